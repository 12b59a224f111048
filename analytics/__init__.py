"""PairMQ analytics."""

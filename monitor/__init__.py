"""PairMQ monitor."""

"""PairMQ configsync."""

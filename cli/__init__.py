"""PairMQ cli."""

"""PairMQ mate_link."""

"""PairMQ appliance."""

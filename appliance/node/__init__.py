"""A PairMQ node process as wiring: `process.py` starts one, `routing.py` is a message-routing node
(pairmq.monitor.node.MonitorNode plus the broker, its listeners, replication and configuration), and
each other module is one part the wiring hands narrow dependencies to."""

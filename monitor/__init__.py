"""The monitor role: `node.py`'s MonitorNode runs the quorum core (`appliance.quorum.core.QuorumCore` with
`Role.MONITOR`) on its heartbeat thread, its decisions, the management API and readiness; it sends
heartbeats, grants votes and never serves MQTT. `pairmq node --role monitor` starts it. A routing node
(`appliance/node/routing.py`) is a MonitorNode plus a broker.
"""

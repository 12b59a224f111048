"""The monitor role.

The monitor runs the same quorum core as the message-routing nodes
(`appliance.quorum.core.QuorumCore` with `Role.MONITOR`): it sends heartbeats,
grants votes and never serves MQTT. `pairmq node --role monitor` starts it.
Monitor-only tooling (for example its status page) will live here.
"""

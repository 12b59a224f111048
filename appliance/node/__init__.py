"""A PairMQ node process as wiring: `process.py` starts one, `routing.py` is a message-routing node
(pairmq.monitor.node.MonitorNode plus the broker, its listeners, replication and configuration), and
each other module is one part the wiring hands narrow dependencies to."""


def management_token(secret: bytes) -> str:
    """The management key (hex) that signs API requests (appliance/request_signing.py); never sent itself."""
    from ..request_signing import management_key

    return management_key(secret).hex()

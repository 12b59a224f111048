"""The mate link (TCP 8301): spool replication, resync and handover. Not built yet (issue 4). So far: secure.py, its handshake and frame protection."""

"""The redundancy core: who is active, decided by authenticated heartbeats (DESIGN §3)."""

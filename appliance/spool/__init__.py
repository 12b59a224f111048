"""The durable spool: SQLite (WAL) state and ordered op log (DESIGN §4)."""

"""The durable spool: SQLite (WAL) state and ordered op log (DESIGN §4).

ops.py     the op vocabulary (what the broker emits)
codec.py   ops <-> bytes (explicit, versioned, canonical)
chain.py   (epoch, seq, checksum) chaining; `verify_chain` for the store and the mate link
state.py   the rules of applying ops, as a pure in-memory model, and `SpoolState`
sql.py     the schema and the same rules as SQL
load.py    reading and cross-checking the whole state
store.py   `Spool.open(dir)`: verify, `load_state()`, `read_entries()`
writer.py  `SpoolWriter`: the group-commit thread, `submit`/`commit`, limits and metrics
errors.py  the spool's errors (corruption itself is `appliance.errors.SpoolCorruption`)

ops, codec, chain and state do no I/O: cores may import them.
"""

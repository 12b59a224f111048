"""The durable spool: the op log is the store, in segment files, with checkpoints (DESIGN §4, docs/spool.md).

ops.py         the op vocabulary (what the broker emits)
codec.py       ops <-> bytes (explicit, versioned, canonical)
chain.py       commits and their (epoch, seq, checksum) chain
state.py       the rules of applying ops: `StateModel`, the spool's live state in memory
snapshot.py    a state as the ops that rebuild it (checkpoints, SNAPSHOT batches)
records.py     the files byte by byte: framed records, commits made and checked, headers
segments.py    `SegmentLog`: group commits appended, scanned at open, read for the mate link
checkpoint.py  checkpoints written and loaded
store.py       `Spool.open(dir)`: recovery (checkpoint + log), `load_state()`, checkpoints and compaction
writer.py      `SpoolWriter`: the group-commit thread, `submit`/`commit`, limits and metrics
local.py       `LocalSpool`: this node's spool and writer, swapped by a full resync
image.py       a full resync's image (a checkpoint) sent and received; install.py: one built from SNAPSHOT batches
verify.py      `pairmq spool verify`: the store's checks, read-only
legacy/        the old SQLite layout, read only by `pairmq spool migrate`
errors.py      the spool's errors (corruption itself is `appliance.errors.SpoolCorruption`)

ops, codec, chain, state, snapshot and records do no I/O: cores may import them.
"""

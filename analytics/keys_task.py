"""The per-delivery keys, bucketed by message id and merged a bucket per Spark task with pyarrow.

Rules:
- A delivery key is (client, msg_id) with its count of `delivered` events
  (partials.deliveries). They are most of a state's rows: one per message
  and subscriber, every one ever delivered, because a redelivery may come
  any time later (a persistent session back after days) and is counted only
  by finding its key again.
- They live in BUCKETS files by msg_id (its low bits): a segment task writes
  its keys as `b<k>-<segment>.parquet` into a scratch directory (one file per
  bucket it has keys of), the state stores `b<k>.parquet` for every bucket,
  empty ones too, which is how a state of this layout is told from an older
  one. A key is always in the same bucket, so merging bucket k of the
  previous state with bucket k of the new segments is the whole merge.
- One Spark task per bucket reads those files, sums the counts per key with
  pyarrow, writes the new state's bucket and returns its redeliveries (the
  deliveries beyond the first of each key) and its number of keys.
- Why not Spark's groupBy: converting, shuffling and aggregating millions of
  keys in Spark costs several times what the bucket tasks take, reading and
  writing included (docs/benchmarks.md, "Analytics").
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from .arrow_io import filesystem, system_allocator

BUCKETS = 8  # a power of two; changing it needs a new --out DIR (the stored buckets would not match)
KEYS = pa.schema([("client", pa.string()), ("msg_id", pa.int64()), ("deliveries", pa.int64())])
OUT = pa.schema([("bucket", pa.int64()), ("keys", pa.int64()), ("extra", pa.int64())])


def bucket_of(msg_id: pa.ChunkedArray) -> pa.ChunkedArray:
    """The bucket of each key: the id's low bits (two's complement for a negative one; a null id in bucket 0)."""
    return pc.bit_wise_and(pc.fill_null(msg_id, 0), BUCKETS - 1)


def state_file(bucket: int) -> str:
    return f"b{bucket:03d}.parquet"


def write_segment_keys(keys: pa.Table, keys_dir: str, name: str) -> None:
    """A segment's keys (KEYS, grouped) into the scratch directory, a file per bucket it has keys of."""
    import pyarrow.parquet as pq

    if not keys.num_rows:
        return
    target, where = filesystem(keys_dir)
    target.create_dir(where, recursive=True)
    buckets = bucket_of(keys["msg_id"])
    for b in pc.unique(buckets).to_pylist():
        pq.write_table(keys.filter(pc.equal(buckets, b)), f"{where}/b{b:03d}-{name}.parquet", filesystem=target)


class Merger:
    """Picklable: a Spark task's function (`mapInArrow` over the bucket numbers, Spark's `range`)."""

    def __init__(self, keys_dir: str, previous: str | None, target: str) -> None:
        self.keys_dir = keys_dir  # the segment tasks' scratch files
        self.previous = previous  # the last state's deliveries directory, None for the first batch
        self.target = target  # the new state's deliveries directory

    def __call__(self, batches):
        system_allocator()
        for batch in batches:
            for b in batch.column("id").to_pylist():
                yield self.bucket(b).to_batches()[0]

    def bucket(self, b: int) -> pa.Table:
        import pyarrow.parquet as pq
        from pyarrow import fs

        source, keys_dir = filesystem(self.keys_dir)
        found = source.get_file_info(fs.FileSelector(keys_dir, allow_not_found=True))
        paths = [(source, f.path) for f in found if f.base_name.startswith(f"b{b:03d}-")]
        if self.previous is not None:
            old, where = filesystem(self.previous)
            paths.append((old, f"{where}/{state_file(b)}"))
        parts = [pq.read_table(path, filesystem=on, schema=KEYS) for on, path in paths]
        merged = (pa.concat_tables(parts).group_by(["client", "msg_id"], use_threads=False)
                  .aggregate([("deliveries", "sum")]).rename_columns({"deliveries_sum": "deliveries"})
                  .select(KEYS.names) if parts else KEYS.empty_table())
        target, where = filesystem(self.target)
        target.create_dir(where, recursive=True)
        pq.write_table(merged.cast(KEYS), f"{where}/{state_file(b)}", filesystem=target)
        extra = pc.sum(pc.subtract(merged["deliveries"], 1)).as_py() or 0
        return pa.table({"bucket": [b], "keys": [merged.num_rows], "extra": [extra]}, schema=OUT)

"""`<out>/tables/_batches`: which closed segments are ingested, and into which batch. The commit point of an ingest.

Rules:
- One Parquet file per batch (`batch-<batch>.parquet`: path, batch), written
  after the table and the state, under a hidden name first and then moved to
  its own: a crash before the move leaves the batch unlisted, so the next run
  ingests those segments again (ingest.py says why that stays exact). Readers
  (Spark's and pyarrow's) skip names that start with `.` or `_`.
- An ingest appends a file, never rewrites one; the files Spark's writer
  appended before (part files) read the same.
- pyarrow through the same filesystems as the tasks, on the driver. Why: a
  Spark write of a few rows starts a Python worker daemon of its own.
"""

from __future__ import annotations

import pyarrow as pa

from .arrow_io import filesystem

SCHEMA = pa.schema([("path", pa.string()), ("batch", pa.string())])


def read(where: str) -> dict[str, str]:
    """Each ingested segment's batch, from the manifest directory `where` (qualified); {} if there is none."""
    import pyarrow.dataset as ds
    from pyarrow import fs

    source, path = filesystem(where)
    if source.get_file_info(path).type == fs.FileType.NotFound:
        return {}
    rows = ds.dataset(path, filesystem=source, format="parquet", schema=SCHEMA).to_table()
    return dict(zip(rows["path"].to_pylist(), rows["batch"].to_pylist(), strict=True))


def append(where: str, batch: str, paths: list[str]) -> None:
    """Lists `paths` as ingested into `batch`: visible whole or not at all."""
    import pyarrow.parquet as pq

    target, path = filesystem(where)
    target.create_dir(path, recursive=True)
    hidden, final = f"{path}/.batch-{batch}.parquet.tmp", f"{path}/batch-{batch}.parquet"
    pq.write_table(pa.table({"path": paths, "batch": [batch] * len(paths)}, SCHEMA), hidden, filesystem=target)
    target.move(hidden, final)

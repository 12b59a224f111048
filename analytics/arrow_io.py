"""What every pyarrow task shares: where a Hadoop-qualified path lives, and which allocator the worker uses."""

from __future__ import annotations

import pyarrow as pa


def system_allocator() -> None:
    """pyarrow's buffers from malloc in this worker, not from its default mimalloc: mimalloc's first segment of a
    process costs far more CPU than the next ones (a worker's first task), malloc's does not."""
    if pa.default_memory_pool().backend_name != "system":
        pa.set_memory_pool(pa.system_memory_pool())


def filesystem(uri: str):
    """(pyarrow filesystem, path) of a path Hadoop qualified (`file:`, `hdfs://`, `s3a://`, which pyarrow calls
    `s3://`)."""
    from pyarrow import fs

    return fs.FileSystem.from_uri("s3://" + uri[len("s3a://"):] if uri.startswith("s3a://") else uri)

"""A small state merged, stored and read on the driver with pyarrow: partials.merge without Spark's jobs.

Rules:
- partials.py defines the merge and the settling; each function here computes
  the same rows (values and types) from pyarrow tables of the same columns
  (partials.SCHEMAS), per kind. A test ingests the same runs both ways and
  compares the stored states row for row.
- Used only when what is merged is small: the segment tasks' rows (but the
  per-delivery keys, which keys_task.py merges either way) and the previous
  state's, at most `max_rows` in all (driver.MAX_ROWS, the bound of the
  reports on the driver). Above it, ingest.py merges in Spark as before.
- The tasks send the topic of per-message rows and latency buckets, not its
  hash (segment_task.py): it is hashed here once per distinct topic, as
  Spark's xxhash64 (xxhash64.py).
- A kind is stored as one Parquet file in its directory (`part-00000.parquet`),
  written through pyarrow's filesystems as the tasks write theirs; Spark and
  pyarrow read it, and a Spark-written state, alike.
- Why: a few thousand rows do not pay for Spark's small jobs (one per kind to
  merge and write, then more to collect them for the reports and write those),
  which cost a first summary seconds (docs/benchmarks.md, "Analytics").
"""

from __future__ import annotations

import datetime

import pyarrow as pa
import pyarrow.compute as pc

from . import segment_task
from .partials import FIRSTS, MESSAGE_KEY, STAGE_NAMES
from .arrow_io import filesystem
from .xxhash64 import of_topic

# The kinds merged here: the per-delivery keys are keys_task.py's; `redelivered` is their total.
MERGED = ("counts", "traffic", "messages", "stage_totals", "latency", "pulses", "small")
PART = "part-00000.parquet"


def _regroup(table: pa.Table, keys: list[str], ops: dict[str, str]) -> pa.Table:
    """`table` grouped by `keys`, each other column aggregated by its op, the columns in `table`'s order."""
    g = table.group_by(keys, use_threads=False).aggregate([(c, op) for c, op in ops.items()])
    g = g.rename_columns([next((c for c, op in ops.items() if name == f"{c}_{op}"), name) for name in g.column_names])
    return g.select(table.column_names)


_STAGE_SUMS = {s: "sum" for s in STAGE_NAMES}
_MESSAGE_OPS = {"topic_hash": "max", "created_ms": "max", "published": "sum", **_STAGE_SUMS,
                **{f: "min" for f in FIRSTS}}


def merge(batches: list[dict[str, pa.Table]], schemas: dict[str, pa.Schema]) -> dict[str, pa.Table]:
    """partials.merge (with `regroup`) of settled batches, each a table per kind of MERGED in `schemas`' columns."""
    union = {k: pa.concat_tables([b[k].cast(schemas[k]) for b in batches]) for k in MERGED}
    messages = _regroup(union["messages"], list(MESSAGE_KEY), _MESSAGE_OPS)
    done = segment_task.settled(messages)
    closed = messages.filter(done)
    totals = pa.concat_tables([union["stage_totals"], segment_task.stage_sums(closed).cast(schemas["stage_totals"])])
    hist = pa.concat_tables([union["latency"],
                             segment_task.latency_histogram(closed, "topic_hash").cast(schemas["latency"])])
    merged = {
        "counts": _regroup(union["counts"], ["node", "event"], {"events": "sum", "first_ts": "min", "last_ts": "max"}),
        "traffic": _regroup(union["traffic"], ["minute", "node", "topic", "client"],
                            {"messages": "sum", "bytes": "sum"}),
        "messages": messages.filter(pc.invert(done)),
        "stage_totals": _regroup(totals, ["node"], _STAGE_SUMS),
        "latency": _regroup(hist, ["topic_hash", "stage", "latency_ms"], {"messages": "sum"}),
        "pulses": _regroup(union["pulses"], ["node", "second"], {"ts": "max"}),
        "small": union["small"],
    }
    return {k: t.cast(schemas[k]) for k, t in merged.items()}


def hashed(kinds: dict[str, pa.Table], schemas: dict[str, pa.Schema]) -> dict[str, pa.Table]:
    """The tasks' kinds with each topic of the per-message rows and latency buckets replaced by its hash."""
    out = dict(kinds)
    for kind in ("messages", "latency"):
        t = kinds[kind]
        out[kind] = t.set_column(t.schema.get_field_index("topic"), "topic_hash", topic_hash(t["topic"]))
        out[kind] = out[kind].cast(schemas[kind])
    return out


def topic_hash(topics: pa.ChunkedArray) -> pa.ChunkedArray:
    """partials.topic_hash: each topic's xxhash64, computed once per distinct topic; null for a null topic."""
    distinct = pc.drop_null(pc.unique(topics))
    hashes = pa.array([of_topic(x) for x in distinct.to_pylist()], pa.int64())
    return pc.take(hashes, pc.index_in(topics, value_set=distinct))


def stored_rows(where: str) -> int:
    """The rows of a stored state's MERGED kinds, from the files' footers."""
    import pyarrow.dataset as ds

    source, path = filesystem(where)
    return sum(ds.dataset(f"{path}/{kind}", filesystem=source, format="parquet").count_rows() for kind in MERGED)


def read(where: str, schemas: dict[str, pa.Schema], kinds=MERGED) -> dict[str, pa.Table]:
    """A stored state's `kinds`, whoever wrote them (Spark's part files or `write`'s)."""
    import pyarrow.dataset as ds

    source, path = filesystem(where)
    return {k: ds.dataset(f"{path}/{k}", filesystem=source, format="parquet", schema=schemas[k]).to_table()
            for k in kinds}


def write(tables: dict[str, pa.Table], where: str) -> None:
    """Each kind as one Parquet file in `where`/<kind>/, replacing what an orphan batch left there."""
    for kind, table in tables.items():
        write_dir(table, f"{where}/{kind}")


def write_dir(table: pa.Table, where: str) -> None:
    """`table` as the one Parquet file of the directory `where` (qualified), replacing whatever it held."""
    import pyarrow.parquet as pq

    target, path = filesystem(where)
    target.delete_dir_contents(path, missing_dir_ok=True)
    target.create_dir(path, recursive=True)
    pq.write_table(table, f"{path}/{PART}", filesystem=target)


def collected(state: dict[str, pa.Table], small_events: tuple[str, ...]) -> dict[str, list[dict]]:
    """driver.collect's rows from a state's tables (with `redelivered`): the same dicts as Spark's Rows give, the
    traffic with its topics' hashes and `small` cut to `small_events`."""
    tables = dict(state)
    tables["traffic"] = state["traffic"].append_column("topic_hash", topic_hash(state["traffic"]["topic"]))
    small = state["small"]
    tables["small"] = small.filter(pc.fill_null(pc.is_in(small["event"], pa.array(small_events)), False))
    return {k: _as_spark(t) for k, t in tables.items()}


def _as_spark(table: pa.Table) -> list[dict]:
    """The rows as PySpark's collect gives them: a map as a dict, a timestamp as a naive datetime in local time."""
    rows = table.to_pylist()
    for f in table.schema:
        if pa.types.is_map(f.type):
            for row in rows:
                row[f.name] = row[f.name] if row[f.name] is None else dict(row[f.name])
        elif pa.types.is_timestamp(f.type):
            micros = pc.cast(table[f.name].cast(pa.timestamp("us", tz="UTC")), pa.int64()).to_pylist()
            for row, us in zip(rows, micros, strict=True):
                row[f.name] = None if us is None else (
                    datetime.datetime.fromtimestamp(us // 1_000_000).replace(microsecond=us % 1_000_000))
    return rows

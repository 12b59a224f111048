"""Segments in, one Parquet table out: closed segments are parsed once, active ones on every run.

Rules:
- Paths go through Hadoop's FileSystem API, so the same code lists and reads
  local directories, hdfs:// and s3a:// (given the connector on a cluster).
- A closed segment (`events-<node>-<seq>.jsonl`) never changes: once its rows
  are in `<out>/tables/events` (Parquet, partitioned by day and node) and the
  state (partials.py: every ingested row so far, reduced, merged and settled)
  in `<out>/tables/state/<batch>/`, its path and batch go into
  `<out>/tables/_batches`, and later runs skip it. JSON parsing is the
  expensive part; the new rows' partials are reduced from the Parquet files
  this run added and merged with the previous batch's state, which is then
  deleted. The reports read only the latest state (small tables: a re-run
  that finds nothing new reads no per-delivery keys and no settled message).
- Active segments (`events.jsonl`) are still growing: parsed and reduced on
  every run, never stored.
- Table, then state, then the manifest: a crash before the manifest
  ingests those segments again on the next run into the same batch number
  (the orphan state is overwritten: the reports stay exact; the raw table
  holds those rows twice).
- JSON is read with the explicit schema; a line that does not parse, or lacks
  ts, node or event, becomes a row with `malformed` set, counted by the
  summary and ignored by every report.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import re

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from appliance.errors import PairMQError

from . import partials, schema
from .partials import Partials

CLOSED = re.compile(r"events-[a-z]+-\d{8}\.jsonl$")
ACTIVE = re.compile(r"events\.jsonl$")


class AnalyticsError(PairMQError):
    """A problem with the job's input or output: one sentence for the operator."""


@dataclasses.dataclass(frozen=True, slots=True)
class Segment:
    path: str
    size: int
    closed: bool


def list_segments(spark: SparkSession, roots: list[str]) -> list[Segment]:
    jvm, conf = spark._jvm, spark._jsc.hadoopConfiguration()
    out: list[Segment] = []
    for root in roots:
        path = jvm.org.apache.hadoop.fs.Path(root)
        fs = path.getFileSystem(conf)
        if not fs.exists(path):
            raise AnalyticsError(f"no event logs at {root}: the path does not exist")
        files = fs.listFiles(path, True)
        while files.hasNext():
            status = files.next()
            name = status.getPath().toString()
            if CLOSED.search(name):
                out.append(Segment(name, status.getLen(), True))
            elif ACTIVE.search(name):
                out.append(Segment(name, status.getLen(), False))
    if not out:
        raise AnalyticsError(f"no event log segments (events*.jsonl) under {', '.join(roots)}")
    return sorted(out, key=lambda s: s.path)


def read_json(spark: SparkSession, paths: list[str]) -> DataFrame:
    raw = (spark.read.schema(schema.RAW).option("mode", "PERMISSIVE")
           .option("columnNameOfCorruptRecord", schema.CORRUPT).json(paths))
    return raw.withColumn("segment", F.input_file_name()).transform(to_table)


def to_table(raw: DataFrame) -> DataFrame:
    """Raw parsed lines (schema.RAW plus `segment`) -> the table's rows (schema.TABLE)."""
    from_name = F.coalesce(F.nullif(F.regexp_extract("segment", r"events-([a-z]+)-\d{8}\.jsonl$", 1), F.lit("")),
                           F.nullif(F.regexp_extract("segment", r"/([^/]+)/events/events\.jsonl$", 1), F.lit("")))
    malformed = (F.col(schema.CORRUPT).isNotNull() | F.col("ts").isNull() | F.col("event").isNull()
                 | F.col("node").isNull())
    return (raw.withColumn("malformed", F.coalesce(malformed, F.lit(True)))
            .withColumn("node", F.coalesce("node", from_name, F.lit("unknown")))
            .withColumn("day", F.coalesce(F.date_format(F.timestamp_seconds("ts"), "yyyy-MM-dd"), F.lit("unknown")))
            .select(*[f.name for f in schema.TABLE.fields]))


@dataclasses.dataclass(slots=True)
class Loaded:
    partials: Partials  # of every valid row (and the counts of every row), merged
    ingested_now: int  # closed segments parsed by this run
    ingested_before: int  # closed segments read from the table
    active: int  # active segments parsed by this run


def load(spark: SparkSession, roots: list[str], out: str | None) -> Loaded:
    """Every event under `roots`, reduced to partials. With `out`, closed segments go through the Parquet table and
    the state is stored beside it (ingested once); a re-run reads only that and parses what is new."""
    found = list_segments(spark, roots)
    closed = [s.path for s in found if s.closed]
    active = [s.path for s in found if not s.closed]
    if out is None:
        return Loaded(partials.reduce(read_json(spark, closed + active)), len(closed), 0, len(active))
    tables = f"{out}/tables"
    table, manifest = f"{tables}/events", f"{tables}/_batches"
    if _exists(spark, f"{tables}/_ingested") or _exists(spark, f"{tables}/partials"):
        raise AnalyticsError(f"{out} was written by an earlier version of the job (no settled state): "
                             "summarize into a new --out DIR")
    done: dict[str, str] = {}
    if _exists(spark, manifest):
        done = {r.path: r.batch for r in spark.read.schema(_MANIFEST).parquet(manifest).collect()}
    last = max(done.values(), default=None)
    parts = [_read_state(spark, f"{tables}/state/{last}")] if last else []
    new = [p for p in closed if p not in done]
    if new:
        batch = f"{int(last or 0) + 1:06d}"  # an orphan of a crash before the manifest is overwritten, never read
        before = set(_files(spark, table))
        read_json(spark, new).write.mode("append").partitionBy("day", "node").parquet(table)
        added = [f for f in _files(spark, table) if f not in before]
        rows = spark.read.schema(schema.TABLE).option("basePath", table).parquet(*added)
        where = f"{tables}/state/{batch}"
        state = partials.merge([*parts, partials.reduce(rows, cache=True)], cache=True)
        with concurrent.futures.ThreadPoolExecutor(4, thread_name_prefix="state") as pool:
            writes = [pool.submit(df.write.mode("overwrite").parquet, f"{where}/{kind}")
                      for kind, df in state.frames().items()]
            for w in writes:
                w.result()
        spark.catalog.clearCache()
        parts = [_read_state(spark, where)]
        spark.createDataFrame([(p, batch) for p in new], _MANIFEST).write.mode("append").parquet(manifest)
        if last:
            _delete(spark, f"{tables}/state/{last}")  # superseded: every row of it is in the new batch's state
    if active:
        parts.append(partials.reduce(read_json(spark, active)))
    assert parts, "list_segments found a segment, so there is a batch or an active segment"
    return Loaded(partials.merge(parts), len(new), len(closed) - len(new), len(active))


_MANIFEST = "path string, batch string"


def _read_state(spark: SparkSession, where: str) -> Partials:
    return Partials(**{kind: spark.read.schema(partials.SCHEMAS[kind]).parquet(f"{where}/{kind}")
                       for kind in partials.KINDS})


def _delete(spark: SparkSession, path: str) -> None:
    jpath = spark._jvm.org.apache.hadoop.fs.Path(path)
    jpath.getFileSystem(spark._jsc.hadoopConfiguration()).delete(jpath, True)


def _files(spark: SparkSession, root: str) -> list[str]:
    jpath = spark._jvm.org.apache.hadoop.fs.Path(root)
    fs = jpath.getFileSystem(spark._jsc.hadoopConfiguration())
    if not fs.exists(jpath):
        return []
    found, files = [], fs.listFiles(jpath, True)
    while files.hasNext():
        name = files.next().getPath().toString()
        if name.endswith(".parquet"):
            found.append(name)
    return found


def _exists(spark: SparkSession, path: str) -> bool:
    jpath = spark._jvm.org.apache.hadoop.fs.Path(path)
    return jpath.getFileSystem(spark._jsc.hadoopConfiguration()).exists(jpath)

"""Segments in, one Parquet table out: closed segments are parsed once, active ones on every run.

Rules:
- Paths go through Hadoop's FileSystem API, so the same code lists and reads
  local directories, hdfs:// and s3a:// (given the connector on a cluster).
- A closed segment (`events-<node>-<seq>.jsonl`) never changes: once its rows
  are in `<out>/tables/events` (Parquet, partitioned by day and node) its path
  goes into `<out>/tables/_ingested`, and later runs skip it. JSON parsing is
  the expensive part; Parquet is read back by column.
- Active segments (`events.jsonl`) are still growing: parsed on every run,
  never stored.
- The table is appended before the manifest: a crash between the two ingests
  those segments again on the next run (duplicates, never a gap).
- JSON is read with the explicit schema; a line that does not parse, or lacks
  ts, node or event, becomes a row with `malformed` set, counted by the
  summary and ignored by every report.
"""

from __future__ import annotations

import dataclasses
import re

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from appliance.errors import PairMQError

from . import schema

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
    events: DataFrame  # every row, malformed ones flagged
    ingested_now: int  # closed segments parsed by this run
    ingested_before: int  # closed segments read from the table
    active: int  # active segments parsed by this run


def load(spark: SparkSession, roots: list[str], out: str | None) -> Loaded:
    """Every event under `roots`. With `out`, closed segments go through the Parquet table (ingested once)."""
    found = list_segments(spark, roots)
    closed = [s.path for s in found if s.closed]
    active = [s.path for s in found if not s.closed]
    if out is None:
        return Loaded(read_json(spark, closed + active), len(closed), 0, len(active))
    table, manifest = f"{out}/tables/events", f"{out}/tables/_ingested"
    done = set()
    if _exists(spark, manifest):
        done = {r.path for r in spark.read.parquet(manifest).collect()}
    new = [p for p in closed if p not in done]
    if new:
        read_json(spark, new).write.mode("append").partitionBy("day", "node").parquet(table)
        spark.createDataFrame([(p,) for p in new], "path string").write.mode("append").parquet(manifest)
    parts = []
    if _exists(spark, table):
        parts.append(spark.read.schema(schema.TABLE).parquet(table).select(*[f.name for f in schema.TABLE.fields]))
    if active:
        parts.append(read_json(spark, active))
    events = parts[0]
    for part in parts[1:]:
        events = events.unionByName(part)
    return Loaded(events, len(new), len(closed) - len(new), len(active))


def _exists(spark: SparkSession, path: str) -> bool:
    jpath = spark._jvm.org.apache.hadoop.fs.Path(path)
    return jpath.getFileSystem(spark._jsc.hadoopConfiguration()).exists(jpath)

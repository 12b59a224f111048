"""Segments in, one Parquet table out: closed segments are parsed once, active ones on every run.

Rules:
- Paths go through Hadoop's FileSystem API (and, in the tasks that parse
  segments, pyarrow's), so the same code lists and reads local directories,
  hdfs:// and s3a:// (given the connector on a cluster; only local paths are
  tested here).
- A closed segment (`events-<node>-<seq>.jsonl`) never changes: once its rows
  are in `<out>/tables/events` (Parquet, partitioned by day and node) and the
  state (partials.py: every ingested row so far, reduced, merged and settled)
  in `<out>/tables/state/<batch>/`, its path and batch go into
  `<out>/tables/_batches` (manifest.py), and later runs skip it. JSON parsing is the
  expensive part: each new segment is parsed once, by a task that writes its
  rows into the table and returns its partials (segment_task.py), which are
  merged with the previous batch's state, which is then deleted. A merge of at
  most `max_rows` rows (driver.MAX_ROWS) runs on the driver in pyarrow
  (driver_merge.py), a larger one in Spark (partials.merge). The reports
  read only the latest state (small tables: a re-run that finds nothing new
  reads no per-delivery keys and no settled message).
- Active segments (`events.jsonl`) are still growing: parsed and reduced on
  every run, never stored.
- Table, then state, then the manifest: a crash before the manifest
  ingests those segments again on the next run into the same batch number
  (the orphan state is overwritten and each segment's table files too, being
  named after it: the reports stay exact and the table holds each row once).
  The tasks hand over the per-delivery keys, most of the rows, as Parquet
  files in a scratch directory (`<out>/tables/_keys`), merged into the state
  by tasks per bucket (keys_task.py), emptied before an ingest and removed
  after it: a crashed run's keys are never counted.
- With a window (--since/--until, window.py), closed segments are still
  ingested whole (the table and the state hold every event), but the
  reports read only the window's events: from the table, its day partitions
  pruned and `ts` filtered in the Parquet scan, and from the active segments
  (or, without --out, from every segment) filtered in the tasks. A segment
  that cannot hold an event of the window is not read at all.
- JSON is read with the explicit schema; a line that does not parse, or lacks
  ts, node or event, becomes a row with `malformed` set, counted by the
  summary and ignored by every report (segment_task.py says exactly when).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import posixpath
import re
from collections.abc import Callable

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from pairmq.appliance.errors import PairMQError

from . import driver_merge, keys_task, manifest, partials, schema, segment_task
from .arrow_io import filesystem
from .partials import Partials
from .window import FIRST_LINE_BYTES, Window, first_ts, overlapping

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
    """Spark's own reader of the same lines (the benchmark's floor and the tests' reference; the job parses with
    segment_task)."""
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


@dataclasses.dataclass(frozen=True, slots=True)
class TaskRows:
    """What the segment tasks returned: every kind's rows in the shared slots (segment_task.py), cached."""
    rows: DataFrame
    count: int
    reducer: segment_task.Reducer
    kinds: dict[str, T.StructType]


def run_tasks(spark: SparkSession, paths: list[str], table: str | None = None, keys: str | None = None,
              window: Window | None = None) -> TaskRows:
    """One task per segment of `paths` (segment_task.py), run now. With `table`, each task also writes its segment's
    rows there; with `keys` (an empty scratch directory), its per-delivery keys there; with `window`, the partials
    are of the rows in it."""
    # Parsed, not made into empty DataFrames: those cost a cold session seconds.
    kinds = {kind: T.DataType.fromDDL(ddl) if isinstance(ddl, str) else ddl
             for kind, ddl in segment_task_schemas().items()}
    arrow = {k: arrow_schema(s) for k, s in kinds.items()}
    if keys is not None:
        _mkdirs(spark, keys)  # read as no keys if no segment has any
    reducer = segment_task.Reducer(arrow_schema(schema.EVENT), arrow, table and qualified(spark, table),
                                   keys and qualified(spark, keys), tuple(paths),
                                   window and (window.since, window.until))
    sql_type = {"s": T.StringType(), "l": T.LongType(), "d": T.DoubleType()}
    out = T.StructType([T.StructField(f.name, sql_type.get(f.name[0], T.StringType())) for f in reducer.out])
    rows = _numbered(spark, len(paths)).mapInArrow(reducer, out).cache()
    # One pass: every kind reads the cached rows, and each segment is parsed (and written) once.
    return TaskRows(rows, rows.count(), reducer, kinds)


def reduce_segments(spark: SparkSession, paths: list[str], table: str | None = None,
                    keys: str | None = None, window: Window | None = None) -> Partials:
    """The partials of every line of `paths`, one task per segment, not yet merged across segments
    (partials.merge with `regroup`); `table`, `keys` and `window` as run_tasks."""
    return partials_of(spark, run_tasks(spark, paths, table, keys, window), keys)


def partials_of(spark: SparkSession, tasks: TaskRows, keys: str | None) -> Partials:
    """The tasks' rows as Spark's partials; with `keys`, the per-delivery keys are read from that scratch directory."""
    rows, reducer, kinds = tasks.rows, tasks.reducer, tasks.kinds

    def of(kind: str) -> DataFrame:
        mine = rows.filter(F.col("partial") == kind)
        if kind in segment_task.AS_JSON:
            return mine.select(F.from_json("s0", kinds[kind]).alias("e")).select("e.*")
        columns = []
        for (name, slot), f in zip(reducer.slots[kind], kinds[kind].fields, strict=True):
            value = F.timestamp_micros(slot) if isinstance(f.dataType, T.TimestampType) else F.col(slot)
            columns.append(value.cast(f.dataType).alias(name))
        return mine.select(*columns)

    hashed = lambda df, names: df.withColumn("topic_hash", partials.topic_hash("topic")).select(*names)  # noqa: E731
    # Listed now, after the tasks wrote them.
    d = of("deliveries") if keys is None else spark.read.schema(partials.SCHEMAS["deliveries"]).parquet(keys)
    return Partials(counts=of("counts"), traffic=of("traffic"),
                    messages=hashed(of("messages"), T.DataType.fromDDL(partials.MESSAGES).names),
                    stage_totals=of("stage_totals"),
                    latency=hashed(of("latency"), ["topic_hash", "stage", "latency_ms", "messages"]),
                    deliveries=d, redelivered=partials.redelivered(d), pulses=of("pulses"), small=of("small"))


def arrow_schema(struct: T.StructType):
    from pyspark.sql.pandas.types import to_arrow_schema

    try:
        return to_arrow_schema(struct, timezone="UTC")  # timestamps as the tasks make them
    except TypeError:  # a Spark whose converter has no time zone argument: it always gives UTC
        return to_arrow_schema(struct)


def segment_task_schemas() -> dict[str, str]:
    """Each kind's columns as the tasks return them: partials.SCHEMAS, with the topic where Spark keeps its hash."""
    return {kind: ddl.replace("topic_hash long", "topic string") if isinstance(ddl, str) else ddl
            for kind, ddl in partials.SCHEMAS.items() if kind != "redelivered"}


@dataclasses.dataclass(slots=True)
class Loaded:
    partials: Partials  # of every valid row (and the counts of every row), merged
    ingested_now: int  # closed segments parsed by this run
    ingested_before: int  # closed segments read from the table
    active: int  # active segments parsed by this run
    state: dict[str, pa.Table] | None = None  # the same partials on the driver, when small (driver_merge.py)


Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


def load(spark: SparkSession, roots: list[str], out: str | None, max_rows: int = 0, window: Window | None = None,
         progress: Progress = _quiet) -> Loaded:
    """Every event under `roots`, reduced to partials. With `out`, closed segments go through the Parquet table and
    the state is stored beside it (ingested once); a re-run reads only that and parses what is new. A state of at
    most `max_rows` rows (the tasks' and the previous state's; 0: never) is merged on the driver, and returned as
    tables too when there is no active segment to add. With `window`, the partials are of its events only (the
    rules). `progress` is told each stage as it starts."""
    progress("listing the event log segments")
    found = list_segments(spark, roots)
    closed = [s.path for s in found if s.closed]
    active = [s.path for s in found if not s.closed]
    if out is None:
        paths = closed + active if window is None else in_window(spark, found, window)
        progress(f"parsing {len(paths)} segment(s), {_mb(found, paths)}")
        return Loaded(partials.merge([reduce_segments(spark, paths, window=window)], regroup=True), len(closed), 0,
                      len(active))
    tables = f"{out}/tables"
    table, batches = f"{tables}/events", f"{tables}/_batches"
    if _exists(spark, f"{tables}/_ingested") or _exists(spark, f"{tables}/partials"):
        raise AnalyticsError(f"{out} was written by an earlier version of the job (no settled state): "
                             "summarize into a new --out DIR")
    done = manifest.read(qualified(spark, batches))
    last = max(done.values(), default=None)
    previous = last and f"{tables}/state/{last}"
    if previous and not _exists(spark, f"{previous}/deliveries/{keys_task.state_file(0)}"):
        raise AnalyticsError(f"{out} was written by an earlier version of the job (per-delivery keys not in "
                             "buckets): summarize into a new --out DIR")
    state = None
    new = [p for p in closed if p not in done]
    if new:
        progress(f"ingesting {len(new)} new closed segment(s), {_mb(found, new)}")
        batch = f"{int(last or 0) + 1:06d}"  # an orphan of a crash before the manifest is overwritten, never read
        where, keys = f"{tables}/state/{batch}", f"{tables}/_keys"
        _delete(spark, keys)  # a crashed run's scratch
        tasks = run_tasks(spark, new, table, keys)
        progress("merging the stored state")
        if 0 < max_rows and tasks.count + (_stored_rows(spark, previous) if previous else 0) <= max_rows:
            state = _store_on_driver(spark, tasks, where, keys, previous)
        else:
            merged = partials.merge([*([_read_state(spark, previous)] if previous else []),
                                     partials_of(spark, tasks, keys)], cache=True, regroup=True)
            _write_state(spark, merged, where, keys, previous and f"{previous}/deliveries")
        spark.catalog.clearCache()
        manifest.append(qualified(spark, batches), batch, new)
        _delete(spark, keys)
        if previous:
            _delete(spark, previous)  # superseded: every row of it is in the new batch's state
        previous = where
    elif previous and 0 < max_rows and _stored_rows(spark, previous) <= max_rows and window is None:
        state = driver_merge.read(qualified(spark, previous), _state_schemas(), (*driver_merge.MERGED, "redelivered"))
    if window is not None:
        return _windowed(spark, found, table, previous is not None, window, len(new), len(closed) - len(new),
                         progress)
    parts = [_read_state(spark, previous)] if previous else []
    if active:
        progress(f"parsing {len(active)} active segment(s), {_mb(found, active)}")
        parts.append(reduce_segments(spark, active))
        state = None  # the reports read the merge with the active segments' partials, in Spark
    assert parts, "list_segments found a segment, so there is a batch or an active segment"
    return Loaded(partials.merge(parts, regroup=bool(active)), len(new), len(closed) - len(new), len(active),
                  state)


def _windowed(spark: SparkSession, found: list[Segment], table: str, ingested: bool, window: Window, now: int,
              before: int, progress: Progress) -> Loaded:
    """The partials of the window's events: the table's rows in it (day partitions pruned, `ts` filtered in the
    scan) and the active segments' that can hold any."""
    parts = []
    if ingested:
        progress("reading the window's events from the table")
        rows = spark.read.schema(schema.TABLE).parquet(table)
        first_day, last_day = window.days()
        if first_day is not None:
            rows = rows.filter((F.col("day") >= first_day) & (F.col("ts") >= window.since))
        if last_day is not None:
            rows = rows.filter((F.col("day") <= last_day) & (F.col("ts") < window.until))
        if window.since is not None or window.until is not None:
            rows = rows.filter(F.col("ts").isNotNull())
        parts.append(partials.reduce(rows))
    active = in_window(spark, [s for s in found if not s.closed], window)
    if active:
        progress(f"parsing {len(active)} active segment(s) in the window")
        parts.append(reduce_segments(spark, active, window=window))
    if not parts:  # nothing ingested, no active segment in the window: the partials of no row
        parts.append(partials.reduce(spark.createDataFrame([], schema.TABLE)))
    return Loaded(partials.merge(parts, regroup=True), now, before,
                  sum(1 for s in found if not s.closed))


def in_window(spark: SparkSession, found: list[Segment], window: Window) -> list[str]:
    """The paths of `found` that can hold an event of `window` (window.py), each node's in the order written: the
    first bytes of each segment give its first time."""
    by_log: dict[str, list[Segment]] = {}
    for seg in found:
        by_log.setdefault(posixpath.dirname(seg.path), []).append(seg)
    logs, order = [], []
    for log, segs in by_log.items():
        segs = sorted(segs, key=lambda s: (not s.closed, s.path))  # closed by sequence number, the active one last
        logs.append((log, [_first_ts(spark, s.path) for s in segs]))
        order.extend(segs)
    return [order[i].path for i in overlapping(logs, window)]


def _first_ts(spark: SparkSession, path: str) -> float | None:
    fs, where = filesystem(qualified(spark, path))
    try:
        with fs.open_input_stream(where) as f:
            return first_ts(f.read(FIRST_LINE_BYTES))
    except FileNotFoundError:
        return None


def _mb(found: list[Segment], paths: list[str]) -> str:
    chosen = set(paths)
    return f"{sum(s.size for s in found if s.path in chosen) / 1e6:,.1f} MB"


def _state_schemas() -> dict[str, pa.Schema]:
    return {kind: arrow_schema(T.DataType.fromDDL(ddl) if isinstance(ddl, str) else ddl)
            for kind, ddl in partials.SCHEMAS.items() if kind != "deliveries"}


def _stored_rows(spark: SparkSession, where: str) -> int:
    return driver_merge.stored_rows(qualified(spark, where))


def _store_on_driver(spark: SparkSession, tasks: TaskRows, where: str, keys: str,
                     previous: str | None) -> dict[str, pa.Table]:
    """The tasks' partials merged with the `previous` state's on the driver (driver_merge.py) and written under
    `where`, the per-delivery keys by keys_task.py's Spark tasks meanwhile: the state's tables."""
    schemas = _state_schemas()
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="keys") as pool:
        extra = pool.submit(lambda: _merge_keys(spark, where, keys, previous and f"{previous}/deliveries")
                            .collect()[0].extra)
        fresh = driver_merge.hashed(tasks.reducer.received(tasks.rows.toArrow()), schemas)
        batches = [driver_merge.read(qualified(spark, previous), schemas)] if previous else []
        state = driver_merge.merge([*batches, fresh], schemas)
        state["redelivered"] = pa.table({"extra": [extra.result()]}, schemas["redelivered"])
    driver_merge.write(state, qualified(spark, where))
    return state


def _merge_keys(spark: SparkSession, where: str, keys: str, previous: str | None) -> DataFrame:
    """The Spark tasks that merge the per-delivery keys into `where`/deliveries (keys_task.py), and the total of
    their redeliveries: `redelivered`'s one row (`extra`). Lazy: they run when it is read."""
    _delete(spark, f"{where}/deliveries")  # an orphan batch's (a crash before the manifest)
    merger = keys_task.Merger(qualified(spark, keys), previous and qualified(spark, previous),
                              qualified(spark, f"{where}/deliveries"))
    merged = _numbered(spark, keys_task.BUCKETS).mapInArrow(merger, "bucket long, keys long, extra long")
    return merged.agg(F.coalesce(F.sum("extra"), F.lit(0)).cast("long").alias("extra"))


def _numbered(spark: SparkSession, n: int) -> DataFrame:
    """0 .. n-1 (`id`), one per partition: what a task's function is handed to pick its piece of work. Spark's
    `range`, made in the JVM: a DataFrame of Python rows starts a Python worker daemon of its own to convert them
    (~1 s of a cold session, twice)."""
    return spark.range(0, n, 1, max(1, n))


def _write_state(spark: SparkSession, state: Partials, where: str, keys: str, previous: str | None) -> None:
    """Every kind under `where`, several at once. The per-delivery keys are not Spark's merge: the segment tasks left
    them in `keys`, bucketed, and a task per bucket merges them with the `previous` state's (keys_task.py), writes
    them and gives its redeliveries, summed into `redelivered`."""
    frames = state.frames()
    del frames["deliveries"], frames["redelivered"]
    frames["redelivered"] = _merge_keys(spark, where, keys, previous)
    with concurrent.futures.ThreadPoolExecutor(4, thread_name_prefix="state") as pool:
        # The keys first: the longest.
        writes = [pool.submit(df.write.mode("overwrite").parquet, f"{where}/{kind}")
                  for kind, df in sorted(frames.items(), key=lambda kv: kv[0] != "redelivered")]
        for w in writes:
            w.result()


def _read_state(spark: SparkSession, where: str) -> Partials:
    return Partials(**{kind: spark.read.schema(partials.SCHEMAS[kind]).parquet(f"{where}/{kind}")
                       for kind in partials.KINDS})


def _delete(spark: SparkSession, path: str) -> None:
    jpath = spark._jvm.org.apache.hadoop.fs.Path(path)
    jpath.getFileSystem(spark._jsc.hadoopConfiguration()).delete(jpath, True)


def qualified(spark: SparkSession, path: str) -> str:
    """The path as Hadoop resolves it (a relative one against the working directory), for the tasks' pyarrow."""
    jpath = spark._jvm.org.apache.hadoop.fs.Path(path)
    return jpath.getFileSystem(spark._jsc.hadoopConfiguration()).makeQualified(jpath).toString()


def _mkdirs(spark: SparkSession, path: str) -> None:
    jpath = spark._jvm.org.apache.hadoop.fs.Path(path)
    jpath.getFileSystem(spark._jsc.hadoopConfiguration()).mkdirs(jpath)


def _exists(spark: SparkSession, path: str) -> bool:
    jpath = spark._jvm.org.apache.hadoop.fs.Path(path)
    return jpath.getFileSystem(spark._jsc.hadoopConfiguration()).exists(jpath)

"""One segment in, its table rows and its partials out: pyarrow inside a Spark task (`mapInArrow`).

Rules:
- Spark lists the segments (ingest.py) and hands each to one task. The task
  reads the file through pyarrow's filesystems (local, hdfs://, s3a:// as
  s3://), parses it with pyarrow's JSON reader, writes the segment's rows
  into the Parquet table itself when asked (one file per (day, node) named
  after the segment's path, `file_name`, so a retried task overwrites its
  own files) and returns the segment's partials: the columns
  partials.reduce computes in Spark, settled within the segment. Spark merges them (partials.merge) as it merges
  stored states. Why: compiled parsing and grouping with no JVM warm-up, faster
  than Spark's reader and reduce (docs/benchmarks.md, "Analytics").
- What a line is, is schema.py's: parsed with the explicit schema, unknown
  fields ignored. A line that is not a JSON object with the documented types,
  or lacks ts, node or event, is malformed: counted, never fatal, whichever
  columns a report reads (Spark's reader skips the columns a query does not
  read, so it calls `"serving": "yes"` valid in one query and malformed in
  another). pyarrow refuses a whole block for one bad line, so a segment is
  parsed in blocks of CHUNK_BYTES, and a refused block again line by line in
  Python (the only slow path, paid for bad blocks only); so are the
  lines that carry a `counts` map, which pyarrow's JSON reader cannot convert
  (a few `unlogged` events). A segment gone since Spark listed it (the
  active one rotated, a closed one removed by retention) gives no rows: what
  was in an active one is in its successor, which the next run lists.
- Each kind is the Spark partial of the same name (partials.SCHEMAS), except
  that per-message rows and latency buckets carry the topic, not its hash:
  the hash is Spark's xxhash64, taken when the rows reach Spark. The
  arithmetic follows partials.py's line for line (rounding half away from
  zero as Spark's `round`, Kleene logic as Spark's boolean columns). A test
  compares both on the same lines, bad ones included.
- The kinds travel to Spark in one set of shared typed columns (`slots`), the
  few `small` events as their JSON. The per-delivery keys, when the job
  stores a state, are written into a scratch directory instead (`keys_dir`,
  bucketed as keys_task.py says), where the tasks that merge them read them:
  they are most of the rows (one per message and subscriber), which Spark
  would otherwise convert, cache, scan for every other kind and shuffle.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import re

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from . import keys_task
from .arrow_io import filesystem, system_allocator

PUBLISHED = "message_published"
STAGES = ("spooled", "replicated", "delivered", "acknowledged")
STAGE_EVENTS = tuple(f"message_{s}" for s in STAGES)
LATENCY_STAGES = ("replicated", "delivered", "replicated_late")  # partials.LATENCY_STAGES
FIRSTS = tuple(f"first_{s}" for s in LATENCY_STAGES)  # partials.FIRSTS
COUNTS_FIELD = b'"counts"'
CHUNK_BYTES = 1 << 20  # a refused block costs this much Python parsing at most
_NAME = re.compile(r"events-([a-z]+)-\d{8}\.jsonl$|/([^/]+)/events/events\.jsonl$")
_EPOCH = datetime.date(1970, 1, 1)
_MAX_TS = 253_402_300_800.0  # 10000-01-01: a later (or negative) ts has no day, like a null one


def file_name(path: str) -> str:
    """What a task names the files it writes for a segment: its name and a digest of its whole path, since two
    roots may hold segments of the same name (two groups' primaries). The same for every run, so a retried task,
    or a run after a crash, overwrites its own files."""
    return path.rsplit("/", 1)[-1].removesuffix(".jsonl") + "-" + hashlib.sha256(path.encode()).hexdigest()[:16]


def node_of_segment(path: str) -> str | None:
    m = _NAME.search(path)
    return (m.group(1) or m.group(2)) if m else None


class Reducer:
    """Picklable: the Arrow schemas are made on the driver (from the Spark ones) and shipped to the tasks."""

    def __init__(self, event: pa.Schema, kinds: dict[str, pa.Schema], table_dir: str | None,
                 keys_dir: str | None = None, paths: tuple[str, ...] = (),
                 window: tuple[float | None, float | None] | None = None) -> None:
        self.event = event  # schema.EVENT
        self.json_schema = pa.schema([f for f in event if not pa.types.is_map(f.type)])
        self.kinds = kinds
        self.slots = {kind: slots(as_sent(kind, s)) for kind, s in kinds.items()}  # kind -> its columns' slots
        self.out = output_schema(kinds)
        self.table_dir = table_dir
        self.keys_dir = keys_dir  # None: the per-delivery keys are returned with the other kinds
        self.paths = paths  # the segments, by the index Spark's `range` gives each task
        self.window = window  # (since, until) in seconds: the partials of those rows only (the table gets all)

    # --- the task -----------------------------------------------------------------------------------------------
    def __call__(self, batches):
        system_allocator()
        for batch in batches:
            for i in batch.column("id").to_pylist():
                yield from self.segment(self.paths[i])

    def segment(self, path: str):
        source, where = filesystem(path)
        try:
            with source.open_input_stream(where) as f:
                data = f.read()
        except FileNotFoundError:  # rotated (an active segment) or removed by retention since Spark listed it
            return
        rows = self.rows(data, path)
        if self.table_dir is not None:
            self.write_table(rows, path)
        if self.window is not None:
            rows = rows.filter(in_window(rows["ts"], *self.window))
        for kind, table in reduce_rows(rows).items():
            if kind == "deliveries" and self.keys_dir is not None:
                self.write_keys(table, path)
            elif table.num_rows:
                yield from self.sent(kind, table).to_batches()

    def sent(self, kind: str, table: pa.Table) -> pa.Table:
        """A kind's rows in the task's output columns (`slots`)."""
        n = table.num_rows
        if kind in AS_JSON:
            maps = [f.name for f in table.schema if pa.types.is_map(f.type)]  # pyarrow gives pairs: JSON wants objects
            table = pa.table({"json": [json.dumps({**row, **{m: row[m] and dict(row[m]) for m in maps}},
                                                  separators=(",", ":")) for row in table.to_pylist()]})
        filled = {slot: table[name] for name, slot in self.slots[kind]}
        cols = [_const(kind, pa.string(), n)]
        for f in list(self.out)[1:]:
            col = filled.get(f.name)
            if col is not None and pa.types.is_timestamp(col.type):
                col = pc.cast(col, pa.timestamp("us", tz="UTC")).cast(pa.int64())
            cols.append(pa.nulls(n, f.type) if col is None else col.cast(f.type))
        return pa.Table.from_arrays(cols, schema=self.out)

    def received(self, rows: pa.Table) -> dict[str, pa.Table]:
        """The tasks' rows (`out`) back into a table per kind, on the driver: `sent` undone."""
        out = {}
        for kind, schema in self.kinds.items():
            mine = rows.filter(pc.equal(rows["partial"], kind))
            if kind in AS_JSON:
                (_, slot), = self.slots[kind]
                out[kind] = pa.Table.from_pylist([json.loads(j) for j in mine[slot].to_pylist()], schema)
                continue
            cols = []
            for (_, slot), f in zip(self.slots[kind], schema, strict=True):
                col = mine[slot]
                if pa.types.is_timestamp(f.type):
                    col = col.cast(pa.timestamp("us", tz="UTC"))
                cols.append(col.cast(f.type))
            out[kind] = pa.Table.from_arrays(cols, schema=schema)
        return out

    # --- parsing ------------------------------------------------------------------------------------------------
    def rows(self, data: bytes, path: str) -> pa.Table:
        """The segment's rows: schema.EVENT's columns, then segment, malformed and day (schema.TABLE)."""
        parts, start = [], 0
        while start < len(data):  # in blocks of whole lines: as fast as one call for the file (measured)
            end = data.find(b"\n", min(start + CHUNK_BYTES, len(data)) - 1)
            end = len(data) if end < 0 else end + 1
            parts.append(self.chunk(data[start:end]))
            start = end
        return self.table_columns(pa.concat_tables(parts) if parts else self.by_line([]), path)

    def chunk(self, chunk: bytes) -> pa.Table:
        slow: list[bytes] = []
        if COUNTS_FIELD in chunk:
            lines = chunk.split(b"\n")
            slow = [line for line in lines if COUNTS_FIELD in line]
            chunk = b"\n".join(line for line in lines if COUNTS_FIELD not in line)
        fast = self.fast(chunk)
        if fast is None:
            slow += chunk.split(b"\n")  # refused as a block: every line on its own
        return pa.concat_tables([self.by_line(slow)] + ([fast] if fast is not None else []))

    def fast(self, data: bytes) -> pa.Table | None:
        """pyarrow's parse of whole lines, None if it refuses any of them."""
        if not data.strip():
            return self.by_line([])
        try:
            got = pj.read_json(pa.BufferReader(data), parse_options=pj.ParseOptions(
                explicit_schema=self.json_schema, unexpected_field_behavior="ignore"),
                read_options=pj.ReadOptions(use_threads=False, block_size=CHUNK_BYTES))
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            return None
        got = got.append_column("counts", pa.nulls(got.num_rows, self.event.field("counts").type))
        return got.select(self.event.names).append_column("_bad", _const(False, pa.bool_(), got.num_rows))

    def by_line(self, lines: list[bytes]) -> pa.Table:
        """Lines parsed one at a time: an object with the schema's types is a row, anything else a malformed one."""
        good, bad = [], 0
        for line in lines:
            if not line.strip():
                continue
            try:
                value = json.loads(line)
                if not isinstance(value, dict):
                    raise ValueError("not an object")
                pa.Table.from_pylist([value], self.event)  # the types, checked as pyarrow converts them
                good.append(value)
            except (ValueError, TypeError, OverflowError, RecursionError, pa.ArrowException):
                bad += 1
        table = pa.Table.from_pylist(good + [{}] * bad, self.event)
        return table.append_column("_bad", pa.array([False] * len(good) + [True] * bad, pa.bool_()))

    def table_columns(self, events: pa.Table, path: str) -> pa.Table:
        """ingest.py's table columns: malformed (did not parse, or lacks ts, node or event), the node named by the
        segment when the line does not, and the day of ts."""
        n = events.num_rows
        malformed = pc.fill_null(pc.or_kleene(pc.or_kleene(events["_bad"], pc.is_null(events["ts"])),
                                              pc.or_kleene(pc.is_null(events["event"]), pc.is_null(events["node"]))),
                                 True)
        node = pc.coalesce(events["node"], pa.scalar(node_of_segment(path) or "unknown"))
        return (events.drop_columns(["_bad", "node"]).add_column(3, "node", node)
                .append_column("segment", _const(path, pa.string(), n))
                .append_column("malformed", malformed)
                .append_column("day", day_of(events["ts"])))

    # --- the table ----------------------------------------------------------------------------------------------
    def write_table(self, rows: pa.Table, path: str) -> None:
        import pyarrow.parquet as pq

        name = file_name(path)
        target, table_dir = filesystem(self.table_dir)
        keys = rows.select(["day", "node"]).group_by(["day", "node"]).aggregate([])
        for day, node in zip(keys["day"].to_pylist(), keys["node"].to_pylist(), strict=True):
            where = f"{table_dir}/day={day}/node={partition_name(node)}"
            target.create_dir(where, recursive=True)
            part = rows.filter(pc.and_(pc.equal(rows["day"], day), pc.equal(rows["node"], node)))
            pq.write_table(part.drop_columns(["day", "node"]), f"{where}/{name}.parquet", filesystem=target)


    def write_keys(self, deliveries: pa.Table, path: str) -> None:
        """The segment's per-delivery keys, bucketed (keys_task.py)."""

        keys_task.write_segment_keys(deliveries, self.keys_dir, file_name(path))


# What Spark's partitioned writer escapes in a partition's directory name (ExternalCatalogUtils.escapePathName), so
# that a node named "../x" in a log line stays inside the table and Spark reads the name back as it was.
_ESCAPED = set('"#%\'*/:=?\\{[]^') | {chr(c) for c in range(0x20)} | {"\x7f"}


def in_window(ts, since: float | None, until: float | None):
    """since <= ts < until (either bound may be open); a row without a time is in no window."""
    keep = pc.is_valid(ts)
    if since is not None:
        keep = pc.and_(keep, pc.greater_equal(ts, since))
    if until is not None:
        keep = pc.and_(keep, pc.less(ts, until))
    return pc.fill_null(keep, False)


def partition_name(value: str) -> str:
    if value == "":
        return "__HIVE_DEFAULT_PARTITION__"
    return "".join(f"%{ord(ch):02X}" if ch in _ESCAPED else ch for ch in value)


AS_JSON = {"small"}  # the other events, all of schema.EVENT's columns: few rows, sent as their JSON
_SLOT = {"s": pa.string(), "l": pa.int64(), "d": pa.float64()}


def as_sent(kind: str, columns: pa.Schema) -> pa.Schema:
    return pa.schema([("json", pa.string())]) if kind in AS_JSON else columns


def slots(kind: pa.Schema) -> list[tuple[str, str]]:
    """(column, slot) of a kind's columns (as_sent) in the task's output: a handful of typed columns that every
    kind shares (strings s0.., integers and timestamps, as microseconds, l0.., doubles d0..), so that a row of one
    kind does not carry the empty columns of all the others into Spark."""
    used, out = {"s": 0, "l": 0, "d": 0}, []
    for f in kind:
        k = "s" if pa.types.is_string(f.type) else "d" if pa.types.is_floating(f.type) else "l"
        out.append((f.name, f"{k}{used[k]}"))
        used[k] += 1
    return out


def output_schema(kinds: dict[str, pa.Schema]) -> pa.Schema:
    used = {slot for kind, s in kinds.items() for _, slot in slots(as_sent(kind, s))}
    return pa.schema([pa.field("partial", pa.string()),
                      *[pa.field(slot, _SLOT[slot[0]]) for slot in sorted(used, key=lambda x: (x[0], int(x[1:])))]])


def day_of(ts: pa.ChunkedArray) -> pa.ChunkedArray:
    """yyyy-MM-dd (UTC) of epoch seconds, "unknown" without one (Spark's date_format of timestamp_seconds). A
    segment spans a day or two: each distinct day is formatted once."""
    usable = pc.fill_null(pc.and_kleene(pc.greater_equal(ts, 0.0), pc.less(ts, _MAX_TS)), False)
    days = pc.cast(pc.floor(pc.divide(pc.if_else(usable, ts, 0.0), 86_400.0)), pa.int64())
    distinct = pc.unique(days)
    names = pa.array([(_EPOCH + datetime.timedelta(days=d)).isoformat() for d in distinct.to_pylist()], pa.string())
    return pc.fill_null(pc.if_else(usable, pc.take(names, pc.index_in(days, value_set=distinct)),
                                   pa.scalar(None, pa.string())), "unknown")


def _const(value, kind: pa.DataType, n: int) -> pa.Array:
    return pa.repeat(pa.scalar(value, kind), n)


def _timestamp(seconds) -> pa.ChunkedArray:
    micros = pc.cast(pc.round(pc.multiply(seconds, 1e6)), pa.int64())
    return pc.cast(micros, pa.timestamp("us", tz="UTC"))


# --- the partials of one segment's rows (partials.reduce, in pyarrow) ---------------------------------------------
def reduce_rows(rows: pa.Table) -> dict[str, pa.Table]:
    # Most segments have no malformed line, and the filter copies every column of every row.
    valid = rows.filter(pc.invert(rows["malformed"])) if pc.any(rows["malformed"]).as_py() else rows
    # A segment is one node's: as a dictionary, the node costs the groupings an integer, not a string.
    valid = valid.set_column(valid.schema.get_field_index("node"), "node",
                             pc.dictionary_encode(valid["node"]).combine_chunks())
    messages = per_message(valid)
    done = settled(messages)
    closed, still_open = messages.filter(done), messages.filter(pc.invert(done))
    return {"counts": event_counts(rows), "traffic": traffic(valid), "messages": still_open,
            "stage_totals": stage_sums(closed), "latency": latency_histogram(closed),
            "deliveries": deliveries(valid), "pulses": pulses(valid), "small": small(valid)}


def _is(rows: pa.Table, event: str):
    return pc.fill_null(pc.equal(rows["event"], event), False)


def event_counts(rows: pa.Table) -> pa.Table:
    name = pc.if_else(rows["malformed"], "malformed", rows["event"])
    ts = pc.if_else(rows["malformed"], pa.scalar(None, pa.float64()), rows["ts"])
    t = pa.table({"node": rows["node"], "event": name, "ts": ts, "one": _const(1, pa.int64(), rows.num_rows)})
    g = t.group_by(["node", "event"], use_threads=False).aggregate([("one", "sum"), ("ts", "min"), ("ts", "max")])
    return g.rename_columns({"one_sum": "events", "ts_min": "first_ts", "ts_max": "last_ts"})


def traffic(valid: pa.Table) -> pa.Table:
    pub = valid.filter(_is(valid, PUBLISHED))
    minute = _timestamp(pc.multiply(pc.floor(pc.divide(pub["ts"], 60.0)), 60.0))
    t = pa.table({"minute": minute, "node": pub["node"], "topic": pub["topic"], "client": pub["client"],
                  "bytes": pub["bytes"], "one": _const(1, pa.int64(), pub.num_rows)})
    g = t.group_by(["minute", "node", "topic", "client"], use_threads=False).aggregate([("one", "sum"),
                                                                                         ("bytes", "sum")])
    return g.rename_columns({"one_sum": "messages", "bytes_sum": "bytes"})


def per_message(valid: pa.Table) -> pa.Table:
    """partials.per_message with the topic instead of its hash."""
    pub = valid.filter(_is(valid, PUBLISHED))
    stage = valid.filter(pc.is_in(valid["event"], pa.array(STAGE_EVENTS)))
    ids = stage["msg_ids"].combine_chunks() if stage.num_rows else pa.array([], pa.list_(pa.int64()))
    each = stage.select(["node", "epoch", "event", "ts", "after_resync"]).take(pc.list_parent_indices(ids))
    zeros = lambda n: _const(0, pa.int64(), n)  # noqa: E731
    of_pub = {"node": pub["node"], "epoch": pub["epoch"], "msg_id": pub["msg_id"], "topic": pub["topic"],
              "created_ms": pub["created_ms"], "published": _const(1, pa.int64(), pub.num_rows),
              **{s: zeros(pub.num_rows) for s in STAGES}, **{f: pa.nulls(pub.num_rows, pa.float64()) for f in FIRSTS}}
    replicated, late = _is(each, "message_replicated"), pc.fill_null(each["after_resync"], False)
    first = {"first_replicated": pc.and_(replicated, pc.invert(late)),
             "first_delivered": _is(each, "message_delivered"), "first_replicated_late": pc.and_(replicated, late)}
    of_stage = {"node": each["node"], "epoch": each["epoch"], "msg_id": pc.list_flatten(ids),
                "topic": pa.nulls(each.num_rows, pa.string()), "created_ms": pa.nulls(each.num_rows, pa.int64()),
                "published": zeros(each.num_rows),
                **{s: pc.cast(_is(each, f"message_{s}"), pa.int64()) for s in STAGES},
                **{f: pc.if_else(first[f], each["ts"], pa.scalar(None, pa.float64())) for f in FIRSTS}}
    rows = pa.concat_tables([pa.table(of_pub), pa.table(of_stage)])
    ops = (("topic", "max"), ("created_ms", "max"), ("published", "sum"), *[(s, "sum") for s in STAGES],
           *[(f, "min") for f in FIRSTS])
    g = rows.group_by(["node", "epoch", "msg_id"], use_threads=False).aggregate(list(ops))
    return g.rename_columns({f"{c}_{op}": c for c, op in ops})


def settled(messages: pa.Table):
    """partials.settled: published, replicated, delivered and acknowledged, with a whole key."""
    done = pc.is_valid(messages["node"])
    for c in ("epoch", "msg_id"):
        done = pc.and_(done, pc.is_valid(messages[c]))
    for c in ("published", "replicated", "delivered", "acknowledged"):
        done = pc.and_(done, pc.fill_null(pc.greater(messages[c], 0), False))
    return done


def stage_sums(messages: pa.Table) -> pa.Table:
    g = messages.group_by("node", use_threads=False).aggregate([(s, "sum") for s in STAGES])
    return g.rename_columns({f"{s}_sum": s for s in STAGES})


def latency_histogram(messages: pa.Table, topic: str = "topic") -> pa.Table:
    """partials.latency_histogram of settled rows (whose keys are whole and `published` > 0), keyed by the `topic`
    column (the topic, or its hash in a merged state: driver_merge.py)."""
    parts = []
    for stage in LATENCY_STAGES:
        at = messages[f"first_{stage}"]
        rows = messages.filter(pc.is_valid(at))
        at = rows[f"first_{stage}"]
        ms = pc.subtract(pc.round(pc.multiply(at, 1000.0), round_mode="half_towards_infinity"),
                         pc.cast(rows["created_ms"], pa.float64()))
        parts.append(pa.table({topic: rows[topic], "stage": _const(stage, pa.string(), rows.num_rows),
                               "latency_ms": pc.cast(ms, pa.int64(), safe=False), "published": rows["published"]}))
    g = pa.concat_tables(parts).group_by([topic, "stage", "latency_ms"], use_threads=False).aggregate(
        [("published", "sum")])
    return g.rename_columns({"published_sum": "messages"})


def deliveries(valid: pa.Table) -> pa.Table:
    d = valid.filter(_is(valid, "message_delivered"))
    ids = d["msg_ids"].combine_chunks() if d.num_rows else pa.array([], pa.list_(pa.int64()))
    t = pa.table({"client": d["client"].take(pc.list_parent_indices(ids)), "msg_id": pc.list_flatten(ids)})
    t = t.append_column("one", _const(1, pa.int64(), t.num_rows))
    g = t.group_by(["client", "msg_id"], use_threads=False).aggregate([("one", "sum")])
    return g.rename_columns({"one_sum": "deliveries"})


def pulses(valid: pa.Table) -> pa.Table:
    event = valid["event"]
    serving = pc.or_kleene(pc.or_kleene(pc.and_kleene(pc.equal(event, "node_alive"), valid["serving"]),
                                        pc.starts_with(event, "message_")),
                           pc.equal(event, "client_accepted"))
    p = valid.filter(serving)
    t = pa.table({"node": p["node"], "second": pc.cast(pc.floor(p["ts"]), pa.int64(), safe=False), "ts": p["ts"]})
    return t.group_by(["node", "second"], use_threads=False).aggregate([("ts", "max")]).rename_columns(
        {"ts_max": "ts"})


def small(valid: pa.Table) -> pa.Table:
    keep = pc.invert(pc.fill_null(pc.is_in(valid["event"], pa.array((PUBLISHED, *STAGE_EVENTS))), False))
    return valid.filter(keep).drop_columns(["segment", "malformed", "day"])

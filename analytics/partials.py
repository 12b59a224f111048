"""Partial aggregates: what event rows reduce to. The state stored at each ingest, merged with what a run parses.

Rules:
- Every report is computed from a `Partials`, never from the raw rows: a run
  reduces only the rows it parses (new closed segments, active segments) and
  merges them with the state stored when earlier segments were ingested.
- Each partial merges exactly: counts and sums add, first times take the
  minimum, last times the maximum, keys come from the same column whichever
  batch saw them; the few rows the incident and overload reports need
  (everything but published and stage events) are kept whole and unioned.
  Merging is per key, so a message whose events straddle two batches
  (published in one segment, acknowledged in the next) comes out as if one
  batch had held them all (a test checks every partial).
- Settled messages are folded away: a message that was published and has
  been replicated, delivered and acknowledged on its node is added to
  per-node stage totals and to a latency histogram, and its per-message row
  is dropped. Only the open ones stay rows, to be merged with later batches.
  Exact because a node writes its log in time order and its segments are
  ingested in order: a later event of a settled message can only be a later
  stage event (a redelivery), which adds to the stage totals (an open row
  with published 0, never in a latency or in flight) and cannot be an
  earlier first time. A message never acknowledged stays open: that is what
  "in flight" reads.
- Redeliveries per (client, msg_id) need the keys to merge; the reports read
  only their total (`redelivered`, one row), so a re-run that parses nothing
  new never reads the keys.
- A reduced or merged `Partials` is settled; `merge` of a single one returns
  it as is (no shuffle); only several are grouped again.
- A message is keyed by (node, epoch, msg_id) on the node that stored it
  (transforms.py); its stage events are batched (`msg_ids`) and counted per
  message here, in one aggregation instead of exploding and joining.
"""

from __future__ import annotations

import dataclasses
import functools

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from . import schema

PUBLISHED = "message_published"
MESSAGE_STAGES = ("message_spooled", "message_replicated", "message_delivered", "message_acknowledged")
STAGE_NAMES = tuple(s.removeprefix("message_") for s in MESSAGE_STAGES)
MESSAGE_KEY = ("node", "epoch", "msg_id")
# replicated_late: a `message_replicated` with `after_resync` (the standby got it only when it caught up), apart
# from the live replication whose latency it would otherwise swamp.
LATENCY_STAGES = ("replicated", "delivered", "replicated_late")
FIRSTS = tuple(f"first_{s}" for s in ("replicated", "delivered", "replicated_late"))  # per_message's first times
STAGE_TOTALS = "node string, " + ", ".join(f"{s} long" for s in STAGE_NAMES)
LATENCY_HISTOGRAM = "topic_hash long, stage string, latency_ms long, messages long"


@dataclasses.dataclass(frozen=True, slots=True)
class Partials:
    counts: DataFrame  # node, event, events, first_ts, last_ts: every row, malformed ones as event `malformed`
    traffic: DataFrame  # minute, node, topic, client, messages, bytes: the published messages
    messages: DataFrame  # per_message() of the open messages: one row per (node, epoch, msg_id)
    stage_totals: DataFrame  # node, spooled, replicated, delivered, acknowledged: of the settled messages
    latency: DataFrame  # topic_hash, stage, latency_ms, messages: latency_histogram() of the settled messages
    deliveries: DataFrame  # client, msg_id, deliveries: `delivered` stage events per message and subscriber
    redelivered: DataFrame  # extra: one row, the deliveries beyond the first of each (client, msg_id)
    pulses: DataFrame  # node, second, ts: each node's last sign of serving in each second
    small: DataFrame  # the valid rows that are neither published nor stage events (decisions, pulses, clients...)

    def frames(self) -> dict[str, DataFrame]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


KINDS = tuple(f.name for f in dataclasses.fields(Partials))
MESSAGES = ("node string, epoch long, msg_id long, topic_hash long, created_ms long, published long, spooled long, "
            "replicated long, delivered long, acknowledged long, first_replicated double, first_delivered double, "
            "first_replicated_late double")
# Each kind's columns: a stored state is read with them (Spark would otherwise run a job per table for its schema).
SCHEMAS = {
    "counts": "node string, event string, events long, first_ts double, last_ts double",
    "traffic": "minute timestamp, node string, topic string, client string, messages long, bytes long",
    "messages": MESSAGES, "stage_totals": STAGE_TOTALS, "latency": LATENCY_HISTOGRAM,
    "deliveries": "client string, msg_id long, deliveries long", "redelivered": "extra long",
    "pulses": "node string, second long, ts double", "small": schema.EVENT,
}


def event_counts(events: DataFrame) -> DataFrame:
    """node, event, events, first_ts, last_ts: what each node logged and when (malformed rows as event `malformed`,
    without times)."""
    name = F.when(F.col("malformed"), F.lit("malformed")).otherwise(F.col("event"))
    ts = F.when(~F.col("malformed"), F.col("ts"))
    return events.groupBy("node", name.alias("event")).agg(F.count(F.lit(1)).alias("events"),
                                                           F.min(ts).alias("first_ts"), F.max(ts).alias("last_ts"))


def traffic(events: DataFrame) -> DataFrame:
    """minute (timestamp), node, topic, client, messages, bytes: published messages, the only pass over them that
    the rates, top topics, top clients and byte totals need."""
    minute = F.timestamp_seconds(F.floor(F.col("ts") / 60) * 60).alias("minute")
    return (events.filter(F.col("event") == PUBLISHED)
            .groupBy(minute, "node", "topic", "client")
            .agg(F.count(F.lit(1)).alias("messages"), F.sum("bytes").alias("bytes")))


def per_message(events: DataFrame) -> DataFrame:
    """node, epoch, msg_id, topic_hash, created_ms, published, spooled, replicated, delivered, acknowledged,
    first_replicated, first_delivered: each message's published and stage events counted, with the first time it
    was replicated and delivered (the latencies' end). Every column is a number so that Spark aggregates in a hash
    table (a string column would make it sort millions of rows): the topic is its xxhash64, named again by
    `topic_names`."""
    is_pub = F.col("event") == PUBLISHED
    ids = F.when(is_pub, F.array("msg_id")).otherwise(F.col("msg_ids"))
    # What each line adds to its messages is computed once per line, before the explode (a stage line names eight
    # messages): the aggregation then only sums, takes minima and maxima of numbers, never comparing event names
    # on every exploded row.
    flags = [(F.col("event") == event).cast("long").alias(name) for event, name in
             ((PUBLISHED, "published"), *[(f"message_{s}", s) for s in STAGE_NAMES])]
    late = F.coalesce(F.col("after_resync"), F.lit(False))
    at = {"replicated": (F.col("event") == "message_replicated") & ~late,
          "delivered": F.col("event") == "message_delivered",
          "replicated_late": (F.col("event") == "message_replicated") & late}
    rows = (events.filter(F.col("event").isin(PUBLISHED, *MESSAGE_STAGES))
            .select("node", "epoch", ids.alias("ids"), F.when(is_pub, topic_hash("topic")).alias("topic_hash"),
                    F.when(is_pub, F.col("created_ms")).alias("created_ms"), *flags,
                    *[F.when(when, F.col("ts")).alias(f"first_{s}") for s, when in at.items()])
            .select("node", "epoch", F.explode("ids").alias("msg_id"), "topic_hash", "created_ms", "published",
                    *STAGE_NAMES, *FIRSTS))
    return rows.groupBy(*MESSAGE_KEY).agg(
        F.max("topic_hash").alias("topic_hash"), F.max("created_ms").alias("created_ms"),
        *[F.sum(c).alias(c) for c in ("published", *STAGE_NAMES)], *[F.min(c).alias(c) for c in FIRSTS])


def topic_hash(column: str):
    return F.when(F.col(column).isNotNull(), F.xxhash64(column))


def topic_names(traffic: DataFrame) -> DataFrame:
    """topic, topic_hash: every published topic (from `traffic`) with the hash per_message keeps of it."""
    return traffic.filter(F.col("topic").isNotNull()).select("topic").distinct().withColumn("topic_hash",
                                                                                             topic_hash("topic"))


def deliveries(events: DataFrame) -> DataFrame:
    """client, msg_id, deliveries: how often each subscriber was sent each message id, on any node."""
    return (events.filter(F.col("event") == "message_delivered")
            .select("client", F.explode("msg_ids").alias("msg_id"))
            .groupBy("client", "msg_id").agg(F.count(F.lit(1)).alias("deliveries")))


def pulses(events: DataFrame) -> DataFrame:
    """node, second, ts: each node's last sign of serving in each second (its pulse said so, or it handled a message
    or a client): the old active's last one before a takeover bounds the outage's start."""
    serving = (((F.col("event") == "node_alive") & F.col("serving")) | F.col("event").startswith("message_")
               | (F.col("event") == "client_accepted"))
    return events.filter(serving).groupBy("node", F.floor("ts").alias("second")).agg(F.max("ts").alias("ts"))


def span(counts: DataFrame) -> DataFrame:
    """start, end: the first and last valid event (null without one), from `event_counts`."""
    return counts.agg(F.min("first_ts").alias("start"), F.max("last_ts").alias("end"))


def small(events: DataFrame) -> DataFrame:
    return (events.filter(~F.col("event").isin(PUBLISHED, *MESSAGE_STAGES))
            .select(*[f.name for f in schema.EVENT.fields]))


def stage_sums(messages: DataFrame) -> DataFrame:
    """node, spooled, replicated, delivered, acknowledged: per_message rows (or stage totals) summed per node."""
    return messages.groupBy("node").agg(*[F.sum(s).cast("long").alias(s) for s in STAGE_NAMES])


def latency_histogram(messages: DataFrame) -> DataFrame:
    """topic_hash, stage (replicated | delivered), latency_ms, messages: how many messages (each `message_published`
    line of one counted) first got to the stage that long after they were published, from per_message rows."""
    stored = messages.filter((F.col("published") > 0) & F.col("node").isNotNull() & F.col("epoch").isNotNull()
                             & F.col("msg_id").isNotNull())
    firsts = F.explode(F.array(*[F.struct(F.lit(s).alias("stage"), F.col(f"first_{s}").alias("at"))
                                 for s in LATENCY_STAGES]))
    latency = (F.round(F.col("f.at") * 1000) - F.col("created_ms")).cast("long").alias("latency_ms")
    return (stored.select("topic_hash", "created_ms", "published", firsts.alias("f"))
            .filter(F.col("f.at").isNotNull())
            .groupBy("topic_hash", F.col("f.stage").alias("stage"), latency)
            .agg(F.sum("published").cast("long").alias("messages")))


def redelivered(deliveries: DataFrame) -> DataFrame:
    """extra: one row, every `delivered` of a message to a client beyond its first (on any node)."""
    return deliveries.agg(F.coalesce(F.sum(F.col("deliveries") - 1), F.lit(0)).cast("long").alias("extra"))


def settled(messages: DataFrame):
    """Whether a per_message row is settled (see the rules): published, replicated, delivered and acknowledged."""
    return ((F.col("published") > 0) & (F.col("replicated") > 0) & (F.col("delivered") > 0)
            & (F.col("acknowledged") > 0) & F.col("node").isNotNull() & F.col("epoch").isNotNull()
            & F.col("msg_id").isNotNull())


def settle(p: Partials, messages: DataFrame, stage_totals: list[DataFrame], latency: list[DataFrame]) -> Partials:
    """`p` with the settled rows of `messages` (every per_message row, merged) folded into the stage totals and
    the latency histogram, `messages` keeping the open ones."""
    done = messages.filter(settled(messages))
    totals = functools.reduce(DataFrame.unionByName, [*stage_totals, stage_sums(done)])
    hist = functools.reduce(DataFrame.unionByName, [*latency, latency_histogram(done)])
    return dataclasses.replace(
        p, messages=messages.filter(~settled(messages)),
        stage_totals=stage_sums(totals) if stage_totals else totals,
        latency=(hist.groupBy("topic_hash", "stage", "latency_ms").agg(F.sum("messages").cast("long")
                                                                        .alias("messages"))
                 if latency else hist))


def reduce(rows: DataFrame, cache: bool = False) -> Partials:
    """The partials of table rows (schema.TABLE, malformed ones included), settled: in Spark, the reference that the
    job's own reduction of each segment (segment_task.py, pyarrow) is tested against. With `cache` the per-message
    aggregation (read three times by settling) and the deliveries (twice) are cached: for a caller that computes
    every partial."""
    valid = rows.filter(~F.col("malformed"))
    d = deliveries(valid).cache() if cache else deliveries(valid)  # stored, and summed into `redelivered`
    p = Partials(counts=event_counts(rows), traffic=traffic(valid), messages=per_message(valid), stage_totals=None,
                 latency=None, deliveries=d, redelivered=redelivered(d), pulses=pulses(valid), small=small(valid))
    return settle(p, p.messages.cache() if cache else p.messages, [], [])


def merge(batches: list[Partials], cache: bool = False, regroup: bool = False) -> Partials:
    """One settled Partials from several (exact: see the rules). `cache`: the per-message aggregation is cached (read
    three times by settling), not the per-delivery keys (ingest.py merges those itself when it stores a state:
    keys_task.py). `regroup`: group even a single batch, one that holds several segments' partials side by
    side (ingest.reduce_segments)."""
    assert batches, "merge needs at least one batch"
    if len(batches) == 1 and not regroup:
        return batches[0]
    union = {k: functools.reduce(DataFrame.unionByName, [getattr(b, k) for b in batches]) for k in KINDS}
    stage_sums_ = [F.sum(c).alias(c) for c in ("published", *STAGE_NAMES)]
    d = union["deliveries"].groupBy("client", "msg_id").agg(F.sum("deliveries").alias("deliveries"))
    p = Partials(
        counts=union["counts"].groupBy("node", "event").agg(F.sum("events").alias("events"),
                                                            F.min("first_ts").alias("first_ts"),
                                                            F.max("last_ts").alias("last_ts")),
        traffic=union["traffic"].groupBy("minute", "node", "topic", "client")
        .agg(F.sum("messages").alias("messages"), F.sum("bytes").alias("bytes")),
        messages=None, stage_totals=None, latency=None, deliveries=d, redelivered=redelivered(d),
        pulses=union["pulses"].groupBy("node", "second").agg(F.max("ts").alias("ts")),
        small=union["small"])
    messages = union["messages"].groupBy(*MESSAGE_KEY).agg(
        F.max("topic_hash").alias("topic_hash"), F.max("created_ms").alias("created_ms"), *stage_sums_,
        *[F.min(c).alias(c) for c in FIRSTS])
    return settle(p, messages.cache() if cache else messages, [b.stage_totals for b in batches],
                  [b.latency for b in batches])

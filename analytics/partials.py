"""Partial aggregates: what a batch of event rows reduces to. Stored when segments are ingested, merged every run.

Rules:
- Every report is computed from a `Partials`, never from the raw rows: a run
  reduces only the rows it parses (new closed segments, active segments) and
  merges them with the partials stored when earlier segments were ingested.
- Each partial merges exactly: counts and sums add, first times take the
  minimum, last times the maximum, keys come from the same column whichever
  batch saw them; the few rows the incident and overload reports need
  (everything but published and stage events) are kept whole and unioned.
  Merging is per key, so a message whose events straddle two batches
  (published in one segment, acknowledged in the next) comes out as if one
  batch had held them all.
- One batch is already merged per key: `merge` of a single `Partials` returns
  it as is (no shuffle); only several batches are grouped again.
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


@dataclasses.dataclass(frozen=True, slots=True)
class Partials:
    counts: DataFrame  # node, event, events, first_ts, last_ts: every row, malformed ones as event `malformed`
    traffic: DataFrame  # minute, node, topic, client, messages, bytes: the published messages
    messages: DataFrame  # per_message(): one row per (node, epoch, msg_id)
    deliveries: DataFrame  # client, msg_id, deliveries: `delivered` stage events per message and subscriber
    pulses: DataFrame  # node, second, ts: each node's last sign of serving in each second
    small: DataFrame  # the valid rows that are neither published nor stage events (decisions, pulses, clients...)

    def frames(self) -> dict[str, DataFrame]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


KINDS = tuple(f.name for f in dataclasses.fields(Partials))


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
    rows = (events.filter(F.col("event").isin(PUBLISHED, *MESSAGE_STAGES))
            .select("node", "epoch", F.explode(ids).alias("msg_id"), "event", "ts", "topic", "created_ms"))
    n = lambda event: F.count(F.when(F.col("event") == event, 1))  # noqa: E731
    first = lambda event: F.min(F.when(F.col("event") == event, F.col("ts")))  # noqa: E731
    return rows.groupBy(*MESSAGE_KEY).agg(
        F.max(F.when(is_pub, topic_hash("topic"))).alias("topic_hash"),
        F.max(F.when(is_pub, F.col("created_ms"))).alias("created_ms"),
        n(PUBLISHED).alias("published"), *[n(f"message_{s}").alias(s) for s in STAGE_NAMES],
        first("message_replicated").alias("first_replicated"), first("message_delivered").alias("first_delivered"))


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


def reduce(rows: DataFrame) -> Partials:
    """The partials of table rows (schema.TABLE, malformed ones included)."""
    valid = rows.filter(~F.col("malformed"))
    return Partials(counts=event_counts(rows), traffic=traffic(valid), messages=per_message(valid),
                    deliveries=deliveries(valid), pulses=pulses(valid), small=small(valid))


def merge(batches: list[Partials]) -> Partials:
    """One Partials from several batches' (exact: see the rules)."""
    assert batches, "merge needs at least one batch"
    if len(batches) == 1:
        return batches[0]
    union = {k: functools.reduce(DataFrame.unionByName, [getattr(b, k) for b in batches]) for k in KINDS}
    stage_sums = [F.sum(c).alias(c) for c in ("published", *STAGE_NAMES)]
    return Partials(
        counts=union["counts"].groupBy("node", "event").agg(F.sum("events").alias("events"),
                                                            F.min("first_ts").alias("first_ts"),
                                                            F.max("last_ts").alias("last_ts")),
        traffic=union["traffic"].groupBy("minute", "node", "topic", "client")
        .agg(F.sum("messages").alias("messages"), F.sum("bytes").alias("bytes")),
        messages=union["messages"].groupBy(*MESSAGE_KEY).agg(
            F.max("topic_hash").alias("topic_hash"), F.max("created_ms").alias("created_ms"), *stage_sums,
            F.min("first_replicated").alias("first_replicated"), F.min("first_delivered").alias("first_delivered")),
        deliveries=union["deliveries"].groupBy("client", "msg_id").agg(F.sum("deliveries").alias("deliveries")),
        pulses=union["pulses"].groupBy("node", "second").agg(F.max("ts").alias("ts")),
        small=union["small"])

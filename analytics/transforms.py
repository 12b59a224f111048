"""The reports' logic: pure DataFrame -> DataFrame functions (no I/O, no clock), chained with `df.transform`.

Rules (what each report means is in docs/events.md, "What the analytics job reports"):
- Inputs are the ingested table's rows (schema.TABLE) with malformed rows
  already removed (`valid`). Outputs have the explicit schemas below.
- A message is identified on the node that stored it by (node, epoch,
  msg_id): message ids restart after a takeover or a restart, epochs do not.
  Latencies are measured on that node, from the PUBLISH being routed
  (`created_ms`, wall clock) to the first `delivered` / `replicated` event.
- Incidents: every activation after the first is a change of the active
  node. Its `detected` is the new active's last bid before it, its
  `last_seen_old` the old active's last sign of serving before the takeover
  (a node_alive pulse with serving true, a message or client event: the
  pulse bounds it to a second), and the service was unavailable
  from last_seen_old to the takeover. In flight: messages the old active
  stored in its epoch and never saw acknowledged.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

MESSAGE_STAGES = ("message_spooled", "message_replicated", "message_delivered", "message_acknowledged")
SERVER_BUSY = 0x89
OVERLOAD_GAP_S = 10.0  # overload signals further apart than this are separate episodes


def valid(events: DataFrame) -> DataFrame:
    return events.filter(~F.col("malformed"))


def published(events: DataFrame) -> DataFrame:
    """node, epoch, msg_id, topic, qos, bytes, client, ts, created_ms: one row per stored message."""
    return (events.filter(F.col("event") == "message_published")
            .select("node", "epoch", "msg_id", "topic", "qos", "bytes", "client", "ts", "created_ms"))


def stages(events: DataFrame) -> DataFrame:
    """node, epoch, msg_id, stage, client, ts: the batched stage events, one row per message."""
    return (events.filter(F.col("event").isin(*MESSAGE_STAGES))
            .select("node", "epoch", F.explode("msg_ids").alias("msg_id"),
                    F.regexp_replace("event", "^message_", "").alias("stage"), "client", "ts"))


def stage_counts(stage_rows: DataFrame) -> DataFrame:
    """node, stage, messages: how many messages reached each stage on each node."""
    return stage_rows.groupBy("node", "stage").agg(F.count(F.lit(1)).alias("messages")).orderBy("node", "stage")


def rates_per_minute(pub: DataFrame) -> DataFrame:
    """minute (timestamp), node, topic, messages, bytes."""
    minute = F.timestamp_seconds(F.floor(F.col("ts") / 60) * 60).alias("minute")
    return (pub.groupBy(minute, "node", "topic")
            .agg(F.count(F.lit(1)).alias("messages"), F.sum("bytes").alias("bytes"))
            .orderBy("minute", "node", "topic"))


def latencies(pub: DataFrame, stage_rows: DataFrame) -> DataFrame:
    """topic, stage (delivered | replicated), node, epoch, msg_id, latency_ms: first time each message got there."""
    firsts = (stage_rows.filter(F.col("stage").isin("delivered", "replicated"))
              .groupBy("node", "epoch", "msg_id", "stage").agg(F.min("ts").alias("at")))
    return (pub.join(firsts, ["node", "epoch", "msg_id"])
            .select("topic", "stage", "node", "epoch", "msg_id",
                    (F.round(F.col("at") * 1000) - F.col("created_ms")).cast("long").alias("latency_ms")))


def latency_percentiles(lat: DataFrame) -> DataFrame:
    """topic, stage, messages, p50_ms, p90_ms, p99_ms, max_ms."""
    q = F.percentile_approx("latency_ms", [0.5, 0.9, 0.99], 10_000)
    return (lat.groupBy("topic", "stage")
            .agg(F.count(F.lit(1)).alias("messages"), q.alias("q"), F.max("latency_ms").alias("max_ms"))
            .select("topic", "stage", "messages", F.col("q")[0].alias("p50_ms"), F.col("q")[1].alias("p90_ms"),
                    F.col("q")[2].alias("p99_ms"), "max_ms")
            .orderBy("topic", "stage"))


def incidents(events: DataFrame) -> DataFrame:
    """One row per change of the active node: epoch, from_node, to_node, cause, last_seen_old, detected, takeover,
    detection_ms, takeover_ms, unavailable_ms, in_flight."""
    decisions = events.filter(F.col("event") == "redundancy_decision")
    order = Window.orderBy("takeover", "to_node")
    acts = (decisions.filter(F.col("kind") == "activate")
            .select(F.col("node").alias("to_node"), "epoch", F.col("ts").alias("takeover"))
            .withColumn("from_node", F.lag("to_node").over(order))
            .withColumn("from_epoch", F.lag("epoch").over(order))
            .withColumn("since", F.coalesce(F.lag("takeover").over(order), F.lit(0.0)))
            .filter(F.col("from_node").isNotNull()))
    i = acts.alias("i")
    bids = decisions.filter(F.col("kind") == "bid").alias("b")
    detected = (i.join(bids, (F.col("b.node") == F.col("i.to_node")) & (F.col("b.ts") <= F.col("i.takeover"))
                       & (F.col("b.ts") > F.col("i.since")), "left")
                .groupBy("i.epoch").agg(F.max("b.ts").alias("detected")))
    # The old active's last sign of serving (its pulse said so, or it handled a message or a client); the latest
    # per second first, so the range join stays small.
    serving = (((F.col("event") == "node_alive") & F.col("serving")) | F.col("event").startswith("message_")
               | (F.col("event") == "client_accepted"))
    pulse = (events.filter(serving).groupBy("node", F.floor("ts").alias("second")).agg(F.max("ts").alias("ts"))
             .alias("o"))
    seen = (i.join(pulse, (F.col("o.node") == F.col("i.from_node")) & (F.col("o.ts") <= F.col("i.takeover")), "left")
            .groupBy("i.epoch").agg(F.max("o.ts").alias("last_seen_old")))
    downs = decisions.filter(F.col("kind") == "step_down").alias("s")
    stepped = (i.join(downs, (F.col("s.node") == F.col("i.from_node")) & (F.col("s.ts") <= F.col("i.takeover"))
                      & (F.col("s.ts") > F.col("i.since")), "left")
               .groupBy("i.epoch").agg(F.count("s.ts").alias("stepped_down")))
    flight = _in_flight(events, i)
    rows = (acts.join(detected, "epoch", "left").join(seen, "epoch", "left").join(stepped, "epoch", "left")
            .join(flight, "epoch", "left")
            .withColumn("detected", F.coalesce("detected", "takeover"))
            .withColumn("last_seen_old", F.least(F.coalesce("last_seen_old", "detected"), "detected")))
    ms = lambda a, b: F.greatest(F.lit(0), F.round((F.col(b) - F.col(a)) * 1000)).cast("long")  # noqa: E731
    return (rows.select(
        "epoch", "from_node", "to_node",
        F.when(F.col("stepped_down") > 0, "step_down").otherwise("lost").alias("cause"),
        "last_seen_old", "detected", "takeover",
        ms("last_seen_old", "detected").alias("detection_ms"), ms("detected", "takeover").alias("takeover_ms"),
        F.coalesce("in_flight", F.lit(0)).cast("long").alias("in_flight"))
        .withColumn("unavailable_ms", F.col("detection_ms") + F.col("takeover_ms"))
        .select("epoch", "from_node", "to_node", "cause", "last_seen_old", "detected", "takeover", "detection_ms",
                "takeover_ms", "unavailable_ms", "in_flight")
        .orderBy("takeover"))


def _in_flight(events: DataFrame, acts: DataFrame) -> DataFrame:
    """epoch (of the incident), in_flight: messages the old active stored in its epoch, never acknowledged there."""
    pub = published(events).select("node", "epoch", "msg_id")
    acked = (stages(events).filter(F.col("stage") == "acknowledged").select("node", "epoch", "msg_id").distinct())
    open_msgs = pub.join(acked, ["node", "epoch", "msg_id"], "left_anti")
    a = acts.select(F.col("epoch").alias("incident"), "from_node", "from_epoch")
    return (open_msgs.join(a, (open_msgs.node == a.from_node) & (open_msgs.epoch == a.from_epoch))
            .groupBy(F.col("incident").alias("epoch")).agg(F.count(F.lit(1)).alias("in_flight")))


def availability(events: DataFrame, incident_rows: DataFrame) -> DataFrame:
    """One row: start, end, period_s, unavailable_ms, availability (share of the period; 1.0 without incidents)."""
    span = events.agg(F.min("ts").alias("start"), F.max("ts").alias("end"))
    down = incident_rows.agg(F.coalesce(F.sum("unavailable_ms"), F.lit(0)).cast("long").alias("unavailable_ms"))
    period = F.col("end") - F.col("start")
    return (span.crossJoin(down)
            .select("start", "end", period.alias("period_s"), "unavailable_ms",
                    F.when(period > 0, F.greatest(F.lit(0.0), 1 - F.col("unavailable_ms") / 1000 / period))
                    .otherwise(F.lit(1.0)).alias("availability")))


def top_topics(pub: DataFrame, n: int = 10) -> DataFrame:
    """topic, messages, bytes: the n busiest by messages."""
    return (pub.groupBy("topic").agg(F.count(F.lit(1)).alias("messages"), F.sum("bytes").alias("bytes"))
            .orderBy(F.desc("messages"), "topic").limit(n))


def top_clients(pub: DataFrame, n: int = 10) -> DataFrame:
    """client, messages, bytes: the n busiest publishers by messages."""
    return (pub.groupBy("client").agg(F.count(F.lit(1)).alias("messages"), F.sum("bytes").alias("bytes"))
            .orderBy(F.desc("messages"), "client").limit(n))


def delivery_problems(events: DataFrame, stage_rows: DataFrame) -> DataFrame:
    """what (redelivered | expired | dropped), reason, messages. A redelivery is a second `delivered` of the same
    message to the same client, on any node (a takeover resends what was in flight)."""
    redelivered = (stage_rows.filter(F.col("stage") == "delivered").groupBy("client", "msg_id")
                   .agg((F.count(F.lit(1)) - 1).alias("extra"))
                   .agg(F.lit("redelivered").alias("what"), F.lit("").alias("reason"),
                        F.coalesce(F.sum("extra"), F.lit(0)).cast("long").alias("messages")))
    gone = (events.filter(F.col("event").isin("message_expired", "message_dropped"))
            .groupBy(F.regexp_replace("event", "^message_", "").alias("what"),
                     F.coalesce("reason", F.lit("")).alias("reason"))
            .agg(F.count(F.lit(1)).cast("long").alias("messages")))
    return redelivered.unionByName(gone).orderBy("what", "reason")


def overload_episodes(events: DataFrame, gap_s: float = OVERLOAD_GAP_S) -> DataFrame:
    """node, start, end, busy_refusals, loop_lags, max_lag_ms: runs of overload signals (CONNECTs refused busy,
    broker loop stalls) on one node, a new episode after `gap_s` without one."""
    signals = events.filter(((F.col("event") == "client_refused") & (F.col("reason_code") == SERVER_BUSY))
                            | (F.col("event") == "broker_loop_lag"))
    w = Window.partitionBy("node").orderBy("ts")
    numbered = (signals.withColumn("new", F.when(F.lag("ts").over(w).isNull()
                                                 | (F.col("ts") - F.lag("ts").over(w) > gap_s), 1).otherwise(0))
                .withColumn("episode", F.sum("new").over(w)))
    return (numbered.groupBy("node", "episode")
            .agg(F.min("ts").alias("start"), F.max("ts").alias("end"),
                 F.sum(F.when(F.col("event") == "client_refused", 1).otherwise(0)).cast("long").alias("busy_refusals"),
                 F.sum(F.when(F.col("event") == "broker_loop_lag", 1).otherwise(0)).cast("long").alias("loop_lags"),
                 F.max("max_ms").alias("max_lag_ms"))
            .select("node", "start", "end", "busy_refusals", "loop_lags", "max_lag_ms").orderBy("node", "start"))


def event_counts(events: DataFrame) -> DataFrame:
    """node, event, events: what each node logged (malformed rows as event `malformed`)."""
    name = F.when(F.col("malformed"), F.lit("malformed")).otherwise(F.col("event"))
    return events.groupBy("node", name.alias("event")).agg(F.count(F.lit(1)).alias("events")).orderBy("node", "event")


def unlogged(events: DataFrame) -> DataFrame:
    """node, what, events: per-message events skipped by sampling, and events the nodes lost (queue full)."""
    sampled = (events.filter(F.col("event") == "message_events_unsampled")
               .select("node", F.explode("counts").alias("what", "n")))
    lost = events.filter(F.col("event") == "events_lost").select("node", F.lit("events_lost").alias("what"),
                                                                 F.col("count").alias("n"))
    return (sampled.unionByName(lost).groupBy("node", "what").agg(F.sum("n").cast("long").alias("events"))
            .orderBy("node", "what"))

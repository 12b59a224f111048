"""The reports' logic: pure DataFrame -> DataFrame functions (no I/O, no clock), chained with `df.transform`.

Rules (what each report means is in docs/events.md, "What the analytics job reports"):
- Inputs are the partial aggregates of the valid rows (partials.py: the
  published traffic, one row per open message, the settled messages' stage
  totals and latency histogram, the redelivery total, pulses, and the few
  other events whole), never the raw rows: each report reads a small table,
  and none joins the stage events back to their messages.
  Outputs have the explicit schemas below.
- A message is identified on the node that stored it by (node, epoch,
  msg_id): message ids restart after a takeover or a restart, epochs do not.
  Latencies are measured on that node, from the PUBLISH being routed
  (`created_ms`, wall clock) to the first `delivered` / `replicated` event.
- Incidents: every activation after the first is a change of the active
  node, read off the decisions the nodes logged. A planned one (cause
  `planned`: the old active's `handover` decision, not aborted, then its
  step-down) was unavailable from that decision (the gate closed) to the
  takeover. A failure (`step_down` if the old active stepped down, else
  `lost`) was unavailable from the old active's last sign of serving: the
  later of its last pulse, message or client event (a second's precision)
  and the moment the new active last heard it claim activity (its bid says
  how long before: a heartbeat's precision). `detected` is the new active's
  last bid before the takeover. In flight: messages the old active stored in
  its epoch and never saw acknowledged.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from .partials import STAGE_NAMES

SERVER_BUSY = 0x89
DOWN, CAUGHT_UP = "→ redundancy down", "caught up on the mate link → in sync"  # the active's `sync` decisions
PLANNED = "planned"  # the cause of a handover (release, revert, auto-revert, SIGTERM): not a failure
# A bid's story of the old active (appliance/quorum/core.py `_silence_story`): how long before the bid the bidder
# last heard it claim activity, a heartbeat's precision where the pulse has a second's.
SILENCE = r"^\S+: (\S+) (?:unseen|gave up activity) ([0-9]+(?:\.[0-9]+)?) s"
OVERLOAD_GAP_S = 10.0  # overload signals further apart than this are separate episodes


def valid(events: DataFrame) -> DataFrame:
    return events.filter(~F.col("malformed"))


def stage_counts(messages: DataFrame) -> DataFrame:
    """node, stage, messages: how many messages reached each stage on each node, from rows with a node and a count
    per stage (partials.per_message of the open messages, unioned with partials.stage_totals of the settled)."""
    sums = messages.groupBy("node").agg(*[F.sum(s).alias(s) for s in STAGE_NAMES])
    pairs = F.explode(F.array(*[F.struct(F.lit(s).alias("stage"), F.col(s).alias("messages")) for s in STAGE_NAMES]))
    return (sums.select("node", pairs.alias("p"))
            .select("node", "p.stage", F.col("p.messages").cast("long").alias("messages"))
            .filter(F.col("messages") > 0).orderBy("node", "stage"))


def rates_per_minute(traffic: DataFrame) -> DataFrame:
    """minute (timestamp), node, topic, messages, bytes (from partials.traffic)."""
    return (traffic.groupBy("minute", "node", "topic")
            .agg(F.sum("messages").alias("messages"), F.sum("bytes").alias("bytes"))
            .orderBy("minute", "node", "topic"))


def latencies(hist: DataFrame, names: DataFrame) -> DataFrame:
    """topic, stage (delivered | replicated), latency_ms, messages: how many messages first got to the stage that
    long after they were published, from histograms keyed by topic hash (partials.latency_histogram of the open
    messages unioned with partials.latency of the settled ones), the topics named by partials.topic_names (a
    handful of rows, broadcast)."""
    summed = hist.groupBy("topic_hash", "stage", "latency_ms").agg(F.sum("messages").alias("messages"))
    return (summed.join(F.broadcast(names), "topic_hash", "left")
            .select("topic", "stage", "latency_ms", F.col("messages").cast("long")))


def latency_percentiles(hist: DataFrame) -> DataFrame:
    """topic, stage, messages, p50_ms, p90_ms, p99_ms, max_ms, from the histogram `latencies` makes. Exact: pN is
    the smallest latency that at least N% of the messages did not exceed (the value at rank ceil(N% x count), what
    percentile_approx returns while its sample is exact)."""
    group = Window.partitionBy("topic", "stage")
    running = group.orderBy(F.asc_nulls_last("latency_ms")).rowsBetween(Window.unboundedPreceding, Window.currentRow)
    ranked = (hist.withColumn("cum", F.sum("messages").over(running))
              .withColumn("n", F.sum(F.when(F.col("latency_ms").isNotNull(), F.col("messages"))).over(group)))
    pick = lambda q: F.min(F.when(F.col("latency_ms").isNotNull()  # noqa: E731
                                  & (F.col("cum") >= F.ceil(F.lit(q) * F.col("n"))), F.col("latency_ms")))
    return (ranked.groupBy("topic", "stage")
            .agg(F.sum("messages").cast("long").alias("messages"), pick(0.5).alias("p50_ms"),
                 pick(0.9).alias("p90_ms"), pick(0.99).alias("p99_ms"), F.max("latency_ms").alias("max_ms"))
            .orderBy("topic", "stage"))


def incidents(events: DataFrame, pulse_rows: DataFrame, messages: DataFrame) -> DataFrame:
    """One row per change of the active node: epoch, from_node, to_node, cause, last_seen_old, detected, takeover,
    detection_ms, takeover_ms, unavailable_ms, in_flight. `events` needs only the decisions (partials.small will
    do), `pulse_rows` is partials.pulses, `messages` partials.per_message."""
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
                .groupBy("i.epoch").agg(F.max("b.ts").alias("detected"),
                                        F.max_by("b.reason", "b.ts").alias("bid_reason")))
    # The old active's last sign of serving, the latest per second (partials.pulses), so the range join stays small.
    pulse = pulse_rows.alias("o")
    seen = (i.join(pulse, (F.col("o.node") == F.col("i.from_node")) & (F.col("o.ts") <= F.col("i.takeover")), "left")
            .groupBy("i.epoch").agg(F.max("o.ts").alias("pulse_old")))
    old_side = [_last_decision(i, decisions, kind, name) for kind, name in
                (("step_down", "stepped_down"), ("handover", "handover_at"), ("handover_aborted", "aborted_at"))]
    flight = _in_flight(messages, i)
    rows = acts.join(detected, "epoch", "left").join(seen, "epoch", "left")
    for df in [*old_side, flight]:
        rows = rows.join(df, "epoch", "left")
    planned = (F.col("handover_at").isNotNull() & (F.col("stepped_down") >= F.col("handover_at"))
               & (F.col("aborted_at").isNull() | (F.col("aborted_at") < F.col("handover_at"))))
    who, secs = (F.regexp_extract("bid_reason", SILENCE, n) for n in (1, 2))
    heard = F.when((who == F.col("from_node")) & (secs != ""), F.col("detected") - secs.cast("double"))
    rows = (rows.withColumn("detected", F.coalesce("detected", "takeover"))
            .withColumn("planned", F.coalesce(planned, F.lit(False)))
            .withColumn("last_seen_old", F.when(F.col("planned"), F.col("handover_at")).otherwise(
                F.least(F.coalesce(F.greatest("pulse_old", heard), "detected"), "detected"))))
    ms = lambda a, b: F.greatest(F.lit(0), F.round((F.col(b) - F.col(a)) * 1000)).cast("long")  # noqa: E731
    cause = (F.when(F.col("planned"), PLANNED).when(F.col("stepped_down").isNotNull(), "step_down")
             .otherwise("lost"))
    return (rows.select(
        "epoch", "from_node", "to_node", cause.alias("cause"),
        "last_seen_old", "detected", "takeover",
        ms("last_seen_old", "detected").alias("detection_ms"), ms("detected", "takeover").alias("takeover_ms"),
        F.coalesce("in_flight", F.lit(0)).cast("long").alias("in_flight"))
        .withColumn("unavailable_ms", F.col("detection_ms") + F.col("takeover_ms"))
        .select("epoch", "from_node", "to_node", "cause", "last_seen_old", "detected", "takeover", "detection_ms",
                "takeover_ms", "unavailable_ms", "in_flight")
        .orderBy("takeover"))


def _last_decision(acts: DataFrame, decisions: DataFrame, kind: str, name: str) -> DataFrame:
    """epoch (of the incident), `name`: the old active's last `kind` decision between the previous activation and
    this one (null without one)."""
    d = decisions.filter(F.col("kind") == kind).alias("d")
    return (acts.join(d, (F.col("d.node") == F.col("i.from_node")) & (F.col("d.ts") <= F.col("i.takeover"))
                      & (F.col("d.ts") > F.col("i.since")), "left")
            .groupBy("i.epoch").agg(F.max("d.ts").alias(name)))


def _in_flight(messages: DataFrame, acts: DataFrame) -> DataFrame:
    """epoch (of the incident), in_flight: messages the old active stored in its epoch, never acknowledged there
    (each `message_published` line of one counts)."""
    open_msgs = messages.filter((F.col("published") > 0) & (F.col("acknowledged") == 0))
    a = acts.select(F.col("epoch").alias("incident"), "from_node", "from_epoch")
    return (open_msgs.join(F.broadcast(a), (open_msgs.node == a.from_node) & (open_msgs.epoch == a.from_epoch))
            .groupBy(F.col("incident").alias("epoch")).agg(F.sum("published").alias("in_flight")))


def availability(span: DataFrame, incident_rows: DataFrame) -> DataFrame:
    """One row: start, end, period_s, unavailable_ms, availability (share of the period; 1.0 without incidents).
    `span` is partials.span: the first and last valid event."""
    down = incident_rows.agg(F.coalesce(F.sum("unavailable_ms"), F.lit(0)).cast("long").alias("unavailable_ms"))
    period = F.col("end") - F.col("start")
    return (span.crossJoin(down)
            .select("start", "end", period.alias("period_s"), "unavailable_ms",
                    F.when(period > 0, F.greatest(F.lit(0.0), 1 - F.col("unavailable_ms") / 1000 / period))
                    .otherwise(F.lit(1.0)).alias("availability")))


def top_topics(traffic: DataFrame, n: int = 10) -> DataFrame:
    """topic, messages, bytes: the n busiest by messages (from partials.traffic)."""
    return (traffic.groupBy("topic").agg(F.sum("messages").alias("messages"), F.sum("bytes").alias("bytes"))
            .orderBy(F.desc("messages"), "topic").limit(n))


def top_clients(traffic: DataFrame, n: int = 10) -> DataFrame:
    """client, messages, bytes: the n busiest publishers by messages (from partials.traffic)."""
    return (traffic.groupBy("client").agg(F.sum("messages").alias("messages"), F.sum("bytes").alias("bytes"))
            .orderBy(F.desc("messages"), "client").limit(n))


def delivery_problems(events: DataFrame, extra: DataFrame) -> DataFrame:
    """what (redelivered | expired | dropped), reason, messages. A redelivery is a second `delivered` of the same
    message to the same client, on any node (a takeover resends what was in flight): `extra` is
    partials.redelivered (one row); `events` needs only the expiries and drops (partials.small will do)."""
    redelivered = extra.agg(F.lit("redelivered").alias("what"), F.lit("").alias("reason"),
                            F.coalesce(F.sum("extra"), F.lit(0)).cast("long").alias("messages"))
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


def redundancy_down(events: DataFrame) -> DataFrame:
    """node, start, end, down_ms: each period an active node's standby was out of sync, from the active's `sync`
    decisions ("→ redundancy down" until "caught up on the mate link → in sync"; end and down_ms null while it
    never caught up). What it stored meanwhile was replicated only at the catch-up: late, not slow."""
    sync = events.filter((F.col("event") == "redundancy_decision") & (F.col("kind") == "sync"))
    downs = sync.filter(F.col("reason").contains(DOWN)).select("node", F.col("ts").alias("start")).alias("d")
    ups = sync.filter(F.col("reason").contains(CAUGHT_UP)).select("node", F.col("ts").alias("up")).alias("u")
    ends = (downs.join(ups, (F.col("u.node") == F.col("d.node")) & (F.col("u.up") > F.col("d.start")), "left")
            .groupBy("d.node", "d.start").agg(F.min("u.up").alias("end")))
    return (ends.groupBy("node", "end").agg(F.min("start").alias("start"))
            .select("node", "start", "end",
                    F.round((F.col("end") - F.col("start")) * 1000).cast("long").alias("down_ms"))
            .orderBy("node", "start"))


def publish_outcomes(events: DataFrame) -> DataFrame:
    """node, topic, qos, outcome, messages: every PUBLISH a client sent, by what became of it (delivered, queued,
    no_subscriber, refused: appliance/broker/outcomes.py), from the nodes' once-a-second `publish_outcomes` events
    (partials.small will do)."""
    each = (events.filter(F.col("event") == "publish_outcomes")
            .select("node", F.explode("outcomes").alias("o")))
    return (each.groupBy("node", F.col("o.topic").alias("topic"), F.col("o.qos").alias("qos"),
                         F.col("o.outcome").alias("outcome"))
            .agg(F.sum("o.messages").cast("long").alias("messages"))
            .orderBy("node", "topic", "qos", "outcome"))


def event_counts(counts: DataFrame) -> DataFrame:
    """node, event, events: what each node logged, malformed rows as event `malformed` (from partials.counts)."""
    return counts.select("node", "event", F.col("events").cast("long")).orderBy("node", "event")


def unlogged(events: DataFrame) -> DataFrame:
    """node, what, events: per-message events skipped by sampling, and events the nodes lost (queue full)."""
    sampled = (events.filter(F.col("event") == "message_events_unsampled")
               .select("node", F.explode("counts").alias("what", "n")))
    lost = events.filter(F.col("event") == "events_lost").select("node", F.lit("events_lost").alias("what"),
                                                                 F.col("count").alias("n"))
    return (sampled.unionByName(lost).groupBy("node", "what").agg(F.sum("n").cast("long").alias("events"))
            .orderBy("node", "what"))

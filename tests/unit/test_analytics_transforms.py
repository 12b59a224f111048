"""Every analytics transform on tiny inline frames, compared with assertDataFrameEqual (Spark's testing guide)."""

from __future__ import annotations

import datetime

from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from pairmq.analytics import partials, schema
from pairmq.analytics import transforms as t
from pairmq.analytics.ingest import to_table
from tests.harness.spark_session import spark  # noqa: F401

UTC = datetime.timezone.utc


def frame(spark, *rows: dict, struct=schema.TABLE):
    names = [f.name for f in struct.fields]
    base = {"malformed": False} if "malformed" in names else {}
    return spark.createDataFrame([tuple({**base, **r}.get(n) for n in names) for r in rows], struct)


def ev(node, ts, event, **fields) -> dict:
    return {"v": 2, "ts": float(ts), "mono_ms": int(ts * 1000), "node": node, "event": event, **fields}


def pub(node, ts, msg_id, topic="a", client="p1", nbytes=10, epoch=1, created=None) -> dict:
    return ev(node, ts, "message_published", msg_id=msg_id, topic=topic, qos=1, bytes=nbytes, client=client,
              epoch=epoch, retain=False, created_ms=int(ts * 1000) if created is None else created)


def stage(node, ts, kind, ids, client=None, epoch=1) -> dict:
    return ev(node, ts, f"message_{kind}", msg_ids=list(ids), client=client, epoch=epoch)


def test_valid_drops_malformed_rows(spark):
    df = frame(spark, ev("primary", 1, "node_alive"), {"node": "backup", "malformed": True, "day": "unknown"})
    assertDataFrameEqual(df.transform(t.valid).select("node", "event"), [("primary", "node_alive")])


def test_to_table_flags_malformed_lines_and_names_their_node_from_the_segment(spark):
    raw = frame(spark,
                {**ev("primary", 86400.5, "node_alive"), "segment": "file:/x/events-primary-00000001.jsonl"},
                {"_corrupt": "{broken", "segment": "file:/d/backup/events/events.jsonl"},
                {**ev(None, 3, "node_alive"), "segment": "file:/y/events-monitor-00000002.jsonl"},
                struct=schema.RAW.add("segment", "string"))
    got = raw.transform(to_table).select("node", "event", "malformed", "day")
    assertDataFrameEqual(got, spark.createDataFrame(
        [("primary", "node_alive", False, "1970-01-02"), ("backup", None, True, "unknown"),
         ("monitor", "node_alive", True, "1970-01-01")], "node string, event string, malformed boolean, day string"))


MESSAGES = partials.MESSAGES


def hashed(spark, topic):
    return spark.range(1).select(F.xxhash64(F.lit(topic))).first()[0]


def test_per_message_counts_each_message_s_events_and_its_first_stages(spark):
    df = frame(spark, pub("primary", 1, 7, topic="t"), ev("primary", 1, "node_alive"),
               stage("primary", 2, "delivered", [7, 8], client="s1"), stage("primary", 1.5, "replicated", [7]),
               stage("primary", 3, "delivered", [7], client="s1"), stage("primary", 4, "acknowledged", [7]),
               stage("backup", 2, "spooled", [7], epoch=2))  # the backup's own message 7
    assertDataFrameEqual(df.transform(partials.per_message), spark.createDataFrame(
        [("primary", 1, 7, hashed(spark, "t"), 1000, 1, 0, 1, 2, 1, 1.5, 2.0, None),
         ("primary", 1, 8, None, None, 0, 0, 0, 1, 0, None, 2.0, None),
         ("backup", 2, 7, None, None, 0, 1, 0, 0, 0, None, None, None)], MESSAGES))


def test_partials_of_two_batches_merge_to_those_of_one(spark):
    """A message published in one batch and acknowledged in the next; every partial, merged, equals one batch's."""
    rows = [pub("primary", 1, 1, "a", "p1", 5), pub("primary", 61, 2, "b", "p2", 7),
            stage("primary", 1.004, "replicated", [1]), stage("primary", 61.5, "delivered", [1, 2], client="s"),
            stage("primary", 62, "acknowledged", [1], client="s"), stage("backup", 63, "delivered", [1], client="s"),
            ev("primary", 1.5, "node_alive", serving=True, epoch=1), {"node": "primary", "malformed": True},
            ev("monitor", 70, "node_alive", serving=False, epoch=1)]
    whole = partials.reduce(frame(spark, *rows))
    merged = partials.merge([partials.reduce(frame(spark, *rows[:3])), partials.reduce(frame(spark, *rows[3:6])),
                             partials.reduce(frame(spark, *rows[6:]))])
    for kind in partials.KINDS:
        assertDataFrameEqual(getattr(merged, kind), getattr(whole, kind))
        # A stored state is read back with these columns.
        want = spark.createDataFrame([], partials.SCHEMAS[kind]).schema
        assert [(f.name, f.dataType) for f in getattr(whole, kind).schema] == [(f.name, f.dataType) for f in want]
    assert partials.merge([whole]) is whole


def test_settling_folds_complete_messages_into_totals_and_keeps_the_open_ones(spark):
    """Message 1 has every stage: it leaves the per-message rows for the stage totals and the latency histogram.
    Message 2 was never acknowledged and stays a row. A redelivery of 1 in a later batch adds to its stage count
    and does not change its latency; the reports from the settled state equal those from every message's row."""
    first = [pub("primary", 10, 1, "a", created=10_000), pub("primary", 10, 2, "a", created=10_000),
             stage("primary", 10.004, "replicated", [1, 2]), stage("primary", 10.020, "delivered", [1, 2], client="s"),
             stage("primary", 10.030, "acknowledged", [1], client="s")]
    later = [stage("primary", 20, "delivered", [1], client="s")]
    p = partials.reduce(frame(spark, *first))
    assertDataFrameEqual(p.messages.select(*partials.MESSAGE_KEY), [("primary", 1, 2)])
    assertDataFrameEqual(p.stage_totals, spark.createDataFrame([("primary", 0, 1, 1, 1)], partials.STAGE_TOTALS))
    assertDataFrameEqual(p.latency, spark.createDataFrame(
        [(hashed(spark, "a"), "replicated", 4, 1), (hashed(spark, "a"), "delivered", 20, 1)],
        partials.LATENCY_HISTOGRAM))
    merged = partials.merge([p, partials.reduce(frame(spark, *later))])
    assertDataFrameEqual(merged.messages.select(*partials.MESSAGE_KEY, "published", "delivered"),
                         [("primary", 1, 1, 0, 1), ("primary", 1, 2, 1, 1)])
    every = frame(spark, *first, *later).transform(partials.per_message)
    assertDataFrameEqual(t.stage_counts(merged.stage_totals.unionByName(
        merged.messages.select("node", *partials.STAGE_NAMES))), t.stage_counts(every))
    names = merged.traffic.transform(partials.topic_names)
    assertDataFrameEqual(t.latencies(merged.latency.unionByName(partials.latency_histogram(merged.messages)), names),
                         t.latencies(partials.latency_histogram(every), names))
    assertDataFrameEqual(merged.redelivered, [(1,)])


def test_stage_counts(spark):
    df = frame(spark, stage("primary", 2, "delivered", [1, 2]), stage("primary", 3, "acknowledged", [1]),
               stage("backup", 4, "delivered", [9]))
    assertDataFrameEqual(df.transform(partials.per_message).transform(t.stage_counts), spark.createDataFrame(
        [("backup", "delivered", 1), ("primary", "acknowledged", 1), ("primary", "delivered", 2)],
        "node string, stage string, messages long"))


def test_rates_per_minute(spark):
    df = frame(spark, pub("primary", 0, 1, "a", nbytes=5), pub("primary", 59.9, 2, "a", nbytes=7),
               pub("primary", 30, 3, "b"), pub("primary", 60, 4, "a"), pub("backup", 61, 1, "a", epoch=2))
    minute = lambda m: datetime.datetime(1970, 1, 1, 0, m, tzinfo=UTC)  # noqa: E731
    assertDataFrameEqual(df.transform(partials.traffic).transform(t.rates_per_minute), spark.createDataFrame(
        [(minute(0), "primary", "a", 2, 12), (minute(0), "primary", "b", 1, 10), (minute(1), "backup", "a", 1, 10),
         (minute(1), "primary", "a", 1, 10)], "minute timestamp, node string, topic string, messages long, bytes long"))


def test_latencies_take_the_first_stage_event_on_the_same_node_and_epoch(spark):
    df = frame(spark, pub("primary", 10, 1, "a", created=9_990), pub("primary", 10, 2, "b", created=10_000),
               stage("primary", 10.004, "replicated", [1, 2]), stage("primary", 10.020, "delivered", [1]),
               stage("primary", 10.500, "delivered", [1]),  # a redelivery: not the latency
               stage("backup", 10.1, "delivered", [2], epoch=2))  # another node's message 2
    names = df.transform(partials.traffic).transform(partials.topic_names)
    hist = df.transform(partials.per_message).transform(partials.latency_histogram)
    assertDataFrameEqual(t.latencies(hist, names), spark.createDataFrame(
        [("a", "replicated", 14, 1), ("b", "replicated", 4, 1), ("a", "delivered", 30, 1)],
        "topic string, stage string, latency_ms long, messages long"))


def test_latencies_count_a_message_published_twice_twice(spark):
    """A crash between the table and the manifest ingests a segment twice in the raw table: like a join would."""
    df = frame(spark, pub("primary", 10, 1, "a", created=9_990), pub("primary", 10, 1, "a", created=9_990),
               stage("primary", 10.02, "delivered", [1]))
    names = df.transform(partials.traffic).transform(partials.topic_names)
    hist = df.transform(partials.per_message).transform(partials.latency_histogram)
    assertDataFrameEqual(t.latencies(hist, names),
                         [("a", "delivered", 30, 2)])


def test_latency_percentiles(spark):
    hist = spark.createDataFrame([("a", "delivered", i * 10, 1) for i in range(1, 11)]
                                 + [("b", "delivered", 5, 1), ("c", "replicated", 3, 98), ("c", "replicated", 7, 1),
                                    ("c", "replicated", 40, 1), ("c", "replicated", None, 2)],
                                 "topic string, stage string, latency_ms long, messages long")
    assertDataFrameEqual(t.latency_percentiles(hist), spark.createDataFrame(
        [("a", "delivered", 10, 50, 90, 100, 100), ("b", "delivered", 1, 5, 5, 5, 5),
         ("c", "replicated", 102, 3, 3, 7, 40)],
        "topic string, stage string, messages long, p50_ms long, p90_ms long, p99_ms long, max_ms long"))


def test_latency_percentiles_match_percentile_approx_where_its_sample_is_exact(spark):
    """The exact histogram percentiles give what percentile_approx gave before, on up to 10,000 values."""
    values = [(i * 7919) % 503 for i in range(2_000)]
    lat = spark.createDataFrame([("t", "delivered", v) for v in values], "topic string, stage string, latency_ms long")
    hist = lat.groupBy("topic", "stage", "latency_ms").agg(F.count(F.lit(1)).alias("messages"))
    q = F.percentile_approx("latency_ms", [0.5, 0.9, 0.99], 10_000)
    want = lat.groupBy("topic", "stage").agg(F.count(F.lit(1)).alias("messages"), q.alias("q"),
                                             F.max("latency_ms").alias("max_ms")) \
        .select("topic", "stage", "messages", F.col("q")[0].alias("p50_ms"), F.col("q")[1].alias("p90_ms"),
                F.col("q")[2].alias("p99_ms"), "max_ms")
    assertDataFrameEqual(t.latency_percentiles(hist), want)


def decision(node, ts, kind, epoch, reason=None) -> dict:
    return ev(node, ts, "redundancy_decision", kind=kind, epoch=epoch, reason=reason or f"{node}: {kind}")


FAILOVER = [
    decision("primary", 100, "bid", 1), decision("primary", 100.05, "activate", 1),
    pub("primary", 150, 1), stage("primary", 150.01, "acknowledged", [1], client="s"),
    pub("primary", 199.5, 2),  # stored, never acknowledged: in flight at the kill
    ev("primary", 200.0, "node_alive", serving=True, epoch=1),  # the last pulse before the kill at ~200.3
    ev("backup", 200.2, "node_alive", serving=False, epoch=1),
    decision("backup", 201.2, "bid", 2), decision("monitor", 201.22, "vote", 2),
    decision("backup", 201.25, "activate", 2),
    pub("backup", 202, 1, epoch=2),
]


def incidents(events):
    return t.incidents(events.transform(partials.small), events.transform(partials.pulses),
                       events.transform(partials.per_message))


def test_incidents_reconstruct_a_lost_primary_from_all_three_nodes(spark):
    got = incidents(frame(spark, *FAILOVER))
    assertDataFrameEqual(got, spark.createDataFrame(
        [(2, "primary", "backup", "lost", 200.0, 201.2, 201.25, 1200, 50, 1250, 1)],
        "epoch long, from_node string, to_node string, cause string, last_seen_old double, detected double, "
        "takeover double, detection_ms long, takeover_ms long, unavailable_ms long, in_flight long"))


def test_incidents_name_a_step_down_and_skip_the_first_activation(spark):
    rows = [decision("primary", 10, "activate", 1), ev("primary", 20, "node_alive", serving=True, epoch=1),
            decision("primary", 20.5, "step_down", 1), decision("backup", 20.6, "bid", 2),
            decision("backup", 20.7, "activate", 2)]
    got = incidents(frame(spark, *rows)).select("epoch", "from_node", "to_node", "cause", "unavailable_ms")
    assertDataFrameEqual(got, [(2, "primary", "backup", "step_down", 700)])
    assertDataFrameEqual(incidents(frame(spark, *rows[:2])).select("epoch"), [])


def test_availability(spark):
    events = frame(spark, *FAILOVER, ev("monitor", 1100, "node_alive"))
    got = t.availability(events.transform(partials.event_counts).transform(partials.span), incidents(events))
    assertDataFrameEqual(got, spark.createDataFrame([(100.0, 1100.0, 1000.0, 1250, 1 - 1.25 / 1000)],
                                                    "start double, end double, period_s double, unavailable_ms long, "
                                                    "availability double"))


def test_top_topics_and_clients(spark):
    df = frame(spark, pub("primary", 1, 1, "a", "c1", 5), pub("primary", 1, 2, "a", "c2", 5),
               pub("primary", 1, 3, "b", "c2", 50), pub("primary", 1, 4, "c", "c3", 1)).transform(partials.traffic)
    assertDataFrameEqual(t.top_topics(df, 2), spark.createDataFrame(
        [("a", 2, 10), ("b", 1, 50)], "topic string, messages long, bytes long"), checkRowOrder=True)
    assertDataFrameEqual(t.top_clients(df, 2), spark.createDataFrame(
        [("c2", 2, 55), ("c1", 1, 5)], "client string, messages long, bytes long"), checkRowOrder=True)


def test_delivery_problems(spark):
    df = frame(spark, stage("primary", 1, "delivered", [1, 2], client="s"),
               stage("backup", 5, "delivered", [1], client="s", epoch=2),  # resent after the takeover
               stage("primary", 1, "delivered", [1], client="other"),
               ev("primary", 9, "message_expired", client="s", msg_id=3, reason="expired"),
               ev("primary", 9, "message_dropped", client="s", msg_id=4, reason="queue full"))
    assertDataFrameEqual(t.delivery_problems(df.transform(partials.small),
                                               df.transform(partials.deliveries).transform(partials.redelivered)),
                         spark.createDataFrame(
        [("dropped", "queue full", 1), ("expired", "expired", 1), ("redelivered", "", 1)],
        "what string, reason string, messages long"))


def test_overload_episodes(spark):
    busy = lambda ts: ev("primary", ts, "client_refused", reason_code=t.SERVER_BUSY)  # noqa: E731
    df = frame(spark, busy(10), busy(15), ev("primary", 40, "broker_loop_lag", max_ms=700),
               ev("primary", 41, "client_refused", reason_code=0x9C),  # a redirect, not overload
               busy(12).copy() | {"node": "backup"})
    assertDataFrameEqual(df.transform(t.overload_episodes), spark.createDataFrame(
        [("backup", 12.0, 12.0, 1, 0, None), ("primary", 10.0, 15.0, 2, 0, None), ("primary", 40.0, 40.0, 0, 1, 700)],
        "node string, start double, end double, busy_refusals long, loop_lags long, max_lag_ms long"))


def test_a_planned_handover_is_timed_from_its_decision_not_from_the_pulse(spark):
    """release-activity: the primary's gate closed at its `handover` decision (90.0), well after its last pulse
    (89.1); unavailable until the backup's activation. An aborted handover followed by a failure is a failure."""
    rows = [decision("primary", 10, "activate", 1), ev("primary", 89.1, "node_alive", serving=True, epoch=1),
            decision("primary", 90.0, "handover", 1), decision("primary", 90.25, "step_down", 1),
            decision("backup", 90.3, "bid", 2, "backup: primary handed activity over (yielded epoch 1), in sync"),
            decision("backup", 90.32, "activate", 2),
            decision("backup", 100.0, "handover", 2), decision("backup", 102.0, "handover_aborted", 2),
            ev("backup", 104.6, "node_alive", serving=True, epoch=2),
            decision("primary", 106.0, "bid", 3, "primary: backup unseen 1.10 s, in sync → asking for epoch 3"),
            decision("primary", 106.05, "activate", 3)]
    got = incidents(frame(spark, *rows)).select("epoch", "cause", "last_seen_old", "detection_ms", "takeover_ms",
                                                "unavailable_ms")
    # The failover: the primary last heard the backup 1.1 s before its bid (104.9), later than its pulse (104.6).
    assertDataFrameEqual(got, [(2, "planned", 90.0, 300, 20, 320), (3, "lost", 104.9, 1100, 50, 1150)],
                         checkRowOrder=True)


def test_a_bid_s_silence_about_another_node_or_a_later_pulse_does_not_move_the_last_sign(spark):
    rows = [*FAILOVER[:6], decision("backup", 201.2, "bid", 2, "backup: monitor unseen 9.00 s, in sync"),
            *FAILOVER[7:]]
    assert incidents(frame(spark, *rows)).first().last_seen_old == 200.0  # the pulse: the bid names no primary
    rows[6] = decision("backup", 201.2, "bid", 2, "backup: primary unseen 3.00 s, in sync")
    assert incidents(frame(spark, *rows)).first().last_seen_old == 200.0  # heard at 198.2, pulsed at 200.0


def test_publish_outcomes_sum_every_node_s_counts_per_topic_qos_and_outcome(spark):
    count = lambda topic, qos, outcome, n: {"topic": topic, "qos": qos, "outcome": outcome, "messages": n}  # noqa
    df = frame(spark, ev("primary", 1, "publish_outcomes", epoch=1,
                         outcomes=[count("t", 1, "no_subscriber", 600), count("t", 0, "delivered", 5)]),
               ev("primary", 2, "publish_outcomes", epoch=1, outcomes=[count("t", 1, "no_subscriber", 400)]),
               ev("backup", 3, "publish_outcomes", epoch=2, outcomes=[count("u", 2, "refused", 1)]))
    assertDataFrameEqual(df.transform(partials.small).transform(t.publish_outcomes), spark.createDataFrame(
        [("backup", "u", 2, "refused", 1), ("primary", "t", 0, "delivered", 5),
         ("primary", "t", 1, "no_subscriber", 1000)],
        "node string, topic string, qos int, outcome string, messages long"), checkRowOrder=True)


def test_redundancy_down_runs_from_the_first_down_decision_to_the_catch_up(spark):
    down = lambda node, ts: decision(node, ts, "sync", 1, f"{node}: x fell behind → redundancy down, x out of sync")  # noqa
    df = frame(spark, down("primary", 5.0), down("primary", 6.0),
               decision("primary", 9.5, "sync", 1, "primary: backup caught up on the mate link → in sync, epoch 1"),
               decision("backup", 9.6, "sync", 1, "backup: in sync until 12.0"),  # the standby's own: not a period
               down("primary", 20.0))
    assertDataFrameEqual(df.transform(t.redundancy_down), spark.createDataFrame(
        [("primary", 5.0, 9.5, 4500), ("primary", 20.0, None, None)],
        "node string, start double, end double, down_ms long"), checkRowOrder=True)


def test_a_late_replication_is_its_own_latency_stage(spark):
    df = frame(spark, pub("primary", 10.0, 1), stage("primary", 10.002, "replicated", [1]),
               pub("primary", 11.0, 2), ev("primary", 40.0, "message_replicated", msg_ids=[2], epoch=1,
                                           after_resync=True))
    hist = partials.latency_histogram(df.transform(partials.per_message))
    assertDataFrameEqual(hist.select("stage", "latency_ms", "messages"),
                         [("replicated", 2, 1), ("replicated_late", 29000, 1)])


def test_event_counts_and_unlogged(spark):
    df = frame(spark, ev("primary", 1, "node_alive"), ev("primary", 2, "node_alive"),
               {"node": "primary", "malformed": True},
               ev("primary", 3, "message_events_unsampled", counts={"message_published": 5}),
               ev("primary", 4, "message_events_unsampled", counts={"message_published": 2, "message_delivered": 1}),
               ev("backup", 5, "events_lost", count=3))
    assertDataFrameEqual(df.transform(partials.event_counts).transform(t.event_counts), spark.createDataFrame(
        [("backup", "events_lost", 1), ("primary", "malformed", 1), ("primary", "message_events_unsampled", 2),
         ("primary", "node_alive", 2)], "node string, event string, events long"))
    assertDataFrameEqual(df.transform(t.valid).transform(t.unlogged), spark.createDataFrame(
        [("backup", "events_lost", 3), ("primary", "message_delivered", 1), ("primary", "message_published", 7)],
        "node string, what string, events long"))


def test_transforms_chain_with_df_transform(spark):
    df = frame(spark, *FAILOVER)
    got = df.transform(t.valid).transform(partials.traffic).transform(t.top_topics).withColumn("x", F.lit(1))
    assertDataFrameEqual(got.select("topic", "messages", "x"), [("a", 3, 1)])

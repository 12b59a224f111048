"""The reports computed on the driver from the collected state (analytics/driver.py) equal the Spark transforms',
row for row and type for type, on inline frames; a state over the bound goes back to the Spark transforms."""

from __future__ import annotations

import json

import pytest

from pairmq.analytics import driver, partials, summary
from pairmq.analytics.ingest import AnalyticsError
from tests.harness.spark_session import spark  # noqa: F401
from tests.unit.test_analytics_job import write_segment
from tests.unit.test_analytics_transforms import decision, ev, frame, pub, stage

# Every report gets rows: open and settled messages on two nodes, a lost primary then a step-down, a message without
# a topic, a redelivery, overload on and off, expiries and drops, unsampled and lost events, a malformed line.
EVENTS = [
    decision("primary", 0.4, "bid", 1), decision("primary", 0.5, "activate", 1),
    pub("primary", 1.0, 1, "a", "p1", 10, created=999), pub("primary", 1.1, 2, "b", "p2", 20),
    pub("primary", 1.2, 3, "a", "p1", 30), pub("primary", 61.3, 4, "a", "p2", 40), pub("primary", 61.4, 5, None),
    stage("primary", 1.0025, "replicated", [1, 2, 3]), stage("primary", 1.0105, "delivered", [1, 2], client="s1"),
    stage("primary", 1.3, "acknowledged", [1, 2], client="s1"), stage("primary", 2.0, "delivered", [1], client="s1"),
    stage("primary", 2.0005, "delivered", [3], client="s2"), stage("primary", 61.5, "spooled", [4]),
    stage("primary", 61.4507, "delivered", [5], client="s1"),
    ev("primary", 1.0, "node_alive", serving=True, epoch=1), ev("primary", 62.0, "node_alive", serving=True, epoch=1),
    ev("backup", 62.0, "node_alive", serving=False, epoch=1),
    ev("primary", 5.0, "client_refused", client_id="c", reason_code=0x89),
    ev("primary", 6.5, "broker_loop_lag", max_ms=40), ev("primary", 40.0, "client_refused", reason_code=0x89),
    ev("primary", 41.0, "client_refused", reason_code=0x9C),
    ev("primary", 7.0, "message_expired", reason="ttl"), ev("primary", 8.0, "message_dropped"),
    ev("primary", 9.0, "message_dropped", reason="queue full"),
    ev("primary", 10.0, "message_events_unsampled", counts={"message_delivered": 5, "message_acknowledged": 3}),
    ev("backup", 11.0, "events_lost", count=2),
    # The backup last heard the primary 0.8 s before its bid: later than the primary's last pulse (62.0).
    decision("backup", 63.2, "bid", 2, "backup: primary unseen 0.80 s, in sync → asking for epoch 2"),
    decision("backup", 63.25, "activate", 2),
    pub("backup", 64.0, 1, "a", "p1", 50, epoch=2), stage("backup", 64.004, "replicated", [1], epoch=2),
    stage("backup", 64.02, "delivered", [1], client="s1", epoch=2),
    stage("backup", 64.03, "acknowledged", [1], client="s1", epoch=2),
    ev("backup", 70.0, "node_alive", serving=True, epoch=2),
    decision("backup", 79.9, "step_down", 2), decision("primary", 80.0, "bid", 3),
    decision("primary", 80.1, "activate", 3),
    # A planned handover back to the backup: not a failure.
    decision("primary", 90.0, "handover", 3), decision("primary", 90.3, "step_down", 3),
    decision("backup", 90.4, "bid", 4, "backup: primary handed activity over (yielded epoch 3), in sync → asking"),
    decision("backup", 90.45, "activate", 4),
    # The standby out of sync twice (once until the end); a message stored meanwhile replicated at the catch-up.
    decision("primary", 20.0, "sync", 1, "primary: backup was not heard → redundancy down, backup out of sync"),
    decision("primary", 21.0, "sync", 1, "primary: backup was not heard → redundancy down, backup out of sync"),
    decision("primary", 30.5, "sync", 1, "primary: backup caught up on the mate link → in sync, epoch 1"),
    decision("backup", 95.0, "sync", 4, "backup: primary fell behind → redundancy down, primary out of sync"),
    ev("primary", 65.0, "message_replicated", msg_ids=[4], epoch=1, after_resync=True),
    ev("primary", 2.0, "publish_outcomes", epoch=1,
       outcomes=[{"topic": "a", "qos": 1, "outcome": "queued", "messages": 3},
                 {"topic": "z", "qos": 1, "outcome": "no_subscriber", "messages": 1000}]),
    ev("primary", 3.0, "publish_outcomes", epoch=1,
       outcomes=[{"topic": "a", "qos": 1, "outcome": "queued", "messages": 1},
                 {"topic": "a", "qos": 0, "outcome": "refused", "messages": 2}]),
    {"node": "backup", "malformed": True, "day": "unknown"},
]


def typed(rows):
    """Rows with each value's type beside it: 1 == 1.0 in Python, not in a report."""
    return [{k: (type(v).__name__, v) for k, v in r.items()} for r in rows]


def materialized(spark, p: partials.Partials) -> partials.Partials:
    """The same partials as inline frames: the reports read them without re-running the reduce (or merge) in every
    report's Spark job."""
    return partials.Partials(**{k: spark.createDataFrame(df.collect(), df.schema) for k, df in p.frames().items()})


def both_ways(spark, p: partials.Partials, top_n: int):
    spark_rows, spark_avail = summary._spark_reports(spark, p, top_n)
    collected = driver.collect(p)
    assert collected is not None
    local = driver.reports(collected, driver.topic_names(collected), top_n)
    local_avail = summary._plain(driver.availability(collected["counts"], local["incidents"]))
    return spark_rows, spark_avail, local, local_avail


@pytest.fixture(scope="module")
def state(spark):
    """partials.reduce of EVENTS, computed once per module."""
    return materialized(spark, partials.reduce(frame(spark, *EVENTS)))


@pytest.fixture(scope="module")
def reports_of_events(spark, state):
    """both_ways over EVENTS with top_n 10, once per module (the Spark side is a dozen jobs)."""
    return both_ways(spark, state, 10)


def test_every_report_on_the_driver_equals_the_spark_transforms(reports_of_events):
    spark_rows, spark_avail, local, local_avail = reports_of_events
    assert set(local) == set(spark_rows) == set(driver.SCHEMAS)
    for name in spark_rows:
        assert spark_rows[name], f"the fixture gives {name} no rows: the comparison would prove nothing"
        assert typed(local[name]) == typed(spark_rows[name]), name
    assert typed([local_avail]) == typed([spark_avail])
    # The fixture reaches the cases the driver's code handles by hand.
    assert {(i["epoch"], i["cause"], i["in_flight"]) for i in local["incidents"]} == {
        (2, "lost", 3), (3, "step_down", 0), (4, "planned", 0)}
    by_epoch = {i["epoch"]: i for i in local["incidents"]}
    assert by_epoch[2]["last_seen_old"] == 63.2 - 0.8 and by_epoch[2]["detection_ms"] == 800  # heard, not pulsed
    assert (by_epoch[4]["last_seen_old"], by_epoch[4]["unavailable_ms"]) == (90.0, 450)  # from the handover
    assert [(r["node"], r["start"], r["end"], r["down_ms"]) for r in local["redundancy_down"]] == [
        ("backup", 95.0, None, None), ("primary", 20.0, 30.5, 10500)]
    assert {(r["topic"], r["stage"]): r["max_ms"] for r in local["latency"]}[("a", "replicated_late")] == 3700
    assert [(r["topic"], r["qos"], r["outcome"], r["messages"]) for r in local["publish_outcomes"]] == [
        ("a", 0, "refused", 2), ("a", 1, "queued", 4), ("z", 1, "no_subscriber", 1000)]
    assert [r["topic"] for r in local["latency"]][:1] == [None]
    assert len(local["overload_episodes"]) == 2


def test_a_top_n_cuts_the_top_reports_on_the_driver_as_in_spark(spark, state, reports_of_events):
    """top_n reaches only the top topics and clients (both sides): those are compared for top_n 1, which cuts them;
    the other reports are top_n 10's."""
    collected = driver.collect(state)
    local = driver.reports(collected, driver.topic_names(collected), 1)
    frames = summary._spark_report_frames(spark, state, 1)
    ten = reports_of_events[2]
    for name in ("top_topics", "top_clients"):
        assert len(ten[name]) > 1 and len(local[name]) == 1, name
        assert typed(local[name]) == typed([r.asDict() for r in frames[name].collect()]), name
    assert {k: v for k, v in local.items() if not k.startswith("top_")} == \
        {k: v for k, v in ten.items() if not k.startswith("top_")}


def test_the_reports_of_two_merged_batches_with_open_messages_agree_too(spark):
    """A merged state (ingest's shape after two runs), whose open messages the driver folds into the latencies."""
    p = materialized(spark, partials.merge([partials.reduce(frame(spark, *EVENTS[:12])),
                                            partials.reduce(frame(spark, *EVENTS[12:]))]))
    spark_rows, spark_avail, local, local_avail = both_ways(spark, p, 10)
    assert {name: typed(rows) for name, rows in local.items()} == {name: typed(r) for name, r in spark_rows.items()}
    assert typed([local_avail]) == typed([spark_avail])
    assert collected_messages(p) > 0


def collected_messages(p) -> int:
    return len(driver.collect(p)["messages"])


def test_the_comparison_catches_a_wrong_report(reports_of_events):
    """The comparison can fail: a report off by one message, or an int where Spark has a float, differs."""
    spark_rows, _, local, _ = reports_of_events
    off = [dict(r) for r in local["top_topics"]]
    off[0]["messages"] += 1
    assert typed(off) != typed(spark_rows["top_topics"])
    as_int = [{**r, "takeover": int(r["takeover"])} for r in local["incidents"]]
    assert typed(as_int) != typed(spark_rows["incidents"])


def test_two_topics_with_one_hash_are_refused_with_a_sentence():
    rows = {"traffic": [{"topic": "a", "topic_hash": 5}, {"topic": "a", "topic_hash": 5}, {"topic": None,
                                                                                          "topic_hash": None}]}
    assert driver.topic_names(rows) == {5: "a"}
    rows["traffic"].append({"topic": "b", "topic_hash": 5})
    with pytest.raises(AnalyticsError) as refused:
        driver.topic_names(rows)
    assert str(refused.value) == "two topics have the same xxhash64: the latency report cannot tell them apart"


def test_a_state_over_the_bound_is_not_collected(state):
    assert driver.collect(state, max_rows=1) is None
    assert driver.collect(state, max_rows=1000) is not None


def test_the_job_gives_the_same_view_and_parquet_reports_whichever_way_it_computes_them(spark, tmp_path):
    """The whole summary: from the driver (the default), and with every partial over the bound (the Spark
    transforms); the view and each report's Parquet rows are the same. The second run is a re-run into the same
    --out (it reads the stored state instead of ingesting the segment again: the reports are the same)."""
    logs, out = tmp_path / "logs", tmp_path / "out"
    lines = [json.dumps({k: v for k, v in e.items() if v is not None}) for e in EVENTS if not e.get("malformed")]
    write_segment(logs / "primary", "primary", 1, [*lines, "{broken"])
    views, tables = [], []
    for max_rows in (driver.MAX_ROWS, 0):
        views.append(summary.summarize(spark, [logs.as_uri()], out.as_uri(), max_rows=max_rows))
        tables.append({name: sorted(map(repr, spark.read.parquet(str(out / "reports" / name)).collect()))
                       for name in driver.SCHEMAS})
    assert [v.pop("inputs")["segments_from_table"] for v in views] == [0, 1]
    del views[0]["elapsed_s"], views[1]["elapsed_s"]
    assert views[0] == views[1]
    assert views[0]["malformed_lines"] == 1 and len(views[0]["incidents"]) == 2
    assert tables[0] == tables[1] and all(tables[0].values())


def test_the_report_schemas_are_the_spark_transforms(spark, state):
    """driver.SCHEMAS (the Parquet files' columns) name and type the columns as transforms.py makes them."""
    from pyspark.sql.types import _parse_datatype_string

    frames = summary._spark_report_frames(spark, state, 10)
    for name, df in frames.items():
        want = [(f.name, f.dataType) for f in _parse_datatype_string(driver.SCHEMAS[name]).fields]
        assert [(f.name, f.dataType) for f in df.schema.fields] == want, name

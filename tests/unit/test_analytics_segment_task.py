"""The job's parser and reducer (pyarrow in Spark tasks, analytics/segment_task.py) against Spark's own: the same
lines, good and bad, give the same table rows and, merged, the same partials as Spark's JSON reader and
partials.reduce."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from pairmq.analytics import ingest, partials, schema, segment_task
from pairmq.analytics import transforms as t
from tests.harness.spark_session import spark  # noqa: F401


def line(node, ts, event, **fields) -> str:
    return json.dumps({"v": 2, "ts": ts, "mono_ms": int(ts * 1000), "node": node, "event": event, **fields})


def pub(node, ts, msg_id, topic="a", client="p1", epoch=1, created=None) -> str:
    return line(node, ts, "message_published", msg_id=msg_id, topic=topic, qos=1, bytes=10 + msg_id, client=client,
                epoch=epoch, retain=False, created_ms=int(ts * 1000) if created is None else created)


def stage(node, ts, kind, ids, client="s", epoch=1) -> str:
    return line(node, ts, f"message_{kind}", msg_ids=ids, client=client, epoch=epoch)


# Not among them: a field of another type than the schema's in a column the query does not read (serving "yes"):
# Spark's reader prunes that column and calls the line valid in one query and malformed in another; the job's
# parser always calls it malformed (the last test).
BAD = ["{not json", "[1, 2]", "42", "{}", "[" * 100_000 + "]" * 100_000,  # too deep for Python's json too
       json.dumps({"v": 2, "ts": "soon", "node": "primary", "event": "node_alive"}),
       json.dumps({"v": 2, "node": "primary", "event": "node_alive"}),  # parses, but has no ts
       json.dumps({"v": 2, "ts": 9.0, "node": "primary"})]  # no event

SEGMENTS = {
    "primary/events/events-primary-00000001.jsonl": [
        line("primary", 0.5, "redundancy_decision", kind="activate", epoch=1, reason="primary: activating",
             core_ms=500),
        line("primary", 1.0, "node_alive", serving=True, epoch=1), pub("primary", 1.0, 1), pub("primary", 1.2, 2, "b"),
        pub("primary", 61.0, 3, "b", "p2"), stage("primary", 1.0045, "replicated", [1, 2]),
        stage("primary", 1.3, "delivered", [1, 2]), stage("primary", 1.4, "acknowledged", [1]),
        stage("primary", 1.41, "spooled", [1, 2, 3]), "", *BAD[:4],
        line("primary", 2.0, "unlogged", counts={"message_delivered": 7, "message_spooled": 2}),
        line("primary", 3.0, "client_accepted", client_id="c1", extra_field="ignored"),
        line("primary", 4.0, "node_alive", serving=None, epoch=1),
        line("primary", 5.5, "node_alive", serving=False, epoch=1),
        line("../../x=1", 6.0, "node_alive", serving=True, epoch=1)],  # a partition name to escape
    "primary/events/events-primary-00000002.jsonl": [  # 2 and 3 settle here; 1 is redelivered
        stage("primary", 62.0, "acknowledged", [2]), stage("primary", 62.5, "replicated", [3]),
        stage("primary", 62.6, "delivered", [3, 1]), stage("primary", 63.0, "acknowledged", [3]), *BAD[4:],
        pub("primary", 86_400.25, 4, "c", created=86_400_000)],
    "backup/events/events-backup-00000001.jsonl": [
        line("backup", 70.0, "redundancy_decision", kind="activate", epoch=2, reason="backup: taking over"),
        pub("backup", 70.1, 1, "a", epoch=2), stage("backup", 70.2, "delivered", [1, 2], client="s", epoch=2),
        # replicated only when the standby caught up: its own latency stage
        line("backup", 70.35, "message_replicated", msg_ids=[1], seq=9, epoch=2, after_resync=True),
        line("backup", 71.0, "publish_outcomes", epoch=2,
             outcomes=[{"topic": "a", "qos": 1, "outcome": "queued", "messages": 1},
                       {"topic": "z", "qos": 1, "outcome": "no_subscriber", "messages": 1000}])],
    "monitor/events/events.jsonl": [line("monitor", 71.0, "node_alive", serving=False, epoch=2), "{broken"],
}


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    root = tmp_path_factory.mktemp("logs")
    for name, lines in SEGMENTS.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("".join(text + "\n" for text in lines))
    return root


def paths(spark, logs) -> list[str]:
    return [s.path for s in ingest.list_segments(spark, [logs.as_uri()])]


def derived(p: partials.Partials) -> dict:
    return {"stages": t.stage_counts(p.stage_totals.unionByName(p.messages.select("node", *partials.STAGE_NAMES))),
            "latency": p.latency.unionByName(partials.latency_histogram(p.messages)),
            "in_flight": p.messages.filter((F.col("published") > 0) & (F.col("acknowledged") == 0))}


def test_the_partials_equal_those_of_spark_s_reader_and_reduce(spark, logs, tmp_path):
    found = paths(spark, logs)
    ours = partials.merge([ingest.reduce_segments(spark, found, f"{tmp_path.as_uri()}/events")], regroup=True)
    theirs = partials.reduce(ingest.read_json(spark, found))
    for kind in ("counts", "traffic", "deliveries", "redelivered", "pulses", "small"):
        assertDataFrameEqual(getattr(ours, kind), getattr(theirs, kind))
    # Settled per segment, a message redelivered in a later segment is an open row with published 0 beside the
    # stage totals (partials.py's rules): the stage counts, the latencies and the messages in flight are the same.
    ours_, theirs_ = derived(ours), derived(theirs)
    for kind in ours_:
        assertDataFrameEqual(ours_[kind], theirs_[kind])
    # Not vacuous: the lines above give every kind rows, bad lines included.
    counts = {(r.node, r.event): r.events for r in ours.counts.collect()}
    assert counts[("primary", "malformed")] == 8 and counts[("monitor", "malformed")] == 1
    assert ours_["in_flight"].count() == 2 and ours.redelivered.first().extra == 3  # in flight: backup 1, primary 4
    assert ours.small.filter(F.col("event") == "unlogged").first().counts == {"message_delivered": 7,
                                                                            "message_spooled": 2}
    late = {(r.stage, r.latency_ms): r.messages for r in ours_["latency"].collect() if r.stage == "replicated_late"}
    assert late == {("replicated_late", 250): 1}
    [outcomes] = ours.small.filter(F.col("event") == "publish_outcomes").collect()
    assert [(o.topic, o.outcome, o.messages) for o in outcomes.outcomes] == [("a", "queued", 1),
                                                                             ("z", "no_subscriber", 1000)]


def test_the_written_table_holds_the_rows_spark_s_reader_gives(spark, logs, tmp_path):
    found = paths(spark, logs)
    table = f"{tmp_path.as_uri()}/events"
    ingest.reduce_segments(spark, found, table)
    spark.catalog.clearCache()
    written = spark.read.schema(schema.TABLE).parquet(table)
    assert sorted(r.day for r in written.select("day").distinct().collect()) == ["1970-01-01", "1970-01-02",
                                                                                  "unknown"]
    columns = [f.name for f in schema.TABLE.fields if f.name != "segment"]
    theirs = ingest.read_json(spark, found)
    # Spark names a file by its URI, the job by the path it listed: the same file. Of a line that did not parse,
    # Spark may keep the fields it read before the error; the job keeps none, only that it was malformed.
    assertDataFrameEqual(written.filter(~F.col("malformed")).select(*columns),
                         theirs.filter(~F.col("malformed")).select(*columns))
    malformed = lambda df: df.filter(F.col("malformed")).groupBy("node").count()  # noqa: E731
    assertDataFrameEqual(malformed(written), malformed(theirs))
    assert {r.segment for r in written.select("segment").distinct().collect()} == set(found)
    assert "../../x=1" in {r.node for r in written.select("node").distinct().collect()}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["events"]  # nothing written outside the table


def test_a_refused_block_costs_only_its_own_lines(logs):
    """One bad line among good ones: the good lines of its block are rows, the bad one is malformed."""
    reducer = segment_task.Reducer(pa.schema([("v", pa.int32()), ("ts", pa.float64()), ("mono_ms", pa.int64()),
                                              ("node", pa.string()), ("event", pa.string()),
                                              ("serving", pa.bool_()),
                                              ("counts", pa.map_(pa.string(), pa.int64()))]), {}, None)
    data = "".join(text + "\n" for text in [line("primary", 1.0, "node_alive"), "{bad",
                                              line("primary", 2.0, "node_alive", serving="yes"),
                                              line("primary", 3.0, "node_alive", serving=True)]).encode()
    rows = reducer.rows(data, "file:/x/events-primary-00000001.jsonl")
    assert sorted(zip(rows["ts"].to_pylist(), rows["malformed"].to_pylist(), rows["node"].to_pylist(),
                      strict=True), key=str) == [(1.0, False, "primary"), (3.0, False, "primary"),
                                                 (None, True, "primary"), (None, True, "primary")]


def test_a_segment_gone_since_it_was_listed_gives_no_rows_and_no_error(spark, logs, tmp_path):
    """The active segment rotated (or a closed one removed by retention) between Spark's listing and the task."""
    found = paths(spark, logs)
    gone = found[0].replace("events-", "events-gone-")
    p = partials.merge([ingest.reduce_segments(spark, [gone, found[0]])], regroup=True)
    one = partials.merge([ingest.reduce_segments(spark, [found[0]])], regroup=True)
    assertDataFrameEqual(p.counts, one.counts)
    assert p.counts.count() > 0


def test_two_roots_with_segments_of_one_name_keep_both_in_the_table(spark, tmp_path):
    """Two groups' primaries both write events-primary-00000001.jsonl: the table holds the rows of both."""
    found = []
    for group, n in (("a", 2), ("b", 3)):
        segment = tmp_path / group / "primary" / "events" / "events-primary-00000001.jsonl"
        segment.parent.mkdir(parents=True)
        segment.write_text("".join(line("primary", 1.0 + i, "node_alive", serving=True, epoch=1) + "\n"
                                   for i in range(n)))
        found += paths(spark, tmp_path / group)
    table = f"{tmp_path.as_uri()}/events"
    ingest.reduce_segments(spark, found, table)
    spark.catalog.clearCache()
    written = spark.read.schema(schema.TABLE).parquet(table)
    assert {(r.segment, r["count"]) for r in written.groupBy("segment").count().collect()} == {
        (found[0], 2), (found[1], 3)}

"""The analytics job on written segments (one shared SparkSession): malformed lines are counted, never fatal;
closed segments are ingested once and a re-run parses only new ones; the Rich rendering; the CLI's refusals."""

from __future__ import annotations

import io
import json
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from rich.console import Console

from pairmq.analytics import manifest, render, summary
from pairmq.analytics.ingest import AnalyticsError
from pairmq.appliance.eventlog import EventLog, EventSettings
from pairmq.cli.main import main
from pairmq.cli.terminal import Terminal
from tests.harness.spark_session import spark  # noqa: F401


def write_segment(directory, node: str, seq: int, lines: list[str]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"events-{node}-{seq:08d}.jsonl").write_text("".join(line + "\n" for line in lines))


def published(node: str, ts: float, msg_id: int, topic: str = "t") -> str:
    return json.dumps({"v": 2, "ts": ts, "mono_ms": int(ts * 1000), "node": node, "event": "message_published",
                       "msg_id": msg_id, "topic": topic, "qos": 1, "bytes": 3, "client": "c", "epoch": 1,
                       "retain": False, "created_ms": int(ts * 1000)})


def test_malformed_lines_are_counted_and_ingestion_happens_once(spark, tmp_path):
    logs, out = tmp_path / "logs", tmp_path / "out"
    write_segment(logs / "primary", "primary", 1, [published("primary", 100.0, 1), "{not json",
                                                   '{"v":2,"event":"node_alive"}', published("primary", 101.0, 2)])
    first = summary.summarize(spark, [logs.as_uri()], out.as_uri())
    assert first["malformed_lines"] == 2 and first["messages"]["published_per_node"] == {"primary": 2}
    assert (first["inputs"]["segments_ingested_now"], first["inputs"]["segments_from_table"]) == (1, 0)

    write_segment(logs / "backup", "backup", 1, [published("backup", 200.0, 1, "u")])
    second = summary.summarize(spark, [logs.as_uri()], out.as_uri())
    assert (second["inputs"]["segments_ingested_now"], second["inputs"]["segments_from_table"]) == (1, 1)
    assert second["messages"]["published_per_node"] == {"primary": 2, "backup": 1}
    assert second["malformed_lines"] == 2  # counted once, from the table

    shutil.rmtree(logs / "primary")  # ingested segments may be gone from the nodes (retention): the table has them
    third = summary.summarize(spark, [logs.as_uri()], out.as_uri())
    assert third["messages"]["published_per_node"] == {"primary": 2, "backup": 1}


def stage(node: str, ts: float, kind: str, ids: list[int], client: str = "s", epoch: int = 1) -> str:
    return json.dumps({"v": 2, "ts": ts, "mono_ms": int(ts * 1000), "node": node, "event": f"message_{kind}",
                       "msg_ids": ids, "client": client, "epoch": epoch})


def test_reports_from_the_settled_state_equal_those_of_one_pass_over_every_segment(spark, tmp_path):
    """Messages straddle segments ingested by different runs (published in one, acknowledged or redelivered in the
    next): the reports from the stored state, merged and settled run after run, are those of one run that
    parses every segment without --out."""
    logs, out = tmp_path / "logs", tmp_path / "out"
    views = []
    batches = [
        [published("primary", 100.0, 1, "a"), published("primary", 100.5, 2, "b"), published("primary", 100.6, 3),
         stage("primary", 100.51, "replicated", [1, 2]), stage("primary", 100.52, "delivered", [1, 2]),
         stage("primary", 100.55, "acknowledged", [1])],
        [stage("primary", 160.0, "acknowledged", [2]), stage("primary", 161.0, "delivered", [1]),
         stage("primary", 161.5, "replicated", [3]), stage("primary", 161.6, "delivered", [3]),
         stage("primary", 170.0, "delivered", [2]), published("primary", 171.0, 4, "a"),
         stage("primary", 171.2, "spooled", [4])],
    ]
    for seq, lines in enumerate(batches, 1):
        write_segment(logs / "primary", "primary", seq, lines)
        if seq == 2:  # a run that crashed left its scratch of per-delivery keys: not counted again
            (out / "tables" / "_keys").mkdir()
            pq.write_table(pa.table({"client": ["s"], "msg_id": [3], "deliveries": [1]}),
                           out / "tables" / "_keys" / "events-primary-00000002-crashed.parquet")
        views.append(summary.summarize(spark, [logs.as_uri()], out.as_uri()))
        assert not (out / "tables" / "_keys").exists()
    once = summary.summarize(spark, [logs.as_uri()])
    ignore = ("inputs", "elapsed_s")
    assert {k: v for k, v in views[-1].items() if k not in ignore} == {k: v for k, v in once.items() if k not in ignore}
    assert {(r["stage"], r["messages"]) for r in once["stages"]} == {
        ("replicated", 3), ("delivered", 5), ("acknowledged", 2), ("spooled", 1)}
    assert once["delivery_problems"] == [{"what": "redelivered", "reason": "", "messages": 2}]
    assert [p.name for p in (out / "tables" / "state").iterdir()] == ["000002"]  # the first batch's is superseded


@pytest.mark.parametrize("layout", ["_ingested", "partials"])
def test_an_out_dir_from_before_the_settled_state_is_refused_with_a_sentence(spark, tmp_path, layout):
    logs, out = tmp_path / "logs", tmp_path / "out"
    write_segment(logs / "primary", "primary", 1, [published("primary", 100.0, 1)])
    # What the job wrote before it kept partial aggregates (_ingested), and before it settled them (partials/<batch>).
    (out / "tables" / layout).mkdir(parents=True)
    with pytest.raises(AnalyticsError) as refused:
        summary.summarize(spark, [logs.as_uri()], out.as_uri())
    assert str(refused.value) == (f"{out.as_uri()} was written by an earlier version of the job (no settled "
                                  "state): summarize into a new --out DIR")
    assert not (out / "tables" / "events").exists()


def test_an_out_dir_whose_delivery_keys_are_not_in_buckets_is_refused_with_a_sentence(spark, tmp_path):
    """What the job wrote before keys_task.py: the state's per-delivery keys as Spark's part files. Merged bucket by
    bucket they would be lost, and the redeliveries with them."""
    logs, out = tmp_path / "logs", tmp_path / "out"
    write_segment(logs / "primary", "primary", 1, [published("primary", 100.0, 1),
                                                   stage("primary", 100.1, "delivered", [1])])
    summary.summarize(spark, [logs.as_uri()], out.as_uri())
    keys = out / "tables" / "state" / "000001" / "deliveries"
    assert sorted(p.name for p in keys.iterdir()) == [f"b{b:03d}.parquet" for b in range(8)]
    for p in keys.iterdir():
        p.rename(keys / f"part-{p.name}")
    write_segment(logs / "primary", "primary", 2, [stage("primary", 160.0, "delivered", [1])])
    with pytest.raises(AnalyticsError) as refused:
        summary.summarize(spark, [logs.as_uri()], out.as_uri())
    assert str(refused.value) == (f"{out.as_uri()} was written by an earlier version of the job (per-delivery keys "
                                  "not in buckets): summarize into a new --out DIR")
    assert [p.name for p in (out / "tables" / "state").iterdir()] == ["000001"]


def test_the_manifest_lists_what_was_moved_into_place_and_what_spark_appended_before(spark, tmp_path):
    where = tmp_path / "_batches"
    # As the job wrote it before manifest.py: Spark's part files.
    spark.createDataFrame([("file:/a", "000001")], "path string, batch string").write.parquet(str(where))
    manifest.append(where.as_uri(), "000002", ["file:/b", "file:/c"])
    # A crash between the write and the move: the hidden file is never read, by the job or by Spark.
    pq.write_table(pa.table({"path": ["file:/d"], "batch": ["000003"]}), where / ".batch-000003.parquet.tmp")
    listed = {"file:/a": "000001", "file:/b": "000002", "file:/c": "000002"}
    assert manifest.read(where.as_uri()) == listed
    assert {r.path: r.batch for r in spark.read.parquet(str(where)).collect()} == listed
    assert manifest.read((tmp_path / "none").as_uri()) == {}


def test_an_active_segment_is_read_every_run_and_never_stored(spark, tmp_path):
    log = EventLog(tmp_path / "logs" / "primary" / "events", "primary", EventSettings())
    log.write("node_alive", serving=True, epoch=1)
    log.close()
    for _ in range(2):
        view = summary.summarize(spark, [(tmp_path / "logs").as_uri()], (tmp_path / "out").as_uri())
        assert view["events_per_node"] == {"primary": {"node_alive": 1}}
        assert view["inputs"] == {"roots": [(tmp_path / "logs").as_uri()], "segments_ingested_now": 0,
                                  "segments_from_table": 0, "active_segments": 1}


VIEW = {
    "inputs": {"segments_ingested_now": 2, "segments_from_table": 5, "active_segments": 3},
    "period": {"start": 1780000000.0, "end": 1780000600.0, "period_s": 600.0, "unavailable_ms": 1250,
               "availability": 0.997917},
    "messages": {"published": 70, "bytes": 4480, "published_per_node": {"primary": 40, "backup": 30}},
    "malformed_lines": 1,
    "incidents": [{"epoch": 2, "from_node": "primary", "to_node": "backup", "cause": "lost", "detection_ms": 1200,
                   "takeover_ms": 50, "unavailable_ms": 1250, "in_flight": 3}],
    "latency": [{"topic": "plant/1", "stage": "delivered", "messages": 55, "p50_ms": 4, "p90_ms": 9, "p99_ms": 20,
                 "max_ms": 31}],
    "top_topics": [{"topic": "plant/1", "messages": 55, "bytes": 3520}], "top_clients": [],
    "delivery_problems": [{"what": "redelivered", "reason": "", "messages": 0}], "overload_episodes": [],
    "unlogged": [],
}


def test_the_rich_rendering(tmp_path):
    console = Console(file=io.StringIO(), width=120)
    console.print(render.render(VIEW))
    lines = [line.rstrip() for line in console.file.getvalue().splitlines()]
    assert lines[:11] == [
        "Overview", "", "  what                 value",
        " " + "─" * 80,
        "  period               2026-05-28 20:26:40 UTC → 2026-05-28 20:36:40 UTC (600 s)",
        "  availability         99.792 % (1250 ms unavailable)",
        "  failovers            1 failover, 0 planned handovers",
        "  messages published   70 (4,480 bytes stored)",
        "  per node             backup 30, primary 40",
        "  malformed lines      1",
        "  segments             2 ingested now, 5 from the table, 3 active"]
    assert "      2   primary   backup   lost            1200            50             1250           3" in lines
    assert "  plant/1   delivered         55     4     9    20    31" in lines
    assert not any("Not logged" in line for line in lines)
    # Nothing to report: no table (overload, redeliveries 0, top clients, handovers)
    assert not any(word in line for line in lines for word in ("Overload", "Redeliveries", "Top clients",
                                                               "Planned handovers", "Late replication"))


def test_the_rendering_of_outcomes_handovers_and_late_replication():
    view = {**VIEW, "incidents": [],
            "handovers": [{"epoch": 3, "from_node": "backup", "to_node": "primary", "cause": "planned",
                           "detection_ms": 120, "takeover_ms": 30, "unavailable_ms": 150, "in_flight": 0}],
            "messages": {**VIEW["messages"], "published": 1070, "outcomes_logged": True, "stored": 70,
                         "by_outcome": {"delivered": 0, "queued": 70, "no_subscriber": 1000, "refused": 2}},
            "publish_outcomes": [{"node": "primary", "topic": "secret", "qos": 1, "outcome": "refused", "messages": 2}],
            "late_replication": {"messages": 20, "max_ms": 5300, "periods": 1, "down_ms": 5000, "still_down": 0},
            "delivery_problems": [{"what": "redelivered", "reason": "", "messages": 4}]}
    console = Console(file=io.StringIO(), width=300)  # the sentence on one line
    console.print(render.render(view))
    lines = [line.rstrip() for line in console.file.getvalue().splitlines()]
    assert "  failovers            0 failovers, 1 planned handover" in lines
    assert "  availability         99.792 % (1250 ms unavailable, 150 ms of it in planned handovers)" in lines
    assert "  outcomes             0 delivered at once, 70 queued, 1,000 no subscriber, 2 refused" in lines
    assert "Planned handovers" in lines and "Failover incidents" not in lines
    assert "      3   backup   primary           120            30              150           0" in lines
    assert ("Late replication: 20 messages were stored while the standby was out of sync and replicated only when it "
            "caught up (up to 5,300 ms later); the replicated_late rows, apart from live replication. Out of sync 1 "
            "time (5,000 ms in all).") in lines
    assert "  primary   secret     1          2" in lines and "  redelivered                   4" in lines


def run_cli(*argv) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(["analytics", "summarize", *argv],
                Terminal(Console(file=out, width=120), Console(file=err, width=400, highlight=False)))
    return code, out.getvalue(), err.getvalue()


def test_the_cli_refuses_bad_input_before_starting_spark(tmp_path):
    code, _, err = run_cli(str(tmp_path / "nope"))
    assert code == 1 and f"error: no event logs at {tmp_path / 'nope'}: the path does not exist" in err
    (tmp_path / "empty").mkdir()
    code, _, err = run_cli(str(tmp_path / "empty"))
    assert code == 1 and "error: no event log segments (events*.jsonl) under" in err
    code, _, err = run_cli(str(tmp_path), "--top", "0")
    assert code == 1 and "error: --top must be from 1 to 1000, not 0" in err
    code, _, err = run_cli()
    assert code == 2 and "the following arguments are required: LOGS" in err

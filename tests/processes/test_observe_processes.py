"""Observability against a real group: `/metrics` parsed strictly and seen to move, the decision stream
(backlog, live decisions, Last-Event-ID, its bound), `/api/v1/group` with a node down, and bad input."""

from __future__ import annotations

import json
import re
import time

import pytest

from pairmq.appliance.api.decisions import MAX_STREAMS
from pairmq.appliance.broker.service import DEFER_MS
from pairmq.appliance.quorum.auth import REASONS
from pairmq.appliance.roles import Role
from pairmq.cli import api
from tests.harness.group import active_group
from tests.harness.http_api import get, hand_over, stream
from tests.harness.paho_clients import client

P, B, M = Role.PRIMARY, Role.BACKUP, Role.MONITOR

# --- a strict reader of the Prometheus text format (0.0.4) ------------------------------------------

NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
LABEL = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*"'
VALUE = r"(?:[-+]?(?:\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|\.\d+)|NaN|[-+]Inf)"
SAMPLE = re.compile(rf"({NAME})(?:\{{((?:{LABEL})(?:,{LABEL})*)?\}})? ({VALUE})")
HELP = re.compile(rf"# HELP ({NAME}) (.*)")
TYPE = re.compile(rf"# TYPE ({NAME}) (counter|gauge|histogram|summary|untyped)")


def parse_metrics(text: str) -> dict[str, dict]:
    """{name: {"type", "help", "samples": {frozenset(labels): value}}}; any line out of format fails."""
    assert text.endswith("\n"), "the exposition must end with a newline"
    metrics: dict[str, dict] = {}
    current = None
    for n, line in enumerate(text.splitlines(), 1):
        if m := HELP.fullmatch(line):
            assert m[1] not in metrics, f"line {n}: a second HELP for {m[1]}"
            metrics[m[1]] = current = {"help": m[2], "type": None, "samples": {}, "name": m[1]}
        elif m := TYPE.fullmatch(line):
            assert current is not None and current["name"] == m[1] and current["type"] is None, \
                f"line {n}: TYPE {m[1]} without its HELP just before"
            current["type"] = m[2]
        elif m := SAMPLE.fullmatch(line):
            assert current is not None, f"line {n}: sample of {m[1]} outside a block"
            assert current["type"] is not None, f"line {n}: {m[1]} has no TYPE"
            labels = frozenset(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', m[2] or ""))
            if current["type"] == "histogram":  # name_bucket{le=...}, name_sum, name_count
                suffix = m[1].removeprefix(current["name"])
                assert suffix in ("_bucket", "_sum", "_count"), f"line {n}: sample of {m[1]} outside its block"
                labels |= {("__sample__", suffix)}
            else:
                assert m[1] == current["name"], f"line {n}: sample of {m[1]} outside its block"
            assert labels not in current["samples"], f"line {n}: a duplicate sample"
            current["samples"][labels] = float(m[3])
        else:
            raise AssertionError(f"line {n} is not in the Prometheus text format: {line!r}")
    for name, metric in metrics.items():
        assert name.startswith(("pairmq_", "process_", "python_")), name  # ours, and the default collectors'
        assert metric["type"] in ("counter", "gauge", "histogram"), name
        assert metric["help"], f"{name} has an empty HELP"
        assert not (metric["type"] == "counter") ^ name.endswith("_total"), f"{name}: counters, and only they, end in _total"
    return metrics


def scrape(g, role: Role) -> dict[str, dict]:
    answer = get(g.config, f"{api.base_url(g.config, role)}/metrics")
    assert answer.status == 200 and answer.content_type.startswith("text/plain"), answer
    return parse_metrics(answer.text)


def value(metrics: dict, name: str, **labels: str) -> float:
    return metrics[name]["samples"][frozenset(labels.items())]


def test_the_strict_parser_refuses_what_prometheus_would():
    good = "# HELP pairmq_x_total X.\n# TYPE pairmq_x_total counter\npairmq_x_total{a=\"b\\\"c\"} 3\n"
    assert value(parse_metrics(good), "pairmq_x_total", a='b\\"c') == 3
    for bad in (good.replace(" 3\n", " three\n"), good.replace("# TYPE pairmq_x_total counter\n", ""),
                good.replace("counter", "gauge"), good.rstrip("\n"), good + "pairmq_y 1\n",
                good.replace('{a="b\\"c"}', "{a=b}")):
        with pytest.raises(AssertionError):
            parse_metrics(bad)


def test_metrics_are_well_formed_on_every_node_and_move_with_messages_and_failover(tmp_path):
    with active_group(tmp_path) as g:
        primary, backup, monitor = scrape(g, P), scrape(g, B), scrape(g, M)
        assert value(primary, "pairmq_active", role="primary") == 1
        assert value(backup, "pairmq_active", role="backup") == 0
        assert value(monitor, "pairmq_active", role="monitor") == 0
        epoch = value(primary, "pairmq_epoch")
        assert epoch >= 1 and value(backup, "pairmq_epoch") == epoch
        assert {dict(k)["reason"] for k in primary["pairmq_heartbeats_rejected_total"]["samples"]} == set(REASONS)
        assert value(primary, "pairmq_peer_seen", peer="backup") == 1
        assert value(monitor, "pairmq_peer_seen", peer="primary") == 1
        assert value(primary, "pairmq_mate_link_up") == 1 and value(primary, "pairmq_mate_link_lag_ops") >= 0
        assert value(primary, "pairmq_config_version") >= 1 and value(primary, "pairmq_config_sync_in_sync") == 1
        assert 1 <= value(primary, "pairmq_overload_window") <= 100
        assert "pairmq_spool_queued_messages" not in monitor  # the monitor routes no messages: left out, not 0
        assert value(monitor, "pairmq_decisions_total") >= 1

        # 30 QoS 1 messages in, 30 out to a subscriber, 5 queued for an offline persistent session.
        sub, got = client("metrics-sub", g.address(P), persistent=False)
        sub.subscribe("metrics/t", qos=1)
        parked, _ = client("metrics-parked", g.address(P), persistent=True)
        parked.subscribe("metrics/parked", qos=1)
        g.wait_for("the subscriptions", lambda: scrape(g, P)["pairmq_spool_sessions"]["samples"][frozenset()] >= 2)
        parked.disconnect()
        parked.loop_stop()
        pub, _ = client("metrics-pub", g.address(P), persistent=False)
        for i in range(30):
            pub.publish("metrics/t", f"m{i}".encode(), qos=1).wait_for_publish(5)
        for i in range(5):
            pub.publish("metrics/parked", f"p{i}".encode(), qos=1).wait_for_publish(5)
        for _ in range(30):
            got.get(timeout=5)
        after = scrape(g, P)
        assert value(after, "pairmq_messages_received_total") - value(primary, "pairmq_messages_received_total") == 35
        assert value(after, "pairmq_messages_sent_total") - value(primary, "pairmq_messages_sent_total") == 30
        # the subscriber's last PUBACKs may still be on their way: wait for them to settle, then five stay queued
        g.wait_for("five parked messages queued", lambda: value(scrape(g, P), "pairmq_spool_queued_messages") == 5)
        assert value(after, "pairmq_mqtt_clients") == 2
        for c in (sub, pub):
            c.disconnect()
            c.loop_stop()
        # The subscriber's PUBACKs and its session's end travel lazily (no client waits for them): let them reach
        # the backup before the kill, so that only the parked five are queued there.
        def ends_replicated() -> bool:
            m = scrape(g, P)
            return (value(m, "pairmq_spool_sessions") == 1 and value(m, "pairmq_spool_pending_ops") == 0
                    and value(m, "pairmq_mate_link_lag_ops") == 0)
        g.wait_for("the clients' ends on the backup", ends_replicated)
        time.sleep(2 * DEFER_MS / 1000)  # an op nobody waits for may be held back this long before it is written
        g.wait_for("the clients' ends on the backup", ends_replicated)

        g.kill(P)
        g.wait_for("the backup to serve", lambda: value(scrape(g, B), "pairmq_active", role="backup") == 1)
        moved = scrape(g, B)
        assert value(moved, "pairmq_epoch") > epoch
        assert value(moved, "pairmq_spool_queued_messages") == 5  # replicated before the PUBACKs
        assert value(scrape(g, M), "pairmq_peer_seen", peer="primary") == 0


def read_until_live(response) -> list[tuple[str, str, dict]]:
    backlog = []
    for event, event_id, data in response.events():
        if event == "live":
            return backlog
        assert event == "decision", event
        backlog.append((event, event_id, json.loads(data)))
    raise AssertionError("the stream ended before its backlog did")


def next_decision(response, predicate) -> tuple[str, dict]:
    for event, event_id, data in response.events():
        if event == "decision" and predicate(decision := json.loads(data)):
            return event_id, decision
    raise AssertionError("the stream ended first")


def test_the_decision_stream_sends_the_backlog_then_live_decisions_and_resumes_from_last_event_id(tmp_path):
    with active_group(tmp_path) as g:
        url = f"{api.base_url(g.config, B)}/api/v1/decisions/stream"
        response = stream(g.config, url)
        assert response.content_type.startswith("text/event-stream")
        backlog = read_until_live(response)
        seqs = [d["seq"] for _, _, d in backlog]
        assert seqs == list(range(1, len(seqs) + 1)) and len(seqs) >= 2
        assert all(event_id == d["id"] and event_id.endswith(f"-{d['seq']}") for _, event_id, d in backlog)
        assert any(d["kind"] == "boot" for _, _, d in backlog)
        assert {d["node"] for _, _, d in backlog} == {"backup"}
        epoch = max(d["epoch"] for _, _, d in backlog)

        # release-activity on the primary: the backup's stream carries its activation as it happens.
        result = hand_over(g.config, P)
        assert result["result"] == "handed over", result
        event_id, activate = next_decision(response, lambda d: d["kind"] == "activate")
        response.close()
        assert activate["epoch"] == epoch + 1 and "taking activity" in activate["reason"]
        assert activate["seq"] > seqs[-1] and re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", activate["at"])

        # Resume: after the second backlog event, the first one sent is the third, in order.
        resumed = stream(g.config, url, last_event_id=backlog[1][1])
        again = read_until_live(resumed)
        resumed.close()
        assert [d["seq"] for _, _, d in again][:len(seqs) - 2] == seqs[2:]
        assert activate["seq"] in [d["seq"] for _, _, d in again]
        # An id from another incarnation (or garbage) starts from the whole backlog.
        for foreign in ("999999-1", "not an id"):
            whole = stream(g.config, url, last_event_id=foreign)
            assert [d["seq"] for _, _, d in read_until_live(whole)][0] == 1
            whole.close()


def test_streams_are_bounded_and_bad_paths_are_refused_as_json(tmp_path):
    with active_group(tmp_path) as g:
        base = api.base_url(g.config, M)
        open_streams = [stream(g.config, f"{base}/api/v1/decisions/stream") for _ in range(MAX_STREAMS)]
        try:
            g.wait_for("the monitor to count its streams",
                       lambda: value(scrape(g, M), "pairmq_decision_streams") == MAX_STREAMS)
            refused = get(g.config, f"{base}/api/v1/decisions/stream")
            assert refused.status == 503 and f"{MAX_STREAMS} decision streams are open" in refused.json()["error"]
            with pytest.raises(api.ApiError, match="decision streams are open already"):
                stream(g.config, f"{base}/api/v1/decisions/stream")
        finally:
            for s in open_streams:
                s.close()
        g.wait_for("the streams to close", lambda: value(scrape(g, M), "pairmq_decision_streams") == 0)
        assert stream(g.config, f"{base}/api/v1/decisions/stream").status == 200  # room again
        for path in ("/static/status.py", "/static/..%2F..%2Fnode.py", "/static/%2e%2e", "/static/nothing.js"):
            answer = get(g.config, base + path)
            assert answer.status == 404 and answer.json()["error"].startswith("no static file"), (path, answer)
        assert get(g.config, base + "/static/status.js").content_type.startswith("text/javascript")
        assert get(g.config, base + "/nothing-here").status == 404


def test_the_group_view_names_an_unreachable_node(tmp_path):
    with active_group(tmp_path) as g:
        g.kill(B)
        document = g.wait_for("the backup to be unreachable", lambda: (
            d if not (d := get(g.config, f"{api.base_url(g.config, M)}/api/v1/group").json())["nodes"][1]["reachable"]
            else None))
        assert document["served_by"] == "monitor"
        assert [n["role"] for n in document["nodes"]] == ["primary", "backup", "monitor"]
        down = document["nodes"][1]
        assert down["address"] == g.address(B) and "connection refused" in down["error"]
        assert document["nodes"][0]["serving"] and document["nodes"][0]["metrics"]["pairmq_active"] == 1

"""End to end: a local group (real node processes) runs paho-mqtt traffic with a kill -9 of the active primary,
then `pairmq analytics summarize` over the three nodes' logs reconstructs that failover and the exact counts.

The traffic is split in two phases with quiet in between so the counts are exact: 40 QoS 1 messages through
the primary (all acknowledged by publisher and subscriber before the kill), then 30 through the backup after
it took over. Segments are kept small (4 KiB) so the logs rotate and the job ingests closed segments; a
second run must ingest nothing new and report the same.
"""

from __future__ import annotations

import json
import queue
import socket
import subprocess
import sys
import threading
import time

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from pairmq.appliance.eventlog import EventSettings, segments
from pairmq.appliance.roles import Role
from tests.harness.group import REPO, active_group

P, B = Role.PRIMARY, Role.BACKUP
TOPICS_BEFORE = {"plant/1/temp": 25, "plant/2/power": 15}
TOPICS_AFTER = {"plant/1/temp": 30}


def connect(client_id: str, host: str, *, persistent: bool) -> tuple[mqtt.Client, queue.Queue]:
    got: queue.Queue = queue.Queue()
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5)
    c.on_message = lambda cl, ud, msg: got.put((msg.topic, msg.payload))
    connected = threading.Event()
    c.on_connect = lambda cl, ud, flags, rc, props: connected.set() if rc == 0 else None
    props = Properties(PacketTypes.CONNECT)
    if persistent:
        props.SessionExpiryInterval = 3600
    c.connect(host, 1883, keepalive=30, clean_start=not persistent, properties=props)
    c.loop_start()
    if not connected.wait(5):
        pytest.fail(f"{client_id}: no CONNACK from {host}")
    return c, got


def publish_all(host: str, client_id: str, topics: dict[str, int]) -> None:
    pub, _ = connect(client_id, host, persistent=False)
    infos = [pub.publish(topic, f"{topic}#{i}".encode().ljust(64, b"."), qos=1)
             for topic, n in topics.items() for i in range(n)]
    for info in infos:
        info.wait_for_publish(10)
        assert info.is_published(), f"{client_id}: a QoS 1 PUBLISH to {host} was not acknowledged"
    pub.disconnect()
    pub.loop_stop()


def receive(got: queue.Queue, n: int) -> list:
    out = []
    deadline = time.monotonic() + 15
    while len(out) < n and time.monotonic() < deadline:
        try:
            out.append(got.get(timeout=0.5))
        except queue.Empty:
            pass
    return out


def summarize(logs, out) -> dict:
    run = subprocess.run([sys.executable, "-m", "pairmq.cli.main", "analytics", "summarize", str(logs), "--out", str(out),
                          "--json"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, f"analytics failed ({run.returncode}): {run.stderr[-3000:]}"
    return json.loads(run.stdout)


def test_the_job_reconstructs_a_kill_9_failover_and_the_exact_counts(tmp_path):
    settings = EventSettings(segment_max_bytes=4096, retain_max_bytes=64 * 1024 * 1024)
    with active_group(tmp_path / "group", events=settings) as g:
        sub, got = connect("fleet", g.address(P), persistent=True)
        assert sub.subscribe("plant/#", qos=1)[0] == mqtt.MQTT_ERR_SUCCESS
        time.sleep(0.5)  # the SUBACK and its replication
        publish_all(g.address(P), "line-1", TOPICS_BEFORE)
        with socket.create_connection((g.address(P), 1883), timeout=5) as bad:  # a rejected frame: logged
            bad.sendall(b"\xf0\x00")
            bad.recv(16)
        assert len(receive(got, 40)) == 40
        time.sleep(1.5)  # the subscriber's PUBACKs committed and replicated, the event queues drained
        sub.disconnect()
        sub.loop_stop()
        killed_at = time.time()
        g.kill(P)
        g.wait_for("the backup to take over", lambda: g.probe_once()[B] == 0, timeout_s=15)
        sub, got = connect("fleet", g.address(B), persistent=True)
        publish_all(g.address(B), "line-2", TOPICS_AFTER)
        assert len(receive(got, 30)) == 30
        time.sleep(1.5)
        sub.disconnect()
        sub.loop_stop()
        data = g.dir / "data"
    rotated = [p for p in segments(data / "primary" / "events") if p.name != "events.jsonl"]
    assert rotated, "the 4 KiB segments never rotated: the test would not exercise ingestion"

    view = summarize(data, tmp_path / "report")
    assert view["malformed_lines"] == 0
    assert view["events_per_node"]["primary"]["bad_packet"] == 1
    assert view["messages"]["published_per_node"] == {"primary": 40, "backup": 30, "monitor": 0}
    assert view["messages"]["bytes"] == 70 * 64
    stages = {(r["node"], r["stage"]): r["messages"] for r in view["stages"]}
    assert stages[("primary", "spooled")] == 40 and stages[("backup", "spooled")] == 30
    assert stages[("primary", "replicated")] == 40  # the backup had every one before the kill
    assert stages[("primary", "delivered")] == 40 and stages[("backup", "delivered")] == 30
    assert stages[("primary", "acknowledged")] == 40 and stages[("backup", "acknowledged")] == 30
    assert {r["topic"]: r["messages"] for r in view["top_topics"]} == {"plant/1/temp": 55, "plant/2/power": 15}
    assert {r["client"]: r["messages"] for r in view["top_clients"]} == {"line-1": 40, "line-2": 30}

    [incident] = view["incidents"]
    assert (incident["from_node"], incident["to_node"], incident["cause"]) == ("primary", "backup", "lost")
    assert incident["epoch"] >= 2 and incident["in_flight"] == 0
    # The primary's last sign of serving is its last pulse before the kill (a second apart, more on a busy machine).
    assert killed_at - 3.0 <= incident["last_seen_old"] <= killed_at + 0.05
    assert incident["last_seen_old"] <= incident["detected"] <= incident["takeover"]
    assert incident["unavailable_ms"] == incident["detection_ms"] + incident["takeover_ms"]
    assert 0 < incident["unavailable_ms"] < 10_000
    assert 0 < view["period"]["availability"] < 1
    deliver = {(r["topic"], r["stage"]): r for r in view["latency"]}
    assert deliver[("plant/1/temp", "delivered")]["messages"] == 55
    assert deliver[("plant/2/power", "replicated")]["messages"] == 15
    assert all(0 <= r["p50_ms"] <= r["p90_ms"] <= r["p99_ms"] <= r["max_ms"] for r in view["latency"])
    for name in ("message_rate", "latency", "availability"):
        png = tmp_path / "report" / "charts" / f"{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", f"{png} is not a PNG"
    assert (tmp_path / "report" / "reports" / "incidents").is_dir()
    assert view["inputs"]["segments_ingested_now"] >= len(rotated) and view["inputs"]["segments_from_table"] == 0
    # A re-run over the ingested segments (ingested once, the same reports from the stored partials) is
    # test_analytics_job.py's and test_analytics_transforms.py's: here it would cost a second JVM.


def test_a_full_disk_stops_event_logging_not_the_node(tmp_path):
    """The primary's active segment is /dev/full (every write fails with ENOSPC): the node still takes activity
    and acknowledges QoS 1 messages, and its management view says why its event log stopped."""
    events_dir = tmp_path / "group" / "data" / "primary" / "events"
    events_dir.mkdir(parents=True)
    (events_dir / "events.jsonl").symlink_to("/dev/full")
    with active_group(tmp_path / "group") as g:
        sub, got = connect("watcher", g.address(P), persistent=False)
        assert sub.subscribe("plant/#", qos=1)[0] == mqtt.MQTT_ERR_SUCCESS
        time.sleep(0.3)
        publish_all(g.address(P), "line-3", {"plant/9/temp": 10})
        assert len(receive(got, 10)) == 10
        sub.disconnect()
        sub.loop_stop()
        log = g.api(P, "/api/v1/redundancy")["event_log"]
        assert log["failed"] == f"No space left on device ({events_dir / 'events.jsonl'})"
        assert log["written"] == 0 and log["lost"] > 10
        assert g.events(B), "the backup's log is unaffected"
    assert "event logging stopped" in (tmp_path / "group" / "primary.log").read_text()

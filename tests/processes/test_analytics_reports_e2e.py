"""End to end, what the reports say about a real group's logs: every PUBLISH counted with its outcome, a kill -9
failover apart from a planned handover (revert-activity), and messages the backup stored while the primary was
down reported as replicated late, not as slow replication.

The story: 40 QoS 1 messages to a subscribed topic (queued), 1,000 QoS 1 to a topic nobody subscribes to, 5 QoS 0
to a connected subscriber (delivered at once), 3 QoS 0 to $SYS (refused); kill -9 of the primary; 20 QoS 1 on the
backup for the subscriber now offline (queued, stored while the backup had no standby); the primary restarts,
catches up, and `pairmq redundancy revert-activity` hands activity back to it.
"""

from __future__ import annotations

import io
import re
import time

import paho.mqtt.client as mqtt
from rich.console import Console

from pairmq.analytics import render
from pairmq.analytics.transforms import SILENCE
from pairmq.appliance.eventlog import EventSettings
from pairmq.appliance.roles import Role
from tests.harness.group import active_group
from tests.processes.test_analytics_e2e import connect, publish_all, receive, summarize
from tests.processes.test_handover_processes import in_sync_with, pairmq

P, B = Role.PRIMARY, Role.BACKUP


def publish_qos0(host: str, client_id: str, topic: str, n: int) -> None:
    pub, _ = connect(client_id, host, persistent=False)
    for i in range(n):
        pub.publish(topic, b"q0-%d" % i, qos=0).wait_for_publish(5)
    pub.disconnect()
    pub.loop_stop()


def test_outcomes_a_failover_a_planned_handover_and_late_replication_from_real_logs(tmp_path):
    settings = EventSettings(segment_max_bytes=16384, retain_max_bytes=64 * 1024 * 1024)
    with active_group(tmp_path / "group", events=settings) as g:
        sub, got = connect("fleet", g.address(P), persistent=True)
        assert sub.subscribe("plant/#", qos=1)[0] == mqtt.MQTT_ERR_SUCCESS
        time.sleep(0.5)  # the SUBACK and its replication
        publish_all(g.address(P), "line-1", {"plant/1/temp": 40})
        publish_all(g.address(P), "quiet-1", {"nobody/listens": 1000})
        publish_qos0(g.address(P), "gauge-1", "plant/2/power", 5)
        publish_qos0(g.address(P), "forger", "$SYS/broker/uptime", 3)
        assert len(receive(got, 45)) == 45
        time.sleep(1.5)  # the subscriber's acks replicated; the last second's outcome counts written
        sub.disconnect()
        sub.loop_stop()

        killed_at = time.time()
        g.kill(P)
        g.wait_for("the backup to take over", lambda: g.probe_once()[B] == 0, timeout_s=15)
        bid = g.decisions(B, "bid")[-1]
        publish_all(g.address(B), "line-2", {"plant/1/temp": 20})  # queued for the offline subscriber

        g.start(P)  # back as the standby: it catches up on what the backup stored alone
        g.wait_for("the restarted primary in sync", lambda: in_sync_with(g, P, B), timeout_s=30)
        asked_at = time.time()
        reverted = pairmq(g, "revert-activity")
        assert reverted.returncode == 0 and "backup: handed activity over in" in reverted.stderr, reverted.stderr
        g.wait_for("the primary to serve again", lambda: g.probe_once()[P] == 0, timeout_s=15)
        handover_decision = g.decisions(B, "handover")[-1]
        time.sleep(1.5)
        # The standby and the monitor go first, so that the primary's stop is not a handover of its own.
        g.kill(B)
        g.kill(Role.MONITOR)
        data = g.dir / "data"

    view = summarize(data, tmp_path / "report")
    m = view["messages"]
    assert m["outcomes_logged"] and m["published"] == 1065
    assert m["by_outcome"] == {"delivered": 5, "queued": 60, "no_subscriber": 1000, "refused": 3}
    assert m["by_qos"]["1"] == {"queued": 60, "no_subscriber": 1000} and m["by_qos"]["0"] == {"delivered": 5,
                                                                                            "refused": 3}
    assert m["published_per_node"] == {"primary": 1045, "backup": 20, "monitor": 0} and m["stored"] == 60
    refused = [(r["node"], r["topic"], r["qos"], r["messages"]) for r in view["publish_outcomes"]
               if r["outcome"] == "refused"]
    assert refused == [("primary", "$SYS/broker/uptime", 0, 3)]

    # The kill -9 is a failure; its start is the last heartbeat the backup heard (its bid says how long before).
    [failure] = view["incidents"]
    assert (failure["from_node"], failure["to_node"], failure["cause"]) == ("primary", "backup", "lost")
    silence = re.match(SILENCE, bid["reason"])
    assert silence and silence.group(1) == "primary", bid["reason"]
    heard = bid["ts"] - float(silence.group(2))
    assert heard - 1e-6 <= failure["last_seen_old"] <= killed_at + 0.05
    # revert-activity is a planned handover, timed from the backup's handover decision, not a pulse before it.
    [handover] = view["handovers"]
    assert (handover["from_node"], handover["to_node"], handover["cause"]) == ("backup", "primary", "planned")
    assert handover["last_seen_old"] == round(handover_decision["ts"], 6)
    assert asked_at <= handover["last_seen_old"] <= handover["detected"] <= handover["takeover"]
    assert handover["in_flight"] == 20  # stored for the offline subscriber, unacknowledged: handed over, not lost
    assert view["period"]["unavailable_ms"] == failure["unavailable_ms"] + handover["unavailable_ms"]

    # The 20 messages stored while the backup had no standby: replicated late, apart from the 40 live ones.
    latency = {(r["topic"], r["stage"]): r for r in view["latency"]}
    assert latency[("plant/1/temp", "replicated")]["messages"] == 40
    assert latency[("plant/1/temp", "replicated_late")]["messages"] == 20
    assert view["late_replication"]["messages"] == 20

    console = Console(file=io.StringIO(), width=160)
    console.print(render.render(view))
    text = console.file.getvalue()
    assert "1 failover, 1 planned handover" in text
    assert "5 delivered at once, 60 queued, 1,000 no subscriber, 3 refused" in text
    assert "Failover incidents" in text and "Planned handovers" in text
    assert "Late replication: 20 messages were stored while the standby was out of sync" in text
    # nothing to say, no table: a loaded machine may lag a node's loop, and then there is something to say
    assert ("Overload episodes" in text) == bool(view["overload_episodes"])
    assert "Redeliveries" not in text
    for name in ("message_rate", "latency", "availability"):
        png = tmp_path / "report" / "charts" / f"{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", f"{png} is not a PNG"

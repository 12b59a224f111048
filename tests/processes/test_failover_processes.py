"""Failover with real node processes on loopback: kill -9, SIGSTOP, restart.

Each test runs a whole group (127.0.0.1-3, the fixed ports), drives it with
real signals, asks with real MQTT CONNECTs who serves, and checks S1 from the
nodes' own event logs as well as from the probes.
"""

import json
import re
import signal
import time

import pytest

from pairmq.appliance.config import Timers
from pairmq.appliance.roles import Role
from tests.harness.group import Group
from tests.harness.probe import double_service

P, B = Role.PRIMARY, Role.BACKUP
TIMERS = Timers()


@pytest.fixture
def group(tmp_path):
    with Group(tmp_path / "group") as g:
        g.start()
        g.wait_for("the primary to take activity", lambda: g.probe_once()[P] == 0)
        g.wait_for("the backup to be in sync", g.backup_in_sync)
        yield g
        assert g.accept_order_violations() == []


def test_standby_redirects_real_clients_and_monitor_never_serves(group):
    import socket
    import subprocess

    import paho.mqtt.client as mqtt

    answers = []
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="redirected", protocol=mqtt.MQTTv5)
    client.on_connect = lambda c, u, flags, rc, props: answers.append((rc.value, getattr(props, "ServerReference", None)))
    client.connect(group.address(B), 1883)
    client.loop_start()
    group.wait_for("paho's CONNACK", lambda: answers, timeout_s=5)
    client.loop_stop()
    client.disconnect()
    assert answers[0] == (0x9C, f"{group.address(P)}:1883"), "MQTT 5: use another server, naming the active"
    v311 = subprocess.run(["mosquitto_pub", "-h", group.address(B), "-V", "mqttv311", "-t", "t", "-m", "m"],
                          capture_output=True, text=True, timeout=10)
    assert v311.returncode != 0 and "unavailable" in v311.stderr
    accepted = subprocess.run(["mosquitto_pub", "-h", group.address(P), "-V", "mqttv5", "-t", "t", "-m", "m"],
                              capture_output=True, text=True, timeout=10)
    assert accepted.returncode == 0, accepted.stderr
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((group.address(Role.MONITOR), 1883), timeout=2)


def test_kill_9_active_backup_accepts_connect(group):
    assert group.probe_once() == {P: 0, B: 3}
    group.kill(P)
    # How fast is bench/failover.py's figure; here only that the backup takes over by itself.
    group.wait_for("the backup to accept a CONNECT", lambda: group.probe_once(in_process=True)[B] == 0, timeout_s=20, every_s=0)
    # The event log's writer thread may write the decision a moment after the backup answered the CONNACK.
    group.wait_for("the backup's activation in its event log", lambda: group.decisions(B, "activate"), timeout_s=2)
    [activation] = group.decisions(B, "activate")
    assert activation["reason"].startswith("backup: primary unseen 0.6")
    # in sync, or (its lease ran out while a loaded machine stalled it) tied with the last active: R4'
    assert re.search(r"monitor concurs, (in sync|holds all the primary released \(spool \d+/\d+\)) → taking "
                     r"activity, epoch 2$", activation["reason"]), activation["reason"]


def test_sigstop_active_for_three_leases_never_two_accept(group, tmp_path):
    samples = tmp_path / "samples.jsonl"
    pause_s = 3 * TIMERS.lease_ms / 1000
    sampler = group.start_sampler(samples, duration_s=pause_s + 3.0, interval_ms=15)
    time.sleep(0.5)
    group.signal(P, signal.SIGSTOP)
    time.sleep(pause_s)
    group.signal(P, signal.SIGCONT)
    sampler.wait(30)
    rounds = [json.loads(line) for line in samples.read_text().splitlines()]
    ticks = {r["tick"] for r in rounds}
    assert len(ticks) > 100, "the sampler must have probed densely"
    assert double_service(rounds) == []
    accepted_by = {r["host"] for r in rounds if r["rc"] == 0}
    assert accepted_by == {group.address(P), group.address(B)}, "service must have moved to the backup"
    # After SIGCONT the old primary notices its lease ran out and serves nothing.
    last = max(ticks)
    assert [r["rc"] for r in rounds if r["tick"] == last and r["host"] == group.address(P)] == [3]
    assert any("lease expired" in d["reason"] or "epoch 2" in d["reason"] for d in group.decisions(P, "step_down"))
    group.wait_active(B)


def test_old_primary_restarted_comes_back_standby(group):
    group.kill(P)
    group.wait_for("the backup to take over", lambda: group.probe_once()[B] == 0)
    group.start(P)
    group.wait_for("the primary to rejoin as standby", lambda: any(
        d["kind"] == "boot" for d in group.decisions(P)) and len(group.decisions(P, "boot")) == 2)
    time.sleep(2 * (TIMERS.lease_ms + TIMERS.takeover_margin_ms) / 1000)
    assert group.probe_once() == {P: 3, B: 0}
    assert group.active() is B
    assert len(group.decisions(P, "activate")) == 1, "the restarted primary must not take activity back"


def test_a_standby_frozen_across_the_actives_crash_takes_over_with_every_acknowledged_message(group):
    """The backup stalls (SIGSTOP: a loaded host, a VM pause) just as the active dies, for longer than its
    in-sync lease outlasts the takeover delay. It then holds exactly what the primary last released: a tie
    with the last active is no loss, so it must take over by itself, not wait for an operator."""
    from tests.harness.paho_clients import client, resume_and_collect, subscribe_then_go_offline

    subscribe_then_go_offline(group.address(P))
    pub, _ = client("car-9", group.address(P), persistent=False)
    acknowledged = []
    for i in range(200):
        info = pub.publish("cars/9/door", str(i).encode(), qos=1)
        info.wait_for_publish(10)
        assert info.is_published(), f"message {i} was not acknowledged"
        acknowledged.append(str(i).encode())
    pub.disconnect()
    pub.loop_stop()
    group.signal(B, signal.SIGSTOP)
    group.kill(P)
    time.sleep(2 * TIMERS.insync_ms / 1000)  # the backup's in-sync lease ends while it is frozen
    group.signal(B, signal.SIGCONT)
    group.wait_for("the frozen backup to take over", lambda: group.probe_once()[B] == 0, timeout_s=15)
    received, missing = resume_and_collect(group.address(B), acknowledged)
    assert not missing, f"acknowledged but lost: {missing[:10]}"
    firsts = [int(x) for n, x in enumerate(received) if x not in received[:n]]
    assert firsts == sorted(firsts), "per-publisher order"
    group.wait_active(B)
    assert "monitor concurs" in group.decisions(B, "activate")[-1]["reason"]

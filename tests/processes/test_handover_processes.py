"""Planned handover with real node processes and paho-mqtt clients (docs/mate_link.md).

A host-list QoS 1 publisher (tests/harness/hostlist.py) sends a sequence-numbered stream while activity moves
(release-activity and revert-activity through the CLI, SIGTERM, auto-revert); a persistent QoS 1
subscriber's session queues everything and is resumed on the final active. Nothing the publisher got
a PUBACK for may be missing, and per-publisher order (of first deliveries) is kept.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time

import paho.mqtt.client as mqtt
import pytest

from pairmq.appliance.roles import Role
from tests.harness.group import REPO, active_group
from tests.harness.hostlist import USE_ANOTHER_SERVER, HostListPublisher
from tests.harness.paho_clients import client, resume_and_collect, subscribe_then_go_offline

P, B = Role.PRIMARY, Role.BACKUP


def pairmq(group, *args: str) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "pairmq.cli.main", "redundancy", *args, "--group", str(group.dir / "group.toml")]
    return subprocess.run(argv, capture_output=True, text=True, cwd=REPO, timeout=30)


def hand_over_by_cli(group, action: str, wait_s: float = 20.0) -> subprocess.CompletedProcess:
    """`pairmq redundancy ACTION`, asked again while the mate is not in sync at this instant or fell out of
    sync during the drain (a loaded machine): both refusals are right, but this test is about what follows."""
    deadline = time.monotonic() + wait_s
    while True:
        done = pairmq(group, action)
        transient = "not in sync" in done.stderr or "handover aborted" in done.stderr
        if done.returncode == 0 or not transient or time.monotonic() > deadline:
            return done
        time.sleep(0.2)


class Stream:
    """The publisher on its own thread: messages 0, 1, 2, ... until stopped."""

    def __init__(self, group) -> None:
        self.pub = HostListPublisher([group.address(P), group.address(B)], "car-7", "cars/7/door")
        group.on_exit(self.abandon)
        self.pub.connect()
        self._stop = threading.Event()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        seq = 0
        try:
            while not self._stop.is_set():
                self.pub.publish(seq)
                seq += 1
        except BaseException as exc:  # reported by stop()
            self.error = exc

    def wait_acked(self, group, count: int) -> None:
        group.wait_for(f"{count} acknowledged messages", lambda: len(self.pub.acked) >= count or self.error,
                       timeout_s=30)
        assert self.error is None, f"the publisher failed: {self.error!r}"

    def stop(self) -> list[bytes]:
        self._stop.set()
        self._thread.join(15)
        assert self.error is None, f"the publisher failed: {self.error!r}"
        self.pub.close()
        return [str(i).encode() for i in self.pub.acked]

    def abandon(self) -> None:
        """The test ended (maybe failed) without stop(): end the thread now, whatever it was doing."""
        self._stop.set()
        self.pub.close()
        self._thread.join(15)


def check_nothing_lost(group, active: Role, acknowledged: list[bytes], what: str) -> None:
    received, missing = resume_and_collect(group.address(active), acknowledged)
    print(f"{what}: {len(acknowledged)} acknowledged, {len(received)} received on the {active.value}, "
          f"{len(missing)} missing")
    assert acknowledged and not missing, f"acknowledged but lost: {missing[:10]}"
    firsts = [int(x) for i, x in enumerate(received) if x not in received[:i]]
    assert firsts == sorted(firsts), "per-publisher order"


def in_sync_with(group, role: Role, mate: Role) -> bool:
    syncs = [d["reason"] for d in group.decisions(role, "sync")]
    return bool(syncs) and f"in sync with {mate.value}" in syncs[-1]


@pytest.fixture
def group(tmp_path):
    with active_group(tmp_path / "group") as g:
        yield g


def test_release_then_revert_through_the_cli_lose_nothing(group):
    subscribe_then_go_offline(group.address(P))
    idle_v5, _ = client("idle-v5", group.address(P), persistent=False)
    v5_disconnects: list[tuple[int, str | None]] = []
    idle_v5.on_disconnect = lambda cl, ud, fl, rc, props: v5_disconnects.append(
        (rc.value, getattr(props, "ServerReference", None)))
    idle_311 = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="idle-311", protocol=mqtt.MQTTv311)
    closed_311 = threading.Event()
    idle_311.on_disconnect = lambda *a: closed_311.set()
    idle_311.connect(group.address(P), 1883, keepalive=30)
    idle_311.loop_start()
    group.on_exit(idle_v5.loop_stop)  # paho's loop threads reconnect by themselves: not into the next group
    group.on_exit(idle_311.loop_stop)

    stream = Stream(group)
    stream.wait_acked(group, 100)
    released = hand_over_by_cli(group, "release-activity")
    assert released.returncode == 0, released.stderr + group.logs_tail(40)
    assert "primary: handed activity over in" in released.stderr and "the backup is active" in released.stderr
    group.wait_active(B)
    group.wait_for("the old primary to stand by in sync", lambda: in_sync_with(group, P, B), timeout_s=20)
    group.wait_for("the MQTT 5 client's DISCONNECT", lambda: v5_disconnects, timeout_s=5)
    assert v5_disconnects[0] == (USE_ANOTHER_SERVER, f"{group.address(B)}:1883")
    assert closed_311.wait(5), "the MQTT 3.1.1 client was not closed"
    idle_v5.loop_stop()
    idle_311.loop_stop()

    stream.wait_acked(group, len(stream.pub.acked) + 100)
    reverted = hand_over_by_cli(group, "revert-activity")
    assert reverted.returncode == 0, reverted.stderr + group.logs_tail(40)
    assert "backup: handed activity over in" in reverted.stderr and "the primary is active" in reverted.stderr
    group.wait_active(P)
    stream.wait_acked(group, len(stream.pub.acked) + 100)
    acknowledged = stream.stop()

    handovers = [d for d in stream.pub.disconnects if d.reason == USE_ANOTHER_SERVER]
    assert [d.server_reference for d in handovers][:2] == [f"{group.address(B)}:1883", f"{group.address(P)}:1883"]
    print(f"publisher: unavailability at each handover (ms): {[round(g) for g in stream.pub.gaps_ms()]}")
    activations = [d["reason"] for d in group.decisions(B, "activate")]  # a lease lost to a stall may add a failover
    assert any(a.startswith("backup: primary handed activity over (yielded epoch 1)") for a in activations), activations
    check_nothing_lost(group, P, acknowledged, "release + revert")


def test_sigterm_on_the_active_hands_over_and_exits_0(group):
    subscribe_then_go_offline(group.address(P))
    stream = Stream(group)
    stream.wait_acked(group, 100)
    group.signal(P, signal.SIGTERM)
    assert group.procs.pop(P).wait(10) == 0, "the terminated primary did not exit 0"
    group.wait_active(B)
    assert any("SIGTERM: the backup holds every op through" in d["reason"] for d in group.decisions(P, "step_down"))
    stream.wait_acked(group, len(stream.pub.acked) + 100)
    acknowledged = stream.stop()
    print(f"publisher: unavailability at the SIGTERM handover (ms): {[round(g) for g in stream.pub.gaps_ms()]}")
    check_nothing_lost(group, B, acknowledged, "SIGTERM on the active")


def _primary_sees_backup(group) -> bool:
    """The primary's own view (its sync decisions may be older: an in-sync drop at start-up says "out of sync")."""
    peers = group.api(P, "/api/v1/redundancy")["peers"]
    return any(peer["role"] == "backup" and peer["seen"] for peer in peers)


def test_release_without_the_backup_is_refused_unless_forced(group):
    group.kill(B)
    group.wait_for("the primary to see the backup gone", lambda: not _primary_sees_backup(group), timeout_s=10)
    refused = pairmq(group, "release-activity")
    assert refused.returncode != 0
    assert "the backup is not reachable, so no node could take over with every acknowledged message; " \
           "repeat with --force to step down anyway" in refused.stderr, refused.stderr
    assert group.active() is P and group.probe_once()[P] == 0

    forced = pairmq(group, "release-activity", "--force")
    assert forced.returncode == 0, forced.stderr + group.logs_tail(40)
    assert "stepped down without an in-sync backup" in forced.stderr
    # the decision reaches the event log off the heartbeat thread: under load it may trail the CLI's answer
    group.wait_for("the step-down decision", lambda: group.decisions(P, "step_down"), timeout_s=10)
    step_downs = [d["reason"] for d in group.decisions(P, "step_down")]
    assert step_downs[-1] == "primary: operator released activity (forced, backup not in sync) → stepping down, epoch 1"


def test_revert_refused_when_the_primary_is_active(group):
    refused = pairmq(group, "revert-activity")
    assert refused.returncode != 0
    assert "the primary already holds activity; there is nothing to revert" in refused.stderr


def test_auto_revert_moves_activity_back_to_the_primary(tmp_path):
    with active_group(tmp_path / "group", auto_revert=True) as group:
        subscribe_then_go_offline(group.address(P))
        stream = Stream(group)
        stream.wait_acked(group, 100)
        group.kill(P)
        group.wait_for("the backup to take over", lambda: group.active() is B, timeout_s=10)
        stream.wait_acked(group, len(stream.pub.acked) + 100)
        group.start(P)
        group.wait_for("auto-revert to hand activity back to the primary", lambda: group.active() is P,
                       timeout_s=30)
        group.wait_for("the backup's auto-revert decision in its event log", lambda: any(
            d["reason"].startswith("backup: auto-revert: primary in sync and seen") for d in group.decisions(B, "auto_revert")))
        stream.wait_acked(group, len(stream.pub.acked) + 100)
        time.sleep(2)
        assert group.active() is P, "auto-revert must not bounce back"
        acknowledged = stream.stop()
        check_nothing_lost(group, P, acknowledged, "kill -9, restart, auto-revert")


def test_a_failed_test_leaves_no_client_behind_for_the_next_group(tmp_path):
    """A publisher left running reconnects to the next group on the same addresses with the same client id:
    its stream then mixes into that test's subscriber and the two publishers take each other over."""
    with pytest.raises(AssertionError, match="the test failed"):
        with active_group(tmp_path / "first") as first:
            Stream(first).wait_acked(first, 20)
            raise AssertionError("the test failed")
    with active_group(tmp_path / "next") as group:
        time.sleep(2)  # a publisher left behind retries every few ms: it would be in by now
        strays = [e["peer"] for e in group.events(P) if e["event"] == "client_accepted" and e["client_id"] == "car-7"]
        assert not strays, f"the failed test's publisher connected to the next group from {strays}"

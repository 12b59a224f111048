"""Replayed heartbeats across a restart (UDP 8300): a recording of a dead primary stays dead.

Replay marks live in memory; a node that restarts has none. The attacker records the primary's
genuine heartbeats off `lo`, the primary dies (kill -9), the backup takes over, then the backup
or the monitor restarts and the attacker replays the recording at it, over and over. Every
replayed datagram must be refused and counted (rule 6 of appliance/quorum/auth.py: it does not
echo the receiver's new incarnation), and the backup must take activity as it would without the
attacker. Real node processes; the replay comes from an ordinary UDP socket (the node does not
trust source addresses, only MACs).
"""

from __future__ import annotations

import socket
import subprocess
import threading
import time

import pytest

from pairmq.appliance.quorum import wire
from pairmq.appliance.roles import Role
from tests.harness import http_api
from tests.harness.group import Group
from tests.processes.test_forged_heartbeats import capture_heartbeats

P, B, M = Role.PRIMARY, Role.BACKUP, Role.MONITOR
CAPTURED = 20  # a second of the primary's heartbeats to both peers


def redundancy(group: Group, role: Role) -> dict | None:
    try:
        return group.api(role, "/api/v1/redundancy")
    except OSError:  # not up yet
        return None


def serving(group: Group, role: Role, above_epoch: int = 0) -> int:
    view = redundancy(group, role)
    return view["epoch"] if view and view["serving"] and view["epoch"] > above_epoch else 0


def capture_primary_heartbeats(group: Group, count: int, timeout_s: float = 20.0) -> list[bytes]:
    """Genuine heartbeats of the primary's one incarnation, oldest first, distinct."""
    captured = capture_heartbeats(group, P, count, timeout_s)
    assert all(wire.peek_header(d).incarnation == wire.peek_header(captured[0]).incarnation for d in captured)
    return captured


class Replayer:
    """Sends the recording at one node, in order and over again, until stopped; counts what it sent."""

    def __init__(self, group: Group, target: Role, datagrams: list[bytes]) -> None:
        self.sent = 0
        self._to = (group.address(target), group.config.ports.heartbeat)
        self._datagrams = datagrams
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            while not self._stop.is_set():
                for data in self._datagrams:  # at the primary's own pace: a fresh claim every interval
                    sock.sendto(data, self._to)
                    self.sent += 1
                    if self._stop.wait(0.02):
                        return

    def __enter__(self) -> "Replayer":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(5)


def rejected_total(group: Group, role: Role) -> dict[str, int]:
    return redundancy(group, role)["rejected_heartbeats"]


def publish_qos1(group: Group, role: Role) -> None:
    """One acknowledged message at the new epoch, so the spool position shows who is more up to date."""
    subprocess.run(["mosquitto_pub", "-h", group.address(role), "-p", str(group.config.ports.mqtt), "-q", "1",
                    "-i", "replay-test", "-t", "replay/test", "-m", "after the failover"], check=True, timeout=10)


@pytest.fixture
def failed_over(tmp_path):
    """A group whose primary was killed after the attacker recorded it; the backup serves (epoch returned)."""
    with Group(tmp_path / "group") as group:
        group.start()
        group.wait_for("the primary to serve", lambda: serving(group, P), timeout_s=20)
        group.wait_for("the backup to be in sync", group.backup_in_sync, timeout_s=20)
        recording = capture_primary_heartbeats(group, CAPTURED)
        group.kill(P)
        epoch = group.wait_for("the backup to take over", lambda: serving(group, B), timeout_s=20)
        publish_qos1(group, B)
        yield group, recording, epoch


def replay_after_restart(group: Group, restarted: Role, recording: list[bytes], epoch: int,
                         while_down=lambda: None, operator=lambda: None) -> tuple[int, dict]:
    """Restart `restarted` (kill -9), replay the recording at it until the backup serves at a newer epoch.

    `while_down` runs before the restart; `operator` once the replay has started (what an operator would do).
    """
    group.kill(restarted)
    while_down()
    group.start(restarted)
    group.wait_for(f"the {restarted.value}'s API", lambda: redundancy(group, restarted), timeout_s=20)
    with Replayer(group, restarted, recording) as replay:
        operator()
        group.wait_for("the backup to serve again, at a newer epoch", lambda: serving(group, B, epoch), timeout_s=30)
        group.wait_for("the whole recording replayed twice", lambda: replay.sent >= 2 * len(recording), timeout_s=10)
        assert serving(group, B, epoch), "the backup stopped serving under the replay"
    sent = replay.sent
    # every datagram sent is refused once it arrived (so are a live peer's first ones, until it echoes the new boot)
    counted = group.wait_for("every replayed datagram to be counted",
                             lambda: (c := rejected_total(group, restarted)) and c.get("unconfirmed", 0) >= sent and c,
                             timeout_s=5)
    return sent, counted


def never_heard_the_primary(group: Group, role: Role) -> bool:
    primary, = [p for p in redundancy(group, role)["peers"] if p["role"] == P.value]
    return primary["heard_ms_ago"] is None and primary["activity"] is None and not primary["seen"]


def test_a_restarted_backup_refuses_the_dead_primarys_recorded_heartbeats_and_takes_activity(failed_over):
    group, recording, epoch = failed_over
    sent, counted = replay_after_restart(group, B, recording, epoch)
    assert sent >= 2 * len(recording)
    assert sum(counted.values()) == counted["unconfirmed"], counted  # under no other reason
    assert never_heard_the_primary(group, B)
    view = redundancy(group, B)
    assert view["serving"] and view["active_role"] == B.value


def test_a_restarted_monitor_refuses_the_dead_primarys_recorded_heartbeats_and_votes(failed_over):
    """The backup loses its lease while the monitor is down; the restarted monitor never heard the primary, so
    (R4) only an operator's forced bid can bring service back, and the recorded claims must not block its vote."""
    group, recording, epoch = failed_over

    def backup_alone():
        group.wait_for("the backup to stop serving without a peer", lambda: not serving(group, B), timeout_s=20)

    def force_the_backup():
        http_api.post(group.config, B, "force-activity", {"acknowledge_data_loss": True})

    sent, counted = replay_after_restart(group, M, recording, epoch, backup_alone, force_the_backup)
    assert sent >= 2 * len(recording)
    assert sum(counted.values()) == counted["unconfirmed"], counted  # under no other reason
    assert never_heard_the_primary(group, M)
    votes = [d for d in group.decisions(M, "vote") if d["epoch"] > epoch and B.value in d["reason"]]
    assert votes, "the restarted monitor never voted for the backup"
    assert redundancy(group, M)["active_role"] == B.value

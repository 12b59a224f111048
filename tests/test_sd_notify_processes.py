"""What systemd sees from a real node: READY=1 only once joined, WATCHDOG=1 from the event loop at
half WATCHDOG_USEC, no pings while the process is stopped or only its event loop is (the heartbeat
thread running on), STOPPING=1 on SIGTERM; and a routing node
serving under the kernel's equivalent of MemoryDenyWriteExecute=.

The test owns the notify socket (a unix datagram socket, as systemd's) and starts real node processes
with NOTIFY_SOCKET / WATCHDOG_USEC in their environment, exactly as systemd passes them.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from appliance.roles import Role
from tests.group import REPO, Group
from tests.netns import hosts  # noqa: F401  (fixture)

P, B, M = Role.PRIMARY, Role.BACKUP, Role.MONITOR
WATCHDOG_USEC = 600_000  # far from the node's other 1 s loop, so the pings' interval shows where it comes from
MATE_LINK_PORT = 8301


class NotifySocket:
    """systemd's side of sd_notify: every datagram received, with its arrival time."""

    def __init__(self) -> None:
        self._dir = tempfile.mkdtemp(prefix="pmq-notify-")  # short: a unix socket path has at most 107 bytes
        self.path = str(Path(self._dir) / "notify")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        os.chmod(self.path, 0o777)
        self.received: list[tuple[float, dict[str, str]]] = []

    def env(self, monkeypatch) -> None:
        monkeypatch.setenv("NOTIFY_SOCKET", self.path)
        monkeypatch.setenv("WATCHDOG_USEC", str(WATCHDOG_USEC))
        monkeypatch.delenv("WATCHDOG_PID", raising=False)

    def collect(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(4096)
            except TimeoutError:
                break
            fields = dict(line.split("=", 1) for line in data.decode().splitlines() if "=" in line)
            self.received.append((time.monotonic(), fields))

    def wait_for(self, key: str, timeout_s: float) -> dict[str, str]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for _, fields in self.received:
                if key in fields:
                    return fields
            self.collect(min(0.2, deadline - time.monotonic()))
        pytest.fail(f"no {key} from the node within {timeout_s} s; got {self.keys()}")

    def keys(self) -> list[str]:
        return [k for _, fields in self.received for k in fields]

    def ping_times(self) -> list[float]:
        return [t for t, fields in self.received if "WATCHDOG" in fields]

    def close(self) -> None:
        self.sock.close()
        os.unlink(self.path)
        os.rmdir(self._dir)


@pytest.fixture
def notify():
    n = NotifySocket()
    yield n
    n.close()


pytestmark = [pytest.mark.processes]


def test_lone_node_ready_says_alone_pings_at_half_watchdog_stops_when_stopped_and_on_sigterm(tmp_path, notify,
                                                                                              monkeypatch):
    with Group(tmp_path / "group") as g:
        notify.env(monkeypatch)
        g.start(P)
        ready = notify.wait_for("READY", timeout_s=20)
        assert "no peer seen" in ready["STATUS"], ready

        notify.received.clear()
        notify.collect(3.0)
        gaps = [b - a for a, b in zip(notify.ping_times(), notify.ping_times()[1:])]
        assert len(gaps) >= 5, f"too few WATCHDOG=1 pings in 3 s: {notify.keys()}"
        # systemd restarts the node when a gap reaches WATCHDOG_USEC; the node aims for half of it.
        assert max(gaps) < WATCHDOG_USEC / 1e6, gaps
        assert 0.2 < statistics.median(gaps) < 0.45, gaps

        g.signal(P, signal.SIGSTOP)  # what a hung process looks like to systemd
        time.sleep(0.2)  # a ping already queued before the stop may still arrive
        notify.received.clear()
        notify.collect(2 * WATCHDOG_USEC / 1e6)
        assert notify.ping_times() == [], "a stopped node still sent watchdog pings"
        g.signal(P, signal.SIGCONT)
        notify.collect(1.0)
        assert notify.ping_times(), "pings did not resume after SIGCONT"

        g.signal(P, signal.SIGTERM)
        notify.wait_for("STOPPING", timeout_s=10)
        assert g.procs[P].wait(15) == 0


def test_monitor_ready_once_it_sees_a_peer(tmp_path, notify, monkeypatch):
    with Group(tmp_path / "group") as g:
        g.start(P, B)
        # their boot decisions are written by their heartbeat threads: both are heartbeating
        g.wait_for("the primary and the backup to run their heartbeat threads",
                   lambda: g.decisions(P, "boot") and g.decisions(B, "boot"), timeout_s=20)
        notify.env(monkeypatch)
        g.start(M)
        ready = notify.wait_for("READY", timeout_s=20)
        assert ready["STATUS"].startswith("monitor: joined (sees "), ready


@pytest.mark.netns
def test_standby_ready_only_once_its_mate_link_to_the_active_is_up(hosts, tmp_path, notify, monkeypatch):  # noqa: F811
    addresses = {r: hosts.address(r.value) for r in Role}
    with Group(tmp_path / "group", addresses, hosts=hosts) as g:
        hosts.cut_tcp_port("primary", "backup", MATE_LINK_PORT)  # heartbeats flow, the mate link cannot
        g.start(P, M)
        notify.env(monkeypatch)
        g.start(B)
        g.wait_for("the primary to take activity", lambda: g.probe_once()[P] == 0, timeout_s=20)
        notify.collect(3.0)
        assert notify.ping_times(), f"the backup sent no watchdog pings while joining: {notify.keys()}"
        assert "READY" not in notify.keys(), "READY=1 before the standby's mate link was up"

        hosts.heal_tcp_port("primary", "backup", MATE_LINK_PORT)
        ready = notify.wait_for("READY", timeout_s=20)
        assert ready["STATUS"] == "backup: joined as standby (sees primary, monitor); mate link to the active primary is up", ready
        assert g.active() is P


PTRACE_SEIZE, PTRACE_INTERRUPT, PTRACE_DETACH, WALL = 0x4206, 0x4207, 17, 0x40000000
EPOLL_WAITS = {"232", "281", "441"}  # x86_64 epoll_wait, epoll_pwait, epoll_pwait2: idle with the GIL released


@contextlib.contextmanager
def main_thread_frozen(pid: int):
    """Stop only the node's main thread (its event loop), with ptrace; the heartbeat thread runs on.

    SIGSTOP stops every thread; PTRACE_INTERRUPT stops one. The thread is caught idle in epoll (tried
    again otherwise), so it does not hold the GIL and the other threads really keep running."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
    status = ctypes.c_int()
    for _ in range(50):
        if libc.ptrace(PTRACE_SEIZE, pid, None, None) != 0 or libc.ptrace(PTRACE_INTERRUPT, pid, None, None) != 0:
            pytest.fail(f"ptrace on the node failed (errno {ctypes.get_errno()}): this test needs CAP_SYS_PTRACE")
        libc.waitpid(pid, ctypes.byref(status), WALL)
        if Path(f"/proc/{pid}/syscall").read_text().split()[0] in EPOLL_WAITS:
            break
        libc.ptrace(PTRACE_DETACH, pid, None, None)
        time.sleep(0.01)
    else:
        pytest.fail("the node's main thread was never caught idle in epoll")
    try:
        yield
    finally:
        libc.ptrace(PTRACE_DETACH, pid, None, None)


def test_hung_event_loop_stops_pings_while_heartbeats_go_on(tmp_path, notify, monkeypatch):
    """Pings come from the loop, not the heartbeat thread: freeze only the loop for three leases and the
    pings stop, while the peers still see the primary (no failover: heartbeats went on)."""
    with Group(tmp_path / "group") as g:
        notify.env(monkeypatch)
        g.start(P)
        monkeypatch.delenv("NOTIFY_SOCKET")
        g.start(B, M)
        g.wait_for("the primary to take activity", lambda: g.probe_once()[P] == 0, timeout_s=20)
        notify.wait_for("READY", timeout_s=20)
        notify.collect(1.0)
        assert notify.ping_times(), "no pings before the freeze"
        freeze_s = 3 * g.config.timers.lease_ms / 1000
        assert freeze_s * 1000 < g.config.timers.broker_stall_ms  # below R6's bound: no step-down expected
        with main_thread_frozen(g.pid(P)):
            time.sleep(0.1)  # a ping sent just before the freeze may still be queued
            notify.received.clear()
            notify.collect(freeze_s)
            assert notify.ping_times() == [], "the primary's frozen event loop still sent watchdog pings"
            states = {t.name: (t / "stat").read_text().split()[2] for t in Path(f"/proc/{g.pid(P)}/task").iterdir()}
            assert states[str(g.pid(P))] == "t" and any(s != "t" for s in states.values()), states
        notify.collect(1.0)
        assert notify.ping_times(), "pings did not resume after the loop thawed"
        assert g.decisions(B, "activate") == [], "the backup took over: heartbeats stopped with the loop"
        assert g.active() is P


# MemoryDenyWriteExecute= is a seccomp filter systemd installs; without systemd as PID 1 the kernel's own
# PR_SET_MDWE (Linux >= 6.3, kept across execve) refuses the same thing: memory that is or becomes
# writable and executable. The wrapper turns it on, proves it holds, and execs the node.
MDWE_WRAPPER = """
import ctypes, mmap, os, sys
if ctypes.CDLL(None, use_errno=True).prctl(65, 1, 0, 0, 0) != 0:  # PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN
    sys.exit("PR_SET_MDWE failed: this kernel (< 6.3?) cannot run the MemoryDenyWriteExecute check")
try:
    mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    sys.exit("a W+X mapping was allowed: MDWE is not in force")
except PermissionError:
    pass
os.execv(sys.executable, [sys.executable, *sys.argv[1:]])
"""


def test_routing_node_serves_under_memory_deny_write_execute(tmp_path):
    with Group(tmp_path / "group") as g:
        g.start(B, M)
        log = open(g.dir / "primary.log", "ab")
        g.procs[P] = subprocess.Popen(
            [sys.executable, "-c", MDWE_WRAPPER, "-m", "cli.main", "node", "--role", "primary", "--group",
             str(g.dir / "group.toml")], stdout=log, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True)
        g.wait_for("the primary (under MDWE) to take activity and serve MQTT", lambda: g.probe_once()[P] == 0,
                   timeout_s=30)
        assert g.procs[P].poll() is None, g.logs_tail()

"""What systemd sees from a real node: READY=1 only once joined, WATCHDOG=1 from the event loop at
half WATCHDOG_USEC, no pings while the process is stopped or only its event loop is (the heartbeat
thread running on), STOPPING=1 on SIGTERM; and a routing node
serving inside the kernel-level part of the units' sandbox (tests/harness/unit_sandbox.py).

The test owns the notify socket (a unix datagram socket, as systemd's) and starts real node processes
with NOTIFY_SOCKET / WATCHDOG_USEC in their environment, exactly as systemd passes them.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from pairmq.appliance.node import sd_notify
from pairmq.appliance.roles import Role
from tests.harness import paho_clients
from tests.harness.group import REPO, Group
from tests.harness.netns import hosts  # noqa: F401  (fixture)

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



def test_lone_node_ready_says_alone_pings_at_half_watchdog_stops_when_stopped_and_on_sigterm(tmp_path, notify,
                                                                                              monkeypatch):
    with Group(tmp_path / "group") as g:
        notify.env(monkeypatch)
        g.start(P)
        ready = notify.wait_for("READY", timeout_s=20)
        assert "no peer seen" in ready["STATUS"], ready

        notify.received.clear()
        notify.collect(3.0)
        # The pings keep coming from the running loop; their spacing is the scheduler's on a loaded machine,
        # the interval the node aims for is checked without a clock below.
        assert len(notify.ping_times()) >= 3, f"too few WATCHDOG=1 pings in 3 s: {notify.keys()}"

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


# The units' kernel-level sandbox without systemd as PID 1 (tests/harness/unit_sandbox.py): no capabilities,
# no_new_privs (setpriv), MemoryDenyWriteExecute (PR_SET_MDWE), SystemCallFilter=@system-service with
# EPERM and RestrictAddressFamilies (a libseccomp allow-list, as systemd builds it).
FAMILIES = "1,2,10,16"  # AF_UNIX, AF_INET, AF_INET6, AF_NETLINK: the units' RestrictAddressFamilies=


def system_service_syscalls(path: Path) -> Path:
    """`systemd-analyze syscall-filter @system-service`, its @groups expanded, one name per line."""
    names: set[str] = set()
    pending, seen = ["@system-service"], set()
    while pending:
        group = pending.pop()
        seen.add(group)
        out = subprocess.run(["/usr/bin/systemd-analyze", "syscall-filter", group], capture_output=True, text=True,
                             check=True).stdout
        for line in out.splitlines()[1:]:
            item = line.strip()
            if item.startswith("@") and item not in seen:
                pending.append(item)
            elif item and not item.startswith(("#", "@")):
                names.add(item)
    path.write_text("\n".join(sorted(names)) + "\n")
    return path


def sandboxed(syscalls: Path, *argv: str, drop_capabilities: bool = True) -> list[str]:
    setpriv = ["setpriv", "--bounding-set=-all", "--inh-caps=-all", "--no-new-privs"] if drop_capabilities else []
    return [*setpriv, sys.executable, str(REPO / "tests/harness/unit_sandbox.py"), str(syscalls), FAMILIES, "--",
            sys.executable, *argv]


PROBE = """
import ctypes, socket
libc = ctypes.CDLL(None, use_errno=True)
traced = libc.ptrace(0, 0, None, None) == 0  # PTRACE_TRACEME: @debug, not in @system-service
try:
    socket.socket(socket.AF_PACKET, socket.SOCK_RAW).close()  # not in RestrictAddressFamilies= (the VIP drop-in's)
    packet = True
except OSError:
    packet = False
socket.socket(socket.AF_INET, socket.SOCK_STREAM).close()
print(f"ptrace={traced} af_packet={packet}")
"""


def test_the_sandbox_refuses_what_the_unit_refuses(tmp_path):
    """The control for the test below: outside the sandbox these calls work; the filter alone (root's
    capabilities kept) refuses them."""
    syscalls = system_service_syscalls(tmp_path / "syscalls")
    free = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=30)
    assert free.stdout.strip() == "ptrace=True af_packet=True", free.stderr
    boxed = subprocess.run(sandboxed(syscalls, "-c", PROBE, drop_capabilities=False), capture_output=True,
                           text=True, timeout=30)
    assert boxed.stdout.strip() == "ptrace=False af_packet=False", boxed.stderr


def test_routing_node_works_inside_the_units_sandbox(tmp_path):
    """A primary with no capabilities, under MDWE, @system-service and the address-family list: it takes
    activity, acknowledges a replicated QoS 1 publish, delivers it, and hands over on SIGTERM."""
    syscalls = system_service_syscalls(tmp_path / "syscalls")
    with Group(tmp_path / "group") as g:
        g.start(B, M)
        log = open(g.dir / "primary.log", "ab")
        argv = sandboxed(syscalls, "-m", "pairmq.cli.main", "node", "--role", "primary", "--group", str(g.dir / "group.toml"))
        g.procs[P] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True)
        g.wait_for("the sandboxed primary to take activity", lambda: g.probe_once()[P] == 0, timeout_s=30)
        g.wait_for("the backup to be in sync", g.backup_in_sync, timeout_s=30)
        status = dict(line.split(":\t", 1) for line in Path(f"/proc/{g.pid(P)}/status").read_text().splitlines()
                      if ":\t" in line)
        assert {k: status[k].strip() for k in ("CapEff", "CapBnd", "NoNewPrivs", "Seccomp")} == {
            "CapEff": "0000000000000000", "CapBnd": "0000000000000000", "NoNewPrivs": "1", "Seccomp": "2"}
        sub, got = paho_clients.client("sandbox-sub", g.address(P), persistent=False)
        pub, _ = paho_clients.client("sandbox-pub", g.address(P), persistent=False)
        try:
            sub.subscribe("sandbox/t", qos=1)
            time.sleep(0.3)
            pub.publish("sandbox/t", b"inside", qos=1).wait_for_publish(10)
            assert got.get(timeout=10) == b"inside"
        finally:
            for c in (sub, pub):
                c.loop_stop()
                c.disconnect()
        g.signal(P, signal.SIGTERM)
        assert g.procs[P].wait(20) == 0, g.logs_tail()
        g.wait_for("the backup to serve after the handover", lambda: g.probe_once()[B] == 0, timeout_s=10)


def test_the_node_pings_at_half_of_what_systemd_allows_and_only_when_the_watchdog_is_its_own(monkeypatch):
    """systemd restarts the node when a gap reaches WATCHDOG_USEC; the node aims for half of it."""
    monkeypatch.setenv("WATCHDOG_USEC", str(WATCHDOG_USEC))
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    assert sd_notify.watchdog_interval_s() == WATCHDOG_USEC / 2 / 1e6
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid() + 1))  # inherited from a watched parent: not ours
    assert sd_notify.watchdog_interval_s() is None
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    for off in ("0", "", "soon"):
        monkeypatch.setenv("WATCHDOG_USEC", off)
        assert sd_notify.watchdog_interval_s() is None

"""A whole PairMQ group of real node processes, for integration tests.

Nodes run as `pairmq node --role R --group FILE` (exactly what systemd runs),
on loopback addresses or, given a `tests.harness.netns.Hosts`, each in its own network
namespace. Tests read what happened from the nodes' own event logs (the data
directories are on the shared filesystem) and ask "who serves?" with real
MQTT CONNECTs (tests/harness/probe.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from pairmq.appliance.access_file import access_path, write_access
from pairmq.appliance.broker.access import AccessPolicy
from pairmq.appliance.eventlog import EventSettings, read_events
from pairmq.appliance.config import (GroupConfig, Limits, NodeSpec, SysTopics, Timers, TlsConfig, VipConfig, load_group, render_group,
                               write_secret)
from pairmq.appliance.hooks_settings import HookSettings
from pairmq.appliance.management_settings import ManagementSettings
from pairmq.appliance.roles import Role

from tests.harness import probe

# PAIRMQ_TEST_LOOPBACK=127.0.0.11 moves groups to .11-.13 with a lock of their own, so that several
# developers' work trees can run tests side by side (tests that name 127.0.0.1 itself still need the default).
_FIRST = os.environ.get("PAIRMQ_TEST_LOOPBACK", "127.0.0.1")
_BASE, _LAST = _FIRST.rsplit(".", 1)
LOOPBACK = {role: f"{_BASE}.{int(_LAST) + i}" for i, role in enumerate((Role.PRIMARY, Role.BACKUP, Role.MONITOR))}
REPO = Path(__file__).resolve().parents[2]


PORTS_LOCK = Path(tempfile.gettempdir()) / ("pairmq-fixed-ports.lock" if _FIRST == "127.0.0.1"
                                            else f"pairmq-fixed-ports-{_FIRST}.lock")
PORTS_FREE_WAIT_S = 120


def ports_free(addresses=LOOPBACK.values()) -> bool:
    """Nobody is bound to the fixed ports (8080, 1883 TCP; 8300 UDP) on these addresses."""
    for address in addresses:
        for kind, port in ((socket.SOCK_STREAM, 8080), (socket.SOCK_STREAM, 1883), (socket.SOCK_DGRAM, 8300)):
            with socket.socket(socket.AF_INET, kind) as s:
                if kind == socket.SOCK_STREAM:
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # ignore TIME_WAIT, not listeners
                try:
                    s.bind((address, port))
                except OSError:
                    return False
    return True


@contextlib.contextmanager
def fixed_ports():
    """Hold the loopback group's ports: one group on 127.0.0.1-3 at a time, across processes.

    Every test or benchmark that runs a loopback group takes this lock, then waits
    for stragglers to let go of the ports; after two minutes it fails, naming why.
    """
    deadline = time.monotonic() + PORTS_FREE_WAIT_S
    with open(PORTS_LOCK, "a") as lock:
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise AssertionError(f"{PORTS_LOCK} stayed locked for {PORTS_FREE_WAIT_S} s "
                                         f"(another loopback group is running)") from None
                time.sleep(0.2)
        while not ports_free():
            if time.monotonic() > deadline:
                raise AssertionError(f"the fixed ports on {', '.join(LOOPBACK.values())} stayed busy for {PORTS_FREE_WAIT_S} s "
                                     f"(another group is running: see `ss -lunp | grep 8300`)")
            time.sleep(0.2)
        yield


class Group:
    def __init__(self, directory: Path, addresses: dict[Role, str] = LOOPBACK, hosts=None,
                 timers: Timers = Timers(), access: AccessPolicy | None = AccessPolicy(allow_anonymous=True),
                 tls: TlsConfig | None = None, limits: Limits = Limits(), auto_revert: bool = False,
                 events: EventSettings = EventSettings(), vip: VipConfig | None = None,
                 management: ManagementSettings = ManagementSettings(), hooks: HookSettings = HookSettings(),
                 sys: SysTopics = SysTopics()) -> None:
        """`access` is written to each routing node's access file (None: no file, anonymous refused)."""
        self.dir = directory
        self.hosts = hosts  # tests.harness.netns.Hosts, or None for loopback
        nodes = {r: NodeSpec(r, addresses[r], directory / "data" / r.value) for r in Role}
        config = GroupConfig("test", nodes, directory / "secret", timers, tls=tls, limits=limits,
                             auto_revert=auto_revert, events=events, vip=vip, management=management, hooks=hooks,
                             sys=sys)
        directory.mkdir(parents=True, exist_ok=True)
        for role in (Role.PRIMARY, Role.BACKUP):
            if access is not None:
                write_access(access_path(nodes[role].data_dir), access)
            else:
                access_path(nodes[role].data_dir).unlink(missing_ok=True)
        (directory / "group.toml").write_text(render_group(config))
        if not (directory / "secret").exists():
            write_secret(directory / "secret")
        self.config: GroupConfig = load_group(directory / "group.toml")
        self.procs: dict[Role, subprocess.Popen] = {}
        self._ports = None if hosts else fixed_ports()
        self._cleanups: list = []
        self._started_at: dict[Role, float] = {}  # wall time of each node's latest start (event "ts" is wall time)

    def on_exit(self, cleanup) -> None:
        """Run `cleanup()` when the group ends, first, even when the test failed: a client thread left
        running would reconnect to the next test's group on the same addresses and mix its stream in."""
        self._cleanups.append(cleanup)

    # --- processes -------------------------------------------------------------------

    def start(self, *roles: Role, wrap: tuple[str, ...] = ()) -> None:
        """`wrap`: a command prefix, e.g. setpriv to start a node without some capabilities."""
        for role in roles or tuple(Role):
            argv = [*wrap, sys.executable, "-m", "pairmq.cli.main", "node", "--role", role.value,
                    "--group", str(self.dir / "group.toml")]
            profile_dir = os.environ.get("PAIRMQ_PROFILE_DIR")  # cProfile the primary's main thread (bench/)
            if profile_dir and role is Role.PRIMARY:
                argv[1:1] = ["-m", "cProfile", "-o", str(Path(profile_dir) / "primary.prof")]
            log = open(self.dir / f"{role.value}.log", "ab")
            kwargs = dict(stdout=log, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True)
            proc = self.hosts.popen(role.value, argv, **kwargs) if self.hosts else subprocess.Popen(argv, **kwargs)
            self.procs[role] = proc
            self._started_at[role] = time.time()

    def pid(self, role: Role) -> int:
        """The node's own pid (under `ip netns exec`, the exec'd process keeps the Popen's pid)."""
        return self.procs[role].pid

    def signal(self, role: Role, sig: int) -> None:
        os.kill(self.pid(role), sig)

    def kill(self, role: Role) -> None:
        self.signal(role, signal.SIGKILL)
        self.procs.pop(role).wait(5)

    def stop_all(self) -> None:
        for role, proc in list(self.procs.items()):
            if proc.poll() is None:
                with _suppress():
                    os.kill(proc.pid, signal.SIGCONT)
                proc.terminate()
        for role, proc in list(self.procs.items()):
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        self.procs.clear()

    def __enter__(self) -> "Group":
        if self._ports is not None:
            self._ports.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        try:
            while self._cleanups:
                with contextlib.suppress(Exception):  # the test's own failure is the one to report
                    self._cleanups.pop()()
            self.stop_all()
        finally:
            if self._ports is not None:
                self._ports.__exit__(None, None, None)

    # --- observation --------------------------------------------------------------------

    def address(self, role: Role) -> str:
        return self.config.node(role).address

    def events(self, role: Role) -> list[dict]:
        return read_events(self.config.node(role).data_dir / "events")  # every segment, in order

    def decisions(self, role: Role, kind: str | None = None) -> list[dict]:
        return [e for e in self.events(role)
                if e["event"] == "redundancy_decision" and (kind is None or e["kind"] == kind)]

    def wait_for(self, what: str, predicate, timeout_s: float = 10.0, every_s: float = 0.02):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            value = predicate()
            if value:
                return value
            time.sleep(every_s)
        raise AssertionError(f"timed out after {timeout_s} s waiting for {what}\n{self.logs_tail()}")

    def active(self) -> Role | None:
        """The node whose latest activation is newer than its latest step-down, from the event logs (since its
        latest boot: a node killed while active logged no step-down)."""
        latest = None
        for role in (Role.PRIMARY, Role.BACKUP):
            since = self._started_at.get(role, 0.0)  # a restarted node's boot may not be in its log yet
            ds = [d for d in self.decisions(role) if d["kind"] in ("boot", "activate", "step_down") and d["ts"] >= since]
            if ds and ds[-1]["kind"] == "activate" and (latest is None or ds[-1]["epoch"] > latest[0]):
                latest = (ds[-1]["epoch"], role)
        return latest[1] if latest else None

    def wait_active(self, role: Role, timeout_s: float = 10.0) -> None:
        """Until the event logs say `role` is active: a decision reaches the log off the heartbeat thread,
        so under load it may trail the CLI's answer or a client's CONNACK."""
        self.wait_for(f"the {role.value}'s activation in the event logs", lambda: self.active() is role,
                      timeout_s=timeout_s)

    def backup_in_sync(self) -> bool:
        """The backup's latest in-sync decision says it holds the active's data (its mate link caught up)."""
        syncs = [d for d in self.decisions(Role.BACKUP, "sync") if "in sync" in d["reason"]]
        return bool(syncs) and "out of sync" not in syncs[-1]["reason"]

    def api(self, role: Role, path: str, timeout_s: float = 5.0) -> dict:
        """GET a management API path on `role`, signed with the group's key (every route needs a credential);
        an error answer raises urllib's HTTPError."""
        from pairmq.appliance.config import load_secret
        from pairmq.appliance.keyring import management_token
        from pairmq.cli.api import _context, base_url, signed_headers

        url = base_url(self.config, role) + path
        request = urllib.request.Request(
            url, headers=signed_headers(management_token(load_secret(self.config)), "GET", url))
        with urllib.request.urlopen(request, timeout=timeout_s, context=_context(url)) as response:
            return json.load(response)

    def serving(self, role: Role) -> bool:
        """`role` says it serves MQTT (False while its API does not answer)."""
        try:
            return self.api(role, "/api/v1/redundancy")["serving"]
        except OSError:
            return False

    def config_in_sync(self, active: Role = Role.PRIMARY) -> bool:
        """The active's config-sync view says its standby holds its configuration (docs/config_sync.md)."""
        try:
            return self.api(active, "/api/v1/config-sync", timeout_s=2)["status"] == "In-Sync"
        except (OSError, ValueError, KeyError):
            return False

    def probe_once(self, in_process: bool = False) -> dict[Role, int | None]:
        """One simultaneous CONNECT to primary and backup: {role: CONNACK code or None}.

        `in_process` (loopback only) saves the probe program's start, ~0.1 s of CPU a poll that the nodes
        starting up want; tests keep the program by default, as the time it takes is the time a node's
        event log needs to show what the CONNACK already says."""
        hosts = [self.address(Role.PRIMARY), self.address(Role.BACKUP)]
        if in_process and self.hosts is None and not _loop_running():
            codes = asyncio.run(probe.one_round(hosts))
        else:  # the client's network namespace, or a caller inside an event loop: the probe program
            argv = [sys.executable, "-m", "tests.harness.probe", "--hosts", ",".join(hosts), "--once"]
            out = (self.hosts.run("client", argv, capture_output=True, text=True, cwd=REPO, timeout=20) if self.hosts
                   else subprocess.run(argv, capture_output=True, text=True, cwd=REPO, timeout=20))
            codes = json.loads(out.stdout)
        return {Role.PRIMARY: codes[hosts[0]], Role.BACKUP: codes[hosts[1]]}

    def start_sampler(self, out: Path, duration_s: float, interval_ms: float = 15,
                      stop_file: Path | None = None) -> subprocess.Popen:
        hosts = [self.address(Role.PRIMARY), self.address(Role.BACKUP)]
        argv = [sys.executable, "-m", "tests.harness.probe", "--hosts", ",".join(hosts), "--interval-ms", str(interval_ms),
                "--duration-s", str(duration_s), "--out", str(out)]
        if stop_file is not None:
            argv += ["--stop-file", str(stop_file)]
        return self.hosts.popen("client", argv, cwd=REPO) if self.hosts else subprocess.Popen(argv, cwd=REPO)

    def accept_order_violations(self) -> list[str]:
        """S1 from the nodes' own logs: once an epoch accepted a client, no lower epoch may accept again.

        Every node stamps accepted CONNECTs with its monotonic clock, which on one
        machine is shared by every namespace, so the logs interleave exactly.
        """
        accepts = sorted((e["mono_ms"], e["epoch"], e["node"]) for r in (Role.PRIMARY, Role.BACKUP)
                         for e in self.events(r) if e["event"] == "client_accepted")
        problems, highest = [], (0, None)
        for t, epoch, node in accepts:
            if epoch < highest[0]:
                problems.append(f"{node} accepted a client at {t} in epoch {epoch} after {highest[1]} "
                                f"had accepted in epoch {highest[0]}")
            if epoch >= highest[0]:
                highest = (epoch, node)
        return problems

    def logs_tail(self, lines: int = 8) -> str:
        out = []
        for role in Role:
            path = self.dir / f"{role.value}.log"
            if path.exists():
                tail = path.read_text(errors="replace").splitlines()[-lines:]
                out.append(f"--- {role.value} ---\n" + "\n".join(tail))
        return "\n".join(out)


def _loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


class _suppress:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return exc[0] is not None and issubclass(exc[0], OSError)


@contextlib.contextmanager
def active_group(directory: Path, timeout_s: float = 20.0, **kwargs):
    """A loopback group (Group's keyword arguments) whose primary is active and serves MQTT."""
    with Group(directory, **kwargs) as g:
        g.start()
        g.wait_for("the primary to take activity", lambda: g.probe_once(in_process=True)[Role.PRIMARY] == 0,
                   timeout_s=timeout_s)
        g.wait_for("the backup's configuration to be in sync", g.config_in_sync, timeout_s=timeout_s)
        g.wait_for("the backup to be in sync", g.backup_in_sync, timeout_s=timeout_s)
        yield g

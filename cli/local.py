"""`pairmq local up|down|status`: a whole group on this machine (the embedded default).

Layout under DIR (default ./local):

    group.toml, secret     created on the first `up` (127.0.0.1-3, default ports)
    data/<role>/           each node's data directory; on the first `up` the
                           primary's and backup's config/access.json allow
                           anonymous clients (`pairmq config anonymous refuse`)
    run/<role>.pid         the pid of each detached `pairmq node` process
    logs/<role>.log        each node's stderr, appended

A pid file is trusted only while /proc shows that pid running `node --role
<role>`: a stale file left by a crash or a reboot is not a reason to refuse
`up`, and `down` never signals a process that merely reused the pid.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from pairmq.appliance.access_file import access_path, write_access
from pairmq.appliance.broker.access import AccessPolicy
from pairmq.appliance.config import GroupConfig, load_group, load_secret
from pairmq.appliance.errors import PairMQError
from pairmq.appliance.roles import Role

from . import api
from .init_group import GROUP_FILE, LOOPBACK_ADDRESSES, write_group
from .render import process_table, redundancy_table
from .show import title
from .terminal import Terminal

DEFAULT_DIR = Path("local")
LOCAL_GROUP_NAME = "local"
START_TIMEOUT_S = 15.0
STANDBY_TIMEOUT_S = 15.0  # a fresh standby joins in a few heartbeats; a long resync is shown by `show redundancy`
STOP_TIMEOUT_S = 5.0
KILL_WAIT_S = 1.0
POLL_INTERVAL_S = 0.1
PROBE_TIMEOUT_S = 0.3
UPTIME_SLACK_MS = 500
LOG_TAIL_LINES = 15


@dataclasses.dataclass(frozen=True, slots=True)
class Layout:
    dir: Path

    @property
    def group_file(self) -> Path:
        return self.dir / GROUP_FILE

    def pid_file(self, role: Role) -> Path:
        return self.dir / "run" / f"{role.value}.pid"

    def log_file(self, role: Role) -> Path:
        return self.dir / "logs" / f"{role.value}.log"


# --- processes ---------------------------------------------------------------------


def read_pid(layout: Layout, role: Role) -> int | None:
    try:
        return int(layout.pid_file(role).read_text().strip())
    except (FileNotFoundError, ValueError):
        return None


def is_node_process(pid: int, role: Role) -> bool:
    """True while `pid` is a live (not zombie) `node --role <role>` process."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    proc = Path("/proc") / str(pid)
    if not Path("/proc/self").exists():
        return True  # no procfs: trust the pid file
    try:
        state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        argv = (proc / "cmdline").read_bytes().split(b"\0")
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state != "Z" and b"node" in argv and role.value.encode() in argv


def running(layout: Layout) -> dict[Role, int]:
    out = {}
    for role in Role:
        pid = read_pid(layout, role)
        if pid is not None and is_node_process(pid, role):
            out[role] = pid
    return out


def node_command(group_file: Path, role: Role) -> list[str]:
    return [sys.executable, "-m", "pairmq.cli.main", "node", "--role", role.value, "--group", str(group_file)]


def spawn(layout: Layout, role: Role) -> tuple[subprocess.Popen, int]:
    """Start one detached node; returns it and the offset where this run's log begins."""
    log_path = layout.log_file(role)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    layout.pid_file(role).parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        offset = log.tell()
        proc = subprocess.Popen(node_command(layout.group_file.resolve(), role), stdin=subprocess.DEVNULL,
                                stdout=log, stderr=log, start_new_session=True, cwd=layout.dir,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
    layout.pid_file(role).write_text(f"{proc.pid}\n")
    return proc, offset


def log_tail(path: Path, offset: int = 0, lines: int = LOG_TAIL_LINES) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            text = f.read().decode("utf-8", "replace")
    except FileNotFoundError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


# --- the commands ----------------------------------------------------------------------


def up(term: Terminal, directory: Path) -> int:
    layout = Layout(directory)
    already = running(layout)
    if len(already) == len(Role):
        pids = ", ".join(f"{role.value} pid {pid}" for role, pid in already.items())
        raise PairMQError(f"the local group in {directory} is already running ({pids}); "
                          f"stop it first with `pairmq local down --dir {directory}`")
    missing = [role for role in Role if role not in already]
    if already:  # a node died (or was killed): start what is missing, as an operator restarts one host
        term.note(f"{', '.join(f'{r.value} (pid {pid})' for r, pid in already.items())} already running: "
                  f"starting {', '.join(r.value for r in missing)}")
    if not layout.group_file.exists():
        written = write_group(directory, name=LOCAL_GROUP_NAME, addresses=dict(LOOPBACK_ADDRESSES), data_dir="data")
        term.note(f"created {written.group_file} and a fresh secret {written.secret_file} (mode 0600)")
        # The embedded default is for trying PairMQ out: anonymous clients in, until the operator says otherwise.
        for role in (Role.PRIMARY, Role.BACKUP):
            write_access(access_path(written.config.node(role).data_dir), AccessPolicy(allow_anonymous=True))
        term.note(f"anonymous MQTT clients are allowed; refuse them with `pairmq config anonymous refuse "
                  f"--group {layout.group_file}` after adding users")
        from pairmq.appliance.api.admin_credential import DEFAULT_USER, generate_password

        from .admin_cmd import set_admin, show_admin_password

        password = generate_password()
        set_admin(written.config, DEFAULT_USER, password)
        show_admin_password(term, DEFAULT_USER, password, f"pairmq admin passwd --group {layout.group_file}")
    config = load_group(layout.group_file)
    load_secret(config)  # a missing or unsafe secret is this command's error, not three dead nodes
    _refuse_taken_ports(config, directory, missing)

    procs: dict[Role, tuple[subprocess.Popen, int]] = {}
    ok = False
    try:
        for role in missing:
            procs[role] = spawn(layout, role)
        nodes = _wait_serving(term, layout, config, procs, rejoining=bool(already))
        ok = True
        nodes = _wait_redundant(term, config, nodes)
    finally:
        if not ok:
            stopped = _stop(layout, {role: p.pid for role, (p, _) in procs.items()})
            for proc, _ in procs.values():
                proc.poll()  # reap our own children
            if stopped:
                term.note(f"stopped the nodes that had started ({', '.join(s.role.value for s in stopped)})")
    pids = ", ".join(f"{role.value} {proc.pid}" for role, (proc, _) in procs.items())
    term.note(f"local group {config.name!r} is up in {directory} ({'started' if already else 'pids'} {pids}; logs "
              f"in {directory / 'logs'})")
    term.print_text(f"Host list: {config.host_list()}")
    term.print_table(redundancy_table(nodes, title=title(config)))
    term.record(**api.redundancy_document(config, nodes), dir=str(directory.resolve()), host_list=config.host_list(),
                pids={role.value: proc.pid for role, (proc, _) in procs.items()})
    return 0


def _redundant(nodes: list[dict]) -> bool:
    """A node serves with redundancy up, and its mate answers as an in-sync standby."""
    active = [n for n in nodes if n.get("serving")]
    if len(active) != 1 or active[0].get("redundancy_status") != "Up":
        return False
    mate = Role(active[0]["role"]).mate().value
    return any(n["role"] == mate and n.get("reachable") and n.get("in_sync") is True for n in nodes)


def _wait_redundant(term: Terminal, config: GroupConfig, nodes: list[dict]) -> list[dict]:
    """Once a node serves, until its mate has joined as an in-sync standby, so that the table printed last is
    the group's steady state; bounded, with a note when the standby is still joining."""
    deadline = time.monotonic() + STANDBY_TIMEOUT_S
    with term.status("waiting for the standby to join and catch up") as status:
        while not _redundant(nodes):
            if time.monotonic() >= deadline:
                term.warn(f"the standby has not joined within {STANDBY_TIMEOUT_S:g} s: the group serves, without "
                          f"redundancy for now; follow it with `pairmq show redundancy --watch --group "
                          f"{config.path}`")
                break
            time.sleep(POLL_INTERVAL_S)
            nodes = api.fetch_redundancy(config, timeout_s=0.5)
            status.update("waiting for the standby: " + ", ".join(
                f"{n['role']} {n['activity'] if n['reachable'] else 'starting'}" for n in nodes))
    return nodes


def _refuse_taken_ports(config: GroupConfig, directory: Path, roles: list[Role]) -> None:
    """Another group (say, from another directory) on the same addresses would answer
    our readiness checks and make our nodes die on bind: refuse before starting any of `roles`."""
    for role in roles:
        address = config.node(role).address
        ports = [config.ports.management] + ([config.ports.mqtt] if role.routes_messages else [])
        for port in ports:
            try:
                with socket.create_connection((address, port), timeout=PROBE_TIMEOUT_S):
                    pass
            except OSError:
                continue
            kind = "MQTT" if port == config.ports.mqtt else "management"
            raise PairMQError(f"{address}:{port} (the {role.value}'s {kind} port) is already in use, perhaps by "
                              f"a local group started from another directory; "
                              f"stop that first (`pairmq local down --dir ...`), then run `pairmq local up --dir "
                              f"{directory}` again")


def _wait_serving(term: Terminal, layout: Layout, config: GroupConfig,
                  procs: dict[Role, tuple[subprocess.Popen, int]], rejoining: bool = False) -> list[dict]:
    """Until a node of ours serves (a fresh group), or, `rejoining` a running group, until the nodes we started
    answer on their management API and some node serves."""
    started = time.monotonic()
    deadline = started + START_TIMEOUT_S
    nodes: list[dict] = []
    with term.status("starting the local group: primary, backup, monitor") as status:
        while True:
            for role, (proc, offset) in procs.items():
                code = proc.poll()
                if code is not None:
                    tail = log_tail(layout.log_file(role), offset)
                    if tail:
                        term.note(f"the last lines of {layout.log_file(role)}:")
                        term.detail("\n".join(f"  {line}" for line in tail.splitlines()))
                    raise PairMQError(f"the {role.value} node exited during start-up (exit code {code}); "
                                      f"its log is {layout.log_file(role)}")
            nodes = api.fetch_redundancy(config, timeout_s=0.5)
            # A serving node counts only if it is one of ours: younger than our processes.
            ours_ms = (time.monotonic() - started) * 1000 + UPTIME_SLACK_MS
            if rejoining:
                answered = {n["role"] for n in nodes if n.get("reachable")}
                ready = any(n.get("serving") for n in nodes) and {r.value for r in procs} <= answered
            else:
                ready = any(n.get("serving") and n.get("uptime_ms", ours_ms + 1) <= ours_ms for n in nodes)
            if ready and all(proc.poll() is None for proc, _ in procs.values()):
                return nodes
            if time.monotonic() >= deadline:
                term.print_table(redundancy_table(nodes, title=title(config)))
                raise PairMQError(f"no node took activity within {START_TIMEOUT_S:g} s; the table above shows "
                                  f"each node's last decision, and the logs are in {layout.dir / 'logs'}")
            status.update("waiting for a node to take activity: " + ", ".join(
                f"{n['role']} {n['activity'] if n['reachable'] else 'starting'}" for n in nodes))
            time.sleep(POLL_INTERVAL_S)


@dataclasses.dataclass(frozen=True, slots=True)
class Stopped:
    role: Role
    pid: int
    killed: bool


def _stop(layout: Layout, pids: dict[Role, int]) -> list[Stopped]:
    """SIGTERM each live node, wait up to STOP_TIMEOUT_S in all, SIGKILL the rest."""
    live = {role: pid for role, pid in pids.items() if is_node_process(pid, role)}
    for pid in live.values():
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while time.monotonic() < deadline and any(is_node_process(pid, role) for role, pid in live.items()):
        time.sleep(POLL_INTERVAL_S)
    stopped = []
    for role, pid in live.items():
        killed = is_node_process(pid, role)
        if killed:
            _signal(pid, signal.SIGKILL)
        stopped.append(Stopped(role, pid, killed))
    deadline = time.monotonic() + KILL_WAIT_S  # SIGKILL is not instant: return once the ports are free
    while time.monotonic() < deadline and any(is_node_process(s.pid, s.role) for s in stopped if s.killed):
        time.sleep(POLL_INTERVAL_S / 10)
    for role in pids:
        layout.pid_file(role).unlink(missing_ok=True)
    return stopped


def _signal(pid: int, sig: signal.Signals) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def down(term: Terminal, directory: Path) -> int:
    layout = Layout(directory)
    recorded = {role: pid for role in Role if (pid := read_pid(layout, role)) is not None}
    stale = [role for role in Role if layout.pid_file(role).exists() and role not in recorded]
    for role in stale:  # unreadable pid files
        layout.pid_file(role).unlink(missing_ok=True)
    stopped = _stop(layout, recorded)
    term.record(dir=str(directory.resolve()), stopped=[{"role": s.role.value, "pid": s.pid, "killed": s.killed}
                                                       for s in stopped])
    if not stopped:
        term.note(f"nothing to stop: no local group is running in {directory}")
        return 0
    parts = [f"{s.role.value} (pid {s.pid}{', killed after ' + format(STOP_TIMEOUT_S, 'g') + ' s' if s.killed else ''})"
             for s in stopped]
    term.note(f"stopped the local group in {directory}: {', '.join(parts)}")
    return 0


def status(term: Terminal, directory: Path, *, as_json: bool) -> int:
    layout = Layout(directory)
    if not layout.group_file.exists():
        raise PairMQError(f"there is no local group in {directory} ({layout.group_file} does not exist); "
                          f"start one with `pairmq local up --dir {directory}`")
    config = load_group(layout.group_file)
    live = running(layout)
    processes = [{"role": role.value, "pid": live.get(role), "running": role in live,
                  "log": str(layout.log_file(role))} for role in Role]
    nodes = api.fetch_redundancy(config) if live else [
        {"role": role.value, "address": config.node(role).address, "reachable": False, "error": "not running"}
        for role in Role]
    if as_json:
        term.print_json({**api.redundancy_document(config, nodes), "dir": str(directory.resolve()),
                         "processes": processes})
        return 0
    if live:
        term.print_text(f"Host list: {config.host_list()}")
        term.print_table(redundancy_table(nodes, title=title(config)))
        term.print_text("")
    term.print_table(process_table(processes))
    if not live:
        term.note(f"the local group in {directory} is not running; start it with `pairmq local up --dir {directory}`")
    return 0

"""The brokers under test: start, wait until they answer CONNECT, measure their CPU and memory, stop.

  pairmq             a local group (tests/harness/group.py: real node processes on
                     127.0.0.1/.2/.3, the fixed ports, under their lock); the
                     load goes to the active primary.
  mosquitto          Debian's /usr/sbin/mosquitto on 127.0.0.1 and a free port,
                     persistence off; mosquitto-persist the same with it on.
  amqtt              pip-installed into a throwaway venv at bench time.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from pairmq.appliance.broker.access import AccessPolicy, Action, Effect, Rule
from pairmq.appliance.eventlog import EventSettings
from pairmq.appliance.roles import Role
from tests.harness.group import active_group
from tests.harness.mqttraw import connect_packet

MOSQUITTO = "/usr/sbin/mosquitto"
CLK_TCK = os.sysconf("SC_CLK_TCK")
QUIET_CPU_FRACTION = 0.2  # between tests: wait until the broker uses less than this of a CPU
QUIET_WAIT_S = 20.0


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


@dataclass
class Target:
    name: str
    host: str
    port: int
    pid: int
    notes: Callable[[], list[str]] = lambda: []  # what the broker itself reported, read after the tests
    ws_port: int | None = None  # MQTT over WebSockets, path /mqtt


async def wait_quiet(target: Target) -> None:
    """Let the broker finish what earlier tests left it (queued deliveries, closes) before the next test."""
    deadline = time.monotonic() + QUIET_WAIT_S
    while time.monotonic() < deadline:
        before = cpu_s(target.pid)
        await asyncio.sleep(0.25)
        if cpu_s(target.pid) - before < 0.25 * QUIET_CPU_FRACTION:
            return


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_listening(host: str, port: int, proc: subprocess.Popen, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"exited with code {proc.returncode} before listening")
        try:
            with socket.create_connection((host, port), timeout=1) as s:
                s.sendall(connect_packet("bench-ready"))
                if s.recv(4)[:1] == b"\x20":
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"not listening on {host}:{port} after {timeout_s} s")


def stop_process(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


ACL_RULES = 50  # pairmq-acl: this many rules, the one that grants the benchmark's topics last


def bench_acl() -> AccessPolicy:
    """Anonymous clients (the load generator's) allowed, behind ACL_RULES - 1 rules that do not apply: every
    PUBLISH and every delivery is checked against the whole list (deliveries through the per-topic cache)."""
    rules = [Rule(Effect.DENY, Action.BOTH, f"other/{i}/#", "all") for i in range(ACL_RULES - 1)]
    return AccessPolicy(True, {}, (*rules, Rule(Effect.ALLOW, Action.BOTH, "#", "all")))


@contextlib.contextmanager
def run_pairmq(workdir: Path, *, acl: bool = False):
    # PAIRMQ_MESSAGE_EVENTS=0: per-message event logging off, to measure what it costs (docs/events.md).
    events = EventSettings(message_events=os.environ.get("PAIRMQ_MESSAGE_EVENTS", "1") != "0")
    name = "pairmq-acl" if acl else "pairmq"
    access = bench_acl() if acl else AccessPolicy(allow_anonymous=True)
    with active_group(workdir / name, timeout_s=30, events=events, access=access) as g:
        yield Target(name, g.address(Role.PRIMARY), g.config.ports.mqtt, g.pid(Role.PRIMARY),
                     notes=lambda: [f"redundancy decision during the run: {d['reason']}"
                                    for r in (Role.PRIMARY, Role.BACKUP) for d in g.decisions(r)
                                    if d["kind"] == "step_down" or d["kind"] == "activate" and d["epoch"] > 1],
                     ws_port=g.config.ports.mqtt_ws)


@contextlib.contextmanager
def run_mosquitto(workdir: Path, persist: bool):
    name = "mosquitto-persist" if persist else "mosquitto"
    directory = workdir / name
    directory.mkdir()
    port, ws_port = free_port(), free_port()
    conf = directory / "mosquitto.conf"
    conf.write_text("\n".join([
        f"listener {port} 127.0.0.1", f"listener {ws_port} 127.0.0.1", "protocol websockets",
        "allow_anonymous true", f"user {os.environ.get('USER') or 'root'}",
        f"persistence {'true' if persist else 'false'}", f"persistence_location {directory}/",
        "autosave_interval 1800", "max_inflight_messages 32", "max_queued_messages 0",
        "set_tcp_nodelay true", "max_connections -1", "log_dest none", ""]))
    proc = subprocess.Popen([MOSQUITTO, "-c", str(conf)], stdout=subprocess.DEVNULL,
                            stderr=open(directory / "mosquitto.log", "wb"), start_new_session=True)
    try:
        wait_listening("127.0.0.1", port, proc)
        yield Target(name, "127.0.0.1", port, proc.pid, ws_port=ws_port)
    finally:
        stop_process(proc)


def install_amqtt(venv: Path) -> str:
    """The amqtt version, installing it into `venv` first if needed; RuntimeError saying why not."""
    python = venv / "bin" / "python"
    probe = [str(python), "-c", "import importlib.metadata as m; print(m.version('amqtt'))"]
    if python.exists():
        out = subprocess.run(probe, capture_output=True, text=True)
        if out.returncode == 0:
            return out.stdout.strip()
    log(f"installing amqtt into {venv} ...")
    for argv in ([sys.executable, "-m", "venv", str(venv)], [str(venv / "bin" / "pip"), "install", "-q", "amqtt"]):
        out = subprocess.run(argv, capture_output=True, text=True, timeout=600)
        if out.returncode != 0:
            tail = (out.stderr or out.stdout).strip().splitlines()[-1:] or ["no output"]
            raise RuntimeError(f"`{' '.join(argv)}` failed: {tail[0]}")
    out = subprocess.run(probe, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"amqtt installed but not importable: {out.stderr.strip().splitlines()[-1:]}")
    return out.stdout.strip()


@contextlib.contextmanager
def run_amqtt(workdir: Path, venv: Path):
    directory = workdir / "amqtt"
    directory.mkdir()
    port = free_port()
    conf = directory / "amqtt.yaml"
    conf.write_text(f"listeners:\n  default:\n    type: tcp\n    bind: 127.0.0.1:{port}\n    max_connections: 0\n"
                    "plugins:\n  amqtt.plugins.authentication.AnonymousAuthPlugin:\n    allow_anonymous: true\n")
    proc = subprocess.Popen([str(venv / "bin" / "amqtt"), "-c", str(conf)], stdout=subprocess.DEVNULL,
                            stderr=open(directory / "amqtt.log", "wb"), start_new_session=True)
    try:
        try:
            wait_listening("127.0.0.1", port, proc)
        except RuntimeError as exc:
            tail = (directory / "amqtt.log").read_text(errors="replace").strip().splitlines()[-1:]
            raise RuntimeError(f"amqtt {exc}: {tail[0] if tail else 'no log'}") from None
        yield Target("amqtt", "127.0.0.1", port, proc.pid)
    finally:
        stop_process(proc)


class Measure:
    """Broker CPU over a test's measured window."""

    def __init__(self, target: Target) -> None:
        self.target = target

    def __enter__(self):
        self.t0, self.c0, self.g0, self.b0 = time.monotonic(), cpu_s(self.target.pid), _own_cpu_s(), _busy_s()
        return self

    def __exit__(self, *exc) -> None:
        self.elapsed = time.monotonic() - self.t0
        self.cpu = (cpu_s(self.target.pid) - self.c0) / self.elapsed
        self.generator_cpu = (_own_cpu_s() - self.g0) / self.elapsed
        self.other_cpu = (_busy_s() - self.b0) / self.elapsed - self.cpu - self.generator_cpu


def _busy_s() -> float:
    """CPU seconds every process on the machine has used (the first line of /proc/stat, minus idle and iowait)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / CLK_TCK


def _own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime

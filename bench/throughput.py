"""Throughput benchmark: PairMQ against mosquitto and amqtt, one load generator, one run.

    python bench/throughput.py [--duration-s 5] [--storm 10000] [--write-docs]

Theory of operation
-------------------
Brokers, each started by this script and stopped after its turn:
  pairmq             a local group (tests/group.py: real node processes on
                     127.0.0.1/.2/.3, the fixed ports, under their lock); the
                     load goes to the active primary, which acknowledges QoS 1
                     only after its SQLite spool's group commit (fsync).
  mosquitto          Debian's /usr/sbin/mosquitto on 127.0.0.1 and a free port,
                     persistence off.
  mosquitto-persist  the same with persistence on: an in-memory broker that
                     writes a snapshot every autosave_interval (1800 s) and at
                     exit. That is not per-message durability.
  amqtt              pip-installed into a throwaway venv (--amqtt-venv) at
                     bench time, its packet/event logging plugins off.
Both mosquitto runs get max_inflight_messages 32 (PairMQ's window towards a
3.1.1 client) and no queue limit (mosquitto's default 1,000 drops QoS 1).

The load generator is this file: a raw MQTT 3.1.1 client on asyncio (uvloop
when installed) Protocols, pre-encoded packets, pipelined writes, one PUBACK
write per read. Every broker gets exactly the same generator. Tests:
  qos0 1->1, 4->1    publishers write 100-byte QoS 0 PUBLISHes as fast as TCP
                     takes them; msg/s counted at one subscriber over the
                     measured window (after a 0.5 s warm-up)
  qos1 1->1          one publisher keeps --window QoS 1 PUBLISHes unacknowledged;
                     one persistent (clean session off) QoS 1 subscriber
  latency            window 1: publish -> PUBACK, p50/p99; a persistent QoS 1
                     subscriber is present so the message is really stored
  storm              N clients connect at once (one process, every connect
                     issued without waiting): time to the last CONNACK,
                     refusals (CONNACK != 0, resets, no answer in 60 s), max
                     CONNACK latency. Then with the N clients idle, RSS per
                     idle connection = (VmRSS after - VmRSS before) / N of the
                     broker process (PairMQ: the primary node's pid).
The generator and the broker share this machine's CPUs; each test also
reports the broker's CPU use (utime + stime from /proc) so a reader can tell
a broker-bound number from a generator-bound one.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import os
import platform
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from appliance.roles import Role  # noqa: E402
from tests.group import Group, fixed_ports  # noqa: E402

MOSQUITTO = "/usr/sbin/mosquitto"
DOC_BEGIN, DOC_END = "<!-- throughput:begin -->", "<!-- throughput:end -->"
WARMUP_S = 0.5
CONNECT_TIMEOUT_S = 60.0
QUIET_CPU_FRACTION = 0.2  # between tests: wait until the broker uses less than this of a CPU
QUIET_WAIT_S = 20.0
GENERATOR_CPU_NOTE = 0.8  # above this the generator, not the broker, may be the limit
OTHER_CPU_NOTE = 0.15  # a test during which other processes used more than this of a CPU gets a note
CLK_TCK = os.sysconf("SC_CLK_TCK")
TESTS = ("qos0", "qos1", "latency", "storm")
GOALS = {
    "qos0": 0.5,  # x mosquitto
    "qos1": 0.5,  # durable QoS 1, x mosquitto
    "amqtt": 10.0,  # x amqtt, every throughput test
    "storm_connack_s": 2.0,
    "rss_kib": 30.0,
}


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# --- MQTT 3.1.1 packets ------------------------------------------------------------------


def _remaining(n: int) -> bytes:
    out = bytearray()
    while True:
        n, digit = divmod(n, 128)
        out.append(digit | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _str(s: str) -> bytes:
    b = s.encode()
    return len(b).to_bytes(2, "big") + b


def connect_packet(client_id: str, clean: bool = True, keepalive_s: int = 300) -> bytes:
    body = _str("MQTT") + bytes([4, 0x02 if clean else 0]) + keepalive_s.to_bytes(2, "big") + _str(client_id)
    return b"\x10" + _remaining(len(body)) + body


def subscribe_packet(packet_id: int, topic_filter: str, qos: int) -> bytes:
    body = packet_id.to_bytes(2, "big") + _str(topic_filter) + bytes([qos])
    return b"\x82" + _remaining(len(body)) + body


def publish_qos0(topic: str, payload: bytes) -> bytes:
    body = _str(topic) + payload
    return b"\x30" + _remaining(len(body)) + body


class Qos1Encoder:
    """PUBLISH QoS 1 with a rolling packet id: header and topic encoded once."""

    def __init__(self, topic: str, payload: bytes) -> None:
        t = _str(topic)
        self.head = b"\x32" + _remaining(len(t) + 2 + len(payload)) + t
        self.payload = payload
        self.next_id = 0

    def packet(self) -> bytes:
        self.next_id = self.next_id % 65535 + 1
        return self.head + self.next_id.to_bytes(2, "big") + self.payload


DISCONNECT = b"\xe0\x00"


class Client(asyncio.Protocol):
    """One raw MQTT 3.1.1 connection. Counts PUBLISHes in, answers QoS 1 with one PUBACK write per read."""

    def __init__(self) -> None:
        loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.connack: asyncio.Future = loop.create_future()
        self.suback: asyncio.Future = loop.create_future()
        self.closed: asyncio.Future = loop.create_future()
        self.received = 0
        self.acks = 0
        self.on_acks = None  # called with the number of PUBACKs in one read
        self.writable = asyncio.Event()
        self.writable.set()

    def connection_made(self, transport) -> None:
        self.transport = transport
        transport.set_write_buffer_limits(high=256 * 1024)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def pause_writing(self) -> None:
        self.writable.clear()

    def resume_writing(self) -> None:
        self.writable.set()

    def connection_lost(self, exc) -> None:
        self.writable.set()
        for fut in (self.connack, self.suback, self.closed):
            if not fut.done():
                fut.set_result(None if fut is self.closed else exc or ConnectionResetError("closed"))

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        i, n = 0, len(buf)
        acks = 0
        pubacks = []
        while n - i >= 2:
            header = buf[i]
            length, mult, j = 0, 1, i + 1
            while j < n:
                b = buf[j]
                length += (b & 0x7F) * mult
                j += 1
                if b < 0x80:
                    break
                mult <<= 7
            else:
                break
            end = j + length
            if end > n:
                break
            kind = header >> 4
            if kind == 3:
                self.received += 1
                if header & 0x06:
                    at = j + 2 + (buf[j] << 8 | buf[j + 1])
                    pubacks.append(b"\x40\x02" + bytes(buf[at:at + 2]))
            elif kind == 4:
                acks += 1
            elif kind == 2:
                if not self.connack.done():
                    self.connack.set_result(buf[j + 1])
            elif kind == 9:
                if not self.suback.done():
                    self.suback.set_result(bytes(buf[j + 2:end]))
            i = end
        if i:
            del buf[:i]
        if pubacks:
            self.transport.write(b"".join(pubacks))
        if acks:
            self.acks += acks
            if self.on_acks is not None:
                self.on_acks(acks)

    def send(self, data: bytes) -> None:
        self.transport.write(data)

    def close(self, graceful: bool = True) -> None:
        if self.transport is not None and not self.transport.is_closing():
            if graceful:
                self.transport.write(DISCONNECT)
                self.transport.close()
            else:
                self.transport.abort()


async def connect(host: str, port: int, client_id: str, clean: bool = True) -> Client:
    loop = asyncio.get_running_loop()
    _, client = await loop.create_connection(Client, host, port)
    client.send(connect_packet(client_id, clean))
    rc = await asyncio.wait_for(client.connack, CONNECT_TIMEOUT_S)
    if rc != 0:
        raise ConnectionRefusedError(f"CONNACK {rc!r} for {client_id}")
    return client


async def subscriber(host: str, port: int, client_id: str, topic_filter: str, qos: int, clean: bool) -> Client:
    client = await connect(host, port, client_id, clean)
    client.send(subscribe_packet(1, topic_filter, qos))
    granted = await asyncio.wait_for(client.suback, 10)
    if not isinstance(granted, bytes) or granted[0] != qos:
        raise RuntimeError(f"SUBACK {granted!r} for {topic_filter} QoS {qos}")
    return client


async def close_all(clients) -> None:
    for c in clients:
        c.close()
    await asyncio.sleep(0.05)


# --- the broker under test ---------------------------------------------------------------


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


@contextlib.contextmanager
def run_pairmq(workdir: Path):
    with Group(workdir / "pairmq") as g:
        g.start()
        g.wait_for("the primary to take activity", lambda: g.probe_once()[Role.PRIMARY] == 0, timeout_s=30)
        yield Target("pairmq", g.address(Role.PRIMARY), g.config.ports.mqtt, g.pid(Role.PRIMARY),
                     notes=lambda: [f"redundancy decision during the run: {d['reason']}"
                                    for r in (Role.PRIMARY, Role.BACKUP) for d in g.decisions(r)
                                    if d["kind"] == "step_down" or d["kind"] == "activate" and d["epoch"] > 1])


@contextlib.contextmanager
def run_mosquitto(workdir: Path, persist: bool):
    name = "mosquitto-persist" if persist else "mosquitto"
    directory = workdir / name
    directory.mkdir()
    port = free_port()
    conf = directory / "mosquitto.conf"
    conf.write_text("\n".join([
        f"listener {port} 127.0.0.1", "allow_anonymous true", f"user {os.environ.get('USER') or 'root'}",
        f"persistence {'true' if persist else 'false'}", f"persistence_location {directory}/",
        "autosave_interval 1800", "max_inflight_messages 32", "max_queued_messages 0",
        "set_tcp_nodelay true", "max_connections -1", "log_dest none", ""]))
    proc = subprocess.Popen([MOSQUITTO, "-c", str(conf)], stdout=subprocess.DEVNULL,
                            stderr=open(directory / "mosquitto.log", "wb"), start_new_session=True)
    try:
        wait_listening("127.0.0.1", port, proc)
        yield Target(name, "127.0.0.1", port, proc.pid)
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


# --- the tests ---------------------------------------------------------------------------


@dataclass
class Result:
    broker: str
    values: dict = field(default_factory=dict)  # metric -> number
    cpu: dict = field(default_factory=dict)  # metric -> broker CPU fraction (1.0 = one core)
    generator_cpu: dict = field(default_factory=dict)  # metric -> the load generator's
    notes: list = field(default_factory=list)

    def measured(self, metric: str, m: "Measure") -> None:
        self.cpu[metric], self.generator_cpu[metric] = m.cpu, m.generator_cpu
        if m.generator_cpu > GENERATOR_CPU_NOTE:
            self.notes.append(f"{metric}: the load generator used {m.generator_cpu:.0%} of a CPU: the broker may "
                              "be faster than this number")
        if m.other_cpu > OTHER_CPU_NOTE:
            self.notes.append(f"{metric}: other processes used {m.other_cpu:.0%} of a CPU during the measurement "
                              "(the PairMQ backup and monitor, or other tenants)")


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


async def qos0(target: Target, publishers: int, duration_s: float, payload: bytes, tag: str):
    sub = await subscriber(target.host, target.port, f"bench-{tag}-sub", f"bench/{tag}/#", 0, clean=True)
    pubs = [await connect(target.host, target.port, f"bench-{tag}-pub{i}") for i in range(publishers)]
    sent = [0] * publishers
    stop = False

    async def publish(i: int) -> None:
        batch_n = 64
        batch = publish_qos0(f"bench/{tag}/{i}", payload) * batch_n
        c = pubs[i]
        while not stop and not c.closed.done():
            c.send(batch)
            sent[i] += batch_n
            await c.writable.wait()
            await asyncio.sleep(0)

    tasks = [asyncio.create_task(publish(i)) for i in range(publishers)]
    await asyncio.sleep(WARMUP_S)
    with Measure(target) as m:
        r0 = sub.received
        await asyncio.sleep(duration_s)
        r1 = sub.received
    stop = True
    await asyncio.gather(*tasks)
    await close_all([*pubs, sub])
    return (r1 - r0) / m.elapsed, m, sum(sent)


async def qos1(target: Target, window: int, duration_s: float, payload: bytes):
    """(msg/s at the subscriber, PUBACKs/s at the publisher, Measure)."""
    sub = await subscriber(target.host, target.port, "bench-q1-sub", "bench/q1", 1, clean=False)
    pub = await connect(target.host, target.port, "bench-q1-pub")
    enc = Qos1Encoder("bench/q1", payload)
    stop = False

    def refill(n: int) -> None:
        if not stop:
            pub.send(b"".join(enc.packet() for _ in range(n)))

    pub.on_acks = refill
    refill(window)
    await asyncio.sleep(WARMUP_S)
    with Measure(target) as m:
        r0, a0 = sub.received, pub.acks
        await asyncio.sleep(duration_s)
        r1, a1 = sub.received, pub.acks
    stop = True
    await asyncio.sleep(0.2)
    await close_all([pub, sub])
    return (r1 - r0) / m.elapsed, (a1 - a0) / m.elapsed, m


async def latency(target: Target, duration_s: float, payload: bytes):
    sub = await subscriber(target.host, target.port, "bench-lat-sub", "bench/lat", 1, clean=False)
    pub = await connect(target.host, target.port, "bench-lat-pub")
    enc = Qos1Encoder("bench/lat", payload)
    loop = asyncio.get_running_loop()
    waiter: list[asyncio.Future] = []
    pub.on_acks = lambda n: waiter[0].done() or waiter[0].set_result(None)
    samples = []
    with Measure(target) as m:
        deadline = time.monotonic() + duration_s
        while time.monotonic() < deadline:
            waiter[:] = [loop.create_future()]
            t0 = time.perf_counter()
            pub.send(enc.packet())
            await asyncio.wait_for(waiter[0], 10)
            samples.append((time.perf_counter() - t0) * 1000)
    await close_all([pub, sub])
    return samples, m


async def storm(target: Target, n: int) -> dict:
    loop = asyncio.get_running_loop()
    clients: list[Client] = []
    accepted: list[Client] = []
    latencies: list[float] = []
    refused = {"connack": 0, "error": 0, "timeout": 0}

    async def one(i: int) -> None:
        t0 = time.perf_counter()
        try:
            _, c = await asyncio.wait_for(loop.create_connection(Client, target.host, target.port), CONNECT_TIMEOUT_S)
        except asyncio.TimeoutError:
            refused["timeout"] += 1
            return
        except OSError:
            refused["error"] += 1
            return
        clients.append(c)
        c.send(connect_packet(f"storm-{i}"))
        try:
            rc = await asyncio.wait_for(c.connack, max(0.1, CONNECT_TIMEOUT_S - (time.perf_counter() - t0)))
        except asyncio.TimeoutError:
            refused["timeout"] += 1
            return
        if rc == 0:
            latencies.append(time.perf_counter() - t0)
            accepted.append(c)
        elif isinstance(rc, int):
            refused["connack"] += 1
        else:
            refused["error"] += 1

    await wait_quiet(target)
    rss_before = rss_kib(target.pid)
    started = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(n)))
    total_s = time.perf_counter() - started
    await asyncio.sleep(1.0)  # idle: keep-alive is 300 s, nothing moves
    await wait_quiet(target)
    idle = sum(1 for c in accepted if not c.closed.done())
    rss_after = rss_kib(target.pid)
    for c in clients:
        c.close(graceful=False)  # RST: no TIME_WAIT left behind for the next broker's storm
    await asyncio.sleep(0.5)
    return {"total_s": total_s, "accepted": len(latencies), "refused": sum(refused.values()), "refusals": refused,
            "max_connack_s": max(latencies, default=float("nan")),
            "p50_connack_s": percentile(sorted(latencies), 50) if latencies else float("nan"),
            "p99_connack_s": percentile(sorted(latencies), 99) if latencies else float("nan"),
            "idle": idle, "rss_before_kib": rss_before, "rss_after_kib": rss_after,
            "rss_per_conn_kib": (rss_after - rss_before) / idle if idle else float("nan")}


def percentile(sorted_values: list[float], p: float) -> float:
    """Nearest rank."""
    k = max(0, min(len(sorted_values) - 1, int(-(-p * len(sorted_values) // 100)) - 1))
    return sorted_values[k]


async def cancellable(coro):
    """Run `coro`; SIGTERM/SIGINT/SIGHUP cancel it, so the `with` blocks around the run stop every broker."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        loop.add_signal_handler(sig, task.cancel)
    try:
        return await coro
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.remove_signal_handler(sig)
        install_signal_handlers()


async def bench_target(target: Target, args) -> Result:
    payload = bytes(args.payload)
    result = Result(target.name)
    v = result.values
    tests = args.test_set
    for label, publishers in (("qos0_1to1", 1), ("qos0_4to1", 4)) if "qos0" in tests else ():
        await wait_quiet(target)
        rate, m, sent = await qos0(target, publishers, args.duration_s, payload, label)
        v[label] = rate
        result.measured(label, m)
        log(f"  {target.name} {label}: {rate:,.0f} msg/s at the subscriber ({sent:,} sent), broker CPU {m.cpu:.0%}, "
            f"generator CPU {m.generator_cpu:.0%}")
    if "qos1" in tests:
        await qos1_test(target, args, payload, result)
    if "latency" in tests:
        await latency_test(target, args, payload, result)
    if "storm" in tests:
        await storm_test(target, args, result)
    result.notes += target.notes()
    return result


async def qos1_test(target: Target, args, payload: bytes, result: Result) -> None:
    v = result.values
    await wait_quiet(target)
    v["qos1"], v["qos1_acked"], m = await qos1(target, args.window, args.duration_s, payload)
    result.measured("qos1", m)
    log(f"  {target.name} qos1 window {args.window}: {v['qos1']:,.0f} msg/s at the subscriber, "
        f"{v['qos1_acked']:,.0f} PUBACKs/s at the publisher, broker CPU {m.cpu:.0%}, "
        f"generator CPU {m.generator_cpu:.0%}")


async def latency_test(target: Target, args, payload: bytes, result: Result) -> None:
    v = result.values
    await wait_quiet(target)
    samples, m = await latency(target, args.duration_s, payload)
    result.measured("lat_p50_ms", m)
    samples.sort()
    v["lat_p50_ms"], v["lat_p99_ms"], v["lat_n"] = percentile(samples, 50), percentile(samples, 99), len(samples)
    log(f"  {target.name} latency: p50 {v['lat_p50_ms']:.3f} ms, p99 {v['lat_p99_ms']:.3f} ms ({len(samples)} samples)")


async def storm_test(target: Target, args, result: Result) -> None:
    v = result.values
    s = await storm(target, args.storm)
    v.update({f"storm_{k}": s[k] for k in ("total_s", "accepted", "refused", "max_connack_s", "p50_connack_s",
                                            "p99_connack_s", "idle", "rss_before_kib", "rss_after_kib",
                                            "rss_per_conn_kib")})
    if s["refused"]:
        result.notes.append(f"storm refusals: {s['refusals']}")
    log(f"  {target.name} storm {args.storm}: all CONNACKs in {s['total_s']:.2f} s, refused {s['refused']} "
        f"{s['refusals']}, CONNACK p50 {s['p50_connack_s'] * 1000:.0f} ms, p99 {s['p99_connack_s'] * 1000:.0f} ms, "
        f"max {s['max_connack_s'] * 1000:.0f} ms; RSS {s['rss_before_kib']} -> "
        f"{s['rss_after_kib']} KiB with {s['idle']} idle = {s['rss_per_conn_kib']:.1f} KiB/connection")


# --- the report --------------------------------------------------------------------------

ROWS = [
    ("qos0_1to1", "QoS 0 1→1 (msg/s)", "{:,.0f}"),
    ("qos0_4to1", "QoS 0 4→1 (msg/s)", "{:,.0f}"),
    ("qos1", "QoS 1 1→1, window {window} (msg/s at the subscriber)", "{:,.0f}"),
    ("qos1_acked", "QoS 1 1→1: PUBACKs/s at the publisher", "{:,.0f}"),
    ("lat_p50_ms", "QoS 1 publish→PUBACK p50, window 1 (ms)", "{:.3f}"),
    ("lat_p99_ms", "QoS 1 publish→PUBACK p99, window 1 (ms)", "{:.3f}"),
    ("storm_total_s", "storm of {storm}: time to all CONNACKs (s)", "{:.2f}"),
    ("storm_refused", "storm of {storm}: refusals", "{:,.0f}"),
    ("storm_max_connack_s", "storm of {storm}: max CONNACK latency (s)", "{:.3f}"),
    ("storm_rss_per_conn_kib", "RSS per idle connection (KiB)", "{:.1f}"),
]
THROUGHPUT = ("qos0_1to1", "qos0_4to1", "qos1")
THROUGHPUT_LABELS = ("QoS 0 1→1", "QoS 0 4→1", "QoS 1 1→1")


def table(results: list[Result], args) -> str:
    names = [r.broker for r in results]
    lines = ["| measure | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    for key, label, fmt in ROWS:
        cells = []
        for r in results:
            value = r.values.get(key)
            cell = "—" if value is None else fmt.format(value)
            if key in r.cpu:
                cell += f" ({r.cpu[key]:.0%} / {r.generator_cpu[key]:.0%})"
            cells.append(cell)
        lines.append(f"| {label.format(window=args.window, storm=f'{args.storm:,}')} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def ratios(results: list[Result]) -> list[str]:
    by = {r.broker: r.values for r in results}
    ours = by.get("pairmq")
    out = []
    if not ours:
        return out
    for other in ("mosquitto", "mosquitto-persist", "amqtt"):
        theirs = by.get(other)
        if not theirs:
            continue
        parts = [f"{label} {ours[k] / theirs[k]:.2f}×" for k, label in zip(THROUGHPUT, THROUGHPUT_LABELS)
                 if theirs.get(k) and k in ours]
        if ours.get("lat_p50_ms") and theirs.get("lat_p50_ms"):
            parts += [f"QoS 1 latency p50 {ours['lat_p50_ms'] / theirs['lat_p50_ms']:.2f}× (lower is better)"]
        out.append(f"PairMQ/{other}: " + ", ".join(parts))
    return out


def goals(results: list[Result], storm_n: int) -> list[str]:
    by = {r.broker: r.values for r in results}
    ours = by.get("pairmq")
    if not ours:
        return ["PairMQ not measured: no goal can be judged"]
    mosq = [by[m] for m in ("mosquitto", "mosquitto-persist") if m in by]
    out = []

    def verdict(ok: bool) -> str:
        return "**met**" if ok else "**missed**"

    if mosq:
        for key, label, goal in (("qos0_1to1", "QoS 0 1→1", GOALS["qos0"]),
                                 ("qos0_4to1", "QoS 0 4→1", GOALS["qos0"]),
                                 ("qos1", "durable QoS 1", GOALS["qos1"])):
            if key not in ours:
                continue
            ref = max(m[key] for m in mosq)  # the faster mosquitto run: the stricter reference
            out.append(f"{label} ≥ {goal}× mosquitto (the faster of its two runs, {ref:,.0f} msg/s): "
                       f"{ours[key] / ref:.2f}× — {verdict(ours[key] >= goal * ref)}")
    else:
        out.append("mosquitto not measured: the QoS 0 and QoS 1 goals cannot be judged")
    if "amqtt" in by:
        for key, label in zip(THROUGHPUT, THROUGHPUT_LABELS):
            if key not in ours:
                continue
            ref = by["amqtt"][key]
            ok = ref > 0 and ours[key] >= GOALS["amqtt"] * ref
            out.append(f"{label} ≥ {GOALS['amqtt']:.0f}× amqtt ({ref:,.0f} msg/s): "
                       f"{(ours[key] / ref) if ref else float('inf'):.2f}× — {verdict(ok)}")
    else:
        out.append("amqtt not measured: the ≥ 10× amqtt goal cannot be judged")
    if "storm_max_connack_s" not in ours:
        return out
    max_s = ours["storm_max_connack_s"]
    ok = ours["storm_refused"] == 0 and ours["storm_accepted"] == storm_n and max_s <= GOALS["storm_connack_s"]
    out.append(f"{storm_n:,}-client storm, no refusals and every CONNACK within {GOALS['storm_connack_s']:.0f} s: "
               f"{ours['storm_refused']} refused, max {max_s:.2f} s — {verdict(ok)}")
    rss = ours["storm_rss_per_conn_kib"]
    out.append(f"≤ {GOALS['rss_kib']:.0f} KiB RSS per idle connection: {rss:.1f} KiB — "
               f"{verdict(rss <= GOALS['rss_kib'])}")
    return out


def fsync_ms(directory: Path, samples: int = 50) -> float:
    """p50 of one 4 KiB write + fsync in `directory`: what a durable commit costs at least on this disk."""
    path = directory / "fsync-probe"
    times = []
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for _ in range(samples):
            t0 = time.perf_counter()
            os.write(fd, bytes(4096))
            os.fsync(fd)
            times.append((time.perf_counter() - t0) * 1000)
    finally:
        os.close(fd)
        path.unlink()
    return statistics.median(times)


def machine() -> str:
    cpu = "unknown CPU"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem = ""
    with contextlib.suppress(OSError, ValueError):
        kib = int(Path("/proc/meminfo").read_text().split()[1])
        mem = f", {kib / 1024 / 1024:.0f} GiB RAM"
    return f"nproc {os.cpu_count()} ({cpu}){mem}, Linux {platform.release()}, Python {platform.python_version()}"


def section(results: list[Result], skipped: dict[str, str], args, versions: dict[str, str], started: str) -> str:
    command = "cd /work/main && .venv/bin/python bench/throughput.py " + " ".join(args.argv)
    lines = [DOC_BEGIN, "## Throughput (bench/throughput.py)", "", "```", command.strip(), "```", "",
             f"- Date: {started}", f"- Machine: {machine()}",
             f"- Disk: the brokers' data under {tempfile.gettempdir()} ({args.fs}); one 4 KiB write + fsync there: "
             f"p50 {args.fsync_ms:.2f} ms",
             "- Brokers: " + ", ".join(f"{k} {v}" for k, v in versions.items()),
             f"- Method: one load generator for every broker (a raw MQTT 3.1.1 asyncio client in the bench, "
             f"{'uvloop' if args.uvloop else 'asyncio'}), on the same machine as the broker; {args.payload}-byte "
             f"payloads; {args.duration_s:g} s measured after {WARMUP_S} s warm-up. PairMQ: a local group's active "
             "primary, every QoS 1 PUBACK after its spool's group commit (SQLite WAL, synchronous=FULL). mosquitto "
             "with persistence on keeps messages in memory and writes a snapshot every autosave_interval (1800 s) "
             "and at exit: not per-message durability. Both mosquitto runs: max_inflight_messages 32 (PairMQ's "
             "window towards 3.1.1 clients), no queue limit. amqtt: its logging plugins off. QoS 1 and latency use a "
             "persistent (clean session off) QoS 1 subscriber; msg/s are counted at the subscriber. "
             "(a% / b%) after a number: CPU of the broker process / of the load generator during the measured window "
             f"(100% = one core of {os.cpu_count()}; PairMQ: the primary node only, its backup and monitor also run). "
             "Storm: all connects issued at once from one process; RSS per idle connection = VmRSS delta of the "
             "broker process / connections that got CONNACK 0 and are still open.",
             ""]
    for name, why in skipped.items():
        lines.append(f"- {name}: not measured: {why}")
    if skipped:
        lines.append("")
    lines += [table(results, args), ""]
    lines += [f"- {r}" for r in ratios(results)]
    lines += ["", "Goals (issue):", ""] + [f"- {g}" for g in goals(results, args.storm)]
    notes = [f"{r.broker}: {n}" for r in results for n in r.notes]
    if notes:
        lines += ["", "Notes:", ""] + [f"- {n}" for n in notes]
    lines += ["", DOC_END]
    return "\n".join(lines)


def write_docs(text: str) -> Path:
    path = REPO / "docs" / "benchmarks.md"
    old = path.read_text() if path.exists() else "# Benchmarks\n"
    if DOC_BEGIN in old and DOC_END in old:
        head, rest = old.split(DOC_BEGIN, 1)
        new = head + text + rest.split(DOC_END, 1)[1]
    else:
        new = old.rstrip("\n") + "\n\n" + text + "\n"
    path.write_text(new)
    return path


# --- main --------------------------------------------------------------------------------


def git_state() -> str:
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "appliance"],
                           capture_output=True, text=True, cwd=REPO)
    if head.returncode != 0:
        return "this tree (not a git checkout)"
    return f"commit {head.stdout.strip()}" + (" with uncommitted changes in appliance/" if dirty.stdout.strip() else "")


def raise_fd_limit(needed: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = needed if hard == resource.RLIM_INFINITY else min(hard, needed)
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft < needed:
        log(f"warning: open files limit {soft} (hard {hard}) is below the {needed} the storm needs")


def _on_signal(signum, frame):
    raise KeyboardInterrupt  # outside the event loop: unwinds the context managers, stopping every broker


def install_signal_handlers() -> None:
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _on_signal)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration-s", type=float, default=5.0, help="measured seconds per throughput test")
    parser.add_argument("--storm", type=int, default=10_000, help="clients in the connection storm")
    parser.add_argument("--window", type=int, default=100, help="QoS 1 publisher's unacknowledged window")
    parser.add_argument("--payload", type=int, default=100, help="payload bytes")
    parser.add_argument("--brokers", default="pairmq,mosquitto,mosquitto-persist,amqtt")
    parser.add_argument("--amqtt-venv", type=Path, default=Path("/tmp/amqtt-venv"))
    parser.add_argument("--write-docs", action="store_true", help="write the section in docs/benchmarks.md")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (broker logs)")
    parser.add_argument("--tests", default=",".join(TESTS), help=f"which tests, of {','.join(TESTS)}")
    args = parser.parse_args(argv)
    args.test_set = set(args.tests.split(","))
    if not args.test_set <= set(TESTS):
        parser.error(f"unknown test(s) {', '.join(sorted(args.test_set - set(TESTS)))}; known: {', '.join(TESTS)}")
    args.argv = argv
    install_signal_handlers()
    raise_fd_limit(args.storm + 1024)  # brokers started from here inherit it too
    try:
        import uvloop
        runner, args.uvloop = uvloop.run, True
    except ImportError:
        runner, args.uvloop = asyncio.run, False
    started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    workdir = Path(tempfile.mkdtemp(prefix="pairmq-throughput-"))
    log(f"work directory: {workdir}")
    args.fsync_ms = fsync_ms(workdir)
    out = subprocess.run(["findmnt", "-n", "-o", "FSTYPE,SOURCE", "-T", str(workdir)], capture_output=True, text=True)
    args.fs = " on ".join(out.stdout.split()) or "file system unknown"
    versions: dict[str, str] = {"PairMQ": git_state()}
    out = subprocess.run([MOSQUITTO, "-h"], capture_output=True, text=True)
    versions["mosquitto"] = (out.stdout or out.stderr).splitlines()[0].replace("mosquitto version ", "")
    results: list[Result] = []
    skipped: dict[str, str] = {}
    try:
        for name in args.brokers.split(","):
            log(f"{name}:")
            try:
                if name == "amqtt":
                    versions["amqtt"] = install_amqtt(args.amqtt_venv)
                # Every broker runs while we hold the loopback groups' lock (PairMQ's Group takes it itself): the
                # other tests that run whole groups then wait, and the comparison has the CPUs to itself.
                with contextlib.ExitStack() as stack:
                    if name == "pairmq":
                        target = stack.enter_context(run_pairmq(workdir))
                    else:
                        stack.enter_context(fixed_ports())
                        if name in ("mosquitto", "mosquitto-persist"):
                            target = stack.enter_context(run_mosquitto(workdir, persist=name == "mosquitto-persist"))
                        elif name == "amqtt":
                            target = stack.enter_context(run_amqtt(workdir, args.amqtt_venv))
                        else:
                            raise SystemExit(f"unknown broker {name!r}")
                    results.append(runner(cancellable(bench_target(target, args))))
            except (RuntimeError, OSError, asyncio.TimeoutError, ConnectionError) as exc:
                skipped[name] = f"{type(exc).__name__}: {exc}"
                log(f"  {name}: not measured: {skipped[name]}")
    except (KeyboardInterrupt, asyncio.CancelledError):
        log("interrupted: every broker this run started is stopped")
        return 130
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    print(table(results, args))
    for line in ratios(results) + [""] + goals(results, args.storm):
        print(line)
    for name, why in skipped.items():
        print(f"{name}: not measured: {why}")
    if args.write_docs:
        path = write_docs(section(results, skipped, args, versions, started))
        log(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

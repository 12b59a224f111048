"""Throughput benchmark: PairMQ against mosquitto and amqtt, one load generator, one run.

    python bench/throughput.py [--tests qos0,qos1,latency,storm] [--brokers pairmq,mosquitto,...]
                               [--duration-s 5] [--storm 10000] [--write-docs]
    PAIRMQ_PROFILE_DIR=/tmp/prof python bench/throughput.py ...   (cProfile of the PairMQ primary's main thread)

Modules: bench/brokers.py starts and measures the brokers, bench/mqttload.py
is the load client (its packets come from tests/harness/mqttraw.py, the tests' raw
client), bench/report.py writes the table and the docs section; this file
holds the tests and main.

Theory of operation
-------------------
Brokers, each started by this script and stopped after its turn:
  pairmq             a local group (tests/harness/group.py: real node processes on
                     127.0.0.1/.2/.3, the fixed ports, under their lock); the
                     load goes to the active primary, which acknowledges QoS 1
                     only after its spool's group commit (one write + fdatasync of a segment).
  pairmq-acl         the same with an ACL of 50 rules, the one that grants
                     the benchmark's topics last (bench/brokers.py): what
                     checking every PUBLISH and every delivery costs, compared
                     with `pairmq` in the same run.
  mosquitto          Debian's /usr/sbin/mosquitto on 127.0.0.1 and a free port,
                     persistence off.
  mosquitto-persist  the same with persistence on: an in-memory broker that
                     writes a snapshot every autosave_interval (1800 s) and at
                     exit. That is not per-message durability.
  amqtt              pip-installed into a throwaway venv (--amqtt-venv) at
                     bench time, its packet/event logging plugins off.
Both mosquitto runs get max_inflight_messages 32 (PairMQ's window towards a
3.1.1 client) and no queue limit (mosquitto's default 1,000 drops QoS 1).

The load generator (bench/mqttload.py) is a raw MQTT 3.1.1 client on asyncio (uvloop
when installed) Protocols, pre-encoded packets, pipelined writes, one PUBACK
write per read. Every broker gets exactly the same generator. Tests:
  qos0 1->1, 4->1    publishers write 100-byte QoS 0 PUBLISHes as fast as TCP
                     takes them; msg/s counted at one subscriber over the
                     measured window (after a 0.5 s warm-up)
  qos1 1->1          one publisher keeps --window QoS 1 PUBLISHes unacknowledged;
                     one persistent (clean session off) QoS 1 subscriber
  latency            window 1: publish -> PUBACK, p50/p99; a persistent QoS 1
                     subscriber is present so the message is really stored
  ws                 qos0 1->1 and qos1 again through the broker's WebSockets
                     listener (PairMQ's 8083; mosquitto's `listener` with
                     `protocol websockets`), the generator's writes framed
                     as masked binary WebSocket frames (bench/mqttload.py)
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
import datetime
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import contextlib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.brokers import (  # noqa: E402
    MOSQUITTO, Measure, Target, install_amqtt, log, rss_kib, run_amqtt, run_mosquitto, run_pairmq, wait_quiet,
)
from bench.mqttload import CONNECT_TIMEOUT_S, Client, close_all, connect, subscriber  # noqa: E402
from bench.report import (  # noqa: E402
    WARMUP_S, Result, fsync_ms, goals, ratios, section, table, write_docs,
)
from tests.harness.group import fixed_ports  # noqa: E402
from tests.harness.mqttraw import Qos1Encoder, connect_packet, publish_qos0  # noqa: E402

TESTS = ("qos0", "qos1", "latency", "storm", "ws")


async def qos0(target: Target, publishers: int, duration_s: float, payload: bytes, tag: str, ws: bool = False):
    port = target.ws_port if ws else target.port
    sub = await subscriber(target.host, port, f"bench-{tag}-sub", f"bench/{tag}/#", 0, clean=True, ws=ws)
    pubs = [await connect(target.host, port, f"bench-{tag}-pub{i}", ws=ws) for i in range(publishers)]
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


async def qos1(target: Target, window: int, duration_s: float, payload: bytes, ws: bool = False):
    """(msg/s at the subscriber, PUBACKs/s at the publisher, Measure)."""
    port, tag = (target.ws_port, "ws-q1") if ws else (target.port, "q1")
    sub = await subscriber(target.host, port, f"bench-{tag}-sub", f"bench/{tag}", 1, clean=False, ws=ws)
    pub = await connect(target.host, port, f"bench-{tag}-pub", ws=ws)
    enc = Qos1Encoder(f"bench/{tag}", payload)
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
        if c.transport.is_closing():  # shed by the broker before our CONNECT (uvloop raises on writing then)
            refused["error"] += 1
            return
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
    if "ws" in tests:
        await websockets_test(target, args, payload, result)
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


async def websockets_test(target: Target, args, payload: bytes, result: Result) -> None:
    """QoS 0 1->1 and durable QoS 1 through the broker's WebSockets listener (the same generator, framed)."""
    if target.ws_port is None:
        result.notes.append("no WebSockets listener: ws tests not run")
        return
    v = result.values
    await wait_quiet(target)
    rate, m, sent = await qos0(target, 1, args.duration_s, payload, "ws_qos0", ws=True)
    v["ws_qos0_1to1"] = rate
    result.measured("ws_qos0_1to1", m)
    log(f"  {target.name} WebSockets qos0 1->1: {rate:,.0f} msg/s at the subscriber ({sent:,} sent), "
        f"broker CPU {m.cpu:.0%}, generator CPU {m.generator_cpu:.0%}")
    await wait_quiet(target)
    v["ws_qos1"], _, m = await qos1(target, args.window, args.duration_s, payload, ws=True)
    result.measured("ws_qos1", m)
    log(f"  {target.name} WebSockets qos1 window {args.window}: {v['ws_qos1']:,.0f} msg/s at the subscriber, "
        f"broker CPU {m.cpu:.0%}, generator CPU {m.generator_cpu:.0%}")


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
                    if name in ("pairmq", "pairmq-acl"):
                        target = stack.enter_context(run_pairmq(workdir, acl=name == "pairmq-acl"))
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

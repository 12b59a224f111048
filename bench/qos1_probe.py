"""Where a durable QoS 1 message's time goes: bench/throughput.py's QoS 1 test on a local group, watched.

    python bench/qos1_probe.py [--duration-s 6] [--window 100]
    PAIRMQ_MESSAGE_EVENTS=0 python bench/qos1_probe.py   (per-message event logging off, as in bench/brokers.py)
    python bench/qos1_probe.py --against .venv-pure/bin/python [--rounds 3]   (compiled vs pure: bench/builds.py)

Prints, once a second during the load, each routing node's spool writer as its management API shows it
(`/api/v1/message-spool`: submissions, commits, ops per commit, the last commit's ms, submissions of
held-back ops alone) and the primary's inbound window and loop lag; then msg/s, each process's CPU per
message, and each thread's (from /proc/<pid>/task/<tid>/stat: `main` is the event loop; the others are
the spool writer, the event log writer and the heartbeat thread; py-spy dump names them). Each process's CPU
per message is also given net of what it spends idle (heartbeats, timers: measured over `--idle-s` before the
load, per second, times the run's length): on a loaded machine the rate, and with it the share of those
per-second costs in each message, moves from run to run, and the net figure moves much less. Not a goal
measurement (bench/throughput.py is): a tool for finding what to make faster. The machine may be shared:
the load average is printed with the numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from pairmq.appliance.eventlog import EventSettings  # noqa: E402
from pairmq.appliance.roles import Role  # noqa: E402
from bench.brokers import Target, cpu_s  # noqa: E402
from bench.throughput import qos1  # noqa: E402
from tests.harness.group import active_group  # noqa: E402

ROUTING = (Role.PRIMARY, Role.BACKUP)
TICKS_S = os.sysconf("SC_CLK_TCK")


def thread_cpu_s(pid: int) -> dict[str, float]:
    """CPU seconds (user + system) of each thread of `pid`, by "main" or its thread id."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except OSError:
            continue  # the thread ended meanwhile
        fields = stat.rpartition(")")[2].split()
        out["main" if int(tid) == pid else f"thread {tid}"] = (int(fields[11]) + int(fields[12])) / TICKS_S
    return out


def watch(group, stop: threading.Event) -> None:
    before: dict[Role, dict] = {}
    while not stop.wait(1.0):
        line = []
        for role in ROUTING:
            try:
                w = group.api(role, "/api/v1/message-spool")["writer"]
            except Exception as exc:  # noqa: BLE001 - a probe: say so and go on
                line.append(f"{role.value}: ? ({exc})")
                continue
            p = before.get(role, w)
            before[role] = w
            commits, ops = w["commits"] - p["commits"], w["ops"] - p["ops"]
            line.append(f"{role.value}: {w['submissions'] - p['submissions']} submissions/s "
                        f"({w['deferred_submissions'] - p['deferred_submissions']} of held-back ops alone), "
                        f"{commits} commits/s, {ops / max(commits, 1):.0f} ops/commit, last {w['last_commit_ms']} ms")
        try:
            mqtt = group.api(Role.PRIMARY, "/api/v1/redundancy")["mqtt"]
            line.append(f"window {mqtt['window']}, loop lag {mqtt['loop_lag_ms']} ms")
        except Exception as exc:  # noqa: BLE001
            line.append(f"? ({exc})")
        print(" | ".join(line), flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration-s", type=float, default=6.0)
    parser.add_argument("--window", type=int, default=100)
    parser.add_argument("--payload", type=int, default=100)
    parser.add_argument("--against", metavar="PYTHON", help="alternate runs under this interpreter (bench/builds.py)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--idle-s", type=float, default=3.0, help="how long the idle group is measured first")
    args = parser.parse_args(argv)
    if args.against:
        from bench.builds import compare
        compare(__file__, ["--duration-s", str(args.duration_s), "--window", str(args.window),
                           "--payload", str(args.payload), "--idle-s", str(args.idle_s)], args.against, args.rounds,
                {"msg/s": r"([\d,]+) msg/s at the subscriber", "primary µs/msg": r"primary: ([\d.]+) µs CPU",
                 "backup µs/msg": r"backup: ([\d.]+) µs CPU",
                 "primary loop µs/msg": r"primary threads:.*?\bmain ([\d.]+) µs",
                 "primary net of idle µs/msg": r"primary: [\d.]+ µs CPU per message \(([-\d.]+) net",
                 "backup net of idle µs/msg": r"backup: [\d.]+ µs CPU per message \(([-\d.]+) net"})
        return 0
    if args.duration_s <= 0 or args.window < 1 or args.payload < 0 or args.idle_s < 0:
        parser.error("--duration-s must be positive, --window at least 1, --payload and --idle-s not negative")
    work = Path(tempfile.mkdtemp(prefix="pairmq-qos1-probe-"))
    events = EventSettings(message_events=os.environ.get("PAIRMQ_MESSAGE_EVENTS", "1") != "0")
    with active_group(work / "pairmq", timeout_s=30, events=events) as g:
        target = Target("pairmq", g.address(Role.PRIMARY), g.config.ports.mqtt, g.pid(Role.PRIMARY))
        stop = threading.Event()
        watcher = threading.Thread(target=watch, args=(g, stop), daemon=True)
        time.sleep(1.0)  # past the start-up's own work (first links, first checkpoints)
        idle0, idle_started = {r: cpu_s(g.pid(r)) for r in Role}, time.monotonic()
        time.sleep(args.idle_s)
        idle_rate = {r: (cpu_s(g.pid(r)) - idle0[r]) / (time.monotonic() - idle_started) for r in Role}
        process0 = {r: cpu_s(g.pid(r)) for r in Role}
        threads0 = {r: thread_cpu_s(g.pid(r)) for r in ROUTING}
        started = time.monotonic()
        watcher.start()
        rate, acks, m = asyncio.run(qos1(target, args.window, args.duration_s, b"x" * args.payload))
        stop.set()
        # The CPU spent over the whole run (connects and warm-up too) per message measured: a slight overestimate.
        elapsed = time.monotonic() - started
        messages = rate * elapsed
        print(f"{rate:,.0f} msg/s at the subscriber, {acks:,.0f} PUBACKs/s; primary CPU {m.cpu:.0%}, other processes "
              f"{m.other_cpu:.0%} during the measurement; load average {os.getloadavg()[0]:.2f}"
              + ("" if events.message_events else "; per-message events OFF"))
        for role in Role:
            spent = cpu_s(g.pid(role)) - process0[role]
            print(f"{role.value}: {spent * 1e6 / messages:.1f} µs CPU per message "
                  f"({(spent - idle_rate[role] * elapsed) * 1e6 / messages:.1f} net of idle, "
                  f"{idle_rate[role] * 1000:.0f} ms/s idle)")
        for role in ROUTING:
            threads = thread_cpu_s(g.pid(role))
            per = {name: (s - threads0[role].get(name, 0.0)) * 1e6 / messages for name, s in threads.items()}
            print(f"  {role.value} threads: " + ", ".join(f"{name} {us:.1f} µs" for name, us in
                                                      sorted(per.items(), key=lambda kv: -kv[1]) if us >= 0.5))
    return 0


if __name__ == "__main__":
    sys.exit(main())

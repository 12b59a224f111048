"""Storm vs. lease: does a connection storm against the active cost it its activity?

    python bench/storm_lease.py [--runs 10] [--clients 10000]
    python bench/storm_lease.py --one HOST --pid PID [--clients N]   (one storm, JSON on stdout)

Each run starts a fresh local group (tests/harness/group.py: real node processes on
127.0.0.1/.2/.3 under the fixed ports' lock), waits until the primary serves
and the backup reports in sync, then opens N raw MQTT 3.1.1 connections to
the primary at once (bench/throughput.py's storm client) and waits a few
leases more. A run counts a **false failover** when, from the nodes' own event
logs, the backup took activity or the primary stepped down. It also reports
what the storm did to the primary's event loop: the `broker_loop_lag` events
the heartbeat thread writes (the longest time the loop did not stamp its
liveness, and the heartbeat timer's worst lateness meanwhile), when the node
writes them (older builds do not).

`--one` is the helper the storm test runs in its own process.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from pairmq.appliance.roles import Role  # noqa: E402
from tests.harness.group import Group  # noqa: E402
from throughput import Target, raise_fd_limit, storm  # noqa: E402

P, B = Role.PRIMARY, Role.BACKUP
AFTER_STORM_S = 3.0  # a takeover needs lease + margin (0.6 s) after the last claim; wait well past it


def one_storm(host: str, pid: int, clients: int) -> dict:
    raise_fd_limit(clients + 1024)
    try:
        import uvloop
        runner = uvloop.run
    except ImportError:
        runner = asyncio.run
    return runner(storm(Target("pairmq", host, 1883, pid), clients))


def settled(group: Group) -> None:
    group.wait_for("the primary to accept a CONNECT", lambda: group.probe_once()[P] == 0, timeout_s=30)
    group.wait_for("the backup to report in sync",
                   lambda: any(d["reason"].startswith("backup: in sync with") for d in group.decisions(B, "sync")),
                   timeout_s=15)
    time.sleep(1.0)


def run_once(directory: Path, clients: int) -> dict:
    with Group(directory) as group:
        group.start()
        settled(group)
        started = time.monotonic_ns() // 1_000_000
        result = one_storm(group.address(P), group.pid(P), clients)
        time.sleep(AFTER_STORM_S)
        takeovers = [d["reason"] for d in group.decisions(B, "activate")]
        step_downs = [d["reason"] for d in group.decisions(P, "step_down")]
        lags = [e for e in group.events(P) if e["event"] == "broker_loop_lag" and e["mono_ms"] >= started]
        return {"false_failover": bool(takeovers or step_downs), "takeovers": takeovers, "step_downs": step_downs,
                "accepted": result["accepted"], "refusals": result["refusals"], "total_s": result["total_s"],
                "max_connack_s": result["max_connack_s"],
                "max_loop_lag_ms": max((e["max_ms"] for e in lags), default=None),
                "max_timer_late_ms": max((e["max_timer_late_ms"] for e in lags), default=None)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--clients", type=int, default=10_000)
    parser.add_argument("--one", metavar="HOST", help="run one storm against HOST:1883 and print JSON")
    parser.add_argument("--pid", type=int, help="with --one: the node's pid (the storm waits for it to go quiet)")
    args = parser.parse_args(argv)
    if args.clients < 1 or args.runs < 1:
        parser.error("--runs and --clients must be positive")
    if args.one:
        if args.pid is None:
            parser.error("--one needs --pid")
        result = one_storm(args.one, args.pid, args.clients)
        print(json.dumps({k: result[k] for k in ("total_s", "accepted", "refused", "refusals", "max_connack_s")}))
        return 0
    raise_fd_limit(args.clients + 1024)  # the nodes inherit it
    false = 0
    with tempfile.TemporaryDirectory(prefix="pairmq-storm-") as work:
        for i in range(args.runs):
            r = run_once(Path(work) / f"run{i}", args.clients)
            false += r["false_failover"]
            lag = "-" if r["max_loop_lag_ms"] is None else f"{r['max_loop_lag_ms']} ms"
            late = "-" if r["max_timer_late_ms"] is None else f"{r['max_timer_late_ms']} ms"
            print(f"run {i + 1}: {'FALSE FAILOVER' if r['false_failover'] else 'ok'}; "
                  f"{r['accepted']} CONNACK 0 in {r['total_s']:.2f} s (max {r['max_connack_s']:.2f} s), "
                  f"refusals {r['refusals']}; loop lag max {lag}, heartbeat timer late max {late}"
                  + "".join(f"\n    {why}" for why in r["step_downs"] + r["takeovers"]), flush=True)
    print(f"{false} false failover(s) in {args.runs} storms of {args.clients:,} clients")
    return 0


if __name__ == "__main__":
    sys.exit(main())

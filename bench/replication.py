"""Replication benchmark: what the mate link costs, against a single node and a NATS JetStream R3 cluster.

    python bench/replication.py [--targets pairmq-group,pairmq-single,nats-r3] [--tests qos1,latency,resync]
                                [--duration-s 5] [--resync-messages 1000000] [--write-docs]

Modules: the load generator and the QoS 1 / latency tests are bench/throughput.py's (bench/mqttload.py's
raw MQTT 3.1.1 client), the broker starters bench/brokers.py's and bench/nats.py's, the resync
measurement bench/resync.py's, the table and the docs section bench/report.py's.

Theory of operation
-------------------
Targets, each started by this script and stopped after its turn, one at a time, each under the
fixed loopback ports' lock (tests/harness/group.py), so no other group shares the CPUs meanwhile:
  pairmq-group   a local group (primary, backup, monitor on 127.0.0.1/.2/.3): the primary releases a
                 PUBACK only after its own group commit AND the backup's acknowledgement of the op
                 (replicated). This is what bench/throughput.py measures as "pairmq".
  pairmq-single  the same group with the backup killed (after it synced: a primary does not take
                 activity alone at start-up): the primary acknowledges on local durability alone
                 (its mate is out of sync and its in-sync lease has ended).
  nats-r3        three nats-servers with JetStream and MQTT, `mqtt { stream_replicas: 3 }`;
                 R3 checked on /jsz after the load (bench/nats.py).
Tests:
  qos1      durable QoS 1 1->1, the publisher keeps --window PUBLISHes unacknowledged, one persistent
            QoS 1 subscriber; msg/s at the subscriber and PUBACKs/s at the publisher
  latency   window 1: publish -> PUBACK p50/p99 with a persistent subscriber present
  resync    --resync-messages queued messages of --resync-payload bytes: a backup joining with an
            empty spool (full snapshot) and one that holds the session but none of the messages
            (incremental); see bench/resync.py. PairMQ only.
Load average (1 min) is read before and after every test and reported with its numbers: the
machine may be shared.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from pairmq.appliance.roles import Role  # noqa: E402
from bench import nats, resync  # noqa: E402
from bench.brokers import Target, log, run_pairmq  # noqa: E402
from bench.report import Result, fsync_ms, machine, table, write_docs  # noqa: E402
from bench.throughput import cancellable, git_state, install_signal_handlers, latency_test, qos1_test  # noqa: E402
from bench.resync import view  # noqa: E402
from tests.harness.group import active_group, fixed_ports  # noqa: E402

TARGETS = ("pairmq-group", "pairmq-single", "nats-r3")
TESTS = ("qos1", "latency", "resync")
DOC_BEGIN, DOC_END = "<!-- replication:begin -->", "<!-- replication:end -->"
GOALS = {"vs_single": 0.8, "vs_nats": 10.0, "resync_msg_s": {"incremental": 100_000, "snapshot": 200_000}}
LOCK_ATTEMPTS = 5  # the fixed ports' lock may stay busy longer than its own wait while others run their suites


@contextlib.contextmanager
def run_single(workdir: Path):
    """A group whose backup is not running: the primary serves alone, acknowledging on local durability once
    the backup's in-sync lease has ended. (A primary does not take activity alone at start-up, DESIGN §3 rule 4,
    so the backup starts, syncs, and is killed.)"""
    with active_group(workdir / "pairmq-single", timeout_s=30) as g:
        g.kill(Role.BACKUP)
        g.wait_for("the primary to report its mate out of sync",
                   lambda: (view(g, Role.PRIMARY) or {}).get("redundancy_status") == "Down", timeout_s=30)
        time.sleep(2 * g.config.timers.lease_ms / 1000)  # the backup's in-sync lease has surely ended
        if g.probe_once()[Role.PRIMARY] != 0:
            raise RuntimeError("the primary stopped serving once its backup was killed")
        yield Target("pairmq-single", g.address(Role.PRIMARY), g.config.ports.mqtt, g.pid(Role.PRIMARY))


def load1() -> float:
    return os.getloadavg()[0]


async def bench_target(target: Target, args) -> Result:
    result = Result(target.name)
    payload = bytes(args.payload)
    for name, test in (("qos1", qos1_test), ("latency", latency_test)):
        if name in args.test_set:
            before = load1()
            await test(target, args, payload, result)
            result.values[f"load_{name}"] = (before, load1())
    check = getattr(target, "check", None)
    if check is not None:
        check()  # the NATS streams really are R3, or RuntimeError: the result is not reported as R3
    result.notes += target.notes()
    return result


def run_target(name: str, workdir: Path, args, runner) -> Result:
    for attempt in range(LOCK_ATTEMPTS):
        try:
            with contextlib.ExitStack() as stack:
                if name == "pairmq-group":
                    target = stack.enter_context(run_pairmq(workdir))
                    target.name = name
                elif name == "pairmq-single":
                    target = stack.enter_context(run_single(workdir))
                else:
                    stack.enter_context(fixed_ports())
                    target = stack.enter_context(nats.run_nats_cluster(workdir))
                return runner(cancellable(bench_target(target, args)))
        except AssertionError as exc:  # the lock or the ports stayed busy: others' tests; try again
            if "stayed" not in str(exc) or attempt == LOCK_ATTEMPTS - 1:
                raise RuntimeError(str(exc).splitlines()[0]) from None
            log(f"  {name}: {str(exc).splitlines()[0]}; trying again")
            shutil.rmtree(workdir / name, ignore_errors=True)
            shutil.rmtree(workdir / "pairmq", ignore_errors=True)
            shutil.rmtree(workdir / "nats", ignore_errors=True)
    raise AssertionError("unreachable")


def run_resync(workdir: Path, args) -> list[dict]:
    out = []
    for kind in args.resync_kinds:
        for attempt in range(LOCK_ATTEMPTS):
            before = load1()
            try:
                r = resync.measure(workdir, kind, args.resync_messages, args.resync_payload)
            except AssertionError as exc:
                if "stayed" not in str(exc) or attempt == LOCK_ATTEMPTS - 1:
                    raise
                log(f"  resync {kind}: {str(exc).splitlines()[0]}; trying again")
                shutil.rmtree(workdir / f"resync-{kind}", ignore_errors=True)
                continue
            r["load"] = (before, load1())
            out.append(r)
            shutil.rmtree(workdir / f"resync-{kind}", ignore_errors=True)  # a GiB or two per run
            break
    return out


# --- the report ------------------------------------------------------------------------


def judged(results: list[Result], resyncs: list[dict]) -> list[str]:
    by = {r.broker: r.values for r in results}
    group, single, peer = by.get("pairmq-group", {}), by.get("pairmq-single", {}), by.get("nats-r3", {})
    out = []

    def verdict(ok: bool) -> str:
        return "**met**" if ok else "**missed**"

    if group.get("qos1") and single.get("qos1"):
        x = group["qos1"] / single["qos1"]
        out.append(f"replicated QoS 1 ≥ {GOALS['vs_single']}× single node ({single['qos1']:,.0f} msg/s): "
                   f"{x:.2f}× — {verdict(x >= GOALS['vs_single'])}")
    else:
        out.append("replicated vs single node: not judged (one of them not measured)")
    if group.get("qos1") and peer.get("qos1"):
        x = group["qos1"] / peer["qos1"]
        out.append(f"replicated QoS 1 ≥ {GOALS['vs_nats']:.0f}× NATS JetStream R3 ({peer['qos1']:,.0f} msg/s): "
                   f"{x:.1f}× — {verdict(x >= GOALS['vs_nats'])}")
    else:
        out.append("replicated vs NATS R3: not judged (one of them not measured)")
    for r in resyncs:
        goal = GOALS["resync_msg_s"][r["kind"]]
        out.append(f"resync ({r['kind']}) ≥ {goal:,} msg/s: {r['msg_per_s']:,.0f} msg/s — "
                   f"{verdict(r['msg_per_s'] >= goal)}")
    out.append("planned handover unavailability and kill → first PUBACK: measured by bench/handover.py and "
               "bench/failover.py, not here")
    return out


def resync_table(resyncs: list[dict]) -> str:
    lines = ["| resync | messages | ops | MB | seconds (backup's PLAN → last op durable) | msg/s | MB/s | "
             "group start → redundancy Up (s) | restarts | load avg (1 min) before → after |", "|---|" + "---:|" * 9]
    for r in resyncs:
        lines.append(f"| {r['kind']} | {r['messages']:,} × {r['payload_bytes']} B | {r['ops']:,} | "
                     f"{r['bytes'] / 1e6:,.0f} | {r['seconds']:.2f} | {r['msg_per_s']:,.0f} | {r['mb_per_s']:,.1f} | "
                     f"{r['wall_s']:.2f} | {r['restarts']} | {r['load'][0]:.2f} → {r['load'][1]:.2f} |")
    return "\n".join(lines)


def loads(results: list[Result]) -> list[str]:
    out = []
    for r in results:
        parts = [f"{k.removeprefix('load_')} {v[0]:.2f} → {v[1]:.2f}" for k, v in r.values.items()
                 if k.startswith("load_")]
        if parts:
            out.append(f"{r.broker}: load average (1 min) " + ", ".join(parts))
    return out


def section(results, resyncs, skipped, args, versions, started) -> str:
    command = ".venv/bin/python bench/replication.py " + " ".join(args.argv)
    lines = [DOC_BEGIN, "## Replication (bench/replication.py)", "", "```", command.strip(), "```", "",
             f"- Date: {started}", f"- Machine: {machine()}",
             f"- Disk: {tempfile.gettempdir()} ({args.fs}); one 4 KiB write + fsync: p50 {args.fsync_ms:.2f} ms",
             "- Versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()),
             "- Targets: pairmq-group = a local group, the primary releases each PUBACK after its group commit and "
             "the backup's acknowledgement (replicated; bench/throughput.py's \"pairmq\" is this); pairmq-single = "
             "the same group with the backup killed once in sync, the primary acknowledging on local durability "
             "after the backup's in-sync lease ended; nats-r3 = "
             "three nats-servers, JetStream, MQTT with `stream_replicas: 3` (R3 read back from /jsz). All on one "
             "machine with the load generator (bench/mqttload.py, the same raw MQTT 3.1.1 client for every "
             f"target); {args.payload}-byte payloads; {args.duration_s:g} s measured per test. (a% / b%): CPU of "
             "the target's (first) process / of the load generator.",
             "- Resync: the primary's spool built with the spool writer API (bench/spoolfill.py: the ops a publish "
             "to an offline persistent subscriber writes), not through MQTT; real node processes; the rate is the "
             "backup's own account in its redundancy view (PLAN received → last op durable, snapshot swapped in). "
             f"Resync groups run with lease_ms {resync.TIMERS.lease_ms}, broker_stall_ms "
             f"{resync.TIMERS.broker_stall_ms}: the primary rebuilds its broker core from the million messages on "
             "its event loop when it takes activity (not what is measured here), and with the default 500 ms lease "
             "it lost activity during that rebuild on a busy machine, again and again.",
             ""]
    lines += [f"- {name}: not measured: {why}" for name, why in skipped.items()]
    lines += ["", table(results, args), ""] if results else []
    lines += [resync_table(resyncs), ""] if resyncs else []
    lines += ["Goals:", ""] + [f"- {g}" for g in judged(results, resyncs)]
    notes = loads(results) + [f"{r.broker}: {n}" for r in results for n in r.notes]
    if notes:
        lines += ["", "Notes:", ""] + [f"- {n}" for n in notes]
    lines += ["", DOC_END]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", default=",".join(TARGETS), help=f"of {','.join(TARGETS)}")
    parser.add_argument("--tests", default=",".join(TESTS), help=f"of {','.join(TESTS)}")
    parser.add_argument("--duration-s", type=float, default=5.0, help="measured seconds per throughput test")
    parser.add_argument("--window", type=int, default=100, help="QoS 1 publisher's unacknowledged window")
    parser.add_argument("--payload", type=int, default=100, help="throughput and latency payload bytes")
    parser.add_argument("--resync-messages", type=int, default=1_000_000)
    parser.add_argument("--resync-payload", type=int, default=1024)
    parser.add_argument("--resync-kinds", default=",".join(resync.KINDS), help=f"of {','.join(resync.KINDS)}")
    parser.add_argument("--write-docs", action="store_true", help="write the section in docs/benchmarks.md")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    args = parser.parse_args(argv)
    args.argv, args.storm = argv, 0
    args.test_set = set(args.tests.split(","))
    targets = args.targets.split(",")
    args.resync_kinds = args.resync_kinds.split(",")
    for what, given, known in (("test", args.test_set, TESTS), ("target", targets, TARGETS),
                               ("resync kind", args.resync_kinds, resync.KINDS)):
        if unknown := sorted(set(given) - set(known)):
            parser.error(f"unknown {what}(s) {', '.join(unknown)}; known: {', '.join(known)}")
    if args.resync_messages < 1 or args.resync_payload < 0 or args.duration_s <= 0 or args.window < 1:
        parser.error("--resync-messages and --window must be at least 1, --duration-s positive, "
                     "--resync-payload not negative")
    if "nats-r3" in targets and not Path(nats.NATS_SERVER).exists():
        parser.error(f"{nats.NATS_SERVER} not found: run .ci/setup (it installs Debian's nats-server)")
    install_signal_handlers()
    try:
        import uvloop
        runner = uvloop.run
    except ImportError:
        runner = asyncio.run
    started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    workdir = Path(tempfile.mkdtemp(prefix="pairmq-replication-"))
    log(f"work directory: {workdir}")
    args.fsync_ms = fsync_ms(workdir)
    out = subprocess.run(["findmnt", "-n", "-o", "FSTYPE,SOURCE", "-T", str(workdir)], capture_output=True, text=True)
    args.fs = " on ".join(out.stdout.split()) or "file system unknown"
    versions = {"PairMQ": git_state()}
    if "nats-r3" in targets:
        versions["nats-server"] = nats.version()
    results: list[Result] = []
    resyncs: list[dict] = []
    skipped: dict[str, str] = {}
    try:
        if args.test_set & {"qos1", "latency"}:
            for name in targets:
                log(f"{name}:")
                try:
                    results.append(run_target(name, workdir, args, runner))
                except (RuntimeError, OSError, asyncio.TimeoutError, ConnectionError) as exc:
                    skipped[name] = f"{type(exc).__name__}: {exc}"
                    log(f"  {name}: not measured: {skipped[name]}")
        if "resync" in args.test_set:
            log("resync:")
            try:
                resyncs = run_resync(workdir, args)
            except (RuntimeError, OSError, AssertionError) as exc:
                skipped["resync"] = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
                log(f"  resync: not measured: {skipped['resync']}")
    except (KeyboardInterrupt, asyncio.CancelledError):
        log("interrupted: every process this run started is stopped")
        return 130
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    if results:
        print(table(results, args))
    if resyncs:
        print(resync_table(resyncs))
    for line in [""] + judged(results, resyncs) + loads(results):
        print(line)
    for name, why in skipped.items():
        print(f"{name}: not measured: {why}")
    if args.write_docs:
        path = write_docs(section(results, resyncs, skipped, args, versions, started), DOC_BEGIN, DOC_END)
        log(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

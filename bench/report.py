"""The benchmark's report: the table, ratios, goals, and the section of docs/benchmarks.md."""

from __future__ import annotations

import contextlib
import os
import platform
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOC_BEGIN, DOC_END = "<!-- throughput:begin -->", "<!-- throughput:end -->"
WARMUP_S = 0.5
GENERATOR_CPU_NOTE = 0.8  # above this the generator, not the broker, may be the limit
OTHER_CPU_NOTE = 0.15  # a test during which other processes used more than this of a CPU gets a note
GOALS = {
    "qos0": 0.5,  # x mosquitto
    "qos1": 0.5,  # durable QoS 1, x mosquitto
    "amqtt": 10.0,  # x amqtt, every throughput test
    "storm_connack_s": 2.0,
    "lat_p50_ms": 0.6,  # durable QoS 1 publish→PUBACK at window 1
    "rss_kib": 30.0,
}


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
    ("ws_qos0_1to1", "WebSockets: QoS 0 1→1 (msg/s)", "{:,.0f}"),
    ("ws_qos1", "WebSockets: QoS 1 1→1, window {window} (msg/s at the subscriber)", "{:,.0f}"),
]
THROUGHPUT = ("qos0_1to1", "qos0_4to1", "qos1", "ws_qos0_1to1", "ws_qos1")
THROUGHPUT_LABELS = ("QoS 0 1→1", "QoS 0 4→1", "QoS 1 1→1", "WebSockets QoS 0 1→1", "WebSockets QoS 1 1→1")


def table(results: list[Result], args) -> str:
    names = [r.broker for r in results]
    lines = ["| measure | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    for key, label, fmt in ROWS:
        if all(r.values.get(key) is None for r in results):
            continue  # a test not run (--tests)
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
    acl = by.get("pairmq-acl")
    if acl:
        out.append("PairMQ with a 50-rule ACL / without: " + ", ".join(
            f"{label} {acl[k] / ours[k]:.2f}×" for k, label in zip(THROUGHPUT, THROUGHPUT_LABELS)
            if ours.get(k) and k in acl))
    over_ws = [f"{name} QoS 0 {v['ws_qos0_1to1'] / v['qos0_1to1']:.2f}×, QoS 1 {v['ws_qos1'] / v['qos1']:.2f}×"
               for name, v in by.items() if v.get("ws_qos0_1to1") and v.get("qos0_1to1") and v.get("ws_qos1")
               and v.get("qos1")]
    if over_ws:
        out.append("WebSockets / TCP, each broker against itself: " + "; ".join(over_ws))
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
    if "lat_p50_ms" in ours:
        out.append(f"QoS 1 publish→PUBACK p50 at window 1 ≤ {GOALS['lat_p50_ms']} ms: {ours['lat_p50_ms']:.3f} ms — "
                   f"{verdict(ours['lat_p50_ms'] <= GOALS['lat_p50_ms'])}")
    if "amqtt" in by:
        for key, label in zip(THROUGHPUT, THROUGHPUT_LABELS):
            if key not in ours or key not in by["amqtt"]:  # amqtt has no WebSockets listener here
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
    command = ".venv/bin/python bench/throughput.py " + " ".join(args.argv)
    lines = [DOC_BEGIN, "## Throughput (bench/throughput.py)", "", "```", command.strip(), "```", "",
             f"- Date: {started}", f"- Machine: {machine()}",
             f"- Disk: the brokers' data under {tempfile.gettempdir()} ({args.fs}); one 4 KiB write + fsync there: "
             f"p50 {args.fsync_ms:.2f} ms",
             "- Brokers: " + ", ".join(f"{k} {v}" for k, v in versions.items()),
             f"- Method: one load generator for every broker (a raw MQTT 3.1.1 asyncio client in the bench, "
             f"{'uvloop' if args.uvloop else 'asyncio'}), on the same machine as the broker; {args.payload}-byte "
             f"payloads; {args.duration_s:g} s measured after {WARMUP_S} s warm-up. PairMQ: a local group's active "
             "primary, every QoS 1 PUBACK after its spool's group commit (one write + fdatasync of a spool segment). mosquitto "
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


def write_docs(text: str, begin: str = DOC_BEGIN, end: str = DOC_END) -> Path:
    """Put `text` (which starts with `begin` and ends with `end`) in docs/benchmarks.md, replacing the old one."""
    path = REPO / "docs" / "benchmarks.md"
    old = path.read_text() if path.exists() else "# Benchmarks\n"
    if begin in old and end in old:
        head, rest = old.split(begin, 1)
        new = head + text + rest.split(end, 1)[1]
    else:
        new = old.rstrip("\n") + "\n\n" + text + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(new)
    return path

"""Failover benchmark: kill -9 the active node, time detection and service recovery.

    python bench/failover.py [--trials 20] [--soak-minutes 10] [--write-docs] [--hanging-hooks]

Theory of operation
-------------------
1. Trials. Each trial starts a *fresh* local group (tests/harness/group.py: real node
   processes on 127.0.0.1/.2/.3, the fixed ports, default timers) in its own
   directory, waits until a node accepts an MQTT CONNECT and its mate reports
   being in sync, then SIGKILLs the active node. A client probes the survivor
   with a real MQTT 3.1.1 CONNECT every ~2 ms, before and after the kill.
   Measured, all on CLOCK_MONOTONIC (one machine, so the nodes' `mono_ms`
   and ours line up exactly):
     detection  kill -> the survivor's "bid" decision (`mono_ms` in its event log)
     vote       kill -> the monitor's "vote" decision
     activate   kill -> the survivor's "activate" decision
     connack    kill -> the first CONNACK 0 the probing client receives
   A fresh group per trial keeps trials independent: the active is always the
   primary in epoch 1, and no trial inherits a previous one's state.
2. Soak. One group runs for --soak-minutes while busy-loop processes (default
   3 on this 2-CPU class of machine, i.e. oversubscribed) compete for the CPUs at
   normal priority. Every "activate" decision after the first is a false
   failover. Heartbeat gaps are read off the wire (a passive AF_PACKET capture
   of UDP :8300 on `lo`, kernel timestamps) when the capture can be opened.

The fixed ports are shared with other people's tests: every group we run holds
tests/harness/group.py's lock on the loopback ports, and before it starts we also wait
until nothing listens on UDP :8300 or TCP :1883/:8080. Every group and busy loop
we start is stopped on exit, Ctrl-C and SIGTERM (the busy loops also end by
themselves when the bench dies).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import datetime
import math
import os
import platform
import random
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from pairmq.appliance.clock import now_ms  # noqa: E402
from pairmq.appliance.config import Timers  # noqa: E402
from pairmq.appliance.hooks_settings import HookEvent, HookSettings  # noqa: E402
from pairmq.appliance.roles import Role  # noqa: E402
from bench import report  # noqa: E402
from tests.harness.group import LOOPBACK, Group  # noqa: E402
from tests.harness.probe import connack, one_round  # noqa: E402

P, B, M = Role.PRIMARY, Role.BACKUP, Role.MONITOR
GOAL_P50_MS, GOAL_P99_MS = 800, 1500
REFERENCES_S = {"Solace (documented)": 30.0, "keepalived + mosquitto": 3.5}
PROBE_INTERVAL_S = 0.002
PROBE_BEFORE_KILL_S = 0.1
TRIAL_TIMEOUT_S = 10.0
SETTLE_S = 1.0  # after the mate is in sync, so every node is past its boot hold
BURNER = ("import os\np = os.getppid()\n"  # a busy loop that dies with its parent
          "while os.getppid() == p:\n    for _ in range(1_000_000): pass\n")
SO_TIMESTAMPNS = SCM_TIMESTAMPNS = 35  # Linux; not exported by the socket module
DOC_BEGIN, DOC_END = "<!-- failover:begin -->", "<!-- failover:end -->"


class Interrupted(Exception):
    pass


def _on_signal(signum, frame):
    raise Interrupted(f"signal {signum}")


# --- the shared ports -------------------------------------------------------------


def ports_busy() -> list[str]:
    """Listeners on the shared ports of our loopback addresses (PAIRMQ_TEST_LOOPBACK moves them; another
    developer's group on other addresses is no reason to wait), or of any address."""
    ours = tuple(f"{a}:" for a in LOOPBACK.values()) + ("*:", "0.0.0.0:", "[::]:")
    udp = subprocess.run(["ss", "-lunp"], capture_output=True, text=True).stdout.splitlines()
    tcp = subprocess.run(["ss", "-ltnp"], capture_output=True, text=True).stdout.splitlines()
    return [line for line in udp + tcp if any(f"{a}{port} " in line for a in ours
                                              for port in ((8300,) if line in udp else (1883, 8080)))]


def wait_for_free_ports(limit_s: float) -> None:
    """Wait until nobody listens on the shared ports, then a random moment more and look again.

    Other people's tests wait the same way; the jitter makes two waiters that
    see the ports free at the same poll unlikely to start at the same instant.
    """
    deadline, said = time.monotonic() + limit_s, False
    while True:
        busy = ports_busy()
        if not busy:
            time.sleep(random.uniform(0.05, 0.5))
            if not ports_busy():
                return
            continue
        if time.monotonic() > deadline:
            raise RuntimeError("the shared ports stayed busy for %.0f s:\n%s" % (limit_s, "\n".join(busy)))
        if not said:
            log(f"shared ports busy (someone else's group?), waiting up to {limit_s:.0f} s")
            said = True
        time.sleep(1.0)


def log(text: str) -> None:
    print(text, flush=True)


# --- one group --------------------------------------------------------------------


class LostPortRace(Exception):
    pass


@contextlib.contextmanager
def running_group(directory: Path, port_wait_s: float, attempts: int = 5, hooks: HookSettings = HookSettings()):
    """A running group of ours: one node serving, its mate in sync, all past their boot hold.

    `with Group(...)` holds tests/harness/group.py's shared lock on the loopback ports
    (and waits for stragglers) until the group is stopped; on top of it we also
    wait for `ss` to show the ports free, as people without the lock would.
    """
    deadline = time.monotonic() + port_wait_s
    for attempt in range(1, attempts + 1):
        group = Group(directory / f"attempt-{attempt}", hooks=hooks)
        try:
            group.__enter__()
        except AssertionError as exc:  # the lock or the ports stayed busy for the harness's 2 minutes
            if time.monotonic() > deadline:
                raise RuntimeError(f"the shared ports stayed busy for {port_wait_s:.0f} s: {exc}") from None
            log(f"still waiting for the shared ports: {exc}")
            continue
        try:
            wait_for_free_ports(max(1.0, deadline - time.monotonic()))
            group.start()
            _wait_until_settled(group)
        except LostPortRace as exc:
            group.__exit__(None, None, None)
            log(f"start attempt {attempt}: {exc}; retrying")
            time.sleep(random.uniform(1.0, 3.0))
            continue
        except BaseException:
            group.__exit__(None, None, None)
            raise
        try:
            yield group
        finally:
            group.__exit__(None, None, None)  # stops our nodes, then releases the lock
        return
    raise RuntimeError(f"could not start a group on the shared ports in {attempts} attempts")


def _wait_until_settled(group: Group) -> None:
    def ours_active() -> Role | None:
        _check_alive(group)
        active = group.active()  # from our own event logs, so a foreign node cannot fool us
        return active if active is not None and _probe(group)[active] == 0 else None

    active = group.wait_for("one of our nodes to activate and accept a CONNECT", ours_active, timeout_s=15)
    mate = active.mate()

    def mate_in_sync() -> bool:
        _check_alive(group)
        return any(d["reason"].startswith(f"{mate.value}: in sync with") for d in group.decisions(mate, "sync"))

    group.wait_for(f"{mate.value} to report in sync", mate_in_sync, timeout_s=10)
    time.sleep(SETTLE_S)
    _check_alive(group)


def _check_alive(group: Group) -> None:
    dead = [r.value for r, p in group.procs.items() if p.poll() is not None]
    if dead:
        why = [line for line in group.logs_tail(3).splitlines() if line.startswith("error:")]
        raise LostPortRace(f"node(s) {', '.join(dead)} exited during start-up ({'; '.join(why) or 'see logs'})")


def _probe(group: Group) -> dict[Role, int | None]:
    hosts = [group.address(P), group.address(B)]
    codes = asyncio.run(one_round(hosts, timeout_s=1.0))
    return {P: codes[hosts[0]], B: codes[hosts[1]]}


def _active_by_probe(group: Group) -> Role:
    """The node our own event logs say is active, confirmed by CONNECTs: it accepts, its mate refuses."""
    active = group.active()
    codes = _probe(group)
    if active is None or codes[active] != 0 or codes[active.mate()] != 3:
        raise RuntimeError(f"expected {active and active.value} alone to accept a CONNECT, got {codes}")
    return active


# --- failover trials --------------------------------------------------------------


@dataclass
class Trial:
    number: int
    killed: str
    detection_ms: int | None = None
    vote_ms: int | None = None
    activate_ms: int | None = None
    connack_ms: int | None = None
    bids: int = 0
    unseen_at_bid: str = ""
    early_accepts: int = 0  # CONNACK 0 from the survivor before the kill: an S1 problem
    probes: int = 0
    note: str = ""


async def _race(host: str, kill) -> tuple[int, list[tuple[int, int, int | None]]]:
    """Probe `host` every ~2 ms; kill mid-way; stop at the first CONNACK 0. -> (kill_ms, results)."""
    results: list[tuple[int, int, int | None]] = []
    tasks: set[asyncio.Task] = set()

    async def one() -> None:
        sent = now_ms()
        rc = await connack(host, timeout_s=1.0)
        results.append((sent, now_ms(), rc))

    start = time.monotonic()
    kill_ms = None
    try:
        while time.monotonic() - start < TRIAL_TIMEOUT_S:
            if kill_ms is None and time.monotonic() - start >= PROBE_BEFORE_KILL_S:
                kill_ms = now_ms()
                kill()
            if kill_ms is not None and any(rc == 0 and done >= kill_ms for _, done, rc in results):
                break
            task = asyncio.create_task(one())
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            await asyncio.sleep(PROBE_INTERVAL_S)
    finally:
        for task in list(tasks):
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return kill_ms, results


def run_trial(number: int, directory: Path, port_wait_s: float, hooks: HookSettings = HookSettings()) -> Trial:
    with running_group(directory, port_wait_s, hooks=hooks) as group:
        active = _active_by_probe(group)
        survivor = active.mate()
        victim = group.procs[active]
        kill_ms, results = asyncio.run(_race(group.address(survivor), lambda: os.kill(victim.pid, signal.SIGKILL)))
        victim.wait(5)
        group.procs.pop(active)
        time.sleep(0.05)  # let the survivor's event log line land
        return _trial_from_logs(number, active, survivor, group, kill_ms, results)


def _trial_from_logs(number, active, survivor, group, kill_ms, results) -> Trial:
    trial = Trial(number, active.value, probes=len(results))
    trial.early_accepts = sum(1 for sent, done, rc in results if rc == 0 and done < kill_ms)
    oks = [done for sent, done, rc in results if rc == 0 and done >= kill_ms]
    trial.connack_ms = min(oks) - kill_ms if oks else None
    bids = [d for d in group.decisions(survivor, "bid") if d["mono_ms"] >= kill_ms]
    trial.bids = len(bids)
    if bids:
        trial.detection_ms = bids[0]["mono_ms"] - kill_ms
        found = re.search(r"unseen ([0-9.]+ s)", bids[0]["reason"])
        trial.unseen_at_bid = found.group(1) if found else bids[0]["reason"]
    acts = [d for d in group.decisions(survivor, "activate") if d["mono_ms"] >= kill_ms]
    if acts:
        trial.activate_ms = acts[0]["mono_ms"] - kill_ms
    votes = [d for d in group.decisions(M, "vote") if d["mono_ms"] >= kill_ms]
    if votes:
        trial.vote_ms = votes[0]["mono_ms"] - kill_ms
    odd = [f'{d["node"]} {d["kind"]}: {d["reason"]}' for r in (survivor, M) for d in group.decisions(r)
           if d["mono_ms"] >= kill_ms and d["kind"] in ("refuse", "bid_end", "step_down")]
    trial.note = "; ".join(odd)
    return trial


def run_trials(count: int, workdir: Path, port_wait_s: float, hooks: HookSettings = HookSettings()) -> list[Trial]:
    trials = []
    for n in range(1, count + 1):
        trial = run_trial(n, workdir / f"trial-{n:02d}", port_wait_s, hooks)
        trials.append(trial)
        log(f"trial {n:2d}: killed {trial.killed}; bid +{_ms(trial.detection_ms)}, vote +{_ms(trial.vote_ms)}, "
            f"activate +{_ms(trial.activate_ms)}, CONNACK 0 +{_ms(trial.connack_ms)} "
            f"({trial.probes} probes; survivor's bid said 'unseen {trial.unseen_at_bid}')"
            + (f"  !! {trial.note}" if trial.note else "")
            + (f"  !! survivor accepted {trial.early_accepts} CONNECTs before the kill" if trial.early_accepts else ""))
    return trials


def _ms(value: int | None) -> str:
    return "—" if value is None else f"{value} ms"


def nearest_rank(values: list[int], pct: float) -> int:
    ordered = sorted(values)
    return ordered[max(1, math.ceil(pct / 100 * len(ordered))) - 1]


def summarize(trials: list[Trial]) -> dict:
    rows = {}
    for key, label in (("detection_ms", "kill → survivor's bid (detection)"),
                       ("vote_ms", "kill → monitor's vote"),
                       ("activate_ms", "kill → survivor's activation"),
                       ("connack_ms", "kill → first CONNACK 0 (client-visible)")):
        values = [getattr(t, key) for t in trials if getattr(t, key) is not None]
        rows[key] = (label, len(values), *((nearest_rank(values, 50), nearest_rank(values, 99), max(values))
                                           if values else (None, None, None)))
    return rows


# --- soak under CPU saturation --------------------------------------------------------


class WireGaps:
    """Passive capture of heartbeats on `lo`: the largest gap per sender -> receiver, by kernel timestamps."""

    # classic BPF for "ip and udp dst port 8300" on an Ethernet-framed device (lo is one)
    FILTER = [(0x28, 0, 0, 12), (0x15, 0, 8, 0x0800), (0x30, 0, 0, 23), (0x15, 0, 6, 17), (0x28, 0, 0, 20),
              (0x45, 4, 0, 0x1FFF), (0xB1, 0, 0, 14), (0x48, 0, 0, 16), (0x15, 0, 1, 8300),
              (0x06, 0, 0, 0x40000), (0x06, 0, 0, 0)]

    def __init__(self, addresses: set[str]) -> None:
        self.addresses = addresses
        self.last: dict[tuple[str, str], float] = {}
        self.gaps: dict[tuple[str, str], list[float]] = {}
        self.error = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        try:
            self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
            self.sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            self._attach_filter()
            self.sock.bind(("lo", 0))
            self.sock.settimeout(0.5)
        except OSError as exc:
            self.sock, self.error = None, f"capture unavailable: {exc}"

    def _attach_filter(self) -> None:
        code = b"".join(struct.pack("HBBI", *ins) for ins in self.FILTER)
        self._filter_buf = ctypes.create_string_buffer(code)
        prog = struct.pack("HL", len(self.FILTER), ctypes.addressof(self._filter_buf))
        self.sock.setsockopt(socket.SOL_SOCKET, 26, prog)  # SO_ATTACH_FILTER

    def start(self) -> None:
        if self.sock is not None:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(2)
        if self.sock is not None:
            self.sock.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data, anc, _, addr = self.sock.recvmsg(2048, 64)
            except socket.timeout:
                continue
            except OSError as exc:
                self.error = f"capture stopped: {exc}"
                return
            if addr[2] == socket.PACKET_OUTGOING or len(data) < 34:
                continue  # lo shows each packet twice; keep the delivered copy
            t = next((struct.unpack("qq", d[:16]) for lvl, typ, d in anc if typ == SCM_TIMESTAMPNS), None)
            stamp = t[0] + t[1] / 1e9 if t else time.time()
            src, dst = socket.inet_ntoa(data[26:30]), socket.inet_ntoa(data[30:34])
            if src in self.addresses and dst in self.addresses:
                flow = (src, dst)
                if flow in self.last:
                    self.gaps.setdefault(flow, []).append((stamp - self.last[flow]) * 1000)
                self.last[flow] = stamp


@dataclass
class Soak:
    minutes: float
    burners: int
    activations: list[dict] = field(default_factory=list)
    step_downs: list[dict] = field(default_factory=list)
    other: list[dict] = field(default_factory=list)  # bids, refusals, sync changes after start-up
    rounds: int = 0
    rounds_nobody: int = 0
    rounds_two: int = 0
    max_gap: dict[str, float] = field(default_factory=dict)
    gap_p999: dict[str, float] = field(default_factory=dict)
    heartbeats: int = 0
    capture_note: str = ""
    load: str = ""

    @property
    def false_failovers(self) -> int:
        return max(0, len(self.activations) - 1)


def run_soak(minutes: float, burners: int, directory: Path, port_wait_s: float) -> Soak:
    soak = Soak(minutes, burners)
    with running_group(directory, port_wait_s) as group:
        started_ms = now_ms()
        wire = WireGaps({group.address(r) for r in Role})
        procs: list[subprocess.Popen] = []
        try:
            wire.start()
            for _ in range(burners):
                procs.append(subprocess.Popen([sys.executable, "-c", BURNER]))
            log(f"soak: {burners} busy loops started (pids {', '.join(str(p.pid) for p in procs)}), "
                f"running {minutes:g} min")
            _soak_loop(soak, group, minutes)
            soak.load = "%.2f %.2f %.2f" % os.getloadavg()
        finally:
            for proc in procs:
                proc.kill()
            for proc in procs:
                proc.wait(5)
            wire.stop()
    _soak_from_logs(soak, group, started_ms, wire)
    return soak


def _soak_loop(soak: Soak, group: Group, minutes: float) -> None:
    deadline = time.monotonic() + minutes * 60
    next_report = time.monotonic() + 60
    while time.monotonic() < deadline:
        codes = _probe(group)
        soak.rounds += 1
        accepted = sum(1 for rc in codes.values() if rc == 0)
        soak.rounds_nobody += accepted == 0
        soak.rounds_two += accepted > 1
        if dead := [r.value for r, p in group.procs.items() if p.poll() is not None]:
            raise RuntimeError(f"node(s) died during the soak: {dead}\n{group.logs_tail()}")
        if time.monotonic() >= next_report:
            acts = sum(len(group.decisions(r, "activate")) for r in (P, B))
            log(f"soak: {(deadline - time.monotonic()) / 60:.1f} min left, activations so far {acts}, "
                f"load {os.getloadavg()[0]:.2f}")
            next_report += 60
        time.sleep(1.0)


def _soak_from_logs(soak: Soak, group: Group, started_ms: int, wire: WireGaps) -> None:
    names = {group.address(r): r.value for r in Role}
    for role in Role:
        for d in group.decisions(role):
            if d["kind"] == "activate":
                soak.activations.append(d)
            elif d["kind"] == "step_down":
                soak.step_downs.append(d)
            elif d["mono_ms"] > started_ms and d["kind"] not in ("boot",):
                soak.other.append(d)
    soak.activations.sort(key=lambda d: d["mono_ms"])
    soak.capture_note = wire.error
    for (src, dst), gaps in wire.gaps.items():
        key = f"{names[src]}→{names[dst]}"
        soak.max_gap[key] = max(gaps)
        soak.gap_p999[key] = sorted(gaps)[max(1, math.ceil(0.999 * len(gaps))) - 1]
        soak.heartbeats += len(gaps) + 1


# --- reporting ----------------------------------------------------------------------


def report_text(trials: list[Trial], soak: Soak | None, timers: Timers, rows: dict) -> str:
    lines = ["", "Failover (kill -9 of the active, %d fresh groups)" % len(trials),
             f"{'':44} {'n':>3} {'p50':>8} {'p99':>8} {'max':>8}"]
    for label, n, p50, p99, mx in rows.values():
        lines.append(f"{label:44} {n:>3} {_ms(p50):>8} {_ms(p99):>8} {_ms(mx):>8}")
    lines += ratio_lines(rows), goal_line(trials, rows)
    if soak is not None:
        lines += ["", soak_line(soak)] + [f"  {line}" for line in soak_details(soak)]
    return "\n".join(lines)


def ratio_lines(rows: dict) -> str:
    _, n, p50, p99, _ = rows["connack_ms"]
    if not n:
        return "no trial reached a CONNACK 0: no comparison"
    parts = [f"{name.split()[0]}/PairMQ = {ref:g} s / {p50 / 1000:.3f} s ≈ {ref * 1000 / p50:.1f}x at p50 "
             f"({ref * 1000 / p99:.1f}x at p99)" for name, ref in REFERENCES_S.items()]
    return "Ratios (kill → first CONNACK 0): " + "; ".join(parts)


def goal_line(trials: list[Trial], rows: dict) -> str:
    _, n, p50, p99, _ = rows["connack_ms"]
    failed = len(trials) - n
    ok = n and failed == 0 and p50 <= GOAL_P50_MS and p99 <= GOAL_P99_MS
    return (f"goal p50 ≤ {GOAL_P50_MS} ms, p99 ≤ {GOAL_P99_MS} ms (kill → CONNACK 0): "
            f"{'met' if ok else 'MISSED'}" + (f" ({failed} trial(s) never got a CONNACK 0)" if failed else ""))


def soak_line(soak: Soak) -> str:
    return (f"False-failover soak: {soak.minutes:g} min, {soak.burners} busy loops: "
            f"{soak.false_failovers} false failover(s), {len(soak.step_downs)} step-down(s) (goal: 0)")


def soak_details(soak: Soak) -> list[str]:
    out = [f"availability probes (one CONNECT to each node per ~1 s): {soak.rounds} rounds, "
           f"{soak.rounds_nobody} with nobody serving, {soak.rounds_two} with two serving",
           f"load average at the end: {soak.load}"]
    if soak.max_gap:
        gaps = ", ".join(f"{k} {v:.0f} ms" for k, v in sorted(soak.max_gap.items()))
        p999 = ", ".join(f"{k} {v:.0f} ms" for k, v in sorted(soak.gap_p999.items()))
        out.append(f"max heartbeat gap on the wire ({soak.heartbeats} heartbeats): {gaps}")
        out.append(f"p99.9 heartbeat gap: {p999}")
    else:
        out.append(f"heartbeat gaps not measured ({soak.capture_note or 'no heartbeats captured'})")
    for d in soak.activations[1:] + soak.step_downs:
        out.append(f'{d["node"]} {d["kind"]} at +{d["mono_ms"] - soak.activations[0]["mono_ms"]} ms: {d["reason"]}')
    for d in soak.other[:20]:
        out.append(f'{d["node"]} {d["kind"]}: {d["reason"]}')
    return out


def doc_section(argv: list[str], trials: list[Trial], soak: Soak | None, timers: Timers, rows: dict) -> str:
    cpu = _cpu_model()
    lines = [DOC_BEGIN, "## Failover (bench/failover.py)", "",
             "```", ".venv/bin/python bench/failover.py " + " ".join(argv), "```", "",
             f"- Date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
             f"- Machine: nproc {len(os.sched_getaffinity(0))}{cpu}, "
             f"Linux {platform.release()}, Python {platform.python_version()}",
             f"- Timers (defaults): heartbeat_interval_ms = {timers.heartbeat_interval_ms}, "
             f"lease_ms = {timers.lease_ms}, takeover_margin_ms = {timers.takeover_margin_ms} "
             f"(expected failover ≈ {timers.expected_failover_ms} ms)",
             f"- Method: {len(trials)} trials, each a fresh local group (127.0.0.1/.2/.3, real node processes); "
             f"once the primary accepts a CONNECT and the backup is in sync (+{SETTLE_S:g} s), `kill -9` the active. "
             "Detection = kill → the survivor's `bid` decision (`mono_ms` in its event log, same "
             "CLOCK_MONOTONIC as the bench); recovery = kill → the first CONNACK 0 received by a client sending a "
             f"real MQTT 3.1.1 CONNECT to the survivor every ~{PROBE_INTERVAL_S * 1000:g} ms. "
             "Percentiles are nearest-rank (with 20 trials p99 is the maximum).", "",
             "| measure | n | p50 | p99 | max |", "|---|---:|---:|---:|---:|"]
    for label, n, p50, p99, mx in rows.values():
        lines.append(f"| {label} | {n} | {_ms(p50)} | {_ms(p99)} | {_ms(mx)} |")
    lines += ["", "Reference failover times: Solace (documented) ~30 s, keepalived + mosquitto ~3.5 s.",
              ratio_lines(rows) + ".", "", goal_line(trials, rows) + ".", ""]
    if soak is not None:
        lines += [f"Soak method: one group runs {soak.minutes:g} min while {soak.burners} busy-loop processes "
                  f"(`python -c` loops, nice 0) compete for the {len(os.sched_getaffinity(0))} CPUs; every "
                  "`activate` decision after the group's first is a false failover. Heartbeat gaps are "
                  "inter-arrival times of UDP :8300 datagrams per sender → receiver, captured passively on `lo` "
                  "with kernel timestamps.", "",
                  soak_line(soak) + ".", ""] + [f"- {line}" for line in soak_details(soak)] + [""]
    lines.append(DOC_END)
    return "\n".join(lines)


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f" ({line.split(':', 1)[1].strip()})"
    except OSError:
        pass
    return ""


def write_docs(section: str) -> Path:
    return report.write_docs(section, DOC_BEGIN, DOC_END)


# --- main -------------------------------------------------------------------------------


def hanging_hooks(workdir: Path) -> HookSettings:
    """Hooks that hang for every event: a failover must not wait for any of them (appliance/node/hooks.py)."""
    hang = workdir / "hang.sh"
    hang.write_text("#!/bin/sh\nsleep 600\n")
    hang.chmod(0o755)
    return HookSettings({event: hang for event in HookEvent}, hook_timeout_ms=60_000)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--soak-minutes", type=float, default=10)
    parser.add_argument("--burners", type=int, default=3, help="busy loops during the soak (default 3: oversubscribed)")
    parser.add_argument("--write-docs", action="store_true", help="write the section in docs/benchmarks.md")
    parser.add_argument("--port-wait-s", type=float, default=600, help="how long to wait for the shared ports")
    parser.add_argument("--keep", action="store_true", help="keep the groups' directories (logs, event logs)")
    parser.add_argument("--hanging-hooks", action="store_true",
                        help="every activity hook of every node is a script that never exits (killed at 60 s)")
    args = parser.parse_args(argv)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _on_signal)
    timers = Timers()
    workdir = Path(tempfile.mkdtemp(prefix="pairmq-failover-"))
    log(f"work directory: {workdir}")
    keep = args.keep
    hooks = hanging_hooks(workdir) if args.hanging_hooks else HookSettings()
    try:
        trials = run_trials(args.trials, workdir, args.port_wait_s, hooks) if args.trials > 0 else []
        rows = summarize(trials)
        soak = run_soak(args.soak_minutes, args.burners, workdir / "soak", args.port_wait_s) \
            if args.soak_minutes > 0 else None
        log(report_text(trials, soak, timers, rows))
        missed = "MISSED" in goal_line(trials, rows) or (soak is not None and (soak.false_failovers or soak.step_downs))
        keep = keep or bool(missed)
        if args.write_docs:
            log(f"wrote {write_docs(doc_section(argv, trials, soak, timers, rows))}")
        return 1 if missed else 0
    except (KeyboardInterrupt, Interrupted):
        log("interrupted; groups and busy loops stopped")
        keep = True
        return 130
    finally:
        if keep:
            log(f"logs kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

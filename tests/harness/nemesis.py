"""The nemesis: applies a seeded fault schedule (tests/harness/nemesis_schedule.py) to a real group in namespaces
(docs/reliability.md).

Rules:
1. One run = one seed = a fresh group (tests/harness/group.py) on fresh hosts (tests/harness/netns.py), QoS 1 and QoS 2
   publishers and persistent subscribers (tests/harness/streams.py, in the client host), a prober, and the
   schedule's steps one after another.
2. A step: resolve its symbolic targets against the group as it is now, inject, hold, heal (always, even
   when the fault failed half way), then wait -- bounded by RECOVER_S -- until every node runs, exactly
   one routing node serves, its mate is in sync, both routing nodes see every peer, and a probe CONNECT
   agrees. A timeout is a reported
   failure (`recovery_timeouts`) and ends the schedule; the run is still checked.
3. A node process that exits without the nemesis killing it is a crash: counted, and restarted so the
   run goes on.
4. The routing nodes' data directories are small tmpfs mounts (the full-disk fault fills the active's);
   their event logs are symlinked to the real disk, because a node stops event logging for good after a
   failed write (appliance/eventlog.py) and the checker reads those logs.
5. The prober is tests/harness/probe.py in the client host, every PROBE_MS to both routing nodes, in chunks of
   PROBE_CHUNK_S that overlap by a second. Two CONNACK 0 in one round is a suspect; it is a dual
   acceptance unless the nodes' logs place the two accepts at different instants in rising epochs
   (`unexplained`).
6. After the last step: publishers stop, the offline subscriber resumes, everything settles (as long
   as deliveries keep coming, up to SETTLE_MAX_S), and the checker (tests/harness/streams.py `check`, the event logs, the probes) fills the run's result.
"""

from __future__ import annotations

import collections
import concurrent.futures
import ctypes
import json
import os
import shutil
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from pairmq.appliance.config import load_secret
from pairmq.appliance.keyring import management_token
from pairmq.appliance.roles import Role
from tests.harness.group import Group
from tests.harness.hostlist_stream import HostListStream
from tests.harness.netns import Hosts, cleanup_stale
from tests.harness.nemesis_schedule import Step, schedule
from tests.harness.probe import double_service
from tests.harness.streams import Subscriber, check, longest_gap, settle, streams

P, B, M = Role.PRIMARY, Role.BACKUP, Role.MONITOR
RECOVER_S = 45.0  # a shared 2-core machine restarting a node under load; beyond this it is a failure
DATA_FS_BYTES = 64 * 1024 * 1024
PROBE_MS = 50
PROBE_CHUNK_S = 30.0
PUBLISH_INTERVAL_S = 0.02
HTTP_TIMEOUT_S = 20.0
# At the end the resumed subscriber drains the whole run's backlog, which a heavily loaded machine makes slow
# enough to look like a lost tail: wait while it makes progress; only SETTLE_STALL_S without a single arrival
# ends the wait early.
SETTLE_MAX_S = 600.0
SETTLE_STALL_S = 15.0


class ClientHost:
    """One worker thread inside the client host's network namespace, for HTTP to the nodes."""

    def __init__(self, netns_name: str) -> None:
        self._pool = concurrent.futures.ThreadPoolExecutor(1, initializer=_enter_netns, initargs=(netns_name,))

    def call(self, fn, *args):
        return self._pool.submit(fn, *args).result(timeout=HTTP_TIMEOUT_S + 5)

    def close(self) -> None:
        self._pool.shutdown(wait=False)


def _enter_netns(name: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/run/netns/{name}", os.O_RDONLY)
    try:
        if libc.setns(fd, 0x40000000) != 0:
            raise OSError(ctypes.get_errno(), f"setns into {name} failed")
    finally:
        os.close(fd)


def _http(url: str, token: str | None = None, body: dict | None = None) -> tuple[int, dict]:
    data = None if body is None else json.dumps(body).encode()
    method = "GET" if body is None else "POST"
    request = urllib.request.Request(url, data=data, method=method)
    if token:
        from pairmq.cli.api import signed_headers

        request.add_header("Authorization", signed_headers(token, method, url, data or b"")["Authorization"])
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as exc:
        try:
            return exc.code, json.load(exc)
        except ValueError:
            return exc.code, {}
    except (OSError, ValueError) as exc:
        return 0, {"error": repr(exc)}


def mount_data_fs(group_dir: Path) -> list[Path]:
    """tmpfs data directories for the routing nodes, event logs on the real disk (rule 4)."""
    mounts = []
    for role in (P, B):
        data = group_dir / "data" / role.value
        data.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DATA_FS_BYTES}", f"pmq-nemesis-{role.value}",
                        str(data)], check=True, capture_output=True, text=True)
        mounts.append(data)
        events = group_dir / "events" / role.value
        events.mkdir(parents=True, exist_ok=True)
        (data / "events").symlink_to(events)
    return mounts


def unmount(mounts: list[Path]) -> None:
    for path in mounts:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


class Prober:
    """Rule 5: back-to-back probe chunks until stopped."""

    def __init__(self, group: Group, directory: Path) -> None:
        self.group, self.dir = group, directory
        self.files: list[Path] = []
        self._procs: list[subprocess.Popen] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="prober", daemon=True)

    def start(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            out = self.dir / f"probe-{len(self.files):04d}.jsonl"
            self.files.append(out)
            self._procs.append(self.group.start_sampler(out, PROBE_CHUNK_S, interval_ms=PROBE_MS,
                                                        stop_file=self.dir / "stop"))
            self._stop.wait(PROBE_CHUNK_S - 1.0)

    def stop(self) -> tuple[int, list[str], list[list[dict]]]:
        """(rounds, problems, suspects): every chunk finished and read. A suspect is a round in which both
        routing nodes answered CONNACK 0 (its two probe records)."""
        self._stop.set()
        self._thread.join()
        (self.dir / "stop").touch()  # the last chunk ends now, not up to PROBE_CHUNK_S later (nothing is injected)
        for proc in self._procs:
            proc.wait(PROBE_CHUNK_S + 30)
        rounds, problems, suspects = 0, [], []
        for path in self.files:
            if not path.exists():
                problems.append(f"probe chunk {path.name} wrote nothing")
                continue
            chunk = [json.loads(line) for line in path.read_text().splitlines() if line]
            rounds += len({r["tick"] for r in chunk})
            suspects += [[r for r in chunk if r["tick"] == tick and r["rc"] == 0] for tick in double_service(chunk)]
        return rounds, problems, suspects


def unexplained(suspects: list[list[dict]], group: Group) -> tuple[list[str], list[str]]:
    """(violations, explained) among the probes' suspects (rule 5).

    Both CONNACK 0 of one round are only a violation if both nodes served at once. A round's two CONNECTs
    leave together but a reply can come late (a SYN lost to a fault is resent after 1 s), so each accept
    happened somewhere in its probe's [sent, done] window. The nodes log every accept with the shared
    monotonic clock and their epoch: a suspect is explained when each node logged an accept of a probe
    inside its window and the later accept is in a higher epoch (activity moved in between). Anything
    else -- including accepts the logs do not show -- is a violation.
    """
    role_of = {group.address(r): r for r in (P, B)}
    accepts = {r: [(e["mono_ms"], e["epoch"]) for e in group.events(r)
                   if e["event"] == "client_accepted" and e.get("client_id") == "prob"] for r in (P, B)}
    violations, explained = [], []
    for pair in suspects:
        found = []
        for probe in pair:
            role = role_of[probe["host"]]
            inside = [a for a in accepts[role] if probe["sent_ms"] - 1 <= a[0] <= probe["done_ms"] + 1]
            found.append((role, inside))
        text = "; ".join(f"{role_of[p['host']].value} window {p['sent_ms']:.0f}..{p['done_ms']:.0f} ms"
                         for p in pair)
        ok = len(found) == 2 and all(inside for _, inside in found) and any(
            (a[0] < b[0] and a[1] < b[1]) or (b[0] < a[0] and b[1] < a[1])
            for a in found[0][1] for b in found[1][1])
        (explained if ok else violations).append(f"probes: both routing nodes answered CONNACK 0 in one round ({text})"
                                                  + ("; the logs show activity moved between the two accepts"
                                                     if ok else ""))
    return violations, explained


class Run:
    """One seed's run (rule 1). `result` is what tests/harness/nemesis_report.py sums."""

    def __init__(self, seed: int, steps: list[Step], directory: Path, log=print) -> None:
        self.seed, self.steps, self.dir, self.log = seed, steps, directory, log
        self.result: dict = {"seed": seed, "steps": [], "counts": {}, "problems": []}
        self.crashes = 0
        self._expected_down: set[Role] = set()

    # --- the whole run -------------------------------------------------------------------------

    def execute(self) -> dict:
        if os.geteuid() != 0:
            raise AssertionError("the nemesis needs root (network namespaces, tmpfs mounts)")
        cleanup_stale()
        self.dir.mkdir(parents=True, exist_ok=True)
        mounts = mount_data_fs(self.dir / "group")
        try:
            with Hosts() as hosts:
                self.hosts = hosts
                addresses = {r: hosts.address(r.value) for r in Role}
                with Group(self.dir / "group", addresses, hosts=hosts) as group:
                    self.group = group
                    self._run_group()
        except Exception as exc:  # reported with the seed; the caller decides
            self.result["error"] = f"{type(exc).__name__}: {exc}"
        finally:
            unmount(mounts)
        return self.result

    def _run_group(self) -> None:
        g, hosts = self.group, self.hosts
        g.start()
        g.wait_for("the primary to take activity", lambda: g.probe_once()[P] == 0, timeout_s=30)
        g.wait_for("the backup to be in sync", g.backup_in_sync, timeout_s=30)
        self.client = ClientHost(hosts.netns_name("client"))
        self.token = management_token(load_secret(g.config))
        client_hosts, ns = [g.address(P), g.address(B)], hosts.netns_name("client")
        live = Subscriber("live", client_hosts, netns=ns)
        parked = Subscriber("parked", client_hosts, v5=False, netns=ns)
        for sub in (live, parked):
            sub.start()
        parked.go_offline()
        pubs = streams(client_hosts, qos1=1, qos2=2, count=10**9, interval_s=PUBLISH_INTERVAL_S, netns=ns)
        pubs.append(HostListStream("hl1", client_hosts, 1, interval_s=PUBLISH_INTERVAL_S, netns=ns))
        for pub in pubs:
            pub.start()
        prober = Prober(g, self.dir / "probes")
        prober.start()
        try:
            time.sleep(1.0)
            for step in self.steps:
                if not self._step(step, pubs):
                    break
        finally:
            for pub in pubs:
                pub.halt()
            rounds, probe_problems, suspects = prober.stop()
            self.client.close()
        parked.come_back()
        settle(pubs, [live, parked], timeout_s=SETTLE_MAX_S, stall_s=SETTLE_STALL_S)
        report = check(f"seed {self.seed}", pubs, [live, parked])
        for client in (*pubs, live, parked):
            client.stop()
        log_problems = g.accept_order_violations()
        dual, explained = unexplained(suspects, g)
        probe_problems += dual
        # QoS 1 duplicates of the message-id publisher: the group is to drop a resend's copy (docs/broker.md).
        msgid_dups = sum(n - 1 for sub in (live, parked) for n in collections.Counter(
            (name, seq) for name, seq, _ in sub.snapshot() if name == "hl1").values() if n > 1)
        self.result["counts"] = {
            "steps": len(self.result["steps"]), "published": report.published, "acknowledged": report.acknowledged,
            "refused": sum(len(p.refused) for p in pubs),
            "refused_codes": dict(collections.Counter(f"0x{c:02x}" for p in pubs for c in p.refused.values())),
            "received": report.received, "lost": report.lost,
            "duplicates_qos1": report.duplicates_qos1, "duplicates_msgid": msgid_dups,
            "duplicates_qos2": report.duplicates_qos2,
            "order_violations": report.order_violations, "unknown": report.unknown,
            "dual_accept_event_log": len(log_problems), "dual_accept_probes": len(probe_problems),
            "probe_suspects_explained": len(explained),
            "probe_rounds": rounds, "node_crashes": self.crashes,
            "recovery_timeouts": sum(1 for s in self.result["steps"] if not s["recovered"]),
            "injection_failures": sum(1 for s in self.result["steps"] if s["note"].startswith("injection failed")),
        }
        self.result["problems"] += [*report.details, *log_problems, *probe_problems]
        self.result["explained"] = explained
        self.log(f"seed {self.seed}: {report.line()}; dual acceptance: {len(log_problems)} (event logs), "
                 f"{len(probe_problems)} (probes, {rounds} rounds); crashes {self.crashes}")

    # --- one step -------------------------------------------------------------------------------

    def _step(self, step: Step, pubs) -> bool:
        start = time.monotonic()
        outcome = {**step.json(), "resolved": None, "note": ""}
        try:
            outcome["resolved"], outcome["note"] = self._inject_hold_heal(step)
        except Exception as exc:  # the fault could not be applied: say so, the heal already ran
            outcome["note"] = f"injection failed: {type(exc).__name__}: {exc}"
            self.result["problems"].append(f"{step.describe()}: {outcome['note']}")
        healed = time.monotonic()
        recovered = self._wait_recovered()
        end = time.monotonic()
        outcome.update(recovered=recovered, heal_s=round(healed - start, 3),
                       recover_s=round(end - healed, 3) if recovered else None,
                       unavailable_s=round(max(longest_gap(p.ack_times_now(), start, end) for p in pubs), 3))
        self.result["steps"].append(outcome)
        self.log(f"seed {self.seed} {step.describe()} on {outcome['resolved']}: unavailable "
                 f"{outcome['unavailable_s']:.2f} s, {'recovered' if recovered else 'NOT RECOVERED'} "
                 f"{outcome['note']}")
        if not recovered:
            self._keep_evidence(step)
        return recovered

    def _keep_evidence(self, step: Step) -> None:
        """What the nodes said and held when they did not recover: their views and a copy of their data."""
        views = {r.value: self._view(r) for r in (P, B)}
        port = self.group.config.ports.management
        for role in (P, B):
            views[f"{role.value} config-sync"] = self.client.call(
                _http, f"http://{self.group.address(role)}:{port}/api/v1/config-sync", self.token)[1]
        evidence = self.dir / f"not-recovered-step-{step.index}"
        for role in (P, B):
            shutil.copytree(self.group.config.node(role).data_dir, evidence / role.value, symlinks=True,
                            dirs_exist_ok=True)
        (evidence / "views.json").write_text(json.dumps(views, indent=1))
        self.result["problems"].append(f"{step.describe()}: the group did not recover within {RECOVER_S} s "
                                       f"(views and data copied to {evidence})\n{self.group.logs_tail(12)}")

    def _roles(self) -> tuple[Role, Role]:
        """(active, standby) now: the routing node that serves, per its own management API."""
        views = {r: self._view(r) for r in (P, B)}
        active = next((r for r, v in views.items() if v.get("serving")), None)
        if active is None:
            active = next((r for r, v in views.items() if v.get("activity") == "active"), P)
        return active, active.mate()

    def _view(self, role: Role) -> dict:
        url = f"http://{self.group.address(role)}:{self.group.config.ports.management}/api/v1/redundancy"
        status, body = self.client.call(_http, url, self.token)
        return body if status == 200 else {}

    def _host(self, name: str) -> str:
        active, standby = self._roles()
        return {"active": active.value, "standby": standby.value}.get(name, name)

    def _inject_hold_heal(self, step: Step) -> tuple[str, str]:
        kind, hosts, g = step.kind, self.hosts, self.group
        if kind in ("kill9", "monitor_failover"):
            roles = [Role(self._host(t)) for t in step.target]
            for role in roles:
                self._expected_down.add(role)
                g.kill(role)
            try:
                time.sleep(step.hold_s)
            finally:
                g.start(*roles)
                self._expected_down.difference_update(roles)
            return "+".join(r.value for r in roles), ""
        if kind == "pause":
            role = Role(self._host(step.target[0]))
            g.signal(role, signal.SIGSTOP)
            try:
                time.sleep(step.hold_s)
            finally:
                g.signal(role, signal.SIGCONT)
            return role.value, ""
        if kind in ("partition", "one_way", "flap"):
            a, b = (self._host(t) for t in step.target)
            try:
                if kind == "flap":
                    deadline, cut = time.monotonic() + step.hold_s, True
                    while time.monotonic() < deadline:
                        hosts.cut(a, b) if cut else hosts.heal(a, b)
                        cut = not cut
                        time.sleep(step.params["period_s"])
                else:
                    hosts.cut(a, b) if kind == "partition" else hosts.cut_one_way(a, b)
                    time.sleep(step.hold_s)
            finally:
                hosts.heal(a, b)
            return f"{a}-{b}", ""
        if kind == "loss":
            host = self._host(step.target[0])
            try:
                hosts.netem(host, loss_pct=step.params["loss_pct"])
                time.sleep(step.hold_s)
            finally:
                hosts.netem(host)
            return host, ""
        if kind == "delay":
            return self._delay(step)
        if kind == "disk_full":
            return self._disk_full(step)
        if kind == "release_revert":
            return self._release_revert(step)
        raise ValueError(f"unknown fault kind {kind!r}")

    def _tc(self, host: str, *args: str) -> subprocess.CompletedProcess:
        return self.hosts.run(host, ["tc", "qdisc", *args], capture_output=True, text=True)

    def _delay(self, step: Step) -> tuple[str, str]:
        """netem delay, jitter and reorder if the kernel has sch_netem; else a tbf rate limit (queueing delay)."""
        host = self._host(step.target[0])
        delay, reorder = step.params["delay_ms"], step.params["reorder_pct"]
        netem = ["add", "dev", "eth0", "root", "netem", "delay", f"{delay}ms", f"{delay // 4}ms"]
        if reorder:
            netem += ["reorder", f"{reorder}%", "50%"]
        done = self._tc(host, *netem)
        note = f"netem delay {delay} ms, reorder {reorder} %"
        if done.returncode != 0:
            # tbf: 1 Mbit/s with up to `delay` ms of queue; over it, packets drop (a congested link).
            done = self._tc(host, "add", "dev", "eth0", "root", "tbf", "rate", "1mbit", "burst", "4kb",
                            "latency", f"{delay}ms")
            note = f"no netem in this kernel; tbf 1 Mbit/s, {delay} ms queue (no reordering)"
            if done.returncode != 0:
                raise RuntimeError(f"tc refused both netem and tbf on {host}: {done.stderr.strip()}")
        try:
            time.sleep(step.hold_s)
        finally:
            removed = self._tc(host, "del", "dev", "eth0", "root")
            if removed.returncode != 0:
                raise RuntimeError(f"tc could not remove the qdisc on {host}: {removed.stderr.strip()}")
        return host, note

    def _disk_full(self, step: Step) -> tuple[str, str]:
        role = Role(self._host("active"))
        filler = self.group.config.node(role).data_dir / "nemesis-filler"
        written = 0
        try:
            with open(filler, "wb", buffering=0) as f:  # unbuffered: ENOSPC shows in write, never in close
                chunk = b"\0" * (256 * 1024)
                try:
                    while True:
                        f.write(chunk)
                        f.flush()
                        written += len(chunk)
                except OSError:
                    pass  # ENOSPC: the file system is full (a last partial chunk may be in the file)
            time.sleep(step.hold_s)
        finally:
            filler.unlink(missing_ok=True)
        return role.value, f"filled {written // 1024} KiB"

    def _release_revert(self, step: Step) -> tuple[str, str]:
        answers = []
        port = self.group.config.ports.management
        for _ in range(step.params["repeats"]):
            for action in ("release-activity", "revert-activity"):
                if not self._wait_recovered():
                    raise RuntimeError(f"the group did not recover before {action}; answers so far {answers}")
                active, _ = self._roles()
                if action == "release-activity" and active is B:
                    continue  # the backup is active already: the revert is what moves activity
                url = f"http://{self.group.address(active)}:{port}/api/v1/redundancy/{action}"
                status, body = self.client.call(_http, url, self.token, {})
                answers.append(f"{action} on {active.value}: {status}"
                               + (f" ({body.get('error', '')[:120]})" if status != 200 else ""))
                if status not in (200, 409):
                    raise RuntimeError(f"{action} on {active.value} answered {status}: {body}")
        return "active", "; ".join(answers)

    # --- recovery ---------------------------------------------------------------------------------

    def _check_crashes(self) -> None:
        for role, proc in list(self.group.procs.items()):
            if role not in self._expected_down and proc.poll() is not None:
                self.crashes += 1
                self.result["problems"].append(f"{role.value} exited by itself (rc {proc.returncode})\n"
                                               f"{self.group.logs_tail(15)}")
                self.group.procs.pop(role)
                self.group.start(role)

    def _recovered_now(self) -> bool:
        self._check_crashes()
        views = {r: self._view(r) for r in (P, B)}
        serving = [r for r, v in views.items() if v.get("serving")]
        if len(serving) != 1 or not views[serving[0].mate()].get("in_sync"):
            return False
        # Every peer seen by both routing nodes: a restarted monitor still booting does not count (killing the
        # standby then would cost the active its lease).
        if not all(peer.get("seen") for v in views.values() for peer in v.get("peers", [{}])):
            return False
        codes = self.group.probe_once()
        return codes[serving[0]] == 0 and codes[serving[0].mate()] != 0

    def _wait_recovered(self) -> bool:
        deadline = time.monotonic() + RECOVER_S
        while time.monotonic() < deadline:
            if self._recovered_now():
                return True
            time.sleep(0.1)
        return False


def run_seeds(seeds: list[int], length: int, mode: str, directory: Path, log=print) -> list[dict]:
    return [Run(seed, schedule(seed, length, mode), directory / f"seed-{seed}", log).execute() for seed in seeds]

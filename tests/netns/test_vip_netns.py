"""The virtual IP with real node processes in network namespaces.

Each node is its own host (tests/harness/netns.py); the VIP 10.77.0.100/24 lives on eth0 of whichever
routing host is active. A paho client in the client host knows only the VIP (tests/harness/vip_client.py).

Throughout each test a sampler reads both routing hosts' addresses with pyroute2 every ~10 ms and
records any instant at which both held the VIP. One sample reads primary, backup, primary: a
both-held sample needs the primary's address before and after the backup's, so a clean hand-off
between two reads is never mistaken for an overlap.

How a dead host counts: a node killed -9 leaves the VIP on its host's interface (the kernel even
answers ARP for it). That host serves nobody, so from the kill until its address is gone it is
not counted as a holder. The address goes when the host's node restarts (as systemd's
Restart=on-failure does): the restarted node removes it before anything else, which the test
checks in its event log. Meanwhile the gratuitous ARPs of the new holder are what move the
client: its neighbour entry for the VIP gets the new holder's MAC although the dead host still
answers for the address.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import threading
import time

import pytest
from pyroute2 import IPRoute

from pairmq.appliance.config import Timers, VipConfig
from pairmq.appliance.roles import Role
from tests.harness.group import REPO, Group
from tests.harness.netns import hosts  # noqa: F401  (fixture)

pytestmark = pytest.mark.processes
P, B, M = Role.PRIMARY, Role.BACKUP, Role.MONITOR
VIP = "10.77.0.100"
VIP_CONFIG = VipConfig(VIP, 24, {P: "eth0", B: "eth0"}, arp_count=3, arp_interval_ms=200)
SETTLE_S = 3 * (Timers().lease_ms + Timers().takeover_margin_ms) / 1000


class VipSampler(threading.Thread):
    """Who holds the VIP, every ~10 ms, from the routing hosts' own address lists."""

    def __init__(self, hosts, interval_s: float = 0.01) -> None:  # noqa: F811
        super().__init__(daemon=True)
        self.names = {h: hosts.netns_name(h) for h in ("primary", "backup")}
        self.interval_s = interval_s
        self.samples: list[tuple[int, frozenset[str]]] = []
        self.overlaps: list[str] = []
        self.dead: set[str] = set()
        self.revived: list[tuple[int, str]] = []  # (ms, host): a dead host's address seen gone
        self.error: BaseException | None = None
        self._lock = threading.Lock()
        self._halt = threading.Event()
        self._started = threading.Event()

    def mark_dead(self, host: str) -> None:
        """`host`'s node is about to be killed: its leftover address does not count until it is gone."""
        with self._lock:
            self.dead.add(host)

    def holders(self) -> frozenset[str]:
        with self._lock:
            return self.samples[-1][1] if self.samples else frozenset()

    def run(self) -> None:
        iprs = {}
        try:
            for host, name in self.names.items():  # pyroute2 objects stay on the thread that made them
                iprs[host] = IPRoute(netns=name, flags=0)
            self._started.set()
            while not self._halt.is_set():
                first_p = _holds(iprs["primary"])
                b = _holds(iprs["backup"])
                second_p = _holds(iprs["primary"])
                now = time.monotonic_ns() // 1_000_000
                held = frozenset(h for h, yes in (("primary", first_p and second_p), ("backup", b)) if yes)
                seen = frozenset(h for h, yes in (("primary", first_p or second_p), ("backup", b)) if yes)
                with self._lock:
                    for host in list(self.dead):
                        if host not in seen:
                            self.dead.discard(host)
                            self.revived.append((now, host))
                    if len(held - self.dead) > 1:
                        self.overlaps.append(f"at {now} ms both {', '.join(sorted(held))} held {VIP}")
                    self.samples.append((now, seen))
                self._halt.wait(self.interval_s)
        except BaseException as exc:  # reported by finish()
            self.error = exc
            self._started.set()
        finally:
            for ipr in iprs.values():
                ipr.close()

    def begin(self) -> VipSampler:
        self.start()
        assert self._started.wait(10), "the VIP sampler did not start"
        return self

    def finish(self) -> None:
        self._halt.set()
        self.join(10)
        assert self.error is None, f"the VIP sampler failed: {self.error!r}"
        assert len(self.samples) >= 20, f"only {len(self.samples)} samples"
        assert self.overlaps == [], self.overlaps[:5]

    def wait_holders(self, expected: set[str], timeout_s: float = 10) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.holders() == frozenset(expected):
                return
            time.sleep(0.01)
        raise AssertionError(f"the VIP is held by {sorted(self.holders())}, not {sorted(expected)}")


def _holds(ipr) -> bool:
    return any(m.get_attr("IFA_LOCAL") == VIP for m in ipr.get_addr(family=2))


class VipClient:
    """tests/harness/vip_client.py in the client host; its JSON lines collected as they come."""

    def __init__(self, hosts) -> None:  # noqa: F811
        self.proc = hosts.popen("client", [sys.executable, "-m", "tests.harness.vip_client", "--host", VIP], cwd=REPO,
                                stdout=subprocess.PIPE, text=True, bufsize=1)
        self.lines: list[dict] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(json.loads(line))

    def echoes_after(self, ms: int) -> int:
        return sum(1 for e in list(self.lines) if e["ev"] == "echo" and e["ms"] > ms)

    def wait_echoes(self, count: int, after_ms: int, what: str, group: Group, timeout_s: float = 20) -> None:
        group.wait_for(f"{count} echoes through the VIP {what}", lambda: self.echoes_after(after_ms) >= count,
                       timeout_s=timeout_s)

    def wait_reconnected(self, after_ms: int, group: Group, timeout_s: float = 20) -> int:
        """When the client, having lost its connection after `after_ms`, was accepted again."""
        def reconnected():
            lines = [e for e in list(self.lines) if e["ms"] > after_ms]
            lost = next((i for i, e in enumerate(lines) if e["ev"] == "disconnected"), None)
            if lost is None:
                return None
            return next((e["ms"] for e in lines[lost:] if e["ev"] == "connected" and e["rc"] == 0), None)

        return group.wait_for("the client to reconnect to the VIP", reconnected, timeout_s=timeout_s)

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(5)


@pytest.fixture
def group(hosts, tmp_path):  # noqa: F811
    addresses = {r: hosts.address(r.value) for r in Role}
    with Group(tmp_path / "group", addresses, hosts=hosts, vip=VIP_CONFIG) as g:
        g.start()
        g.wait_for("the primary to take activity", lambda: g.probe_once()[P] == 0, timeout_s=20)
        g.wait_for("the backup to be in sync", g.backup_in_sync, timeout_s=20)
        g.wait_for("the primary to announce the VIP", lambda: events(g, P, "vip_announced"), timeout_s=10)
        yield g
        assert g.accept_order_violations() == []


def events(group: Group, role: Role, kind: str, after_ms: int = 0) -> list[dict]:
    return [e for e in group.events(role) if e["event"] == kind and e["mono_ms"] > after_ms]


def mac(hosts, host: str) -> str:  # noqa: F811
    out = hosts.run(host, ["ip", "-j", "link", "show", "eth0"], capture_output=True, text=True, check=True).stdout
    return json.loads(out)[0]["address"]


def client_neighbour(hosts) -> str | None:  # noqa: F811
    """The MAC the client host's ARP table holds for the VIP (None: no entry)."""
    out = hosts.run("client", ["ip", "-j", "neigh", "show", VIP], capture_output=True, text=True, check=True).stdout
    entries = [e for e in json.loads(out or "[]") if "lladdr" in e]
    return entries[0]["lladdr"] if entries else None


def accepted_client(group: Group, role: Role, after_ms: int) -> bool:
    return any(e["client_id"] == "vip-client" and e["peer"].startswith("10.77.0.10:")
               for e in events(group, role, "client_accepted", after_ms))


def now_ms() -> int:
    return time.monotonic_ns() // 1_000_000


def test_kill_9_of_the_active_moves_the_vip_and_the_client_follows(group, hosts):  # noqa: F811
    with watched(group, hosts) as (sampler, client):
        assert accepted_client(group, P, 0)
        assert client_neighbour(hosts) == mac(hosts, "primary")

        sampler.mark_dead("primary")
        killed_at = now_ms()
        group.kill(P)
        group.wait_for("the backup to take over", lambda: group.decisions(B, "activate"), timeout_s=10)
        group.wait_for("the backup to announce the VIP", lambda: events(group, B, "vip_announced"), timeout_s=10)
        back_at = client.wait_reconnected(killed_at, group)
        client.wait_echoes(10, back_at, "to the backup", group)
        assert accepted_client(group, B, killed_at)
        # The dead primary's host still holds the address and would answer ARP for it: the client moved
        # because the backup's gratuitous ARPs rewrote its neighbour entry.
        assert sampler.holders() == {"primary", "backup"}
        assert client_neighbour(hosts) == mac(hosts, "backup")
        [activated] = group.decisions(B, "activate")
        [added] = events(group, B, "vip_added", killed_at)
        print(f"kill -9 -> backup active {activated['mono_ms'] - killed_at} ms, VIP added "
              f"{added['mono_ms'] - activated['mono_ms']} ms later, client back through the VIP "
              f"{back_at - added['mono_ms']} ms after that")

        restarted_at = now_ms()
        group.start(P)  # what systemd's Restart=on-failure does
        sampler.wait_holders({"backup"})
        assert [h for _, h in sampler.revived] == ["primary"]
        # The restarted node removed the leftover address before it did anything else.
        kinds = ("vip_removed", "redundancy_decision", "client_accepted")
        since = group.wait_for("the restarted primary's event log", lambda: [
            e for e in group.events(P) if e["mono_ms"] >= restarted_at and e["event"] in kinds], timeout_s=10)
        first = since[0]
        assert first["event"] == "vip_removed", since[:5]
        assert first["why"] == "left by an earlier run of this node (removed at start-up)"
        group.wait_for("the restarted primary to answer as a standby", lambda: group.probe_once() == {P: 3, B: 0},
                       timeout_s=20)
        time.sleep(SETTLE_S)
        assert sampler.holders() == {"backup"}, "the restarted standby must not take the VIP"
        client.wait_echoes(5, now_ms(), "to the backup after the primary's restart", group)


@contextlib.contextmanager
def watched(group: Group, hosts):  # noqa: F811
    """The sampler and the VIP-only client around a test body, the primary holding the VIP and echoing."""
    sampler = VipSampler(hosts).begin()
    client = VipClient(hosts)
    try:
        sampler.wait_holders({"primary"})
        client.wait_echoes(10, 0, "to the primary", group)
        yield sampler, client
    finally:
        client.close()
        sampler.finish()
    print(f"VIP samples: {len(sampler.samples)}, holders over time: {_transitions(sampler)}")


def moved_to_backup(group: Group, hosts, sampler: VipSampler, client: VipClient, since_ms: int) -> dict:  # noqa: F811
    """After a fault at `since_ms`: the backup holds and announced the VIP, the client reconnected through it and
    its messages come back, its neighbour entry has the backup's MAC, and the primary had removed the VIP before
    the backup added it. Returns the primary's `vip_removed` event."""
    sampler.wait_holders({"backup"})
    group.wait_for("the backup to announce the VIP", lambda: events(group, B, "vip_announced", since_ms),
                   timeout_s=10)
    back_at = client.wait_reconnected(since_ms, group)
    client.wait_echoes(10, back_at, "to the backup", group)
    assert accepted_client(group, B, since_ms)
    assert client_neighbour(hosts) == mac(hosts, "backup")
    [removed] = events(group, P, "vip_removed", since_ms)
    [added] = events(group, B, "vip_added", since_ms)
    assert removed["mono_ms"] < added["mono_ms"]
    print(f"the primary removed the VIP {added['mono_ms'] - removed['mono_ms']} ms before the backup added it; "
          f"client back through the VIP {back_at - added['mono_ms']} ms after that")
    return removed


@pytest.mark.parametrize("how", ["release-activity", "SIGTERM"])
def test_a_handover_moves_the_vip_without_overlap(group, hosts, how):  # noqa: F811
    """release-activity through the CLI, or SIGTERM (`systemctl stop`) of the active, which hands over too."""
    with watched(group, hosts) as (sampler, client):
        released_at = now_ms()
        if how == "SIGTERM":
            group.signal(P, signal.SIGTERM)
            assert group.procs.pop(P).wait(20) == 0, group.logs_tail(20)
        else:
            out = hosts.run("client", [sys.executable, "-m", "pairmq.cli.main", "redundancy", "release-activity",
                                       "--group", str(group.dir / "group.toml")],
                            capture_output=True, text=True, cwd=REPO, timeout=30)
            assert out.returncode == 0, out.stderr + group.logs_tail(20)
        removed = moved_to_backup(group, hosts, sampler, client, released_at)
        assert "the backup holds every op" in removed["why"], group.logs_tail(30)
        time.sleep(SETTLE_S)
        assert sampler.holders() == {"backup"}

        # Something else deletes the address from the active's interface: the node puts it back.
        deleted_at = now_ms()
        hosts.run("backup", ["ip", "addr", "del", f"{VIP}/24", "dev", "eth0"], check=True)
        group.wait_for("the backup to notice", lambda: events(group, B, "vip_lost", deleted_at), timeout_s=10)
        sampler.wait_holders({"backup"})
        group.wait_for("the VIP announced again", lambda: events(group, B, "vip_announced", deleted_at),
                       timeout_s=10)


def test_an_active_cut_off_from_its_peers_gives_the_vip_up_before_the_backup_takes_it(group, hosts):  # noqa: F811
    """Both hosts stay alive: the primary's lease expires, it removes the VIP, and only then (lease + margin
    after its last claim) may the backup take activity and the VIP. The client still reaches both hosts."""
    with watched(group, hosts) as (sampler, client):
        cut_at = now_ms()
        hosts.cut("primary", "backup")
        hosts.cut("primary", "monitor")
        removed = moved_to_backup(group, hosts, sampler, client, cut_at)
        assert "lease expired" in removed["why"]
        hosts.heal()
        time.sleep(SETTLE_S)
        assert sampler.holders() == {"backup"}


def _transitions(sampler: VipSampler) -> str:
    out, last = [], None
    for t, held in sampler.samples:
        if held != last:
            out.append(f"{t - sampler.samples[0][0]} ms: {'+'.join(sorted(held)) or 'nobody'}")
            last = held
    return "; ".join(out)


def test_vip_failures_are_one_sentence_and_the_broker_still_serves(hosts, tmp_path):  # noqa: F811
    """A primary without CAP_NET_ADMIN/CAP_NET_RAW, and a backup whose interface does not exist: each says
    why in one sentence (log, event log, redundancy view), once however often it retries, and serves its
    host-list clients all the same."""
    addresses = {r: hosts.address(r.value) for r in Role}
    vip = VipConfig(VIP, 24, {P: "eth0", B: "eth9"}, arp_count=3, arp_interval_ms=200)
    no_caps = ("setpriv", "--bounding-set=-net_admin,-net_raw", "--")
    with Group(tmp_path / "group", addresses, hosts=hosts, vip=vip) as g:
        g.start(P, wrap=no_caps)
        g.start(B, M)
        g.wait_for("the primary to take activity", lambda: g.probe_once()[P] == 0, timeout_s=20)
        g.wait_for("the primary to fail to add the VIP", lambda: events(g, P, "vip_failed"), timeout_s=10)
        no_admin = ("cannot add virtual IP 10.77.0.100/24 on eth0: operation not permitted "
                    "(the node needs CAP_NET_ADMIN)")
        time.sleep(2.5)  # more than one retry (vip.RETRY_S)
        assert [e["error"] for e in events(g, P, "vip_failed")] == [no_admin]
        assert no_admin in (g.dir / "primary.log").read_text()
        views = show_redundancy(g, hosts)
        assert views[P]["vip"] == {"address": "10.77.0.100/24", "interface": "eth0", "held": False,
                                   "error": no_admin, "announcements": 0, "adds": 0, "removals": 0}
        assert views[B]["vip"]["error"] is None and views[M]["vip"] is None
        assert not host_holds(hosts, "primary")

        g.wait_for("the backup to be in sync", g.backup_in_sync, timeout_s=20)
        g.kill(P)
        g.wait_for("the backup to take over", lambda: g.probe_once()[B] == 0, timeout_s=10)
        missing = "cannot hold virtual IP 10.77.0.100/24: interface eth9 does not exist on this host"
        g.wait_for("the backup to fail to add the VIP", lambda: events(g, B, "vip_failed"), timeout_s=10)
        time.sleep(2.5)
        assert [e["error"] for e in events(g, B, "vip_failed")] == [missing]
        assert show_redundancy(g, hosts)[B]["vip"]["error"] == missing
        assert g.probe_once()[B] == 0


def show_redundancy(group: Group, hosts) -> dict[Role, dict]:  # noqa: F811
    out = hosts.run("client", [sys.executable, "-m", "pairmq.cli.main", "show", "redundancy", "--json",
                               "--group", str(group.dir / "group.toml")], capture_output=True, text=True, cwd=REPO,
                    timeout=30)
    assert out.returncode == 0, out.stderr
    return {Role(n["role"]): n for n in json.loads(out.stdout)["nodes"] if n["reachable"]}


def host_holds(hosts, host: str) -> bool:  # noqa: F811
    out = hosts.run(host, ["ip", "-j", "addr", "show", "eth0"], capture_output=True, text=True, check=True).stdout
    return any(a["local"] == VIP for link in json.loads(out) for a in link.get("addr_info", []))


def test_release_command_removes_a_leftover_vip(hosts, tmp_path):  # noqa: F811
    """`python -m pairmq.appliance.node.vip release` (systemd's ExecStopPost) removes what a killed node left."""
    addresses = {r: hosts.address(r.value) for r in Role}
    group = Group(tmp_path / "group", addresses, hosts=hosts, vip=VIP_CONFIG)  # the file only: no node runs
    argv = [sys.executable, "-m", "pairmq.appliance.node.vip", "release", "--role", "primary",
            "--group", str(group.dir / "group.toml")]
    hosts.run("primary", ["ip", "addr", "add", f"{VIP}/24", "dev", "eth0"], check=True)
    assert host_holds(hosts, "primary")
    out = hosts.run("primary", argv, capture_output=True, text=True, cwd=REPO, timeout=60)
    assert (out.returncode, out.stdout, out.stderr) == (0, "virtual IP 10.77.0.100/24 removed from eth0\n", "")
    assert not host_holds(hosts, "primary")
    again = hosts.run("primary", argv, capture_output=True, text=True, cwd=REPO, timeout=60)
    assert (again.returncode, again.stdout) == (0, "virtual IP 10.77.0.100/24 was not on eth0\n")
    bad = hosts.run("primary", [*argv[:6], "--group", str(tmp_path / "missing.toml")], capture_output=True,
                    text=True, cwd=REPO, timeout=60)
    assert bad.returncode == 2 and bad.stderr.startswith("error: group file ") and bad.stderr.count("\n") == 1


def test_mqtt_over_tls_through_the_vip(hosts, tmp_path):  # noqa: F811
    """With [tls], port 8883 answers on the VIP too: mosquitto_pub in the client host verifies the VIP
    (an IP SAN of the certificate) and gets its QoS 1 publish acknowledged by the active."""
    from pairmq.appliance.config import TlsConfig
    from tests.harness.certs import make_pki

    pki = make_pki(tmp_path / "pki", (VIP, hosts.address("primary"), hosts.address("backup")))
    addresses = {r: hosts.address(r.value) for r in Role}
    with Group(tmp_path / "group", addresses, hosts=hosts, vip=VIP_CONFIG,
               tls=TlsConfig(pki.cert_file, pki.key_file)) as g:
        g.start()
        g.wait_for("the primary to take activity", lambda: g.probe_once()[P] == 0, timeout_s=20)
        g.wait_for("the primary to announce the VIP", lambda: events(g, P, "vip_announced"), timeout_s=10)
        started = now_ms()
        out = hosts.run("client", ["mosquitto_pub", "-h", VIP, "-p", "8883", "--cafile", str(pki.ca_file),
                                   "-i", "vip-tls", "-q", "1", "-t", "vip/tls", "-m", "hello"],
                        capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        g.wait_for("the primary's log of the TLS client", lambda: any(
            e["client_id"] == "vip-tls" for e in events(g, P, "client_accepted", started)), timeout_s=10)

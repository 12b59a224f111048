"""S4 on the wire: forged, tampered, replayed, foreign, malformed and stale heartbeats change nothing.

A real group runs on 127.0.0.1-3 (primary active, backup standby). Scapy
crafts UDP datagrams, spoofed as coming from the backup, and injects them
into the nodes' heartbeat port 8300 on loopback; real heartbeats are captured
off `lo` with scapy's sniffer. After each kind of datagram, the test asks the
nodes (GET /api/v1/redundancy, the event logs, a real MQTT CONNECT) whether
anything changed: the primary still serves, no epoch moved, no redundancy
decision was taken, and the receiving node counted every datagram under the
reason DESIGN §3 gives it (malformed → foreign_group → stale → bad_mac →
replayed) and under no other.

How packets reach loopback: a raw IP socket (scapy's `L3RawSocket`) lets the
kernel route the datagram to `lo` and deliver it to the node's socket. (Here,
`sendp` of an Ether frame on `lo` is captured by sniffers but never delivered.)
The counters moving is the proof that the datagrams arrived.

How packets are captured: without libpcap scapy cannot compile a BPF filter,
so the sniffer filters in Python (`lfilter`). On `lo` a packet socket sees
every datagram twice (outgoing and incoming), so captures are de-duplicated.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import subprocess
import time
from pathlib import Path

import pytest
from scapy.all import IP, UDP, AsyncSniffer, L3RawSocket, Raw

from pairmq.appliance.config import load_secret
from pairmq.appliance.quorum import wire
from pairmq.appliance.quorum.auth import REASONS, HeartbeatAuth
from pairmq.appliance.quorum.wire import Activity, Heartbeat, PeerView
from pairmq.appliance.roles import Role
from tests.harness.group import Group

P, B, M = Role.PRIMARY, Role.BACKUP, Role.MONITOR
HUGE_EPOCH = 10**9
STRANGER = "127.0.0.66"  # garbage comes from an address that is no node
MAX_UDP_PAYLOAD = 65535 - 20 - 8
FIXED_PORTS = (8300, 1883, 8080)
SETTLE_S = 0.7  # > lease + margin: long enough for a step-down or a bid to have shown
# Decisions an injected datagram must never cause ("sync"/"refuse" lines are routine).
FORBIDDEN_DECISIONS = ("activate", "step_down", "vote", "bid", "bid_end", "epoch", "force")


@dataclasses.dataclass
class Rig:
    group: Group
    secret: bytes
    first_boot: list[bytes]  # genuine backup heartbeats from its previous incarnation


# --- the group ---------------------------------------------------------------------


def listeners() -> list[str]:
    """`ss` lines for the group's fixed ports, whoever holds them."""
    out = subprocess.run(["ss", "-lntupH"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if any(f":{port} " in line for port in FIXED_PORTS)]


def ours(group: Group) -> bool:
    """Our live nodes hold their ports and nobody else holds any on our addresses: the API we ask is our
    group's. (Groups on other loopback addresses, PAIRMQ_TEST_LOOPBACK, are other developers' and fine.)"""
    lines, pids = listeners(), {f"pid={proc.pid}," for proc in group.procs.values()}
    held = all(any(f"{group.address(r)}:{port} " in line and f"pid={proc.pid}," in line for line in lines)
               for r, proc in group.procs.items() for port in (8300, 8080))
    addresses = {group.address(r) for r in Role} | {"0.0.0.0", "*", "[::]"}  # wildcards take ours too
    on_ours = [line for line in lines if line.split()[4].rsplit(":", 1)[0] in addresses]  # the local address
    strangers = [line for line in on_ours if not any(pid in line for pid in pids)]
    return held and not strangers and all(proc.poll() is None for proc in group.procs.values())


def redundancy(group: Group, role: Role) -> dict:
    return group.api(role, "/api/v1/redundancy")


def steady(group: Group, backup_incarnation: int) -> bool:
    """Primary serves, backup in sync; the backup (at this boot) sees both peers, so both accepted its heartbeats."""
    try:
        views = {r: redundancy(group, r) for r in Role}
    except OSError:  # a node still starting: its API is not up yet
        return False
    return (ours(group) and views[P]["serving"] and views[B]["incarnation"] == backup_incarnation
            and all(p["seen"] for p in views[B]["peers"]) and views[B]["in_sync"]
            and views[M]["redundancy_status"] == "Up")


@pytest.fixture(scope="module")
def rig(tmp_path_factory):
    """A steady group at its second boot, and genuine backup heartbeats from its first.

    Every node boots twice, so that an older incarnation of the backup exists
    to be stale. (Restarting the backup alone would leave it out of sync for
    good until resync exists.) Entering the group takes the shared lock on the
    fixed ports and waits for them to be free.
    """
    with Group(tmp_path_factory.mktemp("forged") / "group") as group:
        group.start()
        group.wait_for("a steady group", lambda: steady(group, 1))
        first_boot = capture_heartbeats(group, B, 8)
        for role in Role:  # kill -9, not SIGTERM: a terminated active hands over, and the backup would boot ahead
            group.kill(role)
        group.start()
        group.wait_for("a steady group after a restart", lambda: steady(group, 2))
        yield Rig(group, load_secret(group.config), first_boot)


# --- the wire ------------------------------------------------------------------------


def inject(group: Group, role: Role, payloads: list[bytes], src: str | None = None, repeat: int = 1) -> int:
    """Send each payload `repeat` times as a UDP datagram from src:8300 (the backup's by default) to the node."""
    port, src = group.config.ports.heartbeat, src or group.address(B)
    sock = L3RawSocket()
    try:
        for _ in range(repeat):
            for payload in payloads:
                pkt = IP(src=src, dst=group.address(role)) / UDP(sport=port, dport=port)
                sock.send(pkt / Raw(payload) if payload else pkt)
    finally:
        sock.close()
    return len(payloads) * repeat


def capture_heartbeats(group: Group, sender: Role, count: int, timeout_s: float = 5.0) -> list[bytes]:
    """Genuine heartbeats `sender` sends to its peers, read off lo, oldest first, distinct."""
    address, port = group.address(sender), group.config.ports.heartbeat
    seen: dict[bytes, None] = {}

    def wanted(pkt) -> bool:  # "udp and src host <sender> and dst port 8300"
        return pkt.haslayer(UDP) and pkt[IP].src == address and pkt[UDP].dport == port

    sniffer = AsyncSniffer(iface="lo", lfilter=wanted, store=False,
                           prn=lambda pkt: seen.setdefault(bytes(pkt[UDP].payload)))
    sniffer.start()
    deadline = time.monotonic() + timeout_s
    while len(seen) < count and time.monotonic() < deadline:
        time.sleep(0.05)
    sniffer.stop()
    captured = list(seen)
    assert len(captured) >= count, f"captured only {len(captured)} {sender.value} heartbeats on lo"
    assert all(wire.peek_header(d).sender is sender for d in captured)
    return captured


def backup_heartbeat(group_name: str, incarnation: int, **fields) -> Heartbeat:
    """A plausible heartbeat from the backup; `fields` override the body."""
    body = dict(seq=1, epoch=1, activity=Activity.STANDBY,
                views=(PeerView(P, 1, 1, 10, 10, 1), PeerView(M, 1, 1, 10)))
    body.update(fields)
    return Heartbeat(group=group_name, sender=B, incarnation=incarnation, **body)


def epoch_offset(data: bytes) -> int:
    """Where the epoch sits: header, group name, then incarnation and seq (8 bytes each)."""
    return wire._HEADER.size + len(wire.peek_header(data).group) + 16


# --- what "nothing changed" means --------------------------------------------------------


@dataclasses.dataclass
class Snapshot:
    views: dict[Role, dict]
    decisions: dict[Role, int]
    kernel_drops: dict[Role, int]


def snapshot(group: Group) -> Snapshot:
    return Snapshot({r: redundancy(group, r) for r in Role},
                    {r: len(forbidden_decisions(group, r)) for r in Role},
                    {r: kernel_drops(group, r) for r in Role})


def kernel_drops(group: Group, role: Role) -> int:
    """Datagrams the kernel dropped for the node's heartbeat socket (its receive buffer full: a burst of
    64 KiB datagrams overflows it while a loaded machine has not yet scheduled the heartbeat thread)."""
    ip, port = group.address(role), group.config.ports.heartbeat
    local = f"{ipaddress.IPv4Address(ip).packed[::-1].hex().upper()}:{port:04X}"
    for line in Path("/proc/net/udp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[1] == local:
            return int(fields[-1])
    raise AssertionError(f"no UDP socket on {ip}:{port}")


def forbidden_decisions(group: Group, role: Role) -> list[dict]:
    return [d for d in group.decisions(role) if d["kind"] in FORBIDDEN_DECISIONS]


def rejected_delta(before: Snapshot, after: dict[Role, dict], role: Role) -> dict[str, int]:
    was, now = before.views[role]["rejected_heartbeats"], after[role]["rejected_heartbeats"]
    return {reason: now[reason] - was[reason] for reason in REASONS}


def assert_nothing_changed(rig: Rig, kind: str, before: Snapshot, sent: dict[Role, tuple[str, int]]) -> None:
    """`sent[role] = (reason, n)`: that node must have refused n datagrams for that reason, and nothing else."""
    group = rig.group

    def dropped(role: Role) -> int:
        return kernel_drops(group, role) - before.kernel_drops[role]

    def counted() -> dict[Role, dict] | None:
        views = {r: redundancy(group, r) for r in Role}
        done = all(rejected_delta(before, views, r)[reason] + dropped(r) >= n for r, (reason, n) in sent.items())
        return views if done else None

    assert ours(group), "another process shares our ports:\n" + "\n".join(listeners())
    group.wait_for(f"the {kind} datagrams to be counted", counted, timeout_s=5, every_s=0.05)
    time.sleep(SETTLE_S)
    after = {r: redundancy(group, r) for r in Role}
    for role in Role:
        delta = rejected_delta(before, after, role)
        reason, n = sent.get(role, (None, 0))
        print(f"{kind:>13} → {role.value:<7} sent {n:>4}  rejected {after[role]['rejected_heartbeats']}  "
              f"delta {({k: v for k, v in delta.items() if v} or '{}')}  accepted {after[role]['accepted_heartbeats']}")
        others = {k: v for k, v in delta.items() if k != reason and v}
        assert not others, f"{role.value} counted {kind} datagrams under other reasons: {delta}"
        if reason:  # each one the kernel let through was counted, and the first always gets through
            assert delta[reason] >= 1 and delta[reason] + dropped(role) >= n, \
                f"{role.value}: {n} {kind} datagrams sent, {delta[reason]} counted {reason}, {dropped(role)} dropped"
        assert after[role]["epoch"] == before.views[role]["epoch"], f"{role.value}'s epoch moved"
        assert after[role]["activity"] == before.views[role]["activity"], f"{role.value}'s activity changed"
        assert len(forbidden_decisions(group, role)) == before.decisions[role], \
            f"{role.value} took a redundancy decision: {forbidden_decisions(group, role)[before.decisions[role]:]}"
        assert group.procs[role].poll() is None, f"{role.value} died\n{group.logs_tail()}"
    # The event log records every refusal too, summed once a second (DESIGN §7).
    time.sleep(1.1)
    for role in Role:
        logged = {}
        for e in group.events(role):
            if e["event"] == "heartbeats_rejected":
                for reason in REASONS:
                    logged[reason] = logged.get(reason, 0) + e.get(reason, 0)
        counters = redundancy(group, role)["rejected_heartbeats"]
        # not `unconfirmed`: a peer's first heartbeats after each boot are, until it echoes the new incarnation,
        # and the log sums from a baseline taken once the node runs
        assert all(logged.get(r, 0) == counters[r] for r in REASONS if r != "unconfirmed"), (role, logged, counters)
        # The backup as its peers see it: still a standby at the old epoch, still heard (its mark did not move).
        if role is not B:
            [view] = [p for p in after[role]["peers"] if p["role"] == "backup"]
            assert (view["activity"], view["epoch"], view["seen"]) == ("standby", before.views[B]["epoch"], True)
    assert after[P]["serving"] and after[P]["activity"] == "Local Active"
    assert ours(group), "another process shares our ports:\n" + "\n".join(listeners())
    assert group.probe_once() == {P: 0, B: 3}, "the primary must still serve and the backup refuse"


# --- the kinds -----------------------------------------------------------------------------


def test_forged_with_a_wrong_secret_is_bad_mac(rig):
    group, before = rig.group, snapshot(rig.group)
    incarnation = before.views[B]["incarnation"]
    claim = backup_heartbeat(group.config.name, incarnation, seq=10**6, epoch=HUGE_EPOCH, activity=Activity.ACTIVE,
                             bid_epoch=HUGE_EPOCH, vote_epoch=HUGE_EPOCH, vote_for=B,
                             flags=wire.FLAG_SELF_IN_SYNC | wire.FLAG_REDUNDANCY_UP)
    forged = [
        HeartbeatAuth(os.urandom(32), group.config.name, B).seal(claim),
        # A newer "boot" must not move the replay mark past the real backup's.
        HeartbeatAuth(os.urandom(32), group.config.name, B).seal(
            dataclasses.replace(claim, incarnation=incarnation + 1000)),
        # An unknown key id is a bad MAC too (there is no key to check it with).
        HeartbeatAuth({7: os.urandom(32)}, group.config.name, B, send_key_id=7).seal(claim),
    ]
    n = 10
    sent = {r: ("bad_mac", inject(group, r, forged, repeat=n)) for r in (P, M)}
    assert_nothing_changed(rig, "forged", before, sent)


def test_tampered_epoch_is_bad_mac(rig):
    group, before = rig.group, snapshot(rig.group)
    genuine = capture_heartbeats(group, B, 5)
    tampered = []
    for data in genuine:
        at = epoch_offset(data)
        flipped = bytearray(data)
        flipped[at] ^= 0x80  # the epoch's top bit: an epoch far above everyone's
        flipped[at + 7] ^= 0x01
        header = wire.peek_header(bytes(flipped))
        assert wire.decode(bytes(flipped), header).epoch == wire.decode(data, header).epoch ^ (1 << 63 | 1)
        tampered.append(bytes(flipped))
    sent = {P: ("bad_mac", inject(group, P, tampered, repeat=4))}
    assert_nothing_changed(rig, "tampered", before, sent)


def test_replayed_genuine_heartbeats_are_replayed(rig):
    group, before = rig.group, snapshot(rig.group)
    genuine = capture_heartbeats(group, B, 10)
    sent = {r: ("replayed", inject(group, r, genuine, repeat=20)) for r in (P, M)}
    assert_nothing_changed(rig, "replayed", before, sent)


def test_foreign_group_with_the_real_secret_is_foreign_group(rig):
    group, before = rig.group, snapshot(rig.group)
    incarnation = before.views[B]["incarnation"]
    foreign = [HeartbeatAuth(rig.secret, name, B).seal(backup_heartbeat(
                   name, incarnation, seq=10**6, epoch=HUGE_EPOCH, activity=Activity.ACTIVE))
               for name in ("other-group", "tset")]  # "tset": same length as "test"
    sent = {r: ("foreign_group", inject(group, r, foreign, repeat=10)) for r in (P, M)}
    assert_nothing_changed(rig, "foreign_group", before, sent)


def test_garbage_is_malformed_on_every_node(rig):
    group, before = rig.group, snapshot(rig.group)
    genuine = capture_heartbeats(group, B, 3)[-1]
    size = len(genuine)
    garbage = [
        b"",  # empty
        os.urandom(1), os.urandom(size), os.urandom(size - 1), os.urandom(1400),  # random
        genuine[:8], genuine[:20], genuine[:size // 2], genuine[:-1],  # truncated
        genuine + b"\x00",  # one byte too long
        os.urandom(8192), genuine + os.urandom(8192 - size),  # oversized, 8 KiB
        os.urandom(MAX_UDP_PAYLOAD),  # the largest datagram IPv4 can carry
        wire.MAGIC + os.urandom(size - 4),  # the right magic, then noise
        genuine[:4] + b"\x02" + genuine[5:],  # protocol version 2
        genuine[:5] + b"\x09" + genuine[6:],  # unknown message type
        genuine[:6] + b"\x07" + genuine[7:],  # unknown sender role
    ]
    sent = {}
    for role in Role:
        reflected = genuine[:6] + bytes([role.wire_id]) + genuine[7:]  # "from" the receiver's own role
        sent[role] = ("malformed", inject(group, role, garbage + [reflected], src=STRANGER, repeat=3))
    assert_nothing_changed(rig, "malformed", before, sent)


def test_older_incarnation_with_the_real_secret_is_stale(rig):
    group, before = rig.group, snapshot(rig.group)
    current = before.views[B]["incarnation"]
    assert current >= 2, "the fixture restarts the group so that an older boot exists"
    sealer = HeartbeatAuth(rig.secret, group.config.name, B)
    built = [
        sealer.seal(backup_heartbeat(group.config.name, current - 1, seq=10**6, epoch=before.views[B]["epoch"])),
        # The dangerous one: correctly sealed, claiming activity at a huge epoch, from the previous boot.
        sealer.seal(backup_heartbeat(group.config.name, current - 1, seq=10**6 + 1, epoch=HUGE_EPOCH,
                                     activity=Activity.ACTIVE, bid_epoch=HUGE_EPOCH, vote_epoch=HUGE_EPOCH,
                                     vote_for=B)),
    ]
    assert all(wire.peek_header(d).incarnation == current - 1 for d in rig.first_boot)
    payloads = built + rig.first_boot  # built ones, then the genuine heartbeats of that older boot
    sent = {r: ("stale", inject(group, r, payloads, repeat=5)) for r in (P, M)}
    assert_nothing_changed(rig, "stale", before, sent)

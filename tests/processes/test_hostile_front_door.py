"""Hostile clients against the MQTT front door of a real group (docs/security.md).

One group for the module. Its [limits] make each budget small enough to reach
quickly: a CONNECT may be as large as any packet (1 MiB) so that the 80,000
User Property CONNECT reaches the decoder and its property cap; 100 pre-auth
connections in total (so the per-address cap, which waits for half of them to
be in use, applies from 50), 64 per address and 16 MiB pre-auth bytes in
total; 1 MiB of output
per connection; 120 subscriptions per session and 50 filters per SUBSCRIBE.
The event log keeps only 64 KiB, so a refusal flood would push everything
else out of it if refusals were not throttled.

The attacker connects from the monitor's address and the legitimate client
from the backup's (both ours: PAIRMQ_TEST_LOOPBACK moves them), so the
per-address cap tells them apart. Nothing asserts a duration: deadlines are
"give up waiting" bounds; outcomes are reason codes, counters, events, RSS.
"""

from __future__ import annotations

import concurrent.futures
import socket
import threading
import time

import pytest

from pairmq.appliance.config import Limits
from pairmq.appliance.eventlog import EventSettings
from pairmq.appliance.roles import Role
from tests.harness.group import Group, active_group
from tests.harness.mqttraw import CONNACK, PORT, PUBACK, V5, V311, WAIT_S, Raw, connect_with_properties, vbi

PACKET_TOO_LARGE, QUOTA_EXCEEDED = 0x95, 0x97
PREAUTH_TOTAL, PREAUTH_PER_ADDRESS = 100, 64
PREAUTH_BYTES = 16 << 20
OUTPUT_MAX = 1 << 20
MAX_SUBSCRIPTIONS, MAX_FILTERS = 120, 50
RSS_GROWTH_BOUND_KIB = 48 * 1024  # the 16 MiB budget, reads in flight and the allocator's slack


@pytest.fixture(scope="module")
def group(tmp_path_factory):
    limits = Limits(mqtt_connect_max_bytes=1 << 20, mqtt_preauth_max_connections=PREAUTH_TOTAL,
                    mqtt_preauth_max_per_address=PREAUTH_PER_ADDRESS,
                    mqtt_preauth_max_bytes=PREAUTH_BYTES, mqtt_output_max_bytes=OUTPUT_MAX,
                    subscriptions_per_client_max=MAX_SUBSCRIPTIONS, subscribe_max_filters=MAX_FILTERS)
    events = EventSettings(message_events=False, segment_max_bytes=16 * 1024, retain_max_bytes=64 * 1024)
    with active_group(tmp_path_factory.mktemp("hostile") / "group", limits=limits, events=events) as g:
        yield g


def attacker(group: Group) -> str:
    return group.address(Role.MONITOR)


def legit(group: Group) -> str:
    return group.address(Role.BACKUP)


class RawFrom(Raw):
    """`Raw` from a chosen source address."""

    def __init__(self, source: str, host: str, version: int = V5) -> None:
        self.version = version
        self._buf = b""
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.settimeout(WAIT_S)
        self.sock.bind((source, 0))
        self.sock.connect((host, PORT))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def activity(group: Group) -> list[tuple[str, str, int]]:
    return [(d["node"], d["kind"], d["epoch"]) for role in (Role.PRIMARY, Role.BACKUP)
            for d in group.decisions(role) if d["kind"] in ("activate", "step_down")]


def mqtt_view(group: Group) -> dict:
    return group.api(Role.PRIMARY, "/api/v1/redundancy")["mqtt"]


def client_ids(group: Group) -> set[str]:
    return {c["client_id"] for c in group.api(Role.PRIMARY, "/api/v1/clients")["clients"]}


def vm_kib(pid: int, field: str) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


# --- the 391 KiB CONNECT with 80,000 User Properties --------------------------------

def send_property_flood(source: str, host: str) -> int | None:
    """The attack CONNECT (no credentials): the CONNACK's reason code, or None if closed without one."""
    raw = RawFrom(source, host)
    try:
        raw.sock.settimeout(60)
        raw.sock.sendall(connect_with_properties(80_000, client_id=b""))
        answer = raw.recv(timeout_s=60)
        return None if answer is None else answer.reason_and_props()[0]
    finally:
        raw.close()


def test_the_80000_property_connect_is_refused_and_moves_no_activity(group):
    before = activity(group)
    client = RawFrom(legit(group), group.address(Role.PRIMARY))
    assert client.connect("legit-during-flood").reason_and_props()[0] == 0
    assert len(connect_with_properties(80_000)) > 390 * 1024

    assert send_property_flood(attacker(group), group.address(Role.PRIMARY)) == PACKET_TOO_LARGE
    with concurrent.futures.ThreadPoolExecutor(2) as pool:  # both routing nodes at once
        codes = list(pool.map(lambda role: send_property_flood(attacker(group), group.address(role)),
                              (Role.PRIMARY, Role.BACKUP)))
    assert codes == [PACKET_TOO_LARGE, PACKET_TOO_LARGE]

    assert client.barrier() == []  # the legitimate client was never dropped: PINGRESP on the same connection
    assert group.probe_once(in_process=True)[Role.PRIMARY] == 0  # and a new one still gets in
    assert activity(group) == before  # no failover, the epoch unchanged
    def refusals() -> list[dict]:
        return [e for e in group.events(Role.PRIMARY) if e["event"] == "bad_packet"
                and e["reason_code"] == PACKET_TOO_LARGE and "more than 128 properties" in e["reason"]]

    group.wait_for("both refusals in the primary's event log", lambda: len(refusals()) >= 2)  # written off the loop
    assert len(refusals()) == 2
    client.close()


# --- memory before login ----------------------------------------------------------

def test_the_per_address_cap_refuses_the_extras_and_a_legitimate_client_still_connects(group):
    primary = group.address(Role.PRIMARY)
    silent = [RawFrom(attacker(group), primary) for _ in range(PREAUTH_PER_ADDRESS)]
    silent[-1].sock.sendall(b"\x10")  # a read on the last one: every one before it was accepted by then
    extra = RawFrom(attacker(group), primary)
    try:
        assert extra.connect("one-too-many") is None  # closed unread: no CONNACK
    except (ConnectionResetError, BrokenPipeError):
        pass
    ok = RawFrom(legit(group), primary)
    assert ok.connect("legit-beside-the-flood").reason_and_props()[0] == 0
    assert ok.barrier() == []
    view = mqtt_view(group)
    assert view["preauth_refused_address"] >= 1 and view["preauth_connections"] == PREAUTH_PER_ADDRESS
    for raw in [*silent, extra, ok]:
        raw.close()
    group.wait_for("the pre-auth slots to be free", lambda: mqtt_view(group)["preauth_connections"] == 0)


def open_unfinished_connect(source: str, host: str) -> socket.socket | None:
    """A CONNECT announced at 1 MiB, all of it sent but its last byte; the socket is kept open."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.settimeout(WAIT_S)
    sock.bind((source, 0))
    try:
        sock.connect((host, PORT))
        remaining = (1 << 20) - 5  # the fixed header is 5 bytes: a 1 MiB packet
        sock.sendall(b"\x10" + vbi(remaining) + bytes(remaining - 1))
    except OSError:  # refused or cut off by the budget while sending
        pass
    return sock


def test_unfinished_connects_keep_rss_bounded(group):
    pid = group.pid(Role.PRIMARY)
    rss_before = vm_kib(pid, "VmRSS")
    socks = [open_unfinished_connect(attacker(group), group.address(Role.PRIMARY)) for _ in range(250)]
    try:
        peak_growth = vm_kib(pid, "VmHWM") - rss_before
        print(f"250 unfinished 1 MiB CONNECTs: peak RSS {rss_before + peak_growth} KiB, {peak_growth} KiB over the "
              f"{rss_before} KiB before; {vm_kib(pid, 'Threads')} threads")
        assert peak_growth < RSS_GROWTH_BOUND_KIB, f"RSS grew {peak_growth} KiB past {rss_before} KiB"
        ok = RawFrom(legit(group), group.address(Role.PRIMARY))
        assert ok.connect("legit-after-the-flood").reason_and_props()[0] == 0
        ok.close()
        view = mqtt_view(group)
        assert view["preauth_bytes"] <= PREAUTH_BYTES
        assert view["preauth_refused_bytes"] > 0 and view["preauth_refused_address"] > 0
    finally:
        for sock in socks:
            sock.close()
    group.wait_for("the pre-auth slots to be free", lambda: mqtt_view(group)["preauth_connections"] == 0)


# --- subscriptions per client and filters per SUBSCRIBE ----------------------------

def test_subscription_caps_answer_quota_exceeded_per_filter(group):
    sub = RawFrom(legit(group), group.address(Role.PRIMARY))
    assert sub.connect("subscription-cap").reason_and_props()[0] == 0
    first = sub.subscribe_many(1, [(f"cap/a{i}", 1) for i in range(60)]).codes()
    assert first == [1] * MAX_FILTERS + [QUOTA_EXCEEDED] * (60 - MAX_FILTERS)  # per SUBSCRIBE
    second = sub.subscribe_many(2, [(f"cap/b{i}", 1) for i in range(50)]).codes()
    assert second == [1] * 50
    third = sub.subscribe_many(3, [(f"cap/c{i}", 1) for i in range(30)]).codes()
    assert third == [1] * 20 + [QUOTA_EXCEEDED] * 10  # the session holds 120 now
    assert sub.subscribe_many(4, [("cap/a0", 0)]).codes() == [0]  # a filter it holds is replaced, not added
    sub.close()

    old = RawFrom(legit(group), group.address(Role.PRIMARY), V311)
    assert old.connect("subscription-cap-311").reason_and_props()[0] == 0
    assert old.subscribe_many(1, [(f"cap311/{i}", 1) for i in range(55)]).codes() == [1] * 50 + [0x80] * 5
    old.close()


def test_a_subscribe_with_twelve_thousand_filters_gets_its_suback(group):
    """Past 10,000 filters one SUBSCRIBE's ops no longer fitted one spool commit: no SUBACK, the connection dropped."""
    sub = RawFrom(legit(group), group.address(Role.PRIMARY))
    assert sub.connect("many-filters").reason_and_props()[0] == 0
    codes = sub.subscribe_many(7, [(f"many/{i}", 0) for i in range(12_000)]).codes()
    assert codes == [0] * MAX_FILTERS + [QUOTA_EXCEEDED] * (12_000 - MAX_FILTERS)
    assert sub.barrier() == []  # still connected
    sub.close()


# --- a slow consumer's output -------------------------------------------------------

def test_a_subscriber_that_stops_reading_is_dropped_at_the_output_cap_and_keeps_its_qos1(group):
    primary = group.address(Role.PRIMARY)
    sub = RawFrom(legit(group), primary)
    assert sub.connect("slow-reader", clean=True, properties=[(0x11, 600)]).reason_and_props()[0] == 0
    assert sub.subscribe_many(1, [("slow/q0", 0), ("slow/q1", 1)]).codes() == [0, 1]
    stop = threading.Event()

    def trickle():  # reads slowly (~1 MiB/s): progress, so the write-stall timeout never fires; only the cap can drop it
        sub.sock.settimeout(0.2)
        while not stop.is_set():
            try:
                if not sub.sock.recv(65536):
                    return
            except socket.timeout:
                pass
            except OSError:
                return
            time.sleep(0.05)

    reader = threading.Thread(target=trickle, daemon=True)
    reader.start()
    pub = RawFrom(legit(group), primary)
    assert pub.connect("slow-publisher").reason_and_props()[0] == 0
    for i in range(1, 4):
        pub.publish("slow/q1", b"kept-%d" % i, qos=1, packet_id=i)
        pub.expect(PUBACK)
    payload = bytes(64 * 1024)
    for _ in range(320):  # 20 MiB of QoS 0: far past the cap and every kernel buffer on the way
        pub.publish("slow/q0", payload)
    assert pub.barrier() == []
    try:
        group.wait_for("the slow reader to be dropped", lambda: "slow-reader" not in client_ids(group))
        assert mqtt_view(group)["output_overflows"] == 1
    finally:
        stop.set()
        reader.join(5)
        sub.close()
    again = RawFrom(legit(group), primary)
    connack = again.connect("slow-reader", clean=False, properties=[(0x11, 600)])
    assert connack.type == CONNACK and connack.body[0] == 1  # session present: it kept its session
    got = set()
    while len(got) < 3:
        packet = again.recv()
        assert packet is not None, f"closed after {got}"
        topic, packet_id, _props, body = packet.publish()
        if topic == "slow/q1":
            got.add(body)
            again.ack(PUBACK, packet_id)
    assert got == {b"kept-1", b"kept-2", b"kept-3"}
    again.close()
    pub.close()


# --- a refusal flood in the event log -------------------------------------------

def test_a_refusal_flood_leaves_the_useful_events_and_counts_the_rest(group):
    backup = group.address(Role.BACKUP)
    decisions_before = group.decisions(Role.BACKUP)
    assert decisions_before
    flood = 1500
    for i in range(flood):  # the standby refuses every CONNECT (0x9C): one client_refused event each
        raw = RawFrom(attacker(group), backup)
        try:
            connack = raw.connect(f"flood-{i}")
            assert connack is not None and connack.reason_and_props()[0] == 0x9C
        finally:
            raw.close()

    def logged(events):
        return any(e["event"] == "events_suppressed" or e.get("client_id") == f"flood-{flood - 1}" for e in events)

    group.wait_for("the flood to reach the log", lambda: logged(group.events(Role.BACKUP)))
    assert group.decisions(Role.BACKUP)[:len(decisions_before)] == decisions_before  # nothing useful pushed out

    def summed():
        events = group.events(Role.BACKUP)
        written = [e for e in events if e["event"] == "client_refused" and e["client_id"].startswith("flood-")]
        suppressed = sum(e["by_source"].get(attacker(group), 0) for e in events
                         if e["event"] == "events_suppressed" and e["kind"] == "client_refused")
        return (len(written), suppressed) if len(written) + suppressed == flood else None

    written, suppressed = group.wait_for("every refusal to be written or counted", summed)
    assert suppressed > written  # most were summed, not written

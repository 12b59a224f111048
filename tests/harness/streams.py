"""Sequence-numbered QoS 1/2 streams through a PairMQ group, and the checker for S2 (DESIGN §8).

What counts, per persistent subscriber and per publisher (the rules `check` applies):
- A message is *acknowledged* once the publisher's paho client reported it published: PUBACK for
  QoS 1, PUBCOMP for QoS 2 (PUBREC alone is not counted; a publisher that keeps its session
  resends PUBREL after a failover, so a PUBREC'd message is PUBCOMP'd before the run ends).
- **Lost**: an acknowledged seq the subscriber never received. Must be zero.
- **Duplicate**: a seq received again after its first arrival. QoS 1 allows them (a PUBACK lost
  in a failover makes the publisher resend, and without message ids the new active stores it
  again), so they are counted and reported; for QoS 2 they must be zero.
- **Order violation**: a *first* arrival of seq s after the first arrival of some seq > s from
  the same publisher. Order is judged on first arrivals only: a QoS 1 redelivery of an earlier
  seq after a later one is a duplicate, not an order violation. Gaps are fine (an unacknowledged
  message may or may not arrive). Must be zero.
- **Refused**: a failure reason code (MQTT 5 PUBACK or PUBREC >= 0x80, e.g. 0x97 from a full spool) ends
  the exchange without the broker taking the message: not acknowledged, and not expected. Except PUBCOMP
  0x92 "packet identifier not found": a PUBREL resent after a failover whose PUBCOMP was lost finds the
  exchange already complete; the PUBREC had accepted the message, so it counts as acknowledged (stricter).
- **Unavailability** (`longest_gap`, the nemesis): the longest stretch of a window in which a publisher
  got no acknowledgement, from the times each publisher records as acknowledgements arrive.
- Unacknowledged messages may or may not arrive; a received seq that was never published is an
  error of its own (`unknown`).

Clients follow a host list (primary, backup): on a refused CONNACK (MQTT 5 0x9C "use another
server", 3.1.1 code 3), a refused TCP connect or a dropped connection they try the next host.
Sessions are persistent (MQTT 5 session expiry 1 h, 3.1.1 clean session off), so a publisher's
in-flight QoS 1/2 messages and a subscriber's queue and QoS 2 state move with them.

Clients can run inside a network namespace (`netns=`): paho's loop thread is started from a
thread that entered the namespace (`run_in_netns`), and threads inherit it, so every reconnect
stays there.
"""

from __future__ import annotations

import collections
import ctypes
import dataclasses
import os
import threading
import time
from collections.abc import Callable, Iterator

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

TOPIC_ROOT = "streams"
SESSION_EXPIRY_S = 3600
WINDOW = 20  # paho's in-flight window per publisher
PUBCOMP_ID_NOT_FOUND = 0x92
_CLONE_NEWNET = 0x40000000


class _PahoClient(mqtt.Client):
    """paho-mqtt 2.2's client with one QoS 2 sender bug fixed (these tests need it).

    On every reconnect attempt paho resets its outgoing messages: a QoS 2 message waiting for
    PUBCOMP becomes "resend PUBREL", and anything else becomes "resend PUBLISH". A second attempt
    before a CONNACK accepts it (a standby's refusal, a dead host: routine when following a host
    list through a failover) therefore turns "resend PUBREL" into "resend PUBLISH", and the client
    publishes again a message the broker already released (MQTT-4.3.3: the sender MUST NOT resend
    the PUBLISH once it sent the PUBREL) - a duplicate no broker can tell from a new message. Here
    the PUBREL owed stays owed however many attempts it takes.
    """

    def _messages_reconnect_reset_out(self) -> None:
        with self._out_message_mutex:
            for m in self._out_messages.values():
                if m.qos == 2 and m.state == mqtt.mqtt_ms_resend_pubrel:
                    m.state = mqtt.mqtt_ms_wait_for_pubcomp
        super()._messages_reconnect_reset_out()


class HostListClient:
    """One paho client with a persistent session that moves along a host list until a node serves it."""

    def __init__(self, client_id: str, hosts: list[str], *, v5: bool = True, keepalive_s: int = 2,
                 netns: str | None = None) -> None:
        self.client_id = client_id
        self.netns = netns
        self.hosts = list(hosts)
        self._next = 0
        self.connects: list[tuple[str, int]] = []  # (host, CONNACK code) in order, refusals included
        self.connected = threading.Event()
        protocol = mqtt.MQTTv5 if v5 else mqtt.MQTTv311
        self.v5 = v5
        kwargs = {} if v5 else {"clean_session": False}
        self.paho = _PahoClient(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=protocol, **kwargs)
        self.paho.max_inflight_messages_set(WINDOW)
        self.paho.max_queued_messages_set(0)  # unbounded: a publisher's backlog waits for a serving node
        self.paho.reconnect_delay_set(min_delay=0.1, max_delay=0.5)
        self.paho.on_connect = self._on_connect
        self.paho.on_disconnect = self._on_disconnect
        self.paho.on_connect_fail = lambda client, userdata: self._rotate()
        self._keepalive_s = keepalive_s

    def start(self, *, clean: bool = True) -> None:
        """Connect (in the background) to the current host; `clean=False` resumes the session."""
        if self.v5:
            props = Properties(PacketTypes.CONNECT)
            props.SessionExpiryInterval = SESSION_EXPIRY_S
            self.paho.connect_async(self.host, 1883, keepalive=self._keepalive_s, properties=props,
                                    clean_start=mqtt.MQTT_CLEAN_START_FIRST_ONLY if clean else False)
        else:
            self.paho.connect_async(self.host, 1883, keepalive=self._keepalive_s)
        run_in_netns(self.netns, self.paho.loop_start)

    def stop(self) -> None:
        self.paho.disconnect()
        self.paho.loop_stop()

    def wait_connected(self, timeout_s: float = 10) -> None:
        assert self.connected.wait(timeout_s), (f"{self.client_id}: no node of {self.hosts} served it within "
                                                f"{timeout_s} s; CONNACKs so far: {self.connects}")

    @property
    def host(self) -> str:
        return self.hosts[self._next]

    def _on_connect(self, client, userdata, flags, reason, props) -> None:
        code = reason.value if hasattr(reason, "value") else int(reason)
        self.connects.append((self.host, code))
        if code == 0:
            self.on_served()
            self.connected.set()
        # A refusal: the node closes the connection and _on_disconnect moves on to the next host.

    def _on_disconnect(self, client, userdata, flags, reason, props) -> None:
        self.connected.clear()
        self._rotate()

    def _rotate(self) -> None:
        self._next = (self._next + 1) % len(self.hosts)
        try:
            self.paho.host = self.hosts[self._next]
        except RuntimeError:  # paho refuses while its socket is still open; it is closing, and reconnects here
            self.paho._host = self.hosts[self._next]

    def on_served(self) -> None:
        """Called on the loop thread after each accepted CONNACK."""


class Publisher(HostListClient):
    """Publishes `count` seq-numbered messages at QoS `qos` to streams/<client_id>, `interval_s` apart.

    It hands paho a message only while connected, with fewer than WINDOW unacknowledged, and not
    between a reconnect and the first acknowledgement after it. paho resends its in-flight messages
    only after the CONNACK (and after calling on_connect), while a publish() from another thread
    goes out at once: without these gates a new message overtakes the resent older ones, and the
    checker would blame the broker for paho's reordering.
    """

    def __init__(self, client_id: str, hosts: list[str], qos: int, count: int, *, interval_s: float = 0.005,
                 v5: bool = True, netns: str | None = None) -> None:
        super().__init__(client_id, hosts, v5=v5, netns=netns)
        assert qos in (1, 2)
        self.qos, self.count, self.interval_s = qos, count, interval_s
        self.topic = f"{TOPIC_ROOT}/{client_id}"
        self._lock = threading.Lock()
        self._seq_of_mid: dict[int, int] = {}
        self.published: list[int] = []  # handed to paho
        self.acked: set[int] = set()
        self.ack_times: list[float] = []  # time.monotonic() of each acknowledgement (unavailability, nemesis)
        self.refused: dict[int, int] = {}  # seq -> the failure reason code it was answered with (0x97: full spool)
        self._halt = threading.Event()
        self._resending = False  # reconnected with messages in flight, no acknowledgement since
        self._early: set[int] = set()  # mids acknowledged before publish() returned them
        self._early_refused: dict[int, int] = {}  # those of them refused, with the reason code
        self.paho.on_publish = self._on_publish
        self._thread = threading.Thread(target=self._run, name=f"pub-{client_id}", daemon=True)

    def start(self) -> None:
        super().start()
        self.wait_connected()
        self._thread.start()

    def on_served(self) -> None:
        with self._lock:
            self._resending = len(self.published) > len(self.acked)

    def _may_publish(self) -> bool:
        with self._lock:
            in_flight = len(self.published) - len(self.acked)
        return self.connected.is_set() and not self._resending and in_flight < WINDOW

    def _run(self) -> None:
        for seq in range(self.count):
            while not self._may_publish() and not self._halt.is_set():
                time.sleep(0.002)
            if self._halt.is_set():
                self.count = seq  # what was handed to paho is all there is
                return
            with self._lock:
                self.published.append(seq)
            # Not under our lock: paho calls on_publish holding its own, which publish() takes too.
            info = self.paho.publish(self.topic, f"{self.client_id}:{seq}".encode(), qos=self.qos)
            with self._lock:
                if info.mid in self._early:  # its acknowledgement came back before publish() returned
                    self._early.discard(info.mid)
                    if code := self._early_refused.pop(info.mid, 0):
                        self.refused[seq] = code
                    else:
                        self.acked.add(seq)
                        self.ack_times.append(time.monotonic())
                else:
                    self._seq_of_mid[info.mid] = seq
            time.sleep(self.interval_s)

    def _on_publish(self, client, userdata, mid, reason, props) -> None:
        # A failure reason code (MQTT 5 PUBACK/PUBREC >= 0x80) ends the exchange without the message
        # being accepted: it is not acknowledged, and the checker must not expect it.
        refused = getattr(reason, "value", 0) if getattr(reason, "is_failure", False) else 0
        if refused == PUBCOMP_ID_NOT_FOUND:  # the PUBREC accepted it; see the module's rules
            refused = 0
        with self._lock:
            self._resending = False
            seq = self._seq_of_mid.pop(mid, None)
            if seq is None:
                self._early.add(mid)
                self._early_refused[mid] = refused
            elif refused:
                self.refused[seq] = refused
            else:
                self.acked.add(seq)
                self.ack_times.append(time.monotonic())

    def halt(self) -> None:
        """Publish nothing new; what paho holds still gets its acknowledgement."""
        self._halt.set()

    def done_publishing(self) -> bool:
        return not self._thread.is_alive()

    def all_acked(self) -> bool:
        with self._lock:
            return self.done_publishing() and len(self.acked) + len(self.refused) == self.count

    def ack_times_now(self) -> list[float]:
        with self._lock:
            return list(self.ack_times)

    def acked_now(self) -> set[int]:
        with self._lock:
            return set(self.acked)


class Subscriber(HostListClient):
    """A persistent subscriber to streams/# at QoS 2: each message arrives at min(its QoS, 2)."""

    def __init__(self, client_id: str, hosts: list[str], *, v5: bool = True, netns: str | None = None) -> None:
        super().__init__(client_id, hosts, v5=v5, netns=netns)
        self._lock = threading.Lock()
        self.received: list[tuple[str, int, int]] = []  # (publisher, seq, qos) in arrival order
        self.subscribed = threading.Event()
        self.paho.on_message = self._on_message
        self.paho.on_subscribe = lambda client, userdata, mid, codes, props: self.subscribed.set()

    def on_served(self) -> None:
        if not self.subscribed.is_set():  # once: the session keeps the subscription across nodes
            self.paho.subscribe(f"{TOPIC_ROOT}/#", qos=2)

    def _on_message(self, client, userdata, msg) -> None:
        publisher, _, seq = msg.payload.decode().rpartition(":")
        with self._lock:
            self.received.append((publisher, int(seq), msg.qos))

    def start(self) -> None:
        super().start()
        self.wait_connected()
        assert self.subscribed.wait(5), f"{self.client_id}: no SUBACK"

    def go_offline(self) -> None:
        """Disconnect and leave the session (and its queue) on the broker."""
        self.paho.disconnect()
        self.paho.loop_stop()
        self.connected.clear()

    def come_back(self) -> None:
        """Resume the session (same paho object: its QoS 2 receive state is kept) along the host list."""
        HostListClient.start(self, clean=False)
        self.wait_connected()

    def snapshot(self) -> list[tuple[str, int, int]]:
        with self._lock:
            return list(self.received)


@dataclasses.dataclass(frozen=True, slots=True)
class Report:
    scenario: str
    published: int
    acknowledged: int
    received: int  # distinct (publisher, seq) pairs, summed over subscribers
    lost: int
    duplicates_qos1: int
    duplicates_qos2: int
    order_violations: int
    unknown: int
    details: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not (self.lost or self.duplicates_qos2 or self.order_violations or self.unknown)

    def line(self) -> str:
        return (f"{self.scenario}: published {self.published}, acknowledged {self.acknowledged}, received "
                f"{self.received}, lost {self.lost}, duplicates {self.duplicates_qos2} (QoS 2) "
                f"{self.duplicates_qos1} (QoS 1, allowed), order violations {self.order_violations}"
                + (f", unknown {self.unknown}" if self.unknown else ""))

    def __str__(self) -> str:
        return "\n  ".join((self.line(), *self.details[:8]))


def check(scenario: str, publishers: list[Publisher], subscribers: list[Subscriber]) -> Report:
    """Apply the module's rules to what each subscriber received from each publisher."""
    published = sum(len(p.published) for p in publishers)
    acked_of = {p.client_id: p.acked_now() for p in publishers}
    sent_of = {p.client_id: set(p.published) for p in publishers}
    qos_of = {p.client_id: p.qos for p in publishers}
    counts = collections.Counter()
    details: list[str] = []
    for sub in subscribers:
        by_publisher: dict[str, list[int]] = collections.defaultdict(list)
        for publisher, seq, _qos in sub.snapshot():
            by_publisher[publisher].append(seq)
        for publisher, seqs in by_publisher.items():
            if publisher not in sent_of:
                counts["unknown"] += len(seqs)
                details.append(f"{sub.client_id} got {len(seqs)} messages from unknown publisher {publisher!r}")
        for name, acked in acked_of.items():
            seen: set[int] = set()
            highest = -1
            for seq in by_publisher.get(name, []):
                if seq not in sent_of[name]:
                    counts["unknown"] += 1
                    details.append(f"{sub.client_id} got {name}:{seq}, never published")
                elif seq in seen:
                    counts[f"dup{qos_of[name]}"] += 1
                    if qos_of[name] == 2:
                        details.append(f"{sub.client_id} got QoS 2 {name}:{seq} again")
                else:
                    if seq < highest:
                        counts["order"] += 1
                        details.append(f"{sub.client_id} got {name}:{seq} first after {name}:{highest}")
                    seen.add(seq)
                    highest = max(highest, seq)
            counts["received"] += len(seen)
            missing = sorted(acked - seen)
            counts["lost"] += len(missing)
            if missing:
                details.append(f"{sub.client_id} never got {len(missing)} acknowledged from {name}: {missing[:10]}")
    return Report(scenario, published, sum(len(a) for a in acked_of.values()), counts["received"], counts["lost"],
                  counts["dup1"], counts["dup2"], counts["order"], counts["unknown"], tuple(details))


def runs(seqs: list[int]) -> str:
    """Arrival order as runs of consecutive seqs: "0-115 242-260 116-241" (for failure messages)."""
    out: list[str] = []
    for seq in seqs:
        if out and out[-1][1] + 1 == seq:
            out[-1][1] = seq
        else:
            out.append([seq, seq])
    return " ".join(f"{a}-{b}" if a != b else f"{a}" for a, b in out)


def arrivals(subscribers: list[Subscriber]) -> str:
    lines = []
    for sub in subscribers:
        by_publisher: dict[str, list[int]] = collections.defaultdict(list)
        for publisher, seq, _qos in sub.snapshot():
            by_publisher[publisher].append(seq)
        lines += [f"{sub.client_id} from {name}: {runs(seqs)}" for name, seqs in sorted(by_publisher.items())]
    return "\n".join(lines)


def wait_until(what: str, predicate: Callable[[], bool], timeout_s: float, on_timeout: Callable[[], str] = str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}\n{on_timeout()}")


def everything_delivered(publishers: list[Publisher], subscribers: list[Subscriber]) -> bool:
    """Each subscriber holds every acknowledged message of every publisher."""
    for sub in subscribers:
        got = {(p, s) for p, s, _ in sub.snapshot()}
        for pub in publishers:
            if any((pub.client_id, seq) not in got for seq in pub.acked_now()):
                return False
    return True


def settle(publishers: list[Publisher], subscribers: list[Subscriber], timeout_s: float,
           stall_s: float | None = None) -> None:
    """Wait (at most `timeout_s`) for every publisher's acknowledgements and every subscriber to catch up.

    With `stall_s`, stop waiting for the subscribers early only once none of them received anything for
    that long: a resumed subscriber draining a long backlog on a loaded machine is slow, not missing.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not all(p.all_acked() for p in publishers):
        time.sleep(0.05)
    received, progress_at = -1, time.monotonic()
    while time.monotonic() < deadline and not everything_delivered(publishers, subscribers):
        now_received = sum(len(sub.snapshot()) for sub in subscribers)
        if now_received != received:
            received, progress_at = now_received, time.monotonic()
        elif stall_s is not None and time.monotonic() - progress_at > stall_s:
            break
        time.sleep(0.05 if stall_s is None else 0.5)
    time.sleep(0.3)  # late redeliveries (duplicates) count too


def longest_gap(times: list[float], start: float, end: float) -> float:
    """Unavailability as one publisher saw it: the longest stretch of [start, end] without an acknowledgement.

    `times` are sorted acknowledgement instants; the stretch before the first acknowledgement inside
    the window counts from `start`, the one after the last counts to `end`.
    """
    inside = [t for t in times if start < t < end]
    edges = [start, *inside, end]
    return max(b - a for a, b in zip(edges, edges[1:]))


def finish(scenario: str, publishers: list[Publisher], subscribers: list[Subscriber], *,
           timeout_s: float = 15, describe: Callable[[], str] = str) -> Report:
    """Let every publisher get its acknowledgements and every subscriber catch up, then check.

    A publisher that cannot finish within the timeout is fine (what it never got acknowledged may
    or may not arrive); a subscriber still missing acknowledged messages then is what `check` reports.
    """
    settle(publishers, subscribers, timeout_s)
    report = check(scenario, publishers, subscribers)
    print(report.line())
    for client in (*publishers, *subscribers):
        client.stop()
    assert report.ok, f"{report}\n{arrivals(subscribers)}\n{describe()}"
    return report


def streams(hosts: list[str], *, qos1: int = 1, qos2: int = 2, count: int = 200, interval_s: float = 0.005,
            tag: str = "", netns: str | None = None) -> list[Publisher]:
    """`qos1` QoS 1 and `qos2` QoS 2 publishers of `count` messages each; the first QoS 2 one speaks 3.1.1."""
    pubs = [Publisher(f"q1{tag}-{i}", hosts, 1, count, interval_s=interval_s, netns=netns) for i in range(qos1)]
    pubs += [Publisher(f"q2{tag}-{i}", hosts, 2, count, interval_s=interval_s, v5=i != 0, netns=netns)
             for i in range(qos2)]
    return pubs


def run_in_netns(name: str | None, fn: Callable[[], object]) -> object:
    """fn() on a thread inside network namespace `name` (None: here, at once); threads it starts stay there."""
    if name is None:
        return fn()
    libc = ctypes.CDLL(None, use_errno=True)
    result: dict = {}

    def body() -> None:
        try:
            fd = os.open(f"/run/netns/{name}", os.O_RDONLY)
            try:
                if libc.setns(fd, _CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), f"setns into network namespace {name} failed")
            finally:
                os.close(fd)
            result["value"] = fn()
        except BaseException as exc:  # handed to the caller's thread
            result["error"] = exc

    thread = threading.Thread(target=body, name=f"netns-{name}")
    thread.start()
    thread.join()
    if "error" in result:
        raise result["error"]
    return result.get("value")

"""A seeded, deterministic simulator for one broker node: the sans-I/O BrokerCore, its spool as
the reference StateModel, group commits that finish late, crashes, and MQTT clients that follow
the spec (resend unacknowledged PUBLISHes with DUP on reconnect, deduplicate QoS 2 by packet id).

Theory of operation
-------------------
Every step picks one action with the schedule's random generator: a publisher publishes (QoS 0, 1
or 2), a client reads what the broker sent it and owes acks, a client sends the acks it owes
(late, in order), the spool commits the oldest pending group(s), a connection is lost, an
offline client reconnects with its session, time moves, or the node crashes. A crash keeps only
committed ops: a fresh core is restored from them, exactly as the node restarts from its spool,
and every connection is gone. Commits finish in submission order, as the real writer's do.

At the end the schedule heals (no more crashes or losses), everyone reconnects and every ack is
sent until nothing moves, and the checks run:

  S2 (one node)  every message a publisher got PUBACK/PUBREC success for reaches every
                 subscriber whose subscription matched, at least once;
  exactly once   no subscriber application sees a QoS 2 message twice;
  order          per publisher, subscriber and QoS, first deliveries keep the publish order;
  refusals       a refused publish (reason >= 0x80) was never acknowledged;
  message ids    MQTT 5 publishers put a `pairmq-msg-id` on some QoS 1/2 publishes and, after a
                 reconnect, sometimes retransmit acknowledged ones as new PUBLISHes (new packet
                 id, same id), as the host-list client does after a failover: no (publisher, id)
                 is ever stored as two messages, so no subscription gets it twice (at most once;
                 S2 above makes it exactly once when acknowledged);
and no input ever raises out of the core.
"""

from __future__ import annotations

import dataclasses
import random

from pairmq.appliance.broker.core import BrokerCore, Close, Limits, Persist, Send, restore
from pairmq.appliance.broker.dedup import PROPERTY as MSG_ID
from pairmq.appliance.broker.routing import decode_stored_properties
from pairmq.appliance.mqtt import codec
from pairmq.appliance.mqtt.properties import PropertyId as P
from pairmq.appliance.spool import ops
from pairmq.appliance.spool.chain import GENESIS
from pairmq.appliance.spool.state import StateModel
from tests.harness.broker_effects import EffectRunner

EXPIRY = {P.SESSION_EXPIRY_INTERVAL: 3600}
TOPICS = ("cars/1/door", "cars/2/door", "pay/eu", "pay/us")
FILTERS = (("cars/+/door", 2), ("pay/#", 2), ("cars/#", 1), ("#", 2))
MAX_PUBLISHER_WINDOW = 20


@dataclasses.dataclass
class SimClient:
    name: str
    version: int
    filters: tuple = ()
    conn: int | None = None
    connected: bool = False  # CONNACK received on `conn`
    inbox: list = dataclasses.field(default_factory=list)
    owed: list = dataclasses.field(default_factory=list)  # acks to send, in order
    # publisher side
    seq: int = 0
    next_pid: int = 1
    unacked: dict = dataclasses.field(default_factory=dict)  # pid -> [Publish, "sent" | "pubrec"]
    acknowledged: list = dataclasses.field(default_factory=list)  # (payload, qos, topic)
    refused: list = dataclasses.field(default_factory=list)
    with_ids: list = dataclasses.field(default_factory=list)  # acknowledged PUBLISHes carrying a message id
    retransmits: int = 0
    # subscriber side
    qos2_pending: set = dataclasses.field(default_factory=set)  # packet ids PUBREC'd, PUBREL not yet
    delivered: list = dataclasses.field(default_factory=list)  # (payload, qos) in application order


class SimFailure(AssertionError):
    pass


class BrokerSim(EffectRunner):
    def __init__(self, seed: int, *, clients: int = 4, limits: Limits = Limits()) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.limits = limits
        self.now = 1_700_000_000_000
        self.committed = StateModel()
        self.seq = 0
        self.pending: list[Persist] = []
        self.core = BrokerCore(limits=limits)
        self.next_conn = 0
        self.crashes = 0
        self.steps = 0
        self.clients = [SimClient(f"c{i}", self.rng.choice((4, 5)),
                                  tuple(self.rng.sample(FILTERS, self.rng.randint(1, 2))))
                        for i in range(clients)]
        self.trace: list[str] = []
        self.stored_ids: dict[tuple[str, str], dict[int, int]] = {}  # (publisher, id) -> {msg_id: op seq}

    # --- the adapter: effects in order, commits late -------------------------------------

    def on_send(self, e: Send) -> None:
        client = self._client_on(e.conn)
        if client is not None:
            client.inbox.append(e.packet)

    def on_close(self, e: Close) -> None:
        client = self._client_on(e.conn)
        if client is not None:
            self._gone(client)

    def on_persist(self, e: Persist) -> None:
        self.pending.append(e)

    def _client_on(self, conn: int) -> SimClient | None:
        return next((c for c in self.clients if c.conn == conn), None)

    def commit(self, groups: int) -> None:
        for _ in range(min(groups, len(self.pending))):
            persist = self.pending.pop(0)
            for op in persist.ops:
                self.seq += 1
                if not self.committed.apply(self.seq, op):
                    raise SimFailure(f"the spool ignored op {self.seq}: {op}")
                if isinstance(op, (ops.MessageStored, ops.MessageRouted)):
                    self.note_stored(op, self.seq)
            self.run(persist.then)

    def crash(self) -> None:
        self.crashes += 1
        self.pending.clear()
        for c in self.clients:
            self._gone(c)
        self.core = BrokerCore(limits=self.limits)
        # The head's seq matters: message ids restart above it, as they do from the real spool.
        restore(self.core, self.committed.state(dataclasses.replace(GENESIS, seq=self.seq)), self.now)

    # --- clients -----------------------------------------------------------------------------

    def _gone(self, c: SimClient) -> None:
        c.conn, c.connected = None, False
        c.inbox.clear()
        c.owed.clear()  # acks for a dead connection are never sent; the broker resends instead

    def connect(self, c: SimClient, *, clean: bool = False) -> None:
        self.next_conn += 1
        c.conn = self.next_conn
        props = EXPIRY if c.version == 5 else {}
        self.run(self.core.connect(c.conn, codec.Connect(c.version, c.name, clean, 60, None, None, None, props),
                                   self.now))

    def lose(self, c: SimClient) -> None:
        conn = c.conn
        self._gone(c)
        self.run(self.core.connection_lost(conn, self.now))

    def send(self, c: SimClient, packet) -> None:
        self.run(self.core.packet(c.conn, packet, self.now))

    def publish(self, c: SimClient) -> None:
        qos = self.rng.choice((0, 1, 1, 2, 2))
        c.seq += 1
        payload = f"{c.name}:{c.seq}".encode()
        topic = self.rng.choice(TOPICS)
        if qos == 0:
            self.send(c, codec.Publish(topic, payload, 0))
            return
        pid = c.next_pid
        c.next_pid = c.next_pid % 65535 + 1
        props = {P.USER_PROPERTY: ((MSG_ID, f"id-{c.name}:{c.seq}"),)} \
            if c.version == 5 and self.rng.random() < 0.5 else {}
        packet = codec.Publish(topic, payload, qos, packet_id=pid, properties=props)
        c.unacked[pid] = [packet, "sent"]
        self.send(c, packet)

    def read(self, c: SimClient) -> None:
        """Handle everything the broker sent, like a spec-following client library."""
        inbox, c.inbox = c.inbox, []
        for packet in inbox:
            name = type(packet).__name__
            if not c.connected and name != "Connack":
                raise SimFailure(f"{c.name} got {name} before its CONNACK (MQTT: CONNACK comes first)")
            if name == "Connack":
                if packet.reason_code != 0:
                    raise SimFailure(f"{c.name}: CONNACK 0x{packet.reason_code:02X}")
                c.connected = True
                for pid, (pub, stage) in sorted(c.unacked.items()):
                    c.owed.append(codec.Pubrel(pid) if stage == "pubrec" else dataclasses.replace(pub, dup=True))
                self._retransmit(c)
            elif name == "Publish":
                self._deliver(c, packet)
            elif name == "Pubrel":
                c.qos2_pending.discard(packet.packet_id)
                c.owed.append(codec.Pubcomp(packet.packet_id))
            elif name in ("Puback", "Pubrec"):
                self._publisher_ack(c, packet, name)
            elif name == "Pubcomp":
                c.unacked.pop(packet.packet_id, None)
            elif name in ("Suback", "Disconnect"):
                pass
            else:
                raise SimFailure(f"{c.name} got an unexpected {packet!r}")

    def _deliver(self, c: SimClient, p) -> None:
        if p.qos == 2:
            if p.packet_id not in c.qos2_pending:  # a resend of one we have is not a new message
                c.qos2_pending.add(p.packet_id)
                c.delivered.append((p.payload, 2))
            c.owed.append(codec.Pubrec(p.packet_id))
            return
        c.delivered.append((p.payload, p.qos))
        if p.qos == 1:
            c.owed.append(codec.Puback(p.packet_id))

    def _publisher_ack(self, c: SimClient, packet, name: str) -> None:
        entry = c.unacked.get(packet.packet_id)
        if entry is None:
            return
        pub = entry[0]
        if packet.reason_code >= 0x80:
            c.refused.append(pub.payload)
            del c.unacked[packet.packet_id]
            return
        if entry[1] == "sent" and pub.properties and not pub.dup:
            c.with_ids.append(pub)
        if name == "Puback":
            del c.unacked[packet.packet_id]
            c.acknowledged.append((pub.payload, 1, pub.topic))
        else:
            if entry[1] == "sent":
                c.acknowledged.append((pub.payload, 2, pub.topic))
            entry[1] = "pubrec"
            c.owed.append(codec.Pubrel(packet.packet_id))

    def _retransmit(self, c: SimClient) -> None:
        """After a reconnect, maybe publish some acknowledged id-carrying messages again under new packet
        ids (the host-list client after a failover: it cannot tell which acks it missed)."""
        if not c.with_ids or self.rng.random() < 0.5:
            return
        for pub in self.rng.sample(c.with_ids[-6:], min(len(c.with_ids), self.rng.randint(1, 3))):
            pid = c.next_pid
            c.next_pid = c.next_pid % 65535 + 1
            again = dataclasses.replace(pub, packet_id=pid, dup=True)  # dup marks "a retransmit" for _publisher_ack
            c.unacked[pid] = [again, "sent"]
            c.owed.append(dataclasses.replace(again, dup=False))
            c.retransmits += 1

    def note_stored(self, op, seq: int) -> None:
        """A committed MessageStored (op `seq`): a (publisher, message id) must never be stored twice."""
        props = decode_stored_properties(op.properties) if op.properties else {}
        for key, value in props.get(P.USER_PROPERTY, ()):
            if key == MSG_ID:
                stored = self.stored_ids.setdefault((op.publisher, value), {})
                stored[op.msg_id] = seq
                if len(stored) > 1:
                    raise SimFailure(f"message id {value!r} of {op.publisher} stored as messages {sorted(stored)}")

    def send_owed(self, c: SimClient, count: int) -> None:
        for _ in range(min(count, len(c.owed))):
            if c.conn is None:
                return
            self.send(c, c.owed.pop(0))

    # --- schedules -----------------------------------------------------------------------------

    def setup(self) -> None:
        for c in self.clients:
            self.connect(c, clean=False)  # 3.1.1: clean session off is what makes the session persistent
            self.commit(len(self.pending))
            self.read(c)
            self.send(c, codec.Subscribe(1, tuple(codec.Subscription(f, q) for f, q in c.filters), {}))
            self.commit(len(self.pending))
            self.read(c)
        self.subscribed = {c.name: c.filters for c in self.clients}

    def step(self) -> None:
        self.steps += 1
        rng = self.rng
        c = rng.choice(self.clients)
        roll = rng.random()
        action = "idle"
        if c.conn is None:
            if roll < 0.5:
                action = "connect"
                self.connect(c)
            elif roll < 0.55:
                action = "commit"
                self.commit(rng.randint(1, 3))
        elif roll < 0.30:
            if c.connected and not c.owed and len(c.unacked) < MAX_PUBLISHER_WINDOW:  # resends go first
                action = "publish"
                self.publish(c)
        elif roll < 0.50:
            action = "read"
            self.read(c)
        elif roll < 0.65:
            action = "send acks"
            self.send_owed(c, rng.randint(1, 4))
        elif roll < 0.88:
            action = "commit"
            self.commit(rng.randint(1, 3))
        elif roll < 0.93:
            action = "lose connection"
            self.lose(c)
        elif roll < 0.97:
            action = "tick"
            self.now += rng.randint(1, 2000)
            self.run(self.core.tick(self.now))
        elif roll < 0.985:
            action = "CRASH"
            self.crash()
        self.trace.append(f"{self.steps:4d} {c.name} {action:15s} pending={len(self.pending)} "
                          f"sessions={self._status()}")
        del self.trace[:-40]  # the last steps are what a failure report needs

    def status(self) -> str:
        return f"{len(self.pending)} commits pending"

    def _status(self) -> str:
        return " ".join(f"{cid}:{len(s.queue)}q/{sum(1 for e in s.queue if e.packet_id)}f"
                        for cid, s in sorted(self.core.sessions.items()))

    def heal(self, max_rounds: int = 200) -> None:
        """No more faults: everyone reconnects, reads and acks until nothing moves."""
        for _ in range(max_rounds):
            for c in self.clients:
                if c.conn is None:
                    self.connect(c)
            self.commit(len(self.pending))
            for c in self.clients:
                self.read(c)
                self.send_owed(c, len(c.owed))
            self.commit(len(self.pending))
            if not self.pending and all(not c.inbox and not c.owed and not c.unacked for c in self.clients):
                return
        raise SimFailure("the schedule did not settle: " + "; ".join(
            f"{c.name} unacked={sorted(c.unacked)} owed={len(c.owed)}" for c in self.clients))

    def check(self) -> None:
        for sub in self.clients:
            seen: dict[bytes, int] = {}
            for payload, _ in sub.delivered:
                seen[payload] = seen.get(payload, 0) + 1
            for pub in self.clients:
                for payload, qos, topic in pub.acknowledged:
                    grants = [q for f, q in self.subscribed[sub.name] if topic_matches(f, topic)]
                    if not grants:
                        continue
                    if payload not in seen:
                        raise SimFailure(f"S2: {pub.name} was acknowledged {payload!r} (QoS {qos}, {topic}); "
                                         f"{sub.name} never got it")
                    if qos == 2 and max(grants) == 2 and seen[payload] > 1:
                        raise SimFailure(f"QoS 2 {payload!r} reached {sub.name} {seen[payload]} times")
                refused = set(pub.refused) & {p for p, _, _ in pub.acknowledged}
                if refused:
                    raise SimFailure(f"{pub.name}: refused yet acknowledged: {sorted(refused)}")
            self._check_order(sub)

    def _check_order(self, sub: SimClient) -> None:
        firsts: dict[tuple[str, int], list[int]] = {}
        seen = set()
        for payload, qos in sub.delivered:
            if payload in seen:
                continue
            seen.add(payload)
            publisher, number = payload.decode().split(":")
            firsts.setdefault((publisher, qos), []).append(int(number))
        for (publisher, qos), numbers in firsts.items():
            if numbers != sorted(numbers):
                raise SimFailure(f"order: {sub.name} got {publisher}'s QoS {qos} messages as {numbers}")


def topic_matches(topic_filter: str, topic: str) -> bool:
    """The test's own matcher (an oracle independent of the broker's trie); no `$` topics here."""
    f, t = topic_filter.split("/"), topic.split("/")
    for i, level in enumerate(f):
        if level == "#":
            return True
        if i >= len(t) or (level != "+" and level != t[i]):
            return False
    return len(f) == len(t)


def run_schedule(seed: int, steps: int = 400, sim_class: type = None) -> BrokerSim:
    """One seeded schedule of `sim_class` (BrokerSim by default); a failure names the seed and the last steps."""
    sim = (sim_class or BrokerSim)(seed)
    try:
        sim.setup()
        for _ in range(steps):
            sim.step()
        sim.heal()
        sim.check()
    except Exception as exc:
        trace = "\n".join(sim.trace)
        raise SimFailure(f"seed {seed}, step {sim.steps}, crashes {sim.crashes}, {sim.status()}: {exc}\n"
                         f"last steps:\n{trace}") from exc
    return sim

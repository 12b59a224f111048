"""What applying ops means: the spool's state and the rules, as a pure in-memory model.

Rules (the SQLite store implements exactly these; tests compare the two):
- Application is total and deterministic: every op applies to every state, and
  an op whose preconditions fail is a no-op (counted as `ignored`, a broker bug
  worth a look, never an error). So replaying the op log from empty always
  rebuilds the same state, whatever the batch boundaries were.
- `MessageRouted` applies as `MessageStored` then `MessageQueued` (ops.py); it counts as ignored
  if either part is a no-op.
- Messages: `MessageStored` adds a body (a second one with the same msg_id is
  ignored). Queue entries, retained topics and wills each hold one reference to
  a body; an entry whose PUBREC arrived holds none (the body is not needed to
  send PUBREL). A body is deleted when its reference count drops to 0, so the
  broker emits `MessageStored` together with the op taking its first reference.
- Ops that name a session (`MessageQueued`, `Subscribed`, `InboundQos2Received`,
  `WillSet`, `SessionDisconnected`, `SessionDeleted`) are ignored if it does not
  exist; ops that take a reference are ignored if the body does not exist.
- Queues: `MessageQueued` appends (client, msg_id) unless already queued; the
  entry's `order` is the op's seq. `MessageInflight` sets the packet id and
  `MessagePubrecReceived` marks the entry (both only before PUBREC);
  `MessageAcked`/`MessageDropped` remove it. `SessionDeleted` removes the
  session with its subscriptions, queue, QoS 2 packet ids and will.
- `SessionOpened` upserts: connected, `disconnected_at_ms` back to 0; the
  owner stays. `SessionOwned` sets the owner of an existing session (None
  until one is set: a session from before owners, see docs/broker.md).
- `RetainedSet`/`WillSet` replace (the earlier body loses its reference).
- Message-id history keeps the newest `max_message_ids` (client id, message id)
  pairs by the seq of their last `MessageIdSeen`; the oldest goes when a new
  pair would exceed the bound. It is only counted: the time window is the
  broker's (appliance/broker/dedup.py), which ignores what is too old.
- `stored_bytes` is the sum of the encoded `MessageStored` sizes of the bodies
  present: what the spool's byte limit counts.
- Domains (`check_op`, enforced when ops are submitted and verified when the
  state is loaded, so a damaged row is noticed): QoS and retain handling are
  0..2, protocol versions 3..5, packet ids 1..65535 (domains.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from ._opcodec import encode_op
from .chain import GENESIS, ChainPoint
from .domains import MAX_BATCH_ITEMS, PACKET_IDS, PROTOCOL_VERSIONS, QOS, RETAIN_HANDLING, check_op
from .ops import (
    InboundQos2Received, InboundQos2Released, MessageAcked, MessageDropped, MessageIdSeen, MessageInflight,
    MessagePubrecReceived, MessageQueued, MessageRouted, MessageStored, MessagesAcked, MessagesInflight, Op,
    RetainedCleared, RetainedSet, SessionDeleted, SessionDisconnected, SessionOpened, SessionOwned, Subscribed,
    Unsubscribed, WillCleared, WillSet,
)
from .varints import encode_uints

__all__ = ["DEFAULT_MAX_MESSAGE_IDS", "MAX_BATCH_ITEMS", "PACKET_IDS", "PROTOCOL_VERSIONS", "QOS", "RETAIN_HANDLING",
           "QueueEntry", "Session", "SpoolState", "StateModel", "check_op", "stored_size", "stored_size_of"]

DEFAULT_MAX_MESSAGE_IDS: Final = 100_000


@dataclass(slots=True, init=False, unsafe_hash=True)
class QueueEntry:
    msg_id: Final[int]
    qos: Final[int]
    retain: Final[bool]
    subscription_ids: Final[tuple[int, ...]]
    order: Final[int]  # the seq of its MessageQueued: queues are in this order
    packet_id: Final[int]  # 0: not sent yet
    pubrec_received: Final[bool]

    def __init__(self, msg_id: int, qos: int, retain: bool, subscription_ids: tuple[int, ...], order: int,
                 packet_id: int = 0, pubrec_received: bool = False) -> None:
        self.msg_id = msg_id
        self.qos = qos
        self.retain = retain
        self.subscription_ids = subscription_ids
        self.order = order
        self.packet_id = packet_id
        self.pubrec_received = pubrec_received


@dataclass(slots=True, init=False, unsafe_hash=True)
class Session:
    client_id: Final[str]
    protocol_version: Final[int]
    expiry_s: Final[int]
    connected_at_ms: Final[int]
    disconnected_at_ms: Final[int]  # 0 while connected
    connected: Final[bool]  # as of the last op; after a restart no connection survives
    subscriptions: Final[tuple[Subscribed, ...]]  # by topic filter
    queue: Final[tuple[QueueEntry, ...]]  # in order
    inbound_qos2: Final[tuple[int, ...]]  # packet ids, ascending
    will: Final[WillSet | None]
    owner: Final[str | None]  # "" anonymous; None: made before sessions had owners

    def __init__(self, client_id: str, protocol_version: int, expiry_s: int, connected_at_ms: int,
                 disconnected_at_ms: int, connected: bool, subscriptions: tuple[Subscribed, ...] = (),
                 queue: tuple[QueueEntry, ...] = (), inbound_qos2: tuple[int, ...] = (), will: WillSet | None = None,
                 owner: str | None = None) -> None:
        self.client_id = client_id
        self.protocol_version = protocol_version
        self.expiry_s = expiry_s
        self.connected_at_ms = connected_at_ms
        self.disconnected_at_ms = disconnected_at_ms
        self.connected = connected
        self.subscriptions = subscriptions
        self.queue = queue
        self.inbound_qos2 = inbound_qos2
        self.will = will
        self.owner = owner


@dataclass(slots=True, init=False, unsafe_hash=True)
class SpoolState:
    """Everything the broker rebuilds from at start-up (and a standby's snapshot)."""

    head: Final[ChainPoint]
    sessions: Final[dict[str, Session]]
    messages: Final[dict[int, MessageStored]]  # bodies, shared by queue entries, retained topics and wills
    retained: Final[dict[str, int]]  # topic -> msg_id
    message_ids: Final[tuple[tuple[str, str, int], ...]]  # (client id, message id, seen_at_ms), oldest first
    stored_bytes: Final[int]

    def __init__(self, head: ChainPoint, sessions: dict[str, Session], messages: dict[int, MessageStored],
                 retained: dict[str, int], message_ids: tuple[tuple[str, str, int], ...], stored_bytes: int) -> None:
        self.head = head
        self.sessions = sessions
        self.messages = messages
        self.retained = retained
        self.message_ids = message_ids
        self.stored_bytes = stored_bytes

    @property
    def position(self) -> tuple[int, int]:
        return self.head.epoch, self.head.seq


def stored_size(body: bytes) -> int:
    """What one stored body counts against the byte limit: its encoded `MessageStored`."""
    return len(body)


def stored_size_of(op: Op, encoded_bytes: int) -> int:
    """What the body an op stores counts (`stored_size`), from the op and its encoded length; 0 for an op that
    stores none. A `MessageRouted` counts as its MessageStored: without its queue entry's fields."""
    if type(op) is MessageStored:
        return encoded_bytes
    if type(op) is not MessageRouted:
        return 0
    cid = len(op.client_id) if op.client_id.isascii() else len(op.client_id.encode())
    ids = op.subscription_ids
    return encoded_bytes - (_varint_bytes(cid) + cid + 2 + (len(encode_uints(ids)) if ids else 1))


def _varint_bytes(n: int) -> int:
    return 1 if n < 0x80 else (n.bit_length() + 6) // 7


class _Session:
    """A session as the model holds it: its record and what it owns, by key."""

    def __init__(self, record: Session) -> None:
        self.record = record
        self.subscriptions: dict[str, Subscribed] = {}
        self.queue: dict[int, QueueEntry] = {}  # msg_id -> entry, in order
        self.inbound_qos2: set[int] = set()
        self.will: WillSet | None = None


class _Stored:
    """A stored body as the model holds it: the op, how many holders refer to it, what it counts in bytes."""

    def __init__(self, op: MessageStored, size: int) -> None:
        self.op = op
        self.refs = 0
        self.size = size


class StateModel:
    """The rules above over plain dicts: the spool's live state (store.py), replayed from its files at open."""

    def __init__(self, max_message_ids: int = DEFAULT_MAX_MESSAGE_IDS) -> None:
        self.max_message_ids = max_message_ids
        self.sessions: dict[str, _Session] = {}
        # msg_id -> its body, holders and size: one dict entry per stored message (every op of a durable message
        # looks it up on both nodes, at each group commit)
        self._stored: dict[int, _Stored] = {}
        self.retained: dict[str, int] = {}
        self.message_ids: dict[tuple[str, str], int] = {}  # insertion order is seq order
        self.stored_bytes = 0
        self.ignored = 0
        self.head = GENESIS
        self._size = 0  # the encoded size of the MessageStored being applied (0: encode it to know)

    @property
    def messages(self) -> dict[int, MessageStored]:
        """The stored bodies by msg_id (a copy)."""
        return {msg_id: stored.op for msg_id, stored in self._stored.items()}

    def apply(self, seq: int, op: Op, size: int = 0) -> bool:
        """Apply one op (the seq it has in the log; `size`, if known, its encoded length); False if it was a
        no-op by the rules."""
        self._size = size
        applied = self._apply(seq, op)
        if not applied:
            self.ignored += 1
        return applied

    def apply_all(self, first_seq: int, ops: tuple[Op, ...], sizes: tuple[int, ...]) -> None:
        """`apply` each of `ops` (seqs from `first_seq` on, encoded sizes `sizes`): one call per group commit."""
        seq = first_seq
        for i in range(len(ops)):
            self._size = sizes[i]
            if not self._apply(seq, ops[i]):
                self.ignored += 1
            seq += 1

    def _apply(self, seq: int, op: Op) -> bool:
        # A durable message's ops first (one MessageRouted, then its in-flight mark and its ack).
        if type(op) is MessageRouted:
            return self._message_routed(seq, op)
        if type(op) is MessagesInflight:
            return self._messages_inflight(op)
        if type(op) is MessagesAcked:
            return self._messages_acked(op)
        if type(op) is MessageIdSeen:
            return self._message_id_seen(op)
        if type(op) is MessageStored:
            return self._message_stored(op)
        if type(op) is MessageQueued:
            return self._message_queued(seq, op)
        if type(op) is MessageInflight:
            return self._message_inflight(op)
        if type(op) is MessagePubrecReceived:
            return self._message_pubrec_received(op)
        if type(op) is MessageAcked or type(op) is MessageDropped:
            return self._remove_entry(op.client_id, op.msg_id)
        if type(op) is SessionOpened:
            return self._session_opened(op)
        if type(op) is SessionOwned:
            return self._session_owned(op)
        if type(op) is SessionDisconnected:
            return self._session_disconnected(op)
        if type(op) is SessionDeleted:
            return self._session_deleted(op)
        if type(op) is Subscribed:
            return self._subscribed(op)
        if type(op) is Unsubscribed:
            s = self.sessions.get(op.client_id)
            return s is not None and s.subscriptions.pop(op.topic_filter, None) is not None
        if type(op) is RetainedSet:
            return self._retained_set(op)
        if type(op) is RetainedCleared:
            return self._retained_cleared(op)
        if type(op) is InboundQos2Received:
            return self._inbound_qos2_received(op)
        if type(op) is InboundQos2Released:
            return self._inbound_qos2_released(op)
        if type(op) is WillSet:
            return self._will_set(op)
        if type(op) is WillCleared:
            return self._will_cleared(op)
        raise AssertionError(f"{type(op).__name__} is not an op")

    def state(self, head: ChainPoint | None = None) -> SpoolState:
        sessions: dict[str, Session] = {}
        for cid, s in self.sessions.items():
            r = s.record
            sessions[cid] = Session(r.client_id, r.protocol_version, r.expiry_s, r.connected_at_ms,
                                    r.disconnected_at_ms, r.connected,
                                    tuple(s.subscriptions[f] for f in sorted(s.subscriptions)),
                                    tuple(s.queue.values()), tuple(sorted(s.inbound_qos2)), s.will, r.owner)
        return SpoolState(head or self.head, sessions, self.messages, dict(self.retained),
                          tuple((c, m, at) for (c, m), at in self.message_ids.items()), self.stored_bytes)

    def _take(self, msg_id: int) -> bool:
        stored = self._stored.get(msg_id)
        if stored is None:
            return False
        stored.refs += 1
        return True

    def _release(self, msg_id: int) -> None:
        stored = self._stored[msg_id]
        stored.refs -= 1
        if not stored.refs:
            del self._stored[msg_id]
            self.stored_bytes -= stored.size

    def _message_stored(self, op: MessageStored) -> bool:
        if op.msg_id in self._stored:
            return False
        size = self._size or stored_size(encode_op(op))
        self._stored[op.msg_id] = _Stored(op, size)
        self.stored_bytes += size
        return True

    def _message_routed(self, seq: int, op: MessageRouted) -> bool:
        self._size = stored_size_of(op, self._size) if self._size else 0
        stored = self._message_stored(op.stored())
        s = self.sessions.get(op.client_id)  # then as _message_queued
        if s is None or op.msg_id in s.queue or not self._take(op.msg_id):
            return False
        s.queue[op.msg_id] = QueueEntry(op.msg_id, op.queue_qos, op.queue_retain, op.subscription_ids, seq)
        return stored

    def _message_queued(self, seq: int, op: MessageQueued) -> bool:
        s = self.sessions.get(op.client_id)
        if s is None or op.msg_id in s.queue or not self._take(op.msg_id):
            return False
        s.queue[op.msg_id] = QueueEntry(op.msg_id, op.qos, op.retain, op.subscription_ids, seq)
        return True

    def _message_inflight(self, op: MessageInflight) -> bool:
        s = self.sessions.get(op.client_id)
        e = s.queue.get(op.msg_id) if s is not None else None
        if s is None or e is None or e.pubrec_received:
            return False
        s.queue[op.msg_id] = QueueEntry(e.msg_id, e.qos, e.retain, e.subscription_ids, e.order, op.packet_id)
        return True

    def _message_pubrec_received(self, op: MessagePubrecReceived) -> bool:
        s = self.sessions.get(op.client_id)
        e = s.queue.get(op.msg_id) if s is not None else None
        if s is None or e is None or e.pubrec_received:
            return False
        s.queue[op.msg_id] = QueueEntry(e.msg_id, e.qos, e.retain, e.subscription_ids, e.order, e.packet_id, True)
        self._release(op.msg_id)
        return True

    def _remove_entry(self, client_id: str, msg_id: int) -> bool:
        s = self.sessions.get(client_id)
        return s is not None and self._remove_queued(s, msg_id)

    def _remove_queued(self, s: _Session, msg_id: int) -> bool:
        e = s.queue.pop(msg_id, None)
        if e is None:
            return False
        if not e.pubrec_received:
            self._release(msg_id)
        return True

    def _messages_inflight(self, op: MessagesInflight) -> bool:
        s = self.sessions.get(op.client_id)
        if s is None:
            return not op.msg_ids
        queue, applied = s.queue, True
        for msg_id, packet_id in zip(op.msg_ids, op.packet_ids):
            e = queue.get(msg_id)
            if e is None or e.pubrec_received:
                applied = False
                continue
            queue[msg_id] = QueueEntry(e.msg_id, e.qos, e.retain, e.subscription_ids, e.order, packet_id)
        return applied

    def _messages_acked(self, op: MessagesAcked) -> bool:
        s = self.sessions.get(op.client_id)
        if s is None:
            return not op.msg_ids
        applied = True
        for msg_id in op.msg_ids:  # every one removed, even after one that was not queued
            if not self._remove_queued(s, msg_id):
                applied = False
        return applied

    def _session_opened(self, op: SessionOpened) -> bool:
        s = self.sessions.get(op.client_id)
        record = Session(op.client_id, op.protocol_version, op.expiry_s, op.connected_at_ms, 0, True,
                         owner=s.record.owner if s is not None else None)
        if s is not None:
            s.record = record
        else:
            self.sessions[op.client_id] = _Session(record)
        return True

    def _session_owned(self, op: SessionOwned) -> bool:
        s = self.sessions.get(op.client_id)
        if s is None:
            return False
        r = s.record
        s.record = Session(r.client_id, r.protocol_version, r.expiry_s, r.connected_at_ms, r.disconnected_at_ms,
                           r.connected, owner=op.owner)
        return True

    def _session_disconnected(self, op: SessionDisconnected) -> bool:
        s = self.sessions.get(op.client_id)
        if s is None:
            return False
        r = s.record
        s.record = Session(r.client_id, r.protocol_version, op.expiry_s, r.connected_at_ms, op.disconnected_at_ms,
                           False, owner=r.owner)
        return True

    def _session_deleted(self, op: SessionDeleted) -> bool:
        s = self.sessions.pop(op.client_id, None)
        if s is None:
            return False
        for e in s.queue.values():
            if not e.pubrec_received:
                self._release(e.msg_id)
        if s.will is not None:
            self._release(s.will.msg_id)
        return True

    def _subscribed(self, op: Subscribed) -> bool:
        s = self.sessions.get(op.client_id)
        if s is None:
            return False
        s.subscriptions[op.topic_filter] = op
        return True

    def _retained_set(self, op: RetainedSet) -> bool:
        if not self._take(op.msg_id):
            return False
        old = self.retained.get(op.topic)
        self.retained[op.topic] = op.msg_id
        if old is not None:
            self._release(old)
        return True

    def _retained_cleared(self, op: RetainedCleared) -> bool:
        old = self.retained.pop(op.topic, None)
        if old is None:
            return False
        self._release(old)
        return True

    def _inbound_qos2_received(self, op: InboundQos2Received) -> bool:
        s = self.sessions.get(op.client_id)
        if s is None or op.packet_id in s.inbound_qos2:
            return False
        s.inbound_qos2.add(op.packet_id)
        return True

    def _inbound_qos2_released(self, op: InboundQos2Released) -> bool:
        s = self.sessions.get(op.client_id)
        if s is None or op.packet_id not in s.inbound_qos2:
            return False
        s.inbound_qos2.discard(op.packet_id)
        return True

    def _will_set(self, op: WillSet) -> bool:
        s = self.sessions.get(op.client_id)
        if s is None or not self._take(op.msg_id):
            return False
        old = s.will
        s.will = op
        if old is not None:
            self._release(old.msg_id)
        return True

    def _will_cleared(self, op: WillCleared) -> bool:
        s = self.sessions.get(op.client_id)
        if s is None or s.will is None:
            return False
        old = s.will
        s.will = None
        self._release(old.msg_id)
        return True

    def _message_id_seen(self, op: MessageIdSeen) -> bool:
        key = (op.client_id, op.message_id)
        existed = self.message_ids.pop(key, None) is not None
        self.message_ids[key] = op.seen_at_ms
        if not existed and len(self.message_ids) > self.max_message_ids:
            del self.message_ids[next(iter(self.message_ids))]
        return True

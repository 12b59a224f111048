"""The op vocabulary: every durable change of broker state is one of these.

Rules:
- The broker core emits ops; the spool applies them in order, durably, in one
  SQLite transaction per group commit; the mate link ships the same
  ops to the standby. Replaying the op log from empty rebuilds the state.
- Ops are frozen, slotted dataclasses with plain fields (str, bytes, int, bool,
  tuples of int). Message bodies are stored once (`MessageStored`) and
  referenced by `msg_id` from each session queue entry, so a fan-out to N
  subscribers costs one body and N small records. A message routed to a
  subscriber is one op, `MessageRouted` (its body and its first queue entry):
  the usual durable message costs one record, not two.
- Times are wall-clock milliseconds since the Unix epoch (they must survive a
  restart and a failover to another host); 0 means "none".
- Type ids are part of the on-disk and on-wire format: never reuse or renumber.
"""

from __future__ import annotations

import dataclasses

from ..frozen import fast_init


@dataclasses.dataclass(frozen=True, slots=True)
class MessageStored:
    TYPE = 1
    msg_id: int
    topic: str
    payload: bytes
    qos: int
    retain: bool
    properties: bytes  # the PUBLISH's MQTT 5 properties, encoded as on the wire (opaque here)
    expiry_at_ms: int  # 0: never expires
    publisher: str
    created_at_ms: int


@dataclasses.dataclass(frozen=True, slots=True)
class MessageQueued:
    """A stored message enters a session's queue (in order) for delivery at `qos`."""

    TYPE = 2
    client_id: str
    msg_id: int
    qos: int
    retain: bool  # the RETAIN flag this subscriber gets (retain-as-published, retained-on-subscribe)
    subscription_ids: tuple[int, ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class MessageInflight:
    """Sent to the client with this packet id; resent with DUP after a reconnect."""

    TYPE = 3
    client_id: str
    msg_id: int
    packet_id: int


@dataclasses.dataclass(frozen=True, slots=True)
class MessagePubrecReceived:
    """Outbound QoS 2: the client sent PUBREC; we owe it PUBREL (the body is no longer needed)."""

    TYPE = 4
    client_id: str
    msg_id: int


@dataclasses.dataclass(frozen=True, slots=True)
class MessageAcked:
    """PUBACK (QoS 1) or PUBCOMP (QoS 2) received, or a QoS 0 copy handed over: the entry leaves the queue."""

    TYPE = 5
    client_id: str
    msg_id: int


@dataclasses.dataclass(frozen=True, slots=True)
class MessageDropped:
    """The entry leaves the queue undelivered, for a documented reason (expired, queue policy...)."""

    TYPE = 6
    client_id: str
    msg_id: int
    reason: str


@dataclasses.dataclass(frozen=True, slots=True)
class SessionOpened:
    """A session is created, or resumed by a new connection (upsert)."""

    TYPE = 7
    client_id: str
    protocol_version: int
    expiry_s: int  # 0xFFFFFFFF: never; 0: ends with the connection
    connected_at_ms: int


@dataclasses.dataclass(frozen=True, slots=True)
class SessionDisconnected:
    """The connection ended; a session with expiry_s > 0 lives on until disconnected_at + expiry."""

    TYPE = 8
    client_id: str
    disconnected_at_ms: int
    expiry_s: int  # a v5 DISCONNECT may change it


@dataclasses.dataclass(frozen=True, slots=True)
class SessionDeleted:
    """The session and everything it owns (subscriptions, queue, QoS 2 state, will) are gone."""

    TYPE = 9
    client_id: str


@dataclasses.dataclass(frozen=True, slots=True)
class Subscribed:
    TYPE = 10
    client_id: str
    topic_filter: str  # including a `$share/group/` prefix when shared
    qos: int
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0
    subscription_id: int = 0  # 0: none


@dataclasses.dataclass(frozen=True, slots=True)
class Unsubscribed:
    TYPE = 11
    client_id: str
    topic_filter: str


@dataclasses.dataclass(frozen=True, slots=True)
class RetainedSet:
    """`topic` now retains the stored message `msg_id` (replacing any earlier one)."""

    TYPE = 12
    topic: str
    msg_id: int


@dataclasses.dataclass(frozen=True, slots=True)
class RetainedCleared:
    TYPE = 13
    topic: str


@dataclasses.dataclass(frozen=True, slots=True)
class InboundQos2Received:
    """We accepted a QoS 2 PUBLISH (packet id) from this client: PUBREC is sent once this is durable."""

    TYPE = 14
    client_id: str
    packet_id: int


@dataclasses.dataclass(frozen=True, slots=True)
class InboundQos2Released:
    """PUBREL received: the packet id may be reused; PUBCOMP is sent once this is durable."""

    TYPE = 15
    client_id: str
    packet_id: int


@dataclasses.dataclass(frozen=True, slots=True)
class WillSet:
    """The session's will message (stored body), published at disconnect + delay unless cleared."""

    TYPE = 16
    client_id: str
    msg_id: int
    delay_s: int


@dataclasses.dataclass(frozen=True, slots=True)
class WillCleared:
    TYPE = 17
    client_id: str


@dataclasses.dataclass(frozen=True, slots=True)
class MessageIdSeen:
    """Duplicate suppression across failover (appliance/broker/dedup.py): the message id a
    publisher assigned was accepted from that client. Committed with the message it names. (Its
    client_id was added before any broker emitted this op, so no spool holds the older layout.)"""

    TYPE = 18
    client_id: str
    message_id: str
    seen_at_ms: int


@dataclasses.dataclass(frozen=True, slots=True)
class MessagesInflight:
    """`MessageInflight` for several messages of one session at once (msg_ids[i] sent with packet_ids[i]):
    one op for everything one pump sends. Applied item by item; applied only if every item is."""

    TYPE = 19
    client_id: str
    msg_ids: tuple[int, ...]
    packet_ids: tuple[int, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class MessagesAcked:
    """`MessageAcked` for several messages of one session at once: the acks of one read of its socket."""

    TYPE = 20
    client_id: str
    msg_ids: tuple[int, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class SessionOwned:
    """The user a session belongs to: "" for an anonymous client (a user name is never empty).

    A session without one was made before sessions had owners (docs/broker.md says how it is treated).
    """

    TYPE = 21
    client_id: str
    owner: str


@dataclasses.dataclass(frozen=True, slots=True)
class MessageRouted:
    """`MessageStored` then `MessageQueued` for `client_id`, in one op: applied exactly as those two are.

    Its first nine fields are MessageStored's (same names, same order), so what reads a stored message reads
    this one too; the body it stores counts as that MessageStored would (state.stored_size_of)."""

    TYPE = 22
    msg_id: int
    topic: str
    payload: bytes
    qos: int
    retain: bool
    properties: bytes
    expiry_at_ms: int
    publisher: str
    created_at_ms: int
    client_id: str
    queue_qos: int
    queue_retain: bool
    subscription_ids: tuple[int, ...] = ()

    def stored(self) -> MessageStored:
        return MessageStored(self.msg_id, self.topic, self.payload, self.qos, self.retain, self.properties,
                             self.expiry_at_ms, self.publisher, self.created_at_ms)


OP_TYPES: dict[int, type] = {cls.TYPE: cls for cls in (
    MessageStored, MessageQueued, MessageInflight, MessagePubrecReceived, MessageAcked, MessageDropped,
    SessionOpened, SessionDisconnected, SessionDeleted, Subscribed, Unsubscribed, RetainedSet, RetainedCleared,
    InboundQos2Received, InboundQos2Released, WillSet, WillCleared, MessageIdSeen, MessagesInflight, MessagesAcked,
    SessionOwned, MessageRouted)}
for _cls in OP_TYPES.values():
    fast_init(_cls)  # made on the message path: the faster constructor (appliance/frozen.py), same class otherwise

Op = (MessageStored | MessageQueued | MessageInflight | MessagePubrecReceived | MessageAcked | MessageDropped
      | SessionOpened | SessionDisconnected | SessionDeleted | Subscribed | Unsubscribed | RetainedSet
      | RetainedCleared | InboundQos2Received | InboundQos2Released | WillSet | WillCleared | MessageIdSeen
      | MessagesInflight | MessagesAcked | SessionOwned | MessageRouted)

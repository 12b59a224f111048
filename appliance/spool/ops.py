"""The op vocabulary: every durable change of broker state is one of these.

Rules:
- The broker core emits ops; the spool applies them in order, durably, one
  group commit at a time; the mate link ships the same ops to the standby.
  Replaying the op log from empty rebuilds the state.
- Ops are immutable, slotted records with plain fields (str, bytes, int, bool,
  tuples of int). Message bodies are stored once (`MessageStored`) and
  referenced by `msg_id` from each session queue entry, so a fan-out to N
  subscribers costs one body and N small records. A message routed to a
  subscriber is one op, `MessageRouted` (its body and its first queue entry):
  the usual durable message costs one record, not two.
- Times are wall-clock milliseconds since the Unix epoch (they must survive a
  restart and a failover to another host); 0 means "none".
- Type ids (`OP_TYPES`) are part of the on-disk and on-wire format: never reuse or renumber.
- Compiled (docs/build.md): each op has an explicit `__init__` and `Final` fields, so mypy refuses an assignment
  (and compiled code raises AttributeError); no runtime `frozen=True`, whose generated `__init__` sets each field
  through `object.__setattr__`. They stay dataclasses (`init=False`) for eq, repr, hash and `dataclasses.replace`.
  Nothing else goes in a class body: a compiled dataclass makes every class-body assignment a field.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

@dataclass(slots=True, init=False, unsafe_hash=True)
class MessageStored:
    msg_id: Final[int]
    topic: Final[str]
    payload: Final[bytes]
    qos: Final[int]
    retain: Final[bool]
    properties: Final[bytes]  # the PUBLISH's MQTT 5 properties, encoded as on the wire (opaque here)
    expiry_at_ms: Final[int]  # 0: never expires
    publisher: Final[str]
    created_at_ms: Final[int]

    def __init__(self, msg_id: int, topic: str, payload: bytes, qos: int, retain: bool, properties: bytes,
                 expiry_at_ms: int, publisher: str, created_at_ms: int) -> None:
        self.msg_id = msg_id
        self.topic = topic
        self.payload = payload
        self.qos = qos
        self.retain = retain
        self.properties = properties
        self.expiry_at_ms = expiry_at_ms
        self.publisher = publisher
        self.created_at_ms = created_at_ms


@dataclass(slots=True, init=False, unsafe_hash=True)
class MessageQueued:
    """A stored message enters a session's queue (in order) for delivery at `qos`."""

    client_id: Final[str]
    msg_id: Final[int]
    qos: Final[int]
    retain: Final[bool]  # the RETAIN flag this subscriber gets (retain-as-published, retained-on-subscribe)
    subscription_ids: Final[tuple[int, ...]]

    def __init__(self, client_id: str, msg_id: int, qos: int, retain: bool,
                 subscription_ids: tuple[int, ...] = ()) -> None:
        self.client_id = client_id
        self.msg_id = msg_id
        self.qos = qos
        self.retain = retain
        self.subscription_ids = subscription_ids


@dataclass(slots=True, init=False, unsafe_hash=True)
class MessageInflight:
    """Sent to the client with this packet id; resent with DUP after a reconnect."""

    client_id: Final[str]
    msg_id: Final[int]
    packet_id: Final[int]

    def __init__(self, client_id: str, msg_id: int, packet_id: int) -> None:
        self.client_id = client_id
        self.msg_id = msg_id
        self.packet_id = packet_id


@dataclass(slots=True, init=False, unsafe_hash=True)
class MessagePubrecReceived:
    """Outbound QoS 2: the client sent PUBREC; we owe it PUBREL (the body is no longer needed)."""

    client_id: Final[str]
    msg_id: Final[int]

    def __init__(self, client_id: str, msg_id: int) -> None:
        self.client_id = client_id
        self.msg_id = msg_id


@dataclass(slots=True, init=False, unsafe_hash=True)
class MessageAcked:
    """PUBACK (QoS 1) or PUBCOMP (QoS 2) received, or a QoS 0 copy handed over: the entry leaves the queue."""

    client_id: Final[str]
    msg_id: Final[int]

    def __init__(self, client_id: str, msg_id: int) -> None:
        self.client_id = client_id
        self.msg_id = msg_id


@dataclass(slots=True, init=False, unsafe_hash=True)
class MessageDropped:
    """The entry leaves the queue undelivered, for a documented reason (expired, queue policy...)."""

    client_id: Final[str]
    msg_id: Final[int]
    reason: Final[str]

    def __init__(self, client_id: str, msg_id: int, reason: str) -> None:
        self.client_id = client_id
        self.msg_id = msg_id
        self.reason = reason


@dataclass(slots=True, init=False, unsafe_hash=True)
class SessionOpened:
    """A session is created, or resumed by a new connection (upsert)."""

    client_id: Final[str]
    protocol_version: Final[int]
    expiry_s: Final[int]  # 0xFFFFFFFF: never; 0: ends with the connection
    connected_at_ms: Final[int]

    def __init__(self, client_id: str, protocol_version: int, expiry_s: int, connected_at_ms: int) -> None:
        self.client_id = client_id
        self.protocol_version = protocol_version
        self.expiry_s = expiry_s
        self.connected_at_ms = connected_at_ms


@dataclass(slots=True, init=False, unsafe_hash=True)
class SessionDisconnected:
    """The connection ended; a session with expiry_s > 0 lives on until disconnected_at + expiry."""

    client_id: Final[str]
    disconnected_at_ms: Final[int]
    expiry_s: Final[int]  # a v5 DISCONNECT may change it

    def __init__(self, client_id: str, disconnected_at_ms: int, expiry_s: int) -> None:
        self.client_id = client_id
        self.disconnected_at_ms = disconnected_at_ms
        self.expiry_s = expiry_s


@dataclass(slots=True, init=False, unsafe_hash=True)
class SessionDeleted:
    """The session and everything it owns (subscriptions, queue, QoS 2 state, will) are gone."""

    client_id: Final[str]

    def __init__(self, client_id: str) -> None:
        self.client_id = client_id


@dataclass(slots=True, init=False, unsafe_hash=True)
class Subscribed:
    client_id: Final[str]
    topic_filter: Final[str]  # including a `$share/group/` prefix when shared
    qos: Final[int]
    no_local: Final[bool]
    retain_as_published: Final[bool]
    retain_handling: Final[int]
    subscription_id: Final[int]  # 0: none

    def __init__(self, client_id: str, topic_filter: str, qos: int, no_local: bool = False,
                 retain_as_published: bool = False, retain_handling: int = 0, subscription_id: int = 0) -> None:
        self.client_id = client_id
        self.topic_filter = topic_filter
        self.qos = qos
        self.no_local = no_local
        self.retain_as_published = retain_as_published
        self.retain_handling = retain_handling
        self.subscription_id = subscription_id


@dataclass(slots=True, init=False, unsafe_hash=True)
class Unsubscribed:
    client_id: Final[str]
    topic_filter: Final[str]

    def __init__(self, client_id: str, topic_filter: str) -> None:
        self.client_id = client_id
        self.topic_filter = topic_filter


@dataclass(slots=True, init=False, unsafe_hash=True)
class RetainedSet:
    """`topic` now retains the stored message `msg_id` (replacing any earlier one)."""

    topic: Final[str]
    msg_id: Final[int]

    def __init__(self, topic: str, msg_id: int) -> None:
        self.topic = topic
        self.msg_id = msg_id


@dataclass(slots=True, init=False, unsafe_hash=True)
class RetainedCleared:
    topic: Final[str]

    def __init__(self, topic: str) -> None:
        self.topic = topic


@dataclass(slots=True, init=False, unsafe_hash=True)
class InboundQos2Received:
    """We accepted a QoS 2 PUBLISH (packet id) from this client: PUBREC is sent once this is durable."""

    client_id: Final[str]
    packet_id: Final[int]

    def __init__(self, client_id: str, packet_id: int) -> None:
        self.client_id = client_id
        self.packet_id = packet_id


@dataclass(slots=True, init=False, unsafe_hash=True)
class InboundQos2Released:
    """PUBREL received: the packet id may be reused; PUBCOMP is sent once this is durable."""

    client_id: Final[str]
    packet_id: Final[int]

    def __init__(self, client_id: str, packet_id: int) -> None:
        self.client_id = client_id
        self.packet_id = packet_id


@dataclass(slots=True, init=False, unsafe_hash=True)
class WillSet:
    """The session's will message (stored body), published at disconnect + delay unless cleared."""

    client_id: Final[str]
    msg_id: Final[int]
    delay_s: Final[int]

    def __init__(self, client_id: str, msg_id: int, delay_s: int) -> None:
        self.client_id = client_id
        self.msg_id = msg_id
        self.delay_s = delay_s


@dataclass(slots=True, init=False, unsafe_hash=True)
class WillCleared:
    client_id: Final[str]

    def __init__(self, client_id: str) -> None:
        self.client_id = client_id


@dataclass(slots=True, init=False, unsafe_hash=True)
class MessageIdSeen:
    """Duplicate suppression across failover (appliance/broker/dedup.py): the message id a
    publisher assigned was accepted from that client. Committed with the message it names. (Its
    client_id was added before any broker emitted this op, so no spool holds the older layout.)"""

    client_id: Final[str]
    message_id: Final[str]
    seen_at_ms: Final[int]

    def __init__(self, client_id: str, message_id: str, seen_at_ms: int) -> None:
        self.client_id = client_id
        self.message_id = message_id
        self.seen_at_ms = seen_at_ms


@dataclass(slots=True, init=False, unsafe_hash=True)
class MessagesInflight:
    """`MessageInflight` for several messages of one session at once (msg_ids[i] sent with packet_ids[i]):
    one op for everything one pump sends. Applied item by item; applied only if every item is."""

    client_id: Final[str]
    msg_ids: Final[tuple[int, ...]]
    packet_ids: Final[tuple[int, ...]]

    def __init__(self, client_id: str, msg_ids: tuple[int, ...], packet_ids: tuple[int, ...]) -> None:
        self.client_id = client_id
        self.msg_ids = msg_ids
        self.packet_ids = packet_ids


@dataclass(slots=True, init=False, unsafe_hash=True)
class MessagesAcked:
    """`MessageAcked` for several messages of one session at once: the acks of one read of its socket."""

    client_id: Final[str]
    msg_ids: Final[tuple[int, ...]]

    def __init__(self, client_id: str, msg_ids: tuple[int, ...]) -> None:
        self.client_id = client_id
        self.msg_ids = msg_ids


@dataclass(slots=True, init=False, unsafe_hash=True)
class SessionOwned:
    """The user a session belongs to: "" for an anonymous client (a user name is never empty).

    A session without one was made before sessions had owners (docs/broker.md says how it is treated).
    """

    client_id: Final[str]
    owner: Final[str]

    def __init__(self, client_id: str, owner: str) -> None:
        self.client_id = client_id
        self.owner = owner


@dataclass(slots=True, init=False, unsafe_hash=True)
class MessageRouted:
    """`MessageStored` then `MessageQueued` for `client_id`, in one op: applied exactly as those two are.

    Its first nine fields are MessageStored's (same names, same order), so what reads a stored message reads
    this one too; the body it stores counts as that MessageStored would (state.stored_size_of)."""

    msg_id: Final[int]
    topic: Final[str]
    payload: Final[bytes]
    qos: Final[int]
    retain: Final[bool]
    properties: Final[bytes]
    expiry_at_ms: Final[int]
    publisher: Final[str]
    created_at_ms: Final[int]
    client_id: Final[str]
    queue_qos: Final[int]
    queue_retain: Final[bool]
    subscription_ids: Final[tuple[int, ...]]

    def __init__(self, msg_id: int, topic: str, payload: bytes, qos: int, retain: bool, properties: bytes,
                 expiry_at_ms: int, publisher: str, created_at_ms: int, client_id: str, queue_qos: int,
                 queue_retain: bool, subscription_ids: tuple[int, ...] = ()) -> None:
        self.msg_id = msg_id
        self.topic = topic
        self.payload = payload
        self.qos = qos
        self.retain = retain
        self.properties = properties
        self.expiry_at_ms = expiry_at_ms
        self.publisher = publisher
        self.created_at_ms = created_at_ms
        self.client_id = client_id
        self.queue_qos = queue_qos
        self.queue_retain = queue_retain
        self.subscription_ids = subscription_ids

    def stored(self) -> MessageStored:
        return MessageStored(self.msg_id, self.topic, self.payload, self.qos, self.retain, self.properties,
                             self.expiry_at_ms, self.publisher, self.created_at_ms)


# Type ids: part of the on-disk and on-wire format (never reuse or renumber).
OP_TYPES: Final[dict[int, type]] = {
    1: MessageStored,
    2: MessageQueued,
    3: MessageInflight,
    4: MessagePubrecReceived,
    5: MessageAcked,
    6: MessageDropped,
    7: SessionOpened,
    8: SessionDisconnected,
    9: SessionDeleted,
    10: Subscribed,
    11: Unsubscribed,
    12: RetainedSet,
    13: RetainedCleared,
    14: InboundQos2Received,
    15: InboundQos2Released,
    16: WillSet,
    17: WillCleared,
    18: MessageIdSeen,
    19: MessagesInflight,
    20: MessagesAcked,
    21: SessionOwned,
    22: MessageRouted,
}


Op = (MessageStored | MessageQueued | MessageInflight | MessagePubrecReceived | MessageAcked | MessageDropped
      | SessionOpened | SessionDisconnected | SessionDeleted | Subscribed | Unsubscribed | RetainedSet
      | RetainedCleared | InboundQos2Received | InboundQos2Released | WillSet | WillCleared | MessageIdSeen
      | MessagesInflight | MessagesAcked | SessionOwned | MessageRouted)

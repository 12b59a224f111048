"""Broker state: stored messages, sessions and their queues, live connections.

Rules:
- A message body is stored once (`Message`) and shared by reference from every
  session queue entry, retained topic and will that needs it; `refs` counts
  those holders, and the body is forgotten when it drops to zero.
- A session's queue is ordered; its entries move queued → inflight (packet id
  assigned) → (QoS 2) pubrec → gone. Only entries at the head are sent, up to
  the client's in-flight window, so per-publisher order is kept: the in-flight
  entries are always the queue's first `len(inflight)` entries, and `inflight`
  indexes them by packet id (acks and the pump never walk the queue).
- An entry is `ready` once the commit that queued it is durable; the pump
  stops at the first entry that is not (docs/broker.md rule 2), so a freed
  window slot can be refilled at once, without waiting for another commit.
- Connection-scoped state (topic aliases, the client's limits) lives on the
  `Connection`, not the session: it dies with the socket.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
from typing import Any, Final

NEVER: Final = 0xFFFFFFFF  # session expiry interval meaning "never expires"


# The per-message records have explicit `__init__`s: the one `dataclass` generates is never compiled
# (docs/build.md, "What compiled code asks of the source").
@dataclasses.dataclass(slots=True, init=False)
class Message:
    msg_id: int
    topic: str
    payload: bytes
    qos: int
    retain: bool
    properties: dict[Any, Any]  # MQTT 5 properties to forward (PropertyId -> value); never Topic Alias / Subscription Id
    expiry_at_ms: int  # 0: never
    publisher: str
    created_at_ms: int
    refs: int
    stored_size: int  # what it counts against the spool's byte limit while stored (0: not stored)

    def __init__(self, msg_id: int, topic: str, payload: bytes, qos: int, retain: bool, properties: dict[Any, Any],
                 expiry_at_ms: int, publisher: str, created_at_ms: int, refs: int = 0, stored_size: int = 0) -> None:
        self.msg_id = msg_id
        self.topic = topic
        self.payload = payload
        self.qos = qos
        self.retain = retain
        self.properties = properties
        self.expiry_at_ms = expiry_at_ms
        self.publisher = publisher
        self.created_at_ms = created_at_ms
        self.refs = refs
        self.stored_size = stored_size

    @property
    def size(self) -> int:
        return len(self.payload) + len(self.topic)


class EntryState(enum.Enum):
    QUEUED = 0
    INFLIGHT = 1
    PUBREC = 2  # outbound QoS 2: PUBREC received, PUBREL sent


@dataclasses.dataclass(slots=True, init=False)
class QueueEntry:
    msg_id: int
    qos: int
    retain: bool
    subscription_ids: tuple[int, ...]
    state: EntryState
    packet_id: int
    ready: bool  # False from routing until the commit holding its MessageQueued is durable

    def __init__(self, msg_id: int, qos: int, retain: bool, subscription_ids: tuple[int, ...],
                 state: EntryState = EntryState.QUEUED, packet_id: int = 0, ready: bool = True) -> None:
        self.msg_id = msg_id
        self.qos = qos
        self.retain = retain
        self.subscription_ids = subscription_ids
        self.state = state
        self.packet_id = packet_id
        self.ready = ready


@dataclasses.dataclass(slots=True)
class SubscriptionOptions:
    qos: int
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0
    subscription_id: int = 0


@dataclasses.dataclass(slots=True)
class Will:
    msg_id: int
    delay_s: int


@dataclasses.dataclass(slots=True)
class Session:
    client_id: str
    protocol_version: int
    expiry_s: int
    subscriptions: dict[str, SubscriptionOptions] = dataclasses.field(default_factory=dict)
    queue: collections.deque[QueueEntry] = dataclasses.field(default_factory=collections.deque)
    inflight: dict[int, QueueEntry] = dataclasses.field(default_factory=dict)  # packet id -> the queue's head entries
    acked: list[int] = dataclasses.field(default_factory=list)  # msg ids acked, not yet in a MessagesAcked op
    queued_bytes: int = 0
    inbound_qos2: set[int] = dataclasses.field(default_factory=set)
    will: Will | None = None
    conn: int | None = None  # the live connection, if any
    disconnected_at_ms: int = 0
    will_due_ms: int = 0  # when a delayed will is published (0: none pending)
    next_packet_id: int = 1
    owner: str | None = None  # the user that made it ("" anonymous); None: restored from before owners

    def inflight_count(self) -> int:
        return len(self.inflight)

    def allocate_packet_id(self) -> int:
        used = self.inflight
        for _ in range(65535):
            pid = self.next_packet_id
            self.next_packet_id = pid % 65535 + 1
            if pid not in used:
                return pid
        raise AssertionError("no free packet id: the in-flight window must stay below 65535")

    def remove_inflight(self, entry: QueueEntry) -> None:
        """An in-flight entry's exchange ended (acked, or refused by the client)."""
        del self.inflight[entry.packet_id]
        if self.queue[0] is entry:
            self.queue.popleft()  # the usual case: acks come in order
        else:
            self.queue.remove(entry)  # within the in-flight head: at most a window's length

    def expires_at_ms(self) -> int | None:
        if self.conn is not None or self.expiry_s == NEVER:
            return None
        return self.disconnected_at_ms + self.expiry_s * 1000


@dataclasses.dataclass(slots=True)
class Connection:
    conn_id: int
    client_id: str
    protocol_version: int
    receive_maximum: int  # the client's: our in-flight window towards it
    maximum_packet_size: int  # the client's: larger PUBLISHes are dropped for it (v5 §3.1.2.11.4)
    topic_alias_maximum: int  # the client's: how many aliases we may assign towards it
    username: str | None = None
    request_problem_information: bool = True
    aliases_in: dict[int, str] = dataclasses.field(default_factory=dict)
    aliases_out: dict[str, int] = dataclasses.field(default_factory=dict)
    will_on_close: bool = True  # a clean DISCONNECT (reason 0) suppresses the will
    closing: bool = False  # a Close is on its way (behind earlier commits): take no more packets
    connacked: bool = False  # its CONNACK is out: nothing may be sent before it (MQTT: CONNACK comes first)

    def outbound_alias(self, topic: str) -> tuple[int, bool]:
        """(alias, first use) for `topic`, or (0, False) when we may not assign one."""
        alias = self.aliases_out.get(topic)
        if alias:
            return alias, False
        if len(self.aliases_out) < self.topic_alias_maximum:
            alias = len(self.aliases_out) + 1
            self.aliases_out[topic] = alias
            return alias, True
        return 0, False

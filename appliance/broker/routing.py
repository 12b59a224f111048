"""Routing: from one PUBLISH to every session that should get it, and out again.

Rules:
- One stored body per message; each target session gets a queue entry at
  min(publish QoS, subscription QoS). QoS 0 copies go out at once and are never
  spooled; QoS 1/2 copies are queued and sent after the commit (docs/broker.md).
- Overlapping subscriptions of one client yield one copy: the highest QoS and
  every subscription identifier. A shared group (`$share/g/f`) yields one copy
  for one member, chosen round-robin, preferring connected members.
- No silent loss: if a target queue is full, or storing the body would pass the
  spool's byte limit, the whole publish is refused with a reason (v5 0x97;
  3.1.1: disconnected without an ack) and counted, before anything is stored.
  `stored_bytes` counts every stored body by `stored_estimate`, at least its
  encoded `MessageStored`, so the core refuses before the spool writer would.
- Retained: an empty payload clears the topic; new subscriptions get matching
  retained messages per their Retain Handling; shared subscriptions never do.
- Message expiry: an unsent copy of an expired message is dropped when its
  window reaches it, or at the first tick after it fell due; a tick walks the
  queues only when some stored message fell due (a heap of their expiries).
- Every copy is checked against the ACL in force (`may_receive`, by the
  session owner's name, docs in access.py): when routed, when a queued entry
  reaches the window (a revoked rule drops it: `MessageDropped` "not
  authorized"), and for retained messages at SUBSCRIBE. A session from before
  owners, offline, is checked when its entries are sent.
- A QoS 0 PUBLISH without RETAIN takes `_route_at_most_once`: the same
  copies as `route`, without the storing, queueing and acking it never needs.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable
import itertools
from typing import TYPE_CHECKING, Any, Final

from ..mqtt import codec
from ..mqtt.properties import PropertyId as P
from ..mqtt.properties import Properties, decode_properties, encode_properties
from ..mqtt.wire import Cursor, PacketType
from ..mqtt.wire import ReasonCode as RC
from ..spool import ops
from . import topics
from .effects import Durable, Persist, Send
from .session import Connection, EntryState, Message, QueueEntry, Session, SubscriptionOptions, Will

if TYPE_CHECKING:
    from .core import BrokerCore, Limits, ReceiveCheck

_NOT_FORWARDED: Final = (P.TOPIC_ALIAS, P.SUBSCRIPTION_IDENTIFIER)
_Target = tuple[int, tuple[int, ...], bool]  # (QoS, subscription ids, RETAIN flag to send) of one copy
# What became of a client's PUBLISH (outcomes.py says what each means), as an index into OUTCOME_NAMES: here,
# where routing decides it, so that counting is a compiled call on a per-topic row, no key built per message.
OUTCOME_NAMES: Final = ("delivered", "queued", "no_subscriber", "refused")
DELIVERED: Final = 0
QUEUED: Final = 1
NO_SUBSCRIBER: Final = 2
REFUSED: Final = 3


def _receive_all(username: str | None, topic: str) -> bool:
    return True


class Router:
    def __init__(self, limits: Limits, may_receive: ReceiveCheck | None = None) -> None:
        self.limits = limits
        self.may_receive: ReceiveCheck = may_receive or _receive_all
        self.withheld = 0  # copies the ACL withheld at delivery
        self.messages: dict[int, Message] = {}
        self.retained = topics.RetainedIndex()
        self.subscriptions = topics.SubscriptionIndex()
        self._msg_ids = itertools.count(1)
        self.stored_bytes = 0  # see the rules: every body in `messages` with a stored_size
        # (expiry_at_ms, msg_id) of stored messages that expire, a heap: a tick looks at the queues only when one
        # is due. Entries of freed messages stay until due or until the heap is rebuilt (`hold`).
        self._expiries: list[tuple[int, int]] = []

    def hold(self, msg: Message) -> None:
        """Keep `msg`'s body in `messages` (every stored message comes in here, so its expiry is tracked)."""
        self.messages[msg.msg_id] = msg
        if msg.expiry_at_ms:
            expiries = self._expiries
            heapq.heappush(expiries, (msg.expiry_at_ms, msg.msg_id))
            if len(expiries) > 2 * len(self.messages) + 1024:  # mostly freed ones: rebuild (amortized O(1))
                self._expiries = [(m.expiry_at_ms, m.msg_id) for m in self.messages.values() if m.expiry_at_ms]
                heapq.heapify(self._expiries)

    def restart_ids(self, first: int) -> None:
        """Continue message ids above every id the restored state still refers to."""
        self._msg_ids = itertools.count(first)

    # --- publish in ------------------------------------------------------------------------

    def route(self, core: BrokerCore, conn: Connection | None, session: Session, topic: str, packet: codec.Publish,
              now_ms: int,
              extra_ops: tuple[Any, ...] = ()) -> list[Any]:
        """`extra_ops` join the message's commit if it is accepted (a `MessageIdSeen`: dedup.py)."""
        msg = self._message(session, topic, packet, now_ms)
        if not msg.qos and not msg.retain and not extra_ops:
            sent = self._route_at_most_once(core, session, topic, msg)
            if conn is not None:
                core.count_outcome(topic, 0, DELIVERED if sent else NO_SUBSCRIBER)
            return sent
        targets = self._targets(core, topic, session.client_id, msg.retain)
        full = self._full_target(core, targets, msg)
        if full is not None and conn is not None:
            core._count("publish_refused_queue_full")
            core.count_outcome(topic, msg.qos, REFUSED)
            return core._refuse_publish(conn, packet, RC.QUOTA_EXCEEDED,
                                        f"the queue of subscriber {full} is full; retry later")
        stored_props = _encode_props(msg.properties) if msg.properties else b""
        size = stored_estimate(msg, stored_props)
        if conn is not None and self._needs_store(targets, msg):
            if self.stored_bytes + size > self.limits.max_spool_bytes:
                core._count("publish_refused_spool_full")
                core.count_outcome(topic, msg.qos, REFUSED)
                return core._refuse_publish(conn, packet, RC.QUOTA_EXCEEDED,
                                            f"the message spool is full ({self.stored_bytes:,} of "
                                            f"{self.limits.max_spool_bytes:,} bytes); retry later")
        op_list: list[Any] = list(extra_ops)
        now_effects: list[Any] = []
        then: list[Any] = []
        queued: list[Any] = []
        stored: ops.MessageStored | None = None  # once the body is stored
        stored_at = -1  # where its MessageStored is in op_list while the first queue entry may join it (MessageRouted)
        if msg.retain:
            retained_ops, keep = self._set_retained(topic, msg)
            if keep:
                stored, stored_at = self._store(msg, size, stored_props, now_ms), len(op_list)
                op_list.append(stored)
            op_list += retained_ops
        for client_id, (sub_qos, sub_ids, retain_flag) in targets.items():
            qos = min(sub_qos, msg.qos)  # never above what the publisher sent
            target = core.sessions.get(client_id)
            if target is None:
                continue
            if qos == 0:
                # At most once: a copy for a connection whose CONNACK is not out yet is dropped, not sent ahead of it.
                if target.conn is not None and core.connections[target.conn].connacked:
                    entry = QueueEntry(msg.msg_id, 0, retain_flag, sub_ids)
                    self.messages.setdefault(msg.msg_id, msg)
                    now_effects += self.publish_packet(core.connections[target.conn], target, entry, dup=False,
                                                       msg=msg)
                continue
            if stored is None:
                stored, stored_at = self._store(msg, size, stored_props, now_ms), len(op_list)
                op_list.append(stored)
            msg.refs += 1
            entry = QueueEntry(msg.msg_id, qos, retain_flag, sub_ids, ready=False)
            queued.append(entry)
            target.queue.append(entry)
            target.queued_bytes += msg.size
            if stored_at == len(op_list) - 1:
                s = stored
                op_list[stored_at] = ops.MessageRouted(s.msg_id, s.topic, s.payload, s.qos, s.retain, s.properties,
                                                       s.expiry_at_ms, s.publisher, s.created_at_ms, client_id, qos,
                                                       retain_flag, sub_ids)
                stored_at = -1  # the other subscribers' entries are MessageQueued ops of their own
            else:
                op_list.append(ops.MessageQueued(client_id, msg.msg_id, qos, retain_flag, sub_ids))
            then.append(client_id)  # connected or not: it may connect before the commit is durable
        if packet.qos == 2 and conn is not None:
            packet_id = ack_for(packet).packet_id
            session.inbound_qos2.add(packet_id)
            op_list.append(ops.InboundQos2Received(session.client_id, packet_id))
        if msg.refs == 0 and not msg.retain:
            self.messages.pop(msg.msg_id, None)  # QoS 0 only: nothing holds the body
        if conn is not None:
            core.count_outcome(topic, msg.qos, QUEUED if queued else DELIVERED if now_effects else NO_SUBSCRIBER)
        acks: list[Any] = []
        if conn is not None and packet.qos:
            reason = RC.SUCCESS if targets or conn.protocol_version == 4 else RC.NO_MATCHING_SUBSCRIBERS
            acks.append(codec_send(conn, ack_for(packet, reason)))
        if not op_list:
            return now_effects + acks
        # Rules 1 and 2: the ack and the QoS 1/2 deliveries wait for the commit.
        return [*now_effects, core_persist(op_list, acks, queued, then)]

    def _message(self, session: Session, topic: str, packet: codec.Publish, now_ms: int) -> Message:
        props = ({k: v for k, v in packet.properties.items() if k not in _NOT_FORWARDED}
                 if packet.properties else {})  # most PUBLISHes carry none: no comprehension for them
        expiry_s = props.get(P.MESSAGE_EXPIRY_INTERVAL) if props else None
        return Message(next(self._msg_ids), topic, bytes(packet.payload), packet.qos, packet.retain, props,
                       now_ms + expiry_s * 1000 if expiry_s is not None else 0, session.client_id, now_ms)

    def _route_at_most_once(self, core: BrokerCore, session: Session, topic: str, msg: Message) -> list[Any]:
        """`route` for a QoS 0 PUBLISH without RETAIN, without what cannot apply to it: every copy is QoS 0, so
        nothing is stored, queued, refused for a full queue or acknowledged; a copy goes now to each target whose
        CONNACK is out (one for a connection still before it is dropped, not sent ahead of it), none to others.
        The hot path of QoS 0 traffic, so none of `route`'s bookkeeping for stored messages runs here."""
        effects: list[Any] = []
        sessions, connections = core.sessions, core.connections
        for client_id, (_qos, sub_ids, retain_flag) in self._targets(core, topic, session.client_id, False).items():
            target = sessions.get(client_id)
            if target is None or target.conn is None:
                continue
            conn = connections[target.conn]
            if conn.connacked:
                effects += self.publish_packet(conn, target, QueueEntry(msg.msg_id, 0, retain_flag, sub_ids),
                                               dup=False, msg=msg)
        return effects

    def _targets(self, core: BrokerCore, topic: str, publisher: str, retain: bool) -> dict[str, _Target]:
        """client id -> (QoS, subscription ids, RETAIN flag to send) for one copy each."""
        out: dict[str, _Target] = {}
        may_receive, sessions, connections = self.may_receive, core.sessions, core.connections
        # The index picks one member per shared group (round-robin, connected members first).
        for match in self.subscriptions.match(topic, eligible=lambda cid: _connected(core, cid)):
            opts: SubscriptionOptions = match.options
            if match.group is None and opts.no_local and match.client_id == publisher:
                continue
            target = sessions.get(match.client_id)
            if target is not None:
                owner = target.owner
                if owner is None and target.conn is not None:
                    owner = connections[target.conn].username or ""
                if owner is not None and not may_receive(owner or None, topic):
                    self.withheld += 1
                    continue
            self._merge(out, match.client_id, opts, match.group is None and retain and opts.retain_as_published)
        return out

    @staticmethod
    def _merge(out: dict[str, _Target], client_id: str, opts: SubscriptionOptions, retain_flag: bool) -> None:
        qos, ids, flag = out.get(client_id, (-1, (), False))
        sub_ids = ids + ((opts.subscription_id,) if opts.subscription_id else ())
        out[client_id] = (max(qos, opts.qos), sub_ids, flag or retain_flag)

    @staticmethod
    def _needs_store(targets: dict[str, _Target], msg: Message) -> bool:
        if msg.retain and msg.payload:
            return True
        return msg.qos > 0 and any(qos > 0 for qos, _, _ in targets.values())

    def _full_target(self, core: BrokerCore, targets: dict[str, _Target], msg: Message) -> str | None:
        if msg.qos == 0:
            return None
        for client_id, (qos, _, _) in targets.items():
            target = core.sessions.get(client_id)
            if target is None or min(qos, msg.qos) == 0:
                continue
            if (len(target.queue) >= self.limits.max_queued_messages
                    or target.queued_bytes + msg.size > self.limits.max_queued_bytes):
                return client_id
        return None

    def _store(self, msg: Message, size: int, stored_props: bytes, now_ms: int) -> ops.MessageStored:
        """Hold `msg`'s body as stored (`size` bytes against the spool's limit): the op that stores it."""
        self.hold(msg)
        msg.stored_size = size
        self.stored_bytes += size
        return ops.MessageStored(msg.msg_id, msg.topic, msg.payload, msg.qos, msg.retain, stored_props,
                                 msg.expiry_at_ms, msg.publisher, now_ms)

    def _set_retained(self, topic: str, msg: Message) -> tuple[list[Any], bool]:
        """(the retained ops, whether the body must be stored for them: the caller stores it ahead of them)."""
        old = self.retained.get(topic)
        op_list: list[Any] = []
        if old is not None:
            self.retained.clear(topic)
            self._unref(old)
        if not msg.payload:
            if old is not None:
                op_list.append(ops.RetainedCleared(topic))
            return op_list, False
        msg.refs += 1
        self.retained.set(topic, msg.msg_id)
        op_list.append(ops.RetainedSet(topic, msg.msg_id))
        return op_list, True

    # --- delivery out ---------------------------------------------------------------------

    def pump(self, conn: Connection, session: Session, now_ms: int) -> list[Any]:
        effects: list[Any] = []
        durable_first: list[Any] = []
        sent: list[Any] = []
        window = max(1, conn.receive_maximum)
        dropped: list[Any] = []
        queue, inflight = session.queue, session.inflight
        # The in-flight entries are the queue's head: the next to send is at index len(inflight). Each step
        # costs O(1), never O(queue) or O(window): a backlog must not make every publish and ack slower.
        while len(inflight) < window and len(inflight) < len(queue):
            i = len(inflight)
            entry = queue[i]
            if not entry.ready:
                break  # rule 2: its commit is pending; what follows it waits too (order)
            msg = self.messages[entry.msg_id]
            if msg.expiry_at_ms and now_ms >= msg.expiry_at_ms:
                del queue[i]
                dropped.append(ops.MessageDropped(session.client_id, entry.msg_id, "expired"))
                self._release_entry(session, entry)
                continue
            if not self.may_receive(conn.username, msg.topic):  # the ACL changed since it was queued
                del queue[i]
                dropped.append(ops.MessageDropped(session.client_id, entry.msg_id, "not authorized"))
                self._release_entry(session, entry)
                self.withheld += 1
                continue
            entry.state = EntryState.INFLIGHT
            entry.packet_id = session.allocate_packet_id()
            inflight[entry.packet_id] = entry
            sends = self.publish_packet(conn, session, entry, dup=False, now_ms=now_ms, msg=msg)
            if entry.qos == 2:
                durable_first.append((entry, sends))  # rule 3
            else:
                sent.append(entry)
                effects += sends
        # One MessagesInflight for everything this pump sent (per QoS): one op, not one per message.
        if durable_first:
            effects.append(Persist((_inflight_op(session, [e for e, _ in durable_first]),),
                                    tuple(s for _, sends in durable_first for s in sends)))
        if sent:
            dropped.append(_inflight_op(session, sent))
        if dropped:
            effects.insert(0, Persist(tuple(dropped), ()))
        return effects

    def publish_packet(self, conn: Connection, session: Session, entry: QueueEntry, *, dup: bool,
                       msg: Message | None = None, now_ms: int = 0) -> list[Any]:
        msg = msg or self.messages[entry.msg_id]
        props = dict(msg.properties) if conn.protocol_version == 5 else {}
        if props and msg.expiry_at_ms and now_ms:
            props[P.MESSAGE_EXPIRY_INTERVAL] = max(0, (msg.expiry_at_ms - now_ms) // 1000)
        if entry.subscription_ids and conn.protocol_version == 5:
            props[P.SUBSCRIPTION_IDENTIFIER] = tuple(entry.subscription_ids)
        topic = msg.topic
        if conn.topic_alias_maximum and not dup:
            alias, first = conn.outbound_alias(topic)
            if alias:
                props[P.TOPIC_ALIAS] = alias
                if not first:
                    topic = ""
        packet = codec.Publish(topic=topic, payload=msg.payload, qos=entry.qos, retain=entry.retain, dup=dup,
                               packet_id=entry.packet_id if entry.qos else None, properties=props)
        return [codec_send(conn, packet)]

    def release(self, session: Session, entry: QueueEntry) -> None:
        self._release_entry(session, entry)

    def _release_entry(self, session: Session, entry: QueueEntry) -> None:
        if entry.state is EntryState.PUBREC:
            return  # released when its PUBREC arrived
        msg = self.messages.get(entry.msg_id)
        if msg is not None:
            session.queued_bytes -= msg.size
            self._unref(msg.msg_id)

    def _unref(self, msg_id: int) -> None:
        msg = self.messages.get(msg_id)
        if msg is None:
            return
        msg.refs -= 1
        if msg.refs <= 0:
            del self.messages[msg_id]
            self.stored_bytes -= msg.stored_size

    def expire_queued(self, sessions: Iterable[Session], now_ms: int) -> list[Any]:
        """Drop the queued (not yet sent) entries of messages past their expiry. The queues are walked only on a
        tick when some stored message fell due: a million queued messages cost nothing while none expires. Once
        walked, a due message has no QUEUED entry left (an entry never goes back to QUEUED, and an expired
        message is never queued again: retained delivery checks expiry), so it leaves the heap."""
        expiries = self._expiries
        if not expiries or expiries[0][0] > now_ms:
            return []
        while expiries and expiries[0][0] <= now_ms:
            heapq.heappop(expiries)
        op_list = []
        for session in sessions:
            for entry in list(session.queue):
                if entry.state is not EntryState.QUEUED:
                    continue
                msg = self.messages.get(entry.msg_id)
                if msg is not None and msg.expiry_at_ms and now_ms >= msg.expiry_at_ms:
                    session.queue.remove(entry)
                    self._release_entry(session, entry)
                    op_list.append(ops.MessageDropped(session.client_id, entry.msg_id, "expired"))
        return op_list

    # --- subscriptions ------------------------------------------------------------------------

    def subscribe(self, core: BrokerCore, conn: Connection, session: Session, packet: codec.Subscribe,
                  now_ms: int) -> list[Any]:
        sub_id = packet.properties.get(P.SUBSCRIPTION_IDENTIFIER, 0)
        if isinstance(sub_id, (list, tuple)):  # repeatable on the wire; a SUBSCRIBE carries at most one
            sub_id = sub_id[0] if sub_id else 0
        codes: list[int] = []
        op_list: list[Any] = core.take_acks(session)  # before a retained message could be queued again
        retained_effects: list[Any] = []
        queued: list[Any] = []
        over_quota = RC.QUOTA_EXCEEDED if conn.protocol_version == 5 else 0x80
        max_subscriptions, max_filters = self.limits.max_subscriptions, self.limits.max_filters_per_subscribe
        for index, requested in enumerate(packet.subscriptions):
            topic_filter = requested.topic_filter
            if index >= max_filters:  # each filter is an op: one SUBSCRIBE must fit one spool commit
                core._count("subscribe_quota_exceeded")
                codes.append(over_quota)
                continue
            try:
                group, plain = topics.parse_shared(topic_filter)
                topics.validate_topic_filter(plain)
            except topics.TopicError as exc:
                codes.append(exc.reason_code if conn.protocol_version == 5 else 0x80)
                continue
            if not core.authorize(conn.username, "subscribe", topic_filter):
                core._count("subscribe_not_authorized")
                codes.append(RC.NOT_AUTHORIZED if conn.protocol_version == 5 else 0x80)
                continue
            if topic_filter not in session.subscriptions and len(session.subscriptions) >= max_subscriptions:
                core._count("subscribe_quota_exceeded")
                codes.append(over_quota)
                continue
            qos = min(requested.qos, 2)
            opts = SubscriptionOptions(qos, requested.no_local, requested.retain_as_published,
                                       requested.retain_handling, sub_id)
            existed = topic_filter in session.subscriptions
            session.subscriptions[topic_filter] = opts
            self.subscriptions.subscribe(session.client_id, topic_filter, opts)
            op_list.append(ops.Subscribed(session.client_id, topic_filter, qos, opts.no_local,
                                          opts.retain_as_published, opts.retain_handling, sub_id))
            codes.append(qos)
            send_retained = group is None and (opts.retain_handling == 0 or (opts.retain_handling == 1 and not existed))
            if send_retained:
                for retained_topic, msg_id in self.retained.matching(plain):
                    msg = self.messages[msg_id]
                    if msg.expiry_at_ms and now_ms >= msg.expiry_at_ms:
                        continue
                    if not self.may_receive(conn.username, retained_topic):
                        self.withheld += 1
                        continue
                    eff = min(qos, msg.qos)
                    ids = (sub_id,) if sub_id else ()
                    entry = QueueEntry(msg_id, eff, True, ids, ready=eff == 0)
                    if eff == 0:
                        retained_effects += self.publish_packet(conn, session, entry, dup=False, msg=msg,
                                                                now_ms=now_ms)
                    else:
                        msg.refs += 1
                        session.queue.append(entry)
                        session.queued_bytes += msg.size
                        op_list.append(ops.MessageQueued(session.client_id, msg_id, eff, True, ids))
                        queued.append(entry)
        suback = codec_send(conn, codec.Suback(packet.packet_id, tuple(codes)))
        return [core_persist(op_list, [suback, *retained_effects], queued,
                             [session.client_id] if queued else [])]

    def unsubscribe(self, conn: Connection, session: Session, packet: codec.Unsubscribe) -> list[Any]:
        codes: list[int] = []
        op_list: list[Any] = []
        for topic_filter in packet.topic_filters:
            if session.subscriptions.pop(topic_filter, None) is not None:
                self.subscriptions.unsubscribe(session.client_id, topic_filter)
                op_list.append(ops.Unsubscribed(session.client_id, topic_filter))
                codes.append(RC.SUCCESS)
            else:
                codes.append(RC.NO_SUBSCRIPTION_EXISTED)
        codes = codes if conn.protocol_version == 5 else []  # a 3.1.1 UNSUBACK carries no reason codes
        return [Persist(tuple(op_list), (codec_send(conn, codec.Unsuback(packet.packet_id, tuple(codes))),))]

    # --- wills and session end ------------------------------------------------------------------

    def set_will(self, session: Session, will: codec.Will, now_ms: int) -> list[Any]:
        op_list = self.drop_will(session)
        # The will's Message Expiry Interval stays relative in its properties: it starts when the will
        # is published (route() turns it into an absolute expiry then).
        props: dict[P, Any] = {k: v for k, v in will.properties.items() if k != P.WILL_DELAY_INTERVAL}
        msg = Message(next(self._msg_ids), will.topic, bytes(will.payload), will.qos, will.retain, props,
                      0, session.client_id, now_ms, refs=1)
        self.messages[msg.msg_id] = msg
        stored_props = _encode_props(props)
        msg.stored_size = stored_estimate(msg, stored_props)
        self.stored_bytes += msg.stored_size
        session.will = Will(msg.msg_id, will.properties.get(P.WILL_DELAY_INTERVAL, 0))
        op_list += [ops.MessageStored(msg.msg_id, msg.topic, msg.payload, msg.qos, msg.retain, stored_props,
                                      msg.expiry_at_ms, msg.publisher, now_ms),
                    ops.WillSet(session.client_id, msg.msg_id, session.will.delay_s)]
        return op_list

    def drop_will(self, session: Session) -> list[Any]:
        if session.will is None:
            return []
        self._unref(session.will.msg_id)
        session.will = None
        session.will_due_ms = 0
        return [ops.WillCleared(session.client_id)]

    def publish_will(self, session: Session, now_ms: int, op_list: list[Any], core: BrokerCore) -> list[Any]:
        will = session.will
        assert will is not None, "called for a session with a will"
        msg = self.messages[will.msg_id]
        packet = codec.Publish(topic=msg.topic, payload=msg.payload, qos=msg.qos, retain=msg.retain, dup=False,
                               packet_id=None, properties=dict(msg.properties))
        op_list += self.drop_will(session)
        effects = self.route(core, None, session, msg.topic, packet, now_ms)
        return effects

    def forget_session(self, session: Session) -> list[Any]:
        self.subscriptions.remove_client(session.client_id)
        for entry in session.queue:
            self._release_entry(session, entry)
        session.queue.clear()
        session.inflight.clear()
        if session.will is not None:
            self._unref(session.will.msg_id)
            session.will = None
        return []


def _inflight_op(session: Session, entries: list[QueueEntry]) -> ops.MessagesInflight:
    return ops.MessagesInflight(session.client_id, tuple(e.msg_id for e in entries),
                                tuple(e.packet_id for e in entries))


def _connected(core: BrokerCore, client_id: str) -> bool:
    session = core.sessions.get(client_id)
    return session is not None and session.conn is not None


def _encode_props(props: Properties) -> bytes:
    """A stored message's properties, as the PUBLISH property block (the spool keeps them opaque)."""
    return encode_properties(props, PacketType.PUBLISH) if props else b""


STORED_OVERHEAD_BYTES: Final = 64  # above an encoded MessageStored's fixed fields (type, ids, lengths, times: < 50)


def stored_estimate(msg: Message, stored_props: bytes) -> int:
    """What one body counts against the spool limit: at least `stored_size` of its encoded MessageStored."""
    return (len(msg.payload) + len(msg.topic.encode()) + len(msg.publisher.encode()) + len(stored_props)
            + STORED_OVERHEAD_BYTES)


def decode_stored_properties(data: bytes) -> dict[P, Any]:
    return decode_properties(Cursor(data), PacketType.PUBLISH) if data else {}


def ack_for(packet: codec.Publish, reason: int = RC.SUCCESS,
            props: dict[P, Any] | None = None) -> codec.Puback | codec.Pubrec:
    """The PUBACK (QoS 1) or PUBREC (QoS 2) that answers `packet`."""
    packet_id = packet.packet_id
    assert packet_id is not None, "a QoS 1 or 2 PUBLISH has a packet id (the codec refuses one without)"
    if packet.qos == 1:
        return codec.Puback(packet_id, reason, props if props is not None else {})
    return codec.Pubrec(packet_id, reason, props if props is not None else {})


def codec_send(conn: Connection, packet: Any) -> Send:
    return Send(conn.conn_id, packet)


def core_persist(op_list: list[Any], sends: list[Any], queued: list[QueueEntry], client_ids: list[str]) -> Persist:
    """Persist the ops; once durable, send the acks, mark the queued entries ready and fill the targets' windows."""
    then = (*sends, Durable(tuple(queued), tuple(client_ids))) if queued else tuple(sends)
    return Persist(tuple(op_list), then)

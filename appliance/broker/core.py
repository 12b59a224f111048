"""The broker core: MQTT sessions, routing and QoS flows, sans-I/O.

Theory of operation
-------------------
Inputs are decoded MQTT packets per connection and the wall clock `now_ms`
(wall, not monotonic: session expiry and message expiry must survive a restart
and a failover). Each input returns a list of effects (`Send`, `Close`,
`Persist(ops, then)`, `Durable` inside a `then`), which the adapter executes in
order; `then` effects run only once the group commit holding `ops` is durable.
The durability rules are in docs/broker.md; each `Persist` below names the rule
it follows. `flush` ends a batch of inputs (one event-loop callback): acks taken
in it are persisted as one op per session and the touched sessions are pumped
once.

Sessions belong to the user that made them (`Session.owner`, replicated by a
`SessionOwned` op). Another user connecting with that client id is refused
(`owner_refusal`: v5 0x87, 3.1.1 return code 5): it never gets the session's
messages, subscriptions or session-present, and never takes the live owner's
connection over. With `Limits.other_user_clean_start` it gets a clean session
instead (the old one discarded, its connection taken over). A session restored
from before owners (None) is claimed by the first user that connects to it.

Every delivery is checked against the ACL in force (`may_receive`): a copy a
subscriber may no longer receive is not routed to it, and a queued one is
dropped when its turn comes (counted, `MessageDropped` "not authorized").

State is rebuilt from the spool at start-up (`restore`). Every change the core
makes to durable state is mirrored by an op in the same call (acks: by the next
`flush`; one lost to a crash means a redelivery, docs/broker.md rule 5), so
replaying the op log reproduces this state.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any, Final

from ..mqtt import codec
from ..mqtt.properties import PropertyId as P
from ..mqtt.wire import ReasonCode as RC
from ..spool import ops
from . import dedup
from .effects import Close, Connacked, Durable, Persist, Send
from .routing import REFUSED, Router, ack_for
from .session import NEVER, Connection, EntryState, QueueEntry, Session, Will
from .sys_topics import SYS_RESERVED_REASON, is_sys_topic

DEFAULT_RECEIVE_MAXIMUM = 32  # our in-flight window towards 3.1.1 clients (they cannot tell us theirs)
SERVER_RECEIVE_MAXIMUM: Final = 100
MAX_OUTCOME_TOPICS: Final = 1000  # topics named in a second's outcome counts: outcomes.py
OTHER_TOPICS: Final = "(other topics)"
SERVER_TOPIC_ALIAS_MAXIMUM: Final = 64
MAX_KEEP_ALIVE_S = 65535


@dataclasses.dataclass(frozen=True, slots=True)
class Limits:
    max_queued_messages: int = 100_000
    max_queued_bytes: int = 64 * 1024 * 1024
    max_spool_bytes: int = 4 * 1024 * 1024 * 1024  # every stored body (Router.stored_bytes); the writer's is above it
    max_packet_size: int = 1024 * 1024
    max_session_expiry_s: int = 7 * 24 * 3600
    message_id_window_ms: int = 300_000  # duplicate suppression by message id (dedup.py)
    max_message_ids: int = 100_000
    other_user_clean_start: bool = False  # see the theory: refuse another user (False) or start it clean
    max_subscriptions: int = 10_000  # filters one session holds; more: SUBACK 0x97 (3.1.1: 0x80) per filter
    max_filters_per_subscribe: int = 1_000  # one SUBSCRIBE's filters past this get 0x97 (3.1.1: 0x80) each
    max_keep_alive_s: int = 0  # 0: no cap; else v5 CONNACK lowers a client's larger (or 0) keep alive to it


Authorizer = Callable[[str | None, str, str], bool]  # (username, "publish"|"subscribe", topic or filter) -> allowed
ReceiveCheck = Callable[[str | None, str], bool]  # (username, topic) -> may be sent a message on it


def allow_all(username: str | None, action: str, topic: str) -> bool:
    return True


def receive_all(username: str | None, topic: str) -> bool:
    return True


def owner_of(username: str | None) -> str:
    return username if username is not None else ""


class BrokerCore:
    def __init__(self, *, node_name: str = "pairmq", limits: Limits = Limits(),
                 authorize: Authorizer = allow_all, id_source: Callable[[], str] | None = None,
                 may_receive: ReceiveCheck = receive_all) -> None:
        self.limits = limits
        self.authorize = authorize
        self.may_receive = may_receive
        self.router = Router(limits, may_receive)
        self.message_ids = dedup.MessageIdHistory(limits.message_id_window_ms, limits.max_message_ids)
        self.sessions: dict[str, Session] = {}
        self.connections: dict[int, Connection] = {}
        self._id_source = id_source
        self._assigned = 0
        self.node_name = node_name
        self.counters: dict[str, int] = {}
        # topic -> a count per (QoS, outcome) at qos * 4 + outcome: what became of each PUBLISH; the node takes them
        self.outcomes: dict[str, list[int]] = {}
        self._dirty: dict[str, None] = {}  # sessions to flush: acks to persist, windows to fill (ordered)

    # --- connections --------------------------------------------------------------------

    def connect(self, conn_id: int, packet: codec.Connect, now_ms: int, *, username: str | None = None) -> list[Any]:
        """A CONNECT already accepted by the front door (protocol, gate, authentication)."""
        v = packet.protocol_version
        props = packet.properties
        client_id = packet.client_id
        assigned = None
        if not client_id:
            client_id = assigned = self._new_client_id()
        effects: list[Any] = []
        expiry_s: int = props.get(P.SESSION_EXPIRY_INTERVAL, 0) if v == 5 else (0 if packet.clean_start else NEVER)
        expiry_s = min(expiry_s, self.limits.max_session_expiry_s) if expiry_s != NEVER else NEVER
        op_list: list[Any] = []
        owner = owner_of(username)
        clean_start = packet.clean_start

        old = self.sessions.get(client_id)
        if old is not None and old.owner is not None and old.owner != owner:
            why = self.owner_refusal(client_id, username)
            if why is not None:  # the front door asks first (authn.py); this holds without it
                self._count("session_owner_refused")
                return [Close(conn_id, RC.NOT_AUTHORIZED, why)]
            self._count("session_owner_clean_start")
            clean_start = True  # the other user's session is discarded, never handed over
        if old is not None and old.conn is not None:
            effects.append(Close(old.conn, RC.SESSION_TAKEN_OVER, "another connection took this session over"))
            effects += self._connection_gone(old.conn, now_ms, taken_over=True, op_list=op_list)
        session = self.sessions.get(client_id)
        present = session is not None and not clean_start
        if session is not None and clean_start:
            op_list += self._delete_session(session)
            session = None
        if session is None:
            session = Session(client_id, v, expiry_s)
            self.sessions[client_id] = session
        session.protocol_version, session.expiry_s, session.conn = v, expiry_s, conn_id
        session.will_due_ms = 0
        op_list.append(ops.SessionOpened(client_id, v, expiry_s, now_ms))
        if session.owner is None:  # new, or from before owners: this user claims it
            session.owner = owner
            op_list.append(ops.SessionOwned(client_id, owner))
        if session.will is not None:  # a reconnect cancels a pending delayed will (v5 §3.1.3.2.2)
            op_list += self.router.drop_will(session)

        conn = Connection(conn_id, client_id, v,
                          receive_maximum=props.get(P.RECEIVE_MAXIMUM, DEFAULT_RECEIVE_MAXIMUM) if v == 5
                          else DEFAULT_RECEIVE_MAXIMUM,
                          maximum_packet_size=props.get(P.MAXIMUM_PACKET_SIZE, 1 << 28),
                          topic_alias_maximum=props.get(P.TOPIC_ALIAS_MAXIMUM, 0) if v == 5 else 0,
                          username=username,
                          request_problem_information=bool(props.get(P.REQUEST_PROBLEM_INFORMATION, 1)))
        self.connections[conn_id] = conn
        if packet.will is not None:
            op_list += self.router.set_will(session, packet.will, now_ms)

        ack_props: dict[P, Any] = {}
        if v == 5:
            ack_props = {P.RECEIVE_MAXIMUM: SERVER_RECEIVE_MAXIMUM, P.TOPIC_ALIAS_MAXIMUM: SERVER_TOPIC_ALIAS_MAXIMUM,
                         P.MAXIMUM_PACKET_SIZE: self.limits.max_packet_size}
            if assigned:
                ack_props[P.ASSIGNED_CLIENT_IDENTIFIER] = assigned
            if expiry_s != props.get(P.SESSION_EXPIRY_INTERVAL, 0):
                ack_props[P.SESSION_EXPIRY_INTERVAL] = expiry_s
            cap = self.limits.max_keep_alive_s
            if cap and not 0 < packet.keep_alive_s <= cap:  # v5 §3.2.2.3.14: the client uses ours instead
                ack_props[P.SERVER_KEEP_ALIVE] = cap
        connack = Send(conn_id, codec.Connack(RC.SUCCESS, present, ack_props))
        if old is None and expiry_s == 0 and packet.will is None:
            # Nothing of this session can outlive a crash (new, expiry 0, no will, nothing deleted), so its
            # CONNACK need not wait for the commit: what a connection storm mostly is. Anything the client does
            # next still waits behind that commit (commits finish in order).
            effects.append(Persist(tuple(op_list)))
            effects.append(connack)
            return effects + self.connacked(Connacked(conn_id), now_ms)
        # The CONNACK waits for the session ops: a client told "session present" must find it after a crash.
        effects.append(Persist(tuple(op_list), (connack, Connacked(conn_id))))
        return effects

    def owner_refusal(self, client_id: str, username: str | None) -> str | None:
        """Why `username` may not connect with `client_id` (its session belongs to another user), or None."""
        session = self.sessions.get(client_id) if client_id else None
        if session is None or session.owner is None or session.owner == owner_of(username):
            return None
        if self.limits.other_user_clean_start:
            return None
        return "this client id's session belongs to another user"

    def remove_users(self, usernames: Iterable[str], now_ms: int) -> list[Any]:
        """Deleted users: end their connections and sessions (the node drops their sockets too)."""
        gone = set(usernames)
        effects: list[Any] = []
        op_list: list[Any] = []
        for conn in list(self.connections.values()):
            if conn.username is not None and conn.username in gone:
                conn.will_on_close = False  # a deleted user's will is not published for it
                effects.append(Close(conn.conn_id, RC.NOT_AUTHORIZED, "the user was deleted"))
                effects += self._connection_gone(conn.conn_id, now_ms, taken_over=True, op_list=op_list)
        for session in list(self.sessions.values()):
            if session.owner and session.owner in gone:
                if session.conn is not None:
                    effects.append(Close(session.conn, RC.NOT_AUTHORIZED, "the session's user was deleted"))
                    effects += self._connection_gone(session.conn, now_ms, taken_over=True, op_list=op_list)
                op_list += self.router.drop_will(session)
                op_list += self._delete_session(session)
                self._count("sessions_of_deleted_users")
        return [Persist(tuple(op_list)), *effects] if op_list else effects

    def connacked(self, done: Connacked, now_ms: int) -> list[Any]:
        """The CONNACK went out: resend what was in flight (DUP), then fill the window."""
        conn = self.connections.get(done.conn)
        if conn is None:
            return []  # lost before its CONNACK: the session's next connection resends
        conn.connacked = True
        return self._resend_and_pump(self.sessions[conn.client_id], conn, now_ms)

    def connection_lost(self, conn_id: int, now_ms: int, *, disconnect: codec.Disconnect | None = None) -> list[Any]:
        """The socket closed (with a DISCONNECT packet, or not). Publishes the will unless told not to."""
        conn = self.connections.get(conn_id)
        if conn is None:
            return []
        if disconnect is not None:
            if disconnect.reason_code == RC.SUCCESS:
                conn.will_on_close = False
            new_expiry: int | None = disconnect.properties.get(P.SESSION_EXPIRY_INTERVAL)
            session = self.sessions.get(conn.client_id)
            if new_expiry is not None and session is not None:
                if session.expiry_s == 0 and new_expiry != 0:
                    pass  # v5 §3.14.2.2.2: a protocol error; keep 0 (the connection is ending anyway)
                else:
                    session.expiry_s = min(new_expiry, self.limits.max_session_expiry_s)
        op_list: list[Any] = []
        effects = self._connection_gone(conn_id, now_ms, taken_over=False, op_list=op_list)
        return [Persist(tuple(op_list)), *effects] if op_list else effects

    def _connection_gone(self, conn_id: int, now_ms: int, *, taken_over: bool, op_list: list[Any]) -> list[Any]:
        conn = self.connections.pop(conn_id)
        session = self.sessions.get(conn.client_id)
        effects: list[Any] = []
        if session is None or session.conn != conn_id:
            return effects
        session.conn = None
        session.disconnected_at_ms = now_ms
        if session.will is not None and conn.will_on_close:
            if session.will.delay_s == 0 or session.expiry_s == 0:
                effects += self.router.publish_will(session, now_ms, op_list, self)
            else:
                session.will_due_ms = now_ms + min(session.will.delay_s, session.expiry_s) * 1000
        elif session.will is not None:
            op_list += self.router.drop_will(session)
        if taken_over:
            pass  # the new connection carries the session on (or clears it, with Clean Start)
        elif session.expiry_s == 0:
            op_list += self._delete_session(session)
        else:
            op_list.append(ops.SessionDisconnected(session.client_id, now_ms, session.expiry_s))
        return effects

    def tick(self, now_ms: int) -> list[Any]:
        """Session expiry, delayed wills, message expiry. Call about once a second."""
        effects: list[Any] = []
        op_list: list[Any] = []
        for session in list(self.sessions.values()):
            if session.will_due_ms and now_ms >= session.will_due_ms and session.will is not None:
                session.will_due_ms = 0
                effects += self.router.publish_will(session, now_ms, op_list, self)
            expires = session.expires_at_ms()
            if expires is not None and now_ms >= expires:
                if session.will is not None:
                    effects += self.router.publish_will(session, now_ms, op_list, self)
                op_list += self._delete_session(session)
        op_list += self.router.expire_queued(self.sessions.values(), now_ms)
        self.message_ids.expire(now_ms)
        if op_list:
            effects.insert(0, Persist(tuple(op_list)))
        return effects

    # --- packets from a connected client --------------------------------------------------

    def packet(self, conn_id: int, packet: object, now_ms: int) -> list[Any]:
        conn = self.connections[conn_id]
        if conn.closing:
            return []  # refused and about to be closed (_refuse_publish): nothing more is taken from it
        # An if-chain, not a table of functions: mypyc compiles it into direct calls.
        if isinstance(packet, codec.Publish):
            return self._on_publish(conn, packet, now_ms)
        if isinstance(packet, codec.Puback):
            return self._on_puback(conn, packet, now_ms)
        if isinstance(packet, codec.Pubrec):
            return self._on_pubrec(conn, packet, now_ms)
        if isinstance(packet, codec.Pubrel):
            return self._on_pubrel(conn, packet, now_ms)
        if isinstance(packet, codec.Pubcomp):
            return self._on_pubcomp(conn, packet, now_ms)
        if isinstance(packet, codec.Subscribe):
            return self._on_subscribe(conn, packet, now_ms)
        if isinstance(packet, codec.Unsubscribe):
            return self._on_unsubscribe(conn, packet, now_ms)
        if isinstance(packet, codec.PingReq):
            return self._on_pingreq(conn, packet, now_ms)
        if isinstance(packet, codec.Disconnect):
            return self._on_disconnect(conn, packet, now_ms)
        return [Close(conn_id, RC.PROTOCOL_ERROR, f"unexpected {type(packet).__name__}")]

    def _on_publish(self, conn: Connection, packet: codec.Publish, now_ms: int) -> list[Any]:
        session = self.sessions[conn.client_id]
        topic = packet.topic
        alias = packet.properties.get(P.TOPIC_ALIAS)
        if alias is not None:
            if not 0 < alias <= SERVER_TOPIC_ALIAS_MAXIMUM:
                return [Close(conn.conn_id, RC.TOPIC_ALIAS_INVALID, f"topic alias {alias} out of range")]
            if topic:
                conn.aliases_in[alias] = topic
            else:
                topic = conn.aliases_in.get(alias, "")
                if not topic:
                    return [Close(conn.conn_id, RC.PROTOCOL_ERROR, f"topic alias {alias} was never set")]
        elif not topic:
            return [Close(conn.conn_id, RC.PROTOCOL_ERROR, "empty topic name without a topic alias")]
        if topic.startswith("$") and is_sys_topic(topic):  # other $ topics are the clients' (sys_topics.py)
            self._count("publish_to_sys_refused")
            self.count_outcome(topic, packet.qos, REFUSED)
            if conn.protocol_version != 5:
                # 3.1.1 has no negative ack: acknowledged and dropped, like mosquitto, rather than disconnected.
                # A barrier like `_refuse_publish`'s: the ack keeps PUBLISH order.
                if not packet.qos:
                    return []
                return [Persist((), (Send(conn.conn_id, ack_for(packet)),))]
            return self._refuse_publish(conn, packet, RC.TOPIC_NAME_INVALID, SYS_RESERVED_REASON)
        if not self.authorize(conn.username, "publish", topic):
            self._count("publish_not_authorized")
            self.count_outcome(topic, packet.qos, REFUSED)
            if conn.protocol_version != 5 and packet.qos:
                # 3.1.1 has no negative ack. Closing would make the client resend the same message on every
                # reconnect, forever; like mosquitto we acknowledge and drop it (counted; the node logs it).
                return [Send(conn.conn_id, ack_for(packet))]
            if conn.protocol_version != 5:
                return []  # QoS 0: dropped, counted
            return self._refuse_publish(conn, packet, RC.NOT_AUTHORIZED, f"not authorized to publish to {topic}")
        if packet.qos == 2 and packet.packet_id in session.inbound_qos2:
            # A retransmission: never routed twice; its PUBREC waits behind the first one's commit.
            return [Persist((), (Send(conn.conn_id, ack_for(packet)),))]
        if packet.qos == 2 and conn.protocol_version == 5 and len(session.inbound_qos2) >= SERVER_RECEIVE_MAXIMUM:
            # v5 §3.3.4: more unfinished QoS 2 PUBLISHes than the Receive Maximum we advertised.
            # (3.1.1 has no such promise: its window is bounded only by the 65,535 packet ids.)
            return [Close(conn.conn_id, RC.RECEIVE_MAXIMUM_EXCEEDED,
                          f"more than {SERVER_RECEIVE_MAXIMUM} QoS 2 PUBLISHes without PUBREL")]
        if packet.qos and P.USER_PROPERTY in packet.properties:
            return self._publish_with_id(conn, session, topic, packet, now_ms)
        return self.router.route(self, conn, session, topic, packet, now_ms)

    def _publish_with_id(self, conn: Connection, session: Session, topic: str, packet: codec.Publish,
                         now_ms: int) -> list[Any]:
        """A QoS 1/2 PUBLISH that may carry a message id: the rules are dedup.py's."""
        try:
            message_id = dedup.message_id_of(packet.properties)
        except dedup.BadMessageId as exc:
            self._count("publish_refused_bad_message_id")
            self.count_outcome(topic, packet.qos, REFUSED)
            return self._refuse_publish(conn, packet, RC.IMPLEMENTATION_SPECIFIC_ERROR, str(exc))
        if message_id is None:
            return self.router.route(self, conn, session, topic, packet, now_ms)
        if self.message_ids.seen(session.client_id, message_id, now_ms):
            self._count("publish_duplicates_suppressed")
            if packet.qos == 1:  # a barrier: the ack waits behind the first copy's commit (and PUBLISH order)
                return [Persist((), (Send(conn.conn_id, ack_for(packet)),))]
            # QoS 2 under a new packet id: its exchange completes (PUBREL gets PUBCOMP), nothing is routed.
            ack = ack_for(packet)
            session.inbound_qos2.add(ack.packet_id)
            return [Persist((ops.InboundQos2Received(session.client_id, ack.packet_id),), (Send(conn.conn_id, ack),))]
        seen = ops.MessageIdSeen(session.client_id, message_id, now_ms)
        effects = self.router.route(self, conn, session, topic, packet, now_ms, extra_ops=(seen,))
        if any(isinstance(e, Persist) and seen in e.ops for e in effects):  # accepted, not refused
            self.message_ids.record(session.client_id, message_id, now_ms)
        return effects

    def _refuse_publish(self, conn: Connection, packet: codec.Publish, reason: int, text: str) -> list[Any]:
        """Refuse one PUBLISH. The answer is a barrier (a Persist without ops): acks go out in PUBLISH order
        (MQTT §4.6), so it waits behind the commits of what this client published before."""
        if conn.protocol_version == 5:
            if packet.qos == 0:
                return []
            props = {P.REASON_STRING: text} if conn.request_problem_information else {}
            return [Persist((), (Send(conn.conn_id, ack_for(packet, reason, props)),))]
        # 3.1.1 has no negative ack: the client is disconnected and retries later. Nothing it sends after the
        # refused PUBLISH is taken (`closing`), so a retry cannot land behind a later message.
        conn.closing = True
        return [Persist((), (Close(conn.conn_id, reason, text),))]

    def _on_puback(self, conn: Connection, packet: codec.Puback, now_ms: int) -> list[Any]:
        return self._ack_outbound(conn, packet.packet_id, now_ms, expect=(1,))

    def _on_pubcomp(self, conn: Connection, packet: codec.Pubcomp, now_ms: int) -> list[Any]:
        return self._ack_outbound(conn, packet.packet_id, now_ms, expect=(2,))

    def _ack_outbound(self, conn: Connection, packet_id: int, now_ms: int, expect: tuple[int, ...]) -> list[Any]:
        session = self.sessions[conn.client_id]
        entry = session.inflight.get(packet_id)
        if entry is None or entry.qos not in expect:
            return []  # an ack for nothing we have in flight: ignored (v5 allows a reason code on PUBREL only)
        return self._end_outbound(session, conn, entry, now_ms)

    def _end_outbound(self, session: Session, conn: Connection, entry: QueueEntry, now_ms: int) -> list[Any]:
        session.remove_inflight(entry)
        self.router.release(session, entry)
        # Rule 5: the ack is not waited for, so the freed slot is refilled without a commit, by `flush` at the
        # end of this event-loop callback: one MessagesAcked and one pump for every ack of one read. The pump
        # sends only entries whose own commit is durable (`ready`): nothing the broker could forget.
        session.acked.append(entry.msg_id)
        self._dirty[session.client_id] = None
        return []

    def flush(self, now_ms: int) -> list[Any]:
        """End of an input batch (the adapter calls it once per event-loop callback): persist the acks taken and
        fill the windows of the sessions that acks or durable commits touched."""
        effects: list[Any] = []
        while self._dirty:
            dirty, self._dirty = self._dirty, {}
            for client_id in dirty:
                session = self.sessions.get(client_id)
                if session is None:
                    continue
                acked = self.take_acks(session)
                if acked:
                    effects.append(Persist(tuple(acked)))
                if session.conn is not None:
                    effects += self._pump(session, self.connections[session.conn], now_ms)
        return effects

    def take_acks(self, session: Session) -> list[Any]:
        """The acks not yet persisted, as ops (before anything that could queue the same message again)."""
        if not session.acked:
            return []
        acked, session.acked = tuple(session.acked), []
        return [ops.MessagesAcked(session.client_id, acked)]

    def _on_pubrec(self, conn: Connection, packet: codec.Pubrec, now_ms: int) -> list[Any]:
        session = self.sessions[conn.client_id]
        entry = session.inflight.get(packet.packet_id)
        if entry is not None and entry.qos == 2 and entry.state is EntryState.INFLIGHT:
            if packet.reason_code >= 0x80:  # the subscriber refused it: the exchange ends here
                return self._end_outbound(session, conn, entry, now_ms)
            # The message itself is no longer needed, only the packet id: released now, as the spool's
            # MessagePubrecReceived releases it (a restored core must count the same references).
            self.router.release(session, entry)
            entry.state = EntryState.PUBREC
            # Rule 3: PUBREL only after the PUBREC is durable.
            return [Persist((ops.MessagePubrecReceived(session.client_id, entry.msg_id),),
                            (Send(conn.conn_id, codec.Pubrel(packet.packet_id)),))]
        if entry is not None and entry.state is EntryState.PUBREC:
            return [Send(conn.conn_id, codec.Pubrel(packet.packet_id))]
        return [Send(conn.conn_id, codec.Pubrel(packet.packet_id, RC.PACKET_IDENTIFIER_NOT_FOUND))] \
            if conn.protocol_version == 5 else [Send(conn.conn_id, codec.Pubrel(packet.packet_id))]

    def _on_pubrel(self, conn: Connection, packet: codec.Pubrel, now_ms: int) -> list[Any]:
        session = self.sessions[conn.client_id]
        if packet.packet_id not in session.inbound_qos2:
            reason = RC.PACKET_IDENTIFIER_NOT_FOUND if conn.protocol_version == 5 else RC.SUCCESS
            return [Send(conn.conn_id, codec.Pubcomp(packet.packet_id, reason))]
        session.inbound_qos2.discard(packet.packet_id)
        # Rule 4: PUBCOMP only once the release is durable.
        return [Persist((ops.InboundQos2Released(session.client_id, packet.packet_id),),
                        (Send(conn.conn_id, codec.Pubcomp(packet.packet_id)),))]

    def _on_subscribe(self, conn: Connection, packet: codec.Subscribe, now_ms: int) -> list[Any]:
        if any(sub.no_local and sub.topic_filter.startswith("$share/") for sub in packet.subscriptions):
            # v5 §3.8.3.1: a Protocol Error, which closes the connection (SUBACK has no code for it).
            return [Close(conn.conn_id, RC.PROTOCOL_ERROR, "no local set on a shared subscription")]
        return self.router.subscribe(self, conn, self.sessions[conn.client_id], packet, now_ms)

    def _on_unsubscribe(self, conn: Connection, packet: codec.Unsubscribe, now_ms: int) -> list[Any]:
        return self.router.unsubscribe(conn, self.sessions[conn.client_id], packet)

    def _on_pingreq(self, conn: Connection, packet: codec.PingReq, now_ms: int) -> list[Any]:
        return [Send(conn.conn_id, codec.PingResp())]

    def _on_disconnect(self, conn: Connection, packet: codec.Disconnect, now_ms: int) -> list[Any]:
        return [*self.connection_lost(conn.conn_id, now_ms, disconnect=packet), Close(conn.conn_id)]

    # --- delivery --------------------------------------------------------------------------

    def _resend_and_pump(self, session: Session, conn: Connection, now_ms: int) -> list[Any]:
        """On (re)connect: resend what was in flight (DUP), then fill the window."""
        effects: list[Any] = []
        withheld: list[QueueEntry] = []
        for entry in list(session.inflight.values()):
            if entry.state is EntryState.PUBREC:
                effects.append(Send(conn.conn_id, codec.Pubrel(entry.packet_id)))
            elif not self.may_receive(conn.username, self.router.messages[entry.msg_id].topic):
                withheld.append(entry)  # the ACL changed since it was first sent: not sent again
            else:
                effects += self.router.publish_packet(conn, session, entry, dup=True)
        if withheld:
            for entry in withheld:
                session.remove_inflight(entry)
                self.router.release(session, entry)
                self.router.withheld += 1
            effects.insert(0, Persist(tuple(ops.MessageDropped(session.client_id, e.msg_id, "not authorized")
                                            for e in withheld)))
        return effects + self._pump(session, conn, now_ms)

    def _pump(self, session: Session, conn: Connection | None, now_ms: int) -> list[Any]:
        """Send queued entries while the client's in-flight window has room."""
        if conn is None or not conn.connacked:
            return []
        return self.router.pump(conn, session, now_ms)

    def durable(self, done: Durable, now_ms: int) -> list[Any]:
        """The commit behind `done` is durable: its queue entries may go out (rule 2)."""
        for entry in done.entries:
            entry.ready = True
        for client_id in done.client_ids:
            self._dirty[client_id] = None  # pumped by `flush`, once for every commit of this callback
        return []

    def deliver_to(self, client_id: str, now_ms: int) -> list[Any]:
        session = self.sessions.get(client_id)
        if session is None or session.conn is None:
            return []
        return self._pump(session, self.connections[session.conn], now_ms)

    # --- sessions ----------------------------------------------------------------------------

    def _delete_session(self, session: Session) -> list[Any]:
        self.sessions.pop(session.client_id, None)
        session.acked.clear()  # SessionDeleted removes every queue entry of it
        op_list = self.router.forget_session(session)
        op_list.append(ops.SessionDeleted(session.client_id))
        return op_list

    def _new_client_id(self) -> str:
        if self._id_source is not None:
            return self._id_source()
        self._assigned += 1
        return f"{self.node_name}-auto-{self._assigned}"

    def _count(self, what: str) -> None:
        self.counters[what] = self.counters.get(what, 0) + 1

    def count_outcome(self, topic: str, qos: int, outcome: int) -> None:
        """One client PUBLISH's outcome (routing.OUTCOME_NAMES, outcomes.py's rules): at most MAX_OUTCOME_TOPICS
        topics until the node takes them, the rest summed under OTHER_TOPICS."""
        counts = self.outcomes
        row = counts.get(topic)
        if row is None:
            if len(counts) >= MAX_OUTCOME_TOPICS:
                topic = OTHER_TOPICS
                row = counts.get(topic)
            if row is None:
                row = [0] * 12
                counts[topic] = row
        row[qos * 4 + outcome] += 1

    def session_will(self, session: Session) -> Will | None:
        return session.will


def limits_from_config(limits: Any) -> Limits:
    """The core's limits from the group file's [limits] table (`appliance.config.Limits`)."""
    return Limits(max_queued_messages=limits.session_queue_max_messages,
                  max_queued_bytes=limits.session_queue_max_bytes, max_spool_bytes=limits.spool_max_bytes,
                  message_id_window_ms=limits.message_id_window_s * 1000,
                  max_message_ids=limits.message_id_history_max,
                  other_user_clean_start=bool(limits.session_other_user_clean_start),
                  max_subscriptions=limits.subscriptions_per_client_max,
                  max_filters_per_subscribe=limits.subscribe_max_filters,
                  max_keep_alive_s=limits.max_keepalive_s)


def restore(core: BrokerCore, state: Any, now_ms: int) -> None:
    """Rebuild the core's state from the spool's (`appliance.spool.state.SpoolState`) at start-up.

    No connection survives a restart: every session comes back offline, its
    expiry counted from now if it was connected when the node stopped.
    """
    from .routing import decode_stored_properties, stored_estimate
    from .session import Message, SubscriptionOptions

    router = core.router
    for msg_id, stored in state.messages.items():
        msg = Message(msg_id, stored.topic, stored.payload, stored.qos, stored.retain,
                      decode_stored_properties(stored.properties), stored.expiry_at_ms, stored.publisher,
                      stored.created_at_ms)
        msg.stored_size = stored_estimate(msg, stored.properties)
        router.hold(msg)
        router.stored_bytes += msg.stored_size
    for topic, msg_id in state.retained.items():
        router.retained.set(topic, msg_id)
        router.messages[msg_id].refs += 1
    for record in state.sessions.values():
        session = Session(record.client_id, record.protocol_version, record.expiry_s)
        session.owner = record.owner
        session.disconnected_at_ms = now_ms if record.connected else record.disconnected_at_ms
        for sub in record.subscriptions:
            opts = SubscriptionOptions(sub.qos, sub.no_local, sub.retain_as_published, sub.retain_handling,
                                       sub.subscription_id)
            session.subscriptions[sub.topic_filter] = opts
            router.subscriptions.subscribe(record.client_id, sub.topic_filter, opts)
        # The in-flight entries are the queue's head (session.py); the spool keeps queue order, so they come first.
        for e in sorted(record.queue, key=lambda e: not e.packet_id):
            state_ = (EntryState.PUBREC if e.pubrec_received else
                      EntryState.INFLIGHT if e.packet_id else EntryState.QUEUED)
            entry = QueueEntry(e.msg_id, e.qos, e.retain, e.subscription_ids, state_, e.packet_id)
            session.queue.append(entry)
            if e.packet_id:
                session.inflight[e.packet_id] = entry
            if not e.pubrec_received:
                msg = router.messages[e.msg_id]
                msg.refs += 1
                session.queued_bytes += msg.size
        session.inbound_qos2 = set(record.inbound_qos2)
        if record.will is not None:
            session.will = Will(record.will.msg_id, record.will.delay_s)
            router.messages[record.will.msg_id].refs += 1
        session.next_packet_id = max((e.packet_id for e in record.queue), default=0) % 65535 + 1
        core.sessions[record.client_id] = session
    router.restart_ids(max([state.head.seq, *state.messages]) + 1)
    core.message_ids.restore(state.message_ids, now_ms)

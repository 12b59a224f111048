"""One MQTT client connection's rules, with no I/O: bytes and time in, bytes and events out.

Rules:

- CONNECT with `may_serve()` true: handed on (`next_event` returns it); the
  listener queues it, then calls `check_connect` and `accept` or `refuse`.
  `check_connect`: v5 with the gate false: CONNACK 0x9C "Use another server"
  with Server Reference when the gate knows the active, else 0x88 "Server
  unavailable"; 3.1.1 return code 3. 3.1.1: an empty client id without clean
  session is refused (return code 2). v5 with enhanced authentication: 0x8C.
  A will topic under `$SYS` (the broker's, as for PUBLISH: sys_topics.py):
  v5 0x90, 3.1.1 close. With `max_keep_alive_s` set, a 3.1.1 keep alive of 0
  or above it: return code 2 (3.1.1 cannot be told another value; mosquitto
  does the same). Every refusal is a CONNACK, then close.
- `accept`: with a broker, `open_session` hands the CONNECT over and the
  broker sends the CONNACK; alone, CONNACK success here (v5: an empty client
  id gets one as Assigned Client Identifier; our Maximum Packet Size is
  advertised).
- Once accepted with a broker, every packet but DISCONNECT asks the gate
  first (once per turn: one read's packets arrived together); false: v5
  DISCONNECT 0x8B, 3.1.1 close. A client's DISCONNECT is handed on and the
  connection closes (nothing is sent).
- Without a broker (the front door alone): PINGREQ gets PINGRESP; any other
  packet v5 DISCONNECT 0x83 "not supported by this node yet", 3.1.1 close.
- Bad input (MqttError from the codec): while connecting, v5 CONNACK with the
  error's reason code, 3.1.1/unknown a plain close, and an unsupported
  protocol level a 3.1.1-format CONNACK return code 1; after CONNACK, v5
  DISCONNECT with the reason code, 3.1.1 close. (MQTT 5 §4.13.1: an error in
  CONNECT is answered with CONNACK, never DISCONNECT.)
- Timers: no complete CONNECT within `connect_timeout_s`: close. Keep alive
  k > 0 (v5: the cap when the client asked for 0 or more than it; the
  CONNACK's Server Keep Alive says so): no packet within 1.5 k: v5 DISCONNECT
  0x8D, close; a client whose packets we do not read (`handle_timer(...,
  unread=True)`) is not late.
- A close asked by the broker before any CONNACK is a v5 CONNACK with its
  reason (a DISCONNECT before the CONNACK breaks the protocol), after it a v5
  DISCONNECT; 3.1.1 clients are simply closed.
- Every connection reports exactly one "client_closed" event.

Theory of operation: the adapter feeds what it reads to `receive_data(data,
now_ms)` and takes packets from `next_event()` until it returns None; the
session answers what it can itself (queued for `data_to_send()`) and sets
`closing` when the connection must end, after which nothing more is sent or
handed on. The timer is lazy: `get_timer()` is re-read only when the adapter
arms its one timer, and `handle_timer` finds the real deadline from the last
read, so reading packets moves no timer.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Sequence
from typing import Final

from pairmq.appliance.broker.sys_topics import is_sys_topic
from pairmq.appliance.mqtt.codec import (
    CONNACK_REASON_CODES, DISCONNECT_REASON_CODES, V311_RETURN_CODES, Connack, Connect, Disconnect,
    Packet, PacketReader, PingReq, PingResp, encode_packet,
)
from pairmq.appliance.mqtt.properties import PropertyId
from pairmq.appliance.mqtt.wire import MQTT_3_1_1, MQTT_5, MqttError, ReasonCode

REASON_STRING_MAX_CHARS = 200
NOT_SUPPORTED_YET = "not supported by this node yet"
WILL_TOPIC_RESERVED = "will topics under $SYS are the broker's"
KEEP_ALIVE_GRACE = 1.5  # MQTT §3.1.2.10: the server may wait one and a half keep alive periods

HANDLED: Final = object()  # next_event: a packet the session answered itself

EventSink = Callable[[str, dict[str, object]], None]
# An accepted CONNECT to the broker, which sends the CONNACK: the client id it gave, None once it closed us.
OpenSession = Callable[[Connect], "str | None"]


@dataclasses.dataclass(frozen=True, slots=True)
class SessionLimits:
    max_packet_size: int
    max_connect_bytes: int  # the codec refuses a larger CONNECT from its fixed header
    max_connect_properties: int
    connect_timeout_s: float
    max_keep_alive_s: int = 0  # 0: no cap


@dataclasses.dataclass(frozen=True, slots=True)
class FrontDoor:
    """What every session of one listener asks of it."""
    may_serve: Callable[[], bool]  # the gate: True only while this node holds a live activity lease
    server_reference: Callable[[], "str | None"]  # "host:port" of the active node, if known
    emit: EventSink
    new_client_id: Callable[[], str]  # for a v5 client that sent none, when there is no broker to assign one


def effective_keep_alive(asked_s: int, cap_s: int) -> int:
    """The keep alive a client runs with: its own, or the cap when it asked for more or for none (0)."""
    return cap_s if cap_s and not 0 < asked_s <= cap_s else asked_s


class Phase(enum.Enum):
    AWAIT_CONNECT = "await_connect"  # nothing complete read yet; the connect timeout runs
    CONNECTING = "connecting"  # the CONNECT waits for the listener's checks; nothing more is read
    ACCEPTED = "accepted"  # CONNACK success is out (or the broker's to send)


# The only moves; closing is a flag beside the phase (a close can come in any phase).
TRANSITIONS: dict[Phase, frozenset[Phase]] = {
    Phase.AWAIT_CONNECT: frozenset({Phase.CONNECTING}),
    Phase.CONNECTING: frozenset({Phase.ACCEPTED}),
    Phase.ACCEPTED: frozenset(),
}


class MqttSession:
    __slots__ = (
        "peer", "phase", "closing", "close_reason", "connacked", "client_id", "username", "keep_alive_s",
        "peer_max_packet_size", "_reader", "_limits", "_door", "_open_session", "_forwarding", "_gate_ok",
        "_last_read_ms", "_deadline_ms", "_to_send", "_closed_reported")

    def __init__(self, peer: str, now_ms: int, limits: SessionLimits, door: FrontDoor,
                 open_session: OpenSession | None = None) -> None:
        self.peer = peer
        self.phase = Phase.AWAIT_CONNECT
        self.closing = False
        self.close_reason = ""
        self.connacked = False  # a CONNACK went out: a refusal from here on is a DISCONNECT, before it a CONNACK
        self.client_id: str | None = None
        self.username: str | None = None
        self.keep_alive_s = 0
        self.peer_max_packet_size: int | None = None
        self._reader = PacketReader(max_packet_size=limits.max_packet_size, max_connect_size=limits.max_connect_bytes,
                                    max_connect_properties=limits.max_connect_properties)
        self._limits = limits
        self._door = door
        self._open_session = open_session
        self._forwarding = False  # accepted with a broker: its packets are the broker's
        self._gate_ok: bool | None = None  # the gate's answer for this turn (see begin_turn)
        self._last_read_ms = now_ms
        self._deadline_ms: int | None = now_ms + round(limits.connect_timeout_s * 1000)
        self._to_send: list[bytes] = []
        self._closed_reported = False

    @property
    def accepted(self) -> bool:
        return self.phase is Phase.ACCEPTED

    @property
    def protocol_version(self) -> int | None:
        return self._reader.protocol_version

    @property
    def buffered_bytes(self) -> int:
        return self._reader.buffered_bytes

    # --- inputs ------------------------------------------------------------------------------

    def receive_data(self, data: bytes, now_ms: int) -> None:
        if self.closing:
            return
        self._last_read_ms = now_ms
        self._reader.feed(data)

    def begin_turn(self) -> None:
        """The adapter starts taking packets (a read, or reading resumed): the gate is asked afresh."""
        self._gate_ok = None

    def next_event(self) -> Packet | object | None:
        """Takes one packet. Returns it when the adapter must hand it on (a CONNECT to the listener's checks, or
        any packet to the broker once accepted with one), HANDLED when the session answered it itself, or None:
        nothing complete is buffered, or the connection is closing."""
        if self.closing:
            return None
        try:
            packet = self._reader.next_packet()
        except MqttError as err:
            self._bad_packet(err)
            return None
        if packet is None:
            return None
        if self._forwarding:
            if type(packet) is Disconnect:  # the codec makes exactly these classes: `is` tests
                self.close(f"client sent DISCONNECT 0x{packet.reason_code:02X}")
                return packet
            if not (self._gate_ok if self._gate_ok is not None else self._ask_gate()):
                self._answer_and_close(Disconnect(ReasonCode.SERVER_SHUTTING_DOWN), "this node may no longer serve")
                return HANDLED
            return packet
        return packet if self._handle_alone(packet) else HANDLED

    def handle_timer(self, now_ms: int, *, unread: bool = False) -> None:
        """`unread`: the adapter does not read this client now (it cannot be late meanwhile)."""
        deadline = self._deadline_ms
        if self.closing or deadline is None:
            return
        if self.phase is not Phase.ACCEPTED:
            if now_ms >= deadline:
                self.close(f"no CONNECT within {self._limits.connect_timeout_s} s")
            return
        grace_ms = self._grace_ms()
        due = self._last_read_ms + grace_ms
        if unread or now_ms < due:
            self._deadline_ms = max(due, now_ms + grace_ms) if unread else due
            return
        self._deadline_ms = None
        self._answer_and_close(Disconnect(ReasonCode.KEEP_ALIVE_TIMEOUT),
                               f"no packet within 1.5 x keep alive {self.keep_alive_s} s")

    # --- the CONNECT checks (the listener's CONNECT pipeline calls these) -----------------------

    def check_connect(self, c: Connect) -> bool:
        """The checks before credentials; False when the CONNECT was refused."""
        v5 = c.protocol_version == MQTT_5
        if v5:
            self.peer_max_packet_size = c.properties.get(PropertyId.MAXIMUM_PACKET_SIZE)
        if not self._door.may_serve():
            reference = self._door.server_reference()
            if v5 and reference:
                self.refuse(c, ReasonCode.USE_ANOTHER_SERVER, f"not active; active is {reference}",
                            {PropertyId.SERVER_REFERENCE: reference})
            else:
                self.refuse(c, ReasonCode.SERVER_UNAVAILABLE, "not active; active unknown")
            return False
        if not v5 and not c.client_id and not c.clean_start:
            self.refuse(c, ReasonCode.CLIENT_IDENTIFIER_NOT_VALID, "empty client id without clean session")
            return False
        if v5 and PropertyId.AUTHENTICATION_METHOD in c.properties:
            self.refuse(c, ReasonCode.BAD_AUTHENTICATION_METHOD, "enhanced authentication is not supported")
            return False
        cap = self._limits.max_keep_alive_s
        if not v5 and cap and not 0 < c.keep_alive_s <= cap:
            self.refuse(c, ReasonCode.CLIENT_IDENTIFIER_NOT_VALID,
                        f"keep alive {c.keep_alive_s} s: this server's maximum is {cap} s (and 0 is off)")
            return False
        if c.will is not None and is_sys_topic(c.will.topic):
            # A will is published for the client: the broker's rule for PUBLISH holds for it too.
            if v5:
                self.refuse(c, ReasonCode.TOPIC_NAME_INVALID, WILL_TOPIC_RESERVED)
            else:
                self.close(f"refused: {WILL_TOPIC_RESERVED}")  # 3.1.1 has no return code for it
            return False
        return True

    def accept(self, c: Connect, now_ms: int) -> None:
        """CONNACK success (from the broker, or here without one); the keep alive runs from now."""
        self._enter(Phase.ACCEPTED)  # before any write: a drop from here on must DISCONNECT
        self.keep_alive_s = effective_keep_alive(c.keep_alive_s, self._limits.max_keep_alive_s)
        self.username = c.username
        if self._open_session is not None:
            given = self._open_session(c)
            self.client_id = given if given is not None else c.client_id
            self._forwarding = not self.closing
        else:
            self.client_id = c.client_id or self._door.new_client_id()
            props: dict[PropertyId, object] = {}
            if c.protocol_version == MQTT_5:
                props[PropertyId.MAXIMUM_PACKET_SIZE] = self._limits.max_packet_size
                if not c.client_id:
                    props[PropertyId.ASSIGNED_CLIENT_IDENTIFIER] = self.client_id
                if self.keep_alive_s != c.keep_alive_s:
                    props[PropertyId.SERVER_KEEP_ALIVE] = self.keep_alive_s
            self.send(Connack(ReasonCode.SUCCESS, False, props))
        self._door.emit("client_accepted", {
            "client_id": self.client_id, "protocol_version": c.protocol_version, "peer": self.peer,
            "keep_alive_s": self.keep_alive_s, "clean_start": c.clean_start, "assigned_client_id": not c.client_id})
        if self.closing:
            return
        self._last_read_ms = now_ms
        self._deadline_ms = now_ms + self._grace_ms() if self.keep_alive_s else None

    def refuse(self, c: Connect, reason: ReasonCode, why: str, extra: dict[PropertyId, object] | None = None) -> None:
        fields: dict[str, object] = {
            "client_id": c.client_id, "protocol_version": c.protocol_version,
            "peer": self.peer, "reason_code": int(reason), "reason": why}
        if c.protocol_version == MQTT_3_1_1:
            fields["return_code"] = V311_RETURN_CODES[reason]
        else:
            fields.update({k.name.lower(): v for k, v in (extra or {}).items()})
        self.client_id = c.client_id or None
        self._door.emit("client_refused", fields)
        props = {PropertyId.REASON_STRING: why, **(extra or {})} if c.protocol_version == MQTT_5 else {}
        self.send(Connack(reason, False, props), c.protocol_version)
        self.close(f"refused 0x{reason:02X}: {why}")

    # --- closes asked from outside -------------------------------------------------------------

    def close_with(self, reason: int, why: str) -> None:
        """The broker closes this client with `reason` (0: no reason to give)."""
        if self.closing:
            return
        if self.protocol_version == MQTT_5 and reason:
            props = {PropertyId.REASON_STRING: why[:REASON_STRING_MAX_CHARS]} if why else {}
            if not self.connacked and reason in CONNACK_REASON_CODES:
                # Its CONNECT waited for a commit that failed (a full disk): a DISCONNECT before the CONNACK
                # breaks the protocol (paho reports 0x80); the CONNACK carries the refusal instead.
                self.send(Connack(ReasonCode(reason), False, props))
            else:
                self.send(Disconnect(ReasonCode(reason), props))
        self._forwarding = False
        self.close(f"closed by the broker (0x{reason:02X}): {why}")

    def drop(self, reason: ReasonCode, server_reference: str | None) -> bool:
        """This node drops the client (a handover, a shutdown, a deleted user); False when already closing."""
        if self.closing:
            return False
        if self.accepted and self.protocol_version == MQTT_5:
            props = {PropertyId.SERVER_REFERENCE: server_reference} if server_reference else {}
            self.send(Disconnect(reason, props))
        self.close(f"dropped by this node (0x{reason:02X})")
        return True

    def close(self, why: str) -> bool:
        """Nothing more is sent or handed on; False when it was closing already (the first reason stays)."""
        if self.closing:
            return False
        self.closing = True
        self.close_reason = why
        self._forwarding = False
        self._reader.clear()  # a closing connection hands nothing on: its buffer is freed now, not with it
        return True

    # --- outputs -----------------------------------------------------------------------------

    def send(self, packet: Packet, version: int | None = None) -> None:
        if self.closing:
            return
        if type(packet) is Connack:
            self.connacked = True
        data = encode_packet(packet, version or self.protocol_version or MQTT_3_1_1,
                             max_packet_size=self.peer_max_packet_size)
        if data is not None:  # larger than the client accepts: discarded, as v5 §3.1.2.11.4 says
            self._to_send.append(data)

    def data_to_send(self) -> Sequence[bytes]:
        """The bytes to write, in order."""
        out = self._to_send
        if not out:
            return ()  # the usual case once accepted: nothing allocated
        self._to_send = []
        return out

    def get_timer(self) -> int | None:
        """When `handle_timer` must run next (it may find the deadline moved on); None: no timer."""
        return None if self.closing else self._deadline_ms

    def report_closed(self) -> None:
        """The connection is gone: its one "client_closed" event."""
        if self._closed_reported:
            return
        self._closed_reported = True
        self._door.emit("client_closed", {
            "client_id": self.client_id, "protocol_version": self.protocol_version,
            "peer": self.peer, "was_accepted": self.accepted, "reason": self.close_reason})

    # --- internals ---------------------------------------------------------------------------

    def _grace_ms(self) -> int:
        return round(KEEP_ALIVE_GRACE * self.keep_alive_s * 1000)

    def _enter(self, phase: Phase) -> None:
        if phase not in TRANSITIONS[self.phase]:  # our own bug: the adapter aborts the connection
            raise AssertionError(f"session {self.peer}: {self.phase.value} -> {phase.value} is not a transition")
        self.phase = phase

    def _ask_gate(self) -> bool:
        self._gate_ok = ok = self._door.may_serve()
        return ok

    def _handle_alone(self, packet: Packet) -> bool:
        """A packet before CONNACK, or with no broker: True when it is a CONNECT to hand on."""
        if isinstance(packet, Connect):
            if self.accepted:  # the codec refuses a second CONNECT; this is a belt for the braces
                self._answer_and_close(Disconnect(ReasonCode.PROTOCOL_ERROR), "a second CONNECT")
                return False
            self._enter(Phase.CONNECTING)
            self._deadline_ms = None  # the listener's checks have their own bounds
            return True
        if isinstance(packet, Disconnect):
            self.close(f"client sent DISCONNECT 0x{packet.reason_code:02X}")
        elif not self._door.may_serve():
            self._answer_and_close(Disconnect(ReasonCode.SERVER_SHUTTING_DOWN), "this node may no longer serve")
        elif isinstance(packet, PingReq):
            self.send(PingResp())
        else:
            name = packet.packet_type.name
            self._answer_and_close(
                Disconnect(ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR, {PropertyId.REASON_STRING: NOT_SUPPORTED_YET}),
                f"{name} is {NOT_SUPPORTED_YET}")
        return False

    def _bad_packet(self, err: MqttError) -> None:
        version = err.protocol_version
        self._door.emit("bad_packet", {
            "peer": self.peer, "client_id": self.client_id, "protocol_version": version,
            "reason_code": int(err.reason_code), "reason": err.message})
        why = err.message[:REASON_STRING_MAX_CHARS]
        if not self.accepted:
            if err.reason_code == ReasonCode.UNSUPPORTED_PROTOCOL_VERSION:
                self.send(Connack(err.reason_code), MQTT_3_1_1)
            elif version == MQTT_5:
                code: ReasonCode = (err.reason_code if err.reason_code in CONNACK_REASON_CODES
                                    else ReasonCode.UNSPECIFIED_ERROR)
                self.send(Connack(code, False, {PropertyId.REASON_STRING: why}), MQTT_5)
        elif version == MQTT_5:
            code = err.reason_code if err.reason_code in DISCONNECT_REASON_CODES else ReasonCode.PROTOCOL_ERROR
            self.send(Disconnect(code, {PropertyId.REASON_STRING: why}))
        self.close(f"bad packet: {err.message}")

    def _answer_and_close(self, v5_answer: Disconnect, why: str) -> None:
        if self.protocol_version == MQTT_5:
            self.send(v5_answer)
        self.close(why)

"""One client connection as an asyncio Protocol; the rules it follows are in listener.py's docstring.

Theory of operation: `data_received` feeds the PacketReader and handles
whole packets until the reader runs dry or reading is paused. Reading is
paused for any of four reasons (bits of `_paused`): the CONNECT waits in the
listener's queue, the in-flight window is full, our output to the client
backs up, or this callback has used its PACKETS_PER_TURN. Packets already buffered stay in the reader until every reason is
gone. One timer handle per connection serves the connect timeout and the
keep alive (it is re-armed lazily from the time of the last read, not per
packet); a second one exists only while output is stalled or a close is in
progress. Output goes through `_write`, which the listener flushes once per
loop turn.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from typing import TYPE_CHECKING

from pairmq.appliance.mqtt.codec import (
    CONNACK_REASON_CODES, DISCONNECT_REASON_CODES, V311_RETURN_CODES, Connack, Connect, Disconnect,
    Packet, PacketReader, PingReq, PingResp, encode_packet,
)
from pairmq.appliance.mqtt.packets import Puback, Subscribe, Unsubscribe
from pairmq.appliance.mqtt.properties import PropertyId
from pairmq.appliance.mqtt.publish import Publish
from pairmq.appliance.mqtt.wire import MQTT_3_1_1, MQTT_5, MqttError, ReasonCode

if TYPE_CHECKING:
    from pairmq.appliance.mqtt.listener import MqttListener

log = logging.getLogger("pairmq.appliance.mqtt.listener")

REASON_STRING_MAX_CHARS = 200
NOT_SUPPORTED_YET = "not supported by this node yet"
WILL_TOPIC_RESERVED = "will topics starting with $ are reserved"
_WINDOWED = frozenset((Publish, Subscribe, Unsubscribe))

# Why reading is paused (bits of MqttConnection._paused).
_CONNECTING = 1
_WINDOW = 2
_OUTPUT = 4
_TURN = 8  # handled PACKETS_PER_TURN in this callback: the rest waits for the next loop turn
_HANDOVER = 16  # the node hands activity over: nothing more is taken until it drops us or serves again
_MATE = 32  # a publisher held while the mate link's backlog is over max_lag (overload.MateBackpressure)
# One 256 KiB read holds ~2,500 small PUBLISHes (~40 ms of work): other clients, timers and heartbeats get the loop
# back after this many.
PACKETS_PER_TURN = 256


class MqttConnection(asyncio.Protocol):
    __slots__ = (
        "_l", "_loop", "transport", "_packets", "peer", "accepted", "connacked", "accepted_at", "closing", "close_reason",
        "client_id", "keep_alive_s", "peer_max_packet_size", "conn_id", "inflight", "username", "_paused", "_out", "_written",
        "_timer", "_last_read", "_aux_timer", "_stall_mark", "_closed_emitted", "_gate_ok", "_preauth_addr", "_held")

    def __init__(self, listener: MqttListener) -> None:
        self._l = listener
        self._loop = listener._loop
        self.transport: asyncio.Transport | None = None
        preauth = listener.budget.limits
        self._packets = PacketReader(max_packet_size=listener.max_packet_size,
                                     max_connect_size=preauth.max_connect_bytes,
                                     max_connect_properties=preauth.max_connect_properties)
        self.peer = "?"
        self.accepted = False
        self.connacked = False  # a CONNACK went out: a refusal from here on is a DISCONNECT, before it a CONNACK
        self.accepted_at = 0.0  # wall clock (s) of CONNACK success: `pairmq show clients`
        self.closing = False
        self.close_reason = ""
        self.client_id: str | None = None
        self.username: str | None = None  # once accepted: config-sync drops a deleted user's clients
        self.keep_alive_s = 0
        self.peer_max_packet_size: int | None = None
        self.conn_id: int | None = None  # the broker's name for this connection once accepted
        self.inflight = 0  # windowed packets whose effects are not complete yet
        self._paused = 0
        self._out: list[bytes] | None = None
        self._written = 0
        self._timer: asyncio.TimerHandle | None = None
        self._last_read = 0.0
        self._aux_timer: asyncio.TimerHandle | None = None  # output stall or close abort
        self._stall_mark = 0
        self._closed_emitted = False
        self._gate_ok: bool | None = None  # the gate's answer for the read being handled (see _run)
        self._preauth_addr: str | None = None  # counted by the listener's PreAuthBudget until admitted or gone
        self._held = 0  # bytes buffered while pre-auth, as the budget counts them

    @property
    def protocol_version(self) -> int | None:
        return self._packets.protocol_version

    # --- transport callbacks ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        # No TCP_NODELAY here: asyncio and uvloop both set it on every TCP transport, and uvloop's
        # get_extra_info("socket") alone costs ~25 us per connection in a storm.
        peername = transport.get_extra_info("peername")
        self.peer = _format_peer(peername)
        self._l.opened(self)
        address = str(peername[0]) if isinstance(peername, tuple) and peername else self.peer
        why = self._l.budget.open(address)
        if why is not None:
            self._l.emit("connection_refused", {"peer": self.peer, "reason": why})
            self.abort(f"refused before CONNECT: {why}")
            return
        self._preauth_addr = address
        self._last_read = self._loop.time()
        self._timer = self._loop.call_at(self._last_read + self._l.connect_timeout_s, self._on_timer)

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return
        self._last_read = self._loop.time()
        self._packets.feed(data)
        self._run()
        if self._preauth_addr is not None and not self.closing:
            held = self._packets.buffered_bytes
            delta, self._held = held - self._held, held
            if not self._l.budget.hold(delta):
                self.abort(f"pre-authentication buffers are full ({self._l.budget.limits.max_bytes} bytes in total)")

    def eof_received(self) -> bool:
        self._close("peer closed the connection")
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closing:
            self.closing = True
            self.close_reason = f"connection error: {exc}" if exc else "peer closed the connection"
        for timer in (self._timer, self._aux_timer):
            if timer is not None:
                timer.cancel()
        self._out = None
        self._release_preauth()
        if self.accepted:
            self._l.accepted_count -= 1
        self._l.closed(self)
        try:
            self.broker_lost()
        except Exception:
            log.exception("the broker failed on losing %s", self.peer)
        self.emit_closed()

    def pause_writing(self) -> None:
        self._pause(_OUTPUT)
        self._stall_mark = self._sent()
        self._arm_aux(self._l.write_timeout_s, self._check_stall)

    def resume_writing(self) -> None:
        if self._aux_timer is not None and not self.closing:
            self._aux_timer.cancel()
            self._aux_timer = None
        self._resume(_OUTPUT)

    # --- reading and handling ----------------------------------------------------------------

    def _run(self) -> None:
        """Handle buffered packets until none is left, or reading is paused."""
        try:
            packets = self._packets
            budget = PACKETS_PER_TURN
            # The gate is asked once per read, not per packet (~1 us each): one read's packets arrived together.
            self._gate_ok = None
            while not self.closing and not self._paused:
                if not budget:
                    self._pause(_TURN)
                    self._loop.call_soon(self._resume, _TURN)
                    return
                budget -= 1
                try:
                    packet = packets.next_packet()
                except MqttError as err:
                    self._on_bad_packet(err)
                    return
                if packet is None:
                    return
                self._handle(packet)
        except Exception:
            log.exception("MQTT connection %s failed", self.peer)
            self.abort("internal error")

    def _ask_gate(self) -> bool:
        self._gate_ok = ok = self._l.gate_allows()
        return ok

    def _handle(self, packet: Packet) -> None:
        if self.conn_id is not None:
            kind = type(packet)  # the codec makes exactly these classes (no subclasses): `is` tests
            if kind is Disconnect:
                self.broker_lost(packet)
                self._close(f"client sent DISCONNECT 0x{packet.reason_code:02X}")
            elif not (self._gate_ok if self._gate_ok is not None else self._ask_gate()):
                self._answer_and_close(Disconnect(ReasonCode.SERVER_SHUTTING_DOWN), "this node may no longer serve")
            else:
                pending = self._l.broker.packet(self.conn_id, packet)
                if pending is not None and kind in _WINDOWED:
                    self.inflight += 1
                    pending.add_done_callback(self._completed)
                    if self.inflight >= self._l.window:
                        self._throttle()
                if kind is Publish:
                    self._l.messages_in += 1
                    if packet.qos and self._l.hold_for_mate(self):
                        self._pause(_MATE)
            return
        if isinstance(packet, Connect):
            if self.accepted:  # the codec refuses a second CONNECT; this is a belt for the braces
                self._answer_and_close(Disconnect(ReasonCode.PROTOCOL_ERROR), "a second CONNECT")
                return
            if self._timer is not None:
                self._timer.cancel()
            self._pause(_CONNECTING)
            self._release_preauth()  # from here the CONNECT queue's bounds apply; nothing more is read until then
            self._l.connect_arrived(self, packet)
        elif isinstance(packet, Disconnect):
            self._close(f"client sent DISCONNECT 0x{packet.reason_code:02X}")
        elif not self._l.gate_allows():
            self._answer_and_close(Disconnect(ReasonCode.SERVER_SHUTTING_DOWN), "this node may no longer serve")
        elif isinstance(packet, PingReq):
            self._send(PingResp())
        else:
            name = packet.packet_type.name
            self._answer_and_close(
                Disconnect(ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR, {PropertyId.REASON_STRING: NOT_SUPPORTED_YET}),
                f"{name} is {NOT_SUPPORTED_YET}")

    # --- the in-flight window ----------------------------------------------------------------

    def _throttle(self) -> None:
        self._l.throttle_events += 1
        self._l.throttled.add(self)
        self._pause(_WINDOW)

    def _completed(self, _future: asyncio.Future) -> None:
        self.inflight -= 1
        if self._paused & _WINDOW and self.inflight < self._l.window:
            self._l.throttled.discard(self)
            self._resume(_WINDOW)

    def mate_drained(self) -> None:
        self._resume(_MATE)

    def window_grew(self) -> None:
        if self.inflight < self._l.window:
            self._l.throttled.discard(self)
            self._resume(_WINDOW)

    def _pause(self, why: int) -> None:
        if not self._paused and not self.closing:
            self.transport.pause_reading()
        self._paused |= why

    def _resume(self, why: int) -> None:
        if not self._paused & why:
            return
        self._paused &= ~why
        if not self._paused and not self.closing:
            self.transport.resume_reading()
            self._run()  # what was read before the pause

    # --- CONNECT (called by the listener's CONNECT pipeline) -------------------------------------

    def precheck(self, c: Connect) -> bool:
        """The checks before credentials; False when the CONNECT was refused."""
        v5 = c.protocol_version == MQTT_5
        if v5:
            self.peer_max_packet_size = c.properties.get(PropertyId.MAXIMUM_PACKET_SIZE)  # type: ignore[assignment]
        if not self._l.gate_allows():
            reference = self._l.server_reference()
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
        if c.will is not None and c.will.topic.startswith("$"):
            # A will is published for the client: the broker's rule for PUBLISH holds for it too.
            if v5:
                self.refuse(c, ReasonCode.TOPIC_NAME_INVALID, WILL_TOPIC_RESERVED)
            else:
                self._close(f"refused: {WILL_TOPIC_RESERVED}")  # 3.1.1 has no return code for it
            return False
        return True

    def admit(self, c: Connect) -> None:
        """CONNACK success (from the broker, or here without one), then read the client's packets."""
        self.keep_alive_s = c.keep_alive_s
        self._release_preauth()
        self.accepted = True  # before any write: a drop_clients from here on must DISCONNECT
        self.accepted_at = time.time()
        self.username = c.username
        self._l.accepted_count += 1
        broker = self._l.broker
        if broker is not None:
            self.conn_id = broker.connect(self, c, c.username)
            core_conn = broker.core.connections.get(self.conn_id)
            self.client_id = core_conn.client_id if core_conn else c.client_id
        else:
            self.client_id = c.client_id or "pairmq-" + secrets.token_hex(8)
            props: dict[PropertyId, object] = {}
            if c.protocol_version == MQTT_5:
                props[PropertyId.MAXIMUM_PACKET_SIZE] = self._l.max_packet_size
                if not c.client_id:
                    props[PropertyId.ASSIGNED_CLIENT_IDENTIFIER] = self.client_id
            self._send(Connack(ReasonCode.SUCCESS, False, props))
        self._l.emit("client_accepted", {
            "client_id": self.client_id, "protocol_version": c.protocol_version, "peer": self.peer,
            "keep_alive_s": c.keep_alive_s, "clean_start": c.clean_start, "assigned_client_id": not c.client_id})
        if self.closing:
            return
        self._last_read = self._loop.time()
        if self.keep_alive_s:
            self._timer = self._loop.call_at(self._last_read + 1.5 * self.keep_alive_s, self._on_timer)
        self._resume(_CONNECTING)

    def _release_preauth(self) -> None:
        address, self._preauth_addr = self._preauth_addr, None
        if address is not None:
            self._l.budget.close(address, self._held)
            self._held = 0

    def refuse_busy(self, c: Connect, why: str) -> None:
        self.refuse(c, ReasonCode.SERVER_BUSY, why)

    def refuse(self, c: Connect, reason: ReasonCode, why: str, extra: dict[PropertyId, object] | None = None) -> None:
        fields: dict[str, object] = {
            "client_id": c.client_id, "protocol_version": c.protocol_version,
            "peer": self.peer, "reason_code": int(reason), "reason": why}
        if c.protocol_version == MQTT_3_1_1:
            fields["return_code"] = V311_RETURN_CODES[reason]
        else:
            fields.update({k.name.lower(): v for k, v in (extra or {}).items()})
        self.client_id = c.client_id or None
        self._l.emit("client_refused", fields)
        props = {PropertyId.REASON_STRING: why, **(extra or {})} if c.protocol_version == MQTT_5 else {}
        self._send(Connack(reason, False, props), c.protocol_version)
        self._close(f"refused 0x{reason:02X}: {why}")

    def _on_bad_packet(self, err: MqttError) -> None:
        version = err.protocol_version
        self._l.emit("bad_packet", {
            "peer": self.peer, "client_id": self.client_id, "protocol_version": version,
            "reason_code": int(err.reason_code), "reason": err.message})
        why = err.message[:REASON_STRING_MAX_CHARS]
        if not self.accepted:
            if err.reason_code == ReasonCode.UNSUPPORTED_PROTOCOL_VERSION:
                self._send(Connack(err.reason_code), MQTT_3_1_1)
            elif version == MQTT_5:
                code = err.reason_code if err.reason_code in CONNACK_REASON_CODES else ReasonCode.UNSPECIFIED_ERROR
                self._send(Connack(code, False, {PropertyId.REASON_STRING: why}), MQTT_5)
        elif version == MQTT_5:
            code = err.reason_code if err.reason_code in DISCONNECT_REASON_CODES else ReasonCode.PROTOCOL_ERROR
            self._send(Disconnect(code, {PropertyId.REASON_STRING: why}))
        self._close(f"bad packet: {err.message}")

    # --- timers ------------------------------------------------------------------------------

    def _on_timer(self) -> None:
        self._timer = None
        if self.closing:
            return
        try:
            self._timer_due()
        except Exception:
            log.exception("MQTT connection %s: timer failed", self.peer)
            self.abort("internal error")

    def _timer_due(self) -> None:
        if not self.accepted:
            if not self._paused & _CONNECTING:
                self._close(f"no CONNECT within {self._l.connect_timeout_s} s")
            return
        now = self._loop.time()
        due = self._last_read + 1.5 * self.keep_alive_s
        if self._paused or now < due:  # a client we do not read cannot be late
            self._timer = self._loop.call_at(max(due, now + 1.5 * self.keep_alive_s) if self._paused else due,
                                             self._on_timer)
            return
        self._answer_and_close(Disconnect(ReasonCode.KEEP_ALIVE_TIMEOUT),
                               f"no packet within 1.5 x keep alive {self.keep_alive_s} s")

    def _arm_aux(self, delay_s: float, callback) -> None:
        if self._aux_timer is not None:
            self._aux_timer.cancel()
        self._aux_timer = self._loop.call_later(delay_s, callback)

    def _sent(self) -> int:
        return self._written - self.transport.get_write_buffer_size()

    def _check_stall(self) -> None:
        self._aux_timer = None
        if self.closing:
            return
        sent = self._sent()
        if sent == self._stall_mark:
            self.abort(f"the client read nothing we sent for {self._l.write_timeout_s} s")
        else:
            self._stall_mark = sent
            self._arm_aux(self._l.write_timeout_s, self._check_stall)

    # --- output and closing --------------------------------------------------------------------

    def _write(self, data: bytes) -> None:
        out = self._out
        if out is None:
            self._out = [data]
            self._l.mark_dirty(self)
        else:
            out.append(data)

    def flush(self) -> None:
        out, self._out = self._out, None
        if not out or self.transport.is_closing():
            return
        data = out[0] if len(out) == 1 else b"".join(out)
        self._written += len(data)
        self.transport.write(data)
        if self.transport.get_write_buffer_size() > self._l.max_output_bytes:
            self._l.output_overflows += 1  # what it had not read is lost with it: QoS 1/2 stay in its session
            self.abort(f"more than {self._l.max_output_bytes} bytes wait for the client to read them")

    def _send(self, packet: Packet, version: int | None = None) -> None:
        if self.closing:
            return
        if type(packet) is Connack:
            self.connacked = True
        data = encode_packet(packet, version or self.protocol_version or MQTT_3_1_1,
                             max_packet_size=self.peer_max_packet_size)
        if data is not None:  # larger than the client accepts: discarded, as v5 §3.1.2.11.4 says
            self._write(data)

    def _answer_and_close(self, v5_answer: Disconnect, why: str) -> None:
        if self.protocol_version == MQTT_5:
            self._send(v5_answer)
        self._close(why)

    # --- the broker's side (BrokerService calls these) -----------------------------

    def send_nowait(self, packet: Packet) -> None:
        if type(packet) is Puback and not packet.reason_code and not packet.properties and not self.closing:
            # What `Puback.encode` makes in 3.1.1 and 5.0 (v5 omits reason 0 without properties), minus ~2 us a
            # packet; the id came from the client's PUBLISH, which the decoder held to 1..65535.
            if self.peer_max_packet_size is None or self.peer_max_packet_size >= 4:
                self._write(b"\x40\x02" + packet.packet_id.to_bytes(2, "big"))
            return
        if type(packet) is Publish and not self.closing:
            self._l.messages_out += 1
        if type(packet) is Publish and not packet.properties and not self.closing:
            data = self._l.encode_plain_publish(packet, self.protocol_version)
            if data is not None:
                if self.peer_max_packet_size is None or len(data) <= self.peer_max_packet_size:
                    self._write(data)
                return  # larger than the client accepts: discarded, as v5 §3.1.2.11.4 says
        self._send(packet)

    def close_with(self, reason: int, why: str) -> None:
        if self.closing:
            return
        if self.protocol_version == MQTT_5 and reason:
            props = {PropertyId.REASON_STRING: why[:REASON_STRING_MAX_CHARS]} if why else {}
            if not self.connacked and reason in CONNACK_REASON_CODES:
                # Its CONNECT waited for a commit that failed (a full disk): a DISCONNECT before the CONNACK
                # breaks the protocol (paho reports 0x80); the CONNACK carries the refusal instead.
                self._send(Connack(ReasonCode(reason), False, props))
            else:
                self._send(Disconnect(ReasonCode(reason), props))
        self.conn_id = None  # the broker already knows
        self._close(f"closed by the broker (0x{reason:02X}): {why}")

    def broker_lost(self, disconnect: Disconnect | None = None) -> None:
        conn_id, self.conn_id = self.conn_id, None
        if conn_id is not None:
            self._l.broker.lost(conn_id, disconnect)

    def hold(self) -> None:
        """Called by hold_clients: stop taking packets (they wait in the socket) until `unhold` or a drop."""
        self._pause(_HANDOVER)

    def unhold(self) -> None:
        self._resume(_HANDOVER)

    def drop(self, reason: ReasonCode, server_reference: str | None) -> bool:
        """Called by drop_clients."""
        if self.closing:
            return False
        if self.accepted and self.protocol_version == MQTT_5:
            props = {PropertyId.SERVER_REFERENCE: server_reference} if server_reference else {}
            self._send(Disconnect(reason, props))
        self._close(f"dropped by this node (0x{reason:02X})")
        return True

    def _close(self, why: str) -> None:
        """Flush what is queued, then FIN; abort if that stalls."""
        if self.closing:
            return
        self.flush()
        self.closing = True
        self.close_reason = why
        if self.transport.is_closing():
            return
        self.transport.close()
        self._arm_aux(self._l.write_timeout_s, self.transport.abort)

    def abort(self, why: str) -> None:
        if not self.closing:
            self.closing = True
            self.close_reason = why
        self._out = None
        self.transport.abort()

    def emit_closed(self) -> None:
        if self._closed_emitted:
            return
        self._closed_emitted = True
        self._l.emit("client_closed", {
            "client_id": self.client_id, "protocol_version": self.protocol_version,
            "peer": self.peer, "was_accepted": self.accepted, "reason": self.close_reason})


def _format_peer(peername: object) -> str:
    if isinstance(peername, tuple) and len(peername) >= 2:
        host, port = peername[0], peername[1]
        return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"
    return str(peername)


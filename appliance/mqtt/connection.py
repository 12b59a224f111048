"""One client connection as an asyncio Protocol: reads, writes and timers around an MqttSession (session.py).

Theory of operation: `data_received` feeds the session and hands its packets
on (a CONNECT to the listener's queue, the rest to the broker) until it has
none or reading is paused. Reading is paused for any of the reasons in
`_paused`; packets already buffered stay in the session until every reason
is gone. One timer handle serves the session's deadline (connect timeout,
keep alive), re-armed only when the session's phase changes or it fires; a
second one exists only while output is stalled or a close is in progress.
After every call into the session, `_transmit` queues what it wrote and
closes the transport once it is closing. Output goes through `_write`, which
the listener flushes once per loop turn.

Closing: a close of ours (a DISCONNECT or CONNACK refusal sent, or a plain
close) flushes, then half-closes (FIN after the last packet) and reads and
discards what the client still sends, up to DRAIN_MAX_BYTES or DRAIN_S,
until its own FIN; only then is the socket closed. Closed with unread bytes,
the kernel would answer them with a reset, and a client reading late would see
"connection reset" instead of our last packet. A transport that cannot
half-close (TLS) is closed as before.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from pairmq.appliance.mqtt.codec import Connect, Disconnect, Packet
from pairmq.appliance.mqtt.packets import Puback, Subscribe, Unsubscribe
from pairmq.appliance.mqtt.publish import Publish
from pairmq.appliance.mqtt.session import HANDLED, MqttSession
from pairmq.appliance.mqtt.traffic import ListenerTraffic
from pairmq.appliance.mqtt.wire import ReasonCode

if TYPE_CHECKING:
    from pairmq.appliance.broker.service import BrokerService
    from pairmq.appliance.mqtt.listener import MqttListener

log = logging.getLogger("pairmq.appliance.mqtt.listener")

# Why reading is paused (bits of MqttConnection._paused).
_CONNECTING: Final = 1
_WINDOW: Final = 2
_OUTPUT: Final = 4
_TURN: Final = 8  # handled PACKETS_PER_TURN in this callback: the rest waits for the next loop turn
_HANDOVER: Final = 16  # the node hands activity over: nothing more is taken until it drops us or serves again
_MATE: Final = 32  # a publisher held while the mate link's backlog is over max_lag (overload.MateBackpressure)
# One 256 KiB read holds thousands of small PUBLISHes: other clients, timers and heartbeats get the loop back after
# this many.
PACKETS_PER_TURN: Final = 256
# The drain after our half-close (see the theory): long enough for a client to read our last packet and close,
# short and small enough that a client that keeps writing cannot hold the connection.
DRAIN_S: Final = 1.0
DRAIN_MAX_BYTES: Final = 1024 * 1024


# Not a subclass of asyncio.Protocol: asyncio and uvloop take any object with a protocol's methods (one with
# `get_buffer` as a buffered one), and compiled, a class derived from a Python one would get a __dict__ per instance.
class MqttConnection:
    __slots__ = (
        "_l", "_t", "_loop", "_broker", "transport", "session", "peer", "accepted_at", "conn_id", "inflight", "_paused",
        "_out", "_written", "_timer", "_aux_timer", "_stall_mark", "_shut", "_preauth_addr", "_held", "_drained",
        "_waits", "_mate_clear")

    # Set by connection_made, before anything else reads them.
    transport: asyncio.Transport
    session: MqttSession

    def __init__(self, listener: MqttListener) -> None:
        loop = listener._loop
        assert loop is not None, "a connection before its listener started"
        self._l = listener
        self._t: ListenerTraffic = listener.traffic  # what every packet counts and reads: native, not the listener's
        self._loop = loop
        self._broker: BrokerService | None = listener.broker
        self.peer = "?"
        self.accepted_at = 0.0  # wall clock (s) of CONNACK success: `pairmq show clients`
        self.conn_id: int | None = None  # the broker's name for this connection once accepted
        self.inflight = 0  # windowed packets whose effects are not complete yet
        # The broker's future for each batch of them -> how many of ours it covers: one callback a batch, not a packet.
        self._waits: dict[asyncio.Future[None], int] = {}
        self._paused = 0
        self._out: list[bytes] | None = None
        self._written = 0
        self._timer: asyncio.TimerHandle | None = None
        self._aux_timer: asyncio.TimerHandle | None = None  # output stall or close abort
        self._stall_mark = 0
        self._shut = False  # the transport is closed or closing
        self._preauth_addr: str | None = None  # counted by the listener's PreAuthBudget until admitted or gone
        self._held = 0  # bytes buffered while pre-auth, as the budget counts them
        self._drained: int | None = None  # bytes discarded since our half-close; None: not draining
        # This turn's QoS 1/2 PUBLISHes need not ask `hold_for_mate` again: it said no, and the mate link's backlog
        # moves only in other callbacks of this loop.
        self._mate_clear = False

    # --- what the listener, the broker and the management API read: the session's --------------

    @property
    def protocol_version(self) -> int | None:
        return self.session.protocol_version

    @property
    def accepted(self) -> bool:
        return self.session.accepted

    @property
    def closing(self) -> bool:
        return self.session.closing

    @property
    def close_reason(self) -> str:
        return self.session.close_reason

    @property
    def client_id(self) -> str | None:
        return self.session.client_id

    @property
    def username(self) -> str | None:  # config-sync drops a deleted user's clients
        return self.session.username

    @property
    def keep_alive_s(self) -> int:
        return self.session.keep_alive_s

    def _now_ms(self) -> int:
        return round(self._loop.time() * 1000)

    # --- transport callbacks ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        # No TCP_NODELAY here: asyncio and uvloop both set it on every TCP transport, and uvloop's
        # get_extra_info("socket") is costly per connection in a storm.
        peername = transport.get_extra_info("peername")
        self.peer = _format_peer(peername)
        listener = self._l
        self.session = MqttSession(self.peer, self._now_ms(), listener.session_limits, listener.front_door,
                                   self._open_in_broker if listener.broker is not None else None)
        listener.opened(self)
        address = str(peername[0]) if isinstance(peername, tuple) and peername else self.peer
        why = listener.budget.open(address)
        if why is not None:
            listener.emit("connection_refused", {"peer": self.peer, "reason": why})
            self.abort(f"refused before CONNECT: {why}")
            return
        self._preauth_addr = address
        self._arm_timer()

    def data_received(self, data: bytes) -> None:
        session = self.session
        self._t.bytes_in += len(data)
        if session.closing:
            if self._drained is not None:
                self._drained += len(data)
                if self._drained > DRAIN_MAX_BYTES:
                    self.transport.abort()
            return
        session.receive_data(data, self._now_ms())
        self._run()
        if self._preauth_addr is not None and not session.closing:
            held = session.buffered_bytes
            delta, self._held = held - self._held, held
            if not self._l.budget.hold(delta):
                self.abort(f"pre-authentication buffers are full ({self._l.budget.limits.max_bytes} bytes in total)")

    def eof_received(self) -> bool:
        if self._drained is not None:
            return False  # the client's FIN after ours: everything was read, the transport closes cleanly
        self.session.close("peer closed the connection")
        self._transmit()
        return False

    def connection_lost(self, exc: BaseException | None) -> None:
        session = self.session
        session.close(f"connection error: {exc}" if exc else "peer closed the connection")
        self._shut = True
        for timer in (self._timer, self._aux_timer):
            if timer is not None:
                timer.cancel()
        self._out = None
        self._release_preauth()
        if session.accepted:
            self._l.accepted_count -= 1
        self._l.closed(self)
        try:
            self.broker_lost()
        except Exception:
            log.exception("the broker failed on losing %s", self.peer)
        session.report_closed()

    def pause_writing(self) -> None:
        if self._shut:
            return  # closing: its own timer bounds the last write
        self._pause(_OUTPUT)
        self._stall_mark = self._sent()
        self._arm_aux(self._l.write_timeout_s, self._check_stall)

    def resume_writing(self) -> None:
        if self._aux_timer is not None and not self.session.closing:
            self._aux_timer.cancel()
            self._aux_timer = None
        self._resume(_OUTPUT)

    # --- reading and handing on --------------------------------------------------------------

    def _run(self) -> None:
        """Hand buffered packets on until none is left, or reading is paused."""
        session = self.session
        try:
            budget = PACKETS_PER_TURN
            session.begin_turn()
            self._mate_clear = False
            while not session.closing and not self._paused:
                if not budget:
                    self._pause(_TURN)
                    self._loop.call_soon(self._resume, _TURN)
                    break
                packet = session.next_event()
                if packet is None:
                    break
                budget -= 1
                if packet is HANDLED:
                    continue
                conn_id = self.conn_id
                if conn_id is None:
                    assert isinstance(packet, Connect), f"{packet!r} handed on before CONNECT"
                    self._connect_arrived(packet)
                else:
                    self._to_broker(conn_id, packet)
            self._t.packets_in += PACKETS_PER_TURN - budget  # once per turn: one per packet taken
            self._transmit()
        except Exception:
            log.exception("MQTT connection %s failed", self.peer)
            self.abort("internal error")

    def _connect_arrived(self, packet: Connect) -> None:
        identity = self._l.identity
        if identity is not None:  # TLS client certificates: the identity is the user name, no password
            packet = dataclasses.replace(packet, username=identity(self.transport.get_extra_info("ssl_object")),
                                         password=None)
        self._arm_timer()
        self._pause(_CONNECTING)
        self._release_preauth()  # from here the CONNECT queue's bounds apply; nothing more is read until then
        self._l.connects.arrived(self, packet)

    def _to_broker(self, conn_id: int, packet: object) -> None:
        kind = type(packet)
        if kind is Disconnect:
            assert isinstance(packet, Disconnect)
            self.broker_lost(packet)
            return
        broker = self._broker
        assert broker is not None, "a connection id without a broker"
        pending = broker.packet(conn_id, packet)
        if pending is not None and (kind is Publish or kind is Subscribe or kind is Unsubscribe):
            self.inflight += 1
            waits = self._waits
            n = waits.get(pending)
            if n is None:
                waits[pending] = 1
                pending.add_done_callback(self._completed)
            else:
                waits[pending] = n + 1
            if self.inflight >= self._t.window:
                self._throttle()
        if type(packet) is Publish:
            self._t.messages_in += 1
            if packet.qos and not self._mate_clear:
                if self._l.hold_for_mate(self):
                    self._pause(_MATE)
                else:
                    self._mate_clear = True

    # --- the in-flight window ----------------------------------------------------------------

    def _throttle(self) -> None:
        self._l.throttle_events += 1
        self._l.throttled.add(self)
        self._pause(_WINDOW)

    def _completed(self, future: asyncio.Future[None]) -> None:
        self.inflight -= self._waits.pop(future)
        if self._paused & _WINDOW and self.inflight < self._t.window:
            self._l.throttled.discard(self)
            self._resume(_WINDOW)

    def mate_drained(self) -> None:
        self._resume(_MATE)

    def window_grew(self) -> None:
        if self.inflight < self._t.window:
            self._l.throttled.discard(self)
            self._resume(_WINDOW)

    def _pause(self, why: int) -> None:
        if not self._paused and not self.session.closing:
            self.transport.pause_reading()
        self._paused |= why

    def _resume(self, why: int) -> None:
        if not self._paused & why:
            return
        self._paused &= ~why
        if not self._paused and not self.session.closing:
            self.transport.resume_reading()
            self._run()  # what was read before the pause

    # --- CONNECT (called by the listener's CONNECT pipeline) -------------------------------------

    def precheck(self, c: Connect) -> bool:
        """The checks before credentials; False when the CONNECT was refused."""
        ok = self.session.check_connect(c)
        self._transmit()
        return ok

    def admit(self, c: Connect) -> None:
        """CONNACK success (from the broker, or the session without one), then read the client's packets."""
        self._release_preauth()
        self.accepted_at = time.time()
        try:
            self.session.accept(c, self._now_ms())
        finally:
            if self.session.accepted:  # connection_lost counts it out again
                self._l.accepted_count += 1
        self._transmit()
        if self.session.closing:
            return
        self._arm_timer()
        self._resume(_CONNECTING)

    def _open_in_broker(self, c: Connect) -> str | None:
        broker = self._broker
        assert broker is not None, "the session opens in the broker only with one"
        conn_id = self.conn_id = broker.connect(self, c, c.username)
        return broker.client_id(conn_id)

    def refuse_busy(self, c: Connect, why: str) -> None:
        self.refuse(c, ReasonCode.SERVER_BUSY, why)

    def refuse(self, c: Connect, reason: ReasonCode, why: str) -> None:
        self.session.refuse(c, reason, why)
        self._transmit()

    def _release_preauth(self) -> None:
        address, self._preauth_addr = self._preauth_addr, None
        if address is not None:
            self._l.budget.close(address, self._held)
            self._held = 0

    # --- timers ------------------------------------------------------------------------------

    def _arm_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        deadline_ms = self.session.get_timer()
        if deadline_ms is not None:
            self._timer = self._loop.call_at(deadline_ms / 1000, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        if self.session.closing:
            return
        try:
            self.session.handle_timer(self._now_ms(), unread=bool(self._paused))
            self._transmit()
            if not self.session.closing:
                self._arm_timer()
        except Exception:
            log.exception("MQTT connection %s: timer failed", self.peer)
            self.abort("internal error")

    def _arm_aux(self, delay_s: float, callback: Callable[[], object]) -> None:
        if self._aux_timer is not None:
            self._aux_timer.cancel()
        self._aux_timer = self._loop.call_later(delay_s, callback)

    def _sent(self) -> int:
        return self._written - self.transport.get_write_buffer_size()

    def _check_stall(self) -> None:
        self._aux_timer = None
        if self.session.closing:
            return
        sent = self._sent()
        if sent == self._stall_mark:
            self.abort(f"the client read nothing we sent for {self._l.write_timeout_s} s")
        else:
            self._stall_mark = sent
            self._arm_aux(self._l.write_timeout_s, self._check_stall)

    # --- output and closing --------------------------------------------------------------------

    def _transmit(self) -> None:
        """What the session wrote goes out with this turn's output; a closing session closes the transport."""
        session = self.session
        for data in session.data_to_send():
            self._write(data)
        if session.closing and not self._shut:
            self._shut_down()

    def _write(self, data: bytes) -> None:
        self._t.packets_out += 1  # one packet per call
        out = self._out
        if out is None:
            self._out = [data]
            self._t.mark_dirty(self)
        else:
            out.append(data)

    def _write_many(self, datas: list[bytes]) -> None:
        if not datas:
            return
        self._t.packets_out += len(datas)
        out = self._out
        if out is None:
            self._out = datas
            self._t.mark_dirty(self)
        else:
            out += datas

    def flush(self) -> None:
        out, self._out = self._out, None
        if not out or self.transport.is_closing():
            return
        data = out[0] if len(out) == 1 else b"".join(out)
        self._written += len(data)
        self._t.bytes_out += len(data)
        self.transport.write(data)
        if self.transport.get_write_buffer_size() > self._l.max_output_bytes:
            self._l.output_overflows += 1  # what it had not read is lost with it: QoS 1/2 stay in its session
            self.abort(f"more than {self._l.max_output_bytes} bytes wait for the client to read them")

    def _shut_down(self) -> None:
        """Flush what is queued, then FIN and drain (see the theory); abort if that stalls."""
        self._shut = True
        self.flush()
        transport = self.transport
        if transport.is_closing():
            return
        if not _can_half_close(transport):
            transport.close()
            self._arm_aux(self._l.write_timeout_s, transport.abort)
            return
        try:
            transport.write_eof()
        except OSError:  # the peer is gone already (ENOTCONN): nothing left to drain
            transport.abort()
            return
        self._drained = 0
        transport.resume_reading()  # whatever paused it: the client's bytes are read and discarded now
        self._arm_aux(DRAIN_S, self._drain_over)

    def _drain_over(self) -> None:
        """The client did not close within DRAIN_S: abort, unless our last bytes are still unsent (the stall
        bound then applies, as to any write)."""
        if self.transport.get_write_buffer_size():
            self._arm_aux(self._l.write_timeout_s, self.transport.abort)
        else:
            self.transport.abort()

    def abort(self, why: str) -> None:
        self.session.close(why)
        self.session.data_to_send()  # lost with the connection
        self._shut = True
        self._out = None
        self.transport.abort()

    # --- the broker's side (BrokerService calls these) -----------------------------

    def send_nowait(self, packet: Packet) -> None:
        if self.session.closing:
            return
        data = self._fast_bytes(packet)
        if data is None:
            self.session.send(packet)
            self._transmit()
        elif data:
            self._write(data)

    def send_many(self, packets: list[Any]) -> None:
        """`send_nowait` for each of `packets` in order, the common ones gathered into one append to the output."""
        session = self.session
        datas: list[bytes] = []
        for packet in packets:
            if session.closing:
                return
            data = self._fast_bytes(packet)
            if data is None:
                self._write_many(datas)
                datas = []
                session.send(packet)
                self._transmit()
            elif data:
                datas.append(data)
        self._write_many(datas)

    def _fast_bytes(self, packet: object) -> bytes | None:
        """The bytes of a common packet without the session's encoder; b"": discarded; None: not a common one."""
        limit = self.session.peer_max_packet_size
        if type(packet) is Puback and not packet.reason_code and not packet.properties:
            # What `Puback.encode` makes in 3.1.1 and 5.0 (v5 omits reason 0 without properties), without the
            # encoder's cost per packet; the id came from the client's PUBLISH, which the decoder held to 1..65535.
            return b"\x40\x02" + packet.packet_id.to_bytes(2, "big") if limit is None or limit >= 4 else b""
        if type(packet) is Publish:
            self._t.messages_out += 1
            if not packet.properties:
                data = self._t.plain_publish.encode(packet, self.session.protocol_version)
                if data is not None:
                    # Larger than the client accepts: discarded, as v5 §3.1.2.11.4 says.
                    return data if limit is None or len(data) <= limit else b""
        return None

    def close_with(self, reason: int, why: str) -> None:
        if self.session.closing:
            return
        self.session.close_with(reason, why)
        self.conn_id = None  # the broker already knows
        self._transmit()

    def broker_lost(self, disconnect: Disconnect | None = None) -> None:
        conn_id, self.conn_id = self.conn_id, None
        if conn_id is not None:
            broker = self._broker
            assert broker is not None, "a connection id without a broker"
            broker.lost(conn_id, disconnect)

    def hold(self) -> None:
        """Called by hold_clients: stop taking packets (they wait in the socket) until `unhold` or a drop."""
        self._pause(_HANDOVER)

    def unhold(self) -> None:
        self._resume(_HANDOVER)

    def drop(self, reason: ReasonCode, server_reference: str | None) -> bool:
        """Called by drop_clients."""
        dropped = self.session.drop(reason, server_reference)
        self._transmit()
        return dropped


def _can_half_close(transport: asyncio.Transport) -> bool:
    try:
        return transport.can_write_eof()
    except NotImplementedError:  # asyncio.Transport's default: a wrapper transport that does not say
        return False


def _format_peer(peername: object) -> str:
    if isinstance(peername, tuple) and len(peername) >= 2:
        host, port = peername[0], peername[1]
        return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"
    return str(peername)

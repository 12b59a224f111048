"""The MQTT listener: a thin asyncio adapter that the redundancy core gates.

Rules:

- CONNECT with `gate.may_serve()` true: CONNACK success. v5: an empty client
  id gets one (Assigned Client Identifier); our Maximum Packet Size is
  advertised. 3.1.1: an empty client id without clean session is refused
  (return code 2). v5 CONNECT with enhanced authentication: 0x8C. A will
  topic starting with `$` (reserved, as for PUBLISH): v5 0x90, 3.1.1 close.
- CONNECT with the gate false: v5 CONNACK 0x9C "Use another server" with
  Server Reference when the gate knows the active, else 0x88 "Server
  unavailable"; 3.1.1 return code 3. Then close.
- Every later packet asks the gate again first: a node resumed after SIGSTOP
  must not serve one packet past its lease. False: v5 DISCONNECT 0x8B, 3.1.1
  close. A client's DISCONNECT is simply honoured (nothing is sent).
- PINGREQ gets PINGRESP. Any other packet, for now: v5 DISCONNECT 0x83
  "not supported by this node yet", 3.1.1 close.
- Bad input (MqttError from the codec): while connecting, v5 CONNACK with the
  error's reason code, 3.1.1/unknown a plain close, and an unsupported
  protocol level a 3.1.1-format CONNACK return code 1; after CONNACK, v5
  DISCONNECT with the reason code, 3.1.1 close. (MQTT 5 §4.13.1: an error in
  CONNECT is answered with CONNACK, never DISCONNECT.)
- Timers: no complete CONNECT within `connect_timeout_s`: close. Keep alive
  k > 0: no packet within 1.5 k: v5 DISCONNECT 0x8D, close. A write that does
  not drain within `write_timeout_s`, or a close that does not finish within
  it, aborts the connection.
- Nothing the peer sends can raise out of here; a bug in this file or in the
  gate is logged with its traceback and the connection is closed (the gate
  failing counts as "may not serve").
- Every connection ends with exactly one "client_closed" event.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import socket
import time
from collections.abc import Callable
from typing import Protocol

from appliance.mqtt.codec import (
    CONNACK_REASON_CODES, DEFAULT_MAX_PACKET_SIZE, DISCONNECT_REASON_CODES,
    V311_RETURN_CODES, Connack, Connect, Disconnect, Packet, PacketReader,
    PingReq, PingResp, encode_packet,
)
from appliance.mqtt.properties import PropertyId
from appliance.mqtt.wire import MQTT_3_1_1, MQTT_5, MqttError, ReasonCode

log = logging.getLogger(__name__)

READ_CHUNK_BYTES = 64 * 1024
# asyncio's default (100) overflows in a reconnect storm: the kernel then drops the handshake's last ACK and the
# client's CONNECT waits for SYN-ACK retransmits (1 s, 3 s, 7 s...). The kernel caps it at net.core.somaxconn.
LISTEN_BACKLOG = 4096
REASON_STRING_MAX_CHARS = 200
NOT_SUPPORTED_YET = "not supported by this node yet"
WILL_TOPIC_RESERVED = "will topics starting with $ are reserved"


class Gate(Protocol):
    def may_serve(self) -> bool:
        """True only while this node holds a live activity lease."""

    def active_server_reference(self) -> str | None:
        """"host:port" of the active node, if known."""


EventSink = Callable[[str, dict[str, object]], None]


def now_ms() -> int:
    return time.monotonic_ns() // 1_000_000


class MqttListener:
    def __init__(self, host: str, port: int, gate: Gate, *,
                 max_packet_size: int = DEFAULT_MAX_PACKET_SIZE,
                 on_event: EventSink | None = None,
                 connect_timeout_s: float = 10.0,
                 write_timeout_s: float = 5.0,
                 broker=None) -> None:
        PacketReader(max_packet_size=max_packet_size)  # validates the size
        if connect_timeout_s <= 0 or write_timeout_s <= 0:
            raise ValueError("timeouts must be positive")
        self.host = host
        self.requested_port = port
        self.max_packet_size = max_packet_size
        self.connect_timeout_s = connect_timeout_s
        self.write_timeout_s = write_timeout_s
        self._gate = gate
        self._on_event = on_event
        self.broker = broker  # appliance.broker.service.BrokerService, or None: the front door alone
        self._server: asyncio.Server | None = None
        self._conns: set[_Connection] = set()

    @property
    def port(self) -> int:
        """The bound port (the real one when 0 was asked for)."""
        assert self._server is not None and self._server.sockets, "listener not started"
        return self._server.sockets[0].getsockname()[1]

    @property
    def client_count(self) -> int:
        """Clients that got CONNACK success and are still connected."""
        return sum(1 for c in self._conns if c.accepted and not c.closing)

    async def start(self) -> None:
        assert self._server is None, "listener already started"
        self._server = await asyncio.start_server(
            self._on_connection, self.host, self.requested_port, reuse_address=True, backlog=LISTEN_BACKLOG)

    async def stop(self) -> None:
        """Stop accepting, drop every client (v5: 0x8B) and wait, bounded."""
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        self.drop_clients(ReasonCode.SERVER_SHUTTING_DOWN)
        tasks = [c.task for c in self._conns if c.task is not None]
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=self.write_timeout_s)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        try:
            await asyncio.wait_for(server.wait_closed(), self.write_timeout_s)
        except TimeoutError:
            log.warning("MQTT listener on %s:%s did not close in time", self.host,
                        self.requested_port)

    def drop_clients(self, reason_code: int = ReasonCode.SERVER_SHUTTING_DOWN,
                     server_reference: str | None = None) -> int:
        """Disconnect everyone now; v5 clients are told why. Returns how many."""
        if reason_code not in DISCONNECT_REASON_CODES or reason_code == ReasonCode.SUCCESS:
            raise ValueError(f"0x{reason_code:02X} is not a DISCONNECT error reason code")
        return sum(conn.drop(ReasonCode(reason_code), server_reference)
                   for conn in list(self._conns))

    # --- used by connections ---------------------------------------------------

    def gate_allows(self) -> bool:
        try:
            return bool(self._gate.may_serve())
        except Exception:
            log.exception("gate.may_serve() failed; treating it as 'may not serve'")
            return False

    def server_reference(self) -> str | None:
        try:
            return self._gate.active_server_reference()
        except Exception:
            log.exception("gate.active_server_reference() failed")
            return None

    def emit(self, kind: str, fields: dict[str, object]) -> None:
        if self._on_event is None:
            return
        try:
            self._on_event(kind, {**fields, "now_ms": now_ms()})
        except Exception:
            log.exception("on_event(%r) failed", kind)

    async def _on_connection(self, reader: asyncio.StreamReader,
                             writer: asyncio.StreamWriter) -> None:
        conn = _Connection(self, reader, writer)
        conn.task = asyncio.current_task()
        self._conns.add(conn)
        try:
            await conn.run()
            await conn.finish()
        except asyncio.CancelledError:
            conn.abort("listener stopped")
            raise
        except Exception:
            log.exception("MQTT connection handler for %s failed", conn.peer)
            conn.abort("internal error")
        finally:
            self._conns.discard(conn)
            conn.broker_lost()
            conn.emit_closed()


class _Connection:
    """One client socket: reads, frames, answers, closes."""

    def __init__(self, listener: MqttListener, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter) -> None:
        self._l = listener
        self._reader = reader
        self._writer = writer
        self._loop = asyncio.get_running_loop()
        self._packets = PacketReader(max_packet_size=listener.max_packet_size)
        self.task: asyncio.Task[None] | None = None
        self.peer = _format_peer(writer.get_extra_info("peername"))
        self.accepted = False
        self.closing = False
        self.close_reason = ""
        self.client_id: str | None = None
        self.keep_alive_s = 0
        self.peer_max_packet_size: int | None = None
        self._abort_timer: asyncio.TimerHandle | None = None
        self._closed_emitted = False
        self.conn_id: int | None = None  # the broker's name for this connection once accepted
        _disable_nagle(writer)

    @property
    def protocol_version(self) -> int | None:
        return self._packets.protocol_version

    async def run(self) -> None:
        deadline: float | None = self._loop.time() + self._l.connect_timeout_s
        while not self.closing:
            data = await self._read(deadline)
            if data is None:
                return
            if self.conn_id is not None and not await self._drained():
                return  # a client that reads nothing stops being read: the broker's backpressure
            self._packets.feed(data)
            while not self.closing:
                try:
                    packet = self._packets.next_packet()
                except MqttError as err:
                    await self._on_bad_packet(err)
                    return
                if packet is None:
                    break
                await self._handle(packet)
                if self.accepted:
                    deadline = (self._loop.time() + 1.5 * self.keep_alive_s
                                if self.keep_alive_s else None)

    async def _read(self, deadline: float | None) -> bytes | None:
        timeout = None if deadline is None else max(0.0, deadline - self._loop.time())
        try:
            data = await asyncio.wait_for(self._reader.read(READ_CHUNK_BYTES), timeout)
        except TimeoutError:
            if self.accepted:
                await self._answer_and_close(
                    Disconnect(ReasonCode.KEEP_ALIVE_TIMEOUT),
                    f"no packet within 1.5 x keep alive {self.keep_alive_s} s")
            else:
                self._close(f"no CONNECT within {self._l.connect_timeout_s} s")
            return None
        except OSError as exc:
            self._close(f"connection error: {exc}")
            return None
        if not data:
            self._close("peer closed the connection")
            return None
        return data

    async def _handle(self, packet: Packet) -> None:
        if self.conn_id is not None and not isinstance(packet, Connect):
            if isinstance(packet, Disconnect):
                self.broker_lost(packet)
                self._close(f"client sent DISCONNECT 0x{packet.reason_code:02X}")
            elif not self._l.gate_allows():
                await self._answer_and_close(Disconnect(ReasonCode.SERVER_SHUTTING_DOWN),
                                             "this node may no longer serve")
            else:
                self._l.broker.packet(self.conn_id, packet)
            return
        if isinstance(packet, Connect) and self.accepted:
            await self._answer_and_close(Disconnect(ReasonCode.PROTOCOL_ERROR), "a second CONNECT")
        elif isinstance(packet, Connect):
            await self._on_connect(packet)
        elif isinstance(packet, Disconnect):
            self._close(f"client sent DISCONNECT 0x{packet.reason_code:02X}")
        elif not self._l.gate_allows():
            await self._answer_and_close(Disconnect(ReasonCode.SERVER_SHUTTING_DOWN),
                                         "this node may no longer serve")
        elif isinstance(packet, PingReq):
            await self._send(PingResp())
        else:
            name = packet.packet_type.name
            await self._answer_and_close(
                Disconnect(ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR,
                           {PropertyId.REASON_STRING: NOT_SUPPORTED_YET}),
                f"{name} is {NOT_SUPPORTED_YET}")

    async def _on_connect(self, c: Connect) -> None:
        v5 = c.protocol_version == MQTT_5
        if v5:
            self.peer_max_packet_size = c.properties.get(PropertyId.MAXIMUM_PACKET_SIZE)  # type: ignore[assignment]
        if not self._l.gate_allows():
            reference = self._l.server_reference()
            if v5 and reference:
                await self._refuse(c, ReasonCode.USE_ANOTHER_SERVER, f"not active; active is {reference}",
                                   {PropertyId.SERVER_REFERENCE: reference})
            else:
                await self._refuse(c, ReasonCode.SERVER_UNAVAILABLE, "not active; active unknown")
            return
        if not v5 and not c.client_id and not c.clean_start:
            await self._refuse(c, ReasonCode.CLIENT_IDENTIFIER_NOT_VALID,
                               "empty client id without clean session")
            return
        if v5 and PropertyId.AUTHENTICATION_METHOD in c.properties:
            await self._refuse(c, ReasonCode.BAD_AUTHENTICATION_METHOD,
                               "enhanced authentication is not supported")
            return
        if c.will is not None and c.will.topic.startswith("$"):
            # A will is published for the client: the broker's rule for PUBLISH holds for it too.
            if v5:
                await self._refuse(c, ReasonCode.TOPIC_NAME_INVALID, WILL_TOPIC_RESERVED)
            else:
                self._close(f"refused: {WILL_TOPIC_RESERVED}")  # 3.1.1 has no return code for it
            return
        self.keep_alive_s = c.keep_alive_s
        if self._l.broker is not None:
            self.accepted = True
            self.conn_id = self._l.broker.connect(self, c, c.username)
            core_conn = self._l.broker.core.connections.get(self.conn_id)
            self.client_id = core_conn.client_id if core_conn else c.client_id
            self._l.emit("client_accepted", {
                "client_id": self.client_id, "protocol_version": c.protocol_version,
                "peer": self.peer, "keep_alive_s": c.keep_alive_s,
                "clean_start": c.clean_start, "assigned_client_id": not c.client_id})
            return
        self.client_id = c.client_id or "pairmq-" + secrets.token_hex(8)
        props: dict[PropertyId, object] = {}
        if v5:
            props[PropertyId.MAXIMUM_PACKET_SIZE] = self._l.max_packet_size
            if not c.client_id:
                props[PropertyId.ASSIGNED_CLIENT_IDENTIFIER] = self.client_id
        self.accepted = True  # before the write: a drop_clients during drain must DISCONNECT
        if not await self._send(Connack(ReasonCode.SUCCESS, False, props)):
            self.accepted = False
        else:
            self._l.emit("client_accepted", {
                "client_id": self.client_id, "protocol_version": c.protocol_version,
                "peer": self.peer, "keep_alive_s": c.keep_alive_s,
                "clean_start": c.clean_start, "assigned_client_id": not c.client_id})

    async def _refuse(self, c: Connect, reason: ReasonCode, why: str,
                      extra: dict[PropertyId, object] | None = None) -> None:
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
        await self._send(Connack(reason, False, props))
        self._close(f"refused 0x{reason:02X}: {why}")

    async def _on_bad_packet(self, err: MqttError) -> None:
        version = err.protocol_version
        self._l.emit("bad_packet", {
            "peer": self.peer, "client_id": self.client_id, "protocol_version": version,
            "reason_code": int(err.reason_code), "reason": err.message})
        why = err.message[:REASON_STRING_MAX_CHARS]
        if not self.accepted:
            if err.reason_code == ReasonCode.UNSUPPORTED_PROTOCOL_VERSION:
                await self._send(Connack(err.reason_code), MQTT_3_1_1)
            elif version == MQTT_5:
                code = (err.reason_code if err.reason_code in CONNACK_REASON_CODES
                        else ReasonCode.UNSPECIFIED_ERROR)
                await self._send(Connack(code, False, {PropertyId.REASON_STRING: why}), MQTT_5)
        elif version == MQTT_5:
            code = (err.reason_code if err.reason_code in DISCONNECT_REASON_CODES
                    else ReasonCode.PROTOCOL_ERROR)
            await self._send(Disconnect(code, {PropertyId.REASON_STRING: why}))
        self._close(f"bad packet: {err.message}")

    # --- output and closing --------------------------------------------------

    async def _answer_and_close(self, v5_answer: Disconnect, why: str) -> None:
        if self.protocol_version == MQTT_5:
            await self._send(v5_answer)
        self._close(why)

    async def _send(self, packet: Packet, version: int | None = None) -> bool:
        if self.closing:
            return False
        data = encode_packet(packet, version or self.protocol_version or MQTT_3_1_1,
                             max_packet_size=self.peer_max_packet_size)
        if data is None:
            return False
        self._writer.write(data)
        try:
            await asyncio.wait_for(self._writer.drain(), self._l.write_timeout_s)
        except TimeoutError:
            self.abort(f"write did not drain within {self._l.write_timeout_s} s")
            return False
        except OSError as exc:
            self._close(f"connection error on write: {exc}")
            return False
        return True

    # --- the broker's side (BrokerService calls these) -----------------------------

    def send_nowait(self, packet: Packet) -> None:
        if self.closing:
            return
        data = encode_packet(packet, self.protocol_version or MQTT_3_1_1,
                             max_packet_size=self.peer_max_packet_size)
        if data is not None:  # larger than the client accepts: discarded, as v5 §3.1.2.11.4 says
            self._writer.write(data)

    def send_many(self, packets: list[Packet]) -> None:
        """`send_nowait` for several packets in ONE write (one send() system call, not one per packet)."""
        if self.closing:
            return
        version = self.protocol_version or MQTT_3_1_1
        data = [d for d in (encode_packet(p, version, max_packet_size=self.peer_max_packet_size) for p in packets)
                if d is not None]
        if data:
            self._writer.write(b"".join(data))

    def close_with(self, reason: int, why: str) -> None:
        if self.closing:
            return
        if self.protocol_version == MQTT_5 and reason:
            props = {PropertyId.REASON_STRING: why[:REASON_STRING_MAX_CHARS]} if why else {}
            self.send_nowait(Disconnect(ReasonCode(reason), props))
        self.conn_id = None  # the broker already knows
        self._close(f"closed by the broker (0x{reason:02X}): {why}")

    def broker_lost(self, disconnect: Disconnect | None = None) -> None:
        conn_id, self.conn_id = self.conn_id, None
        if conn_id is not None:
            self._l.broker.lost(conn_id, disconnect)

    async def _drained(self) -> bool:
        try:
            await asyncio.wait_for(self._writer.drain(), self._l.write_timeout_s * 6)
        except TimeoutError:
            self.abort("the client did not read what we sent for 30 s")
            return False
        except OSError as exc:
            self._close(f"connection error on write: {exc}")
            return False
        return True

    def drop(self, reason: ReasonCode, server_reference: str | None) -> bool:
        """Called by drop_clients (synchronously, between our awaits)."""
        if self.closing:
            return False
        if self.accepted and self.protocol_version == MQTT_5:
            props = {PropertyId.SERVER_REFERENCE: server_reference} if server_reference else {}
            data = encode_packet(Disconnect(reason, props), MQTT_5,
                                 max_packet_size=self.peer_max_packet_size)
            if data is not None:
                self._writer.write(data)
        self._close(f"dropped by this node (0x{reason:02X})")
        return True

    def _close(self, why: str) -> None:
        """Flush what is queued, then FIN; abort if that stalls."""
        if self.closing:
            return
        self.closing = True
        self.close_reason = why
        self._writer.close()
        self._abort_timer = self._loop.call_later(self._l.write_timeout_s,
                                                  self._writer.transport.abort)

    def abort(self, why: str) -> None:
        if not self.closing:
            self.closing = True
            self.close_reason = why
        self._writer.transport.abort()

    async def finish(self) -> None:
        self._close(self.close_reason or "handler ended")
        try:
            await asyncio.wait_for(self._writer.wait_closed(), self._l.write_timeout_s)
        except (TimeoutError, OSError):
            self._writer.transport.abort()

    def emit_closed(self) -> None:
        if self._abort_timer is not None:
            self._abort_timer.cancel()
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


def _disable_nagle(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass  # the peer may already be gone; nothing to tune

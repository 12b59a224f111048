"""MQTT over WebSockets (ports.mqtt_ws, and ports.mqtt_wss with TLS): a framing layer under the same MqttConnection.

Rules:
- The handshake is an HTTP/1.1 GET upgrade of the path /mqtt (what MQTT.js, paho and mosquitto users use) or /
  (some clients send no path), offering the subprotocol `mqtt` (MQTT 5 §6.0.0-3, 3.1.1 §6.0.0-3). Another
  path: 404; no `mqtt` offered, or not a WebSocket upgrade: 400. Extensions are not accepted (permessage-deflate
  would let a small frame expand past every bound).
- The handshake is bounded: at most `max_handshake_bytes` before it completes (431), and it must complete,
  with the CONNECT after it, within the listener's connect timeout: the MQTT session's deadline starts at
  accept, as do the pre-auth budgets (connections per address and in total).
- Binary data frames carry the MQTT byte stream, split anyhow: a frame may hold part of a packet or several.
  Payload goes to the MQTT session as it arrives, the payload of consecutive frames in one piece (nothing is
  reassembled here, so a frame's length costs no memory); a data message longer than `max_message_bytes` is
  closed with 1009. While the MQTT connection has paused reading, frames wsproto has not parsed wait.
- A text frame is closed with 1003 (MQTT §6.0.0-1: binary only); a malformed frame (unmasked, reserved bits or
  opcodes, an oversized control frame) with 1002, by wsproto.
- A ping is answered with a pong; neither counts as MQTT keep-alive (the MQTT session keeps its own).
- A close from the client is answered and the MQTT session sees a peer close; what follows it is ignored.
- When the MQTT session closes, its last packets go out, then a close frame (1000), then FIN (TCP; over TLS
  the close frame alone). Then what the client still sends is read and discarded, up to LINGER_MAX_BYTES or
  LINGER_S, until it closes: a socket closed with unread bytes resets the connection, and the reset can
  destroy our last packets in the client's receive buffer before it reads them (a handover's DISCONNECT
  with its server reference, sent while the connection was held and the client kept sending).
- Everything else (the gate, budgets, overload windows, output bounds, TLS) is the MqttListener's and the
  MqttConnection's: this object is that connection's transport, and the TCP transport's protocol.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from wsproto import ConnectionType, WSConnection
from wsproto.connection import ConnectionState
from wsproto.events import (AcceptConnection, BytesMessage, CloseConnection, Ping, Request, TextMessage)
from wsproto.frame_protocol import CloseReason
from wsproto.utilities import RemoteProtocolError

if TYPE_CHECKING:
    from pairmq.appliance.mqtt.connection import MqttConnection

PATHS = ("/mqtt", "/")
# The linger after our close (see the rules): long enough for a client to read our last frames and close,
# short and bounded, as the MQTT connection's own drain after its FIN.
LINGER_S = 1.0
LINGER_MAX_BYTES = 1024 * 1024
SUBPROTOCOL = "mqtt"
_REASONS = {400: "Bad Request", 404: "Not Found", 431: "Request Header Fields Too Large"}


@dataclasses.dataclass(frozen=True, slots=True)
class WebSocketLimits:
    max_handshake_bytes: int = 8192  # browsers send 0.5-2 KiB (cookies included)
    max_message_bytes: int = 2 << 20  # a data message; MQTT packets are bounded again by the session
    close_timeout_s: float = 5.0  # a refusal or close whose output the client does not read: abort

    def __post_init__(self) -> None:
        for name in ("max_handshake_bytes", "max_message_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 256:
                raise ValueError(f"{name} must be an integer of at least 256, got {value!r}")
        if not self.close_timeout_s > 0:
            raise ValueError("close_timeout_s must be positive")


EventSink = Callable[[str, dict[str, object]], None]


class WebSocketConnection(asyncio.Protocol):
    """The TCP (or TLS) side of one MQTT-over-WebSockets client, and the transport of its MqttConnection."""

    def __init__(self, mqtt: MqttConnection, limits: WebSocketLimits, emit: EventSink) -> None:
        self._mqtt = mqtt
        self._limits = limits
        self._emit = emit
        self._ws = WSConnection(ConnectionType.SERVER)
        self._t: asyncio.Transport | None = None
        self._handshake_bytes = 0
        self._message_bytes = 0
        self._done = False  # refused, or a close was sent or received: nothing more is read
        self._paused = False  # the MQTT connection paused reading
        self._draining = False
        self._lingered: int | None = None  # bytes read and discarded since our close (None: not closing)

    # --- the TCP transport's protocol -----------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._t = transport  # type: ignore[assignment]  # uvloop's transports are not asyncio.Transport subclasses
        self._mqtt.connection_made(self)  # type: ignore[arg-type]  # budgets and the deadline start at accept

    def data_received(self, data: bytes) -> None:
        if self._done:
            if self._lingered is not None:
                self._lingered += len(data)
                if self._lingered > LINGER_MAX_BYTES:
                    self._t.abort()
            return
        ws = self._ws
        if ws.state is ConnectionState.CONNECTING:
            self._handshake_bytes += len(data)
            if self._handshake_bytes > self._limits.max_handshake_bytes:
                self._refuse(431, f"WebSocket handshake over {self._limits.max_handshake_bytes} bytes")
                return
        try:
            ws.receive_data(data)
        except RemoteProtocolError as exc:
            self._refuse(400, f"not a WebSocket handshake: {exc}")
            return
        self._drain()

    def _drain(self) -> None:
        """Hand what wsproto has on, until it has nothing or the MQTT connection paused reading; the payload of
        consecutive data frames goes in one piece, as one TCP read would."""
        if self._draining or self._paused:
            return
        self._draining = True
        ws, chunks = self._ws, []
        try:
            for event in ws.events():
                kind = type(event)
                if kind is BytesMessage:
                    if self._counted(event):  # type: ignore[arg-type]
                        chunks.append(event.data)  # type: ignore[attr-defined]
                        continue
                    chunks = []
                    break
                if chunks:
                    self._mqtt.data_received(b"".join(chunks))
                    chunks = []
                if self._done:
                    break
                if kind is Request:
                    self._request(event)  # type: ignore[arg-type]
                elif kind is Ping:
                    self._t.write(ws.send(event.response()))  # type: ignore[attr-defined]
                elif kind is TextMessage:
                    self._close_frame(CloseReason.UNSUPPORTED_DATA, "MQTT over WebSockets takes binary frames only")
                elif kind is CloseConnection:
                    self._closed_by_peer(event)  # type: ignore[arg-type]
                if self._done or self._paused:
                    break
            if chunks and not self._done:
                self._mqtt.data_received(b"".join(chunks))
        except RemoteProtocolError as exc:
            if ws.state is ConnectionState.CONNECTING or ws.state is ConnectionState.REJECTING:
                self._refuse(400, f"not a WebSocket handshake: {exc}")
            else:
                self._close_frame(CloseReason.PROTOCOL_ERROR, str(exc))
        finally:
            self._draining = False

    def eof_received(self) -> bool:
        if self._lingered is not None:
            return False  # the client's FIN after our close: everything was read, the transport closes cleanly
        self._done = True
        return self._mqtt.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._done = True
        self._mqtt.connection_lost(exc)

    def pause_writing(self) -> None:
        self._mqtt.pause_writing()

    def resume_writing(self) -> None:
        self._mqtt.resume_writing()

    # --- the MqttConnection's transport -------------------------------------------------------------

    def write(self, data: bytes) -> None:
        if self._ws.state is ConnectionState.OPEN:
            self._t.write(self._ws.send(BytesMessage(data=data)))

    def close(self) -> None:
        """The MQTT session closes: a close frame after its last packet, then FIN (bounded in time)."""
        if self._ws.state is ConnectionState.OPEN:
            self._t.write(self._ws.send(CloseConnection(code=CloseReason.NORMAL_CLOSURE)))
        self._finish()

    def abort(self) -> None:
        self._done = True
        self._t.abort()

    def can_write_eof(self) -> bool:
        return False  # `close` is the WebSocket's own closing handshake, bounded in time: no half-close beneath it

    def is_closing(self) -> bool:
        return self._t.is_closing()

    def get_write_buffer_size(self) -> int:
        return self._t.get_write_buffer_size()

    def pause_reading(self) -> None:
        self._paused = True  # what wsproto still holds waits too
        self._t.pause_reading()

    def resume_reading(self) -> None:
        self._paused = False
        self._t.resume_reading()
        if not self._done:
            self._drain()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._t.get_extra_info(name, default)

    # --- the WebSocket's events -----------------------------------------------------------------------

    def _request(self, event: Request) -> None:
        path = event.target.split("?", 1)[0]
        if path not in PATHS:
            self._refuse(404, f"WebSocket path {path[:100]!r} (MQTT is on /mqtt)")
        elif SUBPROTOCOL not in event.subprotocols:
            self._refuse(400, "WebSocket handshake without the subprotocol 'mqtt'")
        else:
            self._t.write(self._ws.send(AcceptConnection(subprotocol=SUBPROTOCOL)))

    def _counted(self, event: BytesMessage) -> bool:
        """False (and closed with 1009) when this chunk takes its message past `max_message_bytes`."""
        self._message_bytes += len(event.data)
        if self._message_bytes > self._limits.max_message_bytes:
            self._close_frame(CloseReason.MESSAGE_TOO_BIG,
                              f"WebSocket message over {self._limits.max_message_bytes} bytes")
            return False
        if event.message_finished:
            self._message_bytes = 0
        return True

    def _closed_by_peer(self, event: CloseConnection) -> None:
        if self._ws.state is ConnectionState.OPEN:  # wsproto's way of saying a frame was malformed
            self._close_frame(CloseReason(event.code), event.reason or "malformed frame")
            return
        if self._ws.state is ConnectionState.REMOTE_CLOSING:
            self._t.write(self._ws.send(event.response()))
        self._done = True
        self._mqtt.eof_received()  # the session closes as on FIN, and closes us

    # --- refusing and closing ---------------------------------------------------------------------------

    def _refuse(self, status: int, why: str) -> None:
        """An HTTP error instead of the upgrade; the MQTT session never saw a byte."""
        self._done = True
        self._emit("connection_refused", {"peer": self._mqtt.peer, "reason": why})
        self._t.write(f"HTTP/1.1 {status} {_REASONS[status]}\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
                      .encode())
        self._finish()

    def _close_frame(self, code: CloseReason, why: str) -> None:
        """The client broke the WebSocket rules: a close frame with `code`, then FIN."""
        self._done = True
        self._emit("bad_packet", {"peer": self._mqtt.peer, "reason": f"WebSocket: {why}"[:200]})
        if self._ws.state is ConnectionState.OPEN:
            self._t.write(self._ws.send(CloseConnection(code=code, reason=why[:100])))
        self._finish()

    def _finish(self) -> None:
        """FIN (where TCP allows it) after our last frame, then linger reading (see the rules); bounded."""
        self._done = True
        transport = self._t
        if transport.is_closing() or self._lingered is not None:
            return
        loop = asyncio.get_running_loop()
        try:
            if transport.can_write_eof():
                transport.write_eof()
        except NotImplementedError:  # a wrapper transport that does not say: the close frame alone
            pass
        except OSError:  # the peer is gone already: nothing left to linger for
            transport.abort()
            return
        self._lingered = 0
        transport.resume_reading()  # whatever paused it (a handover's hold): the client's bytes are discarded now
        loop.call_later(LINGER_S, self._linger_over)
        loop.call_later(self._limits.close_timeout_s, transport.abort)

    def _linger_over(self) -> None:
        """The client did not close within LINGER_S: close (flushing what it has not read yet; the close
        timeout bounds that)."""
        if not self._t.is_closing():
            self._t.close()

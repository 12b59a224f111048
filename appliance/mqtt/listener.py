"""The MQTT listener: a thin asyncio adapter that the redundancy core gates.

Rules (each connection's own are in session.py):

- Overload (DESIGN §5): the CONNECT queue and credential checks are in
  connects.py; the in-flight window and mate backpressure in overload.py.
- TLS (`ssl`, the 8883 listener): asyncio runs the handshake (TLS >= 1.2 is
  the context's business). A handshake that fails at the TLS level (plain
  MQTT bytes, an old TLS version) is counted in `tls_handshake_failures`,
  reported as a "tls_handshake_failed" event and closed (asyncio would drop
  it silently: see `appliance.tls.report_handshake_failures`). A listener
  whose context requires client certificates accepts and runs each handshake
  itself (tls_accept.py) and reports each failure with the peer's address too
  ("tls_refused").
- In-flight window (overload.py): a client's PUBLISH/SUBSCRIBE/UNSUBSCRIBE
  whose effects wait for a spool commit count until the commit is done; while
  the count has reached the window its socket is not read. A client whose
  output passes the transport's high-water mark is not read either.
- Pre-auth budget (budget.py): a connection over the per-address or total
  cap of connections that have not finished CONNECT is closed unread at
  accept ("connection_refused" event); one whose buffered bytes pass the
  total pre-auth byte cap is aborted. The codec refuses a CONNECT over
  `max_connect_bytes` from its fixed header and one with too many properties
  (0x95), so nothing unauthenticated is buffered or decoded at length.
- Output that makes no progress for `write_timeout_s`, output past
  `max_output_bytes`, or a close that does not finish within
  `write_timeout_s`: abort.
- A connection handles at most PACKETS_PER_TURN packets per loop turn; the
  rest stay buffered (its socket unread) until the next turn.
- Writes are coalesced: everything produced for a connection in one loop turn
  goes out in one transport write, in order (traffic.py); a close flushes first.
- WebSockets (`websocket` limits given: ports 8083/8084): each connection's transport is a
  websockets.WebSocketConnection carrying the same MqttConnection; everything above holds for it.
- A server reference (v5 "use another server", DISCONNECT on handover) names the active node with this
  listener's port: a client is sent to the same door (TLS, WebSockets) on the other host.
- Nothing the peer sends can raise out of here; a bug in this package or in
  the gate is logged with its traceback and the connection is closed (the
  gate failing counts as "may not serve").
"""

from __future__ import annotations

import asyncio
import logging
import ssl as _ssl
import secrets
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from pairmq.appliance.clock import now_ms
from pairmq.appliance.mqtt.codec import DEFAULT_MAX_PACKET_SIZE, DISCONNECT_REASON_CODES, PacketReader
from pairmq.appliance.mqtt.budget import PreAuthBudget, PreAuthLimits
from pairmq.appliance.mqtt.connection import MqttConnection
from pairmq.appliance.mqtt.connects import ConnectLimits, ConnectPipeline, CredentialCheck
from pairmq.appliance.mqtt.session import NOT_SUPPORTED_YET  # noqa: F401  (re-exported)
from pairmq.appliance.mqtt.session import FrontDoor, SessionLimits
from pairmq.appliance.mqtt.overload import MateBackpressure, OverloadLimits, WindowPolicy
from pairmq.appliance.mqtt.tls_accept import HandshakeFirstServer
from pairmq.appliance.mqtt.traffic import ListenerTraffic
from pairmq.appliance.mqtt.websockets import WebSocketConnection, WebSocketLimits
from pairmq.appliance.mqtt.wire import ReasonCode

if TYPE_CHECKING:
    from pairmq.appliance.broker.service import BrokerService

log = logging.getLogger(__name__)

# asyncio's default (100) overflows in a reconnect storm: the kernel then drops the handshake's last ACK and the
# client's CONNECT waits for SYN-ACK retransmits (1 s, 3 s, 7 s...). The kernel caps it at net.core.somaxconn.
LISTEN_BACKLOG = 4096
IP_FREEBIND = getattr(socket, "IP_FREEBIND", 15)  # linux/in.h
LAG_SAMPLE_S = 0.05
# A subscriber that stops reading is dropped once this much output waits for it (its QoS 1/2 messages stay
# queued in its session; QoS 0 ones are lost with the connection): a few seconds of a fast stream, not 64 MiB.
DEFAULT_MAX_OUTPUT_BYTES = 8 << 20


class Gate(Protocol):
    def may_serve(self) -> bool:
        """True only while this node holds a live activity lease."""

    def active_server_reference(self) -> str | None:
        """"host:port" of the active node, if known."""


EventSink = Callable[[str, dict[str, object]], None]


def _new_client_id() -> str:
    return "pairmq-" + secrets.token_hex(8)


class MqttListener:
    def __init__(self, host: str, port: int, gate: Gate, *,
                 max_packet_size: int = DEFAULT_MAX_PACKET_SIZE,
                 on_event: EventSink | None = None,
                 connect_timeout_s: float = 10.0,
                 write_timeout_s: float = 5.0,
                 broker: BrokerService | None = None,
                 max_connections: int = 20_000,
                 connect_queue_size: int = 10_000,
                 connect_batch: int = 1024,
                 connect_budget_ms: float = 20.0,
                 max_connect_checks: int = 256,
                 max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
                 preauth: PreAuthLimits = PreAuthLimits(),
                 overload: OverloadLimits = OverloadLimits(),
                 credential_check: CredentialCheck | None = None,
                 ssl: _ssl.SSLContext | None = None,
                 virtual_ip: str | None = None,
                 max_keep_alive_s: int = 0, websocket: WebSocketLimits | None = None,
                 identity: Callable[[_ssl.SSLObject | None], str | None] | None = None) -> None:
        PacketReader(max_packet_size=max_packet_size)  # validates the size
        if connect_timeout_s <= 0 or write_timeout_s <= 0:
            raise ValueError("timeouts must be positive")
        for name, value in (("max_connections", max_connections), ("connect_queue_size", connect_queue_size),
                            ("connect_batch", connect_batch), ("max_connect_checks", max_connect_checks),
                            ("max_output_bytes", max_output_bytes)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        self.host = host
        self.virtual_ip = virtual_ip  # also accepted there, whenever this host holds it (appliance/node/vip.py)
        self._vip_server: asyncio.AbstractServer | None = None
        self.requested_port = port
        self.max_packet_size = max_packet_size
        self.connect_timeout_s = connect_timeout_s
        self.write_timeout_s = write_timeout_s
        if not connect_budget_ms > 0:
            raise ValueError(f"connect_budget_ms must be positive, got {connect_budget_ms!r}")
        self.connects = ConnectPipeline(ConnectLimits(
            queue_size=connect_queue_size, batch=connect_batch, budget_s=connect_budget_ms / 1000,
            max_checks=max_connect_checks, max_connections=max_connections, check_timeout_s=connect_timeout_s),
            credential_check, accepted=lambda: self.accepted_count)
        self.max_output_bytes = max_output_bytes
        self.budget = PreAuthBudget(preauth)
        self.max_keep_alive_s = max_keep_alive_s
        self.session_limits = self._session_limits()
        self._ssl = ssl
        self.websocket = websocket
        self.identity = identity  # a client certificate's identity replaces the CONNECT's user name (tls.py)
        self.tls_handshake_failures = 0
        self.last_tls_handshake_failure = ""
        # A listener that requires client certificates runs its handshakes itself, to report refusals with the
        # peer's address (tls_accept.py); the others count them through the context.
        self._handshake_first = ssl is not None and ssl.verify_mode == _ssl.CERT_REQUIRED
        if ssl is not None and not self._handshake_first:
            from pairmq.appliance.tls import report_handshake_failures

            report_handshake_failures(ssl, self._tls_handshake_failed)
        self._gate = gate
        self._on_event = on_event
        self.front_door = FrontDoor(may_serve=self.gate_allows, server_reference=self.server_reference, emit=self.emit,
                                    new_client_id=_new_client_id)
        self.broker = broker  # appliance.broker.service.BrokerService, or None: the front door alone
        self.policy = WindowPolicy(overload)
        # The counters, window and output every connection touches per packet (traffic.py).
        self.traffic = ListenerTraffic(self.policy.window)
        self.loop_lag_ms = 0.0
        self.output_overflows = 0  # connections dropped with more than max_output_bytes unread
        self.throttle_events = 0  # times a client's socket stopped being read for its full window
        self.connections_opened = 0  # for $SYS, as the traffic's counters
        self.throttled: set[MqttConnection] = set()
        self.held_for_mate: set[MqttConnection] = set()
        self.backpressure: MateBackpressure = getattr(broker, "backpressure", None) or MateBackpressure()
        self.accepted_count = 0  # clients with CONNACK success still connected
        self._server: asyncio.AbstractServer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._conns: set[MqttConnection] = set()
        self._lag_timer: asyncio.TimerHandle | None = None
        self._all_closed: asyncio.Event | None = None

    @property
    def port(self) -> int:
        """The bound port (the real one when 0 was asked for)."""
        assert self._server is not None and self._server.sockets, "listener not started"
        return self._server.sockets[0].getsockname()[1]

    @property
    def window(self) -> int:
        """The in-flight window (overload.py): packets a client may have waiting for a commit."""
        return self.traffic.window

    @window.setter
    def window(self, window: int) -> None:
        self.traffic.window = window

    # Counted by the connections; read by stats, $SYS (node/sys_publisher.py) and /metrics.
    @property
    def messages_in(self) -> int:
        """PUBLISH packets taken from clients (Prometheus computes the rates)."""
        return self.traffic.messages_in

    @property
    def messages_out(self) -> int:
        """PUBLISH packets written to clients."""
        return self.traffic.messages_out

    @property
    def packets_in(self) -> int:
        return self.traffic.packets_in

    @property
    def packets_out(self) -> int:
        return self.traffic.packets_out

    @property
    def bytes_in(self) -> int:
        return self.traffic.bytes_in

    @property
    def bytes_out(self) -> int:
        return self.traffic.bytes_out

    @property
    def client_count(self) -> int:
        """Clients that got CONNACK success and are still connected."""
        return self.accepted_count

    def connections(self) -> list:
        """The open connections, accepted or not (management API: `pairmq show clients`)."""
        return list(self._conns)

    def stats(self) -> dict[str, object]:
        """For the management API."""
        return {"clients": self.accepted_count, "connections": len(self._conns),
                "connect_queue": len(self.connects), "connect_queue_size": self.connects.limits.queue_size,
                "max_connections": self.connects.limits.max_connections, "window": self.window,
                "load": round(self.policy.load, 3), "loop_lag_ms": round(self.loop_lag_ms, 1),
                "throttled_clients": len(self.throttled), "throttle_events": self.throttle_events,
                "busy_refusals": self.connects.busy_refusals, "limit_refusals": self.connects.limit_refusals,
                "messages_in": self.messages_in, "messages_out": self.messages_out,
                "max_output_bytes": self.max_output_bytes, "output_overflows": self.output_overflows,
                **self.budget.view()}

    async def start(self) -> None:
        assert self._server is None, "listener already started"
        self._loop = asyncio.get_running_loop()
        self.traffic.start(self._loop)
        if self._handshake_first:
            sock = socket.create_server((self.host, self.requested_port), backlog=LISTEN_BACKLOG)
            self._server = self._handshake_first_server(sock)  # type: ignore[assignment]
            if self.virtual_ip is not None:
                sock = _freebind_socket(self.virtual_ip, self.port)
                sock.listen(LISTEN_BACKLOG)
                self._vip_server = self._handshake_first_server(sock)  # type: ignore[assignment]
        else:
            tls_timeout = self.connect_timeout_s if self._ssl is not None else None
            self._server = await self._loop.create_server(
                self._new_connection, self.host, self.requested_port, reuse_address=True,
                backlog=LISTEN_BACKLOG, ssl=self._ssl, ssl_handshake_timeout=tls_timeout)
            if self.virtual_ip is not None:
                self._vip_server = await self._loop.create_server(
                    self._new_connection, sock=_freebind_socket(self.virtual_ip, self.port), backlog=LISTEN_BACKLOG,
                    ssl=self._ssl, ssl_handshake_timeout=tls_timeout)
        self._lag_timer = self._loop.call_later(LAG_SAMPLE_S, self._sample_load, self._loop.time() + LAG_SAMPLE_S)

    def _new_connection(self) -> MqttConnection | WebSocketConnection:
        conn = MqttConnection(self)
        return conn if self.websocket is None else WebSocketConnection(conn, self.websocket, self.emit)

    def _handshake_first_server(self, sock: socket.socket) -> HandshakeFirstServer:
        sock.setblocking(False)
        return HandshakeFirstServer(sock, self._ssl, self._new_connection, timeout_s=self.connect_timeout_s,
                                    max_handshakes=self.budget.limits.max_connections, on_refused=self._tls_refused)

    async def stop(self) -> None:
        """Stop accepting, drop every client (v5: 0x8B) and wait, bounded."""
        server, self._server = self._server, None
        if server is None:
            return
        if self._lag_timer is not None:
            self._lag_timer.cancel()
        server.close()
        vip_server, self._vip_server = self._vip_server, None
        if vip_server is not None:
            vip_server.close()
        self.drop_clients(ReasonCode.SERVER_SHUTTING_DOWN)
        if self._conns:
            self._all_closed = asyncio.Event()
            try:
                await asyncio.wait_for(self._all_closed.wait(), self.write_timeout_s)
            except TimeoutError:
                for conn in list(self._conns):
                    conn.abort("listener stopped")
        try:
            await asyncio.wait_for(server.wait_closed(), self.write_timeout_s)
        except TimeoutError:
            log.warning("MQTT listener on %s:%s did not close in time", self.host, self.requested_port)

    def hold_clients(self) -> None:
        """A handover begins: stop reading every client (nothing more is taken or acknowledged by us)."""
        for conn in list(self._conns):
            conn.hold()

    def unhold_clients(self) -> None:
        """The handover was aborted and this node serves again: read the clients again."""
        for conn in list(self._conns):
            conn.unhold()

    def drop_clients(self, reason_code: int = ReasonCode.SERVER_SHUTTING_DOWN,
                     server_reference: str | None = None, only=None) -> int:
        """Disconnect everyone now (or the accepted clients `only(conn)` picks); v5 clients are told why.
        Returns how many."""
        if reason_code not in DISCONNECT_REASON_CODES or reason_code == ReasonCode.SUCCESS:
            raise ValueError(f"0x{reason_code:02X} is not a DISCONNECT error reason code")
        if only is not None:
            return sum(conn.drop(ReasonCode(reason_code), None) for conn in list(self._conns)
                       if conn.accepted and only(conn))
        self.connects.clear()  # their connections are in _conns and are closed below
        server_reference = self._same_door(server_reference)
        return sum(conn.drop(ReasonCode(reason_code), server_reference) for conn in list(self._conns))

    def set_limits(self, preauth: PreAuthLimits, max_output_bytes: int, max_keep_alive_s: int = 0) -> None:
        """New front-door limits (config-sync): for connections accepted from now on; output at once."""
        self.budget.limits = preauth
        self.max_keep_alive_s = max_keep_alive_s
        self.session_limits = self._session_limits()
        self.max_output_bytes = max_output_bytes

    def _session_limits(self) -> SessionLimits:
        preauth = self.budget.limits
        return SessionLimits(max_packet_size=self.max_packet_size, max_connect_bytes=preauth.max_connect_bytes,
                             max_connect_properties=preauth.max_connect_properties,
                             connect_timeout_s=self.connect_timeout_s, max_keep_alive_s=self.max_keep_alive_s)

    def set_overload(self, overload: OverloadLimits) -> None:
        """New overload settings (config-sync): the window restarts from the new maximum."""
        self.policy = WindowPolicy(overload)
        self.window = self.policy.window

    # --- used by connections ---------------------------------------------------

    def gate_allows(self) -> bool:
        try:
            return bool(self._gate.may_serve())
        except Exception:
            log.exception("gate.may_serve() failed; treating it as 'may not serve'")
            return False

    def server_reference(self) -> str | None:
        try:
            reference = self._gate.active_server_reference()
        except Exception:
            log.exception("gate.active_server_reference() failed")
            return None
        return self._same_door(reference)

    def _same_door(self, reference: str | None) -> str | None:
        """The active's "host:port" with this listener's port: a WebSocket or TLS client sent to the plain MQTT
        port would speak the wrong protocol there."""
        if reference is None or not self.requested_port:
            return reference
        return f"{reference.rpartition(':')[0]}:{self.requested_port}"

    def emit(self, kind: str, fields: dict[str, object]) -> None:
        if self._on_event is None:
            return
        try:
            self._on_event(kind, {**fields, "now_ms": now_ms()})
        except Exception:
            log.exception("on_event(%r) failed", kind)

    def opened(self, conn: MqttConnection) -> None:
        self._conns.add(conn)
        self.connections_opened += 1

    def closed(self, conn: MqttConnection) -> None:
        self._conns.discard(conn)
        self.throttled.discard(conn)
        self.held_for_mate.discard(conn)
        if self._all_closed is not None and not self._conns:
            self._all_closed.set()

    def _tls_refused(self, peer: str, reason: str) -> None:
        """A handshake of a listener that requires client certificates failed: reported with the peer."""
        self._tls_handshake_failed(reason)
        self.emit("tls_refused", {"peer": peer, "reason": reason[:200]})

    def _tls_handshake_failed(self, reason: str) -> None:
        self.tls_handshake_failures += 1
        self.last_tls_handshake_failure = reason
        self.emit("tls_handshake_failed", {"reason": reason[:200]})

    # --- load and the in-flight window ----------------------------------------------------

    def _mate_lagging(self) -> bool:
        return self.broker is not None and self.broker.mate_over_lag()

    def hold_for_mate(self, conn: MqttConnection) -> bool:
        """A QoS 1/2 PUBLISH from `conn` was handled: stop reading it while the mate link lags (overload.py)."""
        lagging = self._mate_lagging()
        if not lagging and not self.backpressure.holding:
            return False  # the usual case, without a clock read (it runs once per QoS 1/2 PUBLISH)
        if not self.backpressure.over(now_ms(), lagging):
            return False
        if not self.held_for_mate:
            log.info("mate link backlog over max_lag: holding publishers")
        self.held_for_mate.add(conn)
        return True

    def _sample_load(self, expected: float) -> None:
        loop = self._loop
        now = loop.time()
        self.loop_lag_ms = max(0.0, (now - expected) * 1000)
        writer = getattr(self.broker, "writer", None)
        backlog = writer.pending_ops if writer is not None else 0
        before = self.window
        self.window = self.policy.update(now_ms(), backlog, self.loop_lag_ms)
        if self.window > before and self.throttled:
            for conn in list(self.throttled):
                conn.window_grew()
        if self.held_for_mate:
            took = self.backpressure.sample(now_ms(), self._mate_lagging())
            if not self.backpressure.holding:  # ended now, or by the other listener's sample (MQTT over TLS)
                held, self.held_for_mate = self.held_for_mate, set()
                log.info("mate link drained (%s ms): reading %d held publishers again", took, len(held))
                for conn in held:
                    conn.mate_drained()
        self._lag_timer = loop.call_at(now + LAG_SAMPLE_S, self._sample_load, now + LAG_SAMPLE_S)


def _freebind_socket(address: str, port: int) -> socket.socket:
    """A listening socket on an address this host may not hold yet (IP_FREEBIND): the virtual IP's
    connections arrive once it is added, without rebinding on every failover."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_IP, IP_FREEBIND, 1)
        sock.bind((address, port))
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock

"""The management API's listener on 8080: what a connection may cost before and between requests.

Rules:
- Settings are the group file's optional [management] table (`ManagementSettings`), per listener,
  checked at load: a node never starts half-configured.
- A connection without a complete request head for `idle_timeout_ms` is closed: a silent connection,
  an idle keep-alive and a slowloris head alike (aiohttp's keep-alive timer fires while its handler
  waits for a whole head, however many bytes of one have come). A body has `body_timeout_ms` (408).
- At most `max_connections` connections, and `max_connections_per_address` from one source address;
  one more is reset at once and counted. They spend the broker process's file descriptors.
- HTTPS when `cert_file` and `key_file` are set (TLS >= 1.2; the handshake has the idle deadline too).
  The CLI and the nodes' status fan-out verify the certificate against `ca_file`, by default the
  certificate itself: the self-signed one `pairmq init --management-tls` makes is thereby pinned.
- `ConnectionCaps` is sans-I/O; the aiohttp glue (`GuardedRunner`) only reports connections to it.
"""

from __future__ import annotations

import asyncio

from aiohttp import web


class ConnectionCaps:
    """Open connections in total and per source address; admits or refuses each new one."""

    def __init__(self, max_total: int, max_per_address: int) -> None:
        self.max_total = max_total
        self.max_per_address = max_per_address
        self._owner: dict[object, str] = {}  # connection -> its address
        self._per_address: dict[str, int] = {}
        self.refused_total = 0
        self.refused_per_address = 0

    def __len__(self) -> int:
        return len(self._owner)

    def admit(self, connection: object, address: str) -> bool:
        if len(self._owner) >= self.max_total:
            self.refused_total += 1
            return False
        if self._per_address.get(address, 0) >= self.max_per_address:
            self.refused_per_address += 1
            return False
        self._owner[connection] = address
        self._per_address[address] = self._per_address.get(address, 0) + 1
        return True

    def release(self, connection: object) -> None:
        address = self._owner.pop(connection, None)
        if address is None:
            return
        left = self._per_address[address] - 1
        if left:
            self._per_address[address] = left
        else:
            del self._per_address[address]

    def view(self) -> dict:
        return {"open": len(self._owner), "addresses": len(self._per_address), "max": self.max_total,
                "max_per_address": self.max_per_address, "refused_total_cap": self.refused_total,
                "refused_address_cap": self.refused_per_address}


class _GuardedServer(web.Server):
    """aiohttp's connection manager, reporting each connection to the caps before it is served."""

    caps: ConnectionCaps

    def connection_made(self, handler, transport) -> None:
        super().connection_made(handler, transport)
        peer = transport.get_extra_info("peername")
        if not self.caps.admit(handler, peer[0] if peer else "?"):
            transport.abort()  # a reset costs nothing to send, unlike an answer

    def connection_lost(self, handler, exc: BaseException | None = None) -> None:
        self.caps.release(handler)
        super().connection_lost(handler, exc)


class GuardedRunner(web.AppRunner):
    """An AppRunner whose connections pass `caps` (aiohttp has no connection limit of its own)."""

    def __init__(self, app: web.Application, caps: ConnectionCaps, **kwargs) -> None:
        super().__init__(app, **kwargs)
        self._caps = caps

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        server.__class__ = _GuardedServer  # same state, our two hooks; aiohttp builds it in Application
        server.caps = self._caps
        return server


class GuardedSite(web.TCPSite):
    """A TCPSite whose TLS handshakes and closing handshakes share the idle deadline (asyncio's defaults would
    hold a connection 60 s before its handshake and 30 s after the server closed it, for a peer that never
    answers the close_notify)."""

    __slots__ = ("_handshake_s",)

    def __init__(self, runner: web.AppRunner, host: str, port: int, *, handshake_s: float, **kwargs) -> None:
        super().__init__(runner, host, port, **kwargs)
        self._handshake_s = handshake_s

    async def start(self) -> None:
        await web.BaseSite.start(self)  # registers with the runner; the socket is ours to make
        extra = ({"ssl_handshake_timeout": self._handshake_s, "ssl_shutdown_timeout": self._handshake_s}
                 if self._ssl_context is not None else {})
        self._server = await asyncio.get_running_loop().create_server(
            self._runner.server, self._host, self._port, ssl=self._ssl_context, backlog=self._backlog,
            reuse_address=self._reuse_address, reuse_port=self._reuse_port, **extra)
        self._bound_port = self._server.sockets[0].getsockname()[1]

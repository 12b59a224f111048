"""Accepting for a listener that requires TLS client certificates: each handshake where the peer is known.

Rules:
- asyncio and uvloop run a server's TLS handshake before the protocol exists and drop a failed one without
  saying who it was (tls.report_handshake_failures sees the reason only). A refused client certificate must
  be reported with the peer's address, so these listeners accept sockets themselves and run each handshake
  with `loop.connect_accepted_socket`, which raises the failure, within the listener's connect timeout.
  (`loop.start_tls` on an accepted transport is no substitute: uvloop starts reading a transport right after
  `connection_made` whatever it asked, and the ClientHello can be read as plain data.)
- A failed handshake (a certificate from another CA, none, a plain-text client, a timeout) is reported as
  `on_refused(peer, reason)` and the socket closed; OpenSSL has already sent its alert.
- At most `max_handshakes` run at once; a connection past it is closed at once and reported.
- The object stands in for the asyncio server (`sockets`, `close`, `wait_closed`).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections.abc import Callable


class HandshakeFirstServer:
    def __init__(self, sock: socket.socket, context: ssl.SSLContext, new_protocol: Callable[[], asyncio.Protocol],
                 *, timeout_s: float, max_handshakes: int, on_refused: Callable[[str, str], None]) -> None:
        self.sockets = [sock]
        self._sock = sock
        self._context = context
        self._new_protocol = new_protocol
        self._timeout_s = timeout_s
        self._max_handshakes = max_handshakes
        self._on_refused = on_refused
        self._handshakes: set[asyncio.Task] = set()
        self._accepting = asyncio.get_running_loop().create_task(self._accept())

    def close(self) -> None:
        self._accepting.cancel()
        for task in list(self._handshakes):
            task.cancel()
        self._sock.close()

    async def wait_closed(self) -> None:
        with contextlib.suppress(asyncio.CancelledError):
            await self._accepting
        if self._handshakes:
            await asyncio.wait(list(self._handshakes))

    async def _accept(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, address = await loop.sock_accept(self._sock)
            except OSError:  # EMFILE and the like: the listening socket stays, try again next turn
                await asyncio.sleep(0.1)
                continue
            peer = f"{address[0]}:{address[1]}" if isinstance(address, tuple) else str(address)
            if len(self._handshakes) >= self._max_handshakes:
                conn.close()
                self._on_refused(peer, f"{self._max_handshakes} TLS handshakes already running")
                continue
            task = loop.create_task(self._handshake(conn, peer))
            self._handshakes.add(task)
            task.add_done_callback(self._handshakes.discard)

    async def _handshake(self, conn: socket.socket, peer: str) -> None:
        try:
            await asyncio.get_running_loop().connect_accepted_socket(
                self._new_protocol, conn, ssl=self._context, ssl_handshake_timeout=self._timeout_s)
        except (ssl.SSLError, OSError, TimeoutError, ConnectionError) as exc:
            self._on_refused(peer, str(exc) or type(exc).__name__)
            conn.close()

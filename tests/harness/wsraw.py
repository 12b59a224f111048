"""MQTT over WebSockets written by hand: a blocking client for tests that need what paho hides (frames split
anyhow, text frames, oversized or malformed frames, a handshake sent slowly or not at all)."""

from __future__ import annotations

import socket
import time

HANDSHAKE = ("GET {path} HTTP/1.1\r\nHost: pairmq\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
             "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n{extra}\r\n")
BINARY, TEXT, CLOSE, PING, PONG, CONTINUATION = 0x2, 0x1, 0x8, 0x9, 0xA, 0x0


def handshake(path: str = "/mqtt", protocols: str | None = "mqtt", extra: str = "") -> bytes:
    if protocols is not None:
        extra = f"Sec-WebSocket-Protocol: {protocols}\r\n" + extra
    return HANDSHAKE.format(path=path, extra=extra).encode()


def frame(payload: bytes, opcode: int = BINARY, fin: bool = True, masked: bool = True,
          declared: int | None = None) -> bytes:
    """A client frame (masked with the all-zero key, so the payload reads as sent); `declared` lies about
    the length."""
    n = len(payload) if declared is None else declared
    head = bytes([(0x80 if fin else 0) | opcode])
    bit = 0x80 if masked else 0
    if n < 126:
        head += bytes([bit | n])
    elif n < 1 << 16:
        head += bytes([bit | 126]) + n.to_bytes(2, "big")
    else:
        head += bytes([bit | 127]) + n.to_bytes(8, "big")
    return head + (b"\0\0\0\0" if masked else b"") + payload


class WsRaw:
    def __init__(self, host: str, port: int, source: str | None = None, timeout_s: float = 5.0) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout_s,
                                             source_address=(source, 0) if source else None)
        self.buffer = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def upgrade(self, path: str = "/mqtt", protocols: str | None = "mqtt") -> bytes:
        """Send the handshake; returns the response head (status line and headers)."""
        self.send(handshake(path, protocols))
        return self.response_head()

    def response_head(self) -> bytes:
        while b"\r\n\r\n" not in self.buffer:
            chunk = self.sock.recv(65536)
            if not chunk:
                break
            self.buffer += chunk
        head, _, self.buffer = self.buffer.partition(b"\r\n\r\n")
        return head

    def frames(self, until_closed: bool = True, timeout_s: float = 5.0) -> list[tuple[int, bytes]]:
        """The server's frames (opcode, payload) until it closes the connection (or the timeout)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                chunk = self.sock.recv(65536)
            except (TimeoutError, socket.timeout):
                break
            except ConnectionResetError:
                break
            if not chunk:
                break
            self.buffer += chunk
            if not until_closed and self._complete():
                break
        return self._parse()

    def _complete(self) -> bool:
        return bool(self.buffer) and len(self._parse(consume=False)) > 0

    def _parse(self, consume: bool = True) -> list[tuple[int, bytes]]:
        out, data, i = [], self.buffer, 0
        while len(data) - i >= 2:
            opcode, n, j = data[i] & 0x0F, data[i + 1] & 0x7F, i + 2
            if n == 126:
                n, j = int.from_bytes(data[j:j + 2], "big"), j + 2
            elif n == 127:
                n, j = int.from_bytes(data[j:j + 8], "big"), j + 8
            if len(data) < j + n:
                break
            out.append((opcode, data[j:j + n]))
            i = j + n
        if consume:
            self.buffer = data[i:]
        return out

    def closed(self, timeout_s: float = 5.0) -> bool:
        """True once the server closed the connection (FIN or reset) within the timeout."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                chunk = self.sock.recv(65536)
            except (TimeoutError, socket.timeout):
                return False
            except ConnectionResetError:
                return True
            if not chunk:
                return True
            self.buffer += chunk
        return False

    def close(self) -> None:
        self.sock.close()


def close_code(payload: bytes) -> int | None:
    return int.from_bytes(payload[:2], "big") if len(payload) >= 2 else None

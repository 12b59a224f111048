"""The benchmark's load generator: a raw MQTT 3.1.1 client on asyncio Protocols (uvloop when installed).

Packets are pre-encoded by tests/harness/mqttraw.py (the tests' raw client shares
them); writes are pipelined; every QoS 1 PUBLISH received is answered with one
PUBACK write per read. Every broker gets exactly this client. Over WebSockets
(`ws=True`) the same client runs on `WsTransport`: each of its writes is one
masked binary frame (wsproto), what arrives is unframed before it reads it.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket

from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, BytesMessage, CloseConnection, Ping, RejectConnection, Request

from tests.harness.mqttraw import DISCONNECT_PACKET, connect_packet, subscribe_packet

CONNECT_TIMEOUT_S = 60.0


class Client(asyncio.Protocol):
    """One raw MQTT 3.1.1 connection. Counts PUBLISHes in, answers QoS 1 with one PUBACK write per read."""

    def __init__(self) -> None:
        loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.connack: asyncio.Future = loop.create_future()
        self.suback: asyncio.Future = loop.create_future()
        self.closed: asyncio.Future = loop.create_future()
        self.received = 0
        self.acks = 0
        self.on_acks = None  # called with the number of PUBACKs in one read
        self.writable = asyncio.Event()
        self.writable.set()

    def connection_made(self, transport) -> None:
        self.transport = transport
        transport.set_write_buffer_limits(high=256 * 1024)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def pause_writing(self) -> None:
        self.writable.clear()

    def resume_writing(self) -> None:
        self.writable.set()

    def connection_lost(self, exc) -> None:
        self.writable.set()
        for fut in (self.connack, self.suback, self.closed):
            if not fut.done():
                fut.set_result(None if fut is self.closed else exc or ConnectionResetError("closed"))

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        i, n = 0, len(buf)
        acks = 0
        pubacks = []
        while n - i >= 2:
            header = buf[i]
            length, mult, j = 0, 1, i + 1
            while j < n:
                b = buf[j]
                length += (b & 0x7F) * mult
                j += 1
                if b < 0x80:
                    break
                mult <<= 7
            else:
                break
            end = j + length
            if end > n:
                break
            kind = header >> 4
            if kind == 3:
                self.received += 1
                if header & 0x06:
                    at = j + 2 + (buf[j] << 8 | buf[j + 1])
                    pubacks.append(b"\x40\x02" + bytes(buf[at:at + 2]))
            elif kind == 4:
                acks += 1
            elif kind == 2:
                if not self.connack.done():
                    self.connack.set_result(buf[j + 1])
            elif kind == 9:
                if not self.suback.done():
                    self.suback.set_result(bytes(buf[j + 2:end]))
            i = end
        if i:
            del buf[:i]
        if pubacks:
            self.transport.write(b"".join(pubacks))
        if acks:
            self.acks += acks
            if self.on_acks is not None:
                self.on_acks(acks)

    def send(self, data: bytes) -> None:
        self.transport.write(data)

    def close(self, graceful: bool = True) -> None:
        if self.transport is not None and not self.transport.is_closing():
            if graceful:
                self.transport.write(DISCONNECT_PACKET)
                self.transport.close()
            else:
                self.transport.abort()


class WsTransport(asyncio.Protocol):
    """MQTT over WebSockets (path /mqtt, subprotocol mqtt) under a Client: its transport, and the socket's protocol."""

    def __init__(self, inner: Client, host: str) -> None:
        self.inner = inner
        self.host = host
        self.ws = WSConnection(ConnectionType.CLIENT)
        self.t: asyncio.Transport | None = None
        self.ready: asyncio.Future = asyncio.get_running_loop().create_future()

    def connection_made(self, transport) -> None:
        self.t = transport
        transport.write(self.ws.send(Request(host=self.host, target="/mqtt", subprotocols=["mqtt"])))

    def data_received(self, data: bytes) -> None:
        self.ws.receive_data(data)
        for event in self.ws.events():
            if isinstance(event, BytesMessage):
                self.inner.data_received(event.data)
            elif isinstance(event, AcceptConnection):
                self.inner.connection_made(self)
                self.ready.set_result(None)
            elif isinstance(event, Ping):
                self.t.write(self.ws.send(event.response()))
            elif isinstance(event, (RejectConnection, CloseConnection)):
                self.t.close()

    def connection_lost(self, exc) -> None:
        if not self.ready.done():
            self.ready.set_exception(exc or ConnectionResetError("closed during the WebSocket handshake"))
        else:
            self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    # The Client's transport.
    def write(self, data: bytes) -> None:
        self.t.write(self.ws.send(BytesMessage(data=data)))

    def close(self) -> None:
        self.t.close()

    def abort(self) -> None:
        self.t.abort()

    def is_closing(self) -> bool:
        return self.t.is_closing()

    def set_write_buffer_limits(self, high=None, low=None) -> None:
        self.t.set_write_buffer_limits(high=high, low=low)

    def get_extra_info(self, name, default=None):
        return self.t.get_extra_info(name, default)


async def open_client(host: str, port: int, ws: bool = False) -> Client:
    loop = asyncio.get_running_loop()
    if not ws:
        _, client = await loop.create_connection(Client, host, port)
        return client
    _, adapter = await loop.create_connection(lambda: WsTransport(Client(), host), host, port)
    await asyncio.wait_for(adapter.ready, CONNECT_TIMEOUT_S)
    return adapter.inner


async def connect(host: str, port: int, client_id: str, clean: bool = True, ws: bool = False) -> Client:
    client = await open_client(host, port, ws)
    client.send(connect_packet(client_id, clean))
    rc = await asyncio.wait_for(client.connack, CONNECT_TIMEOUT_S)
    if rc != 0:
        raise ConnectionRefusedError(f"CONNACK {rc!r} for {client_id}")
    return client


async def subscriber(host: str, port: int, client_id: str, topic_filter: str, qos: int, clean: bool,
                     ws: bool = False) -> Client:
    client = await connect(host, port, client_id, clean, ws)
    client.send(subscribe_packet(1, topic_filter, qos))
    granted = await asyncio.wait_for(client.suback, 10)
    if not isinstance(granted, bytes) or granted[0] != qos:
        raise RuntimeError(f"SUBACK {granted!r} for {topic_filter} QoS {qos}")
    return client


async def close_all(clients) -> None:
    for c in clients:
        c.close()
    await asyncio.sleep(0.05)

"""MQTT 3.1.1/5.0 written by hand: the one raw client of the tests and the benchmarks.

`Raw` is a blocking socket client for tests that need what paho hides or
refuses (DUP and packet ids, alias-only PUBLISHes, not acking, invalid
filters, deep unacknowledged windows); the packet builders at the end
(`connect_packet`, `subscribe_packet`, `publish_qos0`, `Qos1Encoder`) are what
the benchmark's asyncio load client (bench/mqttload.py) writes. Nothing here
acks or answers unless its caller says so.
"""

from __future__ import annotations

import os
import socket
import struct
import time
from dataclasses import dataclass

# The test group's primary (tests/harness/group.py moves groups with PAIRMQ_TEST_LOOPBACK, so this follows it).
HOST, PORT = os.environ.get("PAIRMQ_TEST_LOOPBACK", "127.0.0.1"), 1883
WAIT_S = 5.0
V311, V5 = 4, 5

CONNACK, PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP, SUBACK, UNSUBACK, PINGRESP, DISCONNECT = (
    2, 3, 4, 5, 6, 7, 9, 11, 13, 14)

# v5 property id -> kind (only those a broker sends us, or we send it)
_PROP_KINDS = {
    0x01: "u8", 0x02: "u32", 0x03: "str", 0x08: "str", 0x09: "bin", 0x0B: "vbi", 0x11: "u32", 0x12: "str",
    0x13: "u16", 0x15: "str", 0x16: "bin", 0x17: "u8", 0x18: "u32", 0x19: "u8", 0x1A: "str", 0x1C: "str",
    0x1F: "str", 0x21: "u16", 0x22: "u16", 0x23: "u16", 0x24: "u8", 0x25: "u8", 0x26: "pair", 0x27: "u32",
    0x28: "u8", 0x29: "u8", 0x2A: "u8",
}


def vbi(n: int) -> bytes:
    out = bytearray()
    while True:
        n, byte = divmod(n, 128)
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def utf8(s: str) -> bytes:
    b = s.encode()
    return struct.pack("!H", len(b)) + b


def encode_props(items: list[tuple[int, object]]) -> bytes:
    body = b""
    for pid, value in items:
        kind = _PROP_KINDS[pid]
        body += vbi(pid) + {"u8": lambda v: bytes([v]), "u16": lambda v: struct.pack("!H", v),
                            "u32": lambda v: struct.pack("!I", v), "vbi": vbi, "str": utf8,
                            "bin": lambda v: struct.pack("!H", len(v)) + v,
                            "pair": lambda v: utf8(v[0]) + utf8(v[1])}[kind](value)
    return vbi(len(body)) + body


def decode_props(data: bytes, i: int) -> tuple[dict, int]:
    """(id -> value, or list of values for repeated ids), index after the block."""
    length, i = _read_vbi(data, i)
    end, out = i + length, {}
    while i < end:
        pid, i = _read_vbi(data, i)
        kind = _PROP_KINDS[pid]
        if kind == "u8":
            value, i = data[i], i + 1
        elif kind == "u16":
            value, i = struct.unpack_from("!H", data, i)[0], i + 2
        elif kind == "u32":
            value, i = struct.unpack_from("!I", data, i)[0], i + 4
        elif kind == "vbi":
            value, i = _read_vbi(data, i)
        elif kind in ("str", "bin"):
            n = struct.unpack_from("!H", data, i)[0]
            value, i = data[i + 2:i + 2 + n], i + 2 + n
            value = value.decode() if kind == "str" else value
        else:
            a, i = _read_str(data, i)
            b, i = _read_str(data, i)
            value = (a, b)
        if pid in out:
            out[pid] = [*(out[pid] if isinstance(out[pid], list) else [out[pid]]), value]
        else:
            out[pid] = value
    return out, end


def _read_str(data: bytes, i: int) -> tuple[str, int]:
    n = struct.unpack_from("!H", data, i)[0]
    return data[i + 2:i + 2 + n].decode(), i + 2 + n


def _read_vbi(data: bytes, i: int) -> tuple[int, int]:
    n = shift = 0
    while True:
        byte = data[i]
        i += 1
        n |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return n, i


@dataclass
class RawPacket:
    type: int
    flags: int
    body: bytes
    version: int

    @property
    def dup(self) -> bool:
        return bool(self.flags & 0x08)

    @property
    def qos(self) -> int:
        return (self.flags >> 1) & 3

    @property
    def retain(self) -> bool:
        return bool(self.flags & 1)

    def publish(self) -> tuple[str, int | None, dict, bytes]:
        """A PUBLISH's (topic, packet id, properties, payload)."""
        assert self.type == PUBLISH, self
        topic, i = _read_str(self.body, 0)
        packet_id = None
        if self.qos:
            packet_id, i = struct.unpack_from("!H", self.body, i)[0], i + 2
        p = {}
        if self.version == V5:
            p, i = decode_props(self.body, i)
        return topic, packet_id, p, self.body[i:]

    def codes(self) -> list[int]:
        """A SUBACK's or UNSUBACK's reason codes (return codes in 3.1.1)."""
        i = decode_props(self.body, 2)[1] if self.version == V5 else 2
        return list(self.body[i:])

    def reason_and_props(self) -> tuple[int, dict]:
        """CONNACK, DISCONNECT, PUBACK, PUBREC, ...: (reason code, properties); 3.1.1: (return code, {})."""
        if self.type in (PUBACK, PUBREC, PUBREL, PUBCOMP):
            code, i = (self.body[2] if len(self.body) > 2 else 0), 3
        elif self.type == CONNACK:
            code, i = self.body[1], 2
        else:
            code, i = (self.body[0] if self.body else 0), 1
        if self.version == V5 and i < len(self.body):
            return code, decode_props(self.body, i)[0]
        return code, {}


class Raw:
    """MQTT written by hand on a socket: nothing is acked or answered unless the test says so."""

    def __init__(self, version: int = V5, host: str = HOST, port: int = PORT) -> None:
        self.version = version
        self.sock = socket.create_connection((host, port), timeout=WAIT_S)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._buf = b""

    def send(self, first_byte: int, body: bytes) -> None:
        self.sock.sendall(bytes([first_byte]) + vbi(len(body)) + body)

    def connect(self, client_id: str, *, clean: bool = True, keepalive: int = 60,
                properties: list | None = None, will: tuple | None = None) -> RawPacket | None:
        """CONNECT; `will` is (topic, payload, qos, retain, will properties). The CONNACK, or None if the
        broker closed the connection without one."""
        flags = 0x02 if clean else 0
        if will is not None:
            flags |= 0x04 | (will[2] << 3) | (0x20 if will[3] else 0)
        body = utf8("MQTT") + bytes([self.version, flags]) + struct.pack("!H", keepalive)
        if self.version == V5:
            body += encode_props(properties or [])
        body += utf8(client_id)
        if will is not None:
            if self.version == V5:
                body += encode_props(will[4] if len(will) > 4 else [])
            body += utf8(will[0]) + struct.pack("!H", len(will[1])) + will[1]
        self.send(0x10, body)
        connack = self.recv()
        assert connack is None or connack.type == CONNACK, connack
        return connack

    def subscribe(self, packet_id: int, topic_filter: str, options: int, properties: list | None = None) -> RawPacket:
        return self.subscribe_many(packet_id, [(topic_filter, options)], properties)

    def subscribe_many(self, packet_id: int, filters: list[tuple[str, int]],
                       properties: list | None = None) -> RawPacket:
        """SUBSCRIBE with (filter, options byte) pairs; returns the SUBACK."""
        body = struct.pack("!H", packet_id)
        if self.version == V5:
            body += encode_props(properties or [])
        body += b"".join(utf8(f) + bytes([options]) for f, options in filters)
        self.send(0x82, body)
        return self.expect(SUBACK)

    def publish(self, topic: str, payload: bytes, qos: int = 0, packet_id: int = 0,
                properties: list | None = None) -> None:
        body = utf8(topic) + (struct.pack("!H", packet_id) if qos else b"")
        if self.version == V5:
            body += encode_props(properties or [])
        self.send(0x30 | (qos << 1), body + payload)

    def ack(self, kind: int, packet_id: int) -> None:
        self.send((kind << 4) | (2 if kind == PUBREL else 0), struct.pack("!H", packet_id))

    def disconnect(self) -> None:
        self.send(0xE0, b"\x00" if self.version == V5 else b"")

    def recv(self, timeout_s: float = WAIT_S) -> RawPacket | None:
        """The next packet, or None once the broker has closed the connection."""
        self.sock.settimeout(timeout_s)
        while True:
            packet = self._frame()
            if packet is not None:
                return packet
            try:
                chunk = self.sock.recv(65536)
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                return None
            self._buf += chunk

    def _frame(self) -> RawPacket | None:
        if len(self._buf) < 2:
            return None
        try:
            length, i = _read_vbi(self._buf, 1)
        except IndexError:
            return None
        if len(self._buf) < i + length:
            return None
        packet = RawPacket(self._buf[0] >> 4, self._buf[0] & 0x0F, self._buf[i:i + length], self.version)
        self._buf = self._buf[i + length:]
        return packet

    def expect(self, kind: int) -> RawPacket:
        packet = self.recv()
        assert packet is not None and packet.type == kind, f"expected type {kind}, got {packet}"
        return packet

    def barrier(self) -> list[RawPacket]:
        """PINGREQ, and every packet the broker had written before its PINGRESP."""
        self.send(0xC0, b"")
        before = []
        while (packet := self.recv()) is not None and packet.type != PINGRESP:
            before.append(packet)
        assert packet is not None, f"closed before PINGRESP (after {before})"
        return before

    def closed(self, timeout_s: float = WAIT_S) -> list[RawPacket]:
        """Read until the broker closes: what it sent before closing."""
        deadline = time.monotonic() + timeout_s
        got = []
        while (packet := self.recv(max(0.01, deadline - time.monotonic()))) is not None:
            got.append(packet)
        return got

    def close(self) -> None:
        self.sock.close()


# --- pre-encoded 3.1.1 packets for load generators -------------------------------------------


def connect_packet(client_id: str, clean: bool = True, keepalive_s: int = 300) -> bytes:
    body = utf8("MQTT") + bytes([V311, 0x02 if clean else 0]) + keepalive_s.to_bytes(2, "big") + utf8(client_id)
    return b"\x10" + vbi(len(body)) + body


def subscribe_packet(packet_id: int, topic_filter: str, qos: int) -> bytes:
    body = packet_id.to_bytes(2, "big") + utf8(topic_filter) + bytes([qos])
    return b"\x82" + vbi(len(body)) + body


def publish_qos0(topic: str, payload: bytes) -> bytes:
    body = utf8(topic) + payload
    return b"\x30" + vbi(len(body)) + body


class Qos1Encoder:
    """PUBLISH QoS 1 with a rolling packet id: header and topic encoded once."""

    def __init__(self, topic: str, payload: bytes) -> None:
        t = utf8(topic)
        self.head = b"\x32" + vbi(len(t) + 2 + len(payload)) + t
        self.payload = payload
        self.next_id = 0

    def packet(self) -> bytes:
        self.next_id = self.next_id % 65535 + 1
        return self.head + self.next_id.to_bytes(2, "big") + self.payload


DISCONNECT_PACKET = b"\xe0\x00"


# --- hostile input (tests/test_hostile_*.py) ---------------------------------------------------

def empty_user_properties(n: int) -> bytes:
    """A property block of n User Properties with empty name and value (5 bytes each)."""
    body = b"\x26\x00\x00\x00\x00" * n
    return vbi(len(body)) + body


def connect_with_properties(n: int, *, client_id: bytes = b"x") -> bytes:
    """The attack CONNECT: MQTT 5, no credentials, n empty User Properties."""
    body = (b"\x00\x04MQTT\x05\x02\x00\x3c" + empty_user_properties(n)
            + struct.pack("!H", len(client_id)) + client_id)
    return b"\x10" + vbi(len(body)) + body


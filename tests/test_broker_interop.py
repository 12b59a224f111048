"""The rig the `test_broker_interop_*` modules share (this module holds no tests).

Each of those modules runs one real group (the module-scoped `group` fixture;
the primary is active and serves MQTT on 127.0.0.1:1883) and drives it with
real clients: paho-mqtt (3.1.1 and 5.0) through `Paho`, mosquitto_pub/sub
through `mosquitto`, and `Raw`, MQTT written by hand on a socket for what paho
hides or refuses: DUP and packet ids, alias-only PUBLISHes, not acking,
invalid filters.

Waits are on events: a paho callback, a raw packet, a subprocess exit. "Nothing
arrived" is shown with a barrier instead of a sleep: a marker published after
the fact (it arrives behind anything routed before it), or, on a raw socket, a
PINGREQ whose PINGRESP comes behind anything the broker already wrote. Markers
go at QoS 2: paho hands a QoS 2 message to the application only at its PUBREL,
so a QoS 1 marker could overtake it. A raw barrier only covers what the broker
had written: what an ack of ours lets out waits for that ack's commit, so it is
waited for as a packet first. Only the time-based features (keep alive, will
delay, message expiry) wait on the clock.
"""

from __future__ import annotations

import queue
import re
import socket
import struct
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass, field

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

from appliance.roles import Role
from tests.group import Group


HOST, PORT = "127.0.0.1", 1883
WAIT_S = 5.0
V311, V5 = 4, 5
VERSIONS = pytest.mark.parametrize("version", [V311, V5], ids=["v311", "v5"])


@pytest.fixture(scope="module")
def group(tmp_path_factory):
    """One group for the whole module; the primary is active and serves MQTT on 127.0.0.1:1883."""
    with Group(tmp_path_factory.mktemp("interop") / "group") as g:
        g.start()
        g.wait_for("the primary to take activity", lambda: g.probe_once()[Role.PRIMARY] == 0, timeout_s=20)
        yield g


@pytest.fixture
def topic(request, group) -> str:
    """A topic (and client id prefix) no other test uses."""
    name = re.sub(r"[^A-Za-z0-9_-]", "_", request.node.name)[:40]
    return f"interop/{name}/{uuid.uuid4().hex[:8]}"


def cid(topic: str, who: str) -> str:
    return f"{topic.split('/', 2)[2]}-{who}"


# --- paho ---------------------------------------------------------------------------------


def props(packet_type: int, **values) -> Properties:
    p = Properties(packet_type)
    for name, value in values.items():
        setattr(p, name, value)
    return p


@dataclass
class Received:
    topic: str
    payload: bytes
    qos: int
    retain: bool
    properties: dict = field(default_factory=dict)


class Paho:
    """A paho client on its own loop thread; every reply is waited for, never slept for."""

    def __init__(self, client_id: str = "", *, version: int = V5, clean: bool = True, expiry_s: int | None = None,
                 keepalive: int = 60, will: dict | None = None, connect_props: dict | None = None) -> None:
        self.version = version
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id,
                                  protocol=mqtt.MQTTv5 if version == V5 else mqtt.MQTTv311,
                                  clean_session=None if version == V5 else clean, reconnect_on_failure=False)
        self.messages: queue.Queue[Received] = queue.Queue()
        self.disconnects: queue.Queue = queue.Queue()
        self._connack: queue.Queue = queue.Queue()
        self._acks: dict[int, tuple] = {}
        self._acked = threading.Condition()
        c = self.client
        c.on_connect = lambda _c, _u, flags, rc, p: self._connack.put((flags.session_present, rc.value, p))
        c.on_disconnect = lambda _c, _u, _f, rc, p: self.disconnects.put((rc.value, p))
        c.on_message = lambda _c, _u, m: self.messages.put(
            Received(m.topic, m.payload, m.qos, bool(m.retain), _props_dict(getattr(m, "properties", None))))
        c.on_publish = lambda _c, _u, mid, rc, p: self._ack(mid, (rc.value, p))
        c.on_subscribe = lambda _c, _u, mid, rcs, p: self._ack(mid, ([r.value for r in rcs], p))
        c.on_unsubscribe = lambda _c, _u, mid, rcs, p: self._ack(mid, ([r.value for r in rcs], p))
        if will is not None:
            c.will_set(**will)
        if version == V5:
            cp = dict(connect_props or {})
            if expiry_s is not None:
                cp["SessionExpiryInterval"] = expiry_s
            c.connect(HOST, PORT, keepalive, clean_start=clean,
                      properties=props(PacketTypes.CONNECT, **cp) if cp else None)
        else:
            c.connect(HOST, PORT, keepalive)
        c.loop_start()
        self.session_present, self.reason_code, self.connack_props = self._connack.get(timeout=WAIT_S)
        assert self.reason_code == 0, f"CONNACK 0x{self.reason_code:02X}"

    def _ack(self, mid: int, result: tuple) -> None:
        with self._acked:
            self._acks[mid] = result
            self._acked.notify_all()

    def _wait_ack(self, mid: int) -> tuple:
        with self._acked:
            assert self._acked.wait_for(lambda: mid in self._acks, WAIT_S), f"no ack for mid {mid}"
            return self._acks.pop(mid)

    def subscribe(self, *filters, qos: int = 1, options: SubscribeOptions | None = None,
                  sub_id: int | None = None) -> list[int]:
        """SUBSCRIBE and wait for the SUBACK: its codes."""
        p = props(PacketTypes.SUBSCRIBE, SubscriptionIdentifier=sub_id) if sub_id else None
        if options is not None:
            topics = [(f, options) for f in filters]
        else:
            topics = [(f, qos) for f in filters]
        rc, mid = self.client.subscribe(topics, properties=p)
        assert rc == mqtt.MQTT_ERR_SUCCESS
        return self._wait_ack(mid)[0]

    def unsubscribe(self, *filters) -> list[int]:
        rc, mid = self.client.unsubscribe(list(filters))
        assert rc == mqtt.MQTT_ERR_SUCCESS
        codes = self._wait_ack(mid)[0]
        return codes

    def publish(self, topic: str, payload: bytes | str = b"", qos: int = 0, retain: bool = False,
                **properties) -> tuple[int, object]:
        """PUBLISH; for QoS 1/2 wait for the broker's ack: (reason code, its properties)."""
        p = props(PacketTypes.PUBLISH, **properties) if properties else None
        info = self.client.publish(topic, payload, qos, retain, properties=p)
        assert info.rc == mqtt.MQTT_ERR_SUCCESS
        return self._wait_ack(info.mid)

    def get(self, timeout_s: float = WAIT_S) -> Received:
        try:
            return self.messages.get(timeout=timeout_s)
        except queue.Empty:
            raise AssertionError(f"no message within {timeout_s} s") from None

    def until(self, marker_topic: str) -> list[Received]:
        """Every message received before the first one on `marker_topic` (which must come)."""
        out = []
        while (m := self.get()).topic != marker_topic:
            out.append(m)
        return out

    def disconnect(self) -> None:
        """DISCONNECT, and wait until the broker has handled it: it closes the connection then.

        (paho closes its socket at once; a duplicate of it keeps the connection open to see the
        broker's FIN. Without that wait, a reconnect with the same client id may reach the broker
        first and take the session over instead of finding it ended.)
        """
        witness = self.client.socket().dup()
        try:
            self.client.disconnect()
            self.client.loop_stop()
            witness.settimeout(WAIT_S)
            try:
                while witness.recv(65536):
                    pass
            except ConnectionResetError:
                pass
        finally:
            witness.close()

    def stop(self) -> None:
        """The fixture's teardown: disconnect whatever a test left connected (which also wakes the loop)."""
        if self.client.is_connected():
            self.client.disconnect()
        self.client.loop_stop()


def _props_dict(p) -> dict:
    if p is None:
        return {}
    attributes = vars(p)  # paho keeps each property it received as an attribute named like "ContentType"
    return {key: attributes[key] for key in (name.replace(" ", "") for name in p.names) if key in attributes}


@pytest.fixture
def clients():
    """Make paho clients; whatever a test leaves connected is cut at teardown."""
    made: list[Paho] = []

    def make(*args, **kwargs) -> Paho:
        client = Paho(*args, **kwargs)
        made.append(client)
        return client

    yield make
    for client in made:
        client.stop()


# --- a raw-socket client --------------------------------------------------------------------

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

    def __init__(self, version: int = V5) -> None:
        self.version = version
        self.sock = socket.create_connection((HOST, PORT), timeout=WAIT_S)
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


@pytest.fixture
def raws():
    made: list[Raw] = []

    def make(version: int = V5) -> Raw:
        made.append(Raw(version))
        return made[-1]

    yield make
    for r in made:
        r.close()


# --- mosquitto ----------------------------------------------------------------------------


def mosquitto(tool: str, version: int, *args: str, timeout_s: float = 10) -> subprocess.CompletedProcess:
    argv = [tool, "-h", HOST, "-p", str(PORT), "-V", "mqttv5" if version == V5 else "mqttv311", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)


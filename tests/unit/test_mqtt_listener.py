"""The MQTT listener over real sockets on 127.0.0.1, with real clients.

The listener runs on an event loop in a background thread; the tests drive
paho-mqtt 2.x, mosquitto_pub and raw sockets from the test thread and wait on
events with timeouts (no blind sleeps). The gate is a plain object whose
answers the test flips.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import socket
import subprocess
import threading
import time
from dataclasses import dataclass

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.reasoncodes import ReasonCode as PahoReasonCode

from pairmq.appliance.mqtt.codec import (
    Connack, Connect, Disconnect, PingReq, PingResp, decode_packet,
    parse_fixed_header,
)
from pairmq.appliance.mqtt.connection import MqttConnection
from pairmq.appliance.mqtt.listener import NOT_SUPPORTED_YET, MqttListener
from pairmq.appliance.mqtt.properties import PropertyId
from pairmq.appliance.mqtt.traffic import ListenerTraffic
from pairmq.appliance.mqtt.wire import MQTT_3_1_1, MQTT_5, ReasonCode, encode_vbi

HOST = "127.0.0.1"
ACTIVE = "127.0.0.2:1883"
TIMEOUT_S = 2.0
MAX_PACKET = 4096
CONNECT_TIMEOUT_S = 0.5
P = PropertyId
R = ReasonCode


class FlipGate:
    def __init__(self) -> None:
        self.serving = True
        self.reference: str | None = None
        self.broken = False

    def may_serve(self) -> bool:
        if self.broken:
            raise RuntimeError("lease table unreadable")
        return self.serving

    def active_server_reference(self) -> str | None:
        return self.reference


class Events:
    """on_event sink; `expect` consumes the first matching event, waiting for it."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._pending: list[tuple[str, dict]] = []
        self.seen: list[tuple[str, dict]] = []

    def __call__(self, kind: str, fields: dict) -> None:
        with self._cv:
            self._pending.append((kind, fields))
            self.seen.append((kind, fields))
            self._cv.notify_all()

    def expect(self, kind: str, timeout: float = TIMEOUT_S, **match) -> dict:
        def find() -> int | None:
            for i, (k, f) in enumerate(self._pending):
                if k == kind and all(v(f.get(key)) if callable(v) else f.get(key) == v
                                     for key, v in match.items()):
                    return i
            return None

        with self._cv:
            found = self._cv.wait_for(lambda: find() is not None, timeout)
            assert found, f"no {kind} {match} within {timeout} s; saw {self.seen}"
            return self._pending.pop(find())[1]


class LoopThread:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coro, timeout: float = TIMEOUT_S):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def call(self, fn, *args):
        async def call():
            return fn(*args)
        return self.run(call())

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(TIMEOUT_S)
        self.loop.close()


@dataclass
class Broker:
    listener: MqttListener
    gate: FlipGate
    events: Events
    loop: LoopThread

    @property
    def port(self) -> int:
        return self.listener.port

    def client_count(self) -> int:
        return self.loop.call(lambda: self.listener.client_count)


@pytest.fixture
def broker(caplog):
    caplog.set_level(logging.WARNING, logger="pairmq.appliance.mqtt")
    gate, events, loop = FlipGate(), Events(), LoopThread()
    listener = MqttListener(HOST, 0, gate, on_event=events, max_packet_size=MAX_PACKET,
                            connect_timeout_s=CONNECT_TIMEOUT_S)
    loop.run(listener.start())
    try:
        yield Broker(listener, gate, events, loop)
        loop.run(listener.stop())
        assert loop.call(lambda: listener.client_count) == 0
    finally:
        loop.close()
    bugs = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not bugs, [r.getMessage() for r in bugs]


# --- clients ----------------------------------------------------------------------

def pump(client: mqtt.Client, done: threading.Event) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not done.is_set():
        assert time.monotonic() < deadline, "paho callback did not fire in time"
        client.loop(timeout=0.02)


def paho_connect(port: int, protocol: int, client_id: str = "") -> tuple[mqtt.Client, dict]:
    got: dict = {}
    connected, disconnected = threading.Event(), threading.Event()

    def on_connect(client, userdata, flags, reason_code, properties):
        got.update(flags=flags, reason_code=reason_code, properties=properties)
        connected.set()

    def on_disconnect(client, userdata, flags, reason_code, properties):
        got.update(disconnect_reason=reason_code, disconnect_properties=properties)
        disconnected.set()

    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=protocol)
    client.on_connect, client.on_disconnect = on_connect, on_disconnect
    client.connect(HOST, port, keepalive=60)
    pump(client, connected)
    got["disconnected"] = disconnected
    return client, got


def assert_server_alive(broker: Broker) -> None:
    for protocol, version in ((mqtt.MQTTv5, MQTT_5), (mqtt.MQTTv311, MQTT_3_1_1)):
        client, got = paho_connect(broker.port, protocol, client_id=f"alive-{version}")
        assert got["reason_code"] == 0
        broker.events.expect("client_accepted", client_id=f"alive-{version}")
        client.disconnect()
        broker.events.expect("client_closed", client_id=f"alive-{version}")


class Raw:
    """A bare TCP client that speaks bytes and reads whole packets."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection((HOST, port), timeout=TIMEOUT_S)
        self.buf = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def read_packet(self, version: int):
        """The next packet, or None at a clean end of stream."""
        while True:
            header = parse_fixed_header(self.buf)
            if header is not None and len(self.buf) >= header.packet_size:
                body = self.buf[header.header_length:header.packet_size]
                self.buf = self.buf[header.packet_size:]
                return decode_packet(header, body, version)
            try:
                chunk = self.sock.recv(65536)
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                assert not self.buf, f"stream ended inside a packet: {self.buf!r}"
                return None
            self.buf += chunk

    def read_bytes_to_eof(self) -> bytes:
        out = self.buf
        while True:
            try:
                chunk = self.sock.recv(65536)
            except ConnectionResetError:
                return out
            if not chunk:
                return out
            out += chunk

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def raws():
    opened: list[Raw] = []

    def open_raw(port: int) -> Raw:
        opened.append(Raw(port))
        return opened[-1]

    yield open_raw
    for raw in opened:
        raw.close()


def connected_raw(broker: Broker, raws, version: int, client_id: str, **kw) -> Raw:
    raw = raws(broker.port)
    raw.send(Connect(version, client_id, **kw).encode())
    connack = raw.read_packet(version)
    assert isinstance(connack, Connack) and connack.reason_code == R.SUCCESS, connack
    broker.events.expect("client_accepted", client_id=client_id)
    return raw


# --- gate open: CONNACK success ---------------------------------------------------

@pytest.mark.parametrize("protocol, version", [(mqtt.MQTTv311, MQTT_3_1_1), (mqtt.MQTTv5, MQTT_5)])
@pytest.mark.parametrize("client_id", ["", "sensor-1"])
def test_paho_gets_connack_success_while_the_gate_allows(broker, protocol, version, client_id):
    client, got = paho_connect(broker.port, protocol, client_id)
    assert got["reason_code"] == 0 and not got["flags"].session_present
    accepted = broker.events.expect("client_accepted", protocol_version=version)
    assert accepted["peer"].startswith("127.0.0.1:") and isinstance(accepted["now_ms"], int)
    assert accepted["client_id"].startswith("pairmq-") if not client_id else accepted["client_id"] == client_id
    if version == MQTT_5:
        props = got["properties"]
        assert props.MaximumPacketSize == MAX_PACKET
        if client_id:
            assert not hasattr(props, "AssignedClientIdentifier")
        else:
            assert props.AssignedClientIdentifier == accepted["client_id"]
    assert broker.client_count() == 1
    client.disconnect()
    broker.events.expect("client_closed", client_id=accepted["client_id"], was_accepted=True,
                         reason="client sent DISCONNECT 0x00")
    assert broker.client_count() == 0


@pytest.mark.parametrize("version", [MQTT_3_1_1, MQTT_5])
def test_pingreq_gets_pingresp(broker, raws, version):
    raw = connected_raw(broker, raws, version, "pinger")
    for _ in range(3):
        raw.send(PingReq().encode(version))
        assert raw.read_packet(version) == PingResp()


# --- gate closed: refusals ---------------------------------------------------------

def test_v5_refusal_is_use_another_server_naming_the_active(broker):
    broker.gate.serving, broker.gate.reference = False, ACTIVE
    client, got = paho_connect(broker.port, mqtt.MQTTv5)
    assert got["reason_code"] == R.USE_ANOTHER_SERVER
    assert got["properties"].ServerReference == ACTIVE
    broker.events.expect("client_refused", reason_code=R.USE_ANOTHER_SERVER,
                         server_reference=ACTIVE, protocol_version=MQTT_5)
    broker.events.expect("client_closed", was_accepted=False)


def test_v5_refusal_without_a_known_active_is_server_unavailable(broker):
    broker.gate.serving = False
    client, got = paho_connect(broker.port, mqtt.MQTTv5)
    assert got["reason_code"] == R.SERVER_UNAVAILABLE
    assert not hasattr(got["properties"], "ServerReference")
    broker.events.expect("client_refused", reason_code=R.SERVER_UNAVAILABLE)


def test_v311_refusal_is_return_code_3(broker, raws):
    broker.gate.serving, broker.gate.reference = False, ACTIVE
    client, got = paho_connect(broker.port, mqtt.MQTTv311)
    assert got["reason_code"] == PahoReasonCode(PacketTypes.CONNACK, "Server unavailable")
    broker.events.expect("client_refused", protocol_version=MQTT_3_1_1, return_code=3)
    raw = raws(broker.port)
    raw.send(Connect(MQTT_3_1_1, "raw").encode())
    assert raw.read_bytes_to_eof() == b"\x20\x02\x00\x03"


def test_refusal_respects_the_clients_maximum_packet_size(broker, raws):
    broker.gate.serving, broker.gate.reference = False, ACTIVE
    raw = raws(broker.port)
    raw.send(Connect(MQTT_5, "tiny", properties={P.MAXIMUM_PACKET_SIZE: 32}).encode())
    assert raw.read_packet(MQTT_5) == Connack(R.USE_ANOTHER_SERVER,
                                              properties={P.SERVER_REFERENCE: ACTIVE})
    assert raw.read_packet(MQTT_5) is None


@pytest.mark.skipif(shutil.which("mosquitto_pub") is None, reason="mosquitto_pub not installed")
@pytest.mark.parametrize("flag, version", [("mqttv5", MQTT_5), ("mqttv311", MQTT_3_1_1)])
@pytest.mark.parametrize("serving", [True, False], ids=["serving", "refusing"])
def test_mosquitto_pub(broker, flag, version, serving):
    broker.gate.serving, broker.gate.reference = serving, ACTIVE
    proc = subprocess.run(
        ["mosquitto_pub", "-h", HOST, "-p", str(broker.port), "-V", flag, "-d",
         "-i", f"mosq-{flag}", "-t", "t", "-m", "x"],
        capture_output=True, text=True, timeout=5)
    out = proc.stdout + proc.stderr
    if serving:
        assert proc.returncode == 0, out
        assert "received CONNACK (0)" in out
        broker.events.expect("client_accepted", client_id=f"mosq-{flag}", protocol_version=version)
    else:
        assert proc.returncode != 0, out
        assert ("Use another server" if version == MQTT_5 else "unavailable") in out
        broker.events.expect("client_refused", client_id=f"mosq-{flag}", protocol_version=version)
    broker.events.expect("client_closed", client_id=f"mosq-{flag}")


# --- the gate is asked again for every packet ------------------------------------------

@pytest.mark.parametrize("version", [MQTT_3_1_1, MQTT_5])
def test_flipping_the_gate_drops_the_client_on_its_next_packet(broker, raws, version):
    raw = connected_raw(broker, raws, version, "flip")
    raw.send(PingReq().encode(version))
    assert raw.read_packet(version) == PingResp()
    assert broker.client_count() == 1
    broker.gate.serving = False  # e.g. resumed after SIGSTOP with the lease gone
    raw.send(PingReq().encode(version))
    if version == MQTT_5:
        assert raw.read_packet(version) == Disconnect(R.SERVER_SHUTTING_DOWN)
    assert raw.read_packet(version) is None
    broker.events.expect("client_closed", client_id="flip", reason="this node may no longer serve")
    assert broker.client_count() == 0


def test_a_failing_gate_counts_as_may_not_serve(broker, raws, caplog):
    broker.gate.broken = True
    raw = raws(broker.port)
    raw.send(Connect(MQTT_5, "g").encode())
    connack = raw.read_packet(MQTT_5)
    assert connack.reason_code == R.SERVER_UNAVAILABLE
    assert "gate.may_serve() failed" in caplog.text
    caplog.clear()


def test_drop_clients_tells_v5_clients_the_reason_and_the_active(broker, raws):
    five, got5 = paho_connect(broker.port, mqtt.MQTTv5, "five")
    four, got4 = paho_connect(broker.port, mqtt.MQTTv311, "four")
    raw = connected_raw(broker, raws, MQTT_5, "raw5")
    raw4 = connected_raw(broker, raws, MQTT_3_1_1, "raw4")
    assert broker.client_count() == 4
    dropped = broker.loop.call(broker.listener.drop_clients, R.USE_ANOTHER_SERVER, ACTIVE)
    assert dropped == 4
    assert raw.read_packet(MQTT_5) == Disconnect(R.USE_ANOTHER_SERVER, {P.SERVER_REFERENCE: ACTIVE})
    assert raw.read_packet(MQTT_5) is None
    assert raw4.read_bytes_to_eof() == b""  # 3.1.1 has no server DISCONNECT: just closed
    pump(five, got5["disconnected"])
    assert got5["disconnect_reason"] == R.USE_ANOTHER_SERVER
    assert got5["disconnect_properties"].ServerReference == ACTIVE
    pump(four, got4["disconnected"])
    for cid in ("five", "four", "raw5", "raw4"):
        broker.events.expect("client_closed", client_id=cid, reason="dropped by this node (0x9C)")
    assert broker.client_count() == 0


def test_drop_clients_defaults_to_server_shutting_down(broker, raws):
    raw = connected_raw(broker, raws, MQTT_5, "d")
    assert broker.loop.call(broker.listener.drop_clients) == 1
    assert raw.read_bytes_to_eof() == b"\xe0\x02\x8b\x00"
    with pytest.raises(ValueError):
        broker.loop.call(broker.listener.drop_clients, 0x00)


def test_stop_drops_clients_and_stops_accepting(broker, raws):
    raw = connected_raw(broker, raws, MQTT_5, "s")
    port = broker.port
    broker.loop.run(broker.listener.stop())
    assert raw.read_packet(MQTT_5) == Disconnect(R.SERVER_SHUTTING_DOWN)
    assert raw.read_packet(MQTT_5) is None
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((HOST, port), timeout=TIMEOUT_S)


# --- what this node does not do yet, and other CONNACK refusals ---------------------------

@pytest.mark.parametrize("version, subscribe", [
    (MQTT_3_1_1, b"\x82\x06\x00\x01\x00\x01t\x00"),
    (MQTT_5, b"\x82\x07\x00\x01\x00\x00\x01t\x00")])
def test_other_packets_are_not_supported_yet(broker, raws, version, subscribe):
    raw = connected_raw(broker, raws, version, "sub")
    raw.send(subscribe)
    if version == MQTT_5:
        assert raw.read_packet(version) == Disconnect(
            R.IMPLEMENTATION_SPECIFIC_ERROR, {P.REASON_STRING: NOT_SUPPORTED_YET})
    assert raw.read_packet(version) is None
    broker.events.expect("client_closed", client_id="sub",
                         reason=f"SUBSCRIBE is {NOT_SUPPORTED_YET}")


@pytest.mark.parametrize("connect, reply", [
    (Connect(MQTT_3_1_1, "", clean_start=False), b"\x20\x02\x00\x02"),
    (Connect(MQTT_5, "a", properties={P.AUTHENTICATION_METHOD: "SCRAM-SHA-1"}), None),
], ids=["v311 empty id without clean session", "v5 enhanced auth"])
def test_connects_this_node_cannot_honour(broker, raws, connect, reply):
    raw = raws(broker.port)
    raw.send(connect.encode())
    if reply is not None:
        assert raw.read_bytes_to_eof() == reply
    else:
        assert raw.read_packet(MQTT_5).reason_code == R.BAD_AUTHENTICATION_METHOD
        assert raw.read_packet(MQTT_5) is None
    broker.events.expect("client_refused")
    assert_server_alive(broker)


# --- bad input: answered or closed, and the server lives on -------------------------------

@pytest.mark.parametrize("garbage", [
    b"GET / HTTP/1.1\r\nHost: broker\r\n\r\n",
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(32),  # a TLS ClientHello
    bytes(64),
    b"\xff" * 64,
    PingReq().encode(MQTT_5),  # well-formed, but not CONNECT
], ids=["http", "tls", "zeros", "ones", "pingreq-first"])
def test_garbage_is_closed_without_an_answer(broker, raws, garbage):
    raw = raws(broker.port)
    raw.send(garbage)
    assert raw.read_bytes_to_eof() == b""
    broker.events.expect("bad_packet", protocol_version=None)
    broker.events.expect("client_closed", reason=lambda r: r.startswith("bad packet"))
    assert_server_alive(broker)


def test_oversized_length_is_refused_before_the_body(broker, raws):
    raw = raws(broker.port)
    raw.send(b"\x10\xff\xff\xff\x7f")  # 256 MiB announced, nothing sent
    assert raw.read_bytes_to_eof() == b""
    broker.events.expect("bad_packet", reason_code=R.PACKET_TOO_LARGE)
    raw5 = connected_raw(broker, raws, MQTT_5, "big")
    raw5.send(b"\x30" + encode_vbi(MAX_PACKET))
    reply = raw5.read_packet(MQTT_5)
    assert isinstance(reply, Disconnect) and reply.reason_code == R.PACKET_TOO_LARGE
    assert raw5.read_packet(MQTT_5) is None
    assert_server_alive(broker)


def test_truncated_connect_then_end_of_stream(broker, raws):
    raw = raws(broker.port)
    raw.send(Connect(MQTT_5, "cut").encode()[:9])
    raw.sock.shutdown(socket.SHUT_WR)
    assert raw.read_bytes_to_eof() == b""
    broker.events.expect("client_closed", reason="peer closed the connection", was_accepted=False)
    assert_server_alive(broker)


@pytest.mark.parametrize("prefix", [b"", Connect(MQTT_5, "slow").encode()[:9]],
                         ids=["silent", "truncated"])
def test_no_connect_within_the_timeout_is_closed(broker, raws, prefix):
    raw = raws(broker.port)
    started = time.monotonic()
    raw.send(prefix)
    assert raw.read_bytes_to_eof() == b""
    assert time.monotonic() - started >= CONNECT_TIMEOUT_S * 0.9
    broker.events.expect("client_closed", reason=f"no CONNECT within {CONNECT_TIMEOUT_S} s")
    assert_server_alive(broker)


def connect_with_flags(level: int, flags: int) -> bytes:
    body = b"\x00\x04MQTT" + bytes([level, flags]) + b"\x00\x3c" \
        + (b"\x00" if level == MQTT_5 else b"") + b"\x00\x01c"
    return b"\x10" + encode_vbi(len(body)) + body


@pytest.mark.parametrize("data, reply", [
    (connect_with_flags(MQTT_5, 0x03), R.MALFORMED_PACKET),
    (Connect(MQTT_5, "w", will=None, properties={}).encode()[:-3] + b"\x00\x01\x00",  # id has U+0000
     R.MALFORMED_PACKET),
    (connect_with_flags(MQTT_3_1_1, 0x03), None),
    (b"\x10\x0c\x00\x06MQIsdp\x03\x02\x00\x3c", b"\x20\x02\x00\x01"),
], ids=["v5 reserved flag", "v5 NUL in client id", "v311 reserved flag", "v3.1"])
def test_bad_connect_gets_connack_with_the_reason_or_a_close(broker, raws, data, reply):
    raw = raws(broker.port)
    raw.send(data)
    if isinstance(reply, bytes):
        assert raw.read_bytes_to_eof() == reply
    elif reply is None:
        assert raw.read_bytes_to_eof() == b""
    else:
        connack = raw.read_packet(MQTT_5)
        assert isinstance(connack, Connack) and connack.reason_code == reply
        assert P.REASON_STRING in connack.properties
        assert raw.read_packet(MQTT_5) is None
    broker.events.expect("bad_packet")
    assert_server_alive(broker)


@pytest.mark.parametrize("version, data, reason", [
    (MQTT_5, b"\xc1\x00", R.MALFORMED_PACKET),            # PINGREQ with flags
    (MQTT_5, Connect(MQTT_5, "x").encode(), R.PROTOCOL_ERROR),  # second CONNECT
    (MQTT_5, b"\xe0\x01\x05", R.MALFORMED_PACKET),       # no such reason code
    (MQTT_3_1_1, b"\xc1\x00", None),
    (MQTT_3_1_1, b"\xf0\x00", None),                     # AUTH is reserved in 3.1.1
])
def test_bad_packet_after_connect(broker, raws, version, data, reason):
    raw = connected_raw(broker, raws, version, "bad")
    raw.send(data)
    if reason is not None:
        reply = raw.read_packet(version)
        assert isinstance(reply, Disconnect) and reply.reason_code == reason
        assert P.REASON_STRING in reply.properties
    assert raw.read_packet(version) is None
    broker.events.expect("bad_packet", client_id="bad", protocol_version=version)
    broker.events.expect("client_closed", client_id="bad")
    assert_server_alive(broker)


def test_keep_alive_is_enforced_at_one_and_a_half_times(broker, raws):
    raw = connected_raw(broker, raws, MQTT_5, "sleepy", keep_alive_s=1)
    raw.sock.settimeout(30)  # a loaded machine may close it late; only closing early is wrong
    started = time.monotonic()
    assert raw.read_packet(MQTT_5) == Disconnect(R.KEEP_ALIVE_TIMEOUT)
    assert time.monotonic() - started >= 1.4
    assert raw.read_packet(MQTT_5) is None
    broker.events.expect("client_closed", client_id="sleepy",
                         reason=lambda r: r.startswith("no packet within 1.5 x keep alive"))


@pytest.mark.compiled
def test_the_connection_and_its_traffic_are_native_classes():
    """mypyc makes a class native (attributes in fixed slots, methods called directly by compiled code) unless it
    derives from a Python class (asyncio.Protocol) or is told not to: a regression would pass every other test,
    only slower. mypyc gives each native class, and only those, `__mypyc_attrs__`."""
    for cls in (MqttConnection, ListenerTraffic):
        assert hasattr(cls, "__mypyc_attrs__"), f"{cls.__name__} is not a native class"

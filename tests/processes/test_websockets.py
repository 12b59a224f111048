"""MQTT over WebSockets against live groups: paho-mqtt (transport="websockets") publishing and subscribing on
8083 in 3.1.1 and 5.0, and the host-list client riding a failover over WebSockets and over TLS WebSockets
(8084), with the same assertions as over TCP (tests/harness/ride.py)."""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
import time

import paho.mqtt.client as mqtt
import pytest
from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, BytesMessage, CloseConnection, Request

from pairmq.appliance.config import TlsConfig
from pairmq.appliance.roles import Role
from tests.harness.certs import make_pki
from tests.harness.group import LOOPBACK, active_group
from tests.harness.http_api import hand_over
from tests.harness.ride import ride_a_failover

P = Role.PRIMARY


def ws_client(client_id: str, version: int, context: ssl.SSLContext | None = None) -> mqtt.Client:
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=version,
                         transport="websockets")
    client.ws_set_options(path="/mqtt")
    if context is not None:
        client.tls_set_context(context)
    return client


@pytest.mark.processes
@pytest.mark.parametrize("version", [mqtt.MQTTv311, mqtt.MQTTv5])
def test_paho_publishes_and_subscribes_over_websockets(tmp_path, version):
    with active_group(tmp_path / "group") as group:
        port = group.config.ports.mqtt_ws
        got: list[tuple[str, bytes, int]] = []
        done = threading.Event()

        def on_message(client, userdata, message):
            got.append((message.topic, message.payload, message.qos))
            if len(got) == 3:
                done.set()

        sub, pub = ws_client("ws-sub", version), ws_client("ws-pub", version)
        subscribed = threading.Event()
        sub.on_message = on_message
        sub.on_subscribe = lambda *a: subscribed.set()
        sub.connect(group.address(P), port)
        sub.subscribe("ws/#", qos=1)
        sub.loop_start()
        pub.connect(group.address(P), port)
        pub.loop_start()
        try:
            assert subscribed.wait(10)
            infos = [pub.publish("ws/a", b"zero", qos=0), pub.publish("ws/b", b"one" * 20_000, qos=1),
                     pub.publish("ws/c", b"two", qos=2)]
            for info in infos:
                info.wait_for_publish(10)
                assert info.rc == mqtt.MQTT_ERR_SUCCESS
            assert done.wait(10), got
            assert sorted(got) == [("ws/a", b"zero", 0), ("ws/b", b"one" * 20_000, 1), ("ws/c", b"two", 1)]
            clients = group.api(P, "/api/v1/clients")["clients"]
            assert {c["client_id"] for c in clients} >= {"ws-sub", "ws-pub"}
        finally:
            for client in (pub, sub):
                client.loop_stop()
                client.disconnect()


@pytest.mark.processes
@pytest.mark.timeout(180)
@pytest.mark.parametrize("fault", ["kill -9", "release-activity"])
def test_the_host_list_client_over_websockets_rides_a_failover(tmp_path, fault):
    with active_group(tmp_path / "group") as group:
        ride_a_failover(group, fault, port=group.config.ports.mqtt_ws, transport="websockets")


@pytest.mark.processes
@pytest.mark.timeout(180)
def test_the_host_list_client_over_tls_websockets_rides_a_failover(tmp_path):
    pki = make_pki(tmp_path / "pki", addresses=tuple(LOOPBACK.values()))
    context = ssl.create_default_context(cafile=str(pki.ca_file))
    with active_group(tmp_path / "group", tls=TlsConfig(pki.cert_file, pki.key_file)) as group:
        ride_a_failover(group, "kill -9", port=group.config.ports.mqtt_wss, transport="websockets", tls=context)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        n, digit = n >> 7, n & 0x7F
        out.append(digit | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _packet(first: int, body: bytes) -> bytes:
    return bytes([first]) + _varint(len(body)) + body


def _utf8(text: str) -> bytes:
    return len(text).to_bytes(2, "big") + text.encode()


def _mqtt_packets(data: bytes) -> list[tuple[int, bytes]]:
    """(first byte, body) of each whole packet in `data`."""
    packets, at = [], 0
    while at < len(data):
        length, shift, i = 0, 0, at + 1
        while i < len(data):
            length |= (data[i] & 0x7F) << shift
            shift += 7
            i += 1
            if not data[i - 1] & 0x80:
                break
        if i + length > len(data):
            break
        packets.append((data[at], data[i:i + length]))
        at = i + length
    return packets


@pytest.mark.processes
@pytest.mark.timeout(120)
def test_a_handover_disconnect_reaches_a_websocket_client_that_keeps_sending_and_reads_late(tmp_path):
    """The hold before a handover stops reading while the client keeps sending; the DISCONNECT 0x9C and its
    server reference wait behind output the client has not read yet. Closing the socket over unread input
    resets the connection and drops that unsent output: the DISCONNECT must arrive all the same."""
    with active_group(tmp_path / "group") as group:
        port = group.config.ports.mqtt_ws
        sock = socket.create_connection((group.address(P), port), timeout=10)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)  # fills fast: the broker's output waits
        ws = WSConnection(ConnectionType.CLIENT)
        sock.sendall(ws.send(Request(host=group.address(P), target="/mqtt", subprotocols=["mqtt"])))
        mqtt_in = bytearray()
        ended: list[str] = []

        def read_some() -> bool:
            try:
                data = sock.recv(65536)
            except (ConnectionResetError, TimeoutError, socket.timeout) as exc:
                ended.append(repr(exc))
                return False
            ws.receive_data(data or None)
            for event in ws.events():
                if isinstance(event, BytesMessage):
                    mqtt_in.extend(event.data)
                elif isinstance(event, CloseConnection):
                    ended.append(f"close frame {event.code}")
                    return False
                else:
                    assert isinstance(event, AcceptConnection), event
            if not data:
                ended.append("EOF")
            return bool(data)

        def send(packet: bytes) -> None:
            sock.sendall(ws.send(BytesMessage(data=packet)))

        while ws.state.name != "OPEN":
            assert read_some(), "no WebSocket handshake"
        send(_packet(0x10, _utf8("MQTT") + bytes([5, 0x02, 0, 60, 0]) + _utf8("ws-flood")))
        send(_packet(0x82, b"\x00\x01\x00" + _utf8("flood/t") + b"\x00"))  # our own QoS 0 messages come back
        while not any(first == 0x90 for first, _ in _mqtt_packets(bytes(mqtt_in))):
            assert read_some(), f"no SUBACK: {bytes(mqtt_in)[:40]!r}"
        publish = ws.send(BytesMessage(data=_packet(0x30, _utf8("flood/t") + b"\x00" + b"x" * 60_000)))
        for _ in range(10):  # echoed back to us, unread: the broker's output waits (under the linger's bound)
            sock.sendall(publish)
        time.sleep(0.5)
        assert hand_over(group.config, P)["result"] == "handed over"
        # Input the held connection never reads, then the close over it; sent without blocking on the hold.
        sock.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            sock.send(ws.send(BytesMessage(data=_packet(0x30, _utf8("flood/t") + b"\x00" + b"y" * 1000))))
        time.sleep(0.5)
        sock.settimeout(5)
        while read_some():
            pass
        sock.close()
        disconnects = [body for first, body in _mqtt_packets(bytes(mqtt_in)) if first == 0xE0]
        reference = f"{group.address(Role.BACKUP)}:{port}".encode()
        kinds = [first >> 4 for first, _ in _mqtt_packets(bytes(mqtt_in))]
        assert disconnects, f"no DISCONNECT among {len(mqtt_in)} bytes read (packet types {kinds[-5:]}), then {ended}"
        assert disconnects[0][0] == 0x9C and reference in disconnects[0], disconnects[0]

"""Hostile clients against the MQTT-over-WebSockets door (8083) of a real group (appliance/mqtt/websockets.py).

One group for the module, with small pre-auth budgets (40 connections in total, so the per-address cap of 10
applies from 20). The attacker connects from the monitor's address, the legitimate client from the backup's.
Outcomes are HTTP statuses, close codes, MQTT packets, events and what a subscriber receives; deadlines are
"give up waiting" bounds, never asserted durations.
"""

from __future__ import annotations

import time

import paho.mqtt.client as mqtt
import pytest

from pairmq.appliance.config import Limits
from pairmq.appliance.roles import Role
from tests.harness.group import active_group
from tests.harness.mqttraw import connect_packet, publish_qos0
from tests.harness.wsraw import BINARY, CLOSE, PING, PONG, TEXT, WsRaw, close_code, frame, handshake

PREAUTH_TOTAL, PREAUTH_PER_ADDRESS = 40, 10
CONNACK_OK = b"\x20\x02\x00\x00"


@pytest.fixture(scope="module")
def group(tmp_path_factory):
    limits = Limits(mqtt_preauth_max_connections=PREAUTH_TOTAL, mqtt_preauth_max_per_address=PREAUTH_PER_ADDRESS)
    with active_group(tmp_path_factory.mktemp("hostile-ws") / "group", limits=limits) as g:
        yield g


def ws(group, source: Role = Role.BACKUP) -> WsRaw:
    return WsRaw(group.address(Role.PRIMARY), group.config.ports.mqtt_ws, source=group.address(source))


def opened(group, source: Role = Role.BACKUP) -> WsRaw:
    client = ws(group, source)
    head = client.upgrade()
    assert head.startswith(b"HTTP/1.1 101") and b"sec-websocket-protocol: mqtt" in head.lower(), head
    return client


def refusals(group, needle: str) -> list[dict]:
    return [e for e in group.events(Role.PRIMARY)
            if e["event"] in ("connection_refused", "bad_packet") and needle in str(e.get("reason"))]


@pytest.mark.processes
def test_garbage_instead_of_an_upgrade_is_refused_with_400_and_an_event(group):
    client = ws(group, Role.MONITOR)
    client.send(connect_packet("mqtt-on-the-wrong-port"))  # plain MQTT where HTTP is expected
    assert client.response_head().startswith(b"HTTP/1.1 400")
    assert client.closed()
    group.wait_for("a connection_refused event", lambda: refusals(group, "not a WebSocket handshake"))
    assert refusals(group, "not a WebSocket handshake")[-1]["peer"].startswith(group.address(Role.MONITOR))


@pytest.mark.processes
@pytest.mark.parametrize("path,protocols,status", [("/elsewhere", "mqtt", b"404"), ("/mqtt", None, b"400"),
                                                   ("/mqtt", "chat, superchat", b"400")])
def test_another_path_or_no_mqtt_subprotocol_is_refused(group, path, protocols, status):
    client = ws(group)
    assert client.upgrade(path, protocols).startswith(b"HTTP/1.1 " + status)
    assert client.closed()


@pytest.mark.processes
def test_the_root_path_and_a_list_of_subprotocols_are_accepted(group):
    client = ws(group)
    head = client.upgrade("/", "mqttv3.1, mqtt")
    assert head.startswith(b"HTTP/1.1 101"), head
    client.send(frame(connect_packet("root-path")))
    assert client.frames(until_closed=False)[0] == (BINARY, CONNACK_OK)
    client.close()


@pytest.mark.processes
def test_an_oversized_handshake_is_refused_with_431(group):
    client = ws(group, Role.MONITOR)
    cookie = "Cookie: " + "a" * 9000 + "\r\n"
    client.send(handshake(extra=cookie))
    assert client.response_head().startswith(b"HTTP/1.1 431")
    assert client.closed()


@pytest.mark.processes
@pytest.mark.timeout(60)
def test_a_slow_handshake_is_closed_without_an_upgrade(group):
    client = ws(group, Role.MONITOR)
    data, sent = handshake(), 0
    while sent < len(data) - 1:  # never the last byte: it would complete the handshake
        try:
            client.send(data[sent:sent + 1])
        except (BrokenPipeError, ConnectionResetError):
            break
        sent += 1
        if client.closed(timeout_s=0.25):
            break
    assert sent < len(data) - 1, "the whole handshake trickled in and the connection was still open"
    assert b"101" not in client.buffer


@pytest.mark.processes
def test_a_text_frame_is_closed_with_1003(group):
    client = opened(group)
    client.send(frame(connect_packet("text-frame")))
    client.send(frame(b"hello", opcode=TEXT))
    frames = client.frames()
    assert frames[0] == (BINARY, CONNACK_OK)
    assert frames[-1][0] == CLOSE and close_code(frames[-1][1]) == 1003
    group.wait_for("a bad_packet event", lambda: refusals(group, "binary frames only"))


@pytest.mark.processes
def test_an_unmasked_frame_is_closed_with_1002(group):
    client = opened(group)
    client.send(frame(connect_packet("unmasked"), masked=False))
    frames = client.frames()
    assert frames and frames[-1][0] == CLOSE and close_code(frames[-1][1]) == 1002


@pytest.mark.processes
def test_a_huge_frame_is_a_stream_and_a_message_over_the_cap_is_closed_with_1009(group):
    client = opened(group)
    client.send(frame(connect_packet("huge-frame"), declared=1 << 62))
    # The frame declares 2^62 bytes: its CONNECT is answered long before the frame ends.
    assert client.frames(until_closed=False)[0] == (BINARY, CONNACK_OK)
    chunk = publish_qos0("huge/frame", b"x" * 60_000) * 16  # ~1 MiB of valid packets, inside the same frame
    try:
        for _ in range(4):
            client.send(chunk)
    except (BrokenPipeError, ConnectionResetError):
        pass
    frames = client.frames()
    assert frames and frames[-1][0] == CLOSE and close_code(frames[-1][1]) == 1009, frames[-1:]


@pytest.mark.processes
def test_packets_split_over_frames_and_several_in_one_frame(group):
    client = opened(group)
    connect = connect_packet("split-frames")
    for i in range(len(connect)):  # one byte per message
        client.send(frame(connect[i:i + 1]))
    assert client.frames(until_closed=False)[0] == (BINARY, CONNACK_OK)
    subscribe = b"\x82\x0a\x00\x01\x00\x05split\x00"
    ping = b"\xc0\x00"
    client.send(frame(subscribe[:3], fin=False) + frame(subscribe[3:] + ping, opcode=0, fin=True))
    suback, pingresp = b"\x90\x03\x00\x01\x00", b"\xd0\x00"
    got = b""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and len(got) < len(suback + pingresp):
        got += b"".join(p for _, p in client.frames(until_closed=False, timeout_s=1))
    assert got in (suback + pingresp, pingresp + suback)  # the SUBACK waits for its commit, the PINGRESP not
    client.send(frame(b"", opcode=PING))
    assert client.frames(until_closed=False) == [(PONG, b"")]
    client.close()


@pytest.mark.processes
def test_frames_after_close_are_not_read(group):
    received: list[bytes] = []
    sub = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="after-close-watcher")
    sub.on_message = lambda c, u, m: received.append(m.payload)
    sub.connect(group.address(Role.PRIMARY), group.config.ports.mqtt)
    sub.subscribe("after/close", 1)
    sub.loop_start()
    try:
        time.sleep(0.5)  # the SUBACK
        client = opened(group)
        client.send(frame(connect_packet("closer")))
        assert client.frames(until_closed=False)[0] == (BINARY, CONNACK_OK)
        client.send(frame(publish_qos0("after/close", b"before")))
        client.send(frame(b"\x03\xe8", opcode=CLOSE) + frame(publish_qos0("after/close", b"after")))
        frames = client.frames()
        assert frames[-1] == (CLOSE, b"\x03\xe8")  # our close, answered
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not received:
            time.sleep(0.05)
        time.sleep(0.5)  # "after", had it been read
        assert received == [b"before"]
    finally:
        sub.loop_stop()
        sub.disconnect()


@pytest.mark.processes
@pytest.mark.timeout(90)
def test_many_connections_from_one_address_are_capped_and_another_address_still_connects(group):
    flood = []
    for _ in range(PREAUTH_TOTAL):  # none ever completes its handshake
        try:
            flood.append(ws(group, Role.MONITOR))
        except OSError:
            break
    for client in flood:
        client.send(b"GET /mqtt HTTP/1.1\r\n")
    closed = sum(client.closed(timeout_s=0.2) for client in flood)
    try:
        assert closed >= PREAUTH_TOTAL - PREAUTH_TOTAL // 2 - PREAUTH_PER_ADDRESS, closed
        group.wait_for("connection_refused events for the flood", lambda: any(
            e["event"] == "connection_refused" and e["peer"].startswith(group.address(Role.MONITOR) + ":")
            and "address" in e["reason"] for e in group.events(Role.PRIMARY)))
        legit = opened(group, Role.BACKUP)
        legit.send(frame(connect_packet("legit-during-flood")))
        assert legit.frames(until_closed=False)[0] == (BINARY, CONNACK_OK)
        legit.close()
    finally:
        for client in flood:
            client.close()


@pytest.mark.processes
def test_a_v5_client_over_websockets_is_refused_by_the_standby_with_a_reference_to_the_same_door(group):
    backup = WsRaw(group.address(Role.BACKUP), group.config.ports.mqtt_ws)
    assert backup.upgrade().startswith(b"HTTP/1.1 101")
    body = b"\x00\x04MQTT\x05\x02\x00\x3c\x00\x00\x07standby"
    backup.send(frame(bytes([0x10, len(body)]) + body))
    (kind, connack), *_ = backup.frames()
    assert kind == BINARY and connack[0] == 0x20 and connack[3] == 0x9C  # use another server
    assert f"{group.address(Role.PRIMARY)}:{group.config.ports.mqtt_ws}".encode() in connack

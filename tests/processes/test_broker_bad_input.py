"""Bad input against a real group: the malformed packets and protocol errors the MQTT 3.1.1 and 5.0
specifications list for packets after CONNECT, each answered as the spec says.

v5: DISCONNECT with the spec's reason code (and a reason string), then the server closes.
3.1.1: the server closes without answering (3.1.1 §4.8: "close the Network Connection").
After each: the will of the offending client is published (MQTT 5 §3.1.2-8: a server-side close
for a protocol error publishes the will) and the broker still serves a fresh client.

CONNECT-time errors and garbage before CONNECT are in tests/unit/test_mqtt_listener.py; the decoder's
own unit tests and hypothesis fuzzing are in tests/unit/test_mqtt_codec*.py. Shared rig:
tests/processes/test_broker_interop.py.
"""

from __future__ import annotations

import struct

import pytest

from tests.harness.mqttraw import DISCONNECT, PUBCOMP, PUBLISH, PUBREC, SUBACK, encode_props, utf8, vbi
from tests.processes.test_broker_interop import V5, V311, cid, group, raws, topic  # noqa: F401  (fixtures)

MALFORMED, PROTOCOL_ERROR, TOPIC_NAME_INVALID = 0x81, 0x82, 0x90
TOPIC_ALIAS_INVALID, PACKET_TOO_LARGE, PAYLOAD_FORMAT_INVALID = 0x94, 0x95, 0x99
PACKET_IDENTIFIER_NOT_FOUND, RECEIVE_MAXIMUM_EXCEEDED = 0x92, 0x93

NO_PROPS = encode_props([])


def packet(first_byte: int, body: bytes) -> bytes:
    return bytes([first_byte]) + vbi(len(body)) + body


def sub_body(packet_id: int, filters: list[tuple[str, int]], props: bytes = NO_PROPS) -> bytes:
    return struct.pack("!H", packet_id) + props + b"".join(utf8(f) + bytes([o]) for f, o in filters)


# (name, bytes sent after a successful v5 CONNECT, the DISCONNECT reason code the spec asks for)
V5_CASES = [
    ("PUBLISH with QoS 3", packet(0x36, utf8("t") + b"\x00\x01" + NO_PROPS + b"x"), MALFORMED),
    ("PUBLISH QoS 0 with DUP", packet(0x38, utf8("t") + NO_PROPS + b"x"), PROTOCOL_ERROR),
    ("PUBLISH to a wildcard topic", packet(0x30, utf8("t/+") + NO_PROPS + b"x"), TOPIC_NAME_INVALID),
    ("PUBLISH with an empty topic and no alias", packet(0x30, utf8("") + NO_PROPS + b"x"), PROTOCOL_ERROR),
    ("PUBLISH with topic alias 0", packet(0x30, utf8("t") + encode_props([(0x23, 0)]) + b"x"),
     TOPIC_ALIAS_INVALID),
    ("PUBLISH with a topic alias above the maximum",
     packet(0x30, utf8("t") + encode_props([(0x23, 65)]) + b"x"), TOPIC_ALIAS_INVALID),
    ("PUBLISH with an alias never set", packet(0x30, utf8("") + encode_props([(0x23, 7)]) + b"x"),
     PROTOCOL_ERROR),
    ("PUBLISH QoS 1 with packet id 0", packet(0x32, utf8("t") + b"\x00\x00" + NO_PROPS + b"x"), MALFORMED),
    ("PUBLISH with a subscription identifier", packet(0x30, utf8("t") + encode_props([(0x0B, 1)]) + b"x"),
     PROTOCOL_ERROR),
    ("PUBLISH topic not UTF-8", packet(0x30, b"\x00\x02\xc3\x28" + NO_PROPS + b"x"), MALFORMED),
    ("PUBLISH topic with U+0000", packet(0x30, b"\x00\x03a\x00b" + NO_PROPS + b"x"), MALFORMED),
    ("PUBLISH with a property twice", packet(0x30, utf8("t") + encode_props([(0x01, 1), (0x01, 1)]) + b"x"),
     PROTOCOL_ERROR),
    ("PUBLISH with an unknown property", packet(0x30, utf8("t") + b"\x02\x7f\x00" + b"x"), MALFORMED),
    ("PUBLISH declared UTF-8 but not", packet(0x30, utf8("t") + encode_props([(0x01, 1)]) + b"\xff\xfe"),
     PAYLOAD_FORMAT_INVALID),
    ("SUBSCRIBE without a filter", packet(0x82, struct.pack("!H", 1) + NO_PROPS), PROTOCOL_ERROR),
    ("SUBSCRIBE with wrong header flags", packet(0x80, sub_body(1, [("t", 1)])), MALFORMED),
    ("SUBSCRIBE with reserved option bits", packet(0x82, sub_body(1, [("t", 0xC1)])), MALFORMED),
    ("SUBSCRIBE with retain handling 3", packet(0x82, sub_body(1, [("t", 0x31)])), PROTOCOL_ERROR),
    ("SUBSCRIBE with maximum QoS 3", packet(0x82, sub_body(1, [("t", 0x03)])), PROTOCOL_ERROR),
    ("SUBSCRIBE with packet id 0", packet(0x82, sub_body(0, [("t", 1)])), MALFORMED),
    ("SUBSCRIBE with subscription identifier 0",
     packet(0x82, sub_body(1, [("t", 1)], encode_props([(0x0B, 0)]))), PROTOCOL_ERROR),
    ("SUBSCRIBE no-local on a shared subscription", packet(0x82, sub_body(1, [("$share/g/t", 0x05)])),
     PROTOCOL_ERROR),
    ("UNSUBSCRIBE without a filter", packet(0xA2, struct.pack("!H", 1) + NO_PROPS), PROTOCOL_ERROR),
    ("UNSUBSCRIBE with wrong header flags", packet(0xA0, struct.pack("!H", 1) + NO_PROPS + utf8("t")), MALFORMED),
    ("PUBREL with wrong header flags", packet(0x60, b"\x00\x01"), MALFORMED),
    ("PUBACK with header flags", packet(0x41, b"\x00\x01"), MALFORMED),
    ("reserved packet type 0", packet(0x00, b""), MALFORMED),
    ("AUTH without an authentication method", packet(0xF0, b"\x00" + NO_PROPS), PROTOCOL_ERROR),
    ("PINGREQ with a body", packet(0xC0, b"\x00"), MALFORMED),
    ("DISCONNECT with header flags", packet(0xE1, b""), MALFORMED),
    ("remaining length longer than 4 bytes", bytes([0x30, 0x80, 0x80, 0x80, 0x80, 0x01]), MALFORMED),
    ("remaining length not minimally encoded", bytes([0x30, 0x80, 0x00]), MALFORMED),
    ("CONNACK sent by a client", packet(0x20, b"\x00\x00" + NO_PROPS), PROTOCOL_ERROR),
    ("SUBACK sent by a client", packet(0x90, b"\x00\x01" + NO_PROPS + b"\x00"), PROTOCOL_ERROR),
    ("a second CONNECT", packet(0x10, utf8("MQTT") + bytes([5, 2, 0, 60]) + NO_PROPS + utf8("x")),
     PROTOCOL_ERROR),
    ("a packet larger than the advertised maximum", bytes([0x30]) + vbi(2 * 1024 * 1024), PACKET_TOO_LARGE),
]

# The same mistakes in 3.1.1 framing (no property blocks): the server closes without a word.
V311_CASES = [
    ("PUBLISH with QoS 3", packet(0x36, utf8("t") + b"\x00\x01x")),
    ("PUBLISH to a wildcard topic", packet(0x30, utf8("t/#") + b"x")),
    ("PUBLISH with an empty topic", packet(0x30, utf8("") + b"x")),
    ("PUBLISH QoS 1 with packet id 0", packet(0x32, utf8("t") + b"\x00\x00x")),
    ("PUBLISH topic not UTF-8", packet(0x30, b"\x00\x02\xc3\x28x")),
    ("SUBSCRIBE without a filter", packet(0x82, b"\x00\x01")),
    ("SUBSCRIBE with wrong header flags", packet(0x80, b"\x00\x01" + utf8("t") + b"\x01")),
    ("SUBSCRIBE with reserved option bits", packet(0x82, b"\x00\x01" + utf8("t") + b"\x05")),
    ("UNSUBSCRIBE without a filter", packet(0xA2, b"\x00\x01")),
    ("PUBREL with wrong header flags", packet(0x60, b"\x00\x01")),
    ("reserved packet type 15 (AUTH is v5 only)", packet(0xF0, b"")),
    ("remaining length longer than 4 bytes", bytes([0x30, 0xFF, 0xFF, 0xFF, 0xFF, 0x01])),
    ("CONNACK sent by a client", packet(0x20, b"\x00\x00")),
    ("a second CONNECT", packet(0x10, utf8("MQTT") + bytes([4, 2, 0, 60]) + utf8("x"))),
]


def connect_with_will(raws, version: int, client_id: str, will_topic: str):
    raw = raws(version)
    connack = raw.connect(client_id, will=(will_topic, b"gone", 1, False, []))
    assert connack is not None and connack.reason_and_props()[0] == 0, connack
    return raw


def watch(raws, version: int, client_id: str, topic_filter: str):
    watcher = raws(version)
    assert watcher.connect(client_id).reason_and_props()[0] == 0
    assert watcher.subscribe(1, topic_filter, 1).codes() == [1]
    return watcher


def expect_will(watcher, will_topic: str) -> None:
    got = watcher.recv()
    assert got is not None and got.type == PUBLISH, f"expected the offender's will, got {got}"
    assert got.publish()[0] == will_topic and got.publish()[3] == b"gone"


@pytest.mark.parametrize("name, data, reason", V5_CASES, ids=[c[0] for c in V5_CASES])
def test_v5_bad_packet_gets_disconnect_with_the_spec_reason_and_the_will_is_published(
        raws, topic, name, data, reason):
    will_topic = f"{topic}/will"
    watcher = watch(raws, V5, cid(topic, "watch"), will_topic)
    raw = connect_with_will(raws, V5, cid(topic, "bad"), will_topic)
    raw.sock.sendall(data)
    got = raw.closed()
    assert [p.type for p in got] == [DISCONNECT], f"{name}: expected one DISCONNECT then a close, got {got}"
    code, props = got[0].reason_and_props()
    assert code == reason, f"{name}: DISCONNECT 0x{code:02X}, the spec says 0x{reason:02X}"
    assert props.get(0x1F), f"{name}: the DISCONNECT should say why (reason string)"
    expect_will(watcher, will_topic)
    assert raws(V5).connect(cid(topic, "after")).reason_and_props()[0] == 0, "the broker must still serve"


@pytest.mark.parametrize("name, data", V311_CASES, ids=[c[0] for c in V311_CASES])
def test_v311_bad_packet_closes_without_an_answer_and_the_will_is_published(raws, topic, name, data):
    will_topic = f"{topic}/will"
    watcher = watch(raws, V311, cid(topic, "watch"), will_topic)
    raw = connect_with_will(raws, V311, cid(topic, "bad"), will_topic)
    raw.sock.sendall(data)
    assert raw.closed() == [], f"{name}: 3.1.1 has no DISCONNECT from the server; close only"
    expect_will(watcher, will_topic)
    assert raws(V311).connect(cid(topic, "after")).reason_and_props()[0] == 0, "the broker must still serve"


def test_v5_pubrel_for_an_unknown_packet_id_gets_pubcomp_0x92_and_the_session_goes_on(raws, topic):
    raw = raws(V5)
    assert raw.connect(cid(topic, "c")).reason_and_props()[0] == 0
    raw.ack(6, 4242)  # PUBREL for a QoS 2 flow that never started
    pubcomp = raw.recv()
    assert pubcomp.type == PUBCOMP and pubcomp.reason_and_props()[0] == PACKET_IDENTIFIER_NOT_FOUND
    raw.barrier()  # still connected


@pytest.mark.parametrize("version", [V311, V5], ids=["v311", "v5"])
def test_acks_for_unknown_packet_ids_are_ignored(raws, topic, version):
    raw = raws(version)
    assert raw.connect(cid(topic, "c")).reason_and_props()[0] == 0
    for kind in (4, 5, 7):  # PUBACK, PUBREC, PUBCOMP for nothing in flight
        raw.ack(kind, 999)
    before = raw.barrier()
    assert all(p.type != DISCONNECT for p in before), before


@pytest.mark.parametrize("version", [V311, V5], ids=["v311", "v5"])
def test_a_truncated_packet_then_end_of_stream_publishes_the_will(raws, topic, version):
    will_topic = f"{topic}/will"
    watcher = watch(raws, version, cid(topic, "watch"), will_topic)
    raw = connect_with_will(raws, version, cid(topic, "bad"), will_topic)
    raw.sock.sendall(packet(0x32, utf8(f"{topic}/x") + b"\x00\x01" + (NO_PROPS if version == V5 else b"")
                            + b"payload")[:-3])
    raw.sock.shutdown(1)  # FIN mid-packet
    assert raw.closed() == []
    expect_will(watcher, will_topic)


@pytest.mark.parametrize("version", [V311, V5], ids=["v311", "v5"])
def test_a_subscribe_with_one_bad_filter_fails_only_that_filter(raws, topic, version):
    """An invalid filter is not a malformed packet: SUBACK 0x8F (v5) / 0x80 (3.1.1) for it, the rest granted."""
    raw = raws(version)
    assert raw.connect(cid(topic, "c")).reason_and_props()[0] == 0
    suback = raw.subscribe_many(1, [(f"{topic}/ok", 1), (f"{topic}/a#", 1), (f"{topic}/+x", 0)])
    assert suback.type == SUBACK
    assert suback.codes() == ([1, 0x8F, 0x8F] if version == V5 else [1, 0x80, 0x80])
    raw.barrier()


def test_garbage_mid_session_never_stops_other_clients(raws, topic):
    """Many clients sending garbage at once: each is closed, the broker keeps serving."""
    bad = []
    for i in range(20):
        raw = raws(V5)
        assert raw.connect(cid(topic, f"bad{i}")).reason_and_props()[0] == 0
        bad.append(raw)
    for i, raw in enumerate(bad):
        raw.sock.sendall(bytes([(i * 37) & 0xFF, 0xFF, 0xFF, 0xFF, 0xFF]) + b"\x00" * 64)
    for raw in bad:
        got = raw.closed()
        assert all(p.type == DISCONNECT for p in got), got
    good = raws(V5)
    assert good.connect(cid(topic, "good")).reason_and_props()[0] == 0
    good.barrier()


def test_v5_more_unfinished_qos2_than_the_receive_maximum_is_0x93(raws, topic):
    raw = raws(V5)
    connack = raw.connect(cid(topic, "deep"))
    assert connack.reason_and_props()[1][0x21] == 100  # the Receive Maximum we advertise
    for pid in range(1, 102):  # no PUBREL for any of them
        raw.publish(f"{topic}/t", b"x", qos=2, packet_id=pid)
    got = raw.closed()
    # PUBRECs wait for their commit; those not yet written when the 101st arrives are never sent.
    assert [p.type for p in got] == [PUBREC] * (len(got) - 1) + [DISCONNECT] and len(got) <= 101
    assert got[-1].reason_and_props()[0] == RECEIVE_MAXIMUM_EXCEEDED

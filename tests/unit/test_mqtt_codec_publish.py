"""PUBLISH: exact bytes, every refusal, the per-subscriber template, fuzz."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProperties

from pairmq.appliance.mqtt.codec import Connect, PacketReader, encode_packet, parse_fixed_header
from pairmq.appliance.mqtt.publish import KEEP, Publish, PublishTemplate, decode_publish
from pairmq.appliance.mqtt.wire import (
    MQTT_3_1_1, MQTT_5, MalformedPacket, MqttError, ProtocolError, ReasonCode,
    encode_utf8, encode_vbi,
)
from tests.harness.mqtt_strategies import (
    P, PahoBytes, publishes, raises, read_all, roundtrip, split,
)

R = ReasonCode
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# --- exact bytes ------------------------------------------------------------------

@pytest.mark.parametrize("version", [MQTT_3_1_1, MQTT_5])
def test_qos0_publish_bytes_by_hand(version):
    props = b"\x00" if version == MQTT_5 else b""
    body = b"\x00\x03a/b" + props + b"hi"
    assert Publish("a/b", b"hi").encode(version) == bytes([0x30, len(body)]) + body
    assert Publish("a/b", b"hi", retain=True).encode(version)[0] == 0x31


@pytest.mark.parametrize("version", [MQTT_3_1_1, MQTT_5])
def test_qos1_and_qos2_carry_the_packet_id_after_the_topic(version):
    props = b"\x00" if version == MQTT_5 else b""
    q1 = Publish("t", b"", 1, packet_id=0x1234).encode(version)
    assert q1 == bytes([0x32, 5 + len(props)]) + b"\x00\x01t\x12\x34" + props
    q2 = Publish("t", b"x", 2, retain=True, dup=True, packet_id=1).encode(version)
    assert q2[0] == 0x3D and q2[5:7] == b"\x00\x01"


def test_v5_properties_sit_between_packet_id_and_payload():
    pub = Publish("a", b"\x01", 1, packet_id=2, properties={
        P.TOPIC_ALIAS: 3, P.PAYLOAD_FORMAT_INDICATOR: 0, P.USER_PROPERTY: (("k", "v"),)})
    props = b"\x01\x00" + b"\x23\x00\x03" + b"\x26\x00\x01k\x00\x01v"
    assert pub.encode(MQTT_5) == b"\x32" + encode_vbi(5 + 1 + len(props) + 1) \
        + b"\x00\x01a\x00\x02" + bytes([len(props)]) + props + b"\x01"


def test_remaining_length_grows_to_two_bytes():
    data = Publish("t", b"x" * 200).encode(MQTT_3_1_1)
    assert data[1:3] == encode_vbi(203) == b"\xcb\x01"
    assert roundtrip(Publish("t", b"x" * 200), MQTT_3_1_1) == Publish("t", b"x" * 200)


def _paho_props(**kw):
    props = PahoProperties(PacketTypes.PUBLISH)
    for name, value in kw.items():
        setattr(props, name, value)
    return props


PAHO_CASES = [
    (MQTT_3_1_1, Publish("a/b", b"xyz"), dict(mid=0)),
    (MQTT_3_1_1, Publish("a/b", b"xyz", 1, True, False, 7), dict(mid=7, qos=1, retain=True)),
    (MQTT_3_1_1, Publish("ü/√", b"", 2, False, True, 65535), dict(mid=65535, qos=2, dup=True)),
    (MQTT_5, Publish("a/b", b"xyz", 0), dict(mid=0)),
    (MQTT_5, Publish("a/b", b"xyz", 1, False, False, 7, {
        P.MESSAGE_EXPIRY_INTERVAL: 30, P.CONTENT_TYPE: "bin", P.USER_PROPERTY: (("k", "v"),)}),
     dict(mid=7, qos=1, props=_paho_props(MessageExpiryInterval=30, ContentType="bin",
                                          UserProperty=[("k", "v")]))),
    (MQTT_5, Publish("r", b"{}", 2, True, False, 9, {
        P.PAYLOAD_FORMAT_INDICATOR: 1, P.RESPONSE_TOPIC: "reply/1",
        P.CORRELATION_DATA: b"\x00\x01", P.TOPIC_ALIAS: 4}),
     dict(mid=9, qos=2, retain=True, props=_paho_props(
         PayloadFormatIndicator=1, ResponseTopic="reply/1", CorrelationData=b"\x00\x01",
         TopicAlias=4))),
]


@pytest.mark.parametrize("version, packet, args", PAHO_CASES)
def test_publish_bytes_match_paho(version, packet, args):
    paho = PahoBytes(version)
    paho._send_publish(args["mid"], packet.topic.encode(), packet.payload, args.get("qos", 0),
                       args.get("retain", False), args.get("dup", False), None, args.get("props"))
    assert packet.encode(version) == paho.last()
    assert roundtrip(packet, version, from_client=True) == packet


# --- refusals -----------------------------------------------------------------------

def pub_body(topic=b"t", pid=b"", props=None, payload=b"p", version=MQTT_5):
    block = (b"\x00" if props is None else encode_vbi(len(props)) + props) \
        if version == MQTT_5 else b""
    return len(topic).to_bytes(2, "big") + topic + pid + block + payload


SID = bytes([P.SUBSCRIPTION_IDENTIFIER, 5])
PUBLISH_ERRORS = [
    ("QoS 3", 0b0110, pub_body(pid=b"\x00\x01"), MalformedPacket, R.MALFORMED_PACKET),
    ("DUP on QoS 0", 0b1000, pub_body(), ProtocolError, R.PROTOCOL_ERROR),
    ("empty body", 0, b"", MalformedPacket, R.MALFORMED_PACKET),
    ("topic length cut", 0, b"\x00", MalformedPacket, R.MALFORMED_PACKET),
    ("topic past the end", 0, b"\x00\x09abc", MalformedPacket, R.MALFORMED_PACKET),
    ("topic not UTF-8", 0, pub_body(topic=b"a\xff"), MalformedPacket, R.MALFORMED_PACKET),
    ("topic surrogate", 0, pub_body(topic=b"\xed\xa0\x80"), MalformedPacket, R.MALFORMED_PACKET),
    ("topic NUL", 0, pub_body(topic=b"a\x00"), MalformedPacket, R.MALFORMED_PACKET),
    ("topic +", 0, pub_body(topic=b"a/+"), ProtocolError, R.TOPIC_NAME_INVALID),
    ("topic #", 0, pub_body(topic=b"#"), ProtocolError, R.TOPIC_NAME_INVALID),
    ("empty topic no alias", 0, pub_body(topic=b""), ProtocolError, R.PROTOCOL_ERROR),
    ("packet id missing", 0b0010, b"\x00\x01t\x00", MalformedPacket, R.MALFORMED_PACKET),
    ("packet id 0", 0b0010, pub_body(pid=b"\x00\x00"), MalformedPacket, R.MALFORMED_PACKET),
    ("property length missing", 0, b"\x00\x01t", MalformedPacket, R.MALFORMED_PACKET),
    ("property block past the end", 0, b"\x00\x01t\x05\x01", MalformedPacket, R.MALFORMED_PACKET),
    ("topic alias 0", 0, pub_body(props=b"\x23\x00\x00"), ProtocolError, R.TOPIC_ALIAS_INVALID),
    ("topic alias twice", 0, pub_body(props=b"\x23\x00\x01\x23\x00\x02"),
     ProtocolError, R.PROTOCOL_ERROR),
    ("CONNECT-only property", 0, pub_body(props=b"\x11\x00\x00\x00\x01"),
     MalformedPacket, R.MALFORMED_PACKET),
    ("unknown property", 0, pub_body(props=b"\x7f\x00"), MalformedPacket, R.MALFORMED_PACKET),
    ("payload format 2", 0, pub_body(props=b"\x01\x02"), ProtocolError, R.PROTOCOL_ERROR),
    ("subscription id from a client", 0, pub_body(props=SID), ProtocolError, R.PROTOCOL_ERROR),
    ("subscription id 0", 0, pub_body(props=b"\x0b\x00"), ProtocolError, R.PROTOCOL_ERROR),
    ("response topic wildcard", 0, pub_body(props=b"\x08" + encode_utf8("r/#")),
     ProtocolError, R.PROTOCOL_ERROR),
    ("payload not UTF-8", 0, pub_body(props=b"\x01\x01", payload=b"\xc3\x28"),
     ProtocolError, R.PAYLOAD_FORMAT_INVALID),
    ("payload surrogate", 0, pub_body(props=b"\x01\x01", payload=b"\xed\xb0\x80"),
     ProtocolError, R.PAYLOAD_FORMAT_INVALID),
]


@pytest.mark.parametrize("name, flags, body, exc, reason", PUBLISH_ERRORS,
                         ids=[e[0] for e in PUBLISH_ERRORS])
def test_publish_refusals_carry_their_reason_code(name, flags, body, exc, reason):
    raises(exc, reason, decode_publish, flags, body, MQTT_5, from_client=True)
    # Through the reader too (QoS 3 is refused from the first byte already).
    stream = Connect(MQTT_5, "c").encode() + bytes([0x30 | flags]) + encode_vbi(len(body)) + body
    err = raises(exc, reason, read_all, stream)
    assert err.protocol_version == MQTT_5


@pytest.mark.parametrize("flags, body, exc, reason", [
    (0, pub_body(topic=b"", version=MQTT_3_1_1), ProtocolError, R.PROTOCOL_ERROR),
    (0, pub_body(topic=b"+", version=MQTT_3_1_1), ProtocolError, R.TOPIC_NAME_INVALID),
    (0b1000, pub_body(version=MQTT_3_1_1), ProtocolError, R.PROTOCOL_ERROR),
    (0b0100, b"\x00\x01t\x00", MalformedPacket, R.MALFORMED_PACKET),
    (0b0010, pub_body(pid=b"\x00\x00", version=MQTT_3_1_1), MalformedPacket, R.MALFORMED_PACKET),
])
def test_v311_publish_refusals(flags, body, exc, reason):
    raises(exc, reason, decode_publish, flags, body, MQTT_3_1_1, from_client=True)


def test_v311_has_no_properties_the_byte_is_payload():
    got = decode_publish(0, b"\x00\x01t\x01\x01", MQTT_3_1_1, from_client=True)
    assert got == Publish("t", b"\x01\x01")


def test_what_only_a_server_may_send_decodes_from_a_server():
    body = pub_body(props=SID + SID[:1] + b"\x07" + b"\x01\x01", payload=b"\xff")
    got = decode_publish(0, body, MQTT_5, from_client=False)
    assert got.properties == {P.SUBSCRIPTION_IDENTIFIER: (5, 7), P.PAYLOAD_FORMAT_INDICATOR: 1}
    assert got.payload == b"\xff"


@pytest.mark.parametrize("payload", [b"", b"\x00nul is fine in a payload", "✓ 𝄞".encode()])
def test_utf8_payloads_that_are_well_formed_pass(payload):
    body = pub_body(props=b"\x01\x01", payload=payload)
    assert decode_publish(0, body, MQTT_5, from_client=True).payload == payload


def test_empty_topic_with_an_alias_is_allowed_in_v5():
    got = decode_publish(0b0011, pub_body(topic=b"", pid=b"\x00\x09", props=b"\x23\x00\x02"),
                         MQTT_5, from_client=True)
    assert got == Publish("", b"p", 1, True, False, 9, {P.TOPIC_ALIAS: 2})
    assert got.encode(MQTT_5) == b"\x33" + encode_vbi(9) + b"\x00\x00\x00\x09\x03\x23\x00\x02p"


@pytest.mark.parametrize("packet, version", [
    (Publish("t", b"", 0, packet_id=1), MQTT_5),
    (Publish("t", b"", 1), MQTT_5),
    (Publish("t", b"", 1, packet_id=0), MQTT_5),
    (Publish("t", b"", 1, packet_id=65536), MQTT_5),
    (Publish("t", b"", 3, packet_id=1), MQTT_5),
    (Publish("t", b"", 0, dup=True), MQTT_5),
    (Publish("a/#", b""), MQTT_5),
    (Publish("a\x00", b""), MQTT_5),
    (Publish("", b""), MQTT_5),
    (Publish("", b"", properties={P.TOPIC_ALIAS: 1}), MQTT_3_1_1),
    (Publish("t", b"", properties={P.CONTENT_TYPE: "x"}), MQTT_3_1_1),
    (Publish("t", b"", properties={P.SESSION_EXPIRY_INTERVAL: 1}), MQTT_5),
    (Publish("t", b""), 3),
])
def test_publish_encoder_refuses_our_own_mistakes(packet, version):
    with pytest.raises(ValueError):
        packet.encode(version)


def test_encode_packet_never_drops_a_publishs_user_properties():
    pub = Publish("t", b"x", properties={P.USER_PROPERTY: (("k", "v" * 50),)})
    full = pub.encode(MQTT_5)
    assert encode_packet(pub, MQTT_5, max_packet_size=len(full)) == full
    assert encode_packet(pub, MQTT_5, max_packet_size=len(full) - 1) is None


# --- the per-subscriber template --------------------------------------------------

MESSAGE = {P.PAYLOAD_FORMAT_INDICATOR: 1, P.MESSAGE_EXPIRY_INTERVAL: 60,
           P.CONTENT_TYPE: "text/plain", P.RESPONSE_TOPIC: "re/1",
           P.CORRELATION_DATA: b"\x01", P.USER_PROPERTY: (("a", "1"), ("a", "2")),
           P.TOPIC_ALIAS: 9, P.SUBSCRIPTION_IDENTIFIER: (4,)}  # the last two never travel


def test_template_drops_the_publishers_alias_and_subscription_ids():
    tmpl = PublishTemplate("a/b", b"hello", MESSAGE)
    forwarded = {k: v for k, v in MESSAGE.items()
                 if k not in (P.TOPIC_ALIAS, P.SUBSCRIPTION_IDENTIFIER)}
    assert tmpl.encode(MQTT_5) == Publish("a/b", b"hello", properties=forwarded).encode(MQTT_5)
    assert tmpl.encode(MQTT_3_1_1, qos=1, packet_id=3) == \
        Publish("a/b", b"hello", 1, packet_id=3).encode(MQTT_3_1_1)


def test_template_stamps_alias_subscription_ids_and_remaining_expiry():
    tmpl = PublishTemplate("a/b", b"hello", MESSAGE)
    got = tmpl.encode(MQTT_5, qos=2, packet_id=77, dup=True, retain=True, topic_alias=5,
                      alias_only=True, subscription_ids=(1, 300_000),
                      message_expiry_interval=42)
    want = Publish("", b"hello", 2, True, True, 77, {
        **MESSAGE, P.TOPIC_ALIAS: 5, P.SUBSCRIPTION_IDENTIFIER: (1, 300_000),
        P.MESSAGE_EXPIRY_INTERVAL: 42})
    assert got == want.encode(MQTT_5)
    assert PublishTemplate("a/b", b"hello", MESSAGE).header(
        MQTT_5, qos=2, packet_id=77, dup=True, retain=True, topic_alias=5, alias_only=True,
        subscription_ids=(1, 300_000), message_expiry_interval=42) + b"hello" == got
    no_expiry = tmpl.encode(MQTT_5, message_expiry_interval=None)
    assert P.MESSAGE_EXPIRY_INTERVAL not in roundtrip_bytes(no_expiry).properties


def roundtrip_bytes(data: bytes):
    header, body = split(data, MQTT_5)
    return decode_publish(header.flags, body, MQTT_5, from_client=False)


def test_template_respects_the_peers_maximum_packet_size():
    tmpl = PublishTemplate("t", b"x" * 100)
    size = len(tmpl.encode(MQTT_5, qos=1, packet_id=1))
    assert tmpl.encode(MQTT_5, qos=1, packet_id=1, max_packet_size=size) is not None
    assert tmpl.encode(MQTT_5, qos=1, packet_id=1, max_packet_size=size - 1) is None


@pytest.mark.parametrize("kw", [
    dict(version=MQTT_3_1_1, topic_alias=1), dict(version=MQTT_3_1_1, subscription_ids=(1,)),
    dict(version=MQTT_5, alias_only=True), dict(version=MQTT_5, topic_alias=0),
    dict(version=MQTT_5, subscription_ids=(0,)), dict(version=MQTT_5, qos=1),
    dict(version=MQTT_5, message_expiry_interval=2**32), dict(version=6),
])
def test_template_refuses_our_own_mistakes(kw):
    version = kw.pop("version")
    with pytest.raises(ValueError):
        PublishTemplate("t", b"").encode(version, **kw)


def test_template_needs_a_resolved_topic():
    with pytest.raises(ValueError):
        PublishTemplate("", b"")
    with pytest.raises(ValueError):
        PublishTemplate("a/+", b"")
    aliased = Publish("", b"x", properties={P.TOPIC_ALIAS: 1})
    assert PublishTemplate.from_publish(aliased, topic="a").encode(MQTT_5) == \
        Publish("a", b"x").encode(MQTT_5)


@FUZZ
@given(pub=publishes(MQTT_5), data=st.data())
def test_template_matches_the_plain_encoder(pub, data):
    topic = pub.topic or "resolved"
    tmpl = PublishTemplate(topic, pub.payload, pub.properties)
    alias = data.draw(st.none() | st.integers(1, 65535))
    sids = tuple(data.draw(st.lists(st.integers(1, 268_435_455), max_size=3)))
    expiry = data.draw(st.sampled_from([KEEP, None]) | st.integers(0, 2**32 - 1))
    props = {k: v for k, v in pub.properties.items()
             if k not in (P.TOPIC_ALIAS, P.SUBSCRIPTION_IDENTIFIER)}
    if alias is not None:
        props[P.TOPIC_ALIAS] = alias
    if sids:
        props[P.SUBSCRIPTION_IDENTIFIER] = sids
    if expiry is None:
        props.pop(P.MESSAGE_EXPIRY_INTERVAL, None)
    elif expiry is not KEEP:
        props[P.MESSAGE_EXPIRY_INTERVAL] = expiry
    want = Publish(topic, pub.payload, pub.qos, pub.retain, pub.dup, pub.packet_id, props)
    got = tmpl.encode(MQTT_5, qos=pub.qos, packet_id=pub.packet_id, dup=pub.dup,
                      retain=pub.retain, topic_alias=alias, subscription_ids=sids,
                      message_expiry_interval=expiry)
    assert got == want.encode(MQTT_5)


# --- incremental input ------------------------------------------------------------------

def test_publishes_fed_byte_by_byte_come_out_whole_and_only_at_their_end():
    pubs = [Publish("a", b""), Publish("b/c", b"x" * 300, 1, packet_id=1),
            Publish("", b"y", 2, False, True, 2, {P.TOPIC_ALIAS: 1}),
            Publish("d", b"z", properties={P.USER_PROPERTY: (("k", "v"),)})]
    stream = Connect(MQTT_5, "c").encode() + b"".join(p.encode(MQTT_5) for p in pubs)
    reader = PacketReader()
    got = []
    for i in range(len(stream)):
        reader.feed(stream[i:i + 1])
        while (packet := reader.next_packet()) is not None:
            got.append((i + 1, packet))
    ends, offset = [], 0
    while offset < len(stream):
        offset += parse_fixed_header(stream[offset:], MQTT_5).packet_size
        ends.append(offset)
    assert [end for end, _ in got] == ends
    assert [p for _, p in got][1:] == pubs and reader.buffered_bytes == 0


# --- fuzz ------------------------------------------------------------------------

@FUZZ
@given(version=st.sampled_from([MQTT_3_1_1, MQTT_5]), data=st.data())
def test_random_valid_publishes_roundtrip(version, data):
    from_client = data.draw(st.booleans())
    pub = data.draw(publishes(version, from_client=from_client))
    assert roundtrip(pub, version, from_client=from_client) == pub
    if from_client:
        stream = Connect(version, "c").encode() + pub.encode(version)
        assert read_all(stream)[1:] == [pub]


@FUZZ
@given(flags=st.integers(0, 15), body=st.binary(max_size=80),
       version=st.sampled_from([MQTT_3_1_1, MQTT_5]), from_client=st.booleans())
def test_random_publish_bodies_raise_only_codec_errors(flags, body, version, from_client):
    try:
        decode_publish(flags, body, version, from_client=from_client)
    except MqttError:
        pass


@FUZZ
@given(pub=publishes(MQTT_5), data=st.data())
def test_mutated_publishes_raise_only_codec_errors(pub, data):
    raw = bytearray(pub.encode(MQTT_5))
    header, _ = split(bytes(raw), MQTT_5)
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(header.header_length, len(raw) - 1))
        raw[i] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(header.header_length, len(raw)))
    try:
        decode_publish(header.flags, bytes(raw[header.header_length:cut]), MQTT_5,
                       from_client=data.draw(st.booleans()))
    except MqttError:
        pass

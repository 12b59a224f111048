"""Acks, SUBSCRIBE/SUBACK, UNSUBSCRIBE/UNSUBACK and AUTH, both versions."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProperties
from paho.mqtt.subscribeoptions import SubscribeOptions

from pairmq.appliance.mqtt.codec import (
    Connect, Disconnect, PacketReader, PingReq, decode_packet, encode_packet,
    parse_fixed_header,
)
from pairmq.appliance.mqtt.packets import (
    Auth, Puback, Pubcomp, Pubrec, Pubrel, Suback, Subscribe, Subscription,
    Unsuback, Unsubscribe, decode_ack, decode_auth, decode_suback,
    decode_subscribe, decode_unsuback, decode_unsubscribe,
)
from pairmq.appliance.mqtt.publish import Publish
from pairmq.appliance.mqtt.wire import (
    MQTT_3_1_1, MQTT_5, MalformedPacket, MqttError, PacketType, ProtocolError,
    ReasonCode, encode_vbi,
)
from tests.harness.mqtt_strategies import P, PahoBytes, any_packet, raises, read_all, roundtrip

R = ReasonCode
T = PacketType
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
BOTH = [MQTT_3_1_1, MQTT_5]
ACKS = [Puback, Pubrec, Pubrel, Pubcomp]


# --- PUBACK, PUBREC, PUBREL, PUBCOMP --------------------------------------------------

@pytest.mark.parametrize("cls, first", [(Puback, 0x40), (Pubrec, 0x50), (Pubrel, 0x62),
                                        (Pubcomp, 0x70)])
@pytest.mark.parametrize("version", BOTH)
def test_ack_short_form_bytes_and_paho(cls, first, version):
    assert cls(0x0102).encode(version) == bytes([first, 2, 1, 2])
    assert roundtrip(cls(0x0102), version) == cls(0x0102)
    paho = PahoBytes(version)
    sender = {Puback: paho._send_puback, Pubrec: paho._send_pubrec,
              Pubrel: paho._send_pubrel, Pubcomp: paho._send_pubcomp}[cls]
    sender(0x0102)
    assert paho.last() == cls(0x0102).encode(version)


def test_v5_ack_forms_reason_only_and_with_properties():
    assert Puback(1, R.NO_MATCHING_SUBSCRIBERS).encode(MQTT_5) == b"\x40\x03\x00\x01\x10"
    assert Pubrel(1, R.PACKET_IDENTIFIER_NOT_FOUND).encode(MQTT_5) == b"\x62\x03\x00\x01\x92"
    full = Pubrec(7, R.QUOTA_EXCEEDED, {P.REASON_STRING: "full"})
    assert full.encode(MQTT_5) == b"\x50\x0b\x00\x07\x97\x07\x1f\x00\x04full"
    assert roundtrip(full, MQTT_5) == full
    # Reason 0 with an empty property block: the long form of the short form.
    assert decode_ack(T.PUBCOMP, b"\x00\x05\x00\x00", MQTT_5) == Pubcomp(5)
    assert decode_ack(T.PUBACK, b"\x00\x05\x87", MQTT_5) == Puback(5, R.NOT_AUTHORIZED)


ACK_ERRORS = [
    ("v5 empty", T.PUBACK, b"", MQTT_5),
    ("v5 one byte", T.PUBACK, b"\x00", MQTT_5),
    ("v311 three bytes", T.PUBACK, b"\x00\x01\x00", MQTT_3_1_1),
    ("v311 one byte", T.PUBREL, b"\x01", MQTT_3_1_1),
    ("packet id 0", T.PUBREC, b"\x00\x00", MQTT_5),
    ("packet id 0 v311", T.PUBCOMP, b"\x00\x00", MQTT_3_1_1),
    ("PUBACK 0x92", T.PUBACK, b"\x00\x01\x92", MQTT_5),
    ("PUBREL 0x10", T.PUBREL, b"\x00\x01\x10", MQTT_5),
    ("PUBCOMP 0x80", T.PUBCOMP, b"\x00\x01\x80", MQTT_5),
    ("properties past the end", T.PUBACK, b"\x00\x01\x00\x05\x1f", MQTT_5),
    ("topic alias in PUBACK", T.PUBACK, b"\x00\x01\x00\x03\x23\x00\x01", MQTT_5),
    ("bytes after properties", T.PUBREC, b"\x00\x01\x00\x00\x00", MQTT_5),
]


@pytest.mark.parametrize("name, t, body, version", ACK_ERRORS, ids=[e[0] for e in ACK_ERRORS])
def test_ack_refusals_are_malformed(name, t, body, version):
    raises(MalformedPacket, R.MALFORMED_PACKET, decode_ack, t, body, version)


def test_duplicate_reason_string_in_an_ack_is_a_protocol_error():
    rs = b"\x1f\x00\x01x"
    raises(ProtocolError, R.PROTOCOL_ERROR, decode_ack, T.PUBACK,
           b"\x00\x01\x00" + encode_vbi(8) + rs + rs, MQTT_5)


@pytest.mark.parametrize("first", [0x60, 0x61, 0x63, 0x6A, 0x41, 0x72])
def test_ack_fixed_flags_are_checked_before_the_body(first):
    raises(MalformedPacket, R.MALFORMED_PACKET, parse_fixed_header, bytes([first]), MQTT_5)


@pytest.mark.parametrize("packet, version", [
    (Puback(1, R.NOT_AUTHORIZED), MQTT_3_1_1), (Puback(1, properties={P.REASON_STRING: "x"}),
                                                 MQTT_3_1_1),
    (Puback(0), MQTT_5), (Puback(65536), MQTT_5), (Pubrel(1, R.NOT_AUTHORIZED), MQTT_5),
    (Puback(1, R.PACKET_IDENTIFIER_NOT_FOUND), MQTT_5),
    (Puback(1, properties={P.TOPIC_ALIAS: 1}), MQTT_5), (Puback(1), 3),
])
def test_ack_encoder_refuses_our_own_mistakes(packet, version):
    with pytest.raises(ValueError):
        packet.encode(version)


def test_encode_packet_drops_an_acks_reason_string_to_fit():
    ack = Puback(1, R.QUOTA_EXCEEDED, {P.REASON_STRING: "x" * 50, P.USER_PROPERTY: (("a", "b"),)})
    assert encode_packet(ack, MQTT_5, max_packet_size=10) == b"\x40\x03\x00\x01\x97"
    assert encode_packet(ack, MQTT_5, max_packet_size=4) is None
    full = ack.encode(MQTT_5)
    assert encode_packet(ack, MQTT_5, max_packet_size=len(full)) == full


# --- SUBSCRIBE / SUBACK -------------------------------------------------------------------

def test_subscribe_bytes_match_paho_in_both_versions():
    paho = PahoBytes(MQTT_3_1_1)
    paho._send_subscribe(False, [(b"a/+", 1), (b"#", 0), (b"x", 2)])
    sub = Subscribe(1, (Subscription("a/+", 1), Subscription("#"), Subscription("x", 2)))
    assert sub.encode(MQTT_3_1_1) == paho.last() \
        == b"\x82\x10\x00\x01\x00\x03a/+\x01\x00\x01#\x00\x00\x01x\x02"
    paho = PahoBytes(MQTT_5)
    props = PahoProperties(PacketTypes.SUBSCRIBE)
    props.SubscriptionIdentifier = 300
    props.UserProperty = [("k", "v")]
    paho._send_subscribe(False, [(b"a/+", SubscribeOptions(1, True, True, 2))], props)
    sub = Subscribe(1, (Subscription("a/+", 1, True, True, 2),),
                    {P.SUBSCRIPTION_IDENTIFIER: (300,), P.USER_PROPERTY: (("k", "v"),)})
    assert sub.encode(MQTT_5) == paho.last()
    assert paho.last()[-1] == 0b101101  # QoS 1, No Local, RAP, Retain Handling 2
    assert roundtrip(sub, MQTT_5, from_client=True) == sub


def sub_body(filters=(b"t",), options=(0,), props=b"\x00", pid=b"\x00\x01"):
    return pid + props + b"".join(len(f).to_bytes(2, "big") + f + bytes([o])
                                  for f, o in zip(filters, options))


SUBSCRIBE_ERRORS = [
    ("no filter v5", sub_body((), ()), MQTT_5, ProtocolError, R.PROTOCOL_ERROR),
    ("no filter v311", b"\x00\x01", MQTT_3_1_1, ProtocolError, R.PROTOCOL_ERROR),
    ("packet id 0", sub_body(pid=b"\x00\x00"), MQTT_5, MalformedPacket, R.MALFORMED_PACKET),
    ("packet id cut", b"\x00", MQTT_5, MalformedPacket, R.MALFORMED_PACKET),
    ("properties missing", b"\x00\x01", MQTT_5, MalformedPacket, R.MALFORMED_PACKET),
    ("options missing", b"\x00\x01\x00\x00\x01t", MQTT_5, MalformedPacket, R.MALFORMED_PACKET),
    ("filter cut", b"\x00\x01\x00\x00\x05t", MQTT_5, MalformedPacket, R.MALFORMED_PACKET),
    ("filter not UTF-8", sub_body((b"\xff",)), MQTT_5, MalformedPacket, R.MALFORMED_PACKET),
    ("filter NUL", sub_body((b"a\x00",), props=b""), MQTT_3_1_1, MalformedPacket,
     R.MALFORMED_PACKET),
    ("v5 reserved bit 6", sub_body(options=(0x40,)), MQTT_5, MalformedPacket, R.MALFORMED_PACKET),
    ("v5 reserved bit 7", sub_body(options=(0x81,)), MQTT_5, MalformedPacket, R.MALFORMED_PACKET),
    ("v5 QoS 3", sub_body(options=(0x03,)), MQTT_5, ProtocolError, R.PROTOCOL_ERROR),
    ("v5 retain handling 3", sub_body(options=(0x30,)), MQTT_5, ProtocolError, R.PROTOCOL_ERROR),
    ("v311 QoS 3", sub_body(options=(0x03,), props=b""), MQTT_3_1_1, MalformedPacket,
     R.MALFORMED_PACKET),
    ("v311 No Local bit", sub_body(options=(0x04,), props=b""), MQTT_3_1_1, MalformedPacket,
     R.MALFORMED_PACKET),
    ("v311 high bit", sub_body(options=(0x80,), props=b""), MQTT_3_1_1, MalformedPacket,
     R.MALFORMED_PACKET),
    ("subscription id 0", sub_body(props=b"\x02\x0b\x00"), MQTT_5, ProtocolError,
     R.PROTOCOL_ERROR),
    ("subscription id twice", sub_body(props=b"\x04\x0b\x01\x0b\x02"), MQTT_5, ProtocolError,
     R.PROTOCOL_ERROR),
    ("reason string in SUBSCRIBE", sub_body(props=b"\x04\x1f\x00\x01x"), MQTT_5,
     MalformedPacket, R.MALFORMED_PACKET),
    ("second pair cut", sub_body((b"a", b"b"), (0, 0))[:-1], MQTT_5, MalformedPacket,
     R.MALFORMED_PACKET),
]


@pytest.mark.parametrize("name, body, version, exc, reason", SUBSCRIBE_ERRORS,
                         ids=[e[0] for e in SUBSCRIBE_ERRORS])
def test_subscribe_refusals(name, body, version, exc, reason):
    raises(exc, reason, decode_subscribe, body, version)
    stream = Connect(version, "c").encode() + b"\x82" + encode_vbi(len(body)) + body
    assert raises(exc, reason, read_all, stream).protocol_version == version


def test_subscribe_options_decode_every_field():
    sub = decode_subscribe(sub_body((b"a", b"b"), (0b101110, 0b000001)), MQTT_5)
    assert sub.subscriptions == (Subscription("a", 2, True, True, 2), Subscription("b", 1))


def test_topic_filter_syntax_is_not_the_codecs_business():
    sub = decode_subscribe(sub_body((b"a/#/b+",), props=b""), MQTT_3_1_1)
    assert sub.subscriptions[0].topic_filter == "a/#/b+"


@pytest.mark.parametrize("packet, version", [
    (Subscribe(1, ()), MQTT_5), (Subscribe(0, (Subscription("t"),)), MQTT_5),
    (Subscribe(1, (Subscription("t", 3),)), MQTT_5),
    (Subscribe(1, (Subscription("t", retain_handling=3),)), MQTT_5),
    (Subscribe(1, (Subscription("t", no_local=True),)), MQTT_3_1_1),
    (Subscribe(1, (Subscription("t"),), {P.SUBSCRIPTION_IDENTIFIER: (1,)}), MQTT_3_1_1),
    (Subscribe(1, (Subscription("t"),), {P.SUBSCRIPTION_IDENTIFIER: (1, 2)}), MQTT_5),
    (Suback(1, ()), MQTT_5), (Suback(1, (R.NO_MATCHING_SUBSCRIBERS,)), MQTT_5),
    (Suback(1, (0x03,)), MQTT_3_1_1),
])
def test_subscribe_and_suback_encoders_refuse_our_own_mistakes(packet, version):
    with pytest.raises(ValueError):
        packet.encode(version)


def test_suback_bytes_and_v311_failure_mapping():
    ok = Suback(10, (R.GRANTED_QOS_0, R.GRANTED_QOS_1, R.GRANTED_QOS_2, R.NOT_AUTHORIZED))
    assert ok.encode(MQTT_3_1_1) == b"\x90\x06\x00\x0a\x00\x01\x02\x80"
    assert ok.encode(MQTT_5) == b"\x90\x07\x00\x0a\x00\x00\x01\x02\x87"
    assert roundtrip(ok, MQTT_5) == ok
    assert roundtrip(ok, MQTT_3_1_1) == Suback(10, (0, 1, 2, R.UNSPECIFIED_ERROR))
    with_reason = Suback(3, (R.WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED,), {P.REASON_STRING: "no"})
    assert roundtrip(with_reason, MQTT_5) == with_reason


@pytest.mark.parametrize("body, version, exc, reason", [
    (b"\x00\x01", MQTT_3_1_1, ProtocolError, R.PROTOCOL_ERROR),
    (b"\x00\x01\x00", MQTT_5, ProtocolError, R.PROTOCOL_ERROR),
    (b"\x00\x01\x03", MQTT_3_1_1, MalformedPacket, R.MALFORMED_PACKET),
    (b"\x00\x01\x87", MQTT_3_1_1, MalformedPacket, R.MALFORMED_PACKET),
    (b"\x00\x01\x00\x10", MQTT_5, MalformedPacket, R.MALFORMED_PACKET),
    (b"\x00\x00\x00\x00", MQTT_5, MalformedPacket, R.MALFORMED_PACKET),
    (b"\x00\x01\x03\x23\x00\x01\x00", MQTT_5, MalformedPacket, R.MALFORMED_PACKET),
])
def test_suback_refusals(body, version, exc, reason):
    raises(exc, reason, decode_suback, body, version)


# --- UNSUBSCRIBE / UNSUBACK -----------------------------------------------------------

@pytest.mark.parametrize("version", BOTH)
def test_unsubscribe_bytes_match_paho(version):
    paho = PahoBytes(version)
    paho._send_unsubscribe(False, [b"a/+", b"c"])
    unsub = Unsubscribe(1, ("a/+", "c"))
    assert unsub.encode(version) == paho.last()
    assert roundtrip(unsub, version) == unsub
    props = Unsubscribe(2, ("x",), {P.USER_PROPERTY: (("k", "v"),)})
    assert roundtrip(props, MQTT_5) == props


@pytest.mark.parametrize("body, version, exc, reason", [
    (b"\x00\x01\x00", MQTT_5, ProtocolError, R.PROTOCOL_ERROR),
    (b"\x00\x01", MQTT_3_1_1, ProtocolError, R.PROTOCOL_ERROR),
    (b"\x00\x00\x00\x01t", MQTT_3_1_1, MalformedPacket, R.MALFORMED_PACKET),
    (b"\x00\x01\x00\x00\x02t", MQTT_5, MalformedPacket, R.MALFORMED_PACKET),
    (b"\x00\x01\x00\x01\xff", MQTT_3_1_1, MalformedPacket, R.MALFORMED_PACKET),
    (b"\x00\x01\x02\x0b\x01\x00\x01t", MQTT_5, MalformedPacket, R.MALFORMED_PACKET),
])
def test_unsubscribe_refusals(body, version, exc, reason):
    raises(exc, reason, decode_unsubscribe, body, version)


def test_unsuback_in_both_versions():
    assert Unsuback(5).encode(MQTT_3_1_1) == b"\xb0\x02\x00\x05"
    assert roundtrip(Unsuback(5), MQTT_3_1_1) == Unsuback(5)
    v5 = Unsuback(5, (R.SUCCESS, R.NO_SUBSCRIPTION_EXISTED))
    assert v5.encode(MQTT_5) == b"\xb0\x05\x00\x05\x00\x00\x11"
    assert roundtrip(v5, MQTT_5) == v5
    with pytest.raises(ValueError):
        Unsuback(5).encode(MQTT_5)  # v5 needs a code per filter
    with pytest.raises(ValueError):
        v5.encode(MQTT_3_1_1)
    with pytest.raises(ValueError):
        Unsuback(5, (R.QUOTA_EXCEEDED,)).encode(MQTT_5)


@pytest.mark.parametrize("body, version, exc, reason", [
    (b"\x00\x01\x00", MQTT_3_1_1, MalformedPacket, R.MALFORMED_PACKET),
    (b"\x00\x00", MQTT_3_1_1, MalformedPacket, R.MALFORMED_PACKET),
    (b"\x00\x01\x00", MQTT_5, ProtocolError, R.PROTOCOL_ERROR),
    (b"\x00\x01\x00\x97", MQTT_5, MalformedPacket, R.MALFORMED_PACKET),
    (b"\x00\x01", MQTT_5, MalformedPacket, R.MALFORMED_PACKET),
])
def test_unsuback_refusals(body, version, exc, reason):
    raises(exc, reason, decode_unsuback, body, version)


# --- AUTH ------------------------------------------------------------------------

def test_auth_forms():
    assert Auth().encode(MQTT_5) == b"\xf0\x00"
    step = Auth(R.CONTINUE_AUTHENTICATION, {P.AUTHENTICATION_METHOD: "SCRAM",
                                            P.AUTHENTICATION_DATA: b"\x01"})
    assert step.encode(MQTT_5) == b"\xf0\x0e\x18\x0c\x15\x00\x05SCRAM\x16\x00\x01\x01"
    assert roundtrip(step, MQTT_5, from_client=True) == step
    assert decode_auth(b"", MQTT_5) == Auth()


@pytest.mark.parametrize("body, version, exc, reason", [
    (b"\x18\x00", MQTT_5, ProtocolError, R.PROTOCOL_ERROR),          # no method
    (b"\x19", MQTT_5, ProtocolError, R.PROTOCOL_ERROR),              # no method
    (b"\x00\x03\x16\x00\x00", MQTT_5, ProtocolError, R.PROTOCOL_ERROR),  # data, no method
    (b"\x87\x00", MQTT_5, MalformedPacket, R.MALFORMED_PACKET),      # not an AUTH code
    (b"\x18\x02\x23\x00", MQTT_5, MalformedPacket, R.MALFORMED_PACKET),
    (b"\x18\x00\x00", MQTT_5, MalformedPacket, R.MALFORMED_PACKET),  # trailing byte
    (b"", MQTT_3_1_1, MalformedPacket, R.MALFORMED_PACKET),          # reserved in 3.1.1
])
def test_auth_refusals(body, version, exc, reason):
    raises(exc, reason, decode_auth, body, version)


def test_auth_encoder_refuses_our_own_mistakes():
    for packet, version in [(Auth(), MQTT_3_1_1), (Auth(R.RE_AUTHENTICATE), MQTT_5),
                            (Auth(R.SUCCESS, {P.REASON_STRING: "x"}), MQTT_5),
                            (Auth(R.NOT_AUTHORIZED), MQTT_5)]:
        with pytest.raises(ValueError):
            packet.encode(version)


# --- the reader: a whole session, byte by byte --------------------------------------

def client_session(version):
    packets = [
        Connect(version, "c"), Publish("a", b"1"), Publish("b", b"2", 1, packet_id=1),
        Puback(7), Pubrec(8), Pubrel(9), Pubcomp(10),
        Subscribe(2, (Subscription("a/#", 1), Subscription("b"))),
        Unsubscribe(3, ("a/#",)), PingReq(),
    ]
    if version == MQTT_5:
        packets += [Puback(11, R.NO_MATCHING_SUBSCRIBERS), Pubrel(12, R.PACKET_IDENTIFIER_NOT_FOUND,
                                                                  {P.REASON_STRING: "gone"}),
                    Auth(R.RE_AUTHENTICATE, {P.AUTHENTICATION_METHOD: "m"})]
    return packets + [Disconnect()]


@pytest.mark.parametrize("version", BOTH)
def test_every_client_packet_fed_byte_by_byte(version):
    packets = client_session(version)
    encoded = [p.encode(version) for p in packets]
    stream = b"".join(encoded)
    ends = {sum(len(e) for e in encoded[:i + 1]) for i in range(len(encoded))}
    reader, got = PacketReader(), []
    for i in range(len(stream)):
        reader.feed(stream[i:i + 1])
        packet = reader.next_packet()
        assert (packet is not None) == (i + 1 in ends)
        if packet is not None:
            got.append(packet)
    assert got == packets and reader.buffered_bytes == 0
    # And every prefix of each packet alone waits for more.
    for data in encoded[1:]:
        for n in range(len(data)):
            r = PacketReader()
            r.feed(encoded[0] + data[:n])
            r.next_packet()
            assert r.next_packet() is None


@pytest.mark.parametrize("packet", [
    Suback(1, (0,)), Unsuback(1), Publish("t", b"")])
def test_reader_refuses_server_only_packets_but_takes_publish(packet):
    stream = Connect(MQTT_3_1_1, "c").encode() + packet.encode(MQTT_3_1_1)
    if isinstance(packet, Publish):
        assert read_all(stream)[1:] == [packet]
    else:
        raises(ProtocolError, R.PROTOCOL_ERROR, read_all, stream)


# --- fuzz ---------------------------------------------------------------------------

@FUZZ
@given(data=st.data(), version=st.sampled_from(BOTH))
def test_random_valid_packets_roundtrip(data, version):
    packet = data.draw(any_packet(version))
    assert roundtrip(packet, version, from_client=False) == packet


DECODERS = [decode_subscribe, decode_suback, decode_unsubscribe, decode_unsuback, decode_auth,
            *[lambda body, v, t=t: decode_ack(t, body, v)
              for t in (T.PUBACK, T.PUBREC, T.PUBREL, T.PUBCOMP)]]


@FUZZ
@given(decoder=st.sampled_from(DECODERS), body=st.binary(max_size=60),
       version=st.sampled_from(BOTH))
def test_random_bodies_raise_only_codec_errors(decoder, body, version):
    try:
        decoder(body, version)
    except MqttError:
        pass


@FUZZ
@given(data=st.data(), version=st.sampled_from(BOTH))
def test_mutated_valid_packets_raise_only_codec_errors(data, version):
    raw = bytearray(data.draw(any_packet(version)).encode(version))
    for _ in range(data.draw(st.integers(1, 3))):
        raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    try:
        header = parse_fixed_header(bytes(raw), version)
        if header is not None:
            decode_packet(header, bytes(raw[header.header_length:]), version,
                          from_client=data.draw(st.booleans()))
    except MqttError:
        pass


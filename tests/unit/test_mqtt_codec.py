"""The sans-I/O MQTT codec, driven directly: no sockets, no event loop."""


import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pairmq.appliance.errors import RemoteProtocolError
from pairmq.appliance.mqtt.codec import (
    DEFAULT_MAX_PACKET_SIZE, V311_RETURN_CODES, Connack, Connect, Disconnect,
    FixedHeader, PacketReader, PingReq, PingResp, Will, decode_connack,
    decode_connect, decode_disconnect, decode_packet, encode_packet,
    parse_fixed_header,
)
from pairmq.appliance.mqtt.packets import Auth, Pubrel, Subscribe, Subscription
from pairmq.appliance.mqtt.publish import Publish
from pairmq.appliance.mqtt.properties import (
    PROPERTY_TABLE, WILL, DataType, PropertyId, decode_properties,
    encode_properties,
)
from pairmq.appliance.mqtt.wire import (
    MQTT_3_1_1, MQTT_5, Cursor, MalformedPacket, MqttError, PacketType,
    ProtocolError, ReasonCode, encode_utf8, encode_vbi, parse_vbi,
)
from tests.harness.mqtt_strategies import read_all

P = PropertyId
R = ReasonCode


def split(data: bytes) -> tuple[FixedHeader, bytes]:
    header = parse_fixed_header(data)
    assert header is not None and header.packet_size == len(data)
    return header, data[header.header_length:]


def roundtrip(packet, version):
    header, body = split(packet.encode(version))
    return decode_packet(header, body, version)


def raises(exc_type, reason, fn, *args):
    with pytest.raises(exc_type) as info:
        fn(*args)
    assert info.value.reason_code == reason, info.value
    return info.value


def connect_body(name=b"MQTT", level=5, flags=0x02, tail=b"\x00\x3c\x00\x00\x00"):
    """CONNECT body by hand; default tail: keep alive 60, no props, empty id."""
    return len(name).to_bytes(2, "big") + name + bytes([level, flags]) + tail


def connect_packet(body: bytes) -> bytes:
    return bytes([0x10]) + encode_vbi(len(body)) + body


# --- the rules the cores live by ----------------------------------------------

def test_errors_are_remote_protocol_errors_with_reason_codes():
    err = MalformedPacket(0x81, "x")
    assert isinstance(err, MqttError) and isinstance(err, RemoteProtocolError)
    assert err.reason_code is R.MALFORMED_PACKET and err.message == "x"
    assert str(ProtocolError(0x95, "too big")) == "too big (reason 0x95)"


# --- primitives ----------------------------------------------------------------

@pytest.mark.parametrize("value, size", [
    (0, 1), (127, 1), (128, 2), (16_383, 2), (16_384, 3), (2_097_151, 3),
    (2_097_152, 4), (268_435_455, 4)])
def test_vbi_roundtrip_at_the_boundaries(value, size):
    data = encode_vbi(value)
    assert len(data) == size
    assert parse_vbi(data, 0) == (value, size)
    assert parse_vbi(data[:-1], 0) is None  # cut short: wait for more


def test_vbi_rejects_five_bytes_non_minimal_and_out_of_range():
    raises(MalformedPacket, R.MALFORMED_PACKET, parse_vbi, b"\xff\xff\xff\xff\x01", 0)
    raises(MalformedPacket, R.MALFORMED_PACKET, parse_vbi, b"\x80\x00", 0)
    with pytest.raises(ValueError):
        encode_vbi(268_435_456)


@pytest.mark.parametrize("raw", [
    b"\xff", b"\xc0\x80", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"ab\x00c", b"\xe2\x82"])
def test_utf8_strings_reject_invalid_utf8_and_nul(raw):
    data = len(raw).to_bytes(2, "big") + raw
    raises(MalformedPacket, R.MALFORMED_PACKET, Cursor(data).utf8, "topic")


def test_utf8_accepts_the_full_range_and_encoder_refuses_nul():
    text = "héllo ✓ 𝄞"
    assert Cursor(encode_utf8(text)).utf8("s") == text
    with pytest.raises(ValueError):
        encode_utf8("a\x00b")
    raises(MalformedPacket, R.MALFORMED_PACKET, Cursor(b"\x00\x05ab").utf8, "s")


# --- properties ----------------------------------------------------------------

SAMPLES = {DataType.BYTE: 1, DataType.TWO_BYTE_INT: 300, DataType.FOUR_BYTE_INT: 70_000,
           DataType.VBI: 200_000, DataType.UTF8: "ü/x", DataType.BINARY: b"\x00\xff",
           DataType.UTF8_PAIR: ("k", "v")}


@pytest.mark.parametrize("pid", list(PropertyId), ids=lambda p: p.name)
def test_every_property_roundtrips_in_every_scope_that_allows_it(pid):
    spec = PROPERTY_TABLE[pid]
    value = SAMPLES[spec.data_type]
    if pid in (P.USER_PROPERTY, P.SUBSCRIPTION_IDENTIFIER):
        value = (value,)
    for scope in spec.scopes:
        block = encode_properties({pid: value}, scope)
        assert decode_properties(Cursor(block), scope) == {pid: value}


@pytest.mark.parametrize("pid", list(PropertyId), ids=lambda p: p.name)
def test_every_property_is_malformed_outside_its_scopes(pid):
    spec = PROPERTY_TABLE[pid]
    value = SAMPLES[spec.data_type]
    inner = encode_properties({pid: (value,) if pid in (P.USER_PROPERTY, P.SUBSCRIPTION_IDENTIFIER) else value},
                              next(iter(spec.scopes)))
    for scope in set(PacketType) | {WILL}:
        if scope not in spec.scopes:
            raises(MalformedPacket, R.MALFORMED_PACKET, decode_properties, Cursor(inner), scope)


def props_block(*pairs: bytes) -> bytes:
    body = b"".join(pairs)
    return encode_vbi(len(body)) + body


def test_duplicate_single_valued_property_is_a_protocol_error():
    once = bytes([P.SESSION_EXPIRY_INTERVAL]) + (10).to_bytes(4, "big")
    err = raises(ProtocolError, R.PROTOCOL_ERROR, decode_properties,
                 Cursor(props_block(once, once)), PacketType.CONNECT)
    assert "SESSION_EXPIRY_INTERVAL" in err.message


def test_user_property_repeats_and_subscription_identifier_only_in_publish():
    up = bytes([P.USER_PROPERTY]) + encode_utf8("a") + encode_utf8("1")
    up2 = bytes([P.USER_PROPERTY]) + encode_utf8("a") + encode_utf8("2")
    got = decode_properties(Cursor(props_block(up, up2)), PacketType.CONNECT)
    assert got == {P.USER_PROPERTY: (("a", "1"), ("a", "2"))}
    sid = bytes([P.SUBSCRIPTION_IDENTIFIER, 5])
    assert decode_properties(Cursor(props_block(sid, sid)), PacketType.PUBLISH) == {
        P.SUBSCRIPTION_IDENTIFIER: (5, 5)}
    raises(ProtocolError, R.PROTOCOL_ERROR, decode_properties,
           Cursor(props_block(sid, sid)), PacketType.SUBSCRIBE)
    with pytest.raises(ValueError):
        encode_properties({P.SUBSCRIPTION_IDENTIFIER: (1, 2)}, PacketType.SUBSCRIBE)


@pytest.mark.parametrize("raw, scope", [
    (bytes([P.RECEIVE_MAXIMUM, 0, 0]), PacketType.CONNECT),
    (bytes([P.MAXIMUM_PACKET_SIZE, 0, 0, 0, 0]), PacketType.CONNECT),
    (bytes([P.REQUEST_PROBLEM_INFORMATION, 2]), PacketType.CONNECT),
    (bytes([P.REQUEST_RESPONSE_INFORMATION, 7]), PacketType.CONNECT),
    (bytes([P.PAYLOAD_FORMAT_INDICATOR, 2]), WILL),
    (bytes([P.SUBSCRIPTION_IDENTIFIER, 0]), PacketType.SUBSCRIBE),
    (bytes([P.MAXIMUM_QOS, 2]), PacketType.CONNACK),
])
def test_out_of_range_property_values_are_protocol_errors(raw, scope):
    raises(ProtocolError, R.PROTOCOL_ERROR, decode_properties, Cursor(props_block(raw)), scope)


def test_topic_alias_zero_is_topic_alias_invalid():
    """MQTT 5 §3.3.2.3.4: a Topic Alias of 0 is answered with DISCONNECT 0x94, not a plain 0x82."""
    raises(ProtocolError, R.TOPIC_ALIAS_INVALID, decode_properties,
           Cursor(props_block(bytes([P.TOPIC_ALIAS, 0, 0]))), PacketType.PUBLISH)


@pytest.mark.parametrize("block", [
    props_block(bytes([0x7F, 1])),                   # unknown identifier
    props_block(bytes([P.SESSION_EXPIRY_INTERVAL, 0, 0])),  # value cut short
    b"\x05\x11\x00",                                  # length beyond the packet
    props_block(bytes([P.USER_PROPERTY]) + encode_utf8("k")),  # pair missing value
])
def test_unparseable_property_blocks_are_malformed(block):
    raises(MalformedPacket, R.MALFORMED_PACKET, decode_properties, Cursor(block), PacketType.CONNECT)


# --- packets: round trips -------------------------------------------------------

CONNECTS = [
    Connect(MQTT_3_1_1, "c1"),
    Connect(MQTT_3_1_1, "", clean_start=True, keep_alive_s=0),
    Connect(MQTT_3_1_1, "c2", clean_start=False, keep_alive_s=65535,
            will=Will("w/t", b"bye", 2, True), username="u", password=b"\x00pw"),
    Connect(MQTT_3_1_1, "c3", username="only-user"),
    Connect(MQTT_5, ""),
    Connect(MQTT_5, "c5", password=b"no user is fine in v5"),
    Connect(MQTT_5, "c6", clean_start=False, keep_alive_s=10,
            will=Will("w", b"\xff", 1, False, {P.WILL_DELAY_INTERVAL: 5,
                                               P.USER_PROPERTY: (("a", "b"),)}),
            username="ü", password=b"",
            properties={P.SESSION_EXPIRY_INTERVAL: 3600, P.RECEIVE_MAXIMUM: 10,
                        P.MAXIMUM_PACKET_SIZE: 4096, P.TOPIC_ALIAS_MAXIMUM: 5,
                        P.REQUEST_PROBLEM_INFORMATION: 0,
                        P.USER_PROPERTY: (("k", "v"), ("k", "w"))}),
]


@pytest.mark.parametrize("packet", CONNECTS)
def test_connect_roundtrip(packet):
    assert roundtrip(packet, packet.protocol_version) == packet
    assert read_all(packet.encode()) == [packet]


@pytest.mark.parametrize("version", [MQTT_3_1_1, MQTT_5])
def test_small_packets_roundtrip(version):
    assert roundtrip(PingReq(), version) == PingReq()
    assert roundtrip(PingResp(), version) == PingResp()
    assert roundtrip(Disconnect(), version) == Disconnect()
    assert PingReq().encode(version) == b"\xc0\x00"
    assert PingResp().encode(version) == b"\xd0\x00"
    assert Disconnect().encode(version) == b"\xe0\x00"
    assert roundtrip(Connack(), version) == Connack()
    assert roundtrip(Connack(session_present=True), version) == Connack(session_present=True)


def test_v5_connack_and_disconnect_roundtrip_with_properties():
    refuse = Connack(R.USE_ANOTHER_SERVER, properties={
        P.SERVER_REFERENCE: "10.0.0.2:1883", P.REASON_STRING: "standby"})
    assert refuse.encode(MQTT_5) == (b"\x20\x1d\x00\x9c\x1a" + b"\x1c\x00\x0d10.0.0.2:1883"
                                     + b"\x1f\x00\x07standby")
    assert roundtrip(refuse, MQTT_5) == refuse
    ok = Connack(properties={P.ASSIGNED_CLIENT_IDENTIFIER: "pairmq-1",
                             P.SERVER_KEEP_ALIVE: 30, P.MAXIMUM_PACKET_SIZE: 1 << 20,
                             P.MAXIMUM_QOS: 1, P.RETAIN_AVAILABLE: 0})
    assert roundtrip(ok, MQTT_5) == ok
    for code in (R.SERVER_SHUTTING_DOWN, R.USE_ANOTHER_SERVER, R.DISCONNECT_WITH_WILL_MESSAGE):
        d = Disconnect(code, {P.SERVER_REFERENCE: "b:1883"} if code == R.USE_ANOTHER_SERVER else {})
        assert roundtrip(d, MQTT_5) == d
    assert Disconnect(R.SERVER_SHUTTING_DOWN).encode(MQTT_5) == b"\xe0\x02\x8b\x00"
    assert decode_disconnect(b"\x8b", MQTT_5) == Disconnect(R.SERVER_SHUTTING_DOWN)
    assert decode_disconnect(b"", MQTT_5) == Disconnect()


@pytest.mark.parametrize("reason, code", sorted(V311_RETURN_CODES.items()))
def test_v311_connack_maps_reason_codes_to_return_codes(reason, code):
    assert Connack(reason).encode(MQTT_3_1_1) == bytes([0x20, 2, 0, code])
    back = decode_connack(bytes([0, code]), MQTT_3_1_1)
    assert V311_RETURN_CODES[back.reason_code] == code


def test_connack_encoder_refuses_our_own_mistakes():
    with pytest.raises(ValueError):
        Connack(R.MALFORMED_PACKET).encode(MQTT_3_1_1)  # no 3.1.1 code: just close
    with pytest.raises(ValueError):
        Connack(R.SERVER_UNAVAILABLE, session_present=True).encode(MQTT_5)
    with pytest.raises(ValueError):
        Connack(R.SERVER_SHUTTING_DOWN).encode(MQTT_5)  # not a CONNACK code
    with pytest.raises(ValueError):
        Connack(properties={P.TOPIC_ALIAS: 1}).encode(MQTT_5)  # not a CONNACK property
    with pytest.raises(ValueError):
        Disconnect(R.SERVER_SHUTTING_DOWN).encode(MQTT_3_1_1)


def test_decode_connack_refusals():
    raises(MalformedPacket, R.MALFORMED_PACKET, decode_connack, b"\x00\x06", MQTT_3_1_1)
    raises(MalformedPacket, R.MALFORMED_PACKET, decode_connack, b"\x02\x00", MQTT_3_1_1)
    raises(MalformedPacket, R.MALFORMED_PACKET, decode_connack, b"\x01\x88\x00", MQTT_5)
    raises(MalformedPacket, R.MALFORMED_PACKET, decode_connack, b"\x00\x8b\x00", MQTT_5)
    raises(MalformedPacket, R.MALFORMED_PACKET, decode_connack, b"\x00\x00\x00\x00", MQTT_5)


def test_encode_packet_drops_reason_string_to_fit_the_peers_maximum():
    d = Disconnect(R.USE_ANOTHER_SERVER, {P.SERVER_REFERENCE: "b:1", P.REASON_STRING: "x" * 100,
                                          P.USER_PROPERTY: (("a", "b"),)})
    full = encode_packet(d, MQTT_5)
    slim = encode_packet(d, MQTT_5, max_packet_size=20)
    assert len(full) > 100 and slim == Disconnect(
        R.USE_ANOTHER_SERVER, {P.SERVER_REFERENCE: "b:1"}).encode(MQTT_5)
    assert encode_packet(d, MQTT_5, max_packet_size=len(full)) == full
    assert encode_packet(d, MQTT_5, max_packet_size=4) is None


# --- CONNECT: every refusal path --------------------------------------------------

CONNECT_ERRORS = [
    ("MQTT level 3", connect_body(level=3), ProtocolError, R.UNSUPPORTED_PROTOCOL_VERSION, None),
    ("MQTT level 6", connect_body(level=6), ProtocolError, R.UNSUPPORTED_PROTOCOL_VERSION, None),
    ("MQIsdp 3.1", connect_body(name=b"MQIsdp", level=3), ProtocolError,
     R.UNSUPPORTED_PROTOCOL_VERSION, None),
    ("other name", connect_body(name=b"HTTP"), MalformedPacket, R.MALFORMED_PACKET, None),
    ("name not utf-8", connect_body(name=b"MQ\xffT"), MalformedPacket, R.MALFORMED_PACKET, None),
    ("reserved flag v4", connect_body(level=4, flags=0x03), MalformedPacket, R.MALFORMED_PACKET, 4),
    ("reserved flag v5", connect_body(flags=0x03), MalformedPacket, R.MALFORMED_PACKET, 5),
    ("will qos 3", connect_body(flags=0x1E), MalformedPacket, R.MALFORMED_PACKET, 5),
    ("will qos without will", connect_body(flags=0x0A), MalformedPacket, R.MALFORMED_PACKET, 5),
    ("will retain without will", connect_body(level=4, flags=0x22, tail=b"\x00\x3c\x00\x00"),
     MalformedPacket, R.MALFORMED_PACKET, 4),
    ("password without user v4", connect_body(level=4, flags=0x42, tail=b"\x00\x3c\x00\x00\x00\x00"),
     MalformedPacket, R.MALFORMED_PACKET, 4),
    ("trailing bytes", connect_body(tail=b"\x00\x3c\x00\x00\x00\xaa"),
     MalformedPacket, R.MALFORMED_PACKET, 5),
    ("truncated keep alive", connect_body(tail=b"\x00"), MalformedPacket, R.MALFORMED_PACKET, 5),
    ("client id NUL", connect_body(level=4, tail=b"\x00\x3c\x00\x02a\x00"),
     MalformedPacket, R.MALFORMED_PACKET, 4),
    ("client id bad utf-8", connect_body(tail=b"\x00\x3c\x00\x00\x02\xc3\x28"),
     MalformedPacket, R.MALFORMED_PACKET, 5),
    ("auth data without method", connect_body(tail=b"\x00\x3c\x04\x16\x00\x01x\x00\x00"),
     ProtocolError, R.PROTOCOL_ERROR, 5),
    ("duplicate property", connect_body(tail=b"\x00\x3c\x04\x17\x01\x17\x01\x00\x00"),
     ProtocolError, R.PROTOCOL_ERROR, 5),
    ("will-only property in CONNECT", connect_body(tail=b"\x00\x3c\x05\x18\x00\x00\x00\x01\x00\x00"),
     MalformedPacket, R.MALFORMED_PACKET, 5),
    ("will topic wildcard", connect_body(flags=0x06, tail=b"\x00\x3c\x00\x00\x00\x00\x00\x03a/#\x00\x00"),
     ProtocolError, R.TOPIC_NAME_INVALID, 5),
    ("will topic empty", connect_body(level=4, flags=0x06, tail=b"\x00\x3c\x00\x00\x00\x00\x00\x00"),
     ProtocolError, R.TOPIC_NAME_INVALID, 4),
    ("will payload not utf-8", connect_body(flags=0x06, tail=b"\x00\x3c\x00\x00\x00\x02\x01\x01"
                                            b"\x00\x01t\x00\x01\xff"),
     ProtocolError, R.PAYLOAD_FORMAT_INVALID, 5),
]


@pytest.mark.parametrize("name, body, exc, reason, version", CONNECT_ERRORS,
                         ids=[c[0] for c in CONNECT_ERRORS])
def test_connect_refusals_carry_reason_code_and_known_version(name, body, exc, reason, version):
    err = raises(exc, reason, decode_connect, body)
    assert err.protocol_version == version
    # The reader reports the same error for the whole packet.
    err2 = raises(exc, reason, read_all, connect_packet(body))
    assert err2.protocol_version == version


def test_will_rules_shared_with_publish():
    bad = Connect(MQTT_5, "c", will=Will("w", b"", properties={P.RESPONSE_TOPIC: "r/+"}))
    err = raises(ProtocolError, R.PROTOCOL_ERROR, decode_connect, bad.encode()[2:])
    assert err.protocol_version == MQTT_5
    # Declared UTF-8 asks for well-formed UTF-8 only, and U+0000 is well-formed.
    nul = Connect(MQTT_5, "c", will=Will("w", b"a\x00b", properties={
        P.PAYLOAD_FORMAT_INDICATOR: 1}))
    assert decode_connect(nul.encode()[2:]) == nul


def test_every_packet_class_names_its_type():
    import pairmq.appliance.mqtt as mqtt
    samples = {"Connect": (MQTT_5, "c"), "Publish": ("t",), "Subscribe": (1, (Subscription("f"),)),
               "Suback": (1, (0,)), "Unsubscribe": (1, ("f",))}
    named = [name for name in mqtt.__all__ if isinstance(getattr(mqtt, name), type)
             and hasattr(getattr(mqtt, name), "encode") and name != "PublishTemplate"]
    assert len(named) == 15  # every MQTT packet type but the reserved 0
    for name in named:
        args = samples.get(name, (1,) if name.startswith(("Pub", "Unsuback")) else ())
        assert getattr(mqtt, name)(*args).packet_type.name == name.upper(), name


def test_v5_password_without_user_name_is_allowed():
    body = connect_body(flags=0x42, tail=b"\x00\x3c\x00\x00\x00\x00\x02pw")
    assert decode_connect(body).password == b"pw"


# --- fixed header and the reader's order rules ------------------------------------

@pytest.mark.parametrize("first, version", [
    (0x00, None), (0x0F, None),                 # type 0 reserved
    (0xC1, MQTT_5), (0xE8, MQTT_5), (0x20 | 1, MQTT_5),  # fixed flags wrong
    (0x60, MQTT_5), (0x80, MQTT_5), (0xA0, MQTT_5),      # PUBREL/SUBSCRIBE/UNSUBSCRIBE need 0b0010
    (0x36, MQTT_5),                              # PUBLISH QoS 3
    (0xF0, MQTT_3_1_1),                          # AUTH is reserved in 3.1.1
])
def test_bad_first_byte_is_refused_before_the_length_arrives(first, version):
    raises(MalformedPacket, R.MALFORMED_PACKET, parse_fixed_header, bytes([first]), version)


def test_fixed_flags_that_are_right_pass():
    for first in (0x62, 0x82, 0xA2, 0x30, 0x3B, 0xF0):
        assert parse_fixed_header(bytes([first, 0]), MQTT_5) is not None


def v5_session(*packets: bytes) -> bytes:
    return Connect(MQTT_5, "c").encode() + b"".join(packets)


@pytest.mark.parametrize("stream, exc, reason", [
    (PingReq().encode(5), ProtocolError, R.PROTOCOL_ERROR),             # not CONNECT first
    (v5_session(Connect(MQTT_5, "again").encode()), ProtocolError, R.PROTOCOL_ERROR),
    (v5_session(Connack().encode(5)), ProtocolError, R.PROTOCOL_ERROR),  # server-only
    (v5_session(PingResp().encode(5)), ProtocolError, R.PROTOCOL_ERROR),
    (v5_session(b"\x90\x03\x00\x01\x00"), ProtocolError, R.PROTOCOL_ERROR),  # SUBACK
    (v5_session(b"\xc0\x01\x00"), MalformedPacket, R.MALFORMED_PACKET),  # PINGREQ with a body
    (v5_session(b"\xe0\x01\x05"), MalformedPacket, R.MALFORMED_PACKET),  # no such reason code
    (v5_session(b"\xe0\x03\x00\x01\x00"), MalformedPacket, R.MALFORMED_PACKET),  # trailing byte
    (v5_session(b"\xe0\x02\x00\x02"), MalformedPacket, R.MALFORMED_PACKET),  # props cut short
    (Connect(MQTT_3_1_1, "c").encode() + b"\xe0\x01\x00", MalformedPacket, R.MALFORMED_PACKET),
])
def test_reader_order_and_body_rules(stream, exc, reason):
    reader = PacketReader()
    reader.feed(stream)
    seen = []
    with pytest.raises(exc) as info:
        while (packet := reader.next_packet()) is not None:
            seen.append(packet)
    assert info.value.reason_code == reason
    assert all(isinstance(p, Connect) for p in seen) and len(seen) <= 1


def test_reader_error_is_sticky_and_drops_the_buffer():
    reader = PacketReader()
    reader.feed(Connect(MQTT_5, "c").encode())
    reader.next_packet()
    reader.feed(b"\xc1\x00" + b"x" * 1000)
    first = raises(MalformedPacket, R.MALFORMED_PACKET, reader.next_packet)
    assert first.protocol_version == MQTT_5 and reader.buffered_bytes == 0
    reader.feed(PingReq().encode(5))
    assert reader.buffered_bytes == 0
    with pytest.raises(MalformedPacket) as again:
        reader.next_packet()
    assert again.value is first


def test_every_client_packet_type_decodes_after_connect():
    publish = b"\x32\x07\x00\x01t\x00\x01\x00p"
    auth = b"\xf0\x00"
    packets = read_all(v5_session(publish, auth, b"\x62\x02\x00\x01"))
    assert packets[1:] == [Publish("t", b"p", 1, packet_id=1), Auth(), Pubrel(1)]
    assert packets[1].encode(MQTT_5) == publish
    assert [p.packet_type for p in packets] == [
        PacketType.CONNECT, PacketType.PUBLISH, PacketType.AUTH, PacketType.PUBREL]


# --- incremental input ----------------------------------------------------------------

def test_byte_by_byte_gives_the_same_packets_and_nothing_early():
    stream = v5_session(PingReq().encode(5), b"\x82\x07\x00\x01\x00\x00\x01t\x00",
                        Disconnect(R.DISCONNECT_WITH_WILL_MESSAGE,
                                   {P.REASON_STRING: "bye"}).encode(5))
    whole = read_all(stream)
    assert [type(p).__name__ for p in whole] == [
        "Connect", "PingReq", "Subscribe", "Disconnect"]
    assert whole[2] == Subscribe(1, (Subscription("t"),))
    reader = PacketReader()
    got, ends = [], set()
    offset = 0
    for _ in whole:  # where each packet ends in the stream
        h = parse_fixed_header(stream[offset:], MQTT_5)
        offset += h.packet_size
        ends.add(offset)
    for i in range(len(stream)):
        reader.feed(stream[i:i + 1])
        packet = reader.next_packet()
        if packet is None:
            assert i + 1 not in ends
        else:
            assert i + 1 in ends
            got.append(packet)
    assert got == whole and reader.buffered_bytes == 0


@pytest.mark.parametrize("packet", CONNECTS)
def test_every_strict_prefix_of_a_connect_waits_for_more(packet):
    data = packet.encode()
    for n in range(len(data)):
        reader = PacketReader()
        reader.feed(data[:n])
        assert reader.next_packet() is None


# --- packet size limits ------------------------------------------------------------

def test_oversized_packet_is_refused_from_its_header_alone():
    reader = PacketReader(max_packet_size=64)
    reader.feed(b"\x10\xe8\x07")  # CONNECT claiming 1000 bytes, no body sent
    err = raises(ProtocolError, R.PACKET_TOO_LARGE, reader.next_packet)
    assert "1003" in err.message and reader.buffered_bytes == 0


def test_default_limit_is_one_mebibyte_and_counts_the_header():
    reader = PacketReader()
    assert reader.max_packet_size == DEFAULT_MAX_PACKET_SIZE == 1 << 20
    reader.feed(b"\x10\xff\xff\xff\x7f")  # the largest length MQTT can express
    raises(ProtocolError, R.PACKET_TOO_LARGE, reader.next_packet)
    body_len = (1 << 20) - 4  # 1 type byte + 3 length bytes + body = 1 MiB exactly
    at_limit = b"\x30" + encode_vbi(body_len)
    reader = PacketReader()
    reader.feed(Connect(MQTT_3_1_1, "c").encode() + at_limit)
    reader.next_packet()
    assert reader.next_packet() is None  # waiting for the body, not refusing
    reader = PacketReader()
    reader.feed(Connect(MQTT_3_1_1, "c").encode() + b"\x30" + encode_vbi(body_len + 1))
    reader.next_packet()
    raises(ProtocolError, R.PACKET_TOO_LARGE, reader.next_packet)


def test_max_packet_size_is_validated():
    for bad in (0, 15, 268_435_461):
        with pytest.raises(ValueError):
            PacketReader(max_packet_size=bad)


# --- fuzz -------------------------------------------------------------------------------

FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
PREFIXES = [b"", Connect(MQTT_5, "c").encode(), Connect(MQTT_3_1_1, "c").encode()]


def drain(reader: PacketReader) -> None:
    for _ in range(10_000):
        if reader.next_packet() is None:
            return


@FUZZ
@given(prefix=st.sampled_from(PREFIXES), data=st.binary(max_size=300),
       chunk=st.integers(min_value=1, max_value=64))
def test_random_bytes_raise_only_codec_errors(prefix, data, chunk):
    reader = PacketReader(max_packet_size=256)
    stream = prefix + data
    try:
        for i in range(0, len(stream), chunk):
            reader.feed(stream[i:i + chunk])
            drain(reader)
    except MqttError:
        pass
    assert reader.buffered_bytes <= 256 + chunk


@FUZZ
@given(base=st.sampled_from(CONNECTS), data=st.data())
def test_mutated_connects_raise_only_codec_errors(base, data):
    raw = bytearray(base.encode())
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(raw)))
    try:
        decode_connect(bytes(raw[2:cut]))
    except MqttError:
        pass


@FUZZ
@given(body=st.binary(max_size=64),
       scope=st.sampled_from(sorted(set(PacketType) | {WILL}, key=str)))
def test_random_property_blocks_raise_only_codec_errors(body, scope):
    try:
        decode_properties(Cursor(encode_vbi(len(body)) + body), scope)
    except MqttError:
        pass

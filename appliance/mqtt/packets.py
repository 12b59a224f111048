"""MQTT acknowledgements, subscriptions and AUTH (§3.4-3.11, §3.15).

Rules (each a Malformed Packet 0x81 unless another code is named):

- PUBACK, PUBREC, PUBREL, PUBCOMP: a Packet Identifier (0 is malformed).
  3.1.1: nothing else. 5.0: then a reason code from the packet's table and a
  property block (Reason String, User Property); Remaining Length 2 means
  reason 0x00 without properties, 3 a reason without properties. We send the
  shortest form. PUBREL's flags must be 0b0010 (the fixed-header parser).
- SUBSCRIBE: Packet Identifier; 5.0 properties (Subscription Identifier
  1..268,435,455 at most once, User Property); then one or more (topic
  filter, options) pairs, none being 0x82. 3.1.1 options: requested QoS 0-2
  and every other bit 0, else malformed. 5.0 options: Maximum QoS (3 is
  0x82), No Local, Retain As Published, Retain Handling (3 is 0x82), bits 6-7
  reserved (malformed). Filters are decoded as UTF-8 strings only: their
  syntax is the broker's (appliance/broker/topics.py).
- SUBACK: Packet Identifier, 5.0 properties, one code per filter (none is
  0x82). 3.1.1 return codes are 0, 1, 2 and 0x80; we hold v5 reason codes
  and send any failure to a 3.1.1 client as 0x80.
- UNSUBSCRIBE: Packet Identifier, 5.0 properties (User Property), one or
  more topic filters (none is 0x82).
- UNSUBACK: Packet Identifier; 5.0 adds properties and one reason code per
  filter (none is 0x82); 3.1.1 has nothing after the identifier.
- AUTH (5.0 only; type 15 is reserved in 3.1.1): reason 0x00, 0x18 or 0x19
  and properties; Remaining Length 0 means 0x00 without properties. Any
  longer AUTH must carry an Authentication Method (0x82, §3.15.2.2.2).
- A reason code outside its packet's table is malformed, as are bytes left
  over after the last field.
- Compiled (docs/build.md): each class's `packet_type` is a property, not a
  ClassVar (a compiled dataclass makes a ClassVar a field). The acks, one per
  QoS 1/2 message each way, have explicit `__init__`s and `Final` fields
  instead of a runtime `frozen=True`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final
from pairmq.appliance.mqtt.properties import (
    Properties, PropertyId, decode_properties, encode_properties,
)
from pairmq.appliance.mqtt.wire import (
    MQTT_3_1_1, MQTT_5, Cursor, PacketType, ReasonCode, check_version,
    encode_u16, encode_utf8, fixed_header, malformed, protocol_error,
)

_R = ReasonCode
_PUBACK_CODES = (0x00, 0x10, 0x80, 0x83, 0x87, 0x90, 0x91, 0x97, 0x99)
PUBACK_REASON_CODES = frozenset(_R(c) for c in _PUBACK_CODES)
PUBREC_REASON_CODES = PUBACK_REASON_CODES
PUBREL_REASON_CODES = frozenset({_R.SUCCESS, _R.PACKET_IDENTIFIER_NOT_FOUND})
PUBCOMP_REASON_CODES = PUBREL_REASON_CODES
SUBACK_REASON_CODES = frozenset(_R(c) for c in (
    0x00, 0x01, 0x02, 0x80, 0x83, 0x87, 0x8F, 0x91, 0x97, 0x9E, 0xA1, 0xA2))
UNSUBACK_REASON_CODES = frozenset(_R(c) for c in (0x00, 0x11, 0x80, 0x83, 0x87, 0x8F, 0x91))
AUTH_REASON_CODES = frozenset({_R.SUCCESS, _R.CONTINUE_AUTHENTICATION, _R.RE_AUTHENTICATE})
V311_SUBACK_FAILURE = 0x80
_REASONS = {c.value: c for c in ReasonCode}  # a dict hit is cheaper than ReasonCode(c)


def _encode_packet_id(packet_id: int) -> bytes:
    if not 0 < packet_id < 0x10000:
        raise ValueError(f"packet identifier must be 1..65535, got {packet_id}")
    return encode_u16(packet_id)


def _v5_reason(code: int, table: frozenset[ReasonCode], name: str) -> ReasonCode:
    if code not in table:
        raise malformed(f"0x{code:02X} is not a {name} reason code")
    return _REASONS[code]


def _end(c: Cursor, name: str) -> None:
    if not c.at_end():
        raise malformed(f"{c.remaining} bytes after the {name}")


# --- PUBACK, PUBREC, PUBREL, PUBCOMP -----------------------------------------

@dataclass(slots=True, init=False)
class _PubAck:
    packet_id: Final[int]
    reason_code: Final[int]
    properties: Final[Properties]

    def __init__(self, packet_id: int, reason_code: int = ReasonCode.SUCCESS,
                 properties: Properties | None = None) -> None:
        self.packet_id = packet_id
        self.reason_code = reason_code
        self.properties = {} if properties is None else properties

    @property
    def packet_type(self) -> PacketType:
        raise NotImplementedError

    def encode(self, protocol_version: int) -> bytes:
        check_version(protocol_version)
        t = self.packet_type
        body = _encode_packet_id(self.packet_id)
        if protocol_version == MQTT_3_1_1:
            if self.reason_code or self.properties:
                raise ValueError(f"a 3.1.1 {t.name} has no reason code or properties")
        else:
            if self.reason_code not in ACK_REASON_CODES[t]:
                raise ValueError(f"0x{self.reason_code:02X} is not a {t.name} reason code")
            if self.properties:
                body += bytes([self.reason_code]) + encode_properties(self.properties, t)
            elif self.reason_code:
                body += bytes([self.reason_code])
        flags = 0b0010 if t == PacketType.PUBREL else 0
        return fixed_header(t, flags, len(body)) + body


class Puback(_PubAck):
    @property
    def packet_type(self) -> PacketType:
        return PacketType.PUBACK


class Pubrec(_PubAck):
    @property
    def packet_type(self) -> PacketType:
        return PacketType.PUBREC


class Pubrel(_PubAck):
    @property
    def packet_type(self) -> PacketType:
        return PacketType.PUBREL


class Pubcomp(_PubAck):
    @property
    def packet_type(self) -> PacketType:
        return PacketType.PUBCOMP


PubAckPacket = Puback | Pubrec | Pubrel | Pubcomp
ACK_CLASSES: Final[dict[PacketType, type[PubAckPacket]]] = {
    PacketType.PUBACK: Puback, PacketType.PUBREC: Pubrec, PacketType.PUBREL: Pubrel, PacketType.PUBCOMP: Pubcomp}
ACK_REASON_CODES: Final[dict[PacketType, frozenset[ReasonCode]]] = {
    PacketType.PUBACK: PUBACK_REASON_CODES, PacketType.PUBREC: PUBREC_REASON_CODES,
    PacketType.PUBREL: PUBREL_REASON_CODES, PacketType.PUBCOMP: PUBCOMP_REASON_CODES}


def decode_ack(packet_type: PacketType, body: bytes, protocol_version: int) -> PubAckPacket:
    """PUBACK, PUBREC, PUBREL or PUBCOMP, chosen by `packet_type`."""
    cls = ACK_CLASSES[packet_type]
    n = len(body)
    if n < 2 or (n > 2 and protocol_version == MQTT_3_1_1):
        raise malformed(f"{packet_type.name} with a {n}-byte body")
    packet_id = (body[0] << 8) | body[1]
    if not packet_id:
        raise malformed("packet identifier 0")
    if n == 2:
        return cls(packet_id)
    reason = _v5_reason(body[2], ACK_REASON_CODES[packet_type], packet_type.name)
    if n == 3:
        return cls(packet_id, reason)
    c = Cursor(body, 3)
    props = decode_properties(c, packet_type)
    _end(c, packet_type.name)
    return cls(packet_id, reason, props)


# --- SUBSCRIBE, SUBACK --------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Subscription:
    """One topic filter and its options; 3.1.1 has only `qos`."""

    topic_filter: str
    qos: int = 0  # the maximum QoS granted to this subscription
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0

    def options_byte(self, protocol_version: int) -> int:
        if self.qos not in (0, 1, 2) or self.retain_handling not in (0, 1, 2):
            raise ValueError(f"bad subscription options {self}")
        extra = (self.no_local << 2) | (self.retain_as_published << 3) | (self.retain_handling << 4)
        if protocol_version == MQTT_3_1_1 and extra:
            raise ValueError("3.1.1 subscriptions have a QoS and nothing else")
        return self.qos | extra


@dataclass(frozen=True, slots=True)
class Subscribe:
    packet_id: int
    subscriptions: tuple[Subscription, ...]
    properties: Properties = field(default_factory=dict)

    @property
    def packet_type(self) -> PacketType:
        return PacketType.SUBSCRIBE

    def encode(self, protocol_version: int) -> bytes:
        check_version(protocol_version)
        if not self.subscriptions:
            raise ValueError("SUBSCRIBE needs at least one topic filter")
        body = _encode_packet_id(self.packet_id) + _properties(self, protocol_version)
        for s in self.subscriptions:
            body += encode_utf8(s.topic_filter) + bytes([s.options_byte(protocol_version)])
        return fixed_header(PacketType.SUBSCRIBE, 0b0010, len(body)) + body


def _properties(packet: Subscribe | Suback | Unsubscribe | Unsuback,
                protocol_version: int) -> bytes:
    if protocol_version == MQTT_5:
        return encode_properties(packet.properties, packet.packet_type)
    if packet.properties:
        raise ValueError("3.1.1 has no properties")
    return b""


def decode_subscribe(body: bytes, protocol_version: int) -> Subscribe:
    c = Cursor(body)
    packet_id = c.packet_id()
    props = decode_properties(c, PacketType.SUBSCRIBE) if protocol_version == MQTT_5 else {}
    subscriptions = []
    while not c.at_end():
        topic_filter = c.utf8("topic filter")
        options = c.u8("subscription options")
        subscriptions.append(_decode_options(topic_filter, options, protocol_version))
    if not subscriptions:
        raise protocol_error("SUBSCRIBE without a topic filter")
    return Subscribe(packet_id, tuple(subscriptions), props)


def _decode_options(topic_filter: str, options: int, protocol_version: int) -> Subscription:
    qos = options & 0b11
    if protocol_version == MQTT_3_1_1:
        if options & 0xFC or qos == 3:
            raise malformed(f"3.1.1 requested QoS byte 0x{options:02X}")
        return Subscription(topic_filter, qos)
    if options & 0xC0:
        raise malformed(f"reserved subscription option bits set in 0x{options:02X}")
    if qos == 3:
        raise protocol_error("subscription with maximum QoS 3")
    retain_handling = (options >> 4) & 0b11
    if retain_handling == 3:
        raise protocol_error("subscription with retain handling 3")
    return Subscription(topic_filter, qos, bool(options & 0x04), bool(options & 0x08),
                        retain_handling)


@dataclass(frozen=True, slots=True)
class Suback:
    """`reason_codes` are v5 codes, one per filter, whatever the version."""

    packet_id: int
    reason_codes: tuple[int, ...]
    properties: Properties = field(default_factory=dict)

    @property
    def packet_type(self) -> PacketType:
        return PacketType.SUBACK

    def encode(self, protocol_version: int) -> bytes:
        check_version(protocol_version)
        codes = _check_codes(self.reason_codes, SUBACK_REASON_CODES, "SUBACK")
        if protocol_version == MQTT_3_1_1:
            codes = bytes(c if c < 0x80 else V311_SUBACK_FAILURE for c in codes)
        body = _encode_packet_id(self.packet_id) + _properties(self, protocol_version) + codes
        return fixed_header(PacketType.SUBACK, 0, len(body)) + body


def _check_codes(codes: tuple[int, ...], table: frozenset[ReasonCode], name: str) -> bytes:
    if not codes:
        raise ValueError(f"{name} needs one reason code per topic filter")
    for code in codes:
        if code not in table:
            raise ValueError(f"0x{code:02X} is not a {name} reason code")
    return bytes(codes)


def decode_suback(body: bytes, protocol_version: int) -> Suback:
    c = Cursor(body)
    packet_id = c.packet_id()
    if protocol_version == MQTT_3_1_1:
        raw = c.take(c.remaining, "return codes")
        for code in raw:
            if code not in (0, 1, 2, V311_SUBACK_FAILURE):
                raise malformed(f"SUBACK return code 0x{code:02X}")
        props: dict[PropertyId, object] = {}
        codes = tuple(_REASONS[code] for code in raw)
    else:
        props = decode_properties(c, PacketType.SUBACK)
        raw = c.take(c.remaining, "reason codes")
        codes = tuple(_v5_reason(code, SUBACK_REASON_CODES, "SUBACK") for code in raw)
    if not codes:
        raise protocol_error("SUBACK without a reason code")
    return Suback(packet_id, codes, props)


# --- UNSUBSCRIBE, UNSUBACK ------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Unsubscribe:
    packet_id: int
    topic_filters: tuple[str, ...]
    properties: Properties = field(default_factory=dict)

    @property
    def packet_type(self) -> PacketType:
        return PacketType.UNSUBSCRIBE

    def encode(self, protocol_version: int) -> bytes:
        check_version(protocol_version)
        if not self.topic_filters:
            raise ValueError("UNSUBSCRIBE needs at least one topic filter")
        body = _encode_packet_id(self.packet_id) + _properties(self, protocol_version) \
            + b"".join(encode_utf8(f) for f in self.topic_filters)
        return fixed_header(PacketType.UNSUBSCRIBE, 0b0010, len(body)) + body


def decode_unsubscribe(body: bytes, protocol_version: int) -> Unsubscribe:
    c = Cursor(body)
    packet_id = c.packet_id()
    props = decode_properties(c, PacketType.UNSUBSCRIBE) if protocol_version == MQTT_5 else {}
    filters = []
    while not c.at_end():
        filters.append(c.utf8("topic filter"))
    if not filters:
        raise protocol_error("UNSUBSCRIBE without a topic filter")
    return Unsubscribe(packet_id, tuple(filters), props)


@dataclass(frozen=True, slots=True)
class Unsuback:
    """5.0: one reason code per filter. 3.1.1: none, and no properties."""

    packet_id: int
    reason_codes: tuple[int, ...] = ()
    properties: Properties = field(default_factory=dict)

    @property
    def packet_type(self) -> PacketType:
        return PacketType.UNSUBACK

    def encode(self, protocol_version: int) -> bytes:
        check_version(protocol_version)
        body = _encode_packet_id(self.packet_id) + _properties(self, protocol_version)
        if protocol_version == MQTT_5:
            body += _check_codes(self.reason_codes, UNSUBACK_REASON_CODES, "UNSUBACK")
        elif self.reason_codes:
            raise ValueError("a 3.1.1 UNSUBACK has no reason codes")
        return fixed_header(PacketType.UNSUBACK, 0, len(body)) + body


def decode_unsuback(body: bytes, protocol_version: int) -> Unsuback:
    c = Cursor(body)
    packet_id = c.packet_id()
    if protocol_version == MQTT_3_1_1:
        _end(c, "3.1.1 UNSUBACK packet identifier")
        return Unsuback(packet_id)
    props = decode_properties(c, PacketType.UNSUBACK)
    raw = c.take(c.remaining, "reason codes")
    if not raw:
        raise protocol_error("UNSUBACK without a reason code")
    codes = tuple(_v5_reason(code, UNSUBACK_REASON_CODES, "UNSUBACK") for code in raw)
    return Unsuback(packet_id, codes, props)


# --- AUTH ---------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Auth:
    reason_code: int = ReasonCode.SUCCESS
    properties: Properties = field(default_factory=dict)

    @property
    def packet_type(self) -> PacketType:
        return PacketType.AUTH

    def encode(self, protocol_version: int) -> bytes:
        if protocol_version != MQTT_5:
            raise ValueError("AUTH exists only in MQTT 5")
        if self.reason_code not in AUTH_REASON_CODES:
            raise ValueError(f"0x{self.reason_code:02X} is not an AUTH reason code")
        body = b""
        if self.reason_code or self.properties:
            if PropertyId.AUTHENTICATION_METHOD not in self.properties:
                raise ValueError("AUTH needs an authentication method")
            body = bytes([self.reason_code]) + encode_properties(self.properties, PacketType.AUTH)
        return fixed_header(PacketType.AUTH, 0, len(body)) + body


def decode_auth(body: bytes, protocol_version: int) -> Auth:
    if protocol_version != MQTT_5:
        raise malformed("packet type 15 is reserved in MQTT 3.1.1")
    if not body:
        return Auth()
    c = Cursor(body)
    reason = _v5_reason(c.u8("reason code"), AUTH_REASON_CODES, "AUTH")
    props = decode_properties(c, PacketType.AUTH) if not c.at_end() else {}
    _end(c, "AUTH")
    if PropertyId.AUTHENTICATION_METHOD not in props:
        raise protocol_error("AUTH without an authentication method")
    return Auth(reason, props)

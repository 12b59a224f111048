"""Sans-I/O MQTT 3.1.1 / 5.0 packet codec for the broker's front door.

Rules (each a Malformed Packet 0x81 unless another code is named):

- Fixed header: packet type (high nibble), flags (low nibble), Remaining
  Length as a VBI. Type 0 is reserved, and so is 15 in 3.1.1. Flags are fixed
  per type: PUBREL/SUBSCRIBE/UNSUBSCRIBE 0b0010, PUBLISH free except QoS 3,
  every other type 0.
- Packet size is the fixed header plus the Remaining Length. Above
  `max_packet_size` it is 0x95, raised as soon as the header is read, before a
  byte of the body is waited for.
- Before authentication a client gets a smaller budget (the reader's
  `max_connect_size` and `max_connect_properties`): a CONNECT larger than the
  first, or holding more properties in one block than the second, is 0x95,
  the size again from the fixed header alone, so an unauthenticated peer
  never has more than `max_connect_size` bytes buffered.
- Every other packet has its own module and rules: PUBLISH in `publish`,
  the acknowledgements, SUBSCRIBE/UNSUBSCRIBE and AUTH in `packets`.
- CONNECT: protocol name "MQTT" with level 4 (3.1.1) or 5 (5.0). Any other
  level, or "MQIsdp" (3.1), is 0x84; any other name is malformed. Malformed
  too: the reserved flag set, Will QoS 3, Will QoS/Retain without the Will
  flag, a password without a user name (3.1.1), bytes after the payload.
  Authentication Data without a Method is 0x82; a Will Topic that is empty or
  holds a wildcard is 0x90, a will Response Topic with a wildcard 0x82; a
  will payload declared UTF-8 that is not well-formed UTF-8 is 0x99.
- CONNACK: we hold the v5 reason code; 3.1.1 maps it to return codes 0-5
  (`V311_RETURN_CODES`). Session present must be 0 on a refusal.
- DISCONNECT: empty in 3.1.1. In 5.0 the reason code (default 0x00) and the
  properties may be omitted; a code outside the DISCONNECT table is malformed.
- PINGREQ/PINGRESP: empty bodies.
- PacketReader reads what a client sends a server: the first packet must be
  CONNECT, a second CONNECT is 0x82, and so are the packets only a server
  sends (CONNACK, SUBACK, UNSUBACK, PINGRESP). Its PUBLISHes are decoded
  `from_client`. After an error the reader is dead and raises the same error
  again.
- Compiled (docs/build.md): each packet class's `packet_type` is a property,
  not a ClassVar (a compiled dataclass makes a ClassVar a field).
- `encode_packet` to a peer with a Maximum Packet Size drops Reason String
  and User Property from the packets that may lose them (§3.1.2.11.4:
  CONNACK, the acks, DISCONNECT, AUTH), never from a PUBLISH, whose User
  Properties belong to the application message; still too big is None.

Theory of operation: `feed(bytes)` appends; `next_packet()` returns one
decoded packet or None when it needs more bytes. A caller that drains
`next_packet()` after each `feed()` never has more buffered than one
incomplete packet (at most `max_packet_size`) plus the last chunk fed.
Consumed bytes are skipped with an offset and compacted at the next `feed()`,
so a chunk of many small packets costs one copy, not one per packet.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from collections.abc import Callable
from typing import Final

from pairmq.appliance.mqtt.packets import (
    ACK_CLASSES, Auth, Puback, Pubcomp, Pubrec, Pubrel, Suback, Subscribe,
    Subscription, Unsuback, Unsubscribe, decode_ack, decode_auth, decode_suback,
    decode_subscribe, decode_unsuback, decode_unsubscribe,
)
from pairmq.appliance.mqtt.properties import (
    WILL, Properties, PropertyId, decode_properties, encode_properties,
)
from pairmq.appliance.mqtt.publish import (
    Publish, PublishTemplate, check_response_topic, decode_publish,
)
from pairmq.appliance.mqtt.wire import (
    MQTT_3_1_1, MQTT_5, SUPPORTED_VERSIONS, VBI_MAX, Cursor, MqttError,
    PacketType, ProtocolError, ReasonCode, check_topic_name, check_version,
    encode_binary, encode_u8, encode_u16, encode_utf8, fixed_header, is_utf8,
    malformed, parse_vbi, protocol_error,
)

__all__ = [  # the codec's API, including what it re-exports from publish and packets
    "CONNACK_REASON_CODES", "DEFAULT_MAX_PACKET_SIZE", "DISCONNECT_REASON_CODES",
    "MAX_MAX_PACKET_SIZE", "MIN_MAX_PACKET_SIZE", "SUPPORTED_VERSIONS", "V311_RETURN_CODES", "Auth", "Connack", "Connect", "Disconnect", "FixedHeader",
    "Packet", "PacketReader", "PingReq", "PingResp", "Puback", "Pubcomp", "Publish",
    "PublishTemplate", "Pubrec", "Pubrel", "Suback", "Subscribe", "Subscription",
    "Unsuback", "Unsubscribe", "Will", "check_topic_name", "decode_connack",
    "decode_connect", "decode_disconnect", "decode_packet", "encode_packet",
    "parse_fixed_header",
]

DEFAULT_MAX_PACKET_SIZE = 1 << 20
MIN_MAX_PACKET_SIZE = 16
MAX_MAX_PACKET_SIZE = 1 + 4 + VBI_MAX

_R = ReasonCode
V311_RETURN_CODES: dict[int, int] = {
    _R.SUCCESS: 0,
    _R.UNSUPPORTED_PROTOCOL_VERSION: 1,
    _R.CLIENT_IDENTIFIER_NOT_VALID: 2,
    _R.SERVER_UNAVAILABLE: 3, _R.SERVER_BUSY: 3, _R.USE_ANOTHER_SERVER: 3,
    _R.SERVER_MOVED: 3, _R.CONNECTION_RATE_EXCEEDED: 3,
    _R.BAD_USER_NAME_OR_PASSWORD: 4, _R.BAD_AUTHENTICATION_METHOD: 4,
    _R.NOT_AUTHORIZED: 5, _R.BANNED: 5,
}
_V311_TO_REASON = {0: _R.SUCCESS, 1: _R.UNSUPPORTED_PROTOCOL_VERSION,
                   2: _R.CLIENT_IDENTIFIER_NOT_VALID, 3: _R.SERVER_UNAVAILABLE,
                   4: _R.BAD_USER_NAME_OR_PASSWORD, 5: _R.NOT_AUTHORIZED}
CONNACK_REASON_CODES = frozenset(_R(c) for c in (
    0x00, 0x80, 0x81, 0x82, 0x83, 0x84, 0x85, 0x86, 0x87, 0x88, 0x89, 0x8A,
    0x8C, 0x90, 0x95, 0x97, 0x99, 0x9A, 0x9B, 0x9C, 0x9D, 0x9F))
DISCONNECT_REASON_CODES = frozenset(_R(c) for c in (
    0x00, 0x04, 0x80, 0x81, 0x82, 0x83, 0x87, 0x89, 0x8B, 0x8D, 0x8E, 0x8F,
    0x90, 0x93, 0x94, 0x95, 0x96, 0x97, 0x98, 0x99, 0x9A, 0x9B, 0x9C, 0x9D,
    0x9E, 0x9F, 0xA0, 0xA1, 0xA2))

_FIXED_FLAGS: Final = {t: 0 for t in PacketType} | {
    PacketType.PUBREL: 0b0010, PacketType.SUBSCRIBE: 0b0010,
    PacketType.UNSUBSCRIBE: 0b0010, PacketType.PUBLISH: None}
_SERVER_ONLY: Final = frozenset({PacketType.CONNACK, PacketType.SUBACK,
                          PacketType.UNSUBACK, PacketType.PINGRESP})


# --- packets ----------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Will:
    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    properties: Properties = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Connect:
    protocol_version: int
    client_id: str
    clean_start: bool = True
    keep_alive_s: int = 60
    will: Will | None = None
    username: str | None = None
    password: bytes | None = None
    properties: Properties = field(default_factory=dict)

    @property
    def packet_type(self) -> PacketType:
        return PacketType.CONNECT

    def encode(self, protocol_version: int | None = None) -> bytes:
        v = self.protocol_version
        if protocol_version not in (None, v) or v not in SUPPORTED_VERSIONS:
            raise ValueError(f"cannot encode a level-{v} CONNECT as level {protocol_version}")
        if v == MQTT_3_1_1 and (self.properties or (self.will and self.will.properties)):
            raise ValueError("3.1.1 has no properties")
        if v == MQTT_3_1_1 and self.password is not None and self.username is None:
            raise ValueError("3.1.1 needs a user name to send a password")
        flags = (self.clean_start << 1) | ((self.username is not None) << 7) \
            | ((self.password is not None) << 6)
        if self.will is not None:
            flags |= 0b100 | (self.will.qos << 3) | (self.will.retain << 5)
        body = encode_utf8("MQTT") + encode_u8(v) + encode_u8(flags) + encode_u16(self.keep_alive_s)
        if v == MQTT_5:
            body += encode_properties(self.properties, PacketType.CONNECT)
        body += encode_utf8(self.client_id)
        if self.will is not None:
            if v == MQTT_5:
                body += encode_properties(self.will.properties, WILL)
            body += encode_utf8(self.will.topic) + encode_binary(self.will.payload)
        if self.username is not None:
            body += encode_utf8(self.username)
        if self.password is not None:
            body += encode_binary(self.password)
        return fixed_header(PacketType.CONNECT, 0, len(body)) + body


@dataclass(frozen=True, slots=True)
class Connack:
    reason_code: int = ReasonCode.SUCCESS
    session_present: bool = False
    properties: Properties = field(default_factory=dict)

    @property
    def packet_type(self) -> PacketType:
        return PacketType.CONNACK

    def encode(self, protocol_version: int) -> bytes:
        if self.session_present and self.reason_code != ReasonCode.SUCCESS:
            raise ValueError("session present must be 0 on a refused CONNACK")
        if protocol_version == MQTT_3_1_1:
            if self.reason_code not in V311_RETURN_CODES:
                raise ValueError(f"reason 0x{self.reason_code:02X} has no 3.1.1 return code")
            body = bytes([self.session_present, V311_RETURN_CODES[self.reason_code]])
        else:
            check_version(protocol_version)
            if self.reason_code not in CONNACK_REASON_CODES:
                raise ValueError(f"0x{self.reason_code:02X} is not a CONNACK reason code")
            body = bytes([self.session_present, self.reason_code]) \
                + encode_properties(self.properties, PacketType.CONNACK)
        return fixed_header(PacketType.CONNACK, 0, len(body)) + body


@dataclass(frozen=True, slots=True)
class Disconnect:
    reason_code: int = ReasonCode.SUCCESS
    properties: Properties = field(default_factory=dict)

    @property
    def packet_type(self) -> PacketType:
        return PacketType.DISCONNECT

    def encode(self, protocol_version: int) -> bytes:
        if protocol_version == MQTT_3_1_1:
            if self.reason_code or self.properties:
                raise ValueError("a 3.1.1 DISCONNECT has no reason code or properties")
            body = b""
        else:
            check_version(protocol_version)
            if self.reason_code not in DISCONNECT_REASON_CODES:
                raise ValueError(f"0x{self.reason_code:02X} is not a DISCONNECT reason code")
            body = b""
            if self.reason_code or self.properties:
                body = bytes([self.reason_code]) \
                    + encode_properties(self.properties, PacketType.DISCONNECT)
        return fixed_header(PacketType.DISCONNECT, 0, len(body)) + body


@dataclass(frozen=True, slots=True)
class PingReq:
    @property
    def packet_type(self) -> PacketType:
        return PacketType.PINGREQ

    def encode(self, protocol_version: int) -> bytes:
        return fixed_header(PacketType.PINGREQ, 0, 0)


@dataclass(frozen=True, slots=True)
class PingResp:
    @property
    def packet_type(self) -> PacketType:
        return PacketType.PINGRESP

    def encode(self, protocol_version: int) -> bytes:
        return fixed_header(PacketType.PINGRESP, 0, 0)


Packet = (Connect | Connack | Publish | Puback | Pubrec | Pubrel | Pubcomp | Subscribe
          | Suback | Unsubscribe | Unsuback | PingReq | PingResp | Disconnect | Auth)
# §3.1.2.11.4 and each packet's Reason String / User Property: the sender
# must leave them out rather than exceed the peer's Maximum Packet Size.
_MAY_DROP_DIAGNOSTICS = (Connack, Puback, Pubrec, Pubrel, Pubcomp, Suback, Unsuback,
                         Disconnect, Auth)


def encode_packet(packet: Packet, protocol_version: int, *,
                  max_packet_size: int | None = None) -> bytes | None:
    """Encode for a peer that accepts at most `max_packet_size` bytes.

    Too big: drop Reason String and User Property (the only properties MQTT 5
    lets a sender drop, and never from a PUBLISH) and try again; still too
    big: None, meaning "do not send": close, or for a PUBLISH drop it as if
    it had been delivered.
    """
    data = packet.encode(protocol_version)
    if max_packet_size is None or len(data) <= max_packet_size:
        return data
    props = getattr(packet, "properties", None)
    droppable = (PropertyId.REASON_STRING, PropertyId.USER_PROPERTY)
    if isinstance(packet, _MAY_DROP_DIAGNOSTICS) and props \
            and any(p in props for p in droppable):
        slim = {k: v for k, v in props.items() if k not in droppable}
        data = dataclasses.replace(packet, properties=slim).encode(protocol_version)
        if len(data) <= max_packet_size:
            return data
    return None


# --- decoding ---------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class FixedHeader:
    packet_type: PacketType
    flags: int
    remaining_length: int
    header_length: int

    @property
    def packet_size(self) -> int:
        return self.header_length + self.remaining_length


def parse_fixed_header(data: bytes | bytearray, protocol_version: int | None = None,
                       offset: int = 0) -> FixedHeader | None:
    """The fixed header at `data[offset:]`, or None if it is cut short.

    Type and flags are checked from the first byte alone, so garbage is
    refused before any length arrives.
    """
    framed = _frame(data, offset, protocol_version)
    if framed is None:
        return None
    packet_type, flags, header_length, remaining = framed
    return FixedHeader(packet_type, flags, remaining, header_length)


def _frame(data: bytes | bytearray, offset: int,
           protocol_version: int | None) -> tuple[PacketType, int, int, int] | None:
    """(type, flags, header length, remaining length): parse_fixed_header
    without the dataclass, for the reader's per-packet path."""
    if len(data) <= offset:
        return None
    first = data[offset]
    packet_type = _TYPES[first >> 4]
    flags = first & 0x0F
    if packet_type is None:
        raise malformed("packet type 0 is reserved")
    if packet_type == PacketType.AUTH and protocol_version == MQTT_3_1_1:
        raise malformed("packet type 15 is reserved in MQTT 3.1.1")
    expected = _FIXED_FLAGS[packet_type]
    if expected is None:
        if (flags >> 1) & 0b11 == 0b11:
            raise malformed("PUBLISH with QoS 3")
    elif flags != expected:
        raise malformed(f"{packet_type.name} with flags 0b{flags:04b}, expected 0b{expected:04b}")
    parsed = parse_vbi(data, offset + 1)
    if parsed is None:
        return None
    remaining, used = parsed
    return packet_type, flags, 1 + used, remaining


_TYPES: Final[tuple[PacketType | None, ...]] = (None, *PacketType)


def decode_packet(header: FixedHeader, body: bytes, protocol_version: int | None, *,
                  from_client: bool = True) -> Packet:
    """Decode one packet body; `protocol_version` is needed for all but CONNECT.

    `from_client`: the body came from a client (the broker's case); a
    client's PUBLISH is held to stricter rules (see `publish`).
    """
    return _decode(header.packet_type, header.flags, body, protocol_version, from_client)


def _decode(t: PacketType, flags: int, body: bytes, protocol_version: int | None,
            from_client: bool, max_properties: int | None = None) -> Packet:
    if t == PacketType.PUBLISH:  # first: the hot path
        check_version(protocol_version)
        return decode_publish(flags, body, protocol_version,  # type: ignore[arg-type]
                              from_client=from_client)
    if t == PacketType.CONNECT:
        return decode_connect(body, max_properties)
    check_version(protocol_version)
    if t in ACK_CLASSES:
        return decode_ack(t, body, protocol_version)  # type: ignore[arg-type]
    if t in (PacketType.PINGREQ, PacketType.PINGRESP):
        if body:
            raise malformed(f"{t.name} with a {len(body)}-byte body")
        return PingReq() if t == PacketType.PINGREQ else PingResp()
    return _DECODERS[t](body, protocol_version)  # type: ignore[arg-type]


def decode_connect(body: bytes, max_properties: int | None = None) -> Connect:
    """`max_properties`: the most properties each of its blocks may hold (None: no cap but the size)."""
    c = Cursor(body)
    name = c.utf8("protocol name")
    level = c.u8("protocol level")
    if name == "MQIsdp" or (name == "MQTT" and level not in SUPPORTED_VERSIONS):
        raise ProtocolError(ReasonCode.UNSUPPORTED_PROTOCOL_VERSION,
                            f"unsupported protocol {name!r} level {level}")
    if name != "MQTT":
        raise malformed(f"protocol name {name!r} is not MQTT")
    try:
        return _decode_connect_rest(c, level, max_properties)
    except MqttError as err:
        err.protocol_version = level
        raise


def _decode_connect_rest(c: Cursor, v: int, max_properties: int | None) -> Connect:
    flags = c.u8("connect flags")
    if flags & 0x01:
        raise malformed("reserved connect flag is set")
    has_will, will_qos, will_retain = bool(flags & 0x04), (flags >> 3) & 0b11, bool(flags & 0x20)
    has_password, has_username = bool(flags & 0x40), bool(flags & 0x80)
    if will_qos == 3:
        raise malformed("will QoS 3")
    if not has_will and (will_qos or will_retain):
        raise malformed("will QoS or retain set without the will flag")
    if v == MQTT_3_1_1 and has_password and not has_username:
        raise malformed("password flag set without the user name flag")
    keep_alive_s = c.u16("keep alive")
    props = decode_properties(c, PacketType.CONNECT, max_properties) if v == MQTT_5 else {}
    if PropertyId.AUTHENTICATION_DATA in props and PropertyId.AUTHENTICATION_METHOD not in props:
        raise protocol_error("authentication data without an authentication method")
    client_id = c.utf8("client identifier")
    will = None
    if has_will:
        will_props = decode_properties(c, WILL, max_properties) if v == MQTT_5 else {}
        check_response_topic(will_props, "will response topic")
        topic = c.utf8("will topic")
        check_topic_name(topic, "will topic")
        payload = c.binary("will payload")
        if will_props.get(PropertyId.PAYLOAD_FORMAT_INDICATOR) == 1 and not is_utf8(payload):
            raise ProtocolError(ReasonCode.PAYLOAD_FORMAT_INVALID,
                                "will payload is declared UTF-8 but is not")
        will = Will(topic, payload, will_qos, will_retain, will_props)
    username = c.utf8("user name") if has_username else None
    password = c.binary("password") if has_password else None
    if not c.at_end():
        raise malformed(f"{c.remaining} bytes after the CONNECT payload")
    return Connect(v, client_id, bool(flags & 0x02), keep_alive_s, will,
                   username, password, props)


def decode_connack(body: bytes, protocol_version: int) -> Connack:
    c = Cursor(body)
    ack_flags = c.u8("acknowledge flags")
    if ack_flags & 0xFE:
        raise malformed("reserved acknowledge flags are set")
    code = c.u8("reason code")
    if protocol_version == MQTT_3_1_1:
        if code not in _V311_TO_REASON:
            raise malformed(f"CONNACK return code {code}")
        reason, props = _V311_TO_REASON[code], {}
    else:
        if code not in CONNACK_REASON_CODES:
            raise malformed(f"0x{code:02X} is not a CONNACK reason code")
        reason, props = ReasonCode(code), decode_properties(c, PacketType.CONNACK)
    if not c.at_end():
        raise malformed(f"{c.remaining} bytes after the CONNACK")
    if ack_flags and reason != ReasonCode.SUCCESS:
        raise malformed("session present on a refused CONNACK")
    return Connack(reason, bool(ack_flags), props)


def decode_disconnect(body: bytes, protocol_version: int) -> Disconnect:
    if protocol_version == MQTT_3_1_1 or not body:
        if body:
            raise malformed(f"3.1.1 DISCONNECT with a {len(body)}-byte body")
        return Disconnect()
    c = Cursor(body)
    code = c.u8("reason code")
    if code not in DISCONNECT_REASON_CODES:
        raise malformed(f"0x{code:02X} is not a DISCONNECT reason code")
    props = decode_properties(c, PacketType.DISCONNECT) if not c.at_end() else {}
    if not c.at_end():
        raise malformed(f"{c.remaining} bytes after the DISCONNECT")
    return Disconnect(ReasonCode(code), props)


_DECODERS: Final[dict[PacketType, Callable[[bytes, int], Packet]]] = {
    PacketType.CONNACK: decode_connack, PacketType.DISCONNECT: decode_disconnect,
    PacketType.SUBSCRIBE: decode_subscribe, PacketType.SUBACK: decode_suback,
    PacketType.UNSUBSCRIBE: decode_unsubscribe, PacketType.UNSUBACK: decode_unsuback,
    PacketType.AUTH: decode_auth,
}


# --- the incremental reader --------------------------------------------------

class PacketReader:
    """Frames and decodes the byte stream a client sends to a server."""

    def __init__(self, *, max_packet_size: int = DEFAULT_MAX_PACKET_SIZE,
                 max_connect_size: int | None = None,
                 max_connect_properties: int | None = None) -> None:
        if not MIN_MAX_PACKET_SIZE <= max_packet_size <= MAX_MAX_PACKET_SIZE:
            raise ValueError(f"max_packet_size must be {MIN_MAX_PACKET_SIZE}.."
                             f"{MAX_MAX_PACKET_SIZE}, got {max_packet_size}")
        self.max_packet_size = max_packet_size
        self.max_connect_size = min(max_packet_size, max_connect_size or max_packet_size)
        self.max_connect_properties = max_connect_properties
        self._buf = bytearray()
        self._start = 0  # bytes of _buf already decoded
        self._version: int | None = None
        self._error: MqttError | None = None

    @property
    def protocol_version(self) -> int | None:
        """4 or 5 once a CONNECT has been decoded, else None."""
        return self._version

    @property
    def buffered_bytes(self) -> int:
        return len(self._buf) - self._start

    def clear(self) -> None:
        """Drop what is buffered: the connection is closing and will read no packet again."""
        self._buf = bytearray()
        self._start = 0

    def feed(self, data: bytes) -> None:
        if self._error is None:  # a dead reader holds nothing
            if self._start:
                del self._buf[:self._start]
                self._start = 0
            self._buf += data

    def next_packet(self) -> Packet | None:
        if self._error is not None:
            raise self._error
        try:
            return self._next_packet()
        except MqttError as err:
            if err.protocol_version is None:
                err.protocol_version = self._version
            self._error = err
            self._buf = bytearray()
            self._start = 0
            raise

    def _next_packet(self) -> Packet | None:
        start, buf = self._start, self._buf
        framed = _frame(buf, start, self._version)
        if framed is None:
            return None
        t, flags, header_length, remaining = framed
        size = header_length + remaining
        if size > self.max_packet_size:
            raise ProtocolError(ReasonCode.PACKET_TOO_LARGE,
                                f"{t.name} of {size} bytes exceeds "
                                f"the maximum packet size {self.max_packet_size}")
        if self._version is None and t != PacketType.CONNECT:
            raise protocol_error(f"first packet must be CONNECT, got {t.name}")
        if self._version is not None and t == PacketType.CONNECT:
            raise protocol_error("second CONNECT on one connection")
        if t == PacketType.CONNECT and size > self.max_connect_size:
            raise ProtocolError(ReasonCode.PACKET_TOO_LARGE,
                                f"CONNECT of {size} bytes exceeds the {self.max_connect_size} bytes "
                                f"allowed before authentication")
        if t in _SERVER_ONLY:
            raise protocol_error(f"{t.name} is sent only by a server")
        end = start + size
        if len(buf) < end:
            return None
        body = bytes(buf[start + header_length:end])
        if end == len(buf):  # an idle connection keeps no old chunk
            buf.clear()
            self._start = 0
        else:
            self._start = end
        packet = _decode(t, flags, body, self._version, True, self.max_connect_properties)
        if isinstance(packet, Connect):
            self._version = packet.protocol_version
        return packet

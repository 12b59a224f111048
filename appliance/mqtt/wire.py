"""MQTT wire primitives: packet types, reason codes, errors, data types.

Rules (MQTT 3.1.1 §1.5, MQTT 5.0 §1.5, §2.4, §4.13):

- Integers are big-endian: one, two or four bytes.
- A Variable Byte Integer (VBI) carries 7 bits per byte, low group first, the
  top bit meaning "more follows"; at most four bytes (max 268,435,455). A fifth
  byte, or an encoding longer than the minimum, is a Malformed Packet.
- A UTF-8 string is a two-byte length then that many bytes (max 65,535). It
  must be well-formed UTF-8 (no surrogates, no overlongs) and must not contain
  U+0000; either is a Malformed Packet.
- Binary data is a two-byte length then that many bytes.
- Reading past the end of a packet is a Malformed Packet.
- A Topic Name is a UTF-8 string without the wildcards `+` and `#` (0x90).
- A Packet Identifier, where a packet has one, is 1..65,535; 0 is Malformed.
- A payload declared UTF-8 (Payload Format Indicator 1) must be well-formed
  UTF-8; unlike a string it may hold U+0000 (§3.3.2.3.2 asks only for
  well-formed UTF-8).

Every error here is the peer's fault and carries the MQTT 5 reason code to
answer with. Bad values handed to an encoder are our bug: `ValueError`.
"""

from __future__ import annotations

import enum
import struct
from typing import Final

from pairmq.appliance.errors import RemoteProtocolError

MQTT_3_1_1: Final = 4
MQTT_5: Final = 5
SUPPORTED_VERSIONS: Final = (MQTT_3_1_1, MQTT_5)
VBI_MAX: Final = 268_435_455
STRING_MAX_BYTES: Final = 65_535


class PacketType(enum.IntEnum):
    CONNECT = 1
    CONNACK = 2
    PUBLISH = 3
    PUBACK = 4
    PUBREC = 5
    PUBREL = 6
    PUBCOMP = 7
    SUBSCRIBE = 8
    SUBACK = 9
    UNSUBSCRIBE = 10
    UNSUBACK = 11
    PINGREQ = 12
    PINGRESP = 13
    DISCONNECT = 14
    AUTH = 15  # MQTT 5 only; reserved in 3.1.1


class ReasonCode(enum.IntEnum):
    """MQTT 5 reason codes (§2.4). 0x00 doubles as Normal disconnection."""

    SUCCESS = 0x00
    GRANTED_QOS_0 = 0x00  # an alias: SUBACK's name for 0x00
    GRANTED_QOS_1 = 0x01
    GRANTED_QOS_2 = 0x02
    DISCONNECT_WITH_WILL_MESSAGE = 0x04
    NO_MATCHING_SUBSCRIBERS = 0x10
    NO_SUBSCRIPTION_EXISTED = 0x11
    CONTINUE_AUTHENTICATION = 0x18
    RE_AUTHENTICATE = 0x19
    UNSPECIFIED_ERROR = 0x80
    MALFORMED_PACKET = 0x81
    PROTOCOL_ERROR = 0x82
    IMPLEMENTATION_SPECIFIC_ERROR = 0x83
    UNSUPPORTED_PROTOCOL_VERSION = 0x84
    CLIENT_IDENTIFIER_NOT_VALID = 0x85
    BAD_USER_NAME_OR_PASSWORD = 0x86
    NOT_AUTHORIZED = 0x87
    SERVER_UNAVAILABLE = 0x88
    SERVER_BUSY = 0x89
    BANNED = 0x8A
    SERVER_SHUTTING_DOWN = 0x8B
    BAD_AUTHENTICATION_METHOD = 0x8C
    KEEP_ALIVE_TIMEOUT = 0x8D
    SESSION_TAKEN_OVER = 0x8E
    TOPIC_FILTER_INVALID = 0x8F
    TOPIC_NAME_INVALID = 0x90
    PACKET_IDENTIFIER_IN_USE = 0x91
    PACKET_IDENTIFIER_NOT_FOUND = 0x92
    RECEIVE_MAXIMUM_EXCEEDED = 0x93
    TOPIC_ALIAS_INVALID = 0x94
    PACKET_TOO_LARGE = 0x95
    MESSAGE_RATE_TOO_HIGH = 0x96
    QUOTA_EXCEEDED = 0x97
    ADMINISTRATIVE_ACTION = 0x98
    PAYLOAD_FORMAT_INVALID = 0x99
    RETAIN_NOT_SUPPORTED = 0x9A
    QOS_NOT_SUPPORTED = 0x9B
    USE_ANOTHER_SERVER = 0x9C
    SERVER_MOVED = 0x9D
    SHARED_SUBSCRIPTIONS_NOT_SUPPORTED = 0x9E
    CONNECTION_RATE_EXCEEDED = 0x9F
    MAXIMUM_CONNECT_TIME = 0xA0
    SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED = 0xA1
    WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED = 0xA2


class MqttError(RemoteProtocolError):
    """A peer broke the MQTT rules; `reason_code` is the v5 code to answer with.

    `protocol_version` is the peer's protocol level when it was known at the
    time of the error (None before a CONNECT got that far), so an adapter can
    pick the answer: v5 CONNACK/DISCONNECT, a 3.1.1 CONNACK, or a plain close.
    """

    def __init__(self, reason_code: int, message: str, *,
                 protocol_version: int | None = None) -> None:
        super().__init__(f"{message} (reason 0x{reason_code:02X})")
        self.reason_code = ReasonCode(reason_code)
        self.message = message
        self.protocol_version = protocol_version


class MalformedPacket(MqttError):
    """The bytes cannot be parsed as the spec lays them out (usually 0x81)."""


class ProtocolError(MqttError):
    """The bytes parse but break a rule (0x82, 0x84, 0x95, ...)."""


def malformed(message: str) -> MalformedPacket:
    return MalformedPacket(ReasonCode.MALFORMED_PACKET, message)


def protocol_error(message: str,
                   reason_code: int = ReasonCode.PROTOCOL_ERROR) -> ProtocolError:
    return ProtocolError(reason_code, message)


def check_version(protocol_version: int | None) -> None:
    if protocol_version not in SUPPORTED_VERSIONS:
        raise ValueError(f"unsupported protocol version {protocol_version}")


# --- decoding ---------------------------------------------------------------

def parse_vbi(data: bytes | bytearray, pos: int,
              end: int | None = None) -> tuple[int, int] | None:
    """(value, bytes used) of the VBI at data[pos:end], or None if cut short."""
    end = len(data) if end is None else end
    value = 0
    for i in range(4):
        if pos + i >= end:
            return None
        byte = data[pos + i]
        value |= (byte & 0x7F) << (7 * i)
        if not byte & 0x80:
            if i > 0 and byte == 0:
                raise malformed("variable byte integer is not minimally encoded")
            return value, i + 1
    raise malformed("variable byte integer longer than four bytes")


def check_utf8(raw: bytes, what: str) -> str:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise malformed(f"{what} is not valid UTF-8 ({exc.reason})") from None
    if "\x00" in text:
        raise malformed(f"{what} contains U+0000")
    return text


def is_utf8(raw: bytes) -> bool:
    """Well-formed UTF-8 (Python's strict codec refuses surrogates and overlongs)."""
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def check_topic_name(topic: str, what: str = "topic name") -> None:
    if not topic:
        raise ProtocolError(ReasonCode.TOPIC_NAME_INVALID, f"{what} is empty")
    if "+" in topic or "#" in topic:
        raise ProtocolError(ReasonCode.TOPIC_NAME_INVALID, f"{what} {topic!r} holds a wildcard")


class Cursor:
    """Reads MQTT data types from one packet body; never reads past `end`."""

    __slots__ = ("_data", "_pos", "_end")

    def __init__(self, data: bytes, pos: int = 0, end: int | None = None) -> None:
        self._data = data
        self._pos = pos
        self._end = len(data) if end is None else end

    @property
    def position(self) -> int:
        return self._pos

    @property
    def remaining(self) -> int:
        return self._end - self._pos

    def at_end(self) -> bool:
        return self._pos == self._end

    def take(self, n: int, what: str) -> bytes:
        if n > self.remaining:
            raise malformed(f"packet ends inside {what}")
        chunk = self._data[self._pos:self._pos + n]
        self._pos += n
        return chunk

    def u8(self, what: str) -> int:
        return self.take(1, what)[0]

    def u16(self, what: str) -> int:
        pos = self._pos
        if pos + 2 > self._end:
            raise malformed(f"packet ends inside {what}")
        self._pos = pos + 2
        return (self._data[pos] << 8) | self._data[pos + 1]

    def u32(self, what: str) -> int:
        return int.from_bytes(self.take(4, what), "big")

    def vbi(self, what: str) -> int:
        parsed = parse_vbi(self._data, self._pos, self._end)
        if parsed is None:
            raise malformed(f"packet ends inside {what}")
        value, used = parsed
        self._pos += used
        return value

    def packet_id(self) -> int:
        value = self.u16("packet identifier")
        if not value:
            raise malformed("packet identifier 0")
        return value

    def binary(self, what: str) -> bytes:
        pos, data = self._pos, self._data
        if pos + 2 > self._end:
            raise malformed(f"packet ends inside length of {what}")
        stop = pos + 2 + ((data[pos] << 8) | data[pos + 1])
        if stop > self._end:
            raise malformed(f"packet ends inside {what}")
        self._pos = stop
        return data[pos + 2:stop]

    def utf8(self, what: str) -> str:
        return check_utf8(self.binary(what), what)

    def utf8_pair(self, what: str) -> tuple[str, str]:
        """A UTF-8 string pair in one call (User Property: a flood of them is the cost to keep down)."""
        data, pos, end = self._data, self._pos, self._end
        if pos + 2 > end:
            raise malformed(f"packet ends inside length of {what} name")
        name_end = pos + 2 + ((data[pos] << 8) | data[pos + 1])
        if name_end + 2 > end:
            raise malformed(f"packet ends inside {what}")
        value_end = name_end + 2 + ((data[name_end] << 8) | data[name_end + 1])
        if value_end > end:
            raise malformed(f"packet ends inside {what} value")
        self._pos = value_end
        name, value = data[pos + 2:name_end], data[name_end + 2:value_end]
        return (check_utf8(name, f"{what} name") if name else "",
                check_utf8(value, f"{what} value") if value else "")

    def small_vbi(self, what: str) -> int:
        """`vbi` with a fast path for the one-byte case (every property identifier)."""
        pos = self._pos
        if pos < self._end and self._data[pos] < 0x80:
            self._pos = pos + 1
            return self._data[pos]
        return self.vbi(what)

    def split(self, n: int, what: str) -> Cursor:
        """A cursor over the next n bytes; this one moves past them."""
        if n > self.remaining:
            raise malformed(f"{what} length {n} exceeds the {self.remaining} bytes left")
        sub = Cursor(self._data, self._pos, self._pos + n)
        self._pos += n
        return sub


# --- encoding (our values: a bad one is our bug) -----------------------------

def encode_vbi(value: int) -> bytes:
    if 0 <= value < 128:  # the common case, on the PUBLISH hot path
        return _SMALL_VBI[value]
    if not 0 <= value <= VBI_MAX:
        raise ValueError(f"variable byte integer out of range: {value}")
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


_SMALL_VBI: Final = tuple(bytes([i]) for i in range(128))


def _encode_int(size: int, value: int) -> bytes:
    if not 0 <= value < (1 << (8 * size)):
        raise ValueError(f"{value} does not fit in {8 * size} bits")
    return value.to_bytes(size, "big")


def encode_u8(value: int) -> bytes:
    return _encode_int(1, value)


def encode_u16(value: int) -> bytes:
    return _encode_int(2, value)


def encode_u32(value: int) -> bytes:
    return _encode_int(4, value)


def encode_binary(value: bytes) -> bytes:
    if len(value) > STRING_MAX_BYTES:
        raise ValueError(f"binary data longer than {STRING_MAX_BYTES} bytes")
    return len(value).to_bytes(2, "big") + bytes(value)


def encode_utf8(value: str) -> bytes:
    if "\x00" in value:
        raise ValueError("MQTT strings must not contain U+0000")
    return encode_binary(value.encode("utf-8"))  # surrogates raise here


def fixed_header(packet_type: PacketType, flags: int, body_len: int) -> bytes:
    return bytes([(packet_type << 4) | flags]) + encode_vbi(body_len)

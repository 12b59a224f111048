"""MQTT 5 properties (§2.2.2, §3.x): the table and its rules.

Rules:

- A property block is a VBI length, then (VBI identifier, value) pairs that
  fill exactly that length.
- Each identifier has one data type and a set of packets (scopes) that allow
  it; the Will Properties inside CONNECT are a scope of their own (`WILL`).
  An unknown identifier, one not allowed in this scope, or a value that does
  not parse as its type is a Malformed Packet (0x81).
- User Property may repeat anywhere; Subscription Identifier may repeat only
  in PUBLISH. Any other identifier appearing twice is a Protocol Error (0x82).
- Values the spec bounds (0 for Receive Maximum, Maximum Packet Size, Topic
  Alias or Subscription Identifier; anything but 0/1 for the one-byte
  switches; Maximum QoS above 1) are a Protocol Error (0x82).

- Decoding is linear in the block's size: repeated values are collected in
  lists and made tuples once, at the end.
- `max_count` (the pre-authentication budget, for CONNECT): a block holding
  more properties than that, repeated ones counted each time, is refused
  with 0x95 Packet too large as soon as the one too many is read.

Representation: `dict[PropertyId, value]`. The two repeatable properties are
always tuples (User Property: tuple of (name, value) pairs; Subscription
Identifier: tuple of ints), whatever the scope, so callers never branch.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pairmq.appliance.mqtt.wire import (
    VBI_MAX, Cursor, PacketType, ReasonCode, encode_binary, encode_u8, encode_u16,
    encode_u32, encode_utf8, encode_vbi, malformed, protocol_error,
)

WILL = "will"  # the Will Properties scope inside CONNECT
Scope = PacketType | str
Properties = Mapping["PropertyId", Any]  # Any, not object: values are typed per property id (the table below)


class PropertyId(enum.IntEnum):
    PAYLOAD_FORMAT_INDICATOR = 0x01
    MESSAGE_EXPIRY_INTERVAL = 0x02
    CONTENT_TYPE = 0x03
    RESPONSE_TOPIC = 0x08
    CORRELATION_DATA = 0x09
    SUBSCRIPTION_IDENTIFIER = 0x0B
    SESSION_EXPIRY_INTERVAL = 0x11
    ASSIGNED_CLIENT_IDENTIFIER = 0x12
    SERVER_KEEP_ALIVE = 0x13
    AUTHENTICATION_METHOD = 0x15
    AUTHENTICATION_DATA = 0x16
    REQUEST_PROBLEM_INFORMATION = 0x17
    WILL_DELAY_INTERVAL = 0x18
    REQUEST_RESPONSE_INFORMATION = 0x19
    RESPONSE_INFORMATION = 0x1A
    SERVER_REFERENCE = 0x1C
    REASON_STRING = 0x1F
    RECEIVE_MAXIMUM = 0x21
    TOPIC_ALIAS_MAXIMUM = 0x22
    TOPIC_ALIAS = 0x23
    MAXIMUM_QOS = 0x24
    RETAIN_AVAILABLE = 0x25
    USER_PROPERTY = 0x26
    MAXIMUM_PACKET_SIZE = 0x27
    WILDCARD_SUBSCRIPTION_AVAILABLE = 0x28
    SUBSCRIPTION_IDENTIFIER_AVAILABLE = 0x29
    SHARED_SUBSCRIPTION_AVAILABLE = 0x2A


class DataType(enum.Enum):
    BYTE = "byte"
    TWO_BYTE_INT = "two byte integer"
    FOUR_BYTE_INT = "four byte integer"
    VBI = "variable byte integer"
    UTF8 = "UTF-8 string"
    BINARY = "binary data"
    UTF8_PAIR = "UTF-8 string pair"


@dataclass(frozen=True, slots=True)
class PropertySpec:
    data_type: DataType
    scopes: frozenset[Scope]
    repeatable_in: frozenset[Scope] = frozenset()
    min_value: int | None = None
    max_value: int | None = None


P = PacketType
_PUB_WILL: frozenset[Scope] = frozenset({P.PUBLISH, WILL})
_ACKS: frozenset[Scope] = frozenset({P.PUBACK, P.PUBREC, P.PUBREL, P.PUBCOMP, P.SUBACK, P.UNSUBACK})
_ALL: frozenset[Scope] = frozenset[Scope]({P.CONNECT, P.CONNACK, P.PUBLISH, WILL, P.SUBSCRIBE, P.UNSUBSCRIBE,
                                          P.DISCONNECT, P.AUTH}) | _ACKS
_T = DataType

PROPERTY_TABLE: dict[PropertyId, PropertySpec] = {
    PropertyId.PAYLOAD_FORMAT_INDICATOR: PropertySpec(_T.BYTE, _PUB_WILL, max_value=1),
    PropertyId.MESSAGE_EXPIRY_INTERVAL: PropertySpec(_T.FOUR_BYTE_INT, _PUB_WILL),
    PropertyId.CONTENT_TYPE: PropertySpec(_T.UTF8, _PUB_WILL),
    PropertyId.RESPONSE_TOPIC: PropertySpec(_T.UTF8, _PUB_WILL),
    PropertyId.CORRELATION_DATA: PropertySpec(_T.BINARY, _PUB_WILL),
    PropertyId.SUBSCRIPTION_IDENTIFIER: PropertySpec(
        _T.VBI, frozenset({P.PUBLISH, P.SUBSCRIBE}), frozenset({P.PUBLISH}), min_value=1),
    PropertyId.SESSION_EXPIRY_INTERVAL: PropertySpec(
        _T.FOUR_BYTE_INT, frozenset({P.CONNECT, P.CONNACK, P.DISCONNECT})),
    PropertyId.ASSIGNED_CLIENT_IDENTIFIER: PropertySpec(_T.UTF8, frozenset({P.CONNACK})),
    PropertyId.SERVER_KEEP_ALIVE: PropertySpec(_T.TWO_BYTE_INT, frozenset({P.CONNACK})),
    PropertyId.AUTHENTICATION_METHOD: PropertySpec(
        _T.UTF8, frozenset({P.CONNECT, P.CONNACK, P.AUTH})),
    PropertyId.AUTHENTICATION_DATA: PropertySpec(
        _T.BINARY, frozenset({P.CONNECT, P.CONNACK, P.AUTH})),
    PropertyId.REQUEST_PROBLEM_INFORMATION: PropertySpec(
        _T.BYTE, frozenset({P.CONNECT}), max_value=1),
    PropertyId.WILL_DELAY_INTERVAL: PropertySpec(_T.FOUR_BYTE_INT, frozenset({WILL})),
    PropertyId.REQUEST_RESPONSE_INFORMATION: PropertySpec(
        _T.BYTE, frozenset({P.CONNECT}), max_value=1),
    PropertyId.RESPONSE_INFORMATION: PropertySpec(_T.UTF8, frozenset({P.CONNACK})),
    PropertyId.SERVER_REFERENCE: PropertySpec(_T.UTF8, frozenset({P.CONNACK, P.DISCONNECT})),
    PropertyId.REASON_STRING: PropertySpec(
        _T.UTF8, frozenset({P.CONNACK, P.DISCONNECT, P.AUTH}) | _ACKS),
    PropertyId.RECEIVE_MAXIMUM: PropertySpec(
        _T.TWO_BYTE_INT, frozenset({P.CONNECT, P.CONNACK}), min_value=1),
    PropertyId.TOPIC_ALIAS_MAXIMUM: PropertySpec(
        _T.TWO_BYTE_INT, frozenset({P.CONNECT, P.CONNACK})),
    PropertyId.TOPIC_ALIAS: PropertySpec(_T.TWO_BYTE_INT, frozenset({P.PUBLISH}), min_value=1),
    PropertyId.MAXIMUM_QOS: PropertySpec(_T.BYTE, frozenset({P.CONNACK}), max_value=1),
    PropertyId.RETAIN_AVAILABLE: PropertySpec(_T.BYTE, frozenset({P.CONNACK}), max_value=1),
    PropertyId.USER_PROPERTY: PropertySpec(_T.UTF8_PAIR, _ALL, _ALL),
    PropertyId.MAXIMUM_PACKET_SIZE: PropertySpec(
        _T.FOUR_BYTE_INT, frozenset({P.CONNECT, P.CONNACK}), min_value=1),
    PropertyId.WILDCARD_SUBSCRIPTION_AVAILABLE: PropertySpec(
        _T.BYTE, frozenset({P.CONNACK}), max_value=1),
    PropertyId.SUBSCRIPTION_IDENTIFIER_AVAILABLE: PropertySpec(
        _T.BYTE, frozenset({P.CONNACK}), max_value=1),
    PropertyId.SHARED_SUBSCRIPTION_AVAILABLE: PropertySpec(
        _T.BYTE, frozenset({P.CONNACK}), max_value=1),
}

# Stored as tuples in every scope (see the module docstring).
TUPLE_VALUED = frozenset({PropertyId.USER_PROPERTY, PropertyId.SUBSCRIPTION_IDENTIFIER})


def scope_name(scope: Scope) -> str:
    return scope.name if isinstance(scope, PacketType) else "will properties"


_READERS: dict[DataType, Callable[[Cursor, str], Any]] = {
    DataType.BYTE: Cursor.u8,
    DataType.TWO_BYTE_INT: Cursor.u16,
    DataType.FOUR_BYTE_INT: Cursor.u32,
    DataType.VBI: Cursor.vbi,
    DataType.UTF8: Cursor.utf8,
    DataType.BINARY: Cursor.binary,
    DataType.UTF8_PAIR: Cursor.utf8_pair,
}
# identifier -> (PropertyId, spec, name, reader): one dict hit per property
_BY_ID = {int(pid): (pid, spec, pid.name, _READERS[spec.data_type])
          for pid, spec in PROPERTY_TABLE.items()}
_SMALL_IDS = {pid: bytes([pid]) for pid in PropertyId}  # every identifier is < 128
_BOUNDED = frozenset(pid for pid, spec in PROPERTY_TABLE.items()
                     if spec.min_value is not None or spec.max_value is not None)


def decode_properties(cursor: Cursor, scope: Scope,
                      max_count: int | None = None) -> dict[PropertyId, Any]:
    """Read one property block for `scope`; the cursor moves past it."""
    length = cursor.vbi("property length")
    block = cursor.split(length, "property block")
    props: dict[PropertyId, Any] = {}
    repeated: dict[PropertyId, list[Any]] = {}
    count = 0
    while not block.at_end():
        count += 1
        if max_count is not None and count > max_count:
            raise protocol_error(f"more than {max_count} properties in {scope_name(scope)}",
                                 ReasonCode.PACKET_TOO_LARGE)
        raw_id = block.small_vbi("property identifier")
        entry = _BY_ID.get(raw_id)
        if entry is None:
            raise malformed(f"unknown property identifier 0x{raw_id:02X}")
        pid, spec, name, read = entry
        if scope not in spec.scopes:
            raise malformed(f"property {name} is not allowed in {scope_name(scope)}")
        value = read(block, name)
        if pid in _BOUNDED:
            _check_range(pid, spec, value)
        if pid in TUPLE_VALUED:
            values = repeated.get(pid)
            if values is None:
                repeated[pid] = [value]
            elif scope not in spec.repeatable_in:
                raise protocol_error(f"property {pid.name} appears twice in {scope_name(scope)}")
            else:
                values.append(value)  # a tuple rebuilt per value would be quadratic in the count
        elif pid in props:
            raise protocol_error(f"property {pid.name} appears twice in {scope_name(scope)}")
        else:
            props[pid] = value
    for pid, values in repeated.items():
        props[pid] = tuple(values)
    return props


# Out-of-range values are Protocol Errors (0x82), except where the spec names a sharper reason code:
# a Topic Alias of 0 is answered with DISCONNECT 0x94 Topic Alias invalid (MQTT 5 §3.3.2.3.4).
_OUT_OF_RANGE_REASON = {PropertyId.TOPIC_ALIAS: ReasonCode.TOPIC_ALIAS_INVALID}


def _check_range(pid: PropertyId, spec: PropertySpec, value: int) -> None:
    reason = _OUT_OF_RANGE_REASON.get(pid, ReasonCode.PROTOCOL_ERROR)
    if spec.min_value is not None and value < spec.min_value:
        raise protocol_error(f"property {pid.name} must be at least {spec.min_value}, got {value}", reason)
    if spec.max_value is not None and value > spec.max_value:
        raise protocol_error(f"property {pid.name} must be at most {spec.max_value}, got {value}", reason)


def _encode_pair(value: tuple[str, str]) -> bytes:
    name, text = value
    return encode_utf8(name) + encode_utf8(text)


_ENCODERS: dict[DataType, Callable[[Any], bytes]] = {
    DataType.BYTE: encode_u8,
    DataType.TWO_BYTE_INT: encode_u16,
    DataType.FOUR_BYTE_INT: encode_u32,
    DataType.VBI: encode_vbi,
    DataType.UTF8: encode_utf8,
    DataType.BINARY: encode_binary,
    DataType.UTF8_PAIR: _encode_pair,
}


def encode_properties(props: Properties, scope: Scope) -> bytes:
    """The property block (length included) for `scope`, in identifier order."""
    if not props:
        return b"\x00"
    body = encode_property_list(props, scope)
    if len(body) > VBI_MAX:
        raise ValueError("property block too long")
    return encode_vbi(len(body)) + body


def encode_property_list(props: Properties, scope: Scope) -> bytes:
    """The (identifier, value) pairs of a block, in identifier order, no length."""
    return b"".join([encode_property(key, props[key], scope) for key in sorted(props)])


def encode_property(key: int, value: Any, scope: Scope) -> bytes:
    """One property's pairs (several for a repeated one, as a tuple)."""
    if key not in _BY_ID:
        raise ValueError(f"unknown property identifier {key!r}")
    pid, spec, name, _ = _BY_ID[key]
    if scope not in spec.scopes:
        raise ValueError(f"property {name} is not allowed in {scope_name(scope)}")
    values = value if pid in TUPLE_VALUED else (value,)
    if len(values) > 1 and scope not in spec.repeatable_in:
        raise ValueError(f"property {name} may appear once in {scope_name(scope)}")
    encode = _ENCODERS[spec.data_type]
    out: list[bytes] = []
    for one in values:
        if pid in _BOUNDED and not _in_range(spec, one):
            raise ValueError(f"property {name} value {one} out of range")
        out += (_SMALL_IDS[pid], encode(one))
    return b"".join(out)


def _in_range(spec: PropertySpec, value: int) -> bool:
    return ((spec.min_value is None or value >= spec.min_value)
            and (spec.max_value is None or value <= spec.max_value))

"""MQTT PUBLISH (§3.3), the hot path: decoded and encoded by hand.

Rules (each a Malformed Packet 0x81 unless another code is named):

- Fixed-header flags: DUP (bit 3), QoS (bits 2-1), RETAIN (bit 0). QoS 3 is
  malformed (the fixed-header parser refuses it before the body arrives);
  DUP on a QoS 0 PUBLISH is 0x82.
- Topic Name: a UTF-8 string without `+` or `#` (0x90). It may be empty only
  in 5.0 and only with a Topic Alias; an empty one otherwise is 0x82.
- Packet Identifier: present exactly when QoS > 0; 0 is malformed.
- 5.0 properties: the PUBLISH scope of the property table (Topic Alias 0 and
  Subscription Identifier 0 are 0x82 there). A Subscription Identifier sent
  by a client is 0x82 (§3.3.4: only a server adds them); a Response Topic
  holding a wildcard is 0x82.
- Payload: the rest of the packet, possibly empty. From a client, Payload
  Format Indicator 1 with a payload that is not well-formed UTF-8 is 0x99.

Theory of operation: a received PUBLISH is decoded once into `Publish`. The
broker makes one `PublishTemplate` per message, which encodes the topic and
the properties that travel unchanged once; `header()` then stamps, per
subscriber, only what differs (flags, packet id, topic alias, subscription
identifiers, remaining expiry) in a few concatenations. The payload is never
re-encoded: send `header() + payload`, or both buffers to `writelines`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final
from pairmq.appliance.mqtt.properties import (
    Properties, PropertyId, decode_properties, encode_properties, encode_property,
)
from pairmq.appliance.mqtt.wire import (
    MQTT_3_1_1, MQTT_5, VBI_MAX, Cursor, PacketType, ProtocolError, ReasonCode,
    check_version, encode_utf8, encode_vbi, is_utf8, malformed, protocol_error,
)

_PUBLISH: Final = PacketType.PUBLISH
_PFI: Final = PropertyId.PAYLOAD_FORMAT_INDICATOR
_EXPIRY = PropertyId.MESSAGE_EXPIRY_INTERVAL
_ALIAS: Final = PropertyId.TOPIC_ALIAS
_SUB_ID = PropertyId.SUBSCRIPTION_IDENTIFIER
_RESPONSE_TOPIC = PropertyId.RESPONSE_TOPIC
# Per connection or per delivery: never copied from the publisher's packet.
_STAMPED = frozenset({_EXPIRY, _ALIAS, _SUB_ID})
_FIRST_BYTE = tuple(bytes([0x30 | flags]) for flags in range(16))
_EMPTY_TOPIC = b"\x00\x00"


class _Keep(enum.Enum):
    KEEP = "keep"


KEEP = _Keep.KEEP  # "send the Message Expiry Interval the publisher sent"


@dataclass(slots=True, init=False)
class Publish:
    """One per PUBLISH in and out: an explicit `__init__` and `Final` fields, not a runtime `frozen=True`
    (docs/build.md)."""

    topic: Final[str]
    payload: Final[bytes]
    qos: Final[int]
    retain: Final[bool]
    dup: Final[bool]
    packet_id: Final[int | None]
    properties: Final[Properties]

    def __init__(self, topic: str, payload: bytes = b"", qos: int = 0, retain: bool = False, dup: bool = False,
                 packet_id: int | None = None, properties: Properties | None = None) -> None:
        self.topic = topic
        self.payload = payload
        self.qos = qos
        self.retain = retain
        self.dup = dup
        self.packet_id = packet_id
        self.properties = {} if properties is None else properties

    @property
    def packet_type(self) -> PacketType:
        return PacketType.PUBLISH

    def encode(self, protocol_version: int) -> bytes:
        check_version(protocol_version)
        pid = _packet_id_field(self.qos, self.dup, self.packet_id)
        if protocol_version == MQTT_3_1_1:
            if self.properties:
                raise ValueError("3.1.1 has no properties")
            block = b""
        else:
            block = encode_properties(self.properties, _PUBLISH)
        if self.topic:
            _check_our_topic(self.topic)
        elif protocol_version == MQTT_3_1_1 or _ALIAS not in self.properties:
            raise ValueError("an empty topic name needs a topic alias (5.0 only)")
        return _assemble(_flags(self.qos, self.dup, self.retain), encode_utf8(self.topic),
                         pid, block, self.payload)


def _flags(qos: int, dup: bool, retain: bool) -> int:
    return (dup << 3) | (qos << 1) | retain


def _packet_id_field(qos: int, dup: bool, packet_id: int | None) -> bytes:
    if qos == 0:
        if packet_id is not None or dup:
            raise ValueError("a QoS 0 PUBLISH has no packet identifier and no DUP")
        return b""
    if qos not in (1, 2) or packet_id is None or not 0 < packet_id < 0x10000:
        raise ValueError(f"QoS {qos} PUBLISH needs a packet identifier 1..65535, got {packet_id}")
    return packet_id.to_bytes(2, "big")


def _check_our_topic(topic: str) -> None:
    if "+" in topic or "#" in topic:
        raise ValueError(f"topic name {topic!r} holds a wildcard")


def _assemble(flags: int, topic_field: bytes, pid: bytes, block: bytes,
              payload: bytes) -> bytes:
    remaining = len(topic_field) + len(pid) + len(block) + len(payload)
    return b"".join((_FIRST_BYTE[flags], encode_vbi(remaining), topic_field, pid,
                     block, payload))


# --- decoding ---------------------------------------------------------------

def decode_publish(flags: int, body: bytes, protocol_version: int, *,
                   from_client: bool) -> Publish:
    """Decode a PUBLISH body; `from_client` turns on the rules for what a
    client may send (no Subscription Identifier, UTF-8 payload checked)."""
    qos = (flags >> 1) & 0b11
    if qos == 3:
        raise malformed("PUBLISH with QoS 3")
    dup = bool(flags & 0b1000)
    if dup and not qos:
        raise protocol_error("DUP set on a QoS 0 PUBLISH")
    end = len(body)
    if end < 2:
        raise malformed("packet ends inside length of topic name")
    pos = 2 + ((body[0] << 8) | body[1])
    if pos > end:
        raise malformed("packet ends inside topic name")
    try:
        topic = body[2:pos].decode("utf-8")
    except UnicodeDecodeError as exc:
        raise malformed(f"topic name is not valid UTF-8 ({exc.reason})") from None
    if "\x00" in topic:
        raise malformed("topic name contains U+0000")
    if "+" in topic or "#" in topic:
        raise ProtocolError(ReasonCode.TOPIC_NAME_INVALID,
                            f"topic name {topic!r} holds a wildcard")
    packet_id = None
    if qos:
        if pos + 2 > end:
            raise malformed("packet ends inside packet identifier")
        packet_id = (body[pos] << 8) | body[pos + 1]
        if not packet_id:
            raise malformed("packet identifier 0")
        pos += 2
    props: dict[PropertyId, object] = {}
    if protocol_version == MQTT_5:
        if pos >= end:
            raise malformed("packet ends inside property length")
        if body[pos]:
            cursor = Cursor(body, pos)
            props = decode_properties(cursor, _PUBLISH)
            pos = cursor.position
            _check_properties(props, from_client)
        else:
            pos += 1
    if not topic and _ALIAS not in props:
        raise protocol_error("empty topic name without a topic alias")
    payload = body[pos:]
    if from_client and props.get(_PFI) == 1 and not is_utf8(payload):
        raise ProtocolError(ReasonCode.PAYLOAD_FORMAT_INVALID,
                            "payload is declared UTF-8 but is not")
    return Publish(topic, payload, qos, bool(flags & 1), dup, packet_id, props)


def _check_properties(props: dict[PropertyId, object], from_client: bool) -> None:
    if from_client and _SUB_ID in props:
        raise protocol_error("a client sent a subscription identifier in PUBLISH")
    check_response_topic(props, "response topic")


def check_response_topic(props: Properties, what: str) -> None:
    """§3.3.2.3.5: a Response Topic is a topic name, so no wildcards (0x82)."""
    topic = props.get(_RESPONSE_TOPIC)
    if isinstance(topic, str) and ("+" in topic or "#" in topic):
        raise protocol_error(f"{what} {topic!r} holds a wildcard")


# --- the per-subscriber fast path --------------------------------------------

def _encode_expiry(seconds: int) -> bytes:
    if not 0 <= seconds < 1 << 32:
        raise ValueError(f"message expiry interval out of range: {seconds}")
    return b"\x02" + seconds.to_bytes(4, "big")


class PublishTemplate:
    """One application message, encoded once, stamped once per subscriber.

    `properties` are the publisher's; Topic Alias and Subscription Identifier
    are dropped (they belong to a connection and a subscription), Message
    Expiry Interval is kept as the default for `message_expiry_interval`.
    """

    __slots__ = ("topic", "payload", "message_expiry_interval", "_topic_field",
                 "_pfi", "_middle", "_tail", "_block")

    def __init__(self, topic: str, payload: bytes, properties: Properties | None = None) -> None:
        if not topic:
            raise ValueError("a template needs the resolved topic name, not an alias")
        _check_our_topic(topic)
        self.topic = topic
        self.payload = payload
        self._topic_field = encode_utf8(topic)
        props = properties or {}
        expiry = props.get(_EXPIRY)
        self.message_expiry_interval: int | None = expiry
        # Identifier order: PFI 0x01 | expiry 0x02 | 0x03-0x09 | sub ids 0x0B | alias 0x23
        # | user 0x26; the stamped ones go between these pre-encoded runs.
        runs: tuple[list[bytes], list[bytes], list[bytes]] = ([], [], [])
        for key in sorted(props):
            if key not in _STAMPED:
                run = runs[0] if key < _EXPIRY else runs[1] if key < _SUB_ID else runs[2]
                run.append(encode_property(key, props[key], _PUBLISH))
        self._pfi, self._middle, self._tail = (b"".join(run) for run in runs)
        expiry_field = b"" if expiry is None else _encode_expiry(expiry)
        kept = self._pfi + expiry_field + self._middle + self._tail
        self._block = encode_vbi(len(kept)) + kept

    @classmethod
    def from_publish(cls, publish: Publish, topic: str | None = None) -> PublishTemplate:
        """`topic`: the resolved name when the publisher used a bare alias."""
        return cls(topic or publish.topic, publish.payload, publish.properties)

    def header(self, protocol_version: int, *, qos: int = 0, packet_id: int | None = None,
               dup: bool = False, retain: bool = False, topic_alias: int | None = None,
               alias_only: bool = False, subscription_ids: tuple[int, ...] = (),
               message_expiry_interval: int | None | _Keep = KEEP) -> bytes:
        """Every byte of the PUBLISH before the payload.

        `alias_only`: send an empty topic name (the peer already maps
        `topic_alias` to this topic). `message_expiry_interval`: the seconds
        left (§3.3.2.3.3), None to send none, KEEP for the publisher's value;
        3.1.1 carries no properties, so there it is ignored.
        """
        pid = _packet_id_field(qos, dup, packet_id)
        topic = self._topic_field
        if protocol_version == MQTT_5:
            if topic_alias is None and not subscription_ids and message_expiry_interval is KEEP:
                block = self._block
            else:
                block = self._stamped_block(topic_alias, subscription_ids, message_expiry_interval)
            if alias_only:
                if topic_alias is None:
                    raise ValueError("alias_only needs a topic alias")
                topic = _EMPTY_TOPIC
        elif protocol_version == MQTT_3_1_1:
            if topic_alias is not None or subscription_ids or alias_only:
                raise ValueError("3.1.1 has no topic aliases or subscription identifiers")
            block = b""
        else:
            raise ValueError(f"unsupported protocol version {protocol_version}")
        remaining = len(topic) + len(pid) + len(block) + len(self.payload)
        return b"".join((_FIRST_BYTE[_flags(qos, dup, retain)], encode_vbi(remaining),
                         topic, pid, block))

    def encode(self, protocol_version: int, *, qos: int = 0, packet_id: int | None = None,
               dup: bool = False, retain: bool = False, topic_alias: int | None = None,
               alias_only: bool = False, subscription_ids: tuple[int, ...] = (),
               message_expiry_interval: int | None | _Keep = KEEP,
               max_packet_size: int | None = None) -> bytes | None:
        """The whole PUBLISH, or None when it exceeds `max_packet_size`
        (§3.1.2.11.4: the server then drops it as if it had been sent)."""
        head = self.header(protocol_version, qos=qos, packet_id=packet_id, dup=dup,
                           retain=retain, topic_alias=topic_alias, alias_only=alias_only,
                           subscription_ids=subscription_ids,
                           message_expiry_interval=message_expiry_interval)
        if max_packet_size is not None and len(head) + len(self.payload) > max_packet_size:
            return None
        return head + self.payload

    def _stamped_block(self, topic_alias: int | None, subscription_ids: tuple[int, ...],
                       expiry: int | None | _Keep) -> bytes:
        if expiry is KEEP:
            expiry = self.message_expiry_interval
        parts = [self._pfi]
        if expiry is not None:
            parts.append(_encode_expiry(expiry))
        parts.append(self._middle)
        for sid in subscription_ids:
            if not 0 < sid <= VBI_MAX:
                raise ValueError(f"subscription identifier out of range: {sid}")
            parts.append(b"\x0b" + encode_vbi(sid))
        if topic_alias is not None:
            if not 0 < topic_alias < 0x10000:
                raise ValueError(f"topic alias out of range: {topic_alias}")
            parts.append(b"\x23" + topic_alias.to_bytes(2, "big"))
        parts.append(self._tail)
        body = b"".join(parts)
        return encode_vbi(len(body)) + body

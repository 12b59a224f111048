"""Shared helpers for the MQTT codec tests: framing, paho's encoder, strategies."""

from __future__ import annotations

import paho.mqtt.client as paho
import pytest
from hypothesis import strategies as st

from pairmq.appliance.mqtt.codec import (
    FixedHeader, PacketReader, decode_packet, parse_fixed_header,
)
from pairmq.appliance.mqtt.packets import (
    AUTH_REASON_CODES, PUBACK_REASON_CODES, PUBREL_REASON_CODES,
    SUBACK_REASON_CODES, UNSUBACK_REASON_CODES, Auth, Puback, Pubcomp, Pubrec,
    Pubrel, Suback, Subscribe, Subscription, Unsuback, Unsubscribe,
)
from pairmq.appliance.mqtt.properties import PROPERTY_TABLE, DataType, PropertyId
from pairmq.appliance.mqtt.publish import Publish
from pairmq.appliance.mqtt.wire import MQTT_3_1_1, MQTT_5, VBI_MAX, PacketType

P = PropertyId


def split(data: bytes, version: int | None = None) -> tuple[FixedHeader, bytes]:
    header = parse_fixed_header(data, version)
    assert header is not None and header.packet_size == len(data)
    return header, data[header.header_length:]


def roundtrip(packet, version, *, from_client: bool = False):
    header, body = split(packet.encode(version), version)
    return decode_packet(header, body, version, from_client=from_client)


def raises(exc_type, reason, fn, *args, **kw):
    with pytest.raises(exc_type) as info:
        fn(*args, **kw)
    assert info.value.reason_code == reason, info.value
    return info.value


def read_all(data: bytes, **kw) -> list:
    reader = PacketReader(**kw)
    reader.feed(data)
    out = []
    while (packet := reader.next_packet()) is not None:
        out.append(packet)
    return out


# --- paho-mqtt's own encoder -----------------------------------------------------

class _NoSocket:
    def close(self) -> None:
        pass


class PahoBytes(paho.Client):
    """A paho client whose outgoing packets are kept instead of written."""

    def __init__(self, version: int) -> None:
        super().__init__(paho.CallbackAPIVersion.VERSION2,
                         protocol=paho.MQTTv5 if version == MQTT_5 else paho.MQTTv311)
        self._sock = _NoSocket()
        self.sent: list[bytes] = []

    def _packet_queue(self, command, packet, mid, qos, info=None):
        self.sent.append(bytes(packet))
        return paho.MQTTErrorCode.MQTT_ERR_SUCCESS

    def last(self) -> bytes:
        return self.sent[-1]


# --- hypothesis strategies ----------------------------------------------------------

text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
               max_size=12)
topic_names = st.text(st.characters(blacklist_categories=("Cs",),
                                    blacklist_characters="\x00+#"), min_size=1, max_size=20)
packet_ids = st.integers(1, 65535)

_VALUES = {
    DataType.BYTE: st.integers(0, 255), DataType.TWO_BYTE_INT: st.integers(0, 65535),
    DataType.FOUR_BYTE_INT: st.integers(0, 2**32 - 1), DataType.VBI: st.integers(0, VBI_MAX),
    DataType.UTF8: text, DataType.BINARY: st.binary(max_size=12),
    DataType.UTF8_PAIR: st.tuples(text, text),
}


def _value(pid: PropertyId) -> st.SearchStrategy:
    spec = PROPERTY_TABLE[pid]
    if pid == P.RESPONSE_TOPIC:
        return topic_names
    base = _VALUES[spec.data_type]
    if spec.min_value is not None or spec.max_value is not None:
        base = base.filter(lambda v: (spec.min_value is None or v >= spec.min_value)
                           and (spec.max_value is None or v <= spec.max_value))
    return base


@st.composite
def properties(draw, scope, *, exclude=frozenset()):
    """A valid property block for `scope`, as the codec represents it."""
    allowed = sorted(pid for pid, spec in PROPERTY_TABLE.items()
                     if scope in spec.scopes and pid not in exclude)
    chosen = draw(st.lists(st.sampled_from(allowed), unique=True, max_size=4)) if allowed else []
    props = {}
    for pid in chosen:
        if pid in (P.USER_PROPERTY, P.SUBSCRIPTION_IDENTIFIER):
            most = 3 if scope in PROPERTY_TABLE[pid].repeatable_in else 1
            props[pid] = tuple(draw(st.lists(_value(pid), min_size=1, max_size=most)))
        else:
            props[pid] = draw(_value(pid))
    return props


@st.composite
def publishes(draw, version, *, from_client=False):
    qos = draw(st.integers(0, 2))
    props = draw(properties(PacketType.PUBLISH, exclude={P.SUBSCRIPTION_IDENTIFIER}
                            if from_client else frozenset())) if version == MQTT_5 else {}
    topic = draw(topic_names)
    if P.TOPIC_ALIAS in props and draw(st.booleans()):
        topic = ""
    payload = draw(st.binary(max_size=40))
    if from_client and props.get(P.PAYLOAD_FORMAT_INDICATOR) == 1:
        payload = draw(text).encode()
    return Publish(topic, payload, qos, draw(st.booleans()), bool(qos) and draw(st.booleans()),
                   draw(packet_ids) if qos else None, props)


def _codes(table, version):
    codes = sorted(table)
    return st.sampled_from(codes if version == MQTT_5 else [0])


@st.composite
def acks(draw, version):
    cls = draw(st.sampled_from([Puback, Pubrec, Pubrel, Pubcomp]))
    table = PUBREL_REASON_CODES if cls in (Pubrel, Pubcomp) else PUBACK_REASON_CODES
    props = draw(properties(cls(1).packet_type)) if version == MQTT_5 else {}
    return cls(draw(packet_ids), draw(_codes(table, version)), props)


@st.composite
def subscribes(draw, version):
    def one(topic_filter):
        if version == MQTT_3_1_1:
            return Subscription(topic_filter, draw(st.integers(0, 2)))
        return Subscription(topic_filter, draw(st.integers(0, 2)), draw(st.booleans()),
                            draw(st.booleans()), draw(st.integers(0, 2)))
    filters = draw(st.lists(text, min_size=1, max_size=4))
    props = draw(properties(PacketType.SUBSCRIBE)) if version == MQTT_5 else {}
    return Subscribe(draw(packet_ids), tuple(one(f) for f in filters), props)


@st.composite
def subacks(draw, version):
    table = SUBACK_REASON_CODES if version == MQTT_5 else [0, 1, 2, 0x80]
    codes = draw(st.lists(st.sampled_from(sorted(table)), min_size=1, max_size=4))
    props = draw(properties(PacketType.SUBACK)) if version == MQTT_5 else {}
    return Suback(draw(packet_ids), tuple(codes), props)


@st.composite
def unsubscribes(draw, version):
    props = draw(properties(PacketType.UNSUBSCRIBE)) if version == MQTT_5 else {}
    return Unsubscribe(draw(packet_ids), tuple(draw(st.lists(text, min_size=1, max_size=4))),
                       props)


@st.composite
def unsubacks(draw, version):
    if version == MQTT_3_1_1:
        return Unsuback(draw(packet_ids))
    codes = draw(st.lists(st.sampled_from(sorted(UNSUBACK_REASON_CODES)), min_size=1, max_size=4))
    return Unsuback(draw(packet_ids), tuple(codes), draw(properties(PacketType.UNSUBACK)))


@st.composite
def auths(draw):
    reason = draw(st.sampled_from(sorted(AUTH_REASON_CODES)))
    props = draw(properties(PacketType.AUTH))
    if reason or props:
        props[P.AUTHENTICATION_METHOD] = draw(text)
    return Auth(reason, props)


def any_packet(version):
    """Every packet type but CONNECT/CONNACK/DISCONNECT, valid for `version`."""
    kinds = [publishes(version), acks(version), subscribes(version), subacks(version),
             unsubscribes(version), unsubacks(version)]
    return st.one_of(*kinds, auths()) if version == MQTT_5 else st.one_of(*kinds)

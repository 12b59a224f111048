"""PairMQ's MQTT front door: a sans-I/O codec and session, and the asyncio listener.

`codec` frames and decodes packets with no I/O (PUBLISH lives in `publish`,
the acknowledgements, subscriptions and AUTH in `packets`); `session` is one
connection's rules with no I/O (CONNECT checks, refusals, bad-packet answers,
keep alive); `listener` is the thin asyncio adapter that the redundancy core
gates, with one `connection` Protocol per socket around its session, the
CONNECT queue in `connects` and the overload policy in `overload` (no I/O).
Import the listener from its module (`appliance.mqtt.listener`) so that codec
users never pull in asyncio.
"""

from pairmq.appliance.mqtt.codec import (
    DEFAULT_MAX_PACKET_SIZE, Connack, Connect, Disconnect, FixedHeader, Packet,
    PacketReader, PingReq, PingResp, Will, decode_packet, encode_packet,
    parse_fixed_header,
)
from pairmq.appliance.mqtt.packets import (
    Auth, Puback, Pubcomp, Pubrec, Pubrel, Suback, Subscribe, Subscription,
    Unsuback, Unsubscribe,
)
from pairmq.appliance.mqtt.properties import WILL, PropertyId
from pairmq.appliance.mqtt.publish import KEEP, Publish, PublishTemplate
from pairmq.appliance.mqtt.wire import (
    MQTT_3_1_1, MQTT_5, MalformedPacket, MqttError, PacketType, ProtocolError,
    ReasonCode,
)

__all__ = [
    "DEFAULT_MAX_PACKET_SIZE", "KEEP", "MQTT_3_1_1", "MQTT_5", "WILL",
    "Auth", "Connack", "Connect", "Disconnect", "FixedHeader", "MalformedPacket",
    "MqttError", "Packet", "PacketReader", "PacketType", "PingReq", "PingResp",
    "PropertyId", "ProtocolError", "Puback", "Pubcomp", "Publish",
    "PublishTemplate", "Pubrec", "Pubrel", "ReasonCode", "Suback", "Subscribe",
    "Subscription", "Unsuback", "Unsubscribe", "Will", "decode_packet",
    "encode_packet", "parse_fixed_header",
]

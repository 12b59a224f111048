"""PairMQ's MQTT front door: a sans-I/O codec and the asyncio listener.

`codec` frames and decodes packets with no I/O; `listener` is the thin asyncio
adapter that the redundancy core gates. Import the listener from its module
(`appliance.mqtt.listener`) so that codec users never pull in asyncio.
"""

from appliance.mqtt.codec import (
    DEFAULT_MAX_PACKET_SIZE, Connack, Connect, Disconnect, FixedHeader, Packet,
    PacketReader, PingReq, PingResp, UnsupportedPacket, Will, decode_packet,
    encode_packet, parse_fixed_header,
)
from appliance.mqtt.properties import WILL, PropertyId
from appliance.mqtt.wire import (
    MQTT_3_1_1, MQTT_5, MalformedPacket, MqttError, PacketType, ProtocolError,
    ReasonCode,
)

__all__ = [
    "DEFAULT_MAX_PACKET_SIZE", "MQTT_3_1_1", "MQTT_5", "WILL",
    "Connack", "Connect", "Disconnect", "FixedHeader", "MalformedPacket",
    "MqttError", "Packet", "PacketReader", "PacketType", "PingReq", "PingResp",
    "PropertyId", "ProtocolError", "ReasonCode", "UnsupportedPacket", "Will",
    "decode_packet", "encode_packet", "parse_fixed_header",
]

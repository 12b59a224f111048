"""Fuzz targets for every decoder that reads bytes from the network, and the invariant they share.

Rules (what a target checks; anything else escaping from a target is a finding):
- A decoder given any bytes returns a value or raises its documented protocol error, a
  `RemoteProtocolError`: `MqttError` (MQTT codec), `wire.Malformed` / `auth.Rejected` (heartbeats,
  8300), `MalformedMessage` / `TamperedFrame` (mate link, 8301), `ConfigLinkFault` (config-sync, 8302).
- Where the codec has an encoder, what was decoded encodes to bytes that decode to the same value
  (the heartbeat and mate-link layouts are strict, so there the bytes themselves come back).
- The first input byte picks a mode (protocol version, scope, chunking); the rest is the input, so
  one byte string replays the same case under atheris, hypothesis or a regression test.

Run one target coverage-guided (atheris, libFuzzer's flags after the name):
    python -m tests.harness.fuzz_targets mqtt_stream -runs=20000 CORPUS_DIR
`tests/sim/test_hostile_fuzz.py` runs every target with a fixed budget, and longer with --fuzz-minutes.
"""

from __future__ import annotations

import hashlib
import hmac
import sys
from collections.abc import Callable

from pairmq.appliance.errors import RemoteProtocolError
from pairmq.appliance.mqtt.codec import (
    Connect, FixedHeader, PacketReader, Will, decode_packet, parse_fixed_header,
)
from pairmq.appliance.mqtt.packets import Subscribe, Subscription, Unsubscribe
from pairmq.appliance.mqtt.properties import (
    WILL, PropertyId, decode_properties, encode_properties,
)
from pairmq.appliance.mqtt.publish import Publish
from pairmq.appliance.mqtt.wire import MQTT_3_1_1, MQTT_5, Cursor, MqttError, PacketType
from pairmq.appliance.quorum import auth as hb_auth
from pairmq.appliance.quorum import wire as hb_wire
from pairmq.appliance.roles import Role
from pairmq.appliance.spool.chain import CHECKSUM_BYTES, ChainPoint
from pairmq.appliance.spool.records import make_commit
from pairmq.configsync import exchange
from pairmq.configsync.document import ConfigDocument
from pairmq.configsync.store import Entry, Head
from pairmq.mate_link import messages as mate
from pairmq.mate_link.secure import SecureChannel, TamperedFrame

_VERSIONS = (MQTT_3_1_1, MQTT_5)
_SCOPES = (*PacketType, WILL)
_SECRET = b"fuzz-secret-" + bytes(20)
_GROUP = "fuzz"


# --- MQTT (1883/8883) -----------------------------------------------------------------------------

def _roundtrip_packet(packet, version: int, *, from_client: bool) -> None:
    data = packet.encode(version)
    header = parse_fixed_header(data, version)
    assert header is not None and header.packet_size == len(data), (packet, data)
    again = decode_packet(header, data[header.header_length:], version, from_client=from_client)
    assert again == packet, (packet, again)


def mqtt_stream(data: bytes) -> None:
    """What a client sends the broker: PacketReader over the bytes in chunks, behind a valid CONNECT
    (mode bit 0: MQTT 5 or 3.1.1; bit 1: the input is the whole stream, CONNECT included)."""
    if not data:
        return
    mode, rest = data[0], data[1:]
    version = _VERSIONS[mode & 1]
    stream = rest if mode & 2 else Connect(version, "fuzz").encode() + rest
    chunk = 1 + (mode >> 2) * 7  # 1..442 bytes per read, as a slow or a bulk sender
    reader = PacketReader(max_packet_size=1 << 16)
    try:
        for i in range(0, len(stream), chunk):
            reader.feed(stream[i:i + chunk])
            while (packet := reader.next_packet()) is not None:
                _roundtrip_packet(packet, reader.protocol_version, from_client=True)  # type: ignore[arg-type]
    except MqttError:
        pass


def mqtt_packet(data: bytes) -> None:
    """One packet body of any type, both directions (the client-side decoders too: CONNACK, SUBACK...).
    Mode: the fixed header's first byte; bit 0 of the second byte picks the version."""
    if len(data) < 2:
        return
    first, version, body = data[0], _VERSIONS[data[1] & 1], data[2:]
    try:
        header = parse_fixed_header(first.to_bytes(1, "big") + bytes([0]), version)
    except MqttError:
        return
    assert header is not None
    header = FixedHeader(header.packet_type, header.flags, len(body), 2)
    for from_client in (True, False):
        try:
            packet = decode_packet(header, body, version, from_client=from_client)
        except MqttError:
            continue
        _roundtrip_packet(packet, version, from_client=from_client)


def mqtt_properties(data: bytes) -> None:
    """One MQTT 5 property block in any scope (mode: the scope)."""
    if not data:
        return
    scope, block = _SCOPES[data[0] % len(_SCOPES)], data[1:]
    try:
        props = decode_properties(Cursor(block), scope)
    except MqttError:
        return
    encoded = encode_properties(props, scope)
    assert decode_properties(Cursor(encoded), scope) == props


# --- heartbeats (8300/udp) --------------------------------------------------------------------------

def heartbeat(data: bytes) -> None:
    """A datagram to a backup: the full check chain (malformed → ... → replayed). Mode bit 0 seals the
    input with the right key first, so the layout checks behind the MAC are reached too."""
    if not data:
        return
    datagram = data[1:]
    if data[0] & 1:
        datagram += hmac.digest(_HB_KEY, datagram, "sha256")
    receiver = hb_auth.HeartbeatAuth(_SECRET, _GROUP, Role.BACKUP)
    try:
        hb = receiver.open(datagram)
    except hb_auth.Rejected:
        hb = None
    try:
        header = hb_wire.peek_header(datagram)
        decoded = hb_wire.decode(datagram, header)
    except hb_wire.Malformed:
        assert hb is None, "the auth accepted what the layout refuses"
        return
    assert hb_wire.encode(decoded) == datagram[:header.body_end]


_HB_KEY = hb_auth.derive_key(_SECRET, _GROUP, Role.PRIMARY)


# --- mate link (8301) --------------------------------------------------------------------------------

def mate_message(data: bytes) -> None:
    """A mate-link message after the frame opened (what an authenticated but broken peer sends)."""
    try:
        message = mate.decode(data)
    except mate.MalformedMessage:
        return
    assert mate.encode(message) == data


def mate_frames(data: bytes) -> None:
    """The sealed-frame layer: mode bit 0 feeds the bytes raw (none may open), else they are sealed
    as real frames, delivered in chunks of 1..128 bytes, opened and decoded."""
    if not data:
        return
    mode, rest = data[0], data[1:]
    receiver = SecureChannel(send_key=_K2, receive_key=_K1)
    if mode & 1:
        receiver.receive_data(rest)
        try:
            frame = receiver.next_frame()
        except TamperedFrame:
            return
        assert frame is None, "a frame nobody sealed opened"
        return
    sender = SecureChannel(send_key=_K1, receive_key=_K2)
    cut = len(rest) // 2
    wire_bytes = sender.seal(rest[:cut]) + sender.seal(rest[cut:])
    chunk, opened = 1 + (mode >> 1), []
    for i in range(0, len(wire_bytes), chunk):
        receiver.receive_data(wire_bytes[i:i + chunk])
        while (frame := receiver.next_frame()) is not None:
            opened.append(frame)
    assert opened == [rest[:cut], rest[cut:]]
    for frame in opened:
        mate_message(frame)


_K1, _K2 = hashlib.sha256(b"one").digest(), hashlib.sha256(b"two").digest()


# --- config-sync (8302) ------------------------------------------------------------------------------

class _History:
    """An active's history of three changes (exchange.History), enough for a hello to be planned."""

    def __init__(self) -> None:
        self.document = ConfigDocument()
        self._chains = {v: hashlib.sha256(b"%d" % v).hexdigest() for v in range(4)}
        self.head = Head(3, self._chains[3], self.document.digest())

    def chain_at(self, version: int) -> str | None:
        return self._chains.get(version)

    def changes_after(self, version: int, limit: int | None = None) -> list[Entry] | None:
        if version not in self._chains:
            return None
        return [Entry(v, {"kind": "anonymous.set", "allowed": False}, self._chains[v]) for v in range(version + 1, 4)]


def configsync_message(data: bytes) -> None:
    """A config-sync message after the frame opened, handed to both ends of the exchange."""
    try:
        message = exchange.decode(data)
    except exchange.ConfigLinkFault:
        return
    assert exchange.decode(exchange.encode(message)) == message
    for end in (exchange.ActiveEnd(epoch=5, history=_History(), now_ms=0),
                exchange.StandbyEnd(epoch_seen=1, now_ms=0)):
        try:
            end.receive(message, 1)
        except RemoteProtocolError:
            pass


TARGETS: dict[str, Callable[[bytes], None]] = {
    "mqtt_stream": mqtt_stream,
    "mqtt_packet": mqtt_packet,
    "mqtt_properties": mqtt_properties,
    "heartbeat": heartbeat,
    "mate_message": mate_message,
    "mate_frames": mate_frames,
    "configsync_message": configsync_message,
}


# --- seeds: one valid input of each kind, so mutation starts inside the formats -------------------------

def _mqtt_seeds() -> list[bytes]:
    user = {PropertyId.USER_PROPERTY: (("k", "v"), ("k", "w"))}
    connect5 = Connect(MQTT_5, "c1", False, 30, Will("w/t", b"bye", 1, True, {PropertyId.WILL_DELAY_INTERVAL: 5}),
                       "user", b"pw", {PropertyId.SESSION_EXPIRY_INTERVAL: 60, **user})
    packets5 = [
        Publish("a/b", b"payload", 1, False, False, 7, {PropertyId.CONTENT_TYPE: "text", **user}),
        Subscribe(3, (Subscription("a/#", 1, True, False, 1), Subscription("+/x", 2)),
                  {PropertyId.SUBSCRIPTION_IDENTIFIER: (9,)}),
        Unsubscribe(4, ("a/#", "b")),
    ]
    packets4 = [Publish("t", b"x", 0), Subscribe(2, (Subscription("a/+", 1),)), Unsubscribe(5, ("a/+",))]
    seeds = [b"\x00" + b"".join(p.encode(MQTT_3_1_1) for p in packets4),
             b"\x01" + b"".join(p.encode(MQTT_5) for p in packets5),
             b"\x03" + connect5.encode() + packets5[0].encode(MQTT_5),
             b"\x02" + Connect(MQTT_3_1_1, "c", username="u", password=b"p").encode()]
    return seeds


def _packet_seeds() -> list[bytes]:
    out = []
    for version in _VERSIONS:
        for packet in [Publish("a/b", b"x", 1, False, False, 1, {PropertyId.USER_PROPERTY: (("a", "b"),)}
                               if version == MQTT_5 else {}),
                       Subscribe(1, (Subscription("a/#", 1),)), Unsubscribe(1, ("a",))]:
            data = packet.encode(version)
            header = parse_fixed_header(data, version)
            out.append(data[:1] + bytes([version == MQTT_5]) + data[header.header_length:])
    out.append(b"\x20\x01" + b"\x00\x00\x03\x21\x00\x0a")  # CONNACK v5 with Receive Maximum
    out.append(b"\x90\x01" + b"\x00\x01\x00\x01\x02")  # SUBACK v5
    return out


def _properties_seeds() -> list[bytes]:
    props = {PropertyId.USER_PROPERTY: (("a", "b"), ("c", "d")), PropertyId.CONTENT_TYPE: "t",
             PropertyId.MESSAGE_EXPIRY_INTERVAL: 10, PropertyId.CORRELATION_DATA: b"\x00\x01"}
    return [bytes([_SCOPES.index(PacketType.PUBLISH)]) + encode_properties(props, PacketType.PUBLISH),
            bytes([_SCOPES.index(PacketType.CONNECT)]) + encode_properties(
                {PropertyId.RECEIVE_MAXIMUM: 5, PropertyId.AUTHENTICATION_METHOD: "m"}, PacketType.CONNECT)]


def _heartbeat_seeds() -> list[bytes]:
    views = (hb_wire.PeerView(Role.BACKUP, 1, 3, 10, 20, 1, 1, 4), hb_wire.PeerView(Role.MONITOR, 1, 2))
    hb = hb_wire.Heartbeat(_GROUP, Role.PRIMARY, 7, 9, 2, hb_wire.Activity.ACTIVE, views,
                           flags=hb_wire.FLAG_MATE_IN_SYNC, spool_epoch=2, spool_seq=40, config_version=3)
    sealed = hb_auth.HeartbeatAuth(_SECRET, _GROUP, Role.PRIMARY).seal(hb)
    return [b"\x00" + sealed, b"\x01" + sealed[:-hb_wire.TAG_BYTES]]


def _mate_seeds() -> list[bytes]:
    point = ChainPoint(2, 10, b"\x01" * CHECKSUM_BYTES)
    return [mate.encode(m) for m in (
        mate.Join(2, point, 3), mate.Plan(2, mate.Catchup.INCREMENTAL, 4, point, 100),
        mate.Ops(2, (make_commit(point, 2, [b"body"]),)), mate.Ack(2, 11),
        mate.Snapshot(2, (b"a", b"bc"), point, 2, 3), mate.Image(2, 0, 4, b"abcd"),
        mate.ImageEnd(2, point, 4, b"\x03" * 32), mate.Ping(2, 5), mate.Pong(2, 5))]


def _configsync_seeds() -> list[bytes]:
    history = _History()
    messages = [
        exchange.Hello(1, 2, "d", ((2, history.chain_at(2)), (1, "x"))),
        exchange.Changes(5, tuple(history.changes_after(0))),
        exchange.Snapshot(5, 3, "c", history.document, -1, "r"),
        exchange.Ack(1, 3, "d"), exchange.Ping(1),
    ]
    return [exchange.encode(m) for m in messages]


SEEDS: dict[str, Callable[[], list[bytes]]] = {
    "mqtt_stream": _mqtt_seeds,
    "mqtt_packet": _packet_seeds,
    "mqtt_properties": _properties_seeds,
    "heartbeat": _heartbeat_seeds,
    "mate_message": _mate_seeds,
    "mate_frames": lambda: [b"\x00" + s for s in _mate_seeds()] + [b"\x01" + s for s in _mate_seeds()[:2]],
    "configsync_message": _configsync_seeds,
}


_INSTRUMENTED = ("pairmq.appliance.mqtt.wire", "pairmq.appliance.mqtt.properties", "pairmq.appliance.mqtt.packets",
                 "pairmq.appliance.mqtt.publish", "pairmq.appliance.mqtt.codec", "pairmq.appliance.quorum.wire", "pairmq.appliance.quorum.auth",
                 "pairmq.mate_link.messages", "pairmq.mate_link.secure", "pairmq.configsync.exchange", "pairmq.configsync.changes",
                 "pairmq.configsync.document", "pairmq.appliance.broker.access")


def _instrument(atheris) -> None:
    """Coverage for the decoders' modules only: `instrument_all` would take a minute over everything loaded."""
    for name in (*_INSTRUMENTED, __name__):  # the targets themselves too: their modes are branches
        module = sys.modules[name]
        for value in list(vars(module).values()):
            members = vars(value).values() if isinstance(value, type) and value.__module__ == name else [value]
            for member in members:
                for fn in (member, getattr(member, "__func__", None), getattr(member, "fget", None)):
                    if getattr(fn, "__code__", None) is not None and getattr(fn, "__module__", None) == name:
                        atheris.instrument_func(fn)


def main(argv: list[str]) -> None:
    """atheris over one target, the decoders' modules instrumented for coverage."""
    import atheris

    if len(argv) < 2 or argv[1] not in TARGETS:
        raise SystemExit(f"usage: python -m tests.harness.fuzz_targets {{{','.join(TARGETS)}}} [libFuzzer flags] [corpus]")
    _instrument(atheris)  # the decoders were imported above, before atheris could hook imports
    atheris.Setup([argv[0], *argv[2:]], TARGETS[argv[1]])
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv)

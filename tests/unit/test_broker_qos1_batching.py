"""The durable QoS 1 path's batching (docs/broker.md): what it must still do exactly.

A real BrokerService and MqttListener on an event loop in a background thread, raw MQTT clients over real
sockets. Checked here:
- a PUBACK is byte for byte what the general encoder makes (the connection writes SUCCESS acks without it),
  in 3.1.1 and 5.0, at the packet-id edges, and a v5 ack with a reason code still carries it;
- one window future per read (service.py's rules): every PUBLISH of a read, however many, is counted out of
  the in-flight window once its ack is out, so the window returns to 0 and a throttled client is read again;
  the acks keep PUBLISH order;
- the gate, asked once per read: a read after the gate closed is refused;
- a callback's packets for one connection go out in their order, whether the connection writes them itself
  (PUBACKs, PUBLISHes without properties of a topic seen before) or the session encodes them.
"""

from __future__ import annotations

import dataclasses
import struct
import time

import pytest

from pairmq.appliance.broker.service import BrokerService
from pairmq.appliance.mqtt.codec import Puback
from pairmq.appliance.mqtt.overload import OverloadLimits
from tests.harness.inprocess_broker import HOST, InProcessBroker
from tests.harness.mqttraw import DISCONNECT, PUBACK, PUBLISH, SUBACK, V5, V311, Raw, encode_props, utf8

WAIT_S = 10.0


class Broker(InProcessBroker):
    def __init__(self, tmp_path, overload: OverloadLimits | None = None) -> None:
        super().__init__(BrokerService.open(tmp_path / "spool", epoch=lambda: 1), overload)

    def inflight(self) -> dict[str, int]:
        return self.call(lambda: {c.client_id: c.inflight for c in self.listener.connections()})


@pytest.fixture
def make(tmp_path):
    made: list[Broker] = []
    clients: list[Raw] = []

    def broker(overload: OverloadLimits | None = None) -> Broker:
        b = Broker(tmp_path / f"b{len(made)}", overload)
        made.append(b)
        return b

    def client(b: Broker, version: int, client_id: str, **kw) -> Raw:
        c = Raw(version, HOST, b.port)
        clients.append(c)
        assert c.connect(client_id, **kw).reason_and_props()[0] == 0
        return c

    yield broker, client
    for c in clients:
        c.sock.close()
    for b in made:
        b.close()


def publishes(version: int, topic: str, packet_ids: list[int]) -> bytes:
    """QoS 1 PUBLISHes, encoded back to back: the test writes them in one send (one read for the broker)."""
    out = []
    for pid in packet_ids:
        body = utf8(topic) + struct.pack("!H", pid) + (b"\x00" if version == V5 else b"") + b"p%d" % pid
        out.append(bytes([0x32, len(body)]) + body)  # bodies stay under 128 bytes: one length byte
    return b"".join(out)


@pytest.mark.parametrize("version", [V311, V5])
def test_a_puback_is_what_the_encoder_makes(make, version):
    broker, client = make
    b = broker()
    sub = client(b, version, "sub", clean=False)
    assert sub.subscribe(1, "t", 1).type == SUBACK
    pub = client(b, version, "pub")
    for pid in (1, 255, 256, 0x7FFF, 65535):
        pub.publish("t", b"x", qos=1, packet_id=pid)
        ack = pub.expect(PUBACK)
        assert (ack.type << 4).to_bytes(1, "big") + bytes([len(ack.body)]) + ack.body \
            == Puback(pid).encode(version), (pid, ack)
        assert struct.unpack("!H", ack.body[:2])[0] == pid


def test_a_v5_ack_with_a_reason_code_keeps_it(make):
    broker, client = make
    b = broker()
    pub = client(b, V5, "pub")
    pub.publish("nobody/listens", b"x", qos=1, packet_id=9)  # v5: 0x10, no matching subscribers
    ack = pub.expect(PUBACK)
    assert ack.body == b"\x00\x09\x10", ack.body
    assert ack.reason_and_props()[0] == 0x10


@pytest.mark.parametrize("count", [1, 40, 300])
def test_every_publish_of_one_read_leaves_the_window(make, count):
    """300 PUBLISHes in one send: more than the window (100) and than PACKETS_PER_TURN (256), so the read is
    throttled and split across callbacks; each callback's PUBLISHes share one future."""
    broker, client = make
    b = broker()
    sub = client(b, V311, "sub", clean=False)
    assert sub.subscribe(1, "t", 1).type == SUBACK
    pub = client(b, V311, "pub")
    pids = list(range(1, count + 1))
    pub.sock.sendall(publishes(V311, "t", pids))
    acked = [struct.unpack("!H", pub.expect(PUBACK).body)[0] for _ in pids]
    assert acked == pids  # all of them, in PUBLISH order
    deadline = time.monotonic() + WAIT_S
    while b.inflight().get("pub") != 0:
        if time.monotonic() > deadline:
            pytest.fail(f"the publisher's in-flight count stayed at {b.inflight()} after every PUBACK")
        time.sleep(0.01)
    # Read again after all that: a window left counting would stop the socket being read.
    pub.publish("t", b"after", qos=1, packet_id=count + 1)
    assert struct.unpack("!H", pub.expect(PUBACK).body)[0] == count + 1


def test_a_small_window_throttles_and_recovers(make):
    broker, client = make
    b = broker(OverloadLimits(max_window=5))
    sub = client(b, V311, "sub", clean=False)
    assert sub.subscribe(1, "t", 1).type == SUBACK
    pub = client(b, V311, "pub")
    pids = list(range(1, 61))
    pub.sock.sendall(publishes(V311, "t", pids))
    assert [struct.unpack("!H", pub.expect(PUBACK).body)[0] for _ in pids] == pids
    assert b.call(lambda: b.listener.throttle_events) >= 1, "a window of 5 was never full with 60 in one read"


def test_one_reads_deliveries_keep_their_order_however_each_is_encoded(make):
    broker, client = make
    b = broker()
    sub = client(b, V5, "sub")
    assert sub.subscribe(1, "o", 0).type == SUBACK
    pub = client(b, V5, "pub")
    frames = []
    for i in range(8):  # every third one carries a user property: the session's encoder for those
        props = encode_props([(0x26, ("n", str(i)))] if i % 3 == 1 else [])
        body = utf8("o") + props + b"m%d" % i
        frames.append(bytes([0x30, len(body)]) + body)
    pub.sock.sendall(b"".join(frames))  # one read: one callback's deliveries to `sub`
    got = [sub.expect(PUBLISH).publish() for _ in range(8)]
    assert [payload for _t, _pid, _p, payload in got] == [b"m%d" % i for i in range(8)]
    assert [bool(props) for _t, _pid, props, _payload in got] == [i % 3 == 1 for i in range(8)]


def test_a_read_after_the_gate_closed_is_refused(make):
    broker, client = make
    b = broker()
    pub = client(b, V5, "pub")
    pub.publish("t", b"x", qos=1, packet_id=1)
    assert pub.expect(PUBACK).reason_and_props()[0] == 0x10
    b.gate.serving = False
    pub.publish("t", b"y", qos=1, packet_id=2)
    got = pub.closed()
    assert [p.type for p in got] == [DISCONNECT] and got[0].reason_and_props()[0] == 0x8B, got


def test_a_subscribe_whose_retained_messages_pass_a_commits_bound_gets_its_suback_and_all_of_them(tmp_path):
    """The SUBSCRIBE's ops (its subscription and a queued copy of each retained match) are more than one
    commit may hold: they go in slices, and the SUBACK and every retained message still arrive."""
    service = BrokerService.open(tmp_path / "spool", epoch=lambda: 1)
    service.writer.limits = dataclasses.replace(service.writer.limits, max_batch_ops=16)
    b = InProcessBroker(service)
    try:
        pub = Raw(V5, HOST, b.port)
        assert pub.connect("retainer").reason_and_props()[0] == 0
        for i in range(40):
            pub.send(0x33, utf8(f"r/{i}") + struct.pack("!H", i + 1) + b"\x00" + b"kept")  # QoS 1, RETAIN
            assert pub.expect(PUBACK).body[:2] == struct.pack("!H", i + 1)
        sub = Raw(V5, HOST, b.port)
        assert sub.connect("sub", clean=False).reason_and_props()[0] == 0
        assert sub.subscribe(1, "r/#", 1).codes() == [1]
        topics = set()
        while len(topics) < 40:
            packet = sub.recv()
            assert packet is not None, f"closed after {len(topics)} retained messages"
            if packet.type == PUBLISH:
                topic, packet_id, _props, payload = packet.publish()
                assert payload == b"kept"
                topics.add(topic)
                sub.ack(PUBACK, packet_id)
        assert topics == {f"r/{i}" for i in range(40)}
        for c in (pub, sub):
            c.close()
    finally:
        b.close()

"""No silent loss at the limits (real group, raw MQTT clients): a full queue or spool refuses, counts, keeps.

The group file's [limits] table is made small here (50 queued messages per
session, a 64 KiB spool) so the limits are reached in a few dozen messages.
mosquitto's defaults drop QoS 1 messages to a subscriber more than 1,000
behind after acknowledging them to the publisher; PairMQ refuses the publish
instead (docs/broker.md "Limits"): MQTT 5 gets PUBACK 0x97 with a reason
string, MQTT 3.1.1 (no negative ack) is disconnected without a PUBACK, and
each refusal is counted in the management API's GET /api/v1/message-spool
(`counters.publish_refused_queue_full`, `counters.publish_refused_spool_full`).
Every test checks the other half: each message the publisher got PUBACK 0 for
reaches the subscriber, in order, once it reads again.
"""

from __future__ import annotations

import json
import urllib.error

import pytest

from pairmq.appliance.config import Limits
from pairmq.appliance.roles import Role
from tests.harness.group import Group, active_group
from tests.harness.mqttraw import PUBACK, PUBLISH, V5, V311, Raw
from tests.processes.test_broker_interop import raws  # noqa: F401  (a fixture)

QUEUE_LIMIT = 50
SPOOL_LIMIT_BYTES = 64 * 1024
SESSION_EXPIRY = [(0x11, 600)]  # v5 Session Expiry Interval: the session outlives the connection
QUOTA_EXCEEDED = 0x97


@pytest.fixture(scope="module")
def group(tmp_path_factory):
    limits = Limits(session_queue_max_messages=QUEUE_LIMIT, spool_max_bytes=SPOOL_LIMIT_BYTES)
    with active_group(tmp_path_factory.mktemp("limits") / "group", limits=limits) as g:
        yield g


def spool_view(group: Group) -> dict:
    return group.api(Role.PRIMARY, "/api/v1/message-spool")


def test_the_spool_view_is_on_routing_nodes_only(group):
    view = spool_view(group)
    assert view["limits"] == {"session_queue_max_messages": QUEUE_LIMIT, "session_queue_max_bytes": 64 << 20,
                              "spool_max_bytes": SPOOL_LIMIT_BYTES}
    with pytest.raises(urllib.error.HTTPError) as refused:
        group.api(Role.MONITOR, "/api/v1/message-spool")
    assert refused.value.code == 404
    assert json.load(refused.value) == {"error": "the monitor routes no messages: it has no message spool"}


def offline_subscriber(raws, client_id: str, topic: str) -> None:
    sub = raws(V5)
    assert sub.connect(client_id, clean=True, properties=SESSION_EXPIRY).reason_and_props()[0] == 0
    assert sub.subscribe(1, topic, 1).codes() == [1]
    sub.disconnect()
    assert sub.closed() == []


def publish_all(pub: Raw, topic: str, payloads: list[bytes]) -> dict[int, tuple[int, dict]]:
    """Pipeline every QoS 1 PUBLISH (packet ids 1..n), then read the PUBACKs: packet id -> (reason, props)."""
    for i, payload in enumerate(payloads):
        pub.publish(topic, payload, qos=1, packet_id=i + 1)
    acks = {}
    for _ in payloads:
        packet = pub.expect(PUBACK)
        acks[int.from_bytes(packet.body[:2], "big")] = packet.reason_and_props()
    assert list(acks) == list(range(1, len(payloads) + 1)), "PUBACKs (refusals too) come in PUBLISH order"
    return acks


def drain(sub: Raw, expected: int) -> list[bytes]:
    """Read `expected` PUBLISHes, acking each, then prove with a barrier that nothing else is queued."""
    got = []
    while len(got) < expected:
        packet = sub.recv()
        assert packet is not None, f"closed after {len(got)} of {expected} messages"
        assert packet.type == PUBLISH, packet
        topic, packet_id, _, payload = packet.publish()
        got.append(payload)
        sub.ack(PUBACK, packet_id)
    extra = [p for p in sub.barrier() if p.type == PUBLISH]
    assert extra == [], f"{len(extra)} messages more than were acknowledged"
    return got


def test_full_queue_refuses_v5_publishes_with_0x97_and_delivers_every_acked_one(group, raws):
    offline_subscriber(raws, "lim-q5-sub", "lim/q5")
    before = spool_view(group)["counters"]["publish_refused_queue_full"]
    pub = raws(V5)
    pub.connect("lim-q5-pub")
    payloads = [b"m%d" % i for i in range(QUEUE_LIMIT + 30)]
    acks = publish_all(pub, "lim/q5", payloads)
    accepted = [payloads[pid - 1] for pid, (code, _) in sorted(acks.items()) if code == 0]
    refused = [pid for pid, (code, _) in acks.items() if code == QUOTA_EXCEEDED]
    assert accepted == payloads[:QUEUE_LIMIT] and len(refused) == 30, acks
    assert "lim-q5-sub is full" in acks[QUEUE_LIMIT + 1][1][0x1F]  # the reason string names the full queue
    assert pub.barrier() == []  # the publisher stays connected: the refusal is per message
    view = spool_view(group)
    assert view["counters"]["publish_refused_queue_full"] - before == 30
    assert view["limits"]["session_queue_max_messages"] == QUEUE_LIMIT

    sub = raws(V5)
    assert sub.connect("lim-q5-sub", clean=False, properties=SESSION_EXPIRY).reason_and_props()[0] == 0
    assert drain(sub, QUEUE_LIMIT) == accepted


def test_full_queue_disconnects_a_311_publisher_without_ack_while_the_subscriber_stops_reading(group, raws):
    sub = raws(V311)
    assert sub.connect("lim-q3-sub", clean=False).reason_and_props()[0] == 0
    assert sub.subscribe(1, "lim/q3", 1).codes() == [1]
    # From here the subscriber reads nothing: its 32-message window fills, the rest waits in its queue.
    before = spool_view(group)["counters"]["publish_refused_queue_full"]
    pub = raws(V311)
    assert pub.connect("lim-q3-pub").reason_and_props()[0] == 0
    payloads = [b"n%d" % i for i in range(QUEUE_LIMIT + 20)]
    for i, payload in enumerate(payloads):
        pub.publish("lim/q3", payload, qos=1, packet_id=i + 1)
    answered = pub.closed()  # 3.1.1 has no negative ack: the broker closes the connection
    assert all(p.type == PUBACK for p in answered), answered
    acked = [int.from_bytes(p.body[:2], "big") for p in answered]
    assert acked == list(range(1, QUEUE_LIMIT + 1)), "the first 50 are acked, the 51st is refused by a close"
    assert spool_view(group)["counters"]["publish_refused_queue_full"] - before == 1

    assert drain(sub, QUEUE_LIMIT) == payloads[:QUEUE_LIMIT]


def test_full_spool_refuses_publishes_with_0x97_and_drops_no_client(group, raws):
    offline_subscriber(raws, "lim-s-sub", "lim/s")
    bystander = raws(V5)
    assert bystander.connect("lim-s-bystander").reason_and_props()[0] == 0
    before = spool_view(group)["counters"]
    pub = raws(V5)
    pub.connect("lim-s-pub")
    payloads = [bytes([i]) * 2048 for i in range(40)]  # 40 x 2 KiB: more than the 64 KiB spool
    acks = publish_all(pub, "lim/s", payloads)
    codes = [acks[i + 1][0] for i in range(len(payloads))]
    first_refused = codes.index(QUOTA_EXCEEDED)
    assert 20 <= first_refused < 32 and set(codes[first_refused:]) == {QUOTA_EXCEEDED}, codes
    assert "message spool is full" in acks[first_refused + 1][1][0x1F]
    after = spool_view(group)
    assert after["counters"]["publish_refused_spool_full"] - before["publish_refused_spool_full"] == \
        len(payloads) - first_refused
    assert after["counters"]["publish_refused_queue_full"] == before["publish_refused_queue_full"]
    assert after["counters"]["commit_failures"] == 0
    assert after["stored_bytes"] <= SPOOL_LIMIT_BYTES
    # Nobody was dropped: the publisher and a bystander still get their PINGRESP.
    assert pub.barrier() == [] and bystander.barrier() == []

    sub = raws(V5)
    assert sub.connect("lim-s-sub", clean=False, properties=SESSION_EXPIRY).reason_and_props()[0] == 0
    assert drain(sub, first_refused) == payloads[:first_refused]
    # The delivered bodies are freed: the spool takes publishes again.
    pub.publish("lim/s", b"again", qos=1, packet_id=100)
    assert pub.expect(PUBACK).reason_and_props()[0] == 0
    assert drain(sub, 1) == [b"again"]

"""Interop against a real group: PUBLISH flows, redelivery, flow control, aliases, properties, expiry.

Shared rig and clients: tests/processes/test_broker_interop.py (its module docstring says how
"nothing arrived" is shown without sleeping).
"""

from __future__ import annotations

import time

import pytest

from tests.processes.test_broker_interop import (  # noqa: F401  (group, topic, clients, raws are fixtures)
    PUBACK, PUBCOMP, PUBLISH, PUBREC, PUBREL, V5, V311, VERSIONS, WAIT_S, cid, clients, group, mosquitto, raws,
    topic,
)

QOS = pytest.mark.parametrize("qos", [0, 1, 2])


# === PUBLISH QoS 0/1/2, both directions ========================================================


@VERSIONS
@QOS
def test_paho_publish_and_deliver_at_each_qos(clients, topic, version, qos):
    sub = clients(cid(topic, "sub"), version=version)
    assert sub.subscribe(topic, qos=2) == [2]
    pub = clients(cid(topic, "pub"), version=version)
    payload = bytes(range(256)) * 4  # binary, not UTF-8
    if qos:
        reason, _ = pub.publish(topic, payload, qos=qos)
        assert reason == 0
    else:
        pub.publish(topic, payload, qos=0)
    got = sub.get()
    assert (got.topic, got.payload, got.qos, got.retain) == (topic, payload, qos, False)


@pytest.mark.parametrize("pub_version, sub_version", [(V311, V5), (V5, V311)], ids=["v311-to-v5", "v5-to-v311"])
def test_publish_across_protocol_versions(clients, topic, pub_version, sub_version):
    sub = clients(cid(topic, "sub"), version=sub_version)
    sub.subscribe(topic, qos=2)
    pub = clients(cid(topic, "pub"), version=pub_version)
    extra = {"UserProperty": [("k", "v")]} if pub_version == V5 else {}
    pub.publish(topic, b"across", qos=2, **extra)
    got = sub.get()
    assert (got.payload, got.qos) == (b"across", 2)
    assert "UserProperty" not in got.properties, "a 3.1.1 subscriber has no properties to get"


@VERSIONS
@QOS
def test_mosquitto_pub_to_paho_sub(clients, topic, version, qos):
    sub = clients(cid(topic, "sub"), version=version)
    sub.subscribe(topic, qos=2)
    done = mosquitto("mosquitto_pub", version, "-i", cid(topic, "mpub"), "-q", str(qos), "-t", topic, "-m", "hello")
    assert done.returncode == 0, done.stderr
    got = sub.get()
    assert (got.topic, got.payload, got.qos) == (topic, b"hello", qos)


@VERSIONS
def test_paho_pub_to_mosquitto_sub(clients, topic, version):
    """mosquitto_sub makes a persistent session (-c, exits once subscribed), paho publishes, mosquitto_sub
    comes back for the queued QoS 1 and 2 messages."""
    sub_id = cid(topic, "msub")
    made = mosquitto("mosquitto_sub", version, "-c", "-i", sub_id, "-q", "2", "-t", f"{topic}/#", "-E")
    assert made.returncode == 0, made.stderr
    pub = clients(cid(topic, "pub"), version=version)
    assert pub.publish(f"{topic}/one", b"first", qos=1)[0] == 0
    assert pub.publish(f"{topic}/two", b"second", qos=2)[0] == 0
    got = mosquitto("mosquitto_sub", version, "-c", "-i", sub_id, "-q", "2", "-t", f"{topic}/#",
                    "-C", "2", "-W", "5", "-F", "%t %q %p")
    assert got.returncode == 0, got.stderr
    assert got.stdout.splitlines() == [f"{topic}/one 1 first", f"{topic}/two 2 second"]


@VERSIONS
def test_a_burst_arrives_once_each_and_in_order(clients, topic, version):
    """More than the broker's in-flight window (32 towards 3.1.1), published without waiting for acks.

    Order is kept per QoS (MQTT 5 §4.6 asks no more): a QoS 2 copy is sent only once its in-flight
    record is durable (docs/broker.md rule 3), and paho hands it over only at PUBREL, so QoS 1 copies
    queued behind it may pass it.
    """
    sub = clients(cid(topic, "sub"), version=version)
    sub.subscribe(topic, qos=2)
    pub = clients(cid(topic, "pub"), version=version)
    count = 300
    infos = [pub.client.publish(topic, str(i), qos=1 + i % 2) for i in range(count)]
    for info in infos:
        info.wait_for_publish(WAIT_S)
    got = [(int(m.payload), m.qos) for m in (sub.get() for _ in range(count))]
    for qos in (1, 2):
        assert [i for i, q in got if q == qos] == [i for i in range(count) if 1 + i % 2 == qos]
    sub.subscribe(f"{topic}/marker", qos=2)
    pub.publish(f"{topic}/marker", b"", qos=2)
    assert sub.until(f"{topic}/marker") == [], "none twice"


@VERSIONS
def test_qos_downgraded_to_the_subscription_and_never_upgraded(clients, topic, version):
    sub = clients(cid(topic, "sub"), version=version)
    assert sub.subscribe(f"{topic}/zero", qos=0) == [0]
    assert sub.subscribe(f"{topic}/one", qos=1) == [1]
    assert sub.subscribe(f"{topic}/two", qos=2) == [2]
    pub = clients(cid(topic, "pub"), version=version)
    pub.publish(f"{topic}/zero", b"2->0", qos=2)
    assert sub.get().qos == 0
    pub.publish(f"{topic}/one", b"2->1", qos=2)
    assert sub.get().qos == 1
    pub.publish(f"{topic}/two", b"1 stays 1", qos=1)
    assert sub.get().qos == 1
    pub.publish(f"{topic}/two", b"0 stays 0", qos=0)
    assert sub.get().qos == 0


# === redelivery ================================================================================


def _persistent(raw, client_id: str, clean: bool):
    if raw.version == V5:
        return raw.connect(client_id, clean=clean, properties=[(0x11, 300)])
    return raw.connect(client_id, clean=clean)


@VERSIONS
@pytest.mark.parametrize("qos", [1, 2])
def test_unacknowledged_message_resent_with_dup_and_same_packet_id(clients, raws, topic, version, qos):
    client_id = cid(topic, "forgets")
    first = raws(version)
    _persistent(first, client_id, clean=False)
    suback = first.subscribe(1, topic, qos)
    assert suback.body[-1] == qos
    clients(cid(topic, "pub"), version=version).publish(topic, b"ack me", qos=qos)
    sent = first.recv()
    assert sent.type == PUBLISH and not sent.dup and sent.qos == qos
    _, packet_id, _, payload = sent.publish()
    first.disconnect()  # a clean DISCONNECT, without acking
    assert first.closed() == []

    again = raws(version)
    connack = _persistent(again, client_id, clean=False)
    assert connack.body[0] == 1, "session present"
    resent = again.recv()
    assert resent.type == PUBLISH and resent.dup and resent.qos == qos
    assert resent.publish()[1] == packet_id and resent.publish()[3] == payload == b"ack me"
    if qos == 1:
        again.ack(PUBACK, packet_id)
    else:
        again.ack(PUBREC, packet_id)
        assert again.recv().type == PUBREL
        again.ack(PUBCOMP, packet_id)
    assert again.barrier() == [], "acked: nothing more to send"


@VERSIONS
def test_pubrel_resent_after_reconnect(clients, raws, topic, version):
    client_id = cid(topic, "half")
    first = raws(version)
    _persistent(first, client_id, clean=False)
    first.subscribe(1, topic, 2)
    clients(cid(topic, "pub"), version=version).publish(topic, b"two phases", qos=2)
    packet_id = first.expect(PUBLISH).publish()[1]
    first.ack(PUBREC, packet_id)
    assert first.expect(PUBREL).body[:2] == packet_id.to_bytes(2, "big")
    first.close()  # before PUBCOMP

    again = raws(version)
    _persistent(again, client_id, clean=False)
    assert again.expect(PUBREL).body[:2] == packet_id.to_bytes(2, "big"), "the PUBREL, not the PUBLISH again"
    again.ack(PUBCOMP, packet_id)
    assert again.barrier() == []


# === flow control ==============================================================================


def test_v5_receive_maximum_bounds_the_messages_in_flight(clients, raws, topic):
    raw = raws(V5)
    raw.connect(cid(topic, "slow"), properties=[(0x21, 2)])  # Receive Maximum 2
    raw.subscribe(1, topic, 1)
    pub = clients(cid(topic, "pub"), version=V5)
    for i in range(5):
        pub.publish(topic, f"m{i}".encode(), qos=1)  # acked: the broker has written what it will send
    first_two = raw.barrier()
    assert [p.publish()[3] for p in first_two] == [b"m0", b"m1"]
    # What an ack lets out is sent once the ack's commit is durable: wait for it, then the barrier shows
    # nothing came with it.
    raw.ack(PUBACK, first_two[0].publish()[1])
    third = raw.expect(PUBLISH)
    assert third.publish()[3] == b"m2"
    assert raw.barrier() == [], "one ack opens one slot"
    for p in (first_two[1], third):
        raw.ack(PUBACK, p.publish()[1])
    rest = [raw.expect(PUBLISH), raw.expect(PUBLISH)]
    assert [p.publish()[3] for p in rest] == [b"m3", b"m4"]
    for p in rest:
        raw.ack(PUBACK, p.publish()[1])
    pub.publish(topic, b"m5", qos=1)
    assert raw.expect(PUBLISH).publish()[3] == b"m5", "nothing else was left"


def test_v5_small_window_with_prompt_acks_keeps_the_order(clients, raws, topic):
    """What an ack lets out waits behind earlier commits: it never overtakes a send already waiting for
    one, nor goes out before its own message is durable (docs/broker.md rule 2)."""
    raw = raws(V5)
    raw.connect(cid(topic, "quick"), properties=[(0x21, 2)])  # Receive Maximum 2
    raw.subscribe(1, topic, 1)
    pub = clients(cid(topic, "pub"), version=V5)
    count = 300
    infos = [pub.client.publish(topic, str(i), qos=1) for i in range(count)]
    got = []
    while len(got) < count:
        packet = raw.expect(PUBLISH)
        _, packet_id, _, payload = packet.publish()
        raw.ack(PUBACK, packet_id)
        got.append(int(payload))
    for info in infos:
        info.wait_for_publish(WAIT_S)
    assert got == list(range(count))


# === topic aliases =============================================================================


def test_v5_inbound_topic_alias(clients, topic):
    sub = clients(cid(topic, "sub"), version=V5)
    sub.subscribe(topic, qos=1)
    old = clients(cid(topic, "old"), version=V311)
    old.subscribe(topic, qos=1)
    pub = clients(cid(topic, "pub"), version=V5)
    assert pub.connack_props.TopicAliasMaximum >= 1
    pub.publish(topic, b"sets alias 1", qos=1, TopicAlias=1)
    pub.publish("", b"uses alias 1", qos=1, TopicAlias=1)
    for client in (sub, old):
        got = [client.get(), client.get()]
        assert [(m.topic, m.payload) for m in got] == [(topic, b"sets alias 1"), (topic, b"uses alias 1")]
        assert all("TopicAlias" not in m.properties for m in got), "aliases are per connection"


def test_v5_outbound_topic_alias(clients, raws, topic):
    raw = raws(V5)
    raw.connect(cid(topic, "aliased"), properties=[(0x22, 5)])  # Topic Alias Maximum 5
    raw.subscribe(1, f"{topic}/#", 0)
    pub = clients(cid(topic, "pub"), version=V5)
    for sub_topic in ("a", "a", "b", "a", "b"):
        pub.publish(f"{topic}/{sub_topic}", sub_topic.encode(), qos=1)
    got = [p.publish() for p in raw.barrier()]
    seen = [(t, p.get(0x23), payload) for t, _, p, payload in got]
    assert seen == [(f"{topic}/a", 1, b"a"), ("", 1, b"a"), (f"{topic}/b", 2, b"b"), ("", 1, b"a"), ("", 2, b"b")]


def test_v5_no_outbound_alias_without_topic_alias_maximum(clients, raws, topic):
    raw = raws(V5)
    raw.connect(cid(topic, "plain"))
    raw.subscribe(1, topic, 0)
    pub = clients(cid(topic, "pub"), version=V5)
    pub.publish(topic, b"1", qos=1)
    pub.publish(topic, b"2", qos=1)
    got = [p.publish() for p in raw.barrier()]
    assert [(t, 0x23 in p) for t, _, p, _ in got] == [(topic, False), (topic, False)]


# === properties ================================================================================


def test_v5_publish_properties_pass_through_unchanged(clients, topic):
    sub = clients(cid(topic, "sub"), version=V5)
    sub.subscribe(topic, qos=1)
    pub = clients(cid(topic, "pub"), version=V5)
    sent = {"PayloadFormatIndicator": 1, "ContentType": "application/json; charset=utf-8",
            "ResponseTopic": f"{topic}/reply", "CorrelationData": b"\x00\x01corr\xff",
            "UserProperty": [("a", "1"), ("b", "two"), ("a", "3"), ("ünï", "cødé")]}
    pub.publish(topic, '{"k": "v"}', qos=1, **sent)
    got = sub.get()
    assert got.payload == b'{"k": "v"}'
    assert {k: got.properties.get(k) for k in sent} == sent


# === message expiry ============================================================================


def test_message_expiry_drops_what_waited_too_long_for_an_offline_session(clients, topic):
    """v5 and 3.1.1 offline sessions; what expires is gone, the rest comes with its remaining lifetime."""
    ids = {V5: cid(topic, "v5"), V311: cid(topic, "v311")}
    for version, client_id in ids.items():
        sub = clients(client_id, version=version, clean=False, expiry_s=300)
        sub.subscribe(topic, qos=2)
        sub.disconnect()
    pub = clients(cid(topic, "pub"), version=V5)
    pub.publish(topic, b"short q1", qos=1, MessageExpiryInterval=1)
    pub.publish(topic, b"short q2", qos=2, MessageExpiryInterval=1)
    pub.publish(topic, b"long", qos=1, MessageExpiryInterval=60)
    pub.publish(topic, b"forever", qos=1)
    time.sleep(2.2)  # the expiry itself: no event to wait on (the broker ticks each second)
    for version, client_id in ids.items():
        back = clients(client_id, version=version, clean=False, expiry_s=300)
        assert back.session_present
        back.subscribe(f"{topic}/marker", qos=2)
        pub.publish(f"{topic}/marker", b"", qos=2)
        got = back.until(f"{topic}/marker")
        assert [m.payload for m in got] == [b"long", b"forever"]
        if version == V5:
            assert 55 <= got[0].properties["MessageExpiryInterval"] <= 58, "the lifetime left, not the original"
            assert "MessageExpiryInterval" not in got[1].properties

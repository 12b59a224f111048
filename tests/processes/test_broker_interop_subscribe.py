"""Interop against a real group: SUBSCRIBE/UNSUBSCRIBE, wildcards, `$` topics, subscription options,
subscription identifiers, shared subscriptions, refusals with reason codes.

Shared rig and clients: tests/processes/test_broker_interop.py.
"""

from __future__ import annotations

from paho.mqtt.subscribeoptions import SubscribeOptions

from tests.processes.test_broker_interop import (  # noqa: F401  (group, topic, clients, raws are fixtures)
    PUBACK, PUBREC, V5, V311, VERSIONS, WAIT_S, cid, clients, group, raws, topic,
)


@VERSIONS
def test_plus_and_hash_wildcards_then_unsubscribe(clients, topic, version):
    sub = clients(cid(topic, "sub"), version=version)
    assert sub.subscribe(f"{topic}/+/c", f"{topic}/x/#", qos=1) == [1, 1]
    pub = clients(cid(topic, "pub"), version=version)
    for t in ("a/c", "a/b/c", "x", "x/y/z", "y/z", "/c", "a/c/d"):
        pub.publish(f"{topic}/{t}", t, qos=1)
    pub.publish(f"{topic}/x/marker", b"", qos=2)
    got = [m.topic.removeprefix(f"{topic}/") for m in sub.until(f"{topic}/x/marker")]
    assert got == ["a/c", "x", "x/y/z", "/c"], "+ is one level (maybe empty); # includes its parent level"

    assert sub.unsubscribe(f"{topic}/+/c") == ([0] if version == V5 else [])
    if version == V5:
        assert sub.unsubscribe(f"{topic}/never") == [0x11], "No subscription existed"
    pub.publish(f"{topic}/a/c", b"after unsubscribe", qos=1)
    pub.publish(f"{topic}/x/marker", b"", qos=2)
    assert sub.until(f"{topic}/x/marker") == []


def test_v5_publish_to_sys_is_refused_with_a_reason(clients, topic):
    """Only $SYS is the broker's: other $ topics are published like any (tests/processes/test_sys_topics.py)."""
    watcher = clients(cid(topic, "all"), version=V5)
    watcher.subscribe("#", f"$SYS/{topic}/#", qos=1)
    pub = clients(cid(topic, "pub"), version=V5)
    reason, props = pub.publish(f"$SYS/{topic}/q1", b"nope", qos=1)
    assert reason == 0x90 and props.ReasonString == "topics under $SYS are the broker's"
    pub.publish(f"$SYS/{topic}/q0", b"nope", qos=0)  # nothing to answer with: dropped, the connection stays
    assert pub.publish(f"{topic}/marker", b"", qos=2)[0] == 0
    assert [m.topic for m in watcher.until(f"{topic}/marker") if m.topic.startswith("$")] == []
    assert pub.disconnects.empty()


def test_v5_qos2_publish_to_sys_gets_pubrec_with_a_reason(raws, topic):
    """(paho sends PUBREL even after a failed PUBREC, and then reports the PUBCOMP: a raw socket shows the PUBREC.)"""
    raw = raws(V5)
    raw.connect(cid(topic, "pub"))
    raw.publish(f"$SYS/{topic}", b"nope", qos=2, packet_id=5)
    pubrec = raw.expect(PUBREC)
    assert pubrec.body[:2] == b"\x00\x05"
    assert pubrec.reason_and_props() == (0x90, {0x1F: "topics under $SYS are the broker's"})
    assert raw.barrier() == [], "the exchange ends there; the connection stays"


@VERSIONS
def test_a_will_on_a_sys_topic_is_refused_at_connect(raws, topic, version):
    """A will is published for its client: the $SYS rule holds for it too."""
    raw = raws(version)
    connack = raw.connect(cid(topic, "sneaky"), will=(f"$SYS/{topic}", b"nope", 1, False, []))
    if version == V5:
        assert connack.reason_and_props() == (0x90, {0x1F: "will topics under $SYS are the broker's"})
        assert raw.closed() == []
    else:
        assert connack is None, "3.1.1 has no return code for it: closed without a CONNACK"


@VERSIONS
def test_a_will_on_another_dollar_topic_is_accepted(raws, topic, version):
    raw = raws(version)
    connack = raw.connect(cid(topic, "dollar-will"), will=(f"$x/{topic}", b"fine", 1, False, []))
    assert connack is not None and connack.body[1] == 0


@VERSIONS
def test_overlapping_subscriptions_give_one_copy_at_the_highest_qos(clients, topic, version):
    sub = clients(cid(topic, "sub"), version=version)
    if version == V5:
        assert sub.subscribe(f"{topic}/#", qos=1, sub_id=1) == [1]
        assert sub.subscribe(f"{topic}/+", qos=2, sub_id=2) == [2]
        assert sub.subscribe(f"{topic}/a", qos=0, sub_id=3) == [0]
    else:
        assert sub.subscribe(f"{topic}/#", f"{topic}/+", f"{topic}/a", qos=1) == [1, 1, 1]
        assert sub.subscribe(f"{topic}/+", qos=2) == [2]
    pub = clients(cid(topic, "pub"), version=version)
    pub.publish(f"{topic}/a", b"once", qos=2)
    pub.publish(f"{topic}/marker", b"", qos=2)
    got = sub.until(f"{topic}/marker")
    assert [(m.payload, m.qos) for m in got] == [(b"once", 2)]
    if version == V5:
        assert sorted(got[0].properties["SubscriptionIdentifier"]) == [1, 2, 3]


def test_v5_subscription_identifiers(clients, topic):
    sub = clients(cid(topic, "sub"), version=V5)
    sub.subscribe(f"{topic}/a", qos=1, sub_id=7)
    sub.subscribe(f"{topic}/b", qos=1, sub_id=268_435_455)  # the largest a VBI holds
    sub.subscribe(f"{topic}/c", qos=1)
    pub = clients(cid(topic, "pub"), version=V5)
    for t in "abc":
        pub.publish(f"{topic}/{t}", t, qos=1)
    got = [sub.get() for _ in range(3)]
    assert [m.properties.get("SubscriptionIdentifier") for m in got] == [[7], [268_435_455], None]
    sub.subscribe(f"{topic}/a", qos=1, sub_id=8)  # subscribing again replaces the options, identifier too
    pub.publish(f"{topic}/a", b"again", qos=1)
    assert sub.get().properties["SubscriptionIdentifier"] == [8]


def test_v5_no_local(clients, topic):
    me = clients(cid(topic, "me"), version=V5)
    assert me.subscribe(topic, options=SubscribeOptions(qos=1, noLocal=True)) == [1]
    other = clients(cid(topic, "other"), version=V5)
    other.subscribe(topic, qos=1)
    me.publish(topic, b"from me", qos=1)
    assert other.get().payload == b"from me"
    other.publish(topic, b"from other", qos=1)
    assert me.get().payload == b"from other", "its own message, published first, never came back"


def test_v5_retain_as_published(clients, topic):
    keep = clients(cid(topic, "keep"), version=V5)
    keep.subscribe(topic, options=SubscribeOptions(qos=1, retainAsPublished=True))
    clear = clients(cid(topic, "clear"), version=V5)
    clear.subscribe(topic, options=SubscribeOptions(qos=1, retainAsPublished=False))
    pub = clients(cid(topic, "pub"), version=V5)
    try:
        pub.publish(topic, b"retained, live", qos=1, retain=True)
        assert keep.get().retain is True
        assert clear.get().retain is False, "a live message goes out with RETAIN 0 unless asked"
        pub.publish(topic, b"not retained", qos=1)
        assert keep.get().retain is False
    finally:
        pub.publish(topic, b"", qos=1, retain=True)


def test_v5_retain_handling(clients, topic):
    pub = clients(cid(topic, "pub"), version=V5)
    pub.publish(topic, b"stored", qos=1, retain=True)
    marker = f"{topic}/marker"
    try:
        for handling, first, again in ((0, [b"stored"], [b"stored"]), (1, [b"stored"], []), (2, [], [])):
            sub = clients(cid(topic, f"rh{handling}"), version=V5)
            sub.subscribe(marker, qos=2)
            options = SubscribeOptions(qos=1, retainHandling=handling)
            for expected in (first, again):  # a new subscription, then the same one again
                sub.subscribe(topic, options=options)
                pub.publish(marker, b"", qos=2)
                got = sub.until(marker)
                assert [m.payload for m in got] == expected, f"retain handling {handling}"
                assert all(m.retain for m in got)
    finally:
        pub.publish(topic, b"", qos=1, retain=True)


def test_v311_new_subscription_gets_the_retained_message_every_time(clients, topic):
    pub = clients(cid(topic, "pub"), version=V311)
    pub.publish(topic, b"stored", qos=1, retain=True)
    try:
        sub = clients(cid(topic, "sub"), version=V311)
        for _ in range(2):
            sub.subscribe(topic, qos=1)
            got = sub.get()
            assert (got.payload, got.retain) == (b"stored", True)
    finally:
        pub.publish(topic, b"", qos=1, retain=True)


@VERSIONS
def test_shared_subscription_splits_messages_between_members(clients, topic, version):
    shared = f"$share/g/{topic}/jobs"
    members = [clients(cid(topic, f"m{i}"), version=version) for i in range(2)]
    for member in members:
        assert member.subscribe(shared, qos=1) == [1]
        assert member.subscribe(f"{topic}/marker", qos=2) == [2]
    pub = clients(cid(topic, "pub"), version=version)
    count = 20
    for i in range(count):
        pub.publish(f"{topic}/jobs", f"{i}", qos=1)
    pub.publish(f"{topic}/marker", b"", qos=2)
    shares = [[int(m.payload) for m in member.until(f"{topic}/marker")] for member in members]
    assert all(shares), f"each member gets some: {shares}"
    assert sorted(shares[0] + shares[1]) == list(range(count)), f"together all, none twice: {shares}"


@VERSIONS
def test_invalid_filters_get_a_failure_code_in_suback(raws, topic, version):
    """(paho refuses to send these, so the SUBSCRIBE is written by hand.)"""
    raw = raws(version)
    raw.connect(cid(topic, "sub"))
    bad = ["a/#/b", f"{topic}/b#", f"{topic}/a+", "$share/g", "$share//x", "$share/g+/x", ""]
    suback = raw.subscribe_many(7, [(topic, 1), *((f, 1) for f in bad)])
    assert suback.body[:2] == b"\x00\x07"
    failure = 0x8F if version == V5 else 0x80
    assert suback.codes() == [1] + [failure] * len(bad), "each filter stands alone: the valid one is granted"
    assert raw.barrier() == [], "the connection stays"


def test_v5_no_reason_string_when_problem_information_is_not_requested(raws, topic):
    raw = raws(V5)
    raw.connect(cid(topic, "terse"), properties=[(0x17, 0)])  # Request Problem Information 0
    raw.publish(f"$SYS/{topic}", b"nope", qos=1, packet_id=3)
    assert raw.expect(PUBACK).reason_and_props() == (0x90, {})

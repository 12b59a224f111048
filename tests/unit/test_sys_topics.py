"""$SYS (appliance/broker/sys_topics.py): the tree from counters, sans-I/O, and its publication into a broker
core's memory: retained, delivered under the ACL, never an op."""

from __future__ import annotations

import math

import pytest

from pairmq.appliance.broker.sys_topics import Redundancy, SysStats, SysTree, is_sys_topic, publish_in_memory
from pairmq.appliance.mqtt import codec
from tests.unit.test_broker_core import Harness

B = "$SYS/broker/"


def stats(**changes) -> SysStats:
    base = dict(version="1.2.3", uptime_s=42, clients_connected=3, clients_total=5, packets_received=100,
                packets_sent=90, publish_received=60, publish_sent=50, publish_dropped=1, bytes_received=4096,
                bytes_sent=2048, subscriptions=7, retained=2, stored_messages=4, stored_bytes=400,
                connections_opened=9, redundancy=Redundancy("active", 8, True, "In-Sync"))
    return SysStats(**{**base, **changes})


@pytest.mark.parametrize("topic, reserved", [
    ("$SYS", True), ("$SYS/broker/uptime", True), ("$SYS/", True), ("$SYSTEM/x", False), ("$foo/bar", False),
    ("sys/$SYS", False), ("$sys/x", False), ("a", False)])
def test_only_sys_and_below_is_the_broker_s(topic, reserved):
    assert is_sys_topic(topic) is reserved


def test_the_first_update_has_every_topic_in_mosquitto_s_names_and_units():
    got = dict(SysTree().update(stats(), 1000.0))
    assert got[B + "version"] == b"pairmq version 1.2.3"
    assert got[B + "uptime"] == b"42 seconds"
    assert (got[B + "clients/connected"], got[B + "clients/total"], got[B + "clients/disconnected"]) == (
        b"3", b"5", b"2")
    assert got[B + "clients/maximum"] == b"3"
    assert (got[B + "messages/received"], got[B + "publish/messages/received"]) == (b"100", b"60")
    assert (got[B + "bytes/sent"], got[B + "retained messages/count"], got[B + "subscriptions/count"]) == (
        b"2048", b"2", b"7")
    assert (got[B + "store/messages/count"], got[B + "store/messages/bytes"], got[B + "messages/stored"]) == (
        b"4", b"400", b"4")
    assert (got[B + "redundancy/activity"], got[B + "redundancy/epoch"], got[B + "redundancy/in_sync"],
            got[B + "redundancy/config_sync"]) == (b"active", b"8", b"true", b"In-Sync")
    assert not [t for t in got if "/load/" in t], "a rate needs two snapshots"


def test_later_updates_carry_only_what_changed_and_the_maximum_holds():
    tree = SysTree()
    tree.update(stats(), 1000.0)
    got = dict(tree.update(stats(uptime_s=52, clients_connected=1), 1010.0))
    assert got[B + "uptime"] == b"52 seconds" and got[B + "clients/connected"] == b"1"
    assert B + "version" not in got and B + "clients/maximum" not in got  # still 3
    assert dict(tree.update(stats(uptime_s=52, clients_connected=1), 1020.0)).keys() <= {
        t for t in got if "/load/" in t}
    tree.forget_sent()
    assert B + "version" in dict(tree.update(stats(uptime_s=52, clients_connected=1), 1030.0))


def test_load_is_a_per_minute_rate_smoothed_as_mosquitto_does():
    tree = SysTree()
    tree.update(stats(publish_received=0), 1000.0)
    got = dict(tree.update(stats(publish_received=100), 1010.0))  # 100 in 10 s: 600 a minute
    for minutes in (1, 5, 15):
        expected = 600 * (1 - math.exp(-10 / (60 * minutes)))
        assert float(got[f"{B}load/publish/received/{minutes}min"]) == pytest.approx(expected, abs=0.01)


def test_publication_is_retained_in_memory_delivered_by_the_acl_and_never_an_op():
    readers = {"watcher"}
    h = Harness(may_receive=lambda user, topic: not topic.startswith("$SYS") or user in readers)
    for conn, user in ((1, "watcher"), (2, "nosy")):
        h.run(h.core.connect(conn, codec.Connect(5, user, True, 60, None, None, None, {}), h.now, username=user))
        h.take(conn)
        h.subscribe(conn, "$SYS/#", qos=1)
    h.run(publish_in_memory(h.core, SysTree().update(stats(), 1000.0), h.now))
    live = h.publishes(1)
    assert B + "uptime" in {p.topic for p in live} and {p.qos for p in live} == {0}
    assert h.publishes(2) == [], "the ACL withholds it"
    assert not [o for o in h.ops if "Retained" in type(o).__name__ or "Message" in type(o).__name__]
    assert h.core.router.stored_bytes == 0

    h.run(publish_in_memory(h.core, [(B + "uptime", b"43 seconds")], h.now))  # replaces the retained value
    h.take(1)
    h.run(h.core.connect(3, codec.Connect(5, "late", True, 60, None, None, None, {}), h.now, username="watcher"))
    h.take(3)
    h.subscribe(3, B + "uptime", qos=1)
    [retained] = h.publishes(3)
    assert (retained.payload, retained.retain, retained.qos) == (b"43 seconds", True, 0)
    assert all(msg_id < 0 for msg_id in h.core.router.messages), "never a spool id"

"""Duplicate suppression by message id (appliance/broker/dedup.py): the history with time passed in,
then the broker core driven directly (tests/unit/test_broker_core.py's Harness), then a core restored from
the ops it wrote (what a restart and the new active after a failover see)."""

import pytest

from pairmq.appliance.broker.core import Limits, restore
from pairmq.appliance.broker.dedup import MAX_ID_BYTES, PROPERTY, BadMessageId, MessageIdHistory, message_id_of
from pairmq.appliance.mqtt import codec
from pairmq.appliance.mqtt.properties import PropertyId as P
from pairmq.appliance.mqtt.wire import ReasonCode as RC
from pairmq.appliance.spool import ops
from pairmq.appliance.spool.snapshot import snapshot_ops, snapshot_seq
from pairmq.appliance.spool.state import StateModel
from tests.unit.test_broker_core import Harness

PERSISTENT = {P.SESSION_EXPIRY_INTERVAL: 3600}


def with_id(message_id: str, *extra) -> dict:
    return {P.USER_PROPERTY: ((PROPERTY, message_id), *extra)}


# --- the history, time passed in -------------------------------------------------------------------

def test_an_id_is_seen_until_its_window_ends_and_is_scoped_per_client():
    h = MessageIdHistory(window_ms=1_000, max_ids=10)
    assert not h.seen("a", "m1", 0)
    op = h.record("a", "m1", 0)
    assert op == ops.MessageIdSeen("a", "m1", 0)
    assert h.seen("a", "m1", 999)
    assert not h.seen("b", "m1", 999)  # another publisher's id space
    assert not h.seen("a", "m1", 1_000) and len(h) == 0  # the window is over: forgotten


def test_the_count_bound_evicts_the_oldest_accepted_first():
    h = MessageIdHistory(window_ms=10**9, max_ids=3)
    for i, m in enumerate(["m1", "m2", "m3"]):
        h.record("a", m, i)
    h.record("a", "m1", 5)  # accepted again (after its window, say): now the youngest
    h.record("a", "m4", 6)  # one too many: m2, the oldest, goes
    assert [m for _, m, _ in h.entries()] == ["m3", "m1", "m4"]
    assert not h.seen("a", "m2", 7) and h.seen("a", "m3", 7)


def test_expiry_goes_oldest_first_and_a_stepped_back_clock_only_delays_it():
    h = MessageIdHistory(window_ms=100, max_ids=10)
    h.record("a", "late", 500)  # the wall clock then steps back
    h.record("a", "early", 50)
    h.expire(160)  # "late" is young and at the head: the sweep stops there
    assert len(h) == 2
    assert not h.seen("a", "early", 160)  # but a lookup judges each entry's own age
    assert h.seen("a", "late", 160) and len(h) == 1
    h.expire(600)
    assert len(h) == 0


def test_restore_keeps_what_is_inside_the_window_and_the_bound():
    h = MessageIdHistory(window_ms=100, max_ids=2)
    h.restore([("a", "old", 0), ("a", "m1", 950), ("b", "m1", 960), ("a", "m2", 970)], now_ms=1_000)
    assert h.entries() == [("b", "m1", 960), ("a", "m2", 970)]


@pytest.mark.parametrize("props,error", [
    (with_id(""), "must be 1 to 128 bytes"),
    (with_id("x" * (MAX_ID_BYTES + 1)), "not 129"),
    (with_id("a", (PROPERTY, "b")), "appears 2 times"),
])
def test_malformed_ids_are_refused(props, error):
    with pytest.raises(BadMessageId, match=error):
        message_id_of(props)


def test_ids_are_read_from_the_user_property_only():
    assert message_id_of({}) is None
    assert message_id_of({P.USER_PROPERTY: (("other", "x"),)}) is None
    assert message_id_of(with_id("é" * 64, ("other", "x"))) == "é" * 64  # 128 bytes of UTF-8


# --- the core ----------------------------------------------------------------------------------------

def publisher_and_subscriber(h: Harness, qos: int = 1) -> None:
    h.connect(1, "sub", clean=False, props=PERSISTENT)
    h.subscribe(1, "t", qos=qos)
    h.connect(2, "pub", clean=False, props=PERSISTENT)


def test_a_retransmit_with_the_same_id_is_acknowledged_and_not_delivered_again():
    h = Harness()
    publisher_and_subscriber(h)
    h.send(2, codec.Publish("t", b"one", qos=1, packet_id=1, properties=with_id("m1")))
    h.send(2, codec.Publish("t", b"one", qos=1, packet_id=2, properties=with_id("m1")))
    h.send(2, codec.Publish("t", b"two", qos=1, packet_id=3, properties=with_id("m2")))
    acks = h.take(2)
    assert [(a.packet_id, a.reason_code) for a in acks] == [(1, RC.SUCCESS), (2, RC.SUCCESS), (3, RC.SUCCESS)]
    assert [p.payload for p in h.publishes(1)] == [b"one", b"two"]
    assert h.core.counters["publish_duplicates_suppressed"] == 1
    seen = [op for op in h.ops if isinstance(op, ops.MessageIdSeen)]
    assert [(op.client_id, op.message_id) for op in seen] == [("pub", "m1"), ("pub", "m2")]


def test_the_id_is_committed_with_the_message_and_the_duplicates_ack_waits_behind_it():
    h = Harness()
    publisher_and_subscriber(h)
    h.auto_commit = False
    h.send(2, codec.Publish("t", b"one", qos=1, packet_id=1, properties=with_id("m1")))
    h.send(2, codec.Publish("t", b"one", qos=1, packet_id=2, properties=with_id("m1")))
    first = h.pending[0]
    assert {type(op) for op in first.ops} == {ops.MessageIdSeen, ops.MessageRouted}
    assert h.take(2) == []  # neither ack before the commit holding the id and the message
    h.commit()
    assert [a.packet_id for a in h.take(2)] == [1, 2]


def test_another_client_with_the_same_id_is_not_suppressed():
    h = Harness()
    publisher_and_subscriber(h)
    h.connect(3, "pub2")
    h.send(2, codec.Publish("t", b"from pub", qos=1, packet_id=1, properties=with_id("m1")))
    h.send(3, codec.Publish("t", b"from pub2", qos=1, packet_id=1, properties=with_id("m1")))
    assert [p.payload for p in h.publishes(1)] == [b"from pub", b"from pub2"]


def test_a_qos2_duplicate_under_a_new_packet_id_completes_its_exchange_without_a_second_copy():
    h = Harness()
    publisher_and_subscriber(h, qos=2)
    h.send(2, codec.Publish("t", b"once", qos=2, packet_id=1, properties=with_id("m1")))
    h.send(2, codec.Pubrel(1))
    h.send(2, codec.Publish("t", b"once", qos=2, packet_id=9, properties=with_id("m1")))
    h.send(2, codec.Pubrel(9))
    assert [(type(p).__name__, p.packet_id, p.reason_code) for p in h.take(2)] == [
        ("Pubrec", 1, 0), ("Pubcomp", 1, 0), ("Pubrec", 9, 0), ("Pubcomp", 9, 0)]
    assert [p.payload for p in h.publishes(1)] == [b"once"]


def test_a_malformed_id_is_refused_before_anything_is_stored():
    h = Harness()
    publisher_and_subscriber(h)
    before = len(h.ops)
    h.send(2, codec.Publish("t", b"x", qos=1, packet_id=1, properties=with_id("x" * 200)))
    [ack] = h.take(2)
    assert ack.reason_code == RC.IMPLEMENTATION_SPECIFIC_ERROR
    assert "pairmq-msg-id must be 1 to 128 bytes" in ack.properties[P.REASON_STRING]
    assert h.ops[before:] == [] and h.publishes(1) == []
    assert h.core.counters["publish_refused_bad_message_id"] == 1


def test_a_refused_publish_does_not_record_its_id():
    h = Harness(limits=Limits(max_queued_messages=1))
    publisher_and_subscriber(h)
    h.send(2, codec.Publish("t", b"fills the queue", qos=1, packet_id=1))
    h.send(2, codec.Publish("t", b"refused", qos=1, packet_id=2, properties=with_id("m1")))
    assert h.take(2)[-1].reason_code == RC.QUOTA_EXCEEDED
    assert len(h.core.message_ids) == 0  # so its retry, once there is room, is taken


def test_after_the_window_the_same_id_is_a_new_message():
    h = Harness(limits=Limits(message_id_window_ms=1_000))
    publisher_and_subscriber(h)
    h.send(2, codec.Publish("t", b"one", qos=1, packet_id=1, properties=with_id("m1")))
    h.now += 1_000
    h.send(2, codec.Publish("t", b"one again", qos=1, packet_id=2, properties=with_id("m1")))
    assert [p.payload for p in h.publishes(1)] == [b"one", b"one again"]


@pytest.mark.parametrize("via_snapshot", [False, True])
def test_a_core_restored_from_the_spool_suppresses_the_retransmit(via_snapshot):
    """What a restart or the new active after a failover sees: the ids ride the op log (and snapshots)."""
    h = Harness()
    publisher_and_subscriber(h)
    h.send(2, codec.Publish("t", b"one", qos=1, packet_id=1, properties=with_id("m1")))
    model = StateModel()
    for seq, op in enumerate(h.ops, start=1):
        model.apply(seq, op)
    state = model.state()
    if via_snapshot:
        rebuilt = StateModel()
        for i, op in enumerate(snapshot_ops(state)):
            rebuilt.apply(snapshot_seq(i), op)
        state = rebuilt.state()
    assert state.message_ids == (("pub", "m1", h.now),)
    after = Harness()
    restore(after.core, state, h.now + 10_000)
    after.connect(1, "sub", clean=False, props=PERSISTENT)
    after.connect(2, "pub", clean=False, props=PERSISTENT)
    assert [p.payload for p in after.publishes(1)] == [b"one"]  # still queued: it was never acked
    after.send(2, codec.Publish("t", b"one", qos=1, packet_id=5, properties=with_id("m1")))
    assert [(a.packet_id, a.reason_code) for a in after.take(2)] == [(5, RC.SUCCESS)]
    assert after.publishes(1) == []

"""The broker core, driven directly (sans-I/O): packets and time in, effects out.

`Harness` executes effects like the adapter does: `Send` collects packets per
connection, `Persist` holds its `then` effects until `commit()`, so each test
can check what waits for durability.
"""

from collections import defaultdict

import pytest

from pairmq.appliance.broker.core import BrokerCore, Close, Limits, Persist, Send
from pairmq.appliance.mqtt import codec
from pairmq.appliance.mqtt.properties import PropertyId as P
from pairmq.appliance.mqtt.wire import ReasonCode as RC
from pairmq.appliance.spool import ops
from tests.harness.broker_effects import EffectRunner


class Harness(EffectRunner):
    def __init__(self, *, auto_commit: bool = True, **kw) -> None:
        self.core = BrokerCore(**kw)
        self.auto_commit = auto_commit
        self.sent: dict[int, list] = defaultdict(list)
        self.closed: dict[int, Close] = {}
        self.ops: list = []
        self.pending: list[Persist] = []
        self.now = 1_700_000_000_000

    def on_send(self, e: Send) -> None:
        self.sent[e.conn].append(e.packet)

    def on_close(self, e: Close) -> None:
        self.closed[e.conn] = e

    def on_persist(self, e: Persist) -> None:
        self.ops.extend(e.ops)
        if self.auto_commit:
            self.run(e.then)
        else:
            self.pending.append(e)

    def commit(self) -> None:
        pending, self.pending = self.pending, []
        for p in pending:
            self.run(p.then)

    def connect(self, conn, client_id, v=5, clean=True, will=None, props=None) -> codec.Connack:
        props = props or {}
        self.run(self.core.connect(conn, codec.Connect(v, client_id, clean, 60, will, None, None, props), self.now))
        connack, *rest = self.take(conn)
        self.sent[conn] = rest  # what the session resends after the CONNACK stays for the test to read
        return connack

    def send(self, conn, packet) -> None:
        self.run(self.core.packet(conn, packet, self.now))

    def lose(self, conn, disconnect=None) -> None:
        self.run(self.core.connection_lost(conn, self.now, disconnect=disconnect))

    def take(self, conn) -> list:
        out, self.sent[conn] = self.sent[conn], []
        return out

    def subscribe(self, conn, *filters, qos=1, pid=1, **opts) -> codec.Suback:
        subs = tuple(codec.Subscription(f, qos, **opts) for f in filters)
        self.send(conn, codec.Subscribe(pid, subs, {}))
        packets = self.take(conn)
        [suback] = [p for p in packets if isinstance(p, codec.Suback)]
        self.sent[conn] = [p for p in packets if p is not suback]  # retained copies stay for the test
        return suback

    def publishes(self, conn) -> list[codec.Publish]:
        return [p for p in self.take(conn) if isinstance(p, codec.Publish)]


@pytest.fixture
def h():
    return Harness()


def test_qos1_publish_is_acked_after_commit_and_delivered_after_commit():
    h = Harness(auto_commit=False)
    h.run(h.core.connect(1, codec.Connect(5, "sub", True, 60, None, None, None, {}), h.now))
    h.run(h.core.connect(2, codec.Connect(5, "pub", True, 60, None, None, None, {}), h.now))
    h.commit()
    h.take(1), h.take(2)
    h.send(1, codec.Subscribe(1, (codec.Subscription("a/+", 1),), {}))
    h.commit()
    h.take(1)
    h.send(2, codec.Publish("a/b", b"x", qos=1, packet_id=7))
    assert h.take(2) == [] and h.take(1) == [], "nothing is acked or delivered before the commit"
    assert [type(o) for o in h.ops[-1:]] == [ops.MessageRouted]  # stored and queued in one op
    h.commit()
    assert h.take(2) == [codec.Puback(7)]
    [delivered] = h.publishes(1)
    assert (delivered.topic, delivered.payload, delivered.qos, delivered.dup) == ("a/b", b"x", 1, False)
    h.send(1, codec.Puback(delivered.packet_id))
    assert h.ops[-1] == ops.MessagesAcked("sub", (1,))


def test_qos0_is_direct_and_never_spooled(h):
    h.connect(1, "sub"), h.connect(2, "pub")
    h.subscribe(1, "t", qos=0)
    before = len(h.ops)
    h.send(2, codec.Publish("t", b"zero"))
    assert [p.payload for p in h.publishes(1)] == [b"zero"]
    assert len(h.ops) == before


def test_qos_downgraded_to_the_subscription(h):
    h.connect(1, "sub"), h.connect(2, "pub")
    h.subscribe(1, "t", qos=1)
    h.send(2, codec.Publish("t", b"m", qos=2, packet_id=3))
    assert h.take(2) == [codec.Pubrec(3)]
    assert [p.qos for p in h.publishes(1)] == [1]


def test_qos2_exactly_once_inbound_retransmission_not_routed_twice(h):
    h.connect(1, "sub"), h.connect(2, "pub")
    h.subscribe(1, "t", qos=2)
    h.send(2, codec.Publish("t", b"once", qos=2, packet_id=9))
    h.send(2, codec.Publish("t", b"once", qos=2, packet_id=9, dup=True))  # retransmission before PUBREL
    assert h.take(2) == [codec.Pubrec(9), codec.Pubrec(9)]
    assert len(h.publishes(1)) == 1
    h.send(2, codec.Pubrel(9))
    assert h.take(2) == [codec.Pubcomp(9)]
    h.send(2, codec.Publish("t", b"again", qos=2, packet_id=9))  # the id is free again: a new message
    assert len(h.publishes(1)) == 1


def test_qos2_outbound_flow(h):
    h.connect(1, "sub"), h.connect(2, "pub")
    h.subscribe(1, "t", qos=2)
    h.send(2, codec.Publish("t", b"m", qos=2, packet_id=1))
    [out] = h.publishes(1)
    h.send(1, codec.Pubrec(out.packet_id))
    assert h.take(1) == [codec.Pubrel(out.packet_id)]
    assert isinstance(h.ops[-1], ops.MessagePubrecReceived)
    h.send(1, codec.Pubcomp(out.packet_id))
    assert isinstance(h.ops[-1], ops.MessagesAcked)
    assert h.core.sessions["sub"].queue == type(h.core.sessions["sub"].queue)()


def test_persistent_session_queues_offline_and_resends_inflight_with_dup(h):
    assert h.connect(1, "sub", v=4, clean=False).session_present is False
    h.subscribe(1, "q/#", qos=1)
    h.connect(2, "pub")
    h.send(2, codec.Publish("q/1", b"first", qos=1, packet_id=1))
    [first] = h.publishes(1)  # in flight, never acked
    h.lose(1)
    h.send(2, codec.Publish("q/2", b"second", qos=1, packet_id=2))
    connack = h.connect(3, "sub", v=4, clean=False)
    assert connack.session_present is True
    resent = h.publishes(3)
    assert [(p.payload, p.dup) for p in resent] == [(b"first", True), (b"second", False)]
    assert resent[0].packet_id == first.packet_id


def test_clean_start_discards_the_old_session(h):
    h.connect(1, "c", v=4, clean=False)
    h.subscribe(1, "x")
    h.lose(1)
    assert h.connect(2, "c", v=4, clean=True).session_present is False
    assert h.core.sessions["c"].subscriptions == {}


def test_session_takeover_closes_the_first_with_0x8e(h):
    h.connect(1, "same")
    h.connect(2, "same")
    assert h.closed[1].reason_code == RC.SESSION_TAKEN_OVER
    assert h.core.sessions["same"].conn == 2


def test_session_expiry(h):
    h.connect(1, "e", v=5, clean=False, props={P.SESSION_EXPIRY_INTERVAL: 10})
    h.lose(1)
    h.now += 9_000
    h.run(h.core.tick(h.now))
    assert "e" in h.core.sessions
    h.now += 2_000
    h.run(h.core.tick(h.now))
    assert "e" not in h.core.sessions
    assert isinstance(h.ops[-1], ops.SessionDeleted)


def test_retained_set_replace_delete_and_retain_handling(h):
    h.connect(1, "pub")
    h.send(1, codec.Publish("r/a", b"one", qos=1, retain=True, packet_id=1))
    h.send(1, codec.Publish("r/a", b"two", qos=1, retain=True, packet_id=2))
    h.connect(2, "sub")
    h.subscribe(2, "r/#", qos=1)
    [got] = h.publishes(2)
    assert (got.payload, got.retain) == (b"two", True)
    h.subscribe(2, "r/#", qos=1, retain_handling=1, pid=2)  # exists already: no retained copy
    assert h.publishes(2) == []
    h.connect(3, "other")
    h.subscribe(3, "r/#", retain_handling=2)
    assert h.publishes(3) == []
    h.send(1, codec.Publish("r/a", b"", qos=1, retain=True, packet_id=3))  # delete
    h.connect(4, "late")
    h.subscribe(4, "r/#")
    assert h.publishes(4) == []


def test_will_published_on_abrupt_loss_not_on_clean_disconnect(h):
    h.connect(1, "watch")
    h.subscribe(1, "wills/#", qos=1)
    h.connect(2, "dies", will=codec.Will("wills/dies", b"gone", 1))
    h.lose(2)
    assert [p.payload for p in h.publishes(1)] == [b"gone"]
    h.connect(3, "polite", will=codec.Will("wills/polite", b"gone", 1))
    h.send(3, codec.Disconnect(RC.SUCCESS))
    assert h.publishes(1) == []


def test_will_delay_and_cancel_by_reconnect(h):
    h.connect(1, "watch")
    h.subscribe(1, "w", qos=1)
    will = codec.Will("w", b"late", 1, properties={P.WILL_DELAY_INTERVAL: 5})
    h.connect(2, "d", clean=False, will=will, props={P.SESSION_EXPIRY_INTERVAL: 60})
    h.lose(2)
    h.now += 4_000
    h.run(h.core.tick(h.now))
    assert h.publishes(1) == []
    h.now += 2_000
    h.run(h.core.tick(h.now))
    assert [p.payload for p in h.publishes(1)] == [b"late"]
    h.connect(3, "d2", clean=False, will=will, props={P.SESSION_EXPIRY_INTERVAL: 60})
    h.lose(3)
    h.connect(4, "d2", clean=False, props={P.SESSION_EXPIRY_INTERVAL: 60})  # back before the delay
    h.now += 10_000
    h.run(h.core.tick(h.now))
    assert h.publishes(1) == []


def test_no_local_overlap_and_subscription_ids(h):
    h.connect(1, "me")
    h.send(1, codec.Subscribe(1, (codec.Subscription("t/#", 1, no_local=True),), {P.SUBSCRIPTION_IDENTIFIER: 4}))
    h.send(1, codec.Subscribe(2, (codec.Subscription("t/+", 2),), {P.SUBSCRIPTION_IDENTIFIER: 9}))
    h.take(1)
    h.connect(2, "other")
    h.send(2, codec.Publish("t/x", b"m", qos=2, packet_id=1))
    [copy] = h.publishes(1)
    assert copy.qos == 2 and sorted(copy.properties[P.SUBSCRIPTION_IDENTIFIER]) == [4, 9]
    h.send(1, codec.Publish("t/x", b"mine", qos=1, packet_id=5))
    assert [p.payload for p in h.publishes(1)] == [b"mine"]  # only via t/+ (no_local drops t/#)


def test_shared_subscription_round_robin(h):
    for conn, cid in ((1, "a"), (2, "b")):
        h.connect(conn, cid)
        h.subscribe(conn, "$share/g/jobs", qos=1)
    h.connect(3, "pub")
    for i in range(6):
        h.send(3, codec.Publish("jobs", b"%d" % i, qos=1, packet_id=i + 1))
    assert len(h.publishes(1)) == 3 and len(h.publishes(2)) == 3


def test_inbound_topic_alias(h):
    h.connect(1, "sub")
    h.subscribe(1, "long/topic/name")
    h.connect(2, "pub")
    h.send(2, codec.Publish("long/topic/name", b"1", qos=1, packet_id=1, properties={P.TOPIC_ALIAS: 3}))
    h.send(2, codec.Publish("", b"2", qos=1, packet_id=2, properties={P.TOPIC_ALIAS: 3}))
    assert [p.payload for p in h.publishes(1)] == [b"1", b"2"]
    h.send(2, codec.Publish("", b"3", qos=1, packet_id=3, properties={P.TOPIC_ALIAS: 4}))
    assert h.closed[2].reason_code == RC.PROTOCOL_ERROR


def test_full_queue_refuses_the_publisher_never_drops_silently():
    h = Harness(limits=Limits(max_queued_messages=3))
    h.connect(1, "slow", clean=False, props={P.SESSION_EXPIRY_INTERVAL: 600})
    h.subscribe(1, "t", qos=1)
    h.lose(1)
    h.connect(2, "pub")
    for i in range(3):
        h.send(2, codec.Publish("t", b"m", qos=1, packet_id=i + 1))
    assert [a.reason_code for a in h.take(2)] == [0, 0, 0]
    h.send(2, codec.Publish("t", b"m", qos=1, packet_id=4))
    [refused] = h.take(2)
    assert refused.reason_code == RC.QUOTA_EXCEEDED and P.REASON_STRING in refused.properties
    h.connect(3, "pub311", v=4)
    h.send(3, codec.Publish("t", b"m", qos=1, packet_id=1))
    assert h.closed[3].reason_code == RC.QUOTA_EXCEEDED  # 3.1.1 has no negative ack: disconnect, no PUBACK
    assert len(h.core.sessions["slow"].queue) == 3


def test_in_flight_window_follows_receive_maximum(h):
    h.connect(1, "sub", props={P.RECEIVE_MAXIMUM: 2})
    h.subscribe(1, "t")
    h.connect(2, "pub")
    for i in range(5):
        h.send(2, codec.Publish("t", b"%d" % i, qos=1, packet_id=i + 1))
    first = h.publishes(1)
    assert [p.payload for p in first] == [b"0", b"1"]
    h.send(1, codec.Puback(first[0].packet_id))
    assert [p.payload for p in h.publishes(1)] == [b"2"]


def test_message_expiry_drops_queued_copies(h):
    h.connect(1, "s", clean=False, props={P.SESSION_EXPIRY_INTERVAL: 600})
    h.subscribe(1, "t")
    h.lose(1)
    h.connect(2, "pub")
    h.send(2, codec.Publish("t", b"short", qos=1, packet_id=1, properties={P.MESSAGE_EXPIRY_INTERVAL: 5}))
    h.now += 6_000
    h.run(h.core.tick(h.now))
    assert isinstance(h.ops[-1], ops.MessageDropped) and h.ops[-1].reason == "expired"
    h.connect(3, "s", clean=False, props={P.SESSION_EXPIRY_INTERVAL: 600})
    assert h.publishes(3) == []


def test_unauthorized_publish_and_subscribe_are_refused():
    h = Harness(authorize=lambda user, action, topic: not topic.startswith("secret"))
    h.connect(1, "c")
    suback = h.subscribe(1, "secret/#", "open/#")
    assert suback.reason_codes == (RC.NOT_AUTHORIZED, 1)
    h.send(1, codec.Publish("secret/x", b"m", qos=1, packet_id=1))
    assert h.take(1)[0].reason_code == RC.NOT_AUTHORIZED


def test_unauthorized_publishes_are_counted_and_311_ones_acked_and_dropped():
    h = Harness(authorize=lambda user, action, topic: not topic.startswith("secret"))
    h.connect(1, "v3", v=4)
    h.connect(2, "v5")
    h.connect(3, "watcher")
    h.subscribe(3, "#")
    h.send(1, codec.Publish("secret/x", b"m", qos=1, packet_id=1))
    h.send(1, codec.Publish("secret/x", b"m", qos=2, packet_id=2))
    h.send(1, codec.Publish("secret/x", b"m", qos=0))
    assert h.take(1) == [codec.Puback(1), codec.Pubrec(2)]  # no negative ack in 3.1.1: a retry would not help
    h.send(1, codec.Pubrel(2))
    assert [type(p) for p in h.take(1)] == [codec.Pubcomp]
    h.send(2, codec.Publish("secret/x", b"m", qos=0))
    assert h.take(2) == [] and 1 not in h.closed and 2 not in h.closed
    assert h.publishes(3) == []
    assert h.core.counters["publish_not_authorized"] == 4
    assert not [op for op in h.ops if isinstance(op, ops.MessageStored)]


def test_bad_filters_get_per_filter_reason_codes(h):
    h.connect(1, "c")
    suback = h.subscribe(1, "a/#/b", "ok/+", "$share/g/x", qos=1)
    assert suback.reason_codes == (RC.TOPIC_FILTER_INVALID, 1, 1)


@pytest.mark.parametrize("version", [4, 5])
def test_receive_maximum_bounds_unfinished_inbound_qos2_for_v5_only(h, version):
    """v5 advertises Receive Maximum 100: the 101st unfinished QoS 2 PUBLISH is 0x93. 3.1.1 promised
    nothing, so its deep windows (200 here) are taken and each is PUBREC'd."""
    from pairmq.appliance.broker.core import SERVER_RECEIVE_MAXIMUM

    h.connect(1, "deep", v=version)
    count = SERVER_RECEIVE_MAXIMUM + (1 if version == 5 else 100)
    for pid in range(1, count + 1):
        h.send(1, codec.Publish("t", b"x", qos=2, packet_id=pid))
    if version == 5:
        assert h.closed[1].reason_code == RC.RECEIVE_MAXIMUM_EXCEEDED
        assert len(h.take(1)) == SERVER_RECEIVE_MAXIMUM  # the first 100 were PUBREC'd
    else:
        assert 1 not in h.closed and h.take(1) == [codec.Pubrec(pid) for pid in range(1, count + 1)]


def test_nothing_reaches_a_connection_before_its_connack():
    """Found by tests/harness/broker_sim.py: a message routed while a reconnect's session commit ran went out ahead of
    the CONNACK (and ahead of the DUP resends). Now the CONNACK's commit releases resends, then the window."""
    h = Harness(auto_commit=False)
    h.run(h.core.connect(1, codec.Connect(5, "sub", False, 60, None, None, None, {P.SESSION_EXPIRY_INTERVAL: 60}),
                         h.now))
    h.run(h.core.connect(2, codec.Connect(5, "pub", True, 60, None, None, None, {}), h.now))
    h.commit()
    h.take(1), h.take(2)
    h.send(1, codec.Subscribe(1, (codec.Subscription("t", 1),), {}))
    h.commit()
    h.take(1)
    h.send(2, codec.Publish("t", b"first", qos=1, packet_id=1))
    h.commit()
    [first] = h.publishes(1)
    h.lose(1)
    h.run(h.core.connect(3, codec.Connect(5, "sub", False, 60, None, None, None, {P.SESSION_EXPIRY_INTERVAL: 60}),
                         h.now))  # its CONNACK waits for this commit...
    h.send(2, codec.Publish("t", b"second", qos=1, packet_id=2))
    h.send(2, codec.Publish("t", b"zero", qos=0))  # ...and these arrive meanwhile
    assert h.take(3) == []
    h.commit()
    h.commit()
    got = h.take(3)
    assert isinstance(got[0], codec.Connack)
    assert [(p.payload, p.dup) for p in got[1:] if isinstance(p, codec.Publish)] == [(b"first", True), (b"second", False)]


class _CountingQueue(list):
    walks = 0

    def __iter__(self):
        type(self).walks += 1
        return super().__iter__()


def test_message_expiry_walks_the_queues_only_when_a_message_is_due(h):
    """A tick walks the queued entries (a second's work of the event loop with a million queued) only on a tick
    where some stored message fell due."""
    h.connect(1, "s", clean=False, props={P.SESSION_EXPIRY_INTERVAL: 600})
    h.subscribe(1, "t")
    h.lose(1)
    session = h.core.sessions["s"]
    session.queue = _CountingQueue(session.queue)
    h.connect(2, "pub")
    for i in range(50):
        h.send(2, codec.Publish("t", b"%d" % i, qos=1, packet_id=i + 1))  # no expiry
    for pid in (60, 61):
        h.send(2, codec.Publish("t", b"late", qos=1, packet_id=pid, properties={P.MESSAGE_EXPIRY_INTERVAL: 30}))
    _CountingQueue.walks = 0
    for _ in range(20):
        h.now += 1_000
        h.run(h.core.tick(h.now))
    assert _CountingQueue.walks == 0 and not any(isinstance(op, ops.MessageDropped) for op in h.ops)
    h.now += 11_000
    h.run(h.core.tick(h.now))
    assert _CountingQueue.walks == 1
    assert [op.reason for op in h.ops if isinstance(op, ops.MessageDropped)] == ["expired", "expired"]
    h.now += 1_000
    h.run(h.core.tick(h.now))
    assert _CountingQueue.walks == 1  # the due messages left the heap with their walk
    assert len(session.queue) == 50


def test_message_expiry_matches_a_full_walk_on_every_tick():
    """Random expiries, deliveries and acks: after every tick no queued (unsent) entry is past its message's
    expiry, and every drop was of an expired message: what walking every queue on every tick gave."""
    import random

    from pairmq.appliance.broker.session import EntryState

    rng = random.Random(7)
    for _ in range(20):
        h = Harness()
        h.connect(1, "online", clean=False, props={P.SESSION_EXPIRY_INTERVAL: 600})
        h.subscribe(1, "t")
        h.connect(2, "offline", clean=False, props={P.SESSION_EXPIRY_INTERVAL: 600})
        h.subscribe(2, "t")
        h.lose(2)
        h.connect(3, "pub")
        for pid in range(1, 120):
            props = {P.MESSAGE_EXPIRY_INTERVAL: rng.randint(1, 20)} if rng.random() < 0.6 else {}
            h.send(3, codec.Publish("t", b"m", qos=rng.choice((1, 2)), packet_id=pid, properties=props))
            if rng.random() < 0.3:
                for p in h.publishes(1):
                    if rng.random() < 0.5:
                        h.send(1, codec.Puback(p.packet_id) if p.qos == 1 else codec.Pubrec(p.packet_id))
            if rng.random() < 0.2:
                h.now += rng.randint(100, 3_000)
                before = len(h.ops)
                h.run(h.core.tick(h.now))
                for op in h.ops[before:]:
                    if isinstance(op, ops.MessageDropped):
                        assert op.reason == "expired"
                for session in h.core.sessions.values():
                    for entry in session.queue:
                        msg = h.core.router.messages[entry.msg_id]
                        assert entry.state is not EntryState.QUEUED or not msg.expiry_at_ms or \
                            msg.expiry_at_ms > h.now


# --- $ topics and the keep-alive cap -------------------------------------------------------------------------


def test_a_dollar_topic_other_than_sys_is_routed_to_its_exact_subscribers_only(h):
    h.connect(1, "exact")
    h.subscribe(1, "$foo/bar")
    h.connect(2, "wild")
    h.subscribe(2, "#", "+/bar")
    h.connect(3, "pub")
    h.send(3, codec.Publish(topic="$foo/bar", payload=b"x", qos=1, packet_id=1))
    assert [p.reason_code for p in h.take(3)] == [RC.SUCCESS]
    assert [p.topic for p in h.publishes(1)] == ["$foo/bar"] and h.publishes(2) == []


@pytest.mark.parametrize("v", [4, 5])
@pytest.mark.parametrize("qos", [0, 1, 2])
def test_a_publish_to_sys_is_never_routed(h, v, qos):
    h.connect(1, "watcher")
    h.subscribe(1, "$SYS/#")
    h.connect(2, "pub", v=v)
    h.send(2, codec.Publish(topic="$SYS/broker/uptime", payload=b"forged", qos=qos, packet_id=qos and 9))
    acks = h.take(2)
    if qos:
        assert [(type(a), a.packet_id, a.reason_code) for a in acks] == [
            (codec.Puback if qos == 1 else codec.Pubrec, 9, RC.TOPIC_NAME_INVALID if v == 5 else RC.SUCCESS)]
    else:
        assert acks == []
    assert 2 not in h.closed, "3.1.1 is acknowledged, not disconnected"
    assert h.publishes(1) == [] and not [o for o in h.ops if "Message" in type(o).__name__]
    assert h.core.counters["publish_to_sys_refused"] == 1


@pytest.mark.parametrize("asked, given", [(600, 30), (0, 30), (30, None), (5, None)])
def test_the_v5_connack_carries_server_keep_alive_when_it_lowers_the_client_s(asked, given):
    h = Harness(limits=Limits(max_keep_alive_s=30))
    h.run(h.core.connect(1, codec.Connect(5, "c", True, asked, None, None, None, {}), h.now))
    [connack] = h.take(1)
    assert connack.properties.get(P.SERVER_KEEP_ALIVE) == given

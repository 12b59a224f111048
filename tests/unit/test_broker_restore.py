"""The broker's ops, applied by the spool's rules, rebuild the same broker.

Runs a busy scenario through the core, applies every op it emitted to the
spool's reference model (`StateModel`), restores a fresh core from that state,
and compares the two. Also checks that the spool ignored none of the ops: an
ignored op means the core and the spool disagree about the rules.
"""

from pairmq.appliance.broker.core import BrokerCore, Persist, Send, restore
from pairmq.appliance.broker.session import EntryState
from pairmq.appliance.mqtt import codec
from pairmq.appliance.mqtt.properties import PropertyId as P
from pairmq.appliance.spool import ops
from pairmq.appliance.spool.state import StateModel
from tests.unit.test_broker_core import Harness

PERSISTENT = {P.SESSION_EXPIRY_INTERVAL: 3600}


def busy_scenario() -> Harness:
    h = Harness()
    h.connect(1, "fleet", clean=False, props=PERSISTENT)
    h.send(1, codec.Subscribe(1, (codec.Subscription("cars/+/door", 2), codec.Subscription("cars/#", 1)),
                              {P.SUBSCRIPTION_IDENTIFIER: 5}))
    h.connect(2, "pay", clean=False, props=PERSISTENT, will=codec.Will("status/pay", b"offline", 1, True))
    h.subscribe(2, "payments/#", qos=2)
    h.connect(3, "pub")
    h.send(3, codec.Publish("status/pay", b"online", qos=1, retain=True, packet_id=1))
    h.send(3, codec.Publish("cars/7/door", b"open", qos=2, packet_id=2))
    h.send(3, codec.Publish("cars/8/speed", b"88", qos=1, packet_id=3))
    h.send(3, codec.Publish("payments/42", b"EUR 10", qos=2, packet_id=4))  # PUBREL never comes
    out = h.publishes(1)
    h.send(1, codec.Pubrec(out[0].packet_id))  # the QoS 2 copy is half-way
    h.lose(1)  # fleet goes offline with one copy in PUBREC state, one in flight
    for i in range(5):
        h.send(3, codec.Publish(f"cars/{i}/door", b"closed", qos=1, packet_id=10 + i))
    h.send(3, codec.Publish("payments/43", b"EUR 5", qos=1, packet_id=20))
    return h


def summary(core: BrokerCore) -> dict:
    sessions = {}
    for cid, s in core.sessions.items():
        if s.expiry_s == 0:
            continue  # clean sessions end with their connection; nothing of them is durable
        sessions[cid] = (
            s.expiry_s, sorted((f, o.qos, o.subscription_id) for f, o in s.subscriptions.items()),
            [(core.router.messages[e.msg_id].payload if e.state is not EntryState.PUBREC else None,
              e.qos, e.state.name, e.packet_id, e.subscription_ids) for e in s.queue],
            sorted(s.inbound_qos2), s.will and core.router.messages[s.will.msg_id].payload)
    retained = {t: core.router.messages[m].payload for t, m in core.router.retained.matching("#")}
    return {"sessions": sessions, "retained": retained}


def test_ops_rebuild_the_same_broker_and_the_spool_ignores_none():
    h = busy_scenario()
    model = StateModel()
    for seq, op in enumerate(h.ops, start=1):
        assert model.apply(seq, op), f"the spool ignored op {seq}: {op}"
    restored = BrokerCore()
    restore(restored, model.state(), h.now)
    live = summary(h.core)
    assert summary(restored) == live
    assert live["sessions"]["fleet"][2][0][2] == "PUBREC" and len(live["sessions"]["fleet"][2]) == 7
    assert live["retained"] == {"status/pay": b"online"}


def test_a_restored_persistent_session_gets_its_messages_with_dup_for_those_in_flight():
    h = busy_scenario()
    model = StateModel()
    for seq, op in enumerate(h.ops, start=1):
        model.apply(seq, op)
    after = Harness()
    restore(after.core, model.state(), h.now)
    after.connect(9, "fleet", clean=False, props=PERSISTENT)
    packets = after.take(9)
    assert isinstance(packets[0], codec.Pubrel)  # the half-done QoS 2 exchange resumes where it was
    publishes = [p for p in packets if isinstance(p, codec.Publish)]
    assert publishes[0].dup and publishes[0].payload == b"88"
    assert [p.payload for p in publishes[1:]] == [b"closed"] * 5
    after.connect(8, "pay", clean=False, props=PERSISTENT)
    [again, fresh] = after.publishes(8)
    assert (again.payload, again.dup, fresh.payload) == (b"EUR 10", True, b"EUR 5")


def restored_from(h: Harness) -> Harness:
    model = StateModel()
    for seq, op in enumerate(h.ops, start=1):
        model.apply(seq, op)
    after = Harness()
    restore(after.core, model.state(), h.now)
    return after


def test_a_pubcomp_after_a_restart_does_not_free_a_message_another_session_still_needs():
    """Found by tests/harness/broker_sim.py: a copy in PUBREC state holds no reference in the spool, so it
    must hold none in the core either, or its PUBCOMP frees the message under another session."""
    h = Harness()
    for conn, name in ((1, "a"), (2, "b")):
        h.connect(conn, name, clean=False, props=PERSISTENT)
        h.subscribe(conn, "t", qos=2)
    h.lose(2)
    h.connect(3, "pub")
    h.send(3, codec.Publish("t", b"once", qos=2, packet_id=1))
    [copy] = h.publishes(1)
    h.send(1, codec.Pubrec(copy.packet_id))
    after = restored_from(h)
    after.connect(4, "a", clean=False, props=PERSISTENT)
    assert isinstance(after.take(4)[0], codec.Pubrel)
    after.send(4, codec.Pubcomp(copy.packet_id))
    after.connect(5, "b", clean=False, props=PERSISTENT)
    assert [p.payload for p in after.publishes(5)] == [b"once"]


def test_a_persist_inside_then_is_hoisted_so_its_ops_are_written_now():
    """Found by tests/harness/broker_sim.py: a reconnect resent a QoS 2 copy (DUP) whose MessageInflight was
    still waiting behind another commit; a crash then gave it a new packet id: a duplicate."""
    first, second, third = codec.PingResp(), codec.PingResp(), codec.PingResp()
    inner = Persist((ops.SessionDeleted("b"),), (Send(2, second),))
    outer = Persist((ops.SessionDeleted("a"),), (Send(1, first), inner, Send(3, third)))
    assert outer.ops == (ops.SessionDeleted("a"), ops.SessionDeleted("b"))
    assert outer.then == (Send(1, first), Send(2, second), Send(3, third))

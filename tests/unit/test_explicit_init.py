"""Records made per message with explicit constructors instead of runtime-frozen dataclasses (the broker core's
effects, the heartbeat's records, PUBLISH and its acks) stay what their users relied on when they were frozen dataclasses: the same
fields and defaults, by position and by name, equality by value, a repr, hashing, `dataclasses.replace`; and a
Persist inside a Persist's `then` is hoisted."""

from __future__ import annotations

import dataclasses

import pytest

from pairmq.appliance.broker.effects import Close, Connacked, Durable, Persist, Send
from pairmq.appliance.mqtt.packets import Puback, Pubcomp, Pubrec, Pubrel
from pairmq.appliance.mqtt.publish import Publish
from pairmq.appliance.quorum import wire
from pairmq.appliance.roles import Role

VIEW = wire.PeerView(Role.BACKUP, 1, 2, 3, 4, 5, 6, 7)


SAMPLES = {Send: {"conn": 1, "packet": "p"}, Close: {"conn": 1, "reason_code": 0x87, "reason": "why"},
           Persist: {"ops": ("op",), "then": (Close(2),)}, Connacked: {"conn": 3},
           Durable: {"entries": ("e",), "client_ids": ("c",)},
           wire.PeerView: {"role": Role.BACKUP, "incarnation": 1, "seq": 2, "heard_ago_ms": 3, "claim_ago_ms": 4,
                           "epoch": 5, "spool_epoch": 6, "spool_seq": 7},
           wire.Heartbeat: {"group": "g", "sender": Role.PRIMARY, "incarnation": 1, "seq": 2, "epoch": 3,
                            "activity": wire.Activity.ACTIVE, "views": (VIEW, VIEW), "flags": 4, "bid_epoch": 5,
                            "vote_epoch": 6, "vote_for": Role.BACKUP, "spool_epoch": 7, "spool_seq": 8,
                            "config_version": 9, "key_id": 10},
           wire.Header: {"sender": Role.MONITOR, "key_id": 1, "group": b"g", "incarnation": 2, "body_end": 3},
           Publish: {"topic": "t", "payload": b"p", "qos": 1, "retain": True, "dup": True, "packet_id": 7,
                     "properties": {1: 1}},
           **{ack: {"packet_id": 1, "reason_code": 0x10, "properties": {31: "why"}}
              for ack in (Puback, Pubrec, Pubrel, Pubcomp)}}
ALL = list(SAMPLES)


@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.__name__)
def test_the_dataclass_fields_are_the_constructor_parameters(cls):
    values = SAMPLES[cls]
    assert [f.name for f in dataclasses.fields(cls)] == list(values)
    by_name, by_position = cls(**values), cls(*values.values())
    assert by_name == by_position and [getattr(by_name, name) for name in values] == list(values.values())
    if "properties" not in values:  # a mapping: unhashable, as when these were frozen dataclasses
        assert hash(by_name) == hash(by_position)
    assert dataclasses.replace(by_name) == by_name
    first = next(iter(values))
    assert dataclasses.replace(by_name, **{first: values[first]}) == by_name


def test_defaults_of_the_heartbeat_records():
    assert wire.PeerView(Role.BACKUP) == wire.PeerView(Role.BACKUP, 0, 0, wire.NEVER_MS, wire.NEVER_MS, 0, 0, 0)
    hb = wire.Heartbeat("g", Role.PRIMARY, 1, 2, 3, wire.Activity.ACTIVE, (VIEW, VIEW))
    assert (hb.flags, hb.vote_for, hb.key_id) == (0, None, 0)


def test_defaults_equality_repr_and_hash():
    assert Close(3) == Close(3, 0, "") and Close(3) != Close(3, 1)
    assert Durable((1,)).client_ids == () and Persist(("a",)).then == ()
    assert repr(Close(1, 2, "x")) == "Close(conn=1, reason_code=2, reason='x')"
    assert {Close(1), Close(1), Connacked(2), Connacked(2)} == {Close(1), Connacked(2)}
    assert Send(1, "p") == Send(1, "p") and Send(1, "p") != Send(2, "p")


def test_defaults_of_publish_and_the_acks():
    assert Publish("t") == Publish("t", b"", 0, False, False, None, {})
    assert Publish("t").properties is not Publish("t").properties  # each its own, as a default factory gave
    assert Puback(1) == Puback(1, 0, {}) and Puback(1) != Pubrec(1) and Puback(1).properties is not Puback(1).properties
    assert repr(Pubrel(2, 0)) == "Pubrel(packet_id=2, reason_code=0, properties={})"
    assert [a(1).packet_type.name for a in (Puback, Pubrec, Pubrel, Pubcomp)] == ["PUBACK", "PUBREC", "PUBREL", "PUBCOMP"]


def test_a_persist_inside_then_is_hoisted():
    inner = Persist(("b",), (Send(1, "ack"),))
    outer = Persist(("a",), (inner, Send(2, "x")))
    assert outer.ops == ("a", "b") and outer.then == (Send(1, "ack"), Send(2, "x"))
    plain = Persist(("a",), (Send(1, "x"),))
    assert plain.ops == ("a",) and plain.then == (Send(1, "x"),)

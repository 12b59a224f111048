"""appliance/broker/effects.py: the core's effects have explicit constructors (no runtime `frozen`), and stay what
the adapter and the tests relied on when they were frozen dataclasses: the same fields and defaults, equality by
value, a repr, hashing, and a Persist inside a Persist's `then` hoisted."""

from __future__ import annotations

import dataclasses

import pytest

from pairmq.appliance.broker.effects import Close, Connacked, Durable, Persist, Send

ALL = (Send, Close, Persist, Connacked, Durable)


SAMPLES = {Send: {"conn": 1, "packet": "p"}, Close: {"conn": 1, "reason_code": 0x87, "reason": "why"},
           Persist: {"ops": ("op",), "then": (Close(2),)}, Connacked: {"conn": 3},
           Durable: {"entries": ("e",), "client_ids": ("c",)}}


@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.__name__)
def test_the_dataclass_fields_are_the_constructor_parameters(cls):
    values = SAMPLES[cls]
    assert [f.name for f in dataclasses.fields(cls)] == list(values)
    by_name, by_position = cls(**values), cls(*values.values())
    assert by_name == by_position and [getattr(by_name, name) for name in values] == list(values.values())


def test_defaults_equality_repr_and_hash():
    assert Close(3) == Close(3, 0, "") and Close(3) != Close(3, 1)
    assert Durable((1,)).client_ids == () and Persist(("a",)).then == ()
    assert repr(Close(1, 2, "x")) == "Close(conn=1, reason_code=2, reason='x')"
    assert {Close(1), Close(1), Connacked(2), Connacked(2)} == {Close(1), Connacked(2)}
    assert Send(1, "p") == Send(1, "p") and Send(1, "p") != Send(2, "p")


def test_a_persist_inside_then_is_hoisted():
    inner = Persist(("b",), (Send(1, "ack"),))
    outer = Persist(("a",), (inner, Send(2, "x")))
    assert outer.ops == ("a", "b") and outer.then == (Send(1, "ack"), Send(2, "x"))
    plain = Persist(("a",), (Send(1, "x"),))
    assert plain.ops == ("a",) and plain.then == (Send(1, "x"),)

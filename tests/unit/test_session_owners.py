"""Sessions owned by their user, deliveries checked at the ACL in force, and the login budget: sans-I/O.

The live-group versions of these are in tests/processes/test_hostile_sessions.py and tests/processes/test_hostile_logins.py.
"""

from __future__ import annotations

from pairmq.appliance.broker.core import BrokerCore, Close, Limits, Persist, Send, restore
from pairmq.appliance.broker.login_throttle import LoginThrottle
from pairmq.appliance.mqtt import codec
from pairmq.appliance.mqtt.wire import ReasonCode as RC
from pairmq.appliance.spool import ops
from pairmq.appliance.spool.state import StateModel

NOW = 1_700_000_000_000


def connect(core: BrokerCore, conn: int, client_id: str, user: str | None, *, clean: bool = False) -> list:
    packet = codec.Connect(4, client_id, clean, 60, None, None, None, {})
    return core.connect(conn, packet, NOW, username=user)


def flat(effects: list) -> list:
    out = []
    for e in effects:
        out.append(e)
        if isinstance(e, Persist):
            out += flat(list(e.then))
    return out


def test_the_owner_is_recorded_and_another_user_is_refused_without_touching_the_session():
    core = BrokerCore()
    effects = flat(connect(core, 1, "id", "alice"))
    assert ops.SessionOwned("id", "alice") in [op for e in effects if isinstance(e, Persist) for op in e.ops]
    assert core.owner_refusal("id", "mallory") == "this client id's session belongs to another user"
    assert core.owner_refusal("id", "alice") is None and core.owner_refusal("other", "mallory") is None
    assert core.owner_refusal("id", None) is not None  # anonymous is not alice either
    refused = connect(core, 2, "id", "mallory")
    assert refused == [Close(2, RC.NOT_AUTHORIZED, "this client id's session belongs to another user")]
    assert core.sessions["id"].conn == 1 and 2 not in core.connections  # alice kept her connection


def test_the_switch_gives_another_user_a_clean_session():
    core = BrokerCore(limits=Limits(other_user_clean_start=True))
    connect(core, 1, "id", "alice")
    core.sessions["id"].subscriptions["alice/#"] = None  # something of alice's to lose
    effects = flat(connect(core, 2, "id", "mallory"))
    connack = next(e.packet for e in effects if isinstance(e, Send) and isinstance(e.packet, codec.Connack))
    assert connack.session_present is False and core.sessions["id"].subscriptions == {}
    assert core.sessions["id"].owner == "mallory"
    assert any(isinstance(e, Close) and e.conn == 1 for e in effects)  # alice's connection was taken over


def test_a_session_from_before_owners_is_claimed_by_its_next_user():
    model = StateModel()
    model.apply(1, ops.SessionOpened("id", 4, 0xFFFFFFFF, 10))
    model.apply(2, ops.SessionDisconnected("id", 20, 0xFFFFFFFF))
    core = BrokerCore()
    restore(core, model.state(), NOW)
    assert core.sessions["id"].owner is None
    effects = flat(connect(core, 1, "id", "alice"))
    assert ops.SessionOwned("id", "alice") in [op for e in effects if isinstance(e, Persist) for op in e.ops]
    assert core.owner_refusal("id", "mallory") is not None


def test_removing_a_user_deletes_its_sessions_and_closes_its_connections():
    core = BrokerCore()
    connect(core, 1, "live", "carol")
    connect(core, 2, "stored", "carol")
    core.connection_lost(2, NOW)
    connect(core, 3, "bob's", "bob")
    effects = core.remove_users({"carol"}, NOW)
    assert set(core.sessions) == {"bob's"} and set(core.connections) == {3}
    assert [e.conn for e in effects if isinstance(e, Close)] == [1]
    deleted = [op for e in effects if isinstance(e, Persist) for op in e.ops if isinstance(op, ops.SessionDeleted)]
    assert sorted(op.client_id for op in deleted) == ["live", "stored"]


def test_the_login_budget_spends_failures_only_and_spares_a_fresh_address():
    throttle = LoginThrottle(per_address_per_min=3, per_user_per_min=3)
    for _ in range(3):
        assert throttle.take("10.0.0.7", "erin", 0.0) is None
    assert "too many failed logins from 10.0.0.7" in throttle.take("10.0.0.7", "erin", 0.0)
    assert throttle.take("10.0.0.8", "erin", 0.0) is None  # erin's budget is spent, but this address is fresh
    assert "for this user name" in throttle.take("10.0.0.8", "erin", 0.0)  # not any more
    assert throttle.take("10.0.0.7", "erin", 20.0) is None  # a token back after 60 / 3 s
    throttle.refund("10.0.0.9", "bob", 0.0)  # nothing spent: nothing to give back
    assert throttle.take("10.0.0.9", "bob", 0.0) is None
    throttle.refund("10.0.0.9", "bob", 0.0)
    assert [throttle.take("10.0.0.9", "bob", 0.0) for _ in range(3)] == [None, None, None]  # successes are free

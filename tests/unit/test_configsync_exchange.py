"""The config-sync exchange's ends, message by message: the join plans, divergence reports, the join point,
epoch fencing and strict decoding."""

from __future__ import annotations

import json

import pytest

from pairmq.configsync.exchange import (ActiveEnd, Changes, ConfigLinkFault, Hello, Ping, Snapshot, StandbyEnd, SyncStatus,
                                        decode, encode)
from pairmq.configsync.store import ConfigStore

ANON = {"kind": "anonymous.set", "allowed": True}


def change(n: int) -> dict:
    return {"kind": "overload.set", "name": "max_window", "value": 10 + n}


@pytest.fixture
def stores():
    a, b = ConfigStore(":memory:"), ConfigStore(":memory:")
    yield a, b
    a.close(), b.close()


def join(active: ConfigStore, standby: ConfigStore, epoch: int = 3):
    end, mine = ActiveEnd(epoch, active, 0), StandbyEnd(epoch, 0)
    mine.hello(standby.head, standby.recent_chains(64))
    [hello] = [decode(encode(m)) for m in mine.messages_to_send()]
    end.receive(hello, 1)
    return end, mine, [decode(encode(m)) for m in end.messages_to_send()]


def run_effects(mine: StandbyEnd, standby: ConfigStore, messages: list) -> list:
    for message in messages:
        for effect in mine.receive(message, 2):
            if isinstance(effect, Changes):
                standby.apply_entries(effect.entries)
            elif isinstance(effect, Snapshot):
                standby.install(effect.version, effect.chain, effect.document)
            mine.ack(standby.head)
    return [decode(encode(m)) for m in mine.messages_to_send()]


def test_a_standby_behind_gets_the_missing_changes_and_joins(stores):
    active, standby = stores
    for n in range(3):
        active.apply(change(n), n)
    end, mine, plan = join(active, standby)
    assert [type(m) for m in plan] == [Changes] and len(plan[0].entries) == 3 and end.plan == "3 changes"
    assert not end.joined() and end.status() is SyncStatus.SYNCING
    for ack in run_effects(mine, standby, plan):
        end.receive(ack, 3)
    assert standby.head == active.head and end.joined() and end.status() is SyncStatus.IN_SYNC
    entry = active.apply(ANON, 4)
    end.committed(entry)
    live = end.messages_to_send()
    assert end.status() is SyncStatus.SYNCING and end.joined()  # a change in flight does not unjoin it
    for ack in run_effects(mine, standby, live):
        end.receive(ack, 5)
    assert end.status() is SyncStatus.IN_SYNC


def test_a_standby_in_step_joins_on_its_first_ack(stores):
    active, standby = stores
    end, mine, plan = join(active, standby)
    assert plan == [Changes(3, ())] and end.plan == "in step"
    end.receive(run_effects(mine, standby, plan)[0], 2)
    assert end.joined()


def test_divergent_histories_get_a_snapshot_naming_the_common_version(stores):
    active, standby = stores
    shared = active.apply(change(0), 0)
    standby.apply_entries([shared])
    active.apply(change(1), 1)
    standby.apply(ANON, 1)  # standby's own version 2: not the active's
    end, mine, plan = join(active, standby)
    assert [type(m) for m in plan] == [Snapshot]
    assert plan[0].common == 1 and plan[0].reason == "the histories part after version 1"
    effect = mine.receive(plan[0], 2)[0]
    assert isinstance(effect, Snapshot) and effect.common == 1
    assert [e.version for e in standby.changes_after(effect.common)] == [2]  # what it reports as discarded


def test_a_standby_ahead_gets_a_snapshot(stores):
    active, standby = stores
    standby.apply(ANON, 0)
    plan = join(active, standby)[2]
    assert isinstance(plan[0], Snapshot) and "ahead of us" in plan[0].reason


def test_a_history_trimmed_past_the_standby_gets_a_snapshot(tmp_path):
    active, standby = ConfigStore(tmp_path / "a.db", max_history=2), ConfigStore(":memory:")
    first = active.apply(change(0), 0)
    standby.apply_entries([first])
    for n in range(1, 5):
        active.apply(change(n), n)
    plan = join(active, standby)[2]
    assert isinstance(plan[0], Snapshot) and "no longer reaches back to version 1" in plan[0].reason


def test_epochs_fence_both_ways(stores):
    active, standby = stores
    end = ActiveEnd(3, active, 0)
    with pytest.raises(ConfigLinkFault, match="newer than ours"):
        end.receive(Ping(4), 1)
    mine = StandbyEnd(5, 0)
    with pytest.raises(ConfigLinkFault, match="epoch 5 was active since"):
        mine.receive(Changes(4, ()), 1)


@pytest.mark.parametrize("data, why", [
    (b"\xff\xfe", "not JSON"),
    (b"[1, 2]", "without a known type"),
    (b'{"type": "launch", "epoch": 1}', "without a known type"),
    (b'{"type": "ack", "epoch": 1, "version": 2}', "without 'digest'"),
    (b'{"type": "ping", "epoch": -1}', "valid epoch"),
])
def test_decoding_is_strict(data, why):
    with pytest.raises(ConfigLinkFault, match=why):
        decode(data)


def test_a_malformed_change_or_snapshot_from_the_active_is_refused(stores):
    """Refused as it is decoded, before either end sees it."""
    bad_change = {"type": "changes", "epoch": 1, "entries": [{"version": 1, "chain": "00", "at_ms": 0,
                                                              "change": {"kind": "user.delete", "username": ""}}]}
    with pytest.raises(ConfigLinkFault, match="malformed change.*username"):
        decode(json.dumps(bad_change).encode())
    bad_snapshot = {"type": "snapshot", "epoch": 1, "version": 1, "chain": "00", "common": 0, "reason": "x",
                    "document": {"version": 1, "limits": {"session_queue_max_messages": 0}}}
    with pytest.raises(ConfigLinkFault, match="malformed snapshot.*session_queue_max_messages"):
        decode(json.dumps(bad_snapshot).encode())
    with pytest.raises(ConfigLinkFault, match="at most 64"):
        decode(json.dumps({"type": "hello", "epoch": 1, "version": 0, "digest": "", "recent": [[0, "x"]] * 65}).encode())


def test_every_message_survives_its_wire_form(stores):
    active = stores[0]
    entry = active.apply(ANON, 7)
    for message in (Hello(2, 1, "d", ((1, "c"), (0, ""))), Changes(2, (entry,)), Ping(2),
                    Snapshot(2, 1, entry.chain, active.document, -1, "no version in common")):
        assert decode(encode(message)) == message

"""Heartbeat authentication: checks in the order malformed → foreign → stale → MAC → replay."""

import dataclasses

import pytest

from pairmq.appliance.quorum import wire
from pairmq.appliance.quorum.auth import HeartbeatAuth, Rejected
from pairmq.appliance.roles import Role

SECRET = b"k" * 32


def heartbeat(seq=1, incarnation=5, sender=Role.BACKUP, group="g", views=None, **kw) -> wire.Heartbeat:
    views = views or tuple(wire.PeerView(r) for r in sender.peers())
    return wire.Heartbeat(group=group, sender=sender, incarnation=incarnation, seq=seq, epoch=3,
                          activity=wire.Activity.STANDBY if sender.routes_messages else wire.Activity.NONE,
                          views=views, **kw)


@pytest.fixture
def pair():
    return HeartbeatAuth(SECRET, "g", Role.BACKUP), HeartbeatAuth(SECRET, "g", Role.PRIMARY)


def rejection(receiver, data) -> str:
    with pytest.raises(Rejected) as info:
        receiver.open(data)
    return info.value.reason


def test_round_trip_keeps_every_field(pair):
    sender, receiver = pair
    hb = heartbeat(flags=wire.FLAG_SELF_IN_SYNC, bid_epoch=4, vote_epoch=2, vote_for=Role.MONITOR,
                   spool_epoch=3, spool_seq=99, config_version=7,
                   views=(wire.PeerView(Role.PRIMARY, 2, 10, 12, wire.NEVER_MS, 3, 3, 98), wire.PeerView(Role.MONITOR)))
    assert receiver.open(sender.seal(hb)) == hb


@pytest.mark.parametrize("mangle", [
    lambda d: d[:10], lambda d: d + b"x", lambda d: b"XXXX" + d[4:], lambda d: d[:4] + b"\x09" + d[5:],
    lambda d: d[:6] + b"\x07" + d[7:], lambda d: b"",
])
def test_malformed_is_refused_before_any_crypto(pair, mangle):
    sender, receiver = pair
    assert rejection(receiver, mangle(sender.seal(heartbeat()))) == "malformed"
    assert receiver.rejected["malformed"] == 1 and receiver.accepted == 0


def test_own_role_reflected_back_is_refused():
    me = HeartbeatAuth(SECRET, "g", Role.PRIMARY)
    assert rejection(me, me.seal(heartbeat(sender=Role.PRIMARY))) == "malformed"


def test_foreign_group_is_refused_even_with_the_same_secret(pair):
    _, receiver = pair
    other = HeartbeatAuth(SECRET, "h", Role.BACKUP)
    assert rejection(receiver, other.seal(heartbeat(group="h"))) == "foreign_group"


def test_stale_incarnation_refused_before_the_mac(pair):
    sender, receiver = pair
    receiver.open(sender.seal(heartbeat(incarnation=5)))
    old = bytearray(sender.seal(heartbeat(incarnation=4, seq=9)))
    old[-1] ^= 1  # a bad MAC too: stale must be reported first (cheapest check)
    assert rejection(receiver, bytes(old)) == "stale"


def test_tampered_or_wrong_secret_fails_the_mac_and_moves_no_mark(pair):
    sender, receiver = pair
    data = bytearray(sender.seal(heartbeat(seq=50)))
    data[30] ^= 0x40
    assert rejection(receiver, bytes(data)) == "bad_mac"
    forger = HeartbeatAuth(b"x" * 32, "g", Role.BACKUP)
    assert rejection(receiver, forger.seal(heartbeat(seq=60, incarnation=9))) == "bad_mac"
    # Neither forgery moved the replay mark: a genuine seq 1 is still accepted.
    assert receiver.open(sender.seal(heartbeat(seq=1))).seq == 1


def test_relabelled_sender_role_fails_the_mac(pair):
    sender, receiver = pair
    data = bytearray(sender.seal(heartbeat()))
    data[6] = Role.MONITOR.wire_id  # claim the monitor sent it: the key is bound to the role
    assert rejection(receiver, bytes(data)) in ("bad_mac", "malformed")


def test_replay_refused_only_after_the_mac(pair):
    sender, receiver = pair
    first = sender.seal(heartbeat(seq=7))
    receiver.open(first)
    assert rejection(receiver, first) == "replayed"
    assert rejection(receiver, sender.seal(heartbeat(seq=6))) == "replayed"
    assert receiver.open(sender.seal(heartbeat(seq=8))).seq == 8
    assert dict(receiver.rejected) == {"malformed": 0, "foreign_group": 0, "stale": 0, "bad_mac": 0, "replayed": 2,
                                     "unconfirmed": 0}


def test_new_incarnation_resets_sequence_numbers(pair):
    sender, receiver = pair
    receiver.open(sender.seal(heartbeat(seq=100, incarnation=5)))
    assert receiver.open(sender.seal(heartbeat(seq=1, incarnation=6))).incarnation == 6


def test_authentic_but_nonsensical_heartbeat_is_malformed(pair):
    sender, receiver = pair
    bad = dataclasses.replace(heartbeat(), activity=wire.Activity.NONE)  # a backup must report activity
    assert rejection(receiver, sender.seal(bad)) == "malformed"


def test_rotation_accepts_old_and_new_key_ids():
    old_and_new = HeartbeatAuth({0: SECRET, 1: b"n" * 32}, "g", Role.PRIMARY, send_key_id=1)
    assert old_and_new.open(HeartbeatAuth(SECRET, "g", Role.BACKUP).seal(heartbeat(seq=1))).seq == 1
    new_sender = HeartbeatAuth({1: b"n" * 32}, "g", Role.BACKUP, send_key_id=1)
    assert old_and_new.open(new_sender.seal(heartbeat(seq=2))).key_id == 1
    old_and_new.retire_key(0)
    assert rejection(old_and_new, HeartbeatAuth(SECRET, "g", Role.BACKUP).seal(heartbeat(seq=3))) == "bad_mac"


def test_after_a_boot_a_sender_counts_only_once_it_echoes_the_new_incarnation(pair):
    """Rule 6: a recording made before our restart cannot echo the incarnation we booted with."""
    sender, receiver = pair
    receiver.incarnation = 8  # our boot; a recording from before it echoes 7 at best
    echoing = lambda inc: (wire.PeerView(Role.PRIMARY, inc, 40), wire.PeerView(Role.MONITOR))  # noqa: E731
    recorded = [sender.seal(heartbeat(seq=s, views=echoing(7))) for s in (10, 11)]
    assert [rejection(receiver, d) for d in recorded * 2] == ["unconfirmed"] * 4
    assert receiver.unconfirmed == {Role.BACKUP: (5, 11)}  # what we echo back: its boot, so it can confirm us
    assert receiver.open(sender.seal(heartbeat(seq=12, views=echoing(8)))).seq == 12
    assert receiver.unconfirmed == {}
    assert rejection(receiver, recorded[1]) == "replayed"  # the ordinary marks from here on
    assert receiver.open(sender.seal(heartbeat(seq=1, incarnation=6))).incarnation == 6  # the sender restarted
    assert receiver.rejected["unconfirmed"] == 4 and receiver.accepted == 2

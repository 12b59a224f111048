"""The mate link's handshake and frames (mate_link/secure.py), driven as bytes: no sockets."""

from __future__ import annotations

import itertools
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pairmq.appliance.roles import Role
from pairmq.mate_link.secure import (
    MAX_FRAME_BYTES, READ_BYTES, ActiveHandshake, HandshakeFailed, SecureChannel, StandbyHandshake, Stage, TamperedFrame,
)

SECRET = b"s" * 32
GROUP = "plant-7"


def pair(active_secret=SECRET, standby_secret=SECRET, active_group=GROUP, standby_group=GROUP,
         active_role=Role.PRIMARY, standby_role=Role.BACKUP):
    active = ActiveHandshake(active_secret, active_group, active_role, os.urandom(32))
    standby = StandbyHandshake(standby_secret, standby_group, standby_role, os.urandom(32))
    return active, standby


def run(active: ActiveHandshake, standby: StandbyHandshake) -> None:
    """Shuttle bytes until neither side has anything to say."""
    while True:
        to_active, = [standby.data_to_send()]
        if to_active:
            active.receive_data(to_active)
        to_standby = active.data_to_send()
        if to_standby:
            standby.receive_data(to_standby)
        if not to_active and not to_standby:
            return


def established() -> tuple[SecureChannel, SecureChannel]:
    active, standby = pair()
    run(active, standby)
    assert active.stage is standby.stage is Stage.ESTABLISHED
    assert active.peer is Role.BACKUP
    return active.channel, standby.channel


def frames(channel: SecureChannel) -> list[bytes]:
    out = []
    while (frame := channel.next_frame()) is not None:
        out.append(frame)
    return out


def test_both_sides_prove_the_secret_then_frames_flow_both_ways():
    a, s = established()
    s.receive_data(a.seal(b"ops 1..10") + a.seal(b"") + a.seal(b"ops 11..12"))
    assert frames(s) == [b"ops 1..10", b"", b"ops 11..12"]
    a.receive_data(s.seal(b"ack 12"))
    assert frames(a) == [b"ack 12"]


def test_an_eavesdropper_sees_no_payload_and_no_two_frames_look_alike():
    a, _ = established()
    payload = b"car-door-42 OPEN " * 4
    first, second = a.seal(payload), a.seal(payload)
    assert payload[:16] not in first and first[4:] != second[4:]


def test_bytes_may_arrive_one_at_a_time():
    active, standby = pair()
    for _ in range(3):
        for byte in standby.data_to_send():
            active.receive_data(bytes([byte]))
        for byte in active.data_to_send():
            standby.receive_data(bytes([byte]))
    a, s = active.channel, standby.channel
    sealed = a.seal(b"hello")
    for byte in sealed[:-1]:
        s.receive_data(bytes([byte]))
        assert s.next_frame() is None
    s.receive_data(sealed[-1:])
    assert frames(s) == [b"hello"]


@pytest.mark.parametrize("who_lacks_it", ["active", "standby"])
def test_a_peer_without_the_secret_cannot_attach(who_lacks_it):
    """The active proves first; whichever side lacks the secret, the standby's check of that proof fails
    and it sends no proof of its own to a stranger."""
    wrong = b"w" * 32
    active, standby = pair(active_secret=wrong) if who_lacks_it == "active" else pair(standby_secret=wrong)
    with pytest.raises(HandshakeFailed) as err:
        run(active, standby)
    assert err.value.reason == "bad_proof"
    assert standby.stage is Stage.FAILED and standby.data_to_send() == b""
    assert active.stage is Stage.WAITING and active.channel is None


def test_a_standby_guessing_its_proof_is_refused():
    active, standby = pair()
    active.receive_data(standby.data_to_send())
    with pytest.raises(HandshakeFailed) as err:
        active.receive_data(b"\x00\x00\x00\x20" + os.urandom(32))
    assert err.value.reason == "bad_proof" and active.stage is Stage.FAILED and active.channel is None


@pytest.mark.parametrize("kwargs, reason", [
    ({"standby_group": "other"}, "foreign_group"),
    ({"standby_role": Role.PRIMARY}, "wrong_role"),
])
def test_a_foreign_group_or_our_own_role_is_refused_by_name(kwargs, reason):
    active, standby = pair(**kwargs)
    with pytest.raises(HandshakeFailed) as err:
        run(active, standby)
    assert err.value.reason == reason and active.stage is Stage.FAILED


def test_the_monitor_has_no_mate_link():
    with pytest.raises(ValueError, match="monitor"):
        StandbyHandshake(SECRET, GROUP, Role.MONITOR, os.urandom(32))


def test_a_recorded_handshake_replays_into_nothing():
    active, standby = pair()
    hello = standby.data_to_send()
    active.receive_data(hello)
    standby.receive_data(active.data_to_send())
    proof = standby.data_to_send()
    active.receive_data(proof)
    assert active.stage is Stage.ESTABLISHED
    again = ActiveHandshake(SECRET, GROUP, Role.PRIMARY, os.urandom(32))  # a fresh nonce, as every accept has
    again.receive_data(hello)
    with pytest.raises(HandshakeFailed) as err:
        again.receive_data(proof)
    assert err.value.reason == "bad_proof"


@pytest.mark.parametrize("data", [
    b"\x00\x00\x00\x05GARBA",                       # not a HELLO
    b"\x00\x00\xff\xff",                            # an oversized handshake message
    b"\x00\x00\x00\x2bPMQL\x09\x07plant-7\x02" + b"n" * 32,  # an unknown version
    b"\x00\x00\x00\x06PMQL\x01\x07",                # truncated fields
])
def test_malformed_hellos_are_refused_as_malformed(data):
    active = ActiveHandshake(SECRET, GROUP, Role.PRIMARY, os.urandom(32))
    with pytest.raises(HandshakeFailed) as err:
        active.receive_data(data)
    assert err.value.reason == "malformed"
    with pytest.raises(HandshakeFailed):
        active.receive_data(b"more")  # a failed handshake stays failed


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=600))
def test_any_bytes_before_the_handshake_are_a_clean_refusal_or_a_wait(data):
    active = ActiveHandshake(SECRET, GROUP, Role.PRIMARY, os.urandom(32))
    try:
        active.receive_data(data)
    except HandshakeFailed:
        assert active.stage is Stage.FAILED
    else:
        assert active.stage is Stage.WAITING


def test_tampered_replayed_reordered_or_dropped_frames_do_not_open():
    def fresh():
        return established()

    a, s = fresh()
    sealed = bytearray(a.seal(b"payment 10 EUR"))
    sealed[-1] ^= 1
    s.receive_data(bytes(sealed))
    with pytest.raises(TamperedFrame):
        s.next_frame()

    a, s = fresh()
    one = a.seal(b"one")
    s.receive_data(one + one)  # replayed
    assert s.next_frame() == b"one"
    with pytest.raises(TamperedFrame, match="does not authenticate"):
        s.next_frame()

    a, s = fresh()
    one, two = a.seal(b"one"), a.seal(b"two")
    s.receive_data(two + one)  # reordered (or one dropped)
    with pytest.raises(TamperedFrame):
        s.next_frame()

    a, s = fresh()
    sealed = bytearray(a.seal(b"x"))
    sealed[3] ^= 1  # the length is authenticated too
    s.receive_data(bytes(sealed) + b"\x00" * 40)
    with pytest.raises(TamperedFrame):
        s.next_frame()


def test_frame_lengths_are_bounded_before_buffering():
    a, s = established()
    s.receive_data((MAX_FRAME_BYTES + 1).to_bytes(4, "big"))
    with pytest.raises(TamperedFrame, match="frame of"):
        s.next_frame()
    with pytest.raises(ValueError, match="limit"):
        a.seal(b"x" * MAX_FRAME_BYTES)


def test_frames_right_behind_the_handshake_are_kept():
    active, standby = pair()
    active.receive_data(standby.data_to_send())
    standby.receive_data(active.data_to_send())
    assert standby.stage is Stage.ESTABLISHED
    first = standby.data_to_send() + standby.channel.seal(b"join: epoch 7 seq 1000")
    active.receive_data(first)  # PROOF and the first frame in one read
    assert frames(active.channel) == [b"join: epoch 7 seq 1000"]


def test_frames_read_into_the_channels_buffer_open_where_they_landed_whatever_the_read_sizes():
    """As the transport's BufferedProtocol reads: into `get_buffer`, then `buffer_updated`; a frame larger than the
    usual buffer makes it grow while it is read, and it is not kept that large afterwards."""
    a, s = established()
    big = os.urandom(3 * READ_BYTES)
    plain = [b"ops %d" % i for i in range(50)] + [big, b"ack", b""] + [os.urandom(7000) for _ in range(40)]
    wire = b"".join(a.seal(p) for p in plain)
    got, pos = [], 0
    for i, step in enumerate(itertools.cycle([1, 5, 4096, 70_000, 3, 300_000])):
        if pos >= len(wire):
            break
        with s.get_buffer(step) as room:
            n = min(step, len(room), len(wire) - pos)
            room[:n] = wire[pos:pos + n]
        s.buffer_updated(n)
        pos += n
        got += frames(s)
    assert got == plain and s.buffered_bytes == 0
    with s.get_buffer() as room:
        assert len(room) == READ_BYTES  # the 768 KiB frame's buffer went once it was read


def test_a_bad_length_is_refused_before_the_buffer_grows_for_it():
    _, s = established()
    with s.get_buffer() as room:
        room[:4] = (MAX_FRAME_BYTES + 1).to_bytes(4, "big")
    s.buffer_updated(4)
    with s.get_buffer() as room:
        assert len(room) <= READ_BYTES  # no room made for a frame that will never be accepted
    with pytest.raises(TamperedFrame):
        s.next_frame()

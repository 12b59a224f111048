"""Mate link messages (mate_link/messages.py) and the resync decision (mate_link/resync.py)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pairmq.appliance.spool.chain import GENESIS, ChainPoint
from pairmq.appliance.spool.records import make_commit
from pairmq.mate_link.messages import (
    MAX_COMMIT_BYTES, MAX_IMAGE_CHUNK_BYTES, Ack, Catchup, Image, ImageEnd, Join, MalformedMessage, Ops, Ping, Plan,
    Pong, Snapshot, decode, encode,
)
from pairmq.mate_link.resync import plan_resync

u64 = st.integers(0, (1 << 64) - 1)
points = st.builds(ChainPoint, u64, u64, st.binary(min_size=16, max_size=16))
u62 = st.integers(0, (1 << 62) - 1)
commits = st.builds(lambda prev, later, bodies: make_commit(prev, prev.epoch + later, bodies),
                    st.builds(ChainPoint, u62, u62, st.binary(min_size=16, max_size=16)), st.integers(0, 3),
                    st.lists(st.binary(max_size=64), min_size=1, max_size=4))
messages = st.one_of(
    st.builds(Join, u64, points, u64),
    st.builds(Plan, u64, st.sampled_from(Catchup), u64, points),
    st.builds(Ops, u64, st.lists(commits, max_size=5).map(tuple)),
    st.builds(Ack, u64, u64),
    st.builds(Snapshot, u64, st.lists(st.binary(max_size=64), max_size=5).map(tuple), st.none() | points),
    st.builds(Image, u64, u64, u64, st.binary(max_size=64)),
    st.builds(ImageEnd, u64, points, u64, st.binary(min_size=32, max_size=32)),
    st.builds(Ping, u64, u64),
    st.builds(Pong, u64, u64),
)


@settings(max_examples=400, deadline=None)
@given(messages)
def test_every_message_round_trips(m):
    assert decode(encode(m)) == m


@settings(max_examples=400, deadline=None)
@given(messages, st.data())
def test_any_truncation_or_trailing_byte_is_malformed(m, data):
    raw = encode(m)
    cut = data.draw(st.integers(0, len(raw) - 1))
    with pytest.raises(MalformedMessage):
        decode(raw[:cut])
    with pytest.raises(MalformedMessage, match="after the message"):
        decode(raw + b"\x00")


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=200))
def test_garbage_is_a_clean_refusal_or_a_canonical_message(raw):
    try:
        m = decode(raw)
    except MalformedMessage:
        return
    assert encode(m) == raw  # the layout is canonical: whatever decodes re-encodes to the same bytes


@pytest.mark.parametrize("raw, why", [
    (b"\x0a" + bytes(8), "unknown message type 10"),
    (b"\x08" + bytes(8) + bytes(16) + (MAX_IMAGE_CHUNK_BYTES + 1).to_bytes(4, "big"), "-byte image chunk"),
    (b"\x02" + bytes(8) + b"\x07" + bytes(40), "unknown catch-up kind 7"),
    (b"\x03" + bytes(8) + b"\xff\xff\xff\xff", "ops in one message"),
    (b"\x03" + bytes(8) + b"\x00\x00\x00\x01" + (MAX_COMMIT_BYTES + 1).to_bytes(4, "big"), "-byte commit"),
    (b"\x03" + bytes(8) + b"\x00\x00\x00\x01" + (60).to_bytes(4, "big") + bytes(60), "sound commit record"),
    (b"\x05" + bytes(8) + b"\x02", "snapshot flag 2"),
])
def test_malformed_messages_say_what_is_wrong(raw, why):
    with pytest.raises(MalformedMessage, match=why):
        decode(raw)


# --- resync -----------------------------------------------------------------------------------

LOG = []  # ops 1..10, epoch 3, one a commit
for _i in range(1, 11):
    LOG.append(make_commit(LOG[-1].point if LOG else GENESIS, 3, [b"op%d" % _i]))
HEAD = LOG[-1].point


def checksum_at(seq: int, log=LOG, base_seq: int = 0):
    return next((c.checksum for c in log if c.last_seq == seq), None) if seq > base_seq else None


def test_a_standby_at_our_head_is_in_step():
    plan = plan_resync(GENESIS, HEAD, HEAD, checksum_at)
    assert (plan.catchup, plan.ops_to_go) == (Catchup.IN_STEP, 0)


@pytest.mark.parametrize("standby_seq", [0, 1, 7])
def test_a_standby_on_our_history_gets_the_ops_after_its_head(standby_seq):
    standby = GENESIS if standby_seq == 0 else LOG[standby_seq - 1].point
    plan = plan_resync(GENESIS, HEAD, standby, checksum_at)
    assert (plan.catchup, plan.after_seq, plan.ops_to_go) == (Catchup.INCREMENTAL, standby_seq, 10 - standby_seq)


def test_a_standby_behind_our_truncated_log_gets_a_snapshot():
    base = LOG[4].point  # ops 1..5 are gone from our log
    plan = plan_resync(base, HEAD, LOG[2].point, lambda s: checksum_at(s, base_seq=5))
    assert plan.catchup is Catchup.SNAPSHOT and "starts after op 5" in plan.reason
    at_base = plan_resync(base, HEAD, base, lambda s: checksum_at(s, base_seq=5))
    assert (at_base.catchup, at_base.after_seq) == (Catchup.INCREMENTAL, 5)


def test_a_diverged_tail_is_discarded_by_a_snapshot():
    theirs = make_commit(LOG[5].point, 4, [b"never acked"])  # an old active wrote op 7 in epoch 4 alone
    plan = plan_resync(GENESIS, HEAD, theirs.point, checksum_at)
    assert plan.catchup is Catchup.SNAPSHOT and "diverged" in plan.reason
    ahead = make_commit(HEAD, 3, [b"more"]).point
    assert "ahead" in plan_resync(GENESIS, HEAD, ahead, checksum_at).reason

"""A spool's state as ops (appliance/spool/snapshot.py): applied to an empty spool they rebuild it."""

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from appliance.spool import ops as o
from appliance.spool.chain import ChainPoint
from appliance.spool.snapshot import snapshot_ops, snapshot_seqs
from appliance.spool.state import StateModel
from tests.test_spool_store import EVERY_OP, RANDOM_OP, body, model_of


def ranked(state):
    """The state with each queue entry's `order` replaced by its rank (a snapshot renumbers them)."""
    sessions = {cid: dataclasses.replace(s, queue=tuple(dataclasses.replace(e, order=i)
                                                         for i, e in enumerate(s.queue)))
                for cid, s in state.sessions.items()}
    return dataclasses.replace(state, sessions=sessions)


def rebuilt(state, max_message_ids=100_000):
    ops = snapshot_ops(state)
    head = ChainPoint(7, 10_000, b"h" * 16)
    model = StateModel(max_message_ids)
    for seq, op in zip(snapshot_seqs(head, len(ops)), ops, strict=True):
        assert model.apply(seq, op), f"the snapshot's op {op} was ignored"
    return model.state(state.head), ops


def test_every_kind_of_state_survives_a_snapshot():
    original = model_of(EVERY_OP).state()
    again, _ = rebuilt(original)
    assert ranked(again) == ranked(original)


def test_a_pubrec_copy_whose_body_is_gone_is_rebuilt_without_a_body():
    history = [[o.SessionOpened("a", 5, 60, 1)], [body(1), o.MessageQueued("a", 1, 2, False)],
               [o.MessageInflight("a", 1, 9), o.MessagePubrecReceived("a", 1)]]
    original = model_of(history).state()
    assert original.messages == {} and original.sessions["a"].queue[0].pubrec_received
    again, ops = rebuilt(original)
    assert ranked(again) == ranked(original) and again.messages == {} and again.stored_bytes == 0


def test_snapshot_seqs_end_at_the_head():
    assert list(snapshot_seqs(ChainPoint(1, 5, b"x" * 16), 3)) == [3, 4, 5]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(RANDOM_OP, min_size=1, max_size=8), min_size=1, max_size=25))
def test_any_history_survives_a_snapshot(submissions):
    original = model_of(submissions, max_message_ids=3).state()
    again, _ = rebuilt(original, max_message_ids=3)
    assert ranked(again) == ranked(original)

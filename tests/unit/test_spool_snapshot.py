"""A spool's state as ops (appliance/spool/snapshot.py): applied to an empty spool they rebuild it."""

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from pairmq.appliance.spool import ops as o
from pairmq.appliance.spool.records import checkpoint_name, segment_name
from pairmq.appliance.spool.snapshot import snapshot_ops, snapshot_seq
from pairmq.appliance.spool.state import StateModel
from tests.unit.test_spool_store import EVERY_OP, RANDOM_OP, body, model_of


def ranked(state):
    """The state with each queue entry's `order` replaced by its rank (a snapshot renumbers them)."""
    sessions = {cid: dataclasses.replace(s, queue=tuple(dataclasses.replace(e, order=i)
                                                         for i, e in enumerate(s.queue)))
                for cid, s in state.sessions.items()}
    return dataclasses.replace(state, sessions=sessions)


def rebuilt(state, max_message_ids=100_000):
    ops = snapshot_ops(state)
    model = StateModel(max_message_ids)
    for i, op in enumerate(ops):
        assert model.apply(snapshot_seq(i), op), f"the snapshot's op {op} was ignored"
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


def test_a_pubrec_copy_does_not_free_the_body_other_copies_still_hold():
    """Found by tests/netns/test_replication_faults.py: a QoS 2 message whose first subscriber had sent PUBREC
    vanished from every later subscriber's queue in a full resync (its release freed the body first)."""
    history = [[o.SessionOpened("live", 5, 60, 1), o.SessionOpened("late", 4, 60, 1)],
               [body(1), o.MessageQueued("live", 1, 2, False), o.MessageQueued("late", 1, 2, False),
                o.RetainedSet("t", 1)],
               [o.MessageInflight("live", 1, 9), o.MessagePubrecReceived("live", 1)]]
    original = model_of(history).state()
    assert list(original.messages) == [1] and original.sessions["late"].queue[0].msg_id == 1
    again, _ = rebuilt(original)
    assert ranked(again) == ranked(original)


def test_two_pubrec_copies_of_a_gone_body_share_one_placeholder():
    history = [[o.SessionOpened("a", 5, 60, 1), o.SessionOpened("b", 5, 60, 1)],
               [body(1), o.MessageQueued("a", 1, 2, False), o.MessageQueued("b", 1, 2, False)],
               [o.MessageInflight("a", 1, 9), o.MessagePubrecReceived("a", 1)],
               [o.MessageInflight("b", 1, 3), o.MessagePubrecReceived("b", 1)]]
    original = model_of(history).state()
    assert original.messages == {}
    again, _ = rebuilt(original)
    assert ranked(again) == ranked(original) and again.messages == {} and again.stored_bytes == 0


def test_snapshot_seqs_increase_and_stay_below_every_real_seq():
    assert snapshot_seq(0) < snapshot_seq(1) < snapshot_seq(10**9) < 0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(RANDOM_OP, min_size=1, max_size=8), min_size=1, max_size=25))
def test_any_history_survives_a_snapshot(submissions):
    original = model_of(submissions, max_message_ids=3).state()
    again, _ = rebuilt(original, max_message_ids=3)
    assert ranked(again) == ranked(original)


def test_a_spool_built_from_a_snapshot_loads_the_same_state_and_continues_the_log(tmp_path):
    """The standby's full resync on real files: build beside, swap in, then live ops chain on."""
    from pairmq.appliance.spool.records import make_commit
    from pairmq.appliance.spool.codec import encode_op
    from pairmq.appliance.spool.install import SnapshotBuilder
    from pairmq.appliance.spool.store import Spool
    from pairmq.appliance.spool.writer import SpoolWriter
    from tests.unit.test_spool_store import load, write

    write(tmp_path / "active", EVERY_OP, epoch=4)
    original = load(tmp_path / "active")
    write(tmp_path / "standby", [[o.SessionOpened("stale", 5, 60, 1)]], epoch=2)  # diverged: to be replaced

    bodies = [encode_op(op) for op in snapshot_ops(original)]
    live_files = files_of(tmp_path / "standby")
    builder = SnapshotBuilder(tmp_path / "standby.incoming")
    builder.add(bodies[:7])
    builder.add(bodies[7:])
    builder.finish(original.head)
    assert files_of(tmp_path / "standby") == live_files, "the live spool is untouched until the swap"
    builder.swap_into(tmp_path / "standby")
    assert not (tmp_path / "standby.incoming").exists()
    assert [p.name for p in sorted((tmp_path / "standby").iterdir()) if p.name != "spool.lock"] == [
        checkpoint_name(original.head.seq)], "the checkpoint alone: the stale spool's files are gone"

    rebuilt_state = load(tmp_path / "standby")
    assert ranked(rebuilt_state) == ranked(original) and rebuilt_state.head == original.head
    live = make_commit(original.head, 4, [encode_op(body(99)), encode_op(o.MessageQueued("a", 99, 1, False))])
    with Spool.open(tmp_path / "standby") as spool, SpoolWriter(spool) as writer:
        writer.submit_commits([live]).future.result(timeout=10)
    after = load(tmp_path / "standby")
    assert after.head == live.point and after.sessions["a"].queue[-1].msg_id == 99, "new ops queue behind"
    assert (tmp_path / "standby" / segment_name(original.head.seq + 1)).exists(), "the log goes on from the point"


def files_of(directory) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def test_an_abandoned_snapshot_leaves_the_live_spool_and_refuses_later_batches(tmp_path):
    import pytest

    from pairmq.appliance.spool.codec import encode_op
    from pairmq.appliance.spool.install import SnapshotBuilder
    from tests.unit.test_spool_store import load, write

    write(tmp_path / "standby", [[o.SessionOpened("stale", 5, 60, 1)]], epoch=2)
    before, live_files = load(tmp_path / "standby"), files_of(tmp_path / "standby")
    builder = SnapshotBuilder(tmp_path / "standby.incoming")
    builder.add([encode_op(o.SessionOpened("a", 5, 60, 1))])
    builder.abandon()  # the link broke mid-snapshot
    assert not (tmp_path / "standby.incoming").exists()
    with pytest.raises(RuntimeError, match="it was abandoned"):
        builder.add([encode_op(o.SessionOpened("b", 5, 60, 1))])
    with pytest.raises(RuntimeError, match="it was abandoned"):
        builder.finish(before.head)
    assert files_of(tmp_path / "standby") == live_files and load(tmp_path / "standby") == before


def test_a_malformed_snapshot_batch_is_refused_whole(tmp_path):
    import pytest

    from pairmq.appliance.spool.codec import encode_op
    from pairmq.appliance.spool.errors import OpCodecError
    from pairmq.appliance.spool.install import SnapshotBuilder

    builder = SnapshotBuilder(tmp_path / "incoming")
    with pytest.raises(OpCodecError):
        builder.add([encode_op(o.SessionOpened("a", 5, 0, 1)), b"\x01\xff garbage"])
    assert builder.applied == 0
    builder.abandon()
    assert not (tmp_path / "incoming").exists()


def test_the_mate_links_taps_see_every_commit_in_seq_order_and_the_log_answers_points(tmp_path):
    from pairmq.appliance.spool.chain import GENESIS
    from pairmq.appliance.spool.store import Spool
    from pairmq.appliance.spool.writer import SpoolWriter

    seen = []
    with Spool.open(tmp_path) as spool, SpoolWriter(spool) as writer:
        writer.on_commit = seen.append
        subs = [writer.submit(ops, 3) for ops in EVERY_OP]
        for sub in subs:
            sub.future.result(timeout=10)
        assert [c.first_seq for c in seen] == [1] + [c.last_seq + 1 for c in seen[:-1]]
        assert [c.ops for c in seen] == [len(ops) for ops in EVERY_OP]
        assert spool.log_point(seen[3].last_seq) == seen[3].point and spool.log_point(0) == GENESIS == spool.log_base()
        assert spool.log_point(seen[-1].last_seq + 1) is None

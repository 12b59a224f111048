"""The spool on real files (segments and checkpoints): state after every op type, the model, replay
from a checkpoint and from the start, compaction of the log."""

import random
import shutil
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pairmq.appliance.spool import ops as o
from pairmq.appliance.spool.chain import GENESIS
from pairmq.appliance.spool.records import verify_chain
from pairmq.appliance.spool.codec import encode_op
from pairmq.appliance.spool.errors import SpoolLocked
from pairmq.appliance.spool.state import QueueEntry, StateModel
from pairmq.appliance.spool.store import Spool
from pairmq.appliance.spool.writer import SpoolWriter, WriterLimits


def write(directory, submissions, epoch=1, limits=WriterLimits(), **sizes):
    """Apply the submissions (lists of ops) through a writer; returns the writer's final metrics.

    `sizes`: `segment_bytes` (Spool.open's) and `checkpoint_bytes` (the spool's), small to roll segments and
    checkpoint often."""
    checkpoint_bytes = sizes.pop("checkpoint_bytes", None)
    with Spool.open(directory, **sizes) as spool, SpoolWriter(spool, limits) as writer:
        if checkpoint_bytes is not None:
            spool.checkpoint_bytes = checkpoint_bytes
        subs = [writer.submit(ops, epoch) for ops in submissions]
        for sub in subs:
            sub.future.result(timeout=30)
        return writer.metrics()


def load(directory, max_message_ids=100_000):
    with Spool.open(directory, max_message_ids=max_message_ids) as spool:
        return spool.load_state()  # which also cross-checks reference counts, domains and stored bytes


def model_of(submissions, max_message_ids=100_000):
    model = StateModel(max_message_ids)
    seq = 0
    for ops in submissions:
        for op in ops:
            seq += 1
            model.apply(seq, op)
    return model


def body(msg_id, topic="t", payload=b"p", publisher="pub"):
    return o.MessageStored(msg_id, topic, payload, 1, False, b"\x01\x02", 0, publisher, 1000 + msg_id)


EVERY_OP = [
    [o.SessionOpened("a", 5, 3600, 10), o.SessionOpened("b", 4, 0, 11)],
    [o.Subscribed("a", "t/#", 2, True, True, 1, 7), o.Subscribed("a", "x", 1), o.Subscribed("b", "t/+", 1)],
    [o.Unsubscribed("a", "x")],
    [body(1), o.MessageQueued("a", 1, 2, False, (7,)), o.MessageQueued("b", 1, 1, True)],
    [o.MessageInflight("a", 1, 17), o.MessagePubrecReceived("a", 1)],
    [o.MessageAcked("b", 1)],
    [body(2), o.MessageQueued("b", 2, 1, False), o.MessageDropped("b", 2, "expired")],
    [body(3), o.RetainedSet("t/3", 3), body(4), o.RetainedSet("t/4", 4), o.RetainedCleared("t/4")],
    [o.InboundQos2Received("a", 5), o.InboundQos2Received("a", 6), o.InboundQos2Released("a", 5)],
    [body(5), o.WillSet("b", 5, 30), body(6), o.WillSet("a", 6, 0), o.WillCleared("a")],
    [o.MessageIdSeen("c", "m1", 100), o.MessageIdSeen("c", "m2", 101), o.MessageIdSeen("c", "m1", 102)],
    [o.SessionDisconnected("a", 200, 60)],
    [o.SessionOpened("c", 5, 0, 300), o.SessionDeleted("c")],
    [body(7), body(8), body(9), *(o.MessageQueued("b", m, 1, False) for m in (7, 8, 9)),
     o.MessagesInflight("b", (7, 8), (21, 22)), o.MessagesAcked("b", (7, 9))],
    [o.MessagesInflight("b", (8,), (23,))],
    [body(10), o.RetainedSet("t/10", 10), o.MessageQueued("b", 10, 1, False)],
    [o.MessagesAcked("b", (8, 10))],  # bodies committed earlier: 8 is freed, 10 stays retained
    [o.SessionOwned("a", "alice"), o.SessionOwned("b", "")],
    [o.MessageRouted(11, "t/11", b"r", 1, False, b"", 0, "pub", 1011, "b", 1, False, (3,))],
    [o.MessagesAcked("b", (11,))],  # a routed message (stored and queued in one op), acked: its body freed
]
assert {type(op) for ops in EVERY_OP for op in ops} == set(o.OP_TYPES.values())


def test_every_op_type_is_reflected_by_load_state(tmp_path):
    metrics = write(tmp_path, EVERY_OP)
    state = load(tmp_path)
    assert metrics.ignored_ops == 0
    assert state.position == (1, sum(map(len, EVERY_OP)))
    a, b = state.sessions["a"], state.sessions["b"]
    assert (a.owner, b.owner) == ("alice", "")
    assert set(state.sessions) == {"a", "b"}
    assert (a.connected, a.disconnected_at_ms, a.expiry_s) == (False, 200, 60)
    assert (b.connected, b.protocol_version, b.connected_at_ms) == (True, 4, 11)
    assert a.subscriptions == (o.Subscribed("a", "t/#", 2, True, True, 1, 7),)
    assert a.queue == (QueueEntry(1, 2, False, (7,), order=8, packet_id=17, pubrec_received=True),)
    assert b.queue == ()  # 7 and 9 acked in one batch, then 8 and 10 in another
    assert a.inbound_qos2 == (6,) and a.will is None
    assert b.will == o.WillSet("b", 5, 30)
    # Body 1: its only holder left is a's entry after PUBREC, which needs no body; 2 was dropped; 4 un-retained;
    # 6 was a will, cleared.
    assert set(state.messages) == {3, 5, 10}
    assert state.messages[3] == body(3)
    assert state.retained == {"t/3": 3, "t/10": 10}
    assert state.message_ids == (("c", "m2", 101), ("c", "m1", 102))
    assert state == model_of(EVERY_OP).state(state.head)


def test_a_replay_of_the_op_log_from_empty_rebuilds_the_same_state(tmp_path):
    write(tmp_path / "a", EVERY_OP)
    with Spool.open(tmp_path / "a") as spool:
        original = spool.load_state()
        commits = spool.read_commits(0, 1000)
    assert verify_chain(commits, GENESIS) == original.head and len(commits) > 2
    with Spool.open(tmp_path / "b") as spool, SpoolWriter(spool) as writer:
        writer.submit_commits(commits[:2]).future.result()
        writer.submit_commits(commits[2:]).future.result()
    assert load(tmp_path / "b") == original


def test_ops_whose_preconditions_fail_are_no_ops_in_both_the_store_and_the_model(tmp_path):
    submissions = [
        [o.MessageQueued("nobody", 1, 1, False), o.Subscribed("nobody", "t", 1), o.WillSet("nobody", 1, 0)],
        [o.SessionOpened("a", 5, 0, 1), o.MessageQueued("a", 99, 1, False), o.RetainedSet("t", 99)],
        [body(1), body(1, payload=b"other"), o.MessageQueued("a", 1, 1, False), o.MessageQueued("a", 1, 2, False)],
        [o.MessageAcked("a", 2), o.InboundQos2Released("a", 1), o.WillCleared("a"), o.RetainedCleared("t")],
        [o.MessagePubrecReceived("a", 1), o.MessagePubrecReceived("a", 1), o.MessageInflight("a", 1, 5)],
        [o.SessionDisconnected("nobody", 1, 1), o.SessionDeleted("nobody"), o.Unsubscribed("a", "t")],
    ]
    metrics = write(tmp_path, submissions)
    model = model_of(submissions)
    assert metrics.ignored_ops == model.ignored == 16
    state = load(tmp_path)
    assert state == model.state(state.head)
    assert state.messages == {}  # body 1's one entry got PUBREC: nothing holds the body any more
    assert state.sessions["a"].queue[0].pubrec_received


# A random op sequence over a small universe (so that ops interact), in random batches, against the model.

CLIENTS = st.sampled_from(["a", "b", "c"])
MSG_IDS = st.integers(1, 6)
TOPICS = st.sampled_from(["t1", "t2"])
SMALL = st.integers(0, 2)
PACKET_IDS = st.integers(1, 3)
RANDOM_OP = st.one_of(
    st.builds(body, MSG_IDS, TOPICS, st.binary(max_size=20)),
    st.builds(o.MessageRouted, MSG_IDS, TOPICS, st.binary(max_size=20), SMALL, st.booleans(), st.just(b""),
              st.just(0), st.sampled_from(["pub", "pub\u00e9"]), st.just(5), CLIENTS, SMALL, st.booleans(),
              st.lists(st.integers(0, 300), max_size=2).map(tuple)),
    st.builds(o.MessageQueued, CLIENTS, MSG_IDS, SMALL, st.booleans(), st.lists(SMALL, max_size=2).map(tuple)),
    st.builds(o.MessageInflight, CLIENTS, MSG_IDS, PACKET_IDS),
    st.builds(o.MessagePubrecReceived, CLIENTS, MSG_IDS),
    st.builds(o.MessageAcked, CLIENTS, MSG_IDS),
    st.builds(o.MessageDropped, CLIENTS, MSG_IDS, st.just("expired")),
    st.builds(o.SessionOpened, CLIENTS, st.sampled_from([3, 4, 5]), SMALL, SMALL),
    st.builds(o.SessionDisconnected, CLIENTS, SMALL, SMALL),
    st.builds(o.SessionDeleted, CLIENTS),
    st.builds(o.SessionOwned, CLIENTS, st.sampled_from(["", "alice", "mallory"])),
    st.builds(o.Subscribed, CLIENTS, TOPICS, SMALL, st.booleans(), st.booleans(), SMALL, SMALL),
    st.builds(o.Unsubscribed, CLIENTS, TOPICS),
    st.builds(o.RetainedSet, TOPICS, MSG_IDS),
    st.builds(o.RetainedCleared, TOPICS),
    st.builds(o.InboundQos2Received, CLIENTS, PACKET_IDS),
    st.builds(o.InboundQos2Released, CLIENTS, PACKET_IDS),
    st.builds(o.WillSet, CLIENTS, MSG_IDS, SMALL),
    st.builds(o.WillCleared, CLIENTS),
    st.builds(o.MessageIdSeen, CLIENTS, st.sampled_from(["m1", "m2", "m3", "m4"]), SMALL),
)


def files(directory, suffix):
    return sorted(p.name for p in Path(directory).glob("*" + suffix))


def crash_copy(spool, to):
    """The spool's files as a kill -9 would leave them now (the spool still open, its writer's futures resolved:
    every commit is on disk); the lock file stays behind, as the kernel drops a dead process's flock."""
    shutil.copytree(spool.directory, to, ignore=shutil.ignore_patterns("spool.lock"))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(RANDOM_OP, min_size=1, max_size=8), min_size=1, max_size=25), st.data(),
       st.sampled_from([300, 1000, 1 << 20]), st.sampled_from([200, 800, 1 << 30]))
def test_random_op_sequences_replayed_from_a_checkpoint_and_from_the_start_match_the_model(
        submissions, data, segment_bytes, checkpoint_bytes):
    """Written through the writer with a checkpoint forced at a random point (and the writer's own checkpoints when
    `checkpoint_bytes` is small), then recovered three ways: from the checkpoint `close` writes, from the newest
    checkpoint before it plus the log after it (a crash's copy), and from the log alone (that copy without its
    checkpoints). Each is the model's state, queue orders and the message-id history's order included."""
    limits = WriterLimits(max_message_ids=3)  # small, so that the history's bound is exercised
    forced = data.draw(st.integers(0, len(submissions)), label="checkpoint after this many submissions")
    one_by_one = data.draw(st.booleans(), label="a commit per submission (else group commits)")
    model = model_of(submissions, max_message_ids=3)
    with tempfile.TemporaryDirectory() as tmp:
        live, crashed, from_start = Path(tmp, "live"), Path(tmp, "crashed"), Path(tmp, "from-start")
        with Spool.open(live, segment_bytes=segment_bytes) as spool:
            spool.checkpoint_bytes = checkpoint_bytes
            writer = SpoolWriter(spool, limits)
            for i, part in enumerate((submissions[:forced], submissions[forced:])):
                if one_by_one:
                    for ops in part:
                        writer.submit(ops, 1).future.result(timeout=30)
                for sub in [] if one_by_one else [writer.submit(ops, 1) for ops in part]:
                    sub.future.result(timeout=30)
                if i == 0:
                    spool.write_checkpoint()
            metrics = writer.metrics()
            writer.close()  # joins a checkpoint of its own still being written
            crash_copy(spool, crashed)
            head = spool.log.head
        assert metrics.ignored_ops == model.ignored
        expected = model.state(head)
        assert files(live, ".ckpt") == [f"{head.seq:020d}.ckpt"]
        assert load(live, 3) == expected
        assert files(crashed, ".ckpt"), "the forced checkpoint at least"
        assert load(crashed, 3) == expected
        shutil.copytree(crashed, from_start, ignore=shutil.ignore_patterns("*.ckpt"))
        assert files(from_start, ".seg")[0] == f"{1:020d}.seg", "keep_ops kept the whole log"
        assert load(from_start, 3) == expected
        with Spool.open(live, max_message_ids=3) as spool:
            commits = spool.read_commits(0, 10_000)
        with Spool.open(Path(tmp, "b")) as spool, SpoolWriter(spool, limits) as writer:
            writer.submit_commits(commits).future.result()
        assert load(Path(tmp, "b"), 3) == expected


def test_small_segments_and_checkpoints_roll_and_recover_from_each_other(tmp_path):
    """The property above's sizes at a scale where every mechanism certainly runs: many segments, the writer's own
    checkpoints, a crash copy between them."""
    rng = random.Random(23)
    submissions = [[body(i, payload=rng.randbytes(rng.randrange(200))), o.SessionOpened(f"c{i % 5}", 5, 0, i),
                    o.MessageQueued(f"c{i % 5}", i, 1, False)] + ([o.MessageAcked(f"c{(i - 3) % 5}", i - 3)]
                                                                   if i % 3 and i > 3 else [])
                   for i in range(1, 400)]
    model = model_of(submissions)
    with Spool.open(tmp_path / "live", segment_bytes=2000) as spool:
        spool.checkpoint_bytes = 5000
        with SpoolWriter(spool) as writer:
            for ops in submissions:  # a commit each
                writer.submit(ops, 1).future.result(timeout=30)
        head = spool.log.head
        assert len(files(spool.directory, ".seg")) > 20
        checkpoint = spool.checkpoint
        assert 0 < checkpoint.seq < head.seq and files(spool.directory, ".ckpt") == [f"{checkpoint.seq:020d}.ckpt"]
        crash_copy(spool, tmp_path / "crashed")
    assert load(tmp_path / "live") == load(tmp_path / "crashed") == model.state(head)
    shutil.copytree(tmp_path / "crashed", tmp_path / "from-start", ignore=shutil.ignore_patterns("*.ckpt"))
    assert load(tmp_path / "from-start") == model.state(head)


def test_a_session_with_everything_deleted_releases_its_bodies(tmp_path):
    submissions = [[o.SessionOpened("a", 5, 0, 1), body(1), body(2), o.MessageQueued("a", 1, 1, False),
                    o.MessageQueued("a", 2, 2, False), o.MessagePubrecReceived("a", 2), body(3), o.WillSet("a", 3, 5),
                    o.RetainedSet("r", 1)],
                   [o.SessionDeleted("a")]]
    write(tmp_path, submissions)
    state = load(tmp_path)
    assert state.sessions == {} and set(state.messages) == {1} and state.retained == {"r": 1}
    assert state.stored_bytes == len(encode_op(body(1)))


def test_the_log_keeps_the_last_keep_ops_and_a_compacted_spool_still_verifies(tmp_path):
    limits = WriterLimits(keep_ops=50)
    write(tmp_path, [[o.MessageIdSeen("c", f"m{i}", i)] for i in range(200)], limits=limits, segment_bytes=1000,
          checkpoint_bytes=1500)
    with Spool.open(tmp_path, segment_bytes=1000) as spool:
        base = spool.log_base()
        per_segment = max(s.last.seq - s.base.seq for s in spool.log.segment_list())
        assert spool.head.seq == 200
        assert 150 - per_segment <= base.seq <= 150, "at least keep_ops kept, whole segments dropped"
        assert files(tmp_path, ".seg")[0] == f"{base.seq + 1:020d}.seg"
        with pytest.raises(LookupError, match="no longer in the log"):
            spool.read_commits(base.seq - 1, 10)
        commits = spool.read_commits(base.seq, 1000)
        assert commits[0].first_seq == base.seq + 1 and commits[-1].last_seq == 200
        assert verify_chain(commits, base) == spool.head
        assert len(spool.load_state().message_ids) == 200
    write(tmp_path, [[o.MessageIdSeen("c", "more", 1)]], limits=limits)  # reopens from a compacted log
    assert load(tmp_path).head.seq == 201


def test_a_new_epoch_continues_the_same_sequence(tmp_path):
    write(tmp_path, [[o.SessionOpened("a", 5, 0, 1)]], epoch=3)
    write(tmp_path, [[o.SessionOpened("b", 5, 0, 1)]], epoch=4)
    with Spool.open(tmp_path) as spool:
        assert [(c.epoch, c.last_seq) for c in spool.read_commits(0, 10)] == [(3, 1), (4, 2)]
        assert spool.load_state().position == (4, 2)


def test_one_process_at_a_time(tmp_path):
    with Spool.open(tmp_path):
        with pytest.raises(SpoolLocked, match="another process has it open"):
            Spool.open(tmp_path)
    Spool.open(tmp_path).close()


def test_a_fresh_spool_is_empty_and_its_files_appear_whole(tmp_path):
    """No file but the lock until the first commit; then a segment that starts at GENESIS (its header written and
    synced under a `.new` name, then renamed: never half a header under the real name); a checkpoint at close."""
    with Spool.open(tmp_path) as spool:
        state = spool.load_state()
        assert state.head == GENESIS and state.sessions == {} and state.messages == {}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spool.lock"], "an empty spool writes no checkpoint"
    with Spool.open(tmp_path) as spool, SpoolWriter(spool) as writer:
        writer.submit([o.SessionOpened("a", 5, 0, 1)], 1).future.result(timeout=30)
        assert sorted(p.name for p in tmp_path.iterdir()) == [f"{1:020d}.seg", "spool.lock"]
        assert spool.log.segment_list()[0].base == GENESIS
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{1:020d}.ckpt", f"{1:020d}.seg", "spool.lock"]


def test_a_session_opened_without_an_owner_keeps_none_until_one_is_set(tmp_path):
    """A session from before owners (docs/broker.md) keeps owner None through a checkpoint and a replay."""
    write(tmp_path, [[o.SessionOpened("a", 5, 3600, 10)]])
    assert load(tmp_path).sessions["a"].owner is None  # from the checkpoint written at close
    write(tmp_path, [[o.SessionOwned("a", "alice")]])
    assert load(tmp_path).sessions["a"].owner == "alice"


def test_a_body_nothing_refers_to_beside_a_pubrec_copy_of_its_message_survives_a_checkpoint(tmp_path):
    """The copy whose PUBREC arrived released the body; the same msg_id stored again holds a body no one refers
    to. A checkpoint must rebuild both (its release op must not take the second body away)."""
    submissions = [[body(3), o.SessionOpened("a", 5, 0, 0), o.MessageQueued("a", 3, 1, False),
                    o.MessagePubrecReceived("a", 3), body(3)]]
    write(tmp_path, submissions)  # `close` writes the checkpoint the reload starts from
    state = load(tmp_path)
    assert set(state.messages) == {3} and state.sessions["a"].queue[0].pubrec_received
    assert state == model_of(submissions).state(state.head)


def test_a_checkpoint_or_a_copy_taken_between_a_commits_write_and_its_apply_is_consistent(tmp_path):
    """The writer appends a commit outside the state lock and applies it under the lock, so a checkpoint thread
    (or a full resync's image) can take the lock in between. What it copies must be the state at the point it
    names: here the test holds the lock from before the commit (re-entrant: the checkpoint is taken on this
    thread), so the writer waits with its commit written and not applied."""
    with Spool.open(tmp_path) as spool:
        writer = SpoolWriter(spool)
        writer.submit([o.SessionOpened("a", 5, 0, 1)], 1).future.result(timeout=30)
        with spool.lock:
            sub = writer.submit([body(1), o.MessageQueued("a", 1, 1, False)], 1)
            for _ in range(3000):  # until its write is done (then the writer waits for the lock)
                if spool.log.head.seq == 3:
                    break
                time.sleep(0.01)
            assert spool.log.head.seq == 3 and not sub.future.done()
            copy = spool.load_state()
            point = spool.write_checkpoint()
        sub.future.result(timeout=30)
        writer.close()
        first = [[o.SessionOpened("a", 5, 0, 1)]]
        both = first + [[body(1), o.MessageQueued("a", 1, 1, False)]]
        consistent = [model_of(first).state(spool.log_point(1)), model_of(both).state(spool.log_point(3))]
        assert copy in consistent, "a copy that names one point and holds the state at another"
    assert point.seq in (1, 3)
    state = load(tmp_path)
    assert state.head.seq == 3 and [e.msg_id for e in state.sessions["a"].queue] == [1], "an acknowledged op lost"

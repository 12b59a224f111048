"""The group-commit writer on real files: batching, backpressure, limits, the asyncio path, throughput."""

import asyncio
import contextlib
import itertools
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pairmq.appliance.errors import LocalProtocolError
from pairmq.appliance.spool import ops as o
from pairmq.appliance.spool.chain import GENESIS
from pairmq.appliance.spool.codec import decode_op, encode_op
from pairmq.appliance.spool.errors import ChainError, OpCodecError, SpoolBusy, SpoolFull
from pairmq.appliance.spool.state import StateModel
from pairmq.appliance.spool.store import Spool
from pairmq.appliance.spool.records import RecordError, make_commit, segment_name, verify_chain
from pairmq.appliance.spool.outgoing import encode_ops
from pairmq.appliance.spool.received import read_commits
from pairmq.appliance.spool.writer import SpoolWriter, WriterLimits
from tests.harness.commit_gate import commits_stalled
from tests.harness.oplog import chained, ops_of
from tests.unit.test_spool_store import RANDOM_OP, model_of


@pytest.fixture
def spool(tmp_path):
    with Spool.open(tmp_path) as spool:
        yield spool


@contextlib.contextmanager
def writer_of(spool, **limits):
    writer = SpoolWriter(spool, WriterLimits(**limits))
    try:
        yield writer
    finally:
        writer.close()


def stored(msg_id, payload=b"x" * 100):
    return o.MessageStored(msg_id, "a/b/c", payload, 1, False, b"", 0, "pub", 1)


def test_a_future_resolves_with_its_commit_once_durable(spool):
    with writer_of(spool) as writer:
        first = writer.submit([o.SessionOpened("a", 5, 0, 1), o.Subscribed("a", "t", 1)], 2)
        second = writer.submit([o.MessageIdSeen("c", "m", 1)], 3)
        assert [(c.epoch, c.first_seq, c.last_seq) for c in first.commits + second.commits] == [(2, 1, 2), (3, 3, 3)]
        assert writer.head == second.commits[-1].point, "seqs are given at submit, before the commit"
        assert second.future.result(5) == second.commits and first.future.done()
        assert writer.durable == writer.head and writer.pending_ops == 0
        assert verify_chain(first.commits + second.commits, GENESIS) == writer.durable
        with pytest.raises(LocalProtocolError, match="ops of epoch 2 after epoch 3"):
            writer.submit([o.MessageIdSeen("c", "n", 1)], 2)
        assert writer.submit([], 3).future.result(0) == ()


def test_the_asyncio_variant_resolves_on_the_callers_loop(spool):
    async def main():
        with writer_of(spool) as writer:
            loop_thread = threading.get_ident()
            commits = await writer.commit([o.SessionOpened("a", 5, 0, 1)], 1)
            sub = writer.submit_async([o.MessageIdSeen("c", "m", 1)], 1)
            sub.future.add_done_callback(lambda _: seen.append(threading.get_ident()))
            await sub.future
            return commits, loop_thread

    seen = []
    commits, loop_thread = asyncio.run(main())
    assert [c.last_seq for c in commits] == [1] and seen == [loop_thread]


class WakeCountingLoop(asyncio.SelectorEventLoop):
    """A real event loop that counts the wake-ups other threads post to it."""

    def __init__(self) -> None:
        super().__init__()
        self.posted = 0

    def call_soon_threadsafe(self, *args, **kwargs):
        self.posted += 1
        return super().call_soon_threadsafe(*args, **kwargs)


def test_group_commits_made_while_the_loop_is_busy_are_settled_by_one_wake_up(spool):
    async def main():
        with writer_of(spool) as writer:
            subs = []
            for n in range(3):  # the loop is busy (it never yields): each commit is durable before the next is made
                subs.append(writer.submit_async([o.MessageIdSeen("c", f"m{n}", 1)], 1))
                deadline = time.monotonic() + 10
                while writer.durable.seq < subs[-1].commits[-1].last_seq and time.monotonic() < deadline:
                    time.sleep(0.001)
            assert writer.metrics().commits == 3 and not any(s.future.done() for s in subs)
            assert loop.posted == 1  # the first commit's; the two after it joined it
            results = [await s.future for s in subs]
            assert [r[0].last_seq for r in results] == [1, 2, 3]
            more = writer.submit_async([o.MessageIdSeen("c", "later", 1)], 1)  # the loop idles: a wake-up of its own
            assert (await more.future)[0].last_seq == 4 and loop.posted == 2

    loop = WakeCountingLoop()
    try:
        loop.run_until_complete(main())
    finally:
        loop.close()


def test_twenty_concurrent_submitters_share_one_commit(spool):
    with writer_of(spool) as writer:
        writer.submit([o.SessionOpened("a", 5, 0, 1)], 1).future.result(5)
        before = writer.metrics().commits
        start = threading.Barrier(21)
        subs = []

        def submitter(i):
            start.wait()
            subs.append(writer.submit([o.InboundQos2Received("a", i + 1)], 1))

        with commits_stalled(spool) as gate:  # stalls the writer's commits, not the disk: batching is what is tested
            first = writer.submit([o.MessageIdSeen("c", "m", 1)], 1)
            assert gate.reached.wait(5), "the writer never began the first commit"
            threads = [threading.Thread(target=submitter, args=(i,)) for i in range(20)]
            for t in threads:
                t.start()
            start.wait()
            for t in threads:
                t.join()
            assert writer.pending_ops == 21 and gate.waiting == 1
        first.future.result(5)
        for sub in subs:
            sub.future.result(5)
        metrics = writer.metrics()
    # The first commit held at the gate; the twenty queued behind it while it waited and went in one commit.
    assert metrics.commits - before == 2 and metrics.submissions == 22
    assert len(spool.load_state().sessions["a"].inbound_qos2) == 20


def test_free_running_concurrent_submitters_are_group_committed(spool, capsys):
    rounds, threads_n = 100, 20
    with writer_of(spool) as writer:
        writer.submit([o.SessionOpened("a", 5, 0, 1)], 1).future.result(5)

        def submitter(i):
            for r in range(rounds):
                writer.submit([o.MessageIdSeen("c", f"{i}-{r}", r)], 1).future.result(5)

        threads = [threading.Thread(target=submitter, args=(i,)) for i in range(threads_n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        m = writer.metrics()
    with capsys.disabled():
        print(f"\n[spool] {threads_n} threads x {rounds} one-op submissions: {m.submissions - 1} submissions in "
              f"{m.commits - 1} commits (mean batch {m.mean_batch_ops:.1f} ops)")
    assert m.commits < m.submissions / 2


def test_a_full_backlog_refuses_with_spool_busy_and_recovers(spool):
    with writer_of(spool, max_pending_ops=10, max_batch_ops=4) as writer:
        writer.submit([o.SessionOpened("a", 5, 0, 1)], 1).future.result(5)
        with commits_stalled(spool):
            subs = [writer.submit([o.InboundQos2Received("a", i), o.InboundQos2Released("a", i)], 1)
                    for i in range(1, 6)]
            assert writer.pending_ops == 10
            head = writer.head
            with pytest.raises(SpoolBusy, match="10 ops wait for commit \\(limit 10\\); stop reading publishers"):
                writer.submit([o.MessageIdSeen("c", "m", 1)], 1)
            assert writer.head == head, "a refused submission gets no seq"
        for sub in subs:
            sub.future.result(5)
        assert writer.pending_ops == 0
        writer.submit([o.MessageIdSeen("c", "m", 1)], 1).future.result(5)
        m = writer.metrics()
    assert m.ops == 12 and m.commits >= 4, "batches are bounded by max_batch_ops"


def test_the_byte_limit_refuses_whole_submissions_and_frees_on_ack(spool):
    size = len(encode_op(stored(1)))
    with writer_of(spool, max_spool_bytes=3 * size) as writer:
        writer.submit([o.SessionOpened("a", 5, 0, 1)], 1).future.result(5)
        for i in (1, 2, 3):
            writer.submit([stored(i), o.MessageQueued("a", i, 1, False)], 1)
        head = writer.head
        with pytest.raises(SpoolFull, match=f"storing {size} more bytes would pass the limit of {3 * size} bytes"):
            writer.submit([o.Subscribed("a", "t", 1), stored(4), o.MessageQueued("a", 4, 1, False)], 1)
        assert writer.head == head
        writer.submit([o.MessageAcked("a", 1)], 1).future.result(5)
        assert writer.metrics().stored_bytes == 2 * size
        writer.submit([stored(4), o.MessageQueued("a", 4, 1, False)], 1).future.result(5)
    state = spool.load_state()
    assert set(state.messages) == {2, 3, 4} and state.sessions["a"].subscriptions == ()


@settings(max_examples=200, deadline=None)
@given(st.lists(RANDOM_OP, min_size=1, max_size=12))
def test_a_submissions_one_pass_agrees_with_the_standbys_reading_of_its_commit(op_list):
    """outgoing.encode_ops (the active, before the commit is made) and received.read_commits (the standby, on the
    commit's bytes): the same bodies, the same sizes, the same stored bytes added."""
    bodies, sizes, added = encode_ops(op_list)
    assert bodies == [encode_op(op) for op in op_list]
    assert read_commits([make_commit(GENESIS, 1, bodies)]) == (tuple(op_list), sizes, added)


def test_an_op_that_cannot_be_encoded_or_is_out_of_its_domain_is_refused_before_it_gets_a_seq(spool):
    with writer_of(spool) as writer:
        writer.submit([o.SessionOpened("a", 5, 0, 1)], 1).future.result(5)
        head = writer.head
        with pytest.raises(OpCodecError):
            writer.submit([stored(1), o.MessageQueued("a", 2 ** 64, 1, False)], 1)  # past a varint's range
        with pytest.raises(ValueError, match="qos"):
            writer.submit([stored(2), o.MessageQueued("a", 2, 3, False)], 1)  # QoS 3
        assert writer.head == head and writer.pending_ops == 0
        writer.submit([stored(3), o.MessageQueued("a", 3, 1, False)], 1).future.result(5)
    assert set(spool.load_state().messages) == {3}


def test_close_commits_what_is_queued(spool):
    writer = SpoolWriter(spool)
    with commits_stalled(spool):
        for i in range(50):
            writer.submit([o.MessageIdSeen("c", f"m{i}", i)], 1)
        closing = threading.Thread(target=writer.close)
        closing.start()
    closing.join(10)
    assert len(spool.load_state().message_ids) == 50
    with pytest.raises(LocalProtocolError, match="closed"):
        writer.submit([o.MessageIdSeen("c", "late", 1)], 1)


def test_the_standby_path_appends_received_commits_as_they_came_and_refuses_bad_ones(tmp_path):
    with Spool.open(tmp_path / "active") as active, writer_of(active) as writer:
        commits = []
        for ops in ([o.SessionOpened("a", 5, 0, 1)], [stored(1), o.MessageQueued("a", 1, 2, False)]):
            commits += writer.submit(ops, 4).future.result(5)
    first = commits[0]
    forged = make_commit(GENESIS, 4, [encode_op(o.SessionOpened("b", 5, 0, 1))])
    junk = make_commit(GENESIS, 4, [b"\x01\x07junk"])
    with Spool.open(tmp_path / "standby") as standby, writer_of(standby) as writer:
        with pytest.raises(ChainError, match="ops 2..3 follow op 0"):
            writer.submit_commits(commits[1:])
        with pytest.raises(ChainError, match="ops 1..1: their checksum does not chain"):
            writer.submit_commits([forged._replace(checksum=first.checksum)])
        with pytest.raises(RecordError, match="CRC does not match"):
            writer.submit_commits([first._replace(data=first.data.replace(b"a", b"b", 1))])
        with pytest.raises(OpCodecError):
            writer.submit_commits([junk])
        with pytest.raises(ValueError, match="qos 7 is outside 0..2"):
            writer.submit([o.Subscribed("a", "t", 7)], 4)
        assert writer.head == GENESIS
        writer.submit_commits(commits[:1]).future.result(5)
        writer.submit_commits(commits[1:]).future.result(5)
        assert writer.durable == commits[-1].point
        state = standby.load_state()
    assert (tmp_path / "standby" / segment_name(1)).read_bytes() == (tmp_path / "active" / segment_name(1)).read_bytes()
    model = StateModel()
    for seq, body in ops_of(commits):
        model.apply(seq, decode_op(body))
    assert state == model.state(commits[-1].point)


def test_throughput_of_durable_100_byte_messages_with_fan_out_1(spool, capsys):
    """What the broker gets: many publishers awaiting commit of MessageStored + MessageQueued each."""
    publishers, per_publisher = 200, 100

    async def main():
        with writer_of(spool) as writer:
            await writer.commit([o.SessionOpened("sub", 5, 3600, 1)], 1)
            ids = itertools.count(1)

            async def publisher():
                for _ in range(per_publisher):
                    i = next(ids)
                    await writer.commit([stored(i), o.MessageQueued("sub", i, 1, False)], 1)

            started = time.perf_counter()
            await asyncio.gather(*(publisher() for _ in range(publishers)))
            return time.perf_counter() - started, writer.metrics()

    elapsed, m = asyncio.run(main())
    messages = publishers * per_publisher
    with capsys.disabled():
        print(f"\n[spool] {messages} durable 100-byte messages, fan-out 1, {publishers} concurrent publishers: "
              f"{messages / elapsed:,.0f} msg/s ({2 * messages / elapsed:,.0f} ops/s), {m.commits} commits, "
              f"mean batch {m.mean_batch_ops:.0f} ops, last commit {m.last_commit_ms:.1f} ms")
    assert len(spool.load_state().sessions["sub"].queue) == messages


def test_a_standby_batch_with_a_malformed_op_is_refused_whole(tmp_path):
    with Spool.open(tmp_path / "s") as spool, writer_of(spool) as writer:
        sound = encode_op(o.SessionOpened("a", 5, 3600, 1))
        commits = chained([[sound], [sound, b"\x01\x02\xff"]])
        with pytest.raises(OpCodecError):
            writer.submit_commits(commits, chained=True)
        assert writer.head == GENESIS and writer.pending_ops == 0
        assert spool.log.head == GENESIS and spool.read_commits(0, 10) == []
        writer.submit_commits(commits[:1]).future.result(5)  # the sound commit alone goes on
    assert set(load_state(tmp_path / "s").sessions) == {"a"}


def load_state(directory):
    with Spool.open(directory) as spool:
        return spool.load_state()


@settings(max_examples=30, deadline=None)
@given(rounds=st.lists(st.lists(st.lists(RANDOM_OP, min_size=1, max_size=8), min_size=1, max_size=6),
                       min_size=1, max_size=3))
def test_any_ops_received_by_the_standby_path_end_as_the_model_across_restarts(rounds):
    """The standby applies what the active sent (submit_commits), a writer per round with the spool closed and
    opened in between (a checkpoint then, replayed from it): the state is the model's of the same ops."""
    submissions = [[o.SessionOpened(c, 5, 3600, 1) for c in ("a", "b", "c")]] + [s for r in rounds for s in r]
    with tempfile.TemporaryDirectory() as tmp:
        head = GENESIS
        for i, batch in enumerate([submissions[:1] + rounds[0], *rounds[1:]]):
            with Spool.open(tmp) as spool, writer_of(spool) as writer:
                subs = []
                for ops in batch:
                    commit = make_commit(head, 1 + i, [encode_op(op) for op in ops])
                    head = commit.point
                    subs.append(writer.submit_commits([commit], chained=i % 2 == 0))
                for sub in subs:
                    sub.future.result(30)
        state = load_state(tmp)
    assert state == model_of(submissions).state(head)


KILL_BATCH_OPS = 500
CATCH_UP = f"""
import sys
from pairmq.appliance.spool import ops as o
from pairmq.appliance.spool.chain import GENESIS
from pairmq.appliance.spool.codec import encode_op
from pairmq.appliance.spool.records import make_commit
from pairmq.appliance.spool.store import Spool
from pairmq.appliance.spool.writer import SpoolWriter

ops = [o.SessionOpened("sub", 4, 0xFFFFFFFF, 1), o.Subscribed("sub", "t", 1)]
for m in range(1, 60_001):
    ops += [o.MessageStored(m, "t", b"m" * 500, 1, False, b"", 0, "pub", 1), o.MessageQueued("sub", m, 1, False)]
bodies = [encode_op(op) for op in ops]
head = GENESIS
with Spool.open(sys.argv[1]) as spool, SpoolWriter(spool) as writer:
    for at in range(0, len(bodies), {KILL_BATCH_OPS}):
        commit = make_commit(head, 1, bodies[at:at + {KILL_BATCH_OPS}])
        head = commit.point
        sub = writer.submit_commits([commit], chained=True)
        sub.future.add_done_callback(lambda f: print(f.result()[-1].last_seq, flush=True))
print("done", flush=True)
"""


def test_a_standby_killed_mid_catch_up_keeps_every_committed_batch_and_no_part_of_one(tmp_path):
    """kill -9 of a real process while the standby path commits a long catch-up: the spool opens clean, holding
    at least every batch whose commit it reported, and only whole batches (a submission is never split)."""
    directory = tmp_path / "s"
    proc = subprocess.Popen([sys.executable, "-c", CATCH_UP, str(directory)], stdout=subprocess.PIPE, text=True)
    reported = 0
    try:
        while reported < 20_000:
            line = proc.stdout.readline()
            assert line and line.strip() != "done", "the catch-up finished before it could be killed: make it longer"
            reported = int(line)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    with Spool.open(directory) as spool:  # every check: each record's CRC, the chain, the commits
        head = spool.log.head
        state = spool.load_state()
    assert reported <= head.seq < 120_002 and head.seq % KILL_BATCH_OPS == 0, (reported, head)
    assert len(state.messages) == len(state.sessions["sub"].queue) == (head.seq - 2) // 2

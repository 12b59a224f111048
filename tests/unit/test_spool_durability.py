"""Durability with real processes and a real (tiny) filesystem: kill -9 mid-stream, a full disk.

(kill -9 at chosen points of a commit, a new segment and a checkpoint: test_spool_crash.py.)

The child writes through the real writer and prints each seq the moment its
future resolves; whatever it printed was acknowledged, so it must be on disk
after the kill, with the chain intact.
"""

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pairmq.appliance.spool import ops as o
from pairmq.appliance.spool.errors import SpoolFull
from pairmq.appliance.spool.state import StateModel
from pairmq.appliance.spool.store import Spool
from pairmq.appliance.spool.writer import SpoolWriter, WriterLimits

from tests.harness.oplog import logged_ops
from tests.harness.tmpfs import small_disks

REPO = Path(__file__).resolve().parents[2]
CHILD = textwrap.dedent("""
    import sys, threading
    from pairmq.appliance.spool import ops as o
    from pairmq.appliance.spool.store import Spool
    from pairmq.appliance.spool.writer import SpoolWriter, WriterLimits

    directory, first_msg_id, epoch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    writer = SpoolWriter(Spool.open(directory))
    writer.submit([o.SessionOpened("sub", 5, 3600, 1)], epoch).future.result()
    window = threading.Semaphore(400)

    def acknowledged(sub, msg_id):
        def done(future):
            window.release()
            if future.exception() is None:
                sys.stdout.write(f"{sub.commits[-1].last_seq} {msg_id}\\n")
                sys.stdout.flush()
        return done

    for msg_id in range(first_msg_id, first_msg_id + 2_000_000):
        window.acquire()
        sub = writer.submit([o.MessageStored(msg_id, "t", b"x" * 100, 1, False, b"", 0, "p", 1),
                             o.MessageQueued("sub", msg_id, 1, False)], epoch)
        sub.future.add_done_callback(acknowledged(sub, msg_id))
""")


def run_and_kill(directory, first_msg_id, epoch, after_acks):
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(directory), str(first_msg_id), str(epoch)],
                             stdout=subprocess.PIPE, text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    acked = []
    try:
        for line in child.stdout:
            acked.append(tuple(map(int, line.split())))
            if len(acked) == after_acks:
                os.kill(child.pid, signal.SIGKILL)  # mid-stream: hundreds of submissions are in flight
                break
        acked += [tuple(map(int, line.split())) for line in child.stdout]  # printed before it died: acknowledged
    finally:
        child.kill()
        child.wait()
    assert child.returncode == -signal.SIGKILL and len(acked) >= after_acks, "the child died on its own"
    return acked


@pytest.mark.processes
def test_kill_9_mid_stream_loses_no_acknowledged_op(tmp_path):
    everything = []
    for round_, epoch in enumerate((1, 1, 2)):
        acked = run_and_kill(tmp_path, first_msg_id=1 + round_ * 10_000_000, epoch=epoch,
                             after_acks=3000 + 1000 * round_)
        with Spool.open(tmp_path) as spool:  # verifies the whole chain
            state = spool.load_state()
            logged = logged_ops(spool)
        assert state.head.seq >= max(seq for seq, _ in acked)
        assert [seq for seq, _ in logged] == list(range(1, state.head.seq + 1))
        queued = {e.msg_id for e in state.sessions["sub"].queue}
        everything += [msg_id for _, msg_id in acked]
        missing = [msg_id for msg_id in everything if msg_id not in queued]
        assert missing == [], f"acknowledged messages lost after kill -9 (round {round_}): {missing[:5]}"
        assert state.position[0] == epoch


@pytest.fixture
def tiny_fs(tmp_path):
    with small_disks([tmp_path / "tiny"], "1m") as (mount_point,):
        yield mount_point


def test_a_full_disk_is_spool_full_and_the_spool_stays_consistent(tiny_fs):
    ballast = tiny_fs / "ballast"
    ballast.write_bytes(b"\0" * 128 * 1024)  # given back later: space that returns
    directory = tiny_fs / "spool"
    durable = []  # ((commit,), ops) of acknowledged submissions
    errors = []
    with Spool.open(directory) as spool:
        writer = SpoolWriter(spool, WriterLimits(max_batch_bytes=400_000))  # the big submission below: a batch alone
        opened = writer.submit([o.SessionOpened("sub", 5, 0, 1)], 1)
        durable.append((opened.future.result(5), opened.ops))
        for msg_id in range(1, 10_000, 4):
            subs = [writer.submit([o.MessageStored(i, "t", b"y" * 3000, 1, False, b"", 0, "p", 1),
                                   o.MessageQueued("sub", i, 1, False)], 1) for i in range(msg_id, msg_id + 4)]
            for sub in subs:
                try:
                    durable.append((sub.future.result(10), sub.ops))
                except SpoolFull as exc:
                    errors.append(exc)
            if errors:
                break
        assert errors, "the 1 MiB filesystem never filled up"
        assert all(isinstance(e, SpoolFull) for e in errors)
        assert "the disk is full ([Errno 28] No space left on device)" in str(errors[0])
        assert str(directory) in str(errors[0])
        m = writer.metrics()
        assert writer.head == writer.durable == m.durable and m.pending_ops == 0 and m.failed_batches >= 1
        (segment,) = spool.log.segment_list()
        assert segment.last == m.durable and segment.path.stat().st_size == segment.size, \
            "the failed write was cut back off"

        ballast.unlink()  # space comes back: the same writer carries on
        # Submissions queued behind a batch that fails chained on it: they fail too, though they would fit. Holding
        # the spool's state lock (as a reader copying the state does) keeps the writer inside the gate's commit, after
        # its write, until all of them are queued.
        with spool.lock:
            gate = writer.submit([o.MessageIdSeen("c", "gate", 1)], 1)
            big = writer.submit([o.MessageStored(99_999, "t", b"z" * 500_000, 1, False, b"", 0, "p", 1),
                                 o.MessageQueued("sub", 99_999, 1, False)], 1)
            small = [writer.submit([o.MessageIdSeen("c", f"small-{i}", i)], 1) for i in range(3)]
        durable.append((gate.future.result(10), gate.ops))
        with pytest.raises(SpoolFull, match="the disk is full"):
            big.future.result(10)
        for sub in small:
            with pytest.raises(SpoolFull, match="an earlier batch these ops chained on was rolled back"):
                sub.future.result(10)
        assert writer.head == writer.durable == durable[-1][0][-1].point, "the head went back to the last commit"

        more = writer.submit([o.MessageIdSeen("c", "after", 1)], 1)
        durable.append((more.future.result(5), more.ops))
        writer.close()
    model = StateModel()
    for (commit,), ops in sorted(durable, key=lambda d: d[0][0].last_seq):
        for seq, op in zip(range(commit.first_seq, commit.last_seq + 1), ops):
            model.apply(seq, op)
        model.head = commit.point
    with Spool.open(directory) as spool:
        state = spool.load_state()
    assert state == model.state(), "exactly the acknowledged submissions, nothing half-applied"
    assert len(state.sessions["sub"].queue) == len(durable) - 3 > 10

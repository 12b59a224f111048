"""kill -9 at every kind of point of a commit, a new segment and a checkpoint: recovery keeps every
acknowledged op, cuts only an unacknowledged tail, and is exactly a prefix of what was submitted.

A child process (tests/harness/spool_crash_child.py) writes QoS 2 traffic through the real writer and kills
itself with SIGKILL at the nth fdatasync, fsync or pwrite on a chosen file: between a commit's write and its
fdatasync, after the fdatasync returned but before anyone heard, half way through a commit's write, while a
new segment's header or a checkpoint is being synced, around a rename's directory sync. Then the spool is
opened here as a restarted node opens it, and checked:
- it opens (a torn tail is cut, a leftover `.new` removed), and its log verifies from base to head;
- every submission the child printed (its future resolved: acknowledged) is in it;
- its state is the model of exactly the first K submissions, for some K: a commit is all or nothing, and
  never serves a message twice (a QoS 2 message whose PUBCOMP was acknowledged stays gone);
- it takes new commits, and a second kill on top of the first recovers the same way.
A power loss (not a kill) can keep only part of the write whose fdatasync had not returned: the last test
here cuts a killed child's unsynced commit short; test_spool_corruption.py cuts a last commit at every
offset and zeroes it.
"""

import dataclasses
import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from pairmq.appliance.spool import records as r
from pairmq.appliance.spool.state import StateModel
from pairmq.appliance.spool.store import Spool
from pairmq.appliance.spool.writer import SpoolWriter
from tests.harness.spool_crash_child import CLIENT, KillPoint, submission

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.processes


def crash(directory, point):
    """Run the child until it kills itself at `point`; (acknowledged {i: seq}, the child's last stderr line)."""
    child = subprocess.run([sys.executable, "-m", "tests.harness.spool_crash_child", str(directory),
                            json.dumps(dataclasses.asdict(point))], cwd=REPO, capture_output=True, text=True,
                           env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=300)
    assert child.returncode == -signal.SIGKILL, (f"the child did not die at its kill point (exit "
                                                 f"{child.returncode}):\n{child.stderr[-2000:]}")
    said = child.stderr.strip().splitlines()[-1]
    assert said.startswith(f"kill -9 at {point.call} #{point.nth}"), child.stderr[-2000:]
    acked = dict(tuple(map(int, line.split())) for line in child.stdout.splitlines())
    return acked, said


def recovered(directory, stream_end):
    """Open the spool as a restarted node does and check it against the submitted stream (see the module's
    docstring); the state and K, the number of submissions it holds."""
    with Spool.open(directory) as spool:
        state = spool.load_state()
        base = spool.log_base()
        commits = spool.read_commits(base.seq, 10_000_000)
        assert r.verify_chain(commits, base) == state.head
    assert not list(Path(directory).glob("*.new")), "a crash's unfinished file was left"
    model, seq, k = StateModel(), 0, 0
    while seq < state.head.seq:
        assert k < stream_end, f"the spool holds ops past the last submission ({seq} of {state.head.seq})"
        for op in submission(k):
            seq += 1
            model.apply(seq, op)
        k += 1
    assert seq == state.head.seq, f"the head (op {state.head.seq}) is inside submission {k - 1}: a torn commit"
    assert state == model.state(state.head), "not the state of a prefix of the submissions"
    return state, k


def queued(state):
    return {e.msg_id for e in state.sessions[CLIENT].queue} if CLIENT in state.sessions else set()


KILLS = {
    "between a commit's write and its fdatasync": KillPoint("fdatasync", ".seg", 1),
    "between the 9th commit's write and its fdatasync": KillPoint("fdatasync", ".seg", 9),
    "between the 60th commit's write and its fdatasync": KillPoint("fdatasync", ".seg", 60, window=3),
    "after a commit's fdatasync returned, before its ack": KillPoint("fdatasync", ".seg", 25, "after"),
    "a tenth of a commit's write": KillPoint("pwrite", ".seg", 12, "part", 0.1),
    "nine tenths of a commit's write": KillPoint("pwrite", ".seg", 40, "part", 0.9),
    "a new segment's header written, not synced": KillPoint("fdatasync", ".seg.new", 3),
    "a new segment's header synced, not renamed": KillPoint("fdatasync", ".seg.new", 4, "after"),
    "a checkpoint written, not synced": KillPoint("fsync", ".ckpt.new", 2),
    "a checkpoint synced, not renamed": KillPoint("fsync", ".ckpt.new", 3, "after"),
    "a rename or a compaction, before the directory's sync": KillPoint("fsync", "/", 5),
    "a rename or a compaction, after the directory's sync": KillPoint("fsync", "/", 8, "after"),
    "compaction of segments a checkpoint covers": KillPoint("fsync", "/", 20, segment_bytes=2048,
                                                            checkpoint_bytes=4096, keep_ops=200, window=4),
    "a checkpoint, with compaction, written not synced": KillPoint("fsync", ".ckpt.new", 6, segment_bytes=2048,
                                                                   checkpoint_bytes=4096, keep_ops=200, window=4),
    "the checkpoint a clean close writes, not synced": KillPoint("fsync", ".ckpt.new", 1, checkpoint_bytes=1 << 30,
                                                                 close_after=500),
    "the checkpoint a clean close writes, synced, not renamed": KillPoint("fsync", ".ckpt.new", 1, "after",
                                                                          checkpoint_bytes=1 << 30, close_after=500),
    "one segment, no checkpoint": KillPoint("fdatasync", ".seg", 30, segment_bytes=64 << 20,
                                            checkpoint_bytes=1 << 30),
}


@pytest.mark.parametrize("point", KILLS.values(), ids=KILLS.keys())
def test_kill_9_at_a_point_of_a_commit_keeps_every_acknowledged_op_and_a_prefix_only(tmp_path, point):
    acked, said = crash(tmp_path, point)
    state, k = recovered(tmp_path, point.max_submissions)
    assert all(i < k for i in acked), f"acknowledged submissions lost ({said}): {sorted(i for i in acked if i >= k)}"
    assert state.head.seq >= max(acked.values(), default=0)
    assert k <= max(acked, default=-1) + 1 + point.window, "more than the window in flight was kept"
    completed = {i - 6 for i in acked if i > 6}
    assert not completed & queued(state), "a completed QoS 2 message is back"

    if point.close_after:
        assert len(acked) == k == point.close_after, "close commits everything before its checkpoint"

    # The recovered spool takes commits, and a second kill on top of the first recovers the same way.
    again = dataclasses.replace(point, first=k, nth=point.nth if point.close_after else point.nth + 3)
    acked2, said2 = crash(tmp_path, again)
    state2, k2 = recovered(tmp_path, point.max_submissions)
    assert all(i < k2 for i in {**acked, **acked2}), f"acknowledged submissions lost ({said2})"
    assert state2.head.seq >= state.head.seq


def test_a_spool_recovered_from_a_kill_continues_under_a_new_writer(tmp_path):
    crash(tmp_path, KillPoint("pwrite", ".seg", 7, "part", 0.5))
    state, k = recovered(tmp_path, 10**9)
    with Spool.open(tmp_path) as spool, SpoolWriter(spool) as writer:
        writer.submit(submission(k), 1).future.result(timeout=30)
    after, k2 = recovered(tmp_path, 10**9)
    assert k2 == k + 1 and after.head.seq == state.head.seq + len(submission(k))


def random_point(seed):
    """A kill point drawn from `seed`: which call, on which file, before/after/half way, how far in, what sizes."""
    rng = random.Random(seed)
    call, target = rng.choice([("fdatasync", ".seg"), ("fdatasync", ".seg"), ("pwrite", ".seg"),
                               ("fdatasync", ".seg.new"), ("fsync", ".ckpt.new"), ("fsync", "/")])
    when = "part" if call == "pwrite" else rng.choice(["before", "after"])
    return KillPoint(call, target, rng.randrange(1, 12 if target != ".seg" else 60), when, rng.random(),
                     segment_bytes=rng.choice([1024, 8192, 1 << 20]), checkpoint_bytes=rng.choice([2048, 16384]),
                     keep_ops=rng.choice([100, 100_000]), window=rng.choice([1, 4, 64]))


@pytest.mark.parametrize("seed", range(8))
def test_kill_9_at_random_points_keeps_every_acknowledged_op_and_a_prefix_only(tmp_path, seed):
    point = random_point(seed)
    acked, said = crash(tmp_path, point)
    state, k = recovered(tmp_path, point.max_submissions)
    assert all(i < k for i in acked), f"seed {seed}, {point}: acknowledged submissions lost ({said})"
    assert not {i - 6 for i in acked if i > 6} & queued(state)


@pytest.mark.parametrize("seed", range(4))
def test_a_power_loss_that_keeps_only_part_of_the_unsynced_commit_loses_only_it(tmp_path, seed):
    """A kill between write and fdatasync leaves the whole write in the page cache; a power loss instead keeps
    some of its pages. Here the unsynced commit keeps a prefix (cut at a page boundary or not), the rest gone or
    read back as zeros; recovery cuts it and keeps every acknowledged submission."""
    rng = random.Random(seed)
    acked, _ = crash(tmp_path, KillPoint("fdatasync", ".seg", rng.randrange(3, 30), segment_bytes=1 << 20))
    last = sorted(tmp_path.glob("*" + r.SEGMENT_SUFFIX))[-1]
    data = last.read_bytes()
    pos = start = r.HEADER_BYTES
    commits = []  # (start, end, fields)
    while pos < len(data):
        payload, end = r.next_record(data, pos)
        if payload[0] == r.COMMIT:
            commits.append((start, end, r.parse_commit(data, pos)))
            start = end
        pos = end
    (unsynced, end, _), (_, _, before) = commits[-1], commits[-2]  # the last: in the write whose fdatasync never ran
    assert end == len(data) and len(commits) >= 2
    kept = unsynced + rng.randrange(end - unsynced)
    if rng.random() < 0.5:
        kept = max(unsynced, kept // 4096 * 4096)  # whole pages
    last.write_bytes(data[:kept] + (bytes(end - kept) if rng.random() < 0.5 else b""))
    state, k = recovered(tmp_path, KillPoint.max_submissions)
    assert all(i < k for i in acked)
    assert state.head.seq == before.last_seq and last.stat().st_size == unsynced

"""A catch-up's ops that the op log would drop anyway are not written to it (SpoolWriter.submit_entries'
`unlogged_through`, writer.py's rules).

What must hold, on real spool files: the state is the same as applying every op with its log row; the log holds
exactly the ops after the base, the base is the chain point of the last unlogged op, and the file passes every
check `Spool.open` makes (the chain walked from the base to the head); the standby's older log rows go; a
catch-up cut short leaves a shorter log, still sound, that later ops continue; a process killed mid-catch-up
leaves a spool that opens clean at a committed head.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
import time

from pairmq.appliance.spool import ops as o
from pairmq.appliance.spool.chain import GENESIS, chain
from pairmq.appliance.spool.codec import encode_op
from pairmq.appliance.spool.store import FILE_NAME, Spool
from pairmq.appliance.spool.writer import SpoolWriter, WriterLimits
from tests.unit.test_mate_link_service import state_of, stop, until, write
from tests.unit.test_spool_image import image_group
from tests.unit.test_spool_store import body, load

KEEP_OPS = 1_000
# Truncation never runs here: whatever the log holds beyond keep_ops was written by the commits themselves.
LIMITS = WriterLimits(keep_ops=KEEP_OPS, truncate_chunk_ops=10_000_000, max_pending_ops=200_000)
BATCH_OPS = 500


def catchup_entries(messages: int, payload: bytes = b"m" * 300):
    ops = [o.SessionOpened("sub", 4, 0xFFFFFFFF, 1), o.Subscribed("sub", "t", 1)]
    for m in range(1, messages + 1):
        ops += [body(m, payload=payload), o.MessageQueued("sub", m, 1, False)]
    return chain(GENESIS, 1, [encode_op(op) for op in ops])


def apply(directory, entries, *, target: int | None, bulk: bool = True, limits: WriterLimits = LIMITS):
    """Submit `entries` in BATCH_OPS batches as the standby does in a catch-up towards `target` (None: no op left
    out of the log)."""
    unlogged = 0 if target is None else max(0, target - limits.keep_ops)
    with Spool.open(directory) as spool, SpoolWriter(spool, limits) as writer:
        subs = [writer.submit_entries(entries[at:at + BATCH_OPS], chained=True, bulk=bulk, unlogged_through=unlogged)
                for at in range(0, len(entries), BATCH_OPS)]
        for sub in subs:
            sub.future.result(timeout=60)


def log_rows(directory) -> tuple[int, int | None, int | None]:
    conn = sqlite3.connect(directory / FILE_NAME)
    try:
        return conn.execute("SELECT count(*), min(seq), max(seq) FROM oplog").fetchone()
    finally:
        conn.close()


def test_a_catchup_logs_only_its_last_keep_ops_and_ends_in_the_same_state(tmp_path):
    entries = catchup_entries(3_000)
    target = entries[-1].seq
    apply(tmp_path / "logged", entries, target=None)
    apply(tmp_path / "unlogged", entries, target=target)

    assert load(tmp_path / "unlogged") == load(tmp_path / "logged")  # Spool.open walks the chain from the base
    assert log_rows(tmp_path / "logged")[0] == len(entries)
    assert log_rows(tmp_path / "unlogged") == (KEEP_OPS, target - KEEP_OPS + 1, target)
    with Spool.open(tmp_path / "unlogged") as spool:
        assert spool.head == entries[-1].point
        assert spool.base == entries[target - KEEP_OPS - 1].point  # the chain point of the last op left out
        assert spool.read_entries(spool.base.seq, 10) == entries[target - KEEP_OPS:target - KEEP_OPS + 10]
        assert spool.log_point(target - KEEP_OPS - 1) is None  # behind the base: a joiner there gets a snapshot


def test_the_standby_older_log_goes_and_later_ops_continue_the_chain(tmp_path):
    entries = catchup_entries(3_000)
    first, rest = entries[:1_500], entries[1_500:]
    apply(tmp_path / "s", first, target=None)  # the standby's own history, fully logged
    assert log_rows(tmp_path / "s")[0] == 1_500
    apply(tmp_path / "s", rest, target=entries[-1].seq)  # then it catches up
    assert log_rows(tmp_path / "s")[1] == entries[-1].seq - KEEP_OPS + 1
    live = chain(entries[-1].point, 2, [encode_op(o.MessageAcked("sub", 1))])
    apply(tmp_path / "s", live, target=None, bulk=False)  # in sync: every op logged again
    with Spool.open(tmp_path / "s") as spool:
        assert spool.head == live[-1].point
        assert spool.read_entries(spool.head.seq - 1, 5) == live


def test_a_catchup_cut_short_leaves_a_shorter_sound_log(tmp_path):
    entries = catchup_entries(3_000)
    target = entries[-1].seq
    cut = target - KEEP_OPS // 2  # the link broke with 500 ops to go: 500 logged
    apply(tmp_path / "s", entries[:cut], target=target)
    assert log_rows(tmp_path / "s") == (cut - (target - KEEP_OPS), target - KEEP_OPS + 1, cut)
    apply(tmp_path / "s", entries[cut:], target=None, bulk=False)  # the next link catches up op by op
    apply(tmp_path / "ref", entries, target=None)
    assert load(tmp_path / "s") == load(tmp_path / "ref")


def test_a_process_killed_mid_catchup_leaves_a_spool_that_opens_clean(tmp_path):
    directory = tmp_path / "s"
    script = f"""
import sys
sys.path.insert(0, {os.getcwd()!r})
from tests.unit.test_spool_unlogged_catchup import apply, catchup_entries
entries = catchup_entries(60_000, payload=b"m" * 1000)
print("go", flush=True)
apply({str(directory)!r}, entries, target=entries[-1].seq)
print("done", flush=True)
"""
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "go"
        deadline = time.monotonic() + 60
        while head_seq(directory) < 20_000 and time.monotonic() < deadline:
            time.sleep(0.01)  # until commits that left their ops out of the log are in
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    if proc.returncode != -signal.SIGKILL:
        raise AssertionError(f"the catch-up finished (exit {proc.returncode}) before it could be killed: "
                             "make it longer")
    with Spool.open(directory) as spool:  # every check: pages, schema, meta, the chain from the base
        head, base = spool.head, spool.base
        state = spool.load_state()
    assert 20_000 <= head.seq < 120_002 and 0 < base.seq <= head.seq, (head, base)
    assert head.seq % BATCH_OPS == 0  # whole batches committed, nothing of a batch in flight
    assert len(state.messages) == (head.seq - 2) // 2


def head_seq(directory) -> int:
    if not (directory / FILE_NAME).exists():
        return 0
    try:
        conn = sqlite3.connect(f"file:{directory / FILE_NAME}?mode=ro", uri=True)
        try:
            return conn.execute("SELECT head_seq FROM meta").fetchone()[0]
        finally:
            conn.close()
    except sqlite3.Error:  # being created
        return 0


def test_a_standby_catching_up_over_the_link_logs_only_its_last_keep_ops(tmp_path):
    """The wiring (mate_link/service.py): a real link, the active's log reaching back to op 0, a standby whose
    writer keeps KEEP_OPS ops: its catch-up leaves the earlier ops out of its log and ends equal to the active."""
    async def run():
        active, standby, ap, sp = await image_group(tmp_path)
        sp.writer.close()
        sp.writer = SpoolWriter(sp.spool, LIMITS)
        await write(ap, [[o.SessionOpened("sub", 4, 0xFFFFFFFF, 1), o.Subscribed("sub", "t", 1)]])
        for m in range(1, 3_001, 100):
            await write(ap, [[op for i in range(m, m + 100)
                              for op in (body(i, payload=b"m" * 300), o.MessageQueued("sub", i, 1, False))]])
        target = ap.writer.durable.seq
        await standby.start()
        await until("the catch-up", lambda: active.caught_up_now(), 60)
        await stop(standby)
        assert state_of(sp) == state_of(ap)
        assert sp.spool.log_base().seq == target - KEEP_OPS
        assert sp.spool.read_entries(target - KEEP_OPS, 1)[0].seq == target - KEEP_OPS + 1
        await stop(active, ap, sp)
        assert log_rows(tmp_path / "standby") == (KEEP_OPS, target - KEEP_OPS + 1, target)

    asyncio.run(asyncio.wait_for(run(), 120))

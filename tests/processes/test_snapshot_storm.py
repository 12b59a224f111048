"""A storm of full-snapshot installs must not crash a standby (docs/reliability.md, "Findings"): a link that
ends while a snapshot batch runs in a worker thread must not abandon the snapshot builder -- closing its
file (once its SQLite connection: a SIGSEGV in libsqlite3) -- under that running batch.

- The storm itself (tests/harness/snapshot_storm.py) in its own process, so that a crash is an exit status and a
  faulthandler stack here, not a dead pytest.
- The pieces: the builder refuses clearly once abandoned and never closes under a batch; the standby's
  apply worker ends the link (and redials) when applying fails on its side; a node's native crash prints
  every thread's stack to its log.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading

import pytest

from pairmq.appliance.roles import Role
from pairmq.appliance.spool import ops as o
from pairmq.appliance.spool.codec import encode_op
from pairmq.appliance.spool.install import SnapshotBuilder
from tests.harness.group import LOOPBACK, REPO, active_group
from tests.unit.test_mate_link_service import Port, SECRET, GROUP, in_a_loop, stop, until, write
from tests.unit.test_spool_store import EVERY_OP, body

from pairmq.mate_link.service import ActiveReplication, StandbyReplication

INSTALLS = 20  # and as many cuts inside a snapshot: more than a full-disk active causes in a burst


@pytest.mark.processes
@pytest.mark.parametrize("seed", [1, 2])
def test_a_standby_survives_a_storm_of_snapshot_installs_and_ends_consistent(tmp_path, seed):
    proc = subprocess.run([sys.executable, "-m", "tests.harness.snapshot_storm", str(tmp_path), str(INSTALLS), str(seed)],
                          cwd=REPO, capture_output=True, text=True, timeout=400)
    errors = "\n".join(line for line in proc.stderr.splitlines() if "storm: cut" not in line)[-6000:]
    assert proc.returncode == 0, f"the storm's process ended with {proc.returncode} (-11: SIGSEGV):\n{errors}"
    report = json.loads(proc.stdout.splitlines()[-1])
    assert report["installs_in_storm"] >= INSTALLS and report["cuts_mid_snapshot"] >= INSTALLS, report
    assert report["equal"], f"the standby's state differs from the active's after the storm: {report}"
    assert report["equal_after_reopen"], f"the standby's spool, reopened and verified, differs: {report}"
    assert report["errors"] == [], f"the standby logged errors while applying: {report['errors'][:5]}"
    assert report["stale_sessions"] == [] and report["bad_ops"] == 0, report


def _snapshot_batch(n: int) -> list[bytes]:
    ops = [o.SessionOpened("fleet", 5, 3600, 1)]
    for i in range(1, n + 1):
        ops += [o.MessageStored(i, "t", os.urandom(500), 1, False, b"", 0, "pub", i), o.MessageQueued("fleet", i, 1, False)]
    return [encode_op(op) for op in ops]


def test_abandoning_a_snapshot_waits_for_a_running_batch_and_a_later_batch_is_refused_clearly(tmp_path):
    """The builder's own guard (the mate link never abandons under a batch; nothing else may either)."""
    bodies = _snapshot_batch(4_000)
    outcomes = []
    for attempt in range(10):
        builder = SnapshotBuilder(tmp_path / f"incoming-{attempt}")

        def add():
            try:
                builder.add(bodies)
                outcomes.append("added")
            except RuntimeError as exc:
                outcomes.append(str(exc))

        t = threading.Thread(target=add)
        t.start()
        builder.abandon()  # from another thread, while the batch may be running: must not crash, must wait
        t.join(30)
        assert not t.is_alive()
        assert not (tmp_path / f"incoming-{attempt}").exists()
    assert all(x == "added" or "was abandoned" in x for x in outcomes), outcomes
    with pytest.raises(RuntimeError, match="abandoned"):
        builder.add(bodies[:1])


class _FailsOneSwap(Port):
    """A standby whose first swap fails on its side (say its disk is full), before touching its spool."""

    def __init__(self, directory) -> None:
        super().__init__(directory)
        self.failed = 0

    def replace_spool(self, builder) -> None:
        if not self.failed:
            self.failed += 1
            raise OSError(28, "No space left on device (test)")
        super().replace_spool(builder)


@in_a_loop
async def test_a_standby_that_fails_to_apply_ends_the_link_and_catches_up_on_the_next(tmp_path):
    """Before: the apply worker died with the error and the link stayed up, applying and acknowledging
    nothing, so the active's mate never caught up."""
    host = LOOPBACK[Role.PRIMARY]
    ap, sp = Port(tmp_path / "active"), _FailsOneSwap(tmp_path / "standby")
    active = ActiveReplication(secret=SECRET, group=GROUP, me=Role.PRIMARY, spool=ap, epoch=lambda: 4,
                               may_serve=lambda: True)
    await active.start(host, 0)
    standby = StandbyReplication(secret=SECRET, group=GROUP, me=Role.BACKUP, spool=sp,
                                 active_address=lambda: (host, active.bound_port), incarnation=1,
                                 highest_epoch=lambda: 3, incoming_dir=tmp_path / "standby.incoming")
    await write(ap, EVERY_OP)
    await write(sp, [[o.SessionOpened("stale", 5, 60, 1)]], epoch=3)  # diverged: a snapshot
    await standby.start()
    await until("a second link that installs the snapshot",
                lambda: sp.failed == 1 and sp.replaced == 1 and active.caught_up_now()
                and active.acked_seq == ap.writer.durable.seq, timeout_s=20)
    assert standby.links_made >= 2 and "stale" not in sp.spool.load_state().sessions
    await stop(standby, active, ap, sp)


@pytest.mark.processes
def test_a_nodes_native_crash_prints_every_threads_stack_to_its_log(tmp_path):
    """What an operator needs after a SIGSEGV: which thread was where (faulthandler, cli/run_node.py)."""
    with active_group(tmp_path / "group") as g:
        log_path = g.dir / "backup.log"
        g.signal(Role.BACKUP, signal.SIGSEGV)
        rc = g.procs.pop(Role.BACKUP).wait(10)
        text = log_path.read_text(errors="replace")
    assert rc == -signal.SIGSEGV, f"the node ended with {rc}, not by its SIGSEGV"
    assert "Fatal Python error: Segmentation fault" in text, text[-2000:]
    crash = text[text.index("Fatal Python error"):]
    threads = crash.count("Thread 0x") + crash.count("Current thread 0x")
    assert threads >= 3, f"every thread's stack expected (event loop, heartbeats, spool writer...):\n{crash}"
    assert "appliance/" in crash, f"no frame of the node's own code in the stacks:\n{crash}"

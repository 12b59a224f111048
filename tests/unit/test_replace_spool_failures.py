"""A full resync whose swap fails never leaves the node with a closed spool (LocalSpool.replace_spool).

The standby's LocalSpool closes its spool, renames the received one over it and opens that. A failure in
between (the rename, the fsync, the open) must not leave it holding a closed spool and writer (every op
refused, the next JOIN unable to read the head):
- the swap fails before its rename: the old spool is open again, whole, and takes ops; the error still
  reaches the mate link (which closes the link and resyncs from there);
- the swapped-in file cannot be opened: it tells the node (`on_lost`, which stops it with
  that sentence) and raises; it never serves on without a spool.
These run on real spools and a real SnapshotBuilder; the failures are real ones of the files.
"""

import pytest

from pairmq.appliance.spool.local import LocalSpool
from pairmq.appliance.spool import ops as o
from pairmq.appliance.spool.codec import encode_op
from pairmq.appliance.spool.records import CHECKPOINT_SUFFIX
from pairmq.appliance.spool.store import SpoolCorruption
from pairmq.appliance.spool.install import SnapshotBuilder
from pairmq.appliance.spool.snapshot import snapshot_ops
from tests.unit.test_spool_store import EVERY_OP, load, write


def _finished_builder(tmp_path):
    """A full resync of the active's EVERY_OP spool, received and checked, not yet swapped in."""
    write(tmp_path / "active", EVERY_OP, epoch=4)
    original = load(tmp_path / "active")
    builder = SnapshotBuilder(tmp_path / "standby.incoming")
    builder.add([encode_op(op) for op in snapshot_ops(original)])
    builder.finish(original.head)
    return builder


def received(builder):
    """The finished checkpoint waiting in the builder's incoming directory."""
    (path,) = builder.incoming_dir.glob("*" + CHECKPOINT_SUFFIX)
    return path


@pytest.fixture
def standby(tmp_path):
    """A standby's spool of its own (one session, "stale"), the mate link's taps set."""
    write(tmp_path / "standby", [[o.SessionOpened("stale", 5, 60, 1)]], epoch=2)
    lost: list[str] = []
    service = LocalSpool(tmp_path / "standby", on_lost=lost.append)
    taps = (lambda *a: None, lambda *a: None)
    service.tap(*taps)
    yield service, taps, lost
    service.spool.close()


def test_a_swap_that_fails_before_its_rename_reopens_the_old_spool_which_takes_ops(tmp_path, standby):
    service, taps, lost = standby
    builder = _finished_builder(tmp_path)
    live_files = sorted(p.name for p in (tmp_path / "standby").iterdir())
    received(builder).unlink()  # the received file is gone: the swap's first rename fails

    with pytest.raises(FileNotFoundError):
        service.replace_spool(builder)

    assert lost == [], "the old spool opened again: nothing is lost, the node goes on"
    assert sorted(p.name for p in (tmp_path / "standby").iterdir()) == live_files, "the old spool's files stay"
    assert (service.writer.on_commit, service.writer.on_rollback) == taps, "the mate link's taps moved too"
    service.writer.submit([o.SessionOpened("after", 5, 60, 1)], 2).future.result(timeout=10)
    service.spool.close()
    assert load(tmp_path / "standby").sessions.keys() == {"stale", "after"}


def test_a_swapped_in_spool_that_cannot_be_opened_stops_the_node_with_a_sentence(tmp_path, standby):
    service, _, lost = standby
    builder = _finished_builder(tmp_path)
    received(builder).write_bytes(b"not a checkpoint, as a failing disk may leave it" * 100)

    with pytest.raises(SpoolCorruption):
        service.replace_spool(builder)

    assert len(lost) == 1 and f"the spool in {tmp_path / 'standby'} could not be opened again" in lost[0], lost

"""A standby's full resync: a new spool built from a snapshot's op bodies, swapped in whole.

Rules:
- The new spool is built beside the live one (`<spool dir>.incoming`), batch by batch, each batch
  in its own transaction; the live spool is untouched until `swap_into`, so a link that breaks
  mid-snapshot leaves the standby with its old state (and it resyncs again).
- Every body is decoded and checked (codec.py, state.check_op) before it is applied: a malformed
  snapshot is the peer's fault (`OpCodecError`/ValueError) and nothing of the batch is kept.
- Nothing of the new file counts until `swap_into`, which fsyncs it before the rename; so while it
  is built it needs neither a WAL nor an fsync per batch (journal in memory, synchronous off: a
  batch still rolls back whole), and `finish` turns WAL mode back on, as every spool has it.
- `finish(head)` records `head` as both the head and the base of the new spool's log (the log
  holds no ops yet: the next op the standby receives is head + 1) and closes the new file.
- `swap_into(spool_dir)` needs the live spool closed; it replaces the file atomically
  (os.replace, then an fsync of the directory) and removes the incoming directory.
- The builder's connection is used under its lock: `add` and `finish` run in worker threads and
  `abandon` may come from another thread; closing the connection under a running batch crashes
  the process in libsqlite3. The mate link waits for the batch's
  thread before it abandons (mate_link/service.py); the lock makes any other caller wait too, and a
  batch after `abandon` gets a clear error instead of a closed connection.
"""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Iterable
from pathlib import Path

from .chain import ChainPoint
from .codec import decode_op
from .sql import SqlApplier
from .snapshot import snapshot_seq
from .state import DEFAULT_MAX_MESSAGE_IDS, check_op
from .store import FILE_NAME, Spool, _fsync_dir, connect


class SnapshotBuilder:
    def __init__(self, incoming_dir: Path, max_message_ids: int = DEFAULT_MAX_MESSAGE_IDS) -> None:
        self.incoming_dir = Path(incoming_dir)
        shutil.rmtree(self.incoming_dir, ignore_errors=True)  # a half-built earlier attempt
        Spool.open(self.incoming_dir).close()  # lays out an empty, verified spool
        self._conn = connect(self.incoming_dir / FILE_NAME)
        self._conn.execute("PRAGMA journal_mode=MEMORY")
        self._conn.execute("PRAGMA synchronous=OFF")
        self._applier = SqlApplier(self._conn, max_message_ids)
        self.applied = 0
        self.finished: ChainPoint | None = None
        self._lock = threading.Lock()  # see the rules: one thread at a time on the connection
        self._abandoned = False

    def add(self, bodies: Iterable[bytes]) -> None:
        bodies = list(bodies)
        ops = [decode_op(b) for b in bodies]
        for op in ops:
            check_op(op)
        with self._lock:
            self._usable("add a batch to")
            self._add(ops, bodies)

    def _usable(self, what: str) -> None:
        if self._abandoned:
            raise RuntimeError(f"cannot {what} the snapshot in {self.incoming_dir}: it was abandoned")

    def _add(self, ops: list, bodies: list[bytes]) -> None:
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            for op, body in zip(ops, bodies):
                self._applier.apply(snapshot_seq(self.applied), op, body)
                self.applied += 1
            self._applier.write_fresh_bodies()
            self._conn.execute("COMMIT")
        except BaseException:
            self._conn.execute("ROLLBACK")
            self._applier.reload()
            raise

    def finish(self, head: ChainPoint) -> None:
        with self._lock:
            self._usable("finish")
            self._finish(head)

    def _finish(self, head: ChainPoint) -> None:
        self._conn.execute("BEGIN IMMEDIATE")
        self._conn.execute("UPDATE meta SET head_epoch = ?, head_seq = ?, head_checksum = ?, base_epoch = ?, "
                           "base_seq = ?, base_checksum = ?, stored_bytes = ?",
                           (head.epoch, head.seq, head.checksum, head.epoch, head.seq, head.checksum,
                            self._applier.stored_bytes))
        self._conn.execute("COMMIT")
        (mode,), = self._conn.execute("PRAGMA journal_mode=WAL")
        assert mode == "wal", mode
        self._conn.close()
        self.finished = head

    def abandon(self) -> None:
        with self._lock:  # after a batch still running in another thread, never under it
            self._abandoned = True
            self._conn.close()
        shutil.rmtree(self.incoming_dir, ignore_errors=True)

    def swap_into(self, spool_dir: Path) -> None:
        """Replace the (closed) spool in `spool_dir` with the finished one."""
        assert self.finished is not None, "swap_into before finish"
        fd = os.open(self.incoming_dir / FILE_NAME, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        install_file(self.incoming_dir, spool_dir)


def install_file(incoming_dir: Path, spool_dir: Path) -> None:
    """Rename `incoming_dir`'s (synced) spool file over the closed spool in `spool_dir`, then remove the rest."""
    spool_dir = Path(spool_dir)
    target = spool_dir / FILE_NAME
    for stale in (Path(f"{target}-wal"), Path(f"{target}-shm")):
        stale.unlink(missing_ok=True)  # the old file's; its connections are closed (checkpointed)
    os.replace(Path(incoming_dir) / FILE_NAME, target)
    _fsync_dir(spool_dir)
    shutil.rmtree(incoming_dir, ignore_errors=True)

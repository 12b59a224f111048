"""A standby's full resync from a snapshot's op bodies: a checkpoint built beside the live spool, swapped in whole.

Rules:
- The checkpoint is written beside the live spool (`<spool dir>.incoming`), batch by batch; the live
  spool is untouched until `swap_into`, so a link that breaks mid-snapshot leaves the standby with
  its old state (and it resyncs again).
- Every body is decoded and checked (codec.py, state.check_op) before it is written: a malformed
  snapshot is the peer's fault (`OpCodecError`/ValueError) and nothing of the batch is kept.
- `finish(head)` records `head` as the checkpoint's point (the log continues from there: the next op
  the standby receives is head + 1), syncs the file and renames it into place in the incoming dir.
- `swap_into(spool_dir)` needs the live spool closed; the directory then holds the checkpoint alone
  (store.install), and the incoming directory is removed.
- `add`, `finish` and `abandon` run under the builder's lock: they come from worker threads and the
  mate link's own, and a batch after `abandon` gets a clear error instead of a closed file.
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterable
from pathlib import Path

from . import records as r
from .chain import ChainPoint
from .checkpoint import CheckpointWriter
from .codec import decode_op
from .state import DEFAULT_MAX_MESSAGE_IDS, check_op
from .store import install
from ..private_files import private_dir


class SnapshotBuilder:
    def __init__(self, incoming_dir: Path, max_message_ids: int = DEFAULT_MAX_MESSAGE_IDS) -> None:
        del max_message_ids  # the standby's own bound applies when it loads the checkpoint
        self.incoming_dir = Path(incoming_dir)
        shutil.rmtree(self.incoming_dir, ignore_errors=True)  # a half-built earlier attempt
        private_dir(self.incoming_dir)
        self._writer = CheckpointWriter(self.incoming_dir / "snapshot.ckpt")
        self.applied = 0
        self.finished: ChainPoint | None = None
        self._path: Path | None = None
        self._lock = threading.Lock()
        self._abandoned = False

    def add(self, bodies: Iterable[bytes]) -> None:
        bodies = list(bodies)
        for b in bodies:
            check_op(decode_op(b))
        with self._lock:
            self._usable("add a batch to")
            self._writer.add(bodies)
            self.applied += len(bodies)

    def _usable(self, what: str) -> None:
        if self._abandoned:
            raise RuntimeError(f"cannot {what} the snapshot in {self.incoming_dir}: it was abandoned")

    def finish(self, head: ChainPoint) -> None:
        with self._lock:
            self._usable("finish")
            path = self._writer.finish(head)
            self._path = path.rename(path.with_name(r.checkpoint_name(head.seq)))
            self.finished = head

    def abandon(self) -> None:
        with self._lock:
            self._abandoned = True
            self._writer.abandon()
        shutil.rmtree(self.incoming_dir, ignore_errors=True)

    def swap_into(self, spool_dir: Path) -> None:
        """Replace the (closed) spool in `spool_dir` with the finished checkpoint."""
        assert self.finished is not None and self._path is not None, "swap_into before finish"
        install(self._path, spool_dir)
        shutil.rmtree(self.incoming_dir, ignore_errors=True)

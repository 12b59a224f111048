"""A gate in front of a spool's group commits, for tests of what waits on them (backpressure, held acks).

The writer's one disk write per group commit is `spool.log.append` (segments.py). While the gate is
closed, a commit that reaches it waits there, before anything is written; opening the gate lets it and
every later one through unchanged. The disk itself is not what such tests exercise: they check what the
broker, the listener or the writer does while commits are slow.
"""

from __future__ import annotations

import contextlib
import threading


class CommitGate:
    def __init__(self, spool) -> None:
        self._spool = spool
        self._log = spool.log
        self._append = spool.log.append
        self._open = threading.Event()
        self.reached = threading.Event()  # a commit waits at the gate
        self.waiting = 0

    def _gated(self, entries):
        self.waiting += 1
        self.reached.set()
        self._open.wait()
        self.waiting -= 1
        return self._append(entries)

    def close(self) -> None:
        self._open.clear()
        self._log.append = self._gated

    def open(self) -> None:
        """Let every commit through from now on (again: a no-op)."""
        self._log.__dict__.pop("append", None)  # the log's own method again
        self._open.set()


@contextlib.contextmanager
def commits_stalled(spool):
    """Commits of `spool` wait until the block ends (the gate is opened then, whatever happened inside)."""
    gate = CommitGate(spool)
    gate.close()
    try:
        yield gate
    finally:
        gate.open()

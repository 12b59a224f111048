"""This node's spool and its writer: made by the node's wiring and handed to both the broker and the
mate link, which reach them here and nowhere else.

Rules:
- A standby's full resync swaps the spool's files (`replace_spool`, the mate link calls it off the event
  loop): the spool is closed (its writer after what it holds), the builder's file swapped in, and
  whichever file the swap left, the old one if it failed before its rename, the new one after, is
  opened again with a new writer. A node must never keep a closed spool, whose writer refuses every op
  and whose head the next link's JOIN cannot read; the swap's error still reaches the mate link, which
  closes the link and redials from what is open now.
- The mate link's taps (`tap`) ride on every writer made here: without them, once this node is active
  again its standby would never hear of a new op and redundancy would stay down for the whole epoch.
- If the file cannot be opened again there is nothing trustworthy to serve from: `on_lost(sentence)`
  stops the node; a restart opens the file again and refuses it with the same sentence.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from .chain import ChainPoint, Commit
from .store import Spool
from .writer import SpoolWriter, WriterLimits

CommitTap = Callable[[Commit], None]
RollbackTap = Callable[[ChainPoint], None]


class LocalSpool:
    def __init__(self, directory: Path, limits: WriterLimits = WriterLimits(), *,
                 on_lost: Callable[[str], None] | None = None,
                 on_commit_seconds: Callable[[float], None] | None = None) -> None:
        self.directory = Path(directory)
        self._on_lost = on_lost
        self._on_commit_seconds = on_commit_seconds  # every writer's commit times (SpoolWriter.on_commit_seconds)
        self._taps: tuple[CommitTap | None, RollbackTap | None] = (None, None)
        self.spool = Spool.open(self.directory, max_message_ids=limits.max_message_ids)  # SpoolCorruption: refuse to serve from a corrupt spool
        self.writer = self._new_writer(limits)

    def _new_writer(self, limits: WriterLimits) -> SpoolWriter:
        on_commit, on_rollback = self._taps
        return SpoolWriter(self.spool, limits, on_commit=on_commit, on_rollback=on_rollback,
                           on_commit_seconds=self._on_commit_seconds)

    def tap(self, on_commit: CommitTap | None, on_rollback: RollbackTap | None) -> None:
        """The mate link's taps (SpoolWriter's rules), on this writer and every later one; None, None: off."""
        self._taps = (on_commit, on_rollback)
        self.writer.on_commit, self.writer.on_rollback = on_commit, on_rollback

    def replace_spool(self, builder) -> None:
        """A full resync: swap in the spool `builder` made (see the rules)."""
        limits = self.writer.limits
        self.spool.close(checkpoint=False)  # closes the writer too, after what it holds; replaced next
        try:
            builder.swap_into(self.directory)
        finally:
            self._reopen(limits)

    def _reopen(self, limits: WriterLimits) -> None:
        try:
            self.spool = Spool.open(self.directory, max_message_ids=limits.max_message_ids)
        except BaseException as exc:
            if self._on_lost is not None:
                self._on_lost(f"the spool in {self.directory} could not be opened again after a full resync: {exc}")
            raise
        self.writer = self._new_writer(limits)

    def close(self) -> None:
        self.spool.close()

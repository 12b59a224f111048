"""`pairmq spool migrate DIR`: an old-layout spool (SQLite) becomes a spool of the new layout, offline.

Rules:
- The node must be stopped: the spool's lock is taken (`SpoolLocked` otherwise).
- The old file is checked as the old store checked it (`PRAGMA quick_check`, every row by load.py's
  cross-checks); a damaged one is refused with the sentence that names it and nothing changes.
- Its state at its head becomes a checkpoint of the new layout (checkpoint.py) at the same chain
  point, so the mate link sees the same head: a standby that was in step stays in step. The old op
  log is not converted (the new log starts at the head); an incremental resync that would have
  needed ops before it becomes a full one.
- The old files (`spool.db`, `-wal`, `-shm`) are moved, never deleted, to `<DIR>.old-layout/`, after
  the checkpoint is synced; the spool then opens in the new layout.
"""

from __future__ import annotations

import dataclasses
import fcntl
import os
import sqlite3
from pathlib import Path

from .load import Corrupt, load_state
from ..checkpoint import write_checkpoint
from ..chain import ChainPoint
from ..errors import SpoolLocked
from ..segments import fsync_dir
from ..store import LOCK_NAME, OLD_LAYOUT
from ...errors import SpoolCorruption
from ...private_files import private_dir


@dataclasses.dataclass(frozen=True, slots=True)
class Migrated:
    head: ChainPoint
    sessions: int
    messages: int
    checkpoint: Path
    old_files: Path


def migrate(directory: Path | str) -> Migrated:
    directory = Path(directory)
    old = directory / OLD_LAYOUT
    if not old.exists():
        raise FileNotFoundError(f"{directory} holds no old-layout spool ({OLD_LAYOUT})")
    lock_fd = os.open(directory / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise SpoolLocked(f"spool {directory}: another process has it open (stop the node first)") from None
        state = _read(old)
        path = write_checkpoint(directory, state)
        aside = private_dir(directory.with_name(directory.name + ".old-layout"))
        for name in (OLD_LAYOUT, f"{OLD_LAYOUT}-wal", f"{OLD_LAYOUT}-shm"):
            if (directory / name).exists():
                os.replace(directory / name, aside / name)
        fsync_dir(directory)
        fsync_dir(aside)
    finally:
        os.close(lock_fd)
    return Migrated(state.head, len(state.sessions), len(state.messages), path, aside)


def _read(path: Path):
    def refuse(what: str) -> SpoolCorruption:
        return SpoolCorruption(f"spool {path}: {what}; not migrated")

    try:
        conn = sqlite3.connect(path, isolation_level=None)
        try:
            problems = [row[0] for row in conn.execute("PRAGMA quick_check(5)")]
            if problems != ["ok"]:
                raise refuse("damaged database pages (" + "; ".join(problems) + ")")
            conn.execute("BEGIN")
            return load_state(conn)
        finally:
            conn.close()
    except sqlite3.DatabaseError as exc:
        raise refuse(f"not a readable SQLite database ({exc})") from None
    except Corrupt as exc:
        raise refuse(str(exc)) from None

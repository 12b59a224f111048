"""The quorum core's stable store on disk: one small JSON file, replaced atomically, in space reserved up front.

Rules:
- A save is durable when it returns, and atomic: the new record is written
  to a spare file and fsynced, then the spare and `quorum.json` swap names
  in one `renameat2(RENAME_EXCHANGE)`, then the directory is fsynced. A
  crash leaves either the old record or the new one under `quorum.json`.
- A save allocates nothing, so a full disk cannot stop it (a vote that
  cannot be saved for ENOSPC would stop the node; docs/reliability.md).
  Both files are kept at `RECORD_BYTES` (the JSON padded with spaces,
  which JSON allows) and rewritten in place; the swap moves names,
  not data, so after it the spare is the previous record's file, already
  allocated. Space is taken once, at the first save of a boot (the core's
  start-up save), when the disk is not full or the node does not start.
- Where the swap is not supported (a file system without RENAME_EXCHANGE), a
  save falls back to write-temporary-then-replace, which allocates: that
  fallback is logged once.
- A torn or corrupt file is refused with a clear message rather than read as
  "epoch 0", which could let a node vote twice.
"""

from __future__ import annotations

import ctypes
import dataclasses
import errno
import json
import logging
import os
from pathlib import Path

from .errors import SpoolCorruption
from .private_files import private_dir
from .quorum.core import PersistentState
from .roles import Role

log = logging.getLogger("pairmq.stable_file")

RECORD_BYTES = 4096  # one page: the record is ~150 bytes; a page is what tmpfs and ext4 allocate anyway
_AT_FDCWD = -100
_RENAME_EXCHANGE = 2

try:
    _libc = ctypes.CDLL(None, use_errno=True)
    _renameat2 = _libc.renameat2
    _renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
except (OSError, AttributeError):  # not glibc >= 2.28
    _renameat2 = None


def _exchange(a: Path, b: Path) -> None:
    """Swap the names `a` and `b` atomically; OSError(EINVAL/ENOSYS) where the system cannot."""
    if _renameat2 is None:
        raise OSError(errno.ENOSYS, "renameat2 is not available")
    if _renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), str(a))


class FileStore:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.spare = path.with_suffix(".spare")
        self.saves = 0
        self.exchange = True  # False once the file system refused RENAME_EXCHANGE (the allocating fallback)
        self.last_error: str | None = None  # the latest failed save, until a save succeeds

    def load(self) -> PersistentState:
        try:
            raw = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return PersistentState()
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise SpoolCorruption(f"quorum state {self.path} is unreadable ({exc}); refusing to start "
                                  "rather than forget the epochs this node voted in") from None
        try:
            voted_for = raw.pop("voted_for")
            state = PersistentState(**raw, voted_for=Role(voted_for) if voted_for else None)
            assert all(isinstance(v, int) and v >= 0 for k, v in raw.items())
        except (TypeError, ValueError, KeyError, AssertionError):
            raise SpoolCorruption(f"quorum state {self.path} has unexpected contents; refusing to start") from None
        return state

    def save(self, state: PersistentState) -> None:
        raw = dataclasses.asdict(state)
        raw["voted_for"] = state.voted_for.value if state.voted_for else None
        record = json.dumps(raw).encode()
        assert len(record) < RECORD_BYTES, "the quorum record outgrew its reserved space"
        record = record.ljust(RECORD_BYTES - 1) + b"\n"
        try:
            self._save(record)
        except OSError as exc:
            self.last_error = f"{exc.strerror or exc} ({self.path})"
            raise
        self.last_error = None
        self.saves += 1

    def view(self) -> dict:
        return {"path": str(self.path), "saves": self.saves, "in_place": self.exchange, "last_error": self.last_error}

    def _save(self, record: bytes) -> None:
        private_dir(self.path.parent)
        if self.exchange:
            self._write(self.spare, record)
            if not self.path.exists():
                self._write(self.path, record)  # the first save ever: both files exist from now on
            try:
                _exchange(self.spare, self.path)
            except OSError as exc:
                if exc.errno not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                    raise
                self.exchange = False
                log.warning("quorum state %s: this file system cannot swap names (%s); saves now write a new file "
                            "each time, and a full disk will stop them", self.path, exc.strerror)
            else:
                self._sync_dir()
                self._reserve(self.spare)  # a quorum.json from before this scheme may be short: pad it while we can
                return
        self._write(self.path.with_suffix(".tmp"), record)
        os.replace(self.path.with_suffix(".tmp"), self.path)
        self._sync_dir()

    @staticmethod
    def _write(path: Path, record: bytes) -> None:
        """Overwrite in place (no O_TRUNC: the blocks stay allocated, so this needs no free space)."""
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            if os.pwrite(fd, record, 0) != len(record):
                raise OSError(errno.EIO, "short write", str(path))
            os.fsync(fd)
        finally:
            os.close(fd)

    def _reserve(self, path: Path) -> None:
        try:
            if path.stat().st_size < RECORD_BYTES:
                fd = os.open(path, os.O_WRONLY)
                try:
                    os.posix_fallocate(fd, 0, RECORD_BYTES)
                finally:
                    os.close(fd)
        except OSError as exc:  # the save itself succeeded; the next one may allocate
            log.warning("quorum state %s: could not reserve space for the next save: %s", path, exc)

    def _sync_dir(self) -> None:
        dir_fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

"""A spool's file image: how a full resync ships the spool's pages instead of re-encoding rows as ops.

Rules:
- The active's image (`SpoolImage`) is one read transaction's snapshot of its spool, whatever the writer
  commits meanwhile (the writer never waits for it: WAL). Two ways, the first when it can:
  - the live database file itself: inside the read transaction a PASSIVE checkpoint copies the WAL's
    frames into the file; if it copied every frame the WAL holds, the file is exactly our snapshot, and
    stays so while the transaction is held (SQLite never checkpoints a frame past an active reader's
    mark into the file), so its first page_count pages are the image, streamed straight from it. The
    transaction is held until the image has gone out (checkpoints meanwhile stop at our mark: the WAL
    grows instead). Nothing is copied first, so reading the file overlaps the stream instead of delaying
    its first byte.
  - else (a commit after our snapshot began, or an older reader holding frames back) a copy by SQLite's
    online backup API (`make_image`) in one step, into `image_dir(spool)`: memory (/dev/shm) when it
    has room, else beside the spool. A GB written beside the spool makes every fsync of the node's own
    (quorum state, spool commits) wait behind its writeback, stalling the active's loop for seconds. The
    GIL is free meanwhile (`Connection.serialize` would hold it for the whole copy, freezing the active's
    loop). The copy is streamed, then removed.
  Either is streamed (`SpoolImage.chunks`) with its SHA-256 taken on the way.
- The active checks the image's pages and its op log (`SpoolImage.check`: `PRAGMA quick_check`, then the
  log's chain from its base to the recorded head; on the copy opened immutable so nothing writes it, or
  on the live file within the image's own read transaction) while it streams them, and ends the image
  (IMAGE_END) only once both passed; a failure is `SpoolCorruption` (our spool is damaged) and no image
  is ended.
- The standby writes what arrives to `<incoming dir>/spool.db` (`ImageReceiver`), in order: a
  chunk at any offset but the next one is refused (`ImageRefused`). It syncs the file every
  SYNC_BYTES as it goes, so its dirty pages stay bounded (the same stall, on the standby). Nothing of it counts until
  `finish`, which checks, in order: the size announced, the digest announced, then the file's
  schema, journal mode and meta (`Spool.open(check_pages=False)`) and that its head is the point
  announced. Not its pages nor its log's chain again: the active checked both on this very image,
  and the SHA-256, checked first, proves these are those bytes (store.py, `check_pages`), which keeps
  the chain walk off the standby's critical path. Any failure is `ImageRefused` with what was wrong (the
  active's fault, or damage on the way: the link closes and the standby resyncs); the file is removed.
- A refused or abandoned image never touches the live spool: `swap_into` (as `SnapshotBuilder`'s)
  needs the live spool closed, fsyncs the file, renames it over `spool.db`, fsyncs the directory.
- The image carries the active's op log (what its writer keeps) and meta (head and base): after
  the swap the standby continues the chain from the head, and could itself serve an incremental
  resync from that log.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import sqlite3
from collections.abc import Iterator
from pathlib import Path

from .chain import ChainPoint
from .sql import read_meta
from .install import install_file
from .store import FILE_NAME, Spool, connect, log_problem, page_problems, vouch
from ..errors import SpoolCorruption
from ..private_files import private_dir

DIGEST_BYTES = 32
READ_BYTES = 4 << 20  # read from the image per worker-thread call on the active
SYNC_BYTES = 64 << 20  # the standby syncs what it received every this many bytes


class ImageRefused(ValueError):
    """A received spool image that must not be installed (the peer's fault or damage in transit)."""


@dataclasses.dataclass(frozen=True, slots=True)
class ImageInfo:
    path: Path
    point: ChainPoint  # the head the image holds
    size: int
    how: str  # "live" (the spool's own file) or "backup" (a copy by SQLite's backup API): see the rules


def image_dir(spool_path: Path) -> Path:
    """Where the active puts its copy: memory if /dev/shm has room for twice the spool, else beside it."""
    spool_path = Path(spool_path)
    need = 2 * sum(p.stat().st_size for p in (spool_path, Path(f"{spool_path}-wal")) if p.exists())
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK) and shutil.disk_usage(shm).free > need:
        return shm / f"pairmq-image-{os.getpid()}-{spool_path.parent.name}"
    return spool_path.parent.with_name(spool_path.parent.name + ".outgoing")


class SpoolImage:
    """The active's image of its spool (see the rules): `info`, `check()` and `chunks(digest)` until `close()`."""

    def __init__(self, spool_path: Path, out_dir: Path) -> None:
        spool_path = Path(spool_path)
        self._reader = _snapshot_in_file(spool_path)
        if self._reader is None:
            self.info = make_image(spool_path, out_dir)
            return
        try:
            (page_size,), = self._reader.execute("PRAGMA page_size")
            (pages,), = self._reader.execute("PRAGMA page_count")
            head, _, _ = read_meta(self._reader)
        except BaseException:
            self.close()
            raise
        self.info = ImageInfo(spool_path, head, pages * page_size, "live")

    def check(self) -> None:
        """`SpoolCorruption` if the image's pages or its op log are damaged."""
        if self._reader is None:
            check_pages(self.info.path)
        elif problem := _problem(self._reader):
            raise SpoolCorruption(f"spool {self.info.path}: {problem}; our spool cannot be sent")

    def chunks(self, digest) -> Iterator[bytes]:
        return read_chunks(self.info.path, digest, self.info.size)

    def close(self) -> None:
        """Let checkpoints past the image's snapshot again (the live way); the caller removes a copy's directory."""
        if self._reader is not None:
            self._reader.close()
            self._reader = None


def _snapshot_in_file(spool_path: Path) -> sqlite3.Connection | None:
    """A connection holding a read transaction whose snapshot the database file holds exactly (see the rules), or
    None if the file does not."""
    reader = connect(spool_path)
    try:
        reader.execute("BEGIN")
        reader.execute("SELECT head_seq FROM meta").fetchall()  # our snapshot starts here
        checkpointer = connect(spool_path)
        try:
            busy, in_log, copied = checkpointer.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        finally:
            checkpointer.close()
    except BaseException:
        reader.close()
        raise
    if busy or in_log != copied:  # frames past our snapshot, or held back by an older reader
        reader.close()
        return None
    return reader


def make_image(spool_path: Path, out_dir: Path) -> ImageInfo:
    """Copy the spool at `spool_path` to `out_dir/spool.db` in one consistent read: SQLite's backup API (see the
    rules)."""
    out_dir = Path(out_dir)
    shutil.rmtree(out_dir, ignore_errors=True)  # an earlier link's image
    private_dir(out_dir)  # a copy of every payload: as private as the spool
    out = out_dir / FILE_NAME
    source, target = connect(spool_path), connect(out)
    try:
        target.execute("PRAGMA synchronous=OFF")  # a scratch copy: the standby syncs what it installs
        source.backup(target)  # pages=-1: one step, one read transaction of the source
        head, _, _ = read_meta(target)
    finally:
        target.close()
        source.close()
    return ImageInfo(out, head, out.stat().st_size, "backup")


def check_pages(path: Path) -> None:
    """`SpoolCorruption` if the image at `path` has damaged pages or a broken op log (see the rules); it is only
    read."""
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True, check_same_thread=False)
        try:
            problem = _problem(conn)
        finally:
            conn.close()
    except sqlite3.DatabaseError as exc:
        problem = f"damaged database pages ({exc})"
    if problem:
        raise SpoolCorruption(f"spool image {path}: {problem}; our spool cannot be sent")


def _problem(conn: sqlite3.Connection) -> str | None:
    try:
        if problems := page_problems(conn):
            return f"damaged database pages ({'; '.join(problems)})"
        if why := log_problem(conn):
            return f"its op log is broken ({why})"
    except sqlite3.DatabaseError as exc:
        return f"damaged database pages ({exc})"
    return None


def read_chunks(path: Path, digest, size: int) -> Iterator[bytes]:
    """The first `size` bytes of the file at `path` in READ_BYTES pieces, fed to `digest` (a hashlib object) on the
    way; OSError if the file ends before them."""
    with open(path, "rb") as f:
        left = size
        while left > 0:
            chunk = f.read(min(READ_BYTES, left))
            if not chunk:
                raise OSError(f"{path} ended {left} bytes before the image's {size}")
            digest.update(chunk)
            left -= len(chunk)
            yield chunk


class ImageReceiver:
    """A standby's incoming spool image, written as it arrives, checked whole at `finish`."""

    def __init__(self, incoming_dir: Path) -> None:
        self.incoming_dir = Path(incoming_dir)
        shutil.rmtree(self.incoming_dir, ignore_errors=True)  # a half-received earlier attempt
        private_dir(self.incoming_dir)
        self.path = self.incoming_dir / FILE_NAME
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        self._digest = hashlib.sha256()
        self.received = 0
        self._synced = 0
        self.finished: ChainPoint | None = None

    def write(self, offset: int, chunks: list[bytes]) -> None:
        """Append `chunks`, which start at `offset` (the end of what we hold)."""
        if self._fd < 0:
            raise RuntimeError(f"the image in {self.incoming_dir} is closed")
        if offset != self.received:
            raise ImageRefused(f"an image chunk at byte {offset}, but {self.received} bytes arrived so far")
        for chunk in chunks:
            self._digest.update(chunk)
            view = memoryview(chunk)
            while view:
                view = view[os.write(self._fd, view):]
            self.received += len(chunk)
        if self.received - self._synced >= SYNC_BYTES:
            os.fdatasync(self._fd)
            self._synced = self.received

    def finish(self, point: ChainPoint, size: int, digest: bytes) -> None:
        """Check the whole image (see the rules); `ImageRefused` and the file removed if it fails."""
        try:
            self._check(point, size, digest)
        except BaseException:
            self.abandon()
            raise
        self.finished = point

    def _check(self, point: ChainPoint, size: int, digest: bytes) -> None:
        if self.received != size:
            raise ImageRefused(f"the image is {size} bytes, but {self.received} arrived (truncated or padded)")
        if self._digest.digest() != digest:
            raise ImageRefused("the image's SHA-256 does not match the one the active sent (damaged in transit)")
        os.fsync(self._fd)
        os.close(self._fd)
        self._fd = -1
        try:
            with Spool.open(self.incoming_dir, check_pages=False) as spool:
                head = spool.head
        except SpoolCorruption as exc:
            raise ImageRefused(f"the image is not a sound spool: {exc}") from None
        if head != point:
            raise ImageRefused(f"the image holds op {head.seq} (epoch {head.epoch}) as its head, but the active "
                               f"announced op {point.seq} (epoch {point.epoch})")
        vouch(self.path)  # checked whole here: opened as the live spool next, it is not checked page by page again

    def abandon(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        shutil.rmtree(self.incoming_dir, ignore_errors=True)

    def swap_into(self, spool_dir: Path) -> None:
        """Replace the (closed) spool in `spool_dir` with the checked image."""
        assert self.finished is not None, "swap_into before finish"
        install_file(self.incoming_dir, spool_dir)  # synced in finish

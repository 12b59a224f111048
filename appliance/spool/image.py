"""A full resync's image: a checkpoint of the active's state, streamed as bytes and installed whole.

Rules:
- The active's image (`SpoolImage`) is a checkpoint (checkpoint.py) and the log after it follows as a
  catch-up (mate_link/active.py): a full resync is a checkpoint plus the segments after it.
  - Its newest checkpoint when it has one, hard-linked into `image_dir(...)` beside the spool: nothing
    is encoded or written, and a checkpoint written meanwhile (which deletes the older one) cannot
    take the file away. The log keeps every op after its newest checkpoint; a newer checkpoint's
    compaction may drop some before the catch-up reads them, and then the link restarts its resync.
  - Else (no checkpoint yet, or a link that fails) one written for the standby from the state at its
    head (the copy taken under the spool's lock, the file written outside it, while commits go on),
    into memory (/dev/shm) when it has room, else beside the spool: a GB written beside the spool
    makes every fsync of the node's own wait behind its writeback, stalling the active's loop.
- The active reads the image back (`check`: every record's CRC, the counts at its end)
  while it streams it, and ends the image (IMAGE_END) only once that passed; a failure is
  `SpoolCorruption` (our disk damaged it) and no image is ended.
- The standby writes what arrives to `<incoming dir>/image.ckpt` (`ImageReceiver`), in order: a chunk
  at any offset but the next one is refused (`ImageRefused`). It syncs the file every SYNC_BYTES as it
  goes, so its dirty pages stay bounded. Nothing of it counts until `finish`, which checks, in order:
  the size announced, the SHA-256 announced, then the checkpoint's header and that its point is the
  one announced. Its records are checked again when the spool opens it. Any failure is
  `ImageRefused` with what was wrong; the file is removed.
- A refused or abandoned image never touches the live spool: `swap_into` (as `SnapshotBuilder`'s) needs
  the live spool closed, and leaves the directory holding the checkpoint alone (store.install): the
  standby's log continues from the image's point.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from . import checkpoint as ckpt
from . import records as r
from .chain import ChainPoint
from .store import Spool, install
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
    how: str  # "checkpoint": a checkpoint written for the standby (see the rules)


def image_dir(spool_dir: Path, need: int = 0, *, linked: bool = False) -> Path:
    """Where the active puts its image: beside the spool when it links its checkpoint there (`linked`), else
    memory if /dev/shm has room for twice `need` bytes, else beside the spool."""
    spool_dir = Path(spool_dir)
    shm = Path("/dev/shm")
    if not linked and shm.is_dir() and os.access(shm, os.W_OK) and shutil.disk_usage(shm).free > 2 * need:
        return shm / f"pairmq-image-{os.getpid()}-{spool_dir.name}"
    return spool_dir.with_name(spool_dir.name + ".outgoing")


class SpoolImage:
    """The active's image of its spool (see the rules): `info`, `check()` and `chunks(digest)` until `close()`."""

    def __init__(self, spool: Spool, out_dir: Path) -> None:
        out_dir = Path(out_dir)
        shutil.rmtree(out_dir, ignore_errors=True)  # an earlier link's image
        private_dir(out_dir)  # a copy of every payload: as private as the spool
        point = spool.checkpoint
        if point.seq:
            name = r.checkpoint_name(point.seq)
            try:
                os.link(spool.directory / name, out_dir / name)
                self.info = ImageInfo(out_dir / name, point, (out_dir / name).stat().st_size,
                                      "its newest checkpoint; the log after it follows")
                return
            except OSError:  # replaced meanwhile, or another filesystem: write one (see the rules)
                pass
        state = spool.load_state()
        path = ckpt.write_checkpoint(out_dir, state)
        self.info = ImageInfo(path, state.head, path.stat().st_size, "a checkpoint written for it")

    def check(self) -> None:
        """`SpoolCorruption` if the image does not read back whole."""
        for _ in ckpt.chunks(self.info.path):
            pass

    def chunks(self, digest) -> Iterator[bytes]:
        return read_chunks(self.info.path, digest, self.info.size)

    def close(self) -> None:
        """Nothing to let go of: the caller removes the image's directory."""


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
        self.path = self.incoming_dir / "image.ckpt"
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
            head = ckpt.read_point(self.path)
        except SpoolCorruption as exc:
            raise ImageRefused(f"the image is not a sound checkpoint: {exc}") from None
        if head != point:
            raise ImageRefused(f"the image holds op {head.seq} (epoch {head.epoch}) as its head, but the active "
                               f"announced op {point.seq} (epoch {point.epoch})")
        self.path = self.path.rename(self.path.with_name(r.checkpoint_name(point.seq)))

    def abandon(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        shutil.rmtree(self.incoming_dir, ignore_errors=True)

    def swap_into(self, spool_dir: Path) -> None:
        """Replace the (closed) spool in `spool_dir` with the checked image."""
        assert self.finished is not None, "swap_into before finish"
        install(self.path, spool_dir)
        shutil.rmtree(self.incoming_dir, ignore_errors=True)

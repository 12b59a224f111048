"""Checkpoints: the whole spool state at one point of the log, as a file of snapshot ops.

Rules:
- A checkpoint holds the state at a chain point as the ops that rebuild it from empty (snapshot.py),
  framed as records (records.py), after a header with the point and before an end record with the
  count and the SHA-256 of every byte before it. Recovery is the newest checkpoint, then the log's
  ops after its point.
- It appears atomically: written as `<name>.new`, synced, renamed, the directory synced. A `.new`
  left by a crash is removed at open; a checkpoint that does not read back whole (header, every
  record's CRC, the count, the digest) is damage, refused with its name.
- It is also what a full resync ships (image.py): a checkpoint written for the standby, streamed with
  its SHA-256; the standby installs it as its spool and continues the log from its point.
- Reading applies each op to a `StateModel` as it goes (no list of a million ops in memory).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

from . import records as r
from .chain import ChainPoint
from .codec import decode_op
from .errors import OpCodecError
from .segments import fsync_dir
from .snapshot import snapshot_items, snapshot_seq
from .state import StateModel, SpoolState, check_op
from ..errors import SpoolCorruption

WRITE_BYTES = 4 << 20


class CheckpointWriter:
    """A checkpoint written piece by piece (`add`), made whole by `finish`, or `abandon`ed."""

    def __init__(self, path: Path, point: ChainPoint | None = None) -> None:
        self.path = Path(path)
        self.tmp = self.path.with_name(self.path.name + ".new")
        self._fd = os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        self._digest = hashlib.sha256()
        self._buf = bytearray()
        self.ops = 0
        self._header_at_finish = point is None
        self._write(r.header(r.CHECKPOINT_MAGIC, point or ChainPoint(0, 0, bytes(16))))

    def _write(self, data: bytes) -> None:
        self._digest.update(data)
        self._buf += data
        if len(self._buf) >= WRITE_BYTES:
            self._flush()

    def _flush(self) -> None:
        with memoryview(self._buf) as whole:
            view = whole
            while view:
                view = view[os.write(self._fd, view):]
            del view
        self._buf.clear()

    def add(self, bodies) -> None:
        """Snapshot ops applied with `snapshot_seq(i)` (the mate link's SNAPSHOT batches)."""
        self.add_items((snapshot_seq(self.ops + i), body) for i, body in enumerate(bodies))

    def add_items(self, items) -> None:
        """(seq to apply with, op bytes) pairs (snapshot.snapshot_items)."""
        for seq, body in items:
            self._write(r.snapshot_op_record(seq, body))
            self.ops += 1

    def finish(self, point: ChainPoint | None = None) -> Path:
        """Write the end, sync, rename into place; the path. `point`: for a writer made without one."""
        if self._header_at_finish:
            assert point is not None, "a checkpoint made without its point needs one at finish"
            self._flush()
            os.pwrite(self._fd, r.header(r.CHECKPOINT_MAGIC, point), 0)
            self._digest = _digest_of(self._fd)  # the header changed: digest what is on disk
        self._buf += r.checkpoint_end_record(self.ops, self._digest.digest())
        self._flush()
        os.fsync(self._fd)
        os.close(self._fd)
        self._fd = -1
        os.replace(self.tmp, self.path)
        fsync_dir(self.path.parent)
        return self.path

    def abandon(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self.tmp.unlink(missing_ok=True)


def _digest_of(fd: int):
    digest = hashlib.sha256()
    at = 0
    while chunk := os.pread(fd, WRITE_BYTES, at):
        digest.update(chunk)
        at += len(chunk)
    return digest


def write_checkpoint(directory: Path, state: SpoolState) -> Path:
    """The checkpoint of `state` (at its head) in `directory`, whole and synced."""
    writer = CheckpointWriter(Path(directory) / r.checkpoint_name(state.head.seq), state.head)
    try:
        writer.add_items(snapshot_items(state))
        return writer.finish()
    except BaseException:
        writer.abandon()
        raise


def read_point(path: Path) -> ChainPoint:
    """The point a checkpoint's header holds (its contents unchecked); `SpoolCorruption` if it has none."""
    with open(path, "rb") as f:
        data = f.read(r.HEADER_BYTES)
    try:
        return r.parse_header(data, r.CHECKPOINT_MAGIC)
    except r.RecordError as exc:
        raise _damaged(path, exc.why) from None


def bodies(path: Path) -> Iterator[tuple[int, bytes]]:
    """(seq to apply with, op bytes) of the checkpoint at `path`, checked record by record and whole at the end."""
    with open(path, "rb") as f:
        data = f.read()
    try:
        r.parse_header(data, r.CHECKPOINT_MAGIC)
        pos, n = r.HEADER_BYTES, 0
        while True:
            payload, end = r.next_record(data, pos)
            if payload[0] == r.CHECKPOINT_END:
                ops, digest = r.parse_end(payload, pos)
                if ops != n:
                    raise r.RecordError(pos, f"the end counts {ops} ops, the file holds {n}")
                if hashlib.sha256(data[:pos]).digest() != digest:
                    raise r.RecordError(pos, "the SHA-256 at its end does not match its contents")
                if end != len(data):
                    raise r.RecordError(end, f"{len(data) - end} bytes after its end")
                return
            if payload[0] != r.SNAPSHOT_OP:
                raise r.RecordError(pos, f"a record of kind {payload[0]} in a checkpoint")
            yield r.parse_snapshot_op(payload, pos)
            n += 1
            pos = end
    except r.RecordError as exc:
        raise _damaged(path, str(exc)) from None  # its str names the offset


def load(path: Path, model: StateModel) -> ChainPoint:
    """Apply the checkpoint at `path` to the empty `model`; its point. `SpoolCorruption` if it is damaged."""
    point = read_point(path)
    for i, (seq, body) in enumerate(bodies(path)):
        try:
            op = decode_op(body)
            check_op(op)
        except (OpCodecError, ValueError) as exc:
            raise _damaged(path, f"op {i} of its snapshot is malformed ({exc})") from None
        model.apply(seq, op, len(body))
    model.head = point
    return point


def _damaged(path: Path, why: str) -> SpoolCorruption:
    return SpoolCorruption(f"checkpoint {path}: {why}; refusing to serve from a corrupt spool")

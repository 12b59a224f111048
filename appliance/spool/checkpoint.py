"""Checkpoints: the whole spool state at one point of the log, as a file of snapshot ops.

Rules:
- A checkpoint holds the state at a chain point as the ops that rebuild it from empty (snapshot.py),
  many to a framed record (records.py: S), after a header with the point and before an end record
  with the counts (E). Recovery is the newest checkpoint, then the log's ops after its point.
- It appears atomically: written as `<name>.new`, synced, renamed, the directory synced. A `.new`
  left by a crash is removed at open (store.py); a checkpoint that does not read back whole (header,
  every record's CRC, the counts, nothing after the end) is damage, refused with its name.
- Its ops are not checked again as they load (codec.py decodes them strictly all the same): they
  were checked when they were first written, and each record's CRC proves these are those bytes.
- It is also what a full resync ships (image.py): a checkpoint written for the standby, streamed with
  a SHA-256 the standby checks; the standby installs it as its spool and continues from its point.
- Reading goes record by record (memory stays bounded by a record, not the file).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path

from . import records as r
from .chain import ChainPoint
from .codec import decode_op
from .errors import OpCodecError
from .segments import fsync_dir
from .snapshot import snapshot_items, snapshot_seq
from .state import StateModel, SpoolState
from ..errors import SpoolCorruption

WRITE_BYTES = 4 << 20
_NO_POINT = ChainPoint(0, 0, bytes(16))


class CheckpointWriter:
    """A checkpoint written piece by piece (`add`/`add_items`), made whole by `finish`, or `abandon`ed."""

    def __init__(self, path: Path, point: ChainPoint | None = None) -> None:
        self.path = Path(path)
        self.tmp = self.path.with_name(self.path.name + ".new")
        self._fd = os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        self._buf = bytearray(r.header(r.CHECKPOINT_MAGIC, point or _NO_POINT))
        self._chunk = bytearray((r.SNAPSHOT_OP,))
        self.ops = 0
        self._chunks = 0
        self._header_at_finish = point is None

    def _end_chunk(self) -> None:
        if len(self._chunk) > 1:
            self._buf += r.frame(bytes(self._chunk))
            self._chunks += 1
            del self._chunk[1:]
        if len(self._buf) >= WRITE_BYTES:
            self._flush()

    def _flush(self) -> None:
        with memoryview(self._buf) as whole:
            view = whole
            while view:
                view = view[os.write(self._fd, view):]
            del view
        self._buf.clear()

    def add(self, bodies: Iterable[bytes]) -> None:
        """Snapshot ops applied with `snapshot_seq(i)` (the mate link's SNAPSHOT batches)."""
        self.add_items((snapshot_seq(self.ops + i), body) for i, body in enumerate(bodies))

    def add_items(self, items: Iterable[tuple[int, bytes]]) -> None:
        """(seq to apply with, op bytes) pairs (snapshot.snapshot_items)."""
        chunk, put = self._chunk, r.put_snapshot_op
        for seq, body in items:
            put(chunk, seq, body)
            self.ops += 1
            if len(chunk) >= r.CHUNK_BYTES:
                self._end_chunk()

    def finish(self, point: ChainPoint | None = None) -> Path:
        """Write the end, sync, rename into place; the path. `point`: for a writer made without one."""
        self._end_chunk()
        self._buf += r.checkpoint_end_record(self.ops, self._chunks)
        self._flush()
        if self._header_at_finish:
            assert point is not None, "a checkpoint made without its point needs one at finish"
            os.pwrite(self._fd, r.header(r.CHECKPOINT_MAGIC, point), 0)
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


def chunks(path: Path) -> Iterator[list[tuple[int, bytes]]]:
    """The checkpoint's ops, a record's worth at a time: (seq to apply with, op bytes); checked record by record
    and whole at the end (see the rules)."""
    with open(path, "rb") as f:
        try:
            r.parse_header(f.read(r.HEADER_BYTES), r.CHECKPOINT_MAGIC)
            pos, ops, records = r.HEADER_BYTES, 0, 0
            while True:
                head = f.read(r.FRAME_BYTES)
                length = int.from_bytes(head[:4], "big") if len(head) == r.FRAME_BYTES else 0
                data = head + f.read(min(length, r.MAX_PAYLOAD + 1))
                try:
                    payload, end = r.next_record(data, 0)
                except r.RecordError as exc:
                    raise r.RecordError(pos + exc.offset, exc.why) from None
                if payload[0] == r.CHECKPOINT_END:
                    want_ops, want_records = r.parse_end(payload, pos)
                    if (want_ops, want_records) != (ops, records):
                        raise r.RecordError(pos, f"the end counts {want_ops} ops in {want_records} records, the "
                                                 f"file holds {ops} in {records}")
                    if f.read(1):
                        raise r.RecordError(pos + end, "bytes after its end")
                    return
                if payload[0] != r.SNAPSHOT_OP:
                    raise r.RecordError(pos, f"a record of kind {payload[0]} in a checkpoint")
                items = r.parse_snapshot_ops(payload, pos)
                ops += len(items)
                records += 1
                pos += end
                yield items
        except r.RecordError as exc:
            raise _damaged(path, str(exc)) from None


def load(path: Path, model: StateModel) -> tuple[ChainPoint, int]:
    """Apply the checkpoint at `path` to the empty `model`; its point and how many ops it held. `SpoolCorruption`
    if it is damaged."""
    point = read_point(path)
    if path.name != r.checkpoint_name(point.seq):
        raise _damaged(path, f"its header holds op {point.seq}, its name says otherwise")
    apply = model.apply
    i = 0
    for items in chunks(path):
        for seq, body in items:
            try:
                op = decode_op(body)
            except OpCodecError as exc:
                raise _damaged(path, f"op {i} of its snapshot is malformed ({exc})") from None
            apply(seq, op, len(body))
            i += 1
    model.head = point
    return point, i


def _damaged(path: Path, why: str) -> SpoolCorruption:
    return SpoolCorruption(f"checkpoint {path}: {why}; refusing to serve from a corrupt spool")

"""The spool's files, byte by byte: segment and checkpoint headers and the framed records in them.

Rules:
- Every record is framed: u32 payload length, u32 CRC-32 of the payload, the payload. Big-endian.
  The payload's first byte says what it is:
    O  an op:         the op's bytes (codec.py); its seq is its place in its commit
    C  a commit:      u64 epoch, u64 seq of its last op, u32 ops, 16-byte chained checksum (chain.py);
                      it ends the commit whose op records come right before it
    S  a checkpoint's ops: for each, i64 the seq it is applied with (snapshot.py), u32 its length, its
       bytes; as many as fit in CHUNK_BYTES (one frame and one CRC for many ops)
    E  a checkpoint's end: u64 ops, u64 S records (so a checkpoint cut short between records is told)
- A commit's bytes (`Commit.data`: its op records, then its commit record) never depend on where they
  are written, so the active's segment, the mate link and the standby's segment hold the same bytes.
- A segment starts with SEGMENT_HEADER: magic, format, the chain point its first op follows, a CRC.
  Its name is the seq of that first op, 20 digits, then `.seg`. Then commits follow; a group commit
  is several of them in one write, durable once the fdatasync after it returns.
- A checkpoint starts with CHECKPOINT_HEADER: magic, format, the chain point it holds the state at, a
  CRC; then S records, the snapshot of that state; then one E record, and nothing after it. Its name is that point's seq,
  20 digits, then `.ckpt`.
- Parsing is strict: a length past the end, a CRC that does not match, an unknown kind or a payload of
  the wrong size is a `RecordError` with the offset. Whether that means a torn tail or damage is the
  segment log's decision (segments.py), not this module's.
- Pure: no I/O.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterable
from typing import Final, NamedTuple

from .chain import CHECKSUM_BYTES, ChainPoint, Commit, checksum, follows
from .errors import ChainError

FORMAT: Final = 2
SEGMENT_MAGIC: Final = b"PAIRMQSG"
CHECKPOINT_MAGIC: Final = b"PAIRMQCP"
SEGMENT_SUFFIX: Final = ".seg"
CHECKPOINT_SUFFIX: Final = ".ckpt"
MAX_PAYLOAD: Final = 64 << 20  # no record is larger: a bigger length is damage, not a record

OP: Final = 0x4F  # b"O"
COMMIT: Final = 0x43  # b"C"
SNAPSHOT_OP: Final = 0x53  # b"S"
CHECKPOINT_END: Final = 0x45  # b"E"

_FRAME: Final = struct.Struct(">II")
_HEADER: Final = struct.Struct(f">8sIQQ{CHECKSUM_BYTES}s")  # magic, format, point (epoch, seq, checksum)
_CRC: Final = struct.Struct(">I")
_OP_FRAME: Final = struct.Struct(">IIB")  # an op record's frame and kind byte: its payload's first byte
_COMMIT: Final = struct.Struct(f">BQQI{CHECKSUM_BYTES}s")
_END: Final = struct.Struct(">BQQ")
SNAPSHOT_ITEM: Final = struct.Struct(">qI")
CHUNK_BYTES: Final = 1 << 20
HEADER_BYTES: Final = _HEADER.size + _CRC.size
FRAME_BYTES: Final = _FRAME.size
OP_OVERHEAD: Final = _OP_FRAME.size  # bytes a record adds to an op's own
COMMIT_BYTES: Final = FRAME_BYTES + _COMMIT.size
_crc32: Final = zlib.crc32
_OP_CRC: Final = _crc32(bytes((OP,)))  # an op record's CRC starts from its kind byte's
_frame_from: Final = _FRAME.unpack_from
_op_frame_pack: Final = _OP_FRAME.pack
_commit_from: Final = _COMMIT.unpack_from


class RecordError(ValueError):
    """A record or header that does not parse; `offset` is where it starts in its file."""

    def __init__(self, offset: int, why: str) -> None:
        super().__init__(f"at byte {offset}: {why}")
        self.offset = offset
        self.why = why


def segment_name(first_seq: int) -> str:
    return f"{first_seq:020d}{SEGMENT_SUFFIX}"


def checkpoint_name(seq: int) -> str:
    return f"{seq:020d}{CHECKPOINT_SUFFIX}"


def header(magic: bytes, point: ChainPoint) -> bytes:
    head = _HEADER.pack(magic, FORMAT, point.epoch, point.seq, point.checksum)
    return head + _CRC.pack(_crc32(head))


def parse_header(data: bytes, magic: bytes) -> ChainPoint:
    """The point a segment or checkpoint header holds; `RecordError` if it is not one of this build's."""
    if len(data) < HEADER_BYTES:
        raise RecordError(0, f"a header of {len(data)} bytes ({HEADER_BYTES} expected)")
    head = data[:_HEADER.size]
    (crc,) = _CRC.unpack_from(data, _HEADER.size)
    got_magic, fmt, epoch, seq, checksum_ = _HEADER.unpack(head)
    if got_magic != magic:
        raise RecordError(0, f"not a PairMQ {'segment' if magic == SEGMENT_MAGIC else 'checkpoint'} "
                             f"(magic {got_magic!r})")
    if _crc32(head) != crc:
        raise RecordError(0, "the header's CRC does not match")
    if fmt != FORMAT:
        raise RecordError(0, f"format {fmt}, but this build reads format {FORMAT}")
    return ChainPoint(epoch, seq, checksum_)


def frame(payload: bytes) -> bytes:
    return _FRAME.pack(len(payload), _crc32(payload)) + payload


# Commits.

def make_commit(prev: ChainPoint, epoch: int, bodies: Iterable[bytes]) -> Commit:
    """The commit of `bodies` (encoded ops, at least one), written in `epoch` after `prev`.

    The writer's hot path, once per submission: one frame and one CRC per op, the parts joined once, one digest."""
    assert epoch >= prev.epoch, f"epoch {epoch} is older than the log's {prev.epoch}"
    parts: list[bytes] = []
    for body in bodies:
        parts.append(_op_frame_pack(len(body) + 1, _crc32(body, _OP_CRC), OP))
        parts.append(body)
    n = len(parts) // 2
    assert n, "a commit of no ops"
    last_seq = prev.seq + n
    records = b"".join(parts)
    chained = checksum(prev.checksum, epoch, last_seq, n, records)
    return Commit(epoch, last_seq, n, chained, records + frame(_COMMIT.pack(COMMIT, epoch, last_seq, n, chained)))


def parse_commit(data: bytes | memoryview, pos: int) -> Commit:
    """The fields of the commit record framed at `pos` (its `data` is left empty: the caller knows the span)."""
    if pos < 0 or pos + COMMIT_BYTES > len(data):
        raise RecordError(max(pos, 0), "a commit record cut off")
    length, crc = _frame_from(data, pos)
    start = pos + FRAME_BYTES
    if length != _COMMIT.size or data[start] != COMMIT:
        raise RecordError(pos, "not a commit record where a commit must end")
    if _crc32(data[start:start + length]) != crc:
        raise RecordError(pos, "a record whose CRC does not match")
    _, epoch, last_seq, ops, chained = _commit_from(data, start)
    return Commit(epoch, last_seq, ops, chained, b"")


def commit_from_bytes(data: bytes) -> Commit:
    """A commit received whole (the mate link's OPS): its fields from its last record; `RecordError` if none."""
    c = parse_commit(data, len(data) - COMMIT_BYTES)
    return c._replace(data=data)


def op_bodies(commit: Commit, offset: int = 0) -> list[bytes]:
    """The ops' bytes of `commit`, every record's frame and CRC checked and their number matched.

    `offset`: where the commit starts in its file, for the errors."""
    data = commit.data
    end = len(data) - COMMIT_BYTES
    out, pos = [], 0
    while pos < end:
        if pos + FRAME_BYTES > end:
            raise RecordError(offset + pos, "an op record cut off before its commit record")
        length, crc = _frame_from(data, pos)
        start = pos + FRAME_BYTES
        stop = start + length
        if length < 2 or stop > end or data[start] != OP:
            raise RecordError(offset + pos, f"not an op record of a sound length ({length})")
        if _crc32(data[start:stop]) != crc:
            raise RecordError(offset + pos, "a record whose CRC does not match")
        out.append(data[start + 1:stop])
        pos = stop
    if len(out) != commit.ops:
        raise RecordError(offset + end, f"a commit record for {commit.ops} ops after {len(out)} op records")
    return out


def verify_chain(commits: Iterable[Commit], prev: ChainPoint) -> ChainPoint:
    """The point after the last commit, if every commit follows its predecessor (the first one `prev`).

    Raises `ChainError` naming the first commit that does not follow, and why."""
    for c in commits:
        why = follows(prev, c.epoch, c.last_seq, c.ops)
        if not why and checksum(prev.checksum, c.epoch, c.last_seq, c.ops,
                                memoryview(c.data)[:len(c.data) - COMMIT_BYTES]) != c.checksum:
            why = f"ops {c.first_seq}..{c.last_seq}: their checksum does not chain"
        if why:
            raise ChainError(c.last_seq, why)
        prev = c.point
    return prev


# Checkpoints.

def put_snapshot_op(chunk: bytearray, seq: int, body: bytes) -> None:
    """Append one op to an S record's payload being built (start it with `bytearray((SNAPSHOT_OP,))`)."""
    chunk += SNAPSHOT_ITEM.pack(seq, len(body))
    chunk += body


def parse_snapshot_ops(payload: bytes, offset: int) -> list[tuple[int, bytes]]:
    """The (seq, op bytes) items of an S record's payload."""
    out, pos, end = [], 1, len(payload)
    unpack_from, head = SNAPSHOT_ITEM.unpack_from, SNAPSHOT_ITEM.size
    while pos < end:
        if pos + head > end:
            raise RecordError(offset, "a checkpoint op cut off inside its record")
        seq, n = unpack_from(payload, pos)
        pos += head
        if n < 2 or pos + n > end:
            raise RecordError(offset, f"a checkpoint op of impossible length {n}")
        out.append((seq, payload[pos:pos + n]))
        pos += n
    return out


def checkpoint_end_record(ops: int, chunks: int) -> bytes:
    return frame(_END.pack(CHECKPOINT_END, ops, chunks))


def parse_end(payload: bytes, offset: int) -> tuple[int, int]:
    if len(payload) != _END.size:
        raise RecordError(offset, f"a checkpoint end of {len(payload)} bytes ({_END.size} expected)")
    _, ops, chunks = _END.unpack(payload)
    return ops, chunks


# Reading records one by one.

def next_record(data: bytes | memoryview, pos: int) -> tuple[bytes, int]:
    """(the payload of the record at `pos`, the offset after it); `RecordError` if it is not whole and sound."""
    end = len(data)
    if pos + FRAME_BYTES > end:
        raise RecordError(pos, f"a record frame cut off after {end - pos} bytes")
    length, crc = _frame_from(data, pos)
    if length == 0 or length > MAX_PAYLOAD:
        raise RecordError(pos, f"a record of impossible length {length}")
    start = pos + FRAME_BYTES
    if start + length > end:
        raise RecordError(pos, f"a record of {length} bytes cut off after {end - start}")
    payload = bytes(data[start:start + length])
    if _crc32(payload) != crc:
        raise RecordError(pos, "a record whose CRC does not match")
    return payload, start + length


def find_commit_after(data: bytes | memoryview, pos: int) -> int | None:
    """The offset of a sound commit record anywhere after `pos` (byte by byte, not by frames), or None.

    What tells damage in the middle of a segment (a later commit survived it) from a torn last write."""
    needle = _CRC.pack(_COMMIT.size)  # the length field every commit record starts with
    raw = bytes(data)
    at = raw.find(needle, pos + 1)
    while at >= 0:
        try:
            parse_commit(raw, at)
            return at
        except RecordError:
            pass
        at = raw.find(needle, at + 1)
    return None

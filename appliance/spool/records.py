"""The spool's files, byte by byte: segment and checkpoint headers and the framed records in them.

Rules:
- Every record is framed: u32 payload length, u32 CRC-32 of the payload, the payload. Big-endian.
  The payload's first byte says what it is:
    O  an op:         u64 epoch, u64 seq, 16-byte chained checksum (chain.py), the op's bytes (codec.py)
    C  a commit:      u64 offset of the group commit's first record, u64 seq of its last op, u32 ops
    S  a checkpoint's ops: for each, i64 the seq it is applied with (snapshot.py), u32 its length, its
       bytes; as many as fit in CHUNK_BYTES (one frame and one CRC for many ops)
    E  a checkpoint's end: u64 ops, u64 S records (so a checkpoint cut short between records is told)
- A segment starts with SEGMENT_HEADER: magic, format, the chain point its first op follows, a CRC.
  Its name is the seq of that first op, 20 digits, then `.seg`. Then group commits follow, each its
  op records and one commit record; a commit is durable once the fdatasync after its write returns.
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
from typing import NamedTuple

from .chain import CHECKSUM_BYTES, ChainPoint, LogEntry

FORMAT = 1
SEGMENT_MAGIC = b"PAIRMQSG"
CHECKPOINT_MAGIC = b"PAIRMQCP"
SEGMENT_SUFFIX = ".seg"
CHECKPOINT_SUFFIX = ".ckpt"
MAX_PAYLOAD = 64 << 20  # no record is larger: a bigger length is damage, not a record

OP, COMMIT, SNAPSHOT_OP, CHECKPOINT_END = b"O"[0], b"C"[0], b"S"[0], b"E"[0]

_FRAME = struct.Struct(">II")
_HEADER = struct.Struct(f">8sIQQ{CHECKSUM_BYTES}s")  # magic, format, point (epoch, seq, checksum)
_CRC = struct.Struct(">I")
_OP_HEAD = struct.Struct(f">BQQ{CHECKSUM_BYTES}s")
_COMMIT = struct.Struct(">BQQI")
_END = struct.Struct(">BQQ")
SNAPSHOT_ITEM = struct.Struct(">qI")
CHUNK_BYTES = 1 << 20
HEADER_BYTES = _HEADER.size + _CRC.size
FRAME_BYTES = _FRAME.size
OP_HEAD_BYTES = _OP_HEAD.size
OP_OVERHEAD = FRAME_BYTES + _OP_HEAD.size  # bytes a record adds to an op's own
COMMIT_BYTES = FRAME_BYTES + _COMMIT.size
_crc32 = zlib.crc32
_frame_pack = _FRAME.pack
_op_head_pack = _OP_HEAD.pack


class RecordError(ValueError):
    """A record or header that does not parse; `offset` is where it starts in its file."""

    def __init__(self, offset: int, why: str) -> None:
        super().__init__(f"at byte {offset}: {why}")
        self.offset = offset
        self.why = why


class Commit(NamedTuple):
    start: int  # offset of the commit's first record in its segment
    last_seq: int
    ops: int


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
    got_magic, fmt, epoch, seq, checksum = _HEADER.unpack(head)
    if got_magic != magic:
        raise RecordError(0, f"not a PairMQ {'segment' if magic == SEGMENT_MAGIC else 'checkpoint'} "
                             f"(magic {got_magic!r})")
    if _crc32(head) != crc:
        raise RecordError(0, "the header's CRC does not match")
    if fmt != FORMAT:
        raise RecordError(0, f"format {fmt}, but this build reads format {FORMAT}")
    return ChainPoint(epoch, seq, checksum)


def frame(payload: bytes) -> bytes:
    return _frame_pack(len(payload), _crc32(payload)) + payload


def put_op(out: bytearray, entry: LogEntry) -> None:
    """Append `entry`'s framed op record to `out` (the writer's hot path: one buffer per group commit)."""
    payload = _op_head_pack(OP, entry.epoch, entry.seq, entry.checksum) + entry.body
    out += _frame_pack(len(payload), _crc32(payload))
    out += payload


def commit_record(start: int, last_seq: int, ops: int) -> bytes:
    return frame(_COMMIT.pack(COMMIT, start, last_seq, ops))


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


def next_record(data: bytes | memoryview, pos: int) -> tuple[bytes, int]:
    """(the payload of the record at `pos`, the offset after it); `RecordError` if it is not whole and sound."""
    end = len(data)
    if pos + FRAME_BYTES > end:
        raise RecordError(pos, f"a record frame cut off after {end - pos} bytes")
    length, crc = _FRAME.unpack_from(data, pos)
    if length == 0 or length > MAX_PAYLOAD:
        raise RecordError(pos, f"a record of impossible length {length}")
    start = pos + FRAME_BYTES
    if start + length > end:
        raise RecordError(pos, f"a record of {length} bytes cut off after {end - start}")
    payload = bytes(data[start:start + length])
    if _crc32(payload) != crc:
        raise RecordError(pos, "a record whose CRC does not match")
    return payload, start + length


def parse_op(payload: bytes, offset: int) -> LogEntry:
    if len(payload) < _OP_HEAD.size + 2:
        raise RecordError(offset, f"an op record of {len(payload)} bytes is too short")
    _, epoch, seq, checksum = _OP_HEAD.unpack_from(payload)
    return LogEntry(epoch, seq, checksum, payload[_OP_HEAD.size:])


def parse_commit(payload: bytes, offset: int) -> Commit:
    if len(payload) != _COMMIT.size:
        raise RecordError(offset, f"a commit record of {len(payload)} bytes ({_COMMIT.size} expected)")
    _, start, last_seq, ops = _COMMIT.unpack(payload)
    return Commit(start, last_seq, ops)


def parse_end(payload: bytes, offset: int) -> tuple[int, int]:
    if len(payload) != _END.size:
        raise RecordError(offset, f"a checkpoint end of {len(payload)} bytes ({_END.size} expected)")
    _, ops, chunks = _END.unpack(payload)
    return ops, chunks


def find_commit_after(data: bytes | memoryview, pos: int) -> int | None:
    """The offset of a sound commit record anywhere after `pos` (byte by byte, not by frames), or None.

    What tells damage in the middle of a segment (a later commit survived it) from a torn last write."""
    needle = _CRC.pack(_COMMIT.size)  # the length field every commit record starts with
    raw = bytes(data)
    at = raw.find(needle, pos + 1)
    while at >= 0:
        try:
            payload, _ = next_record(raw, at)
            if payload[0] == COMMIT:
                return at
        except RecordError:
            pass
        at = raw.find(needle, at + 1)
    return None

"""The op log as segment files: appended by group commits, scanned at open, read for the mate link.

Rules:
- The log is the segments in a spool directory (records.py has their bytes), in seq order, each
  following the one before: a segment's header holds the point of the previous segment's last op.
  The log's base is the first segment's header point; its head the last op of the last segment.
- `append(entries)` is one group commit: the op records and a commit record, one `pwrite` at the end of
  the last segment and one `fdatasync`. Only then are the entries durable. A failed write or sync
  takes the file back to its size before (ftruncate) and raises the OSError; nothing of it counts.
- A new segment begins when the last one holds `segment_bytes` or more; a commit is never split.
  The new file's header is written and synced, and the directory synced, before any op goes in.
- Opening scans every segment: each record's frame and CRC, the seqs, the commits, and the chain
  (chain.py) of every op after `replay_after` (the checkpoint's point, which the store checks is on the
  log): the ops before it are only kept for an incremental resync, and the standby checks their chain
  itself as they arrive.
  In the last segment, records after the last sound commit that do not parse, with no sound commit
  anywhere after them, are a write that a crash cut short: never acknowledged (its fdatasync never
  returned), so the file is cut back to the end of the last commit and a warning says how many bytes
  went. Anything else that does not parse or chain is damage: `SpoolCorruption` naming the segment
  and the offset, and the node refuses to serve from it.
- `open(..., check_all=True)` (`pairmq spool verify`) checks the chain of every op and changes nothing:
  a torn last write is reported (`Segment.unfinished`), not cut off.
- `drop_through(seq)` deletes whole segments whose every op is at or before `seq` (the caller keeps
  what the checkpoint has not covered and what an incremental resync may still ask for); the last
  segment always stays.
- Threads: the writer thread appends; any thread reads (`read_entries`, `point_at`); `_lock` guards the
  segment list and each segment's index, and readers use their own file descriptors.
"""

from __future__ import annotations

import array
import logging
import os
import struct
import threading
import zlib
from collections.abc import Callable
from pathlib import Path

from . import records as r
from .chain import GENESIS, ChainPoint, LogEntry, checksum
from ..errors import SpoolCorruption

log = logging.getLogger(__name__)
SEGMENT_BYTES = 64 << 20
_frame_from = struct.Struct(">II").unpack_from
_seq_from = struct.Struct(">Q").unpack_from
_crc32 = zlib.crc32


class Segment:
    """One segment file: where its ops are (`offsets[i]` is the record of op `first_seq + i`)."""

    __slots__ = ("path", "base", "last", "size", "offsets", "commits", "unfinished")

    def __init__(self, path: Path, base: ChainPoint) -> None:
        self.path = path
        self.base = base  # the point its first op follows
        self.last = base  # its last op's point (base while it holds none)
        self.size = r.HEADER_BYTES
        self.offsets = array.array("Q")
        self.commits = 0  # found when it was opened
        self.unfinished = 0  # bytes after its last commit found at open (cut off unless opened to check)

    @property
    def first_seq(self) -> int:
        return self.base.seq + 1

    @property
    def ops(self) -> int:
        return len(self.offsets)


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class SegmentLog:
    def __init__(self, directory: Path, segments: list[Segment], start: ChainPoint,
                 segment_bytes: int = SEGMENT_BYTES) -> None:
        self.directory = directory
        self.segment_bytes = segment_bytes
        self._segments = segments
        self._start = start  # the log's base and head while it has no segment
        self._lock = threading.Lock()
        self._fd = -1  # the last segment, open for appending (the writer thread's)

    # Opening.

    @classmethod
    def open(cls, directory: Path, start: ChainPoint = GENESIS, *, replay_after: int = 0,
             replay: Callable[[LogEntry], None] | None = None, segment_bytes: int = SEGMENT_BYTES,
             check_all: bool = False) -> SegmentLog:
        """Scan the directory's segments (see the rules); `replay(entry)` for each op with seq > `replay_after`.

        `start`: the point the log begins at when there is no segment (a checkpoint's, or GENESIS)."""
        paths = sorted(directory.glob("*" + r.SEGMENT_SUFFIX))
        segments: list[Segment] = []
        prev: ChainPoint | None = None
        for i, path in enumerate(paths):
            seg = _scan(path, prev, last=i == len(paths) - 1, replay_after=replay_after, replay=replay,
                        check_all=check_all)
            segments.append(seg)
            prev = seg.last
        return cls(directory, segments, start, segment_bytes)

    # Reading (any thread).

    @property
    def base(self) -> ChainPoint:
        with self._lock:
            return self._segments[0].base if self._segments else self._start

    @property
    def head(self) -> ChainPoint:
        with self._lock:
            return self._segments[-1].last if self._segments else self._start

    def segment_list(self) -> list[Segment]:
        """The segments, oldest first (read their fields; the writer moves the last one on)."""
        with self._lock:
            return list(self._segments)

    def point_at(self, seq: int) -> ChainPoint | None:
        """The point of op `seq` (the base's for seq == base), or None if the log does not hold it."""
        with self._lock:
            base = self._segments[0].base if self._segments else self._start
            if seq == base.seq:
                return base
            found = self._locate(seq)
        if found is None:
            return None
        seg, offset = found
        try:
            with open(seg.path, "rb") as f:
                entry = _read_ops(f, offset, 1)[0]
        except FileNotFoundError:  # dropped by a checkpoint since it was located: no longer in the log
            return None
        return entry.point

    def bytes_after(self, seq: int) -> int:
        """The bytes of the records after op `seq` (a catch-up's size, for its progress only)."""
        with self._lock:
            total = 0
            for seg in self._segments:
                if seg.last.seq <= seq:
                    continue
                at = seg.offsets[seq - seg.first_seq + 1] if seq >= seg.first_seq else r.HEADER_BYTES
                total += seg.size - at
            return total

    def read_entries(self, after_seq: int, max_ops: int) -> list[LogEntry]:
        """Up to `max_ops` ops with seq > after_seq, in order; `LookupError` if the log no longer holds them."""
        with self._lock:
            base = self._segments[0].base if self._segments else self._start
            if after_seq < base.seq:
                raise LookupError(f"ops {after_seq + 1}..{base.seq} are no longer in the log (it starts at "
                                  f"{base.seq + 1})")
            plan = []
            want = max_ops
            for seg in self._segments:
                if want <= 0:
                    break
                if seg.last.seq <= after_seq or not seg.ops:
                    continue
                i = max(0, after_seq + 1 - seg.first_seq)
                n = min(want, seg.ops - i)
                plan.append((seg.path, seg.offsets[i], n))
                want -= n
        out: list[LogEntry] = []
        for path, offset, n in plan:
            try:
                with open(path, "rb") as f:
                    out += _read_ops(f, offset, n)
            except FileNotFoundError:  # dropped by a checkpoint since it was planned: as if asked a moment later
                raise LookupError(f"ops after {after_seq} were dropped from the log while being read") from None
        return out

    def _locate(self, seq: int) -> tuple[Segment, int] | None:
        for seg in self._segments:
            if seg.first_seq <= seq <= seg.last.seq:
                return seg, seg.offsets[seq - seg.first_seq]
        return None

    # Writing (the writer thread).

    def append(self, entries: list[LogEntry] | tuple[LogEntry, ...]) -> None:
        """One group commit, durable on return (see the rules); OSError if it failed, with nothing kept."""
        seg = self._writable()
        start = seg.size
        buf = bytearray()
        offsets = []
        put = r.put_op
        for entry in entries:
            offsets.append(start + len(buf))
            put(buf, entry)
        buf += r.commit_record(start, entries[-1].seq, len(entries))
        try:
            written = 0
            while written < len(buf):
                written += os.pwrite(self._fd, buf[written:] if written else buf, start + written)
            os.fdatasync(self._fd)
        except OSError:
            try:
                os.ftruncate(self._fd, start)
            except OSError as again:
                log.error("segment %s: could not cut a failed commit back off: %s", seg.path, again)
            raise
        with self._lock:
            seg.size = start + len(buf)
            seg.offsets.extend(offsets)
            seg.last = entries[-1].point

    def _writable(self) -> Segment:
        seg = self._segments[-1] if self._segments else None
        if seg is not None and (seg.size < self.segment_bytes or not seg.ops):
            if self._fd < 0:
                self._fd = os.open(seg.path, os.O_WRONLY)
            return seg
        base = seg.last if seg is not None else self._start
        path = self.directory / r.segment_name(base.seq + 1)
        tmp = path.with_name(path.name + ".new")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, r.header(r.SEGMENT_MAGIC, base))
            os.fdatasync(fd)
        except BaseException:
            os.close(fd)
            tmp.unlink(missing_ok=True)
            raise
        os.replace(tmp, path)
        fsync_dir(self.directory)
        new = Segment(path, base)
        with self._lock:
            self._segments.append(new)
        if self._fd >= 0:
            os.close(self._fd)
        self._fd = fd
        return new

    def drop_through(self, seq: int) -> int:
        """Delete whole segments (not the last) whose ops are all at or before `seq`; how many went."""
        with self._lock:
            gone = []
            while len(self._segments) > 1 and self._segments[0].last.seq <= seq:
                gone.append(self._segments.pop(0))
        for seg in gone:
            seg.path.unlink(missing_ok=True)
        if gone:
            fsync_dir(self.directory)
        return len(gone)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _read_ops(f, offset: int, n: int) -> list[LogEntry]:
    """`n` op records from `offset` of an open segment file (commit records in between are skipped)."""
    out: list[LogEntry] = []
    chunk = 1 << 20
    data = b""
    pos = 0
    f.seek(offset)
    while len(out) < n:
        try:
            payload, end = r.next_record(data, pos)
        except r.RecordError:
            more = f.read(max(chunk, 2 * (len(data) - pos) + 1))
            if not more:
                raise SpoolCorruption(f"segment {f.name}: op records end early at byte {offset + pos}; "
                                      "refusing to serve from a corrupt spool") from None
            data = data[pos:] + more
            offset += pos
            pos = 0
            continue
        if payload[0] == r.OP:
            out.append(r.parse_op(payload, offset + pos))
        pos = end
    return out


def _scan(path: Path, prev: ChainPoint | None, *, last: bool, replay_after: int,
          replay: Callable[[LogEntry], None] | None, check_all: bool = False) -> Segment:
    def damaged(what: str) -> SpoolCorruption:
        return SpoolCorruption(f"segment {path}: {what}; refusing to serve from a corrupt spool")

    with open(path, "rb") as f:
        data = f.read()
    try:
        base = r.parse_header(data, r.SEGMENT_MAGIC)
    except r.RecordError as exc:
        raise damaged(exc.why) from None
    if path.name != r.segment_name(base.seq + 1):
        raise damaged(f"its header says its first op is {base.seq + 1}, its name says otherwise")
    if prev is not None and base != prev:
        raise damaged(f"it follows op {base.seq} (epoch {base.epoch}), but the segment before ends at op {prev.seq} "
                      f"(epoch {prev.epoch}){' with another checksum' if base.seq == prev.seq else ''}")
    seg = Segment(path, base)
    point = base
    pending: list[tuple[int, LogEntry | None]] = []  # ops of the commit being read
    pos = good = r.HEADER_BYTES
    size, view = len(data), memoryview(data)
    lazy = -1  # where the op that `point` should be is, when only its seq was read (the fast path below)
    chain_after = -1 if check_all else replay_after
    while pos < size:
        # The fast path: an op kept only for an incremental resync (see the rules): frame, CRC and seq.
        if pos + r.FRAME_BYTES <= size:
            length, crc = _frame_from(data, pos)
            start = pos + r.FRAME_BYTES
            end = start + length
            if end <= size and length > r.OP_HEAD_BYTES and data[start] == r.OP \
                    and _crc32(view[start:end]) == crc:
                seq = _seq_from(data, start + 9)[0]
                if seq <= chain_after:
                    if seq != (point.seq if lazy < 0 else lazy_seq) + 1:
                        raise damaged(f"op {seq} at byte {pos} follows op {point.seq if lazy < 0 else lazy_seq}")
                    lazy, lazy_seq = pos, seq
                    pending.append((pos, None))
                    pos = end
                    continue
        if lazy >= 0:
            point = r.parse_op(r.next_record(data, lazy)[0], lazy).point
            lazy = -1
        try:
            payload, end = r.next_record(data, pos)
            kind = payload[0]
            if kind == r.OP:
                entry = r.parse_op(payload, pos)
                if entry.seq <= chain_after:
                    if entry.seq != point.seq + 1:
                        raise damaged(f"op {entry.seq} at byte {pos} follows op {point.seq}")
                    point = entry.point
                else:
                    point = _follow(point, entry, pos, damaged)
                pending.append((pos, entry))
            elif kind == r.COMMIT:
                commit = r.parse_commit(payload, pos)
                if not pending or commit.start != pending[0][0] or commit.last_seq != point.seq \
                        or commit.ops != len(pending):
                    raise damaged(f"the commit at byte {pos} does not match the ops before it")
                for at, entry in pending:
                    seg.offsets.append(at)
                    if replay is not None and entry is not None and entry.seq > replay_after:
                        replay(entry)
                seg.commits += 1
                pending.clear()
                seg.last = point
                good = end
            else:
                raise r.RecordError(pos, f"a record of unknown kind {kind}")
        except r.RecordError as exc:
            if last and r.find_commit_after(data, exc.offset) is None:
                break  # a torn last write (see the rules)
            raise damaged(str(exc)) from None  # its str names the offset
        pos = end
    if lazy >= 0:
        raise damaged(f"{size - good} bytes of ops after its last commit")
    seg.unfinished = len(data) - good
    if good < len(data) and not last:
        raise damaged(f"{len(data) - good} bytes after its last commit")
    if good < len(data) and not check_all:
        log.warning("segment %s: %d bytes after the last commit were cut off (a write a crash cut short, never "
                    "acknowledged)", path, len(data) - good)
        with open(path, "r+b") as f:
            f.truncate(good)
            os.fdatasync(f.fileno())
    seg.size = good
    return seg


def _follow(prev: ChainPoint, entry: LogEntry, pos: int, damaged) -> ChainPoint:
    if entry.seq != prev.seq + 1:
        raise damaged(f"op {entry.seq} at byte {pos} follows op {prev.seq}")
    if entry.epoch < prev.epoch:
        raise damaged(f"op {entry.seq} at byte {pos} has epoch {entry.epoch}, older than op {prev.seq}'s")
    if checksum(prev.checksum, entry.epoch, entry.seq, entry.body) != entry.checksum:
        raise damaged(f"op {entry.seq} at byte {pos}: its checksum does not chain")
    return entry.point

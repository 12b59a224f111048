"""The op log as segment files: appended by group commits, scanned at open, read for the mate link.

Rules:
- The log is the segments in a spool directory (records.py has their bytes), in seq order, each
  following the one before: a segment's header holds the point of the previous segment's last commit.
  The log's base is the first segment's header point; its head the last commit of the last segment.
- `append(commits)` is one group commit: the commits' bytes as they are (`Commit.data`), one `pwrite`
  at the end of the last segment and one `fdatasync`. Only then are they durable. A failed write or
  sync takes the file back to its size before (ftruncate) and raises the OSError; nothing of it counts.
- A new segment begins when the last one holds `segment_bytes` or more; a commit is never split.
  The new file's header is written and synced, and the directory synced, before any op goes in.
- Opening scans every segment: each record's frame and CRC, each commit against the op records
  before it and the commit before it, and the chained checksum (chain.py) of every commit after
  `replay_after` (the checkpoint's point, which the store checks is on the log): the commits before
  it are only kept for an incremental resync, and the standby checks their chain itself as they arrive.
  In the last segment, records after the last sound commit that do not parse, with no sound commit
  anywhere after them, are a write that a crash cut short: never acknowledged (its fdatasync never
  returned), so the file is cut back to the end of the last commit and a warning says how many bytes
  went. Anything else that does not parse or chain is damage: `SpoolCorruption` naming the segment
  and the offset, and the node refuses to serve from it.
- `open(..., check_all=True)` (`pairmq spool verify`) checks the chain of every commit and changes
  nothing: a torn last write is reported (`Segment.unfinished`), not cut off.
- Reads for the mate link (`read_commits`, `point_at`) go by commits: a point of the log is a commit's
  end, and what is read is the commits' bytes as written, never re-framed.
- `drop_through(seq)` deletes whole segments whose every op is at or before `seq` (the caller keeps
  what the checkpoint has not covered and what an incremental resync may still ask for); the last
  segment always stays.
- Threads: the writer thread appends; any thread reads (`read_commits`, `point_at`); `_lock` guards the
  segment list and each segment's index, and readers use their own file descriptors.
"""

from __future__ import annotations

import array
import bisect
import logging
import os
import struct
import threading
import zlib
from collections.abc import Callable
from pathlib import Path

from . import records as r
from .chain import GENESIS, ChainPoint, Commit, checksum, follows
from ..errors import SpoolCorruption

log = logging.getLogger(__name__)
SEGMENT_BYTES = 64 << 20
_frame_from = struct.Struct(">II").unpack_from
_crc32 = zlib.crc32
Replay = Callable[[int, bytes], None]  # (seq, op bytes), in seq order


class Segment:
    """One segment file and where its commits end (`ends[i]`: the offset after commit i, `lasts[i]`: its last seq)."""

    __slots__ = ("path", "base", "last", "size", "ends", "lasts", "unfinished")

    def __init__(self, path: Path, base: ChainPoint) -> None:
        self.path = path
        self.base = base  # the point its first op follows
        self.last = base  # its last commit's point (base while it holds none)
        self.size = r.HEADER_BYTES
        self.ends = array.array("Q")
        self.lasts = array.array("Q")
        self.unfinished = 0  # bytes after its last commit found at open (cut off unless opened to check)

    @property
    def first_seq(self) -> int:
        return self.base.seq + 1

    @property
    def ops(self) -> int:
        return self.last.seq - self.base.seq

    @property
    def commits(self) -> int:
        return len(self.ends)

    def commit_after(self, seq: int) -> int:
        """The index of the commit that starts at op seq + 1; LookupError if no commit of this segment does."""
        i = bisect.bisect_right(self.lasts, seq)
        if (self.lasts[i - 1] if i else self.base.seq) != seq or i == len(self.lasts):
            raise LookupError(f"op {seq} is not the end of a commit in segment {self.path.name}")
        return i

    def start_of(self, i: int) -> int:
        return self.ends[i - 1] if i else r.HEADER_BYTES


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
             replay: Replay | None = None, segment_bytes: int = SEGMENT_BYTES,
             check_all: bool = False) -> SegmentLog:
        """Scan the directory's segments (see the rules); `replay(seq, op bytes)` for each op with seq > `replay_after`.

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
        """The point of the commit ending at op `seq` (the base's for seq == base), or None if the log holds none."""
        with self._lock:
            base = self._segments[0].base if self._segments else self._start
            if seq == base.seq:
                return base
            seg = self._holding(seq)
            if seg is None:
                return None
            i = bisect.bisect_left(seg.lasts, seq)
            if i == len(seg.lasts) or seg.lasts[i] != seq:
                return None
            at = seg.ends[i] - r.COMMIT_BYTES
        try:
            with open(seg.path, "rb") as f:
                commit = r.parse_commit(os.pread(f.fileno(), r.COMMIT_BYTES, at), 0)
        except FileNotFoundError:  # dropped by a checkpoint since it was located: no longer in the log
            return None
        except r.RecordError as exc:
            raise SpoolCorruption(f"segment {seg.path}: at byte {at}: {exc.why}; refusing to serve from a "
                                  "corrupt spool") from None
        return commit.point

    def bytes_after(self, seq: int) -> int:
        """The bytes of the commits after op `seq` (a catch-up's size, for its progress only)."""
        with self._lock:
            total = 0
            for seg in self._segments:
                if seg.last.seq <= seq:
                    continue
                i = bisect.bisect_right(seg.lasts, seq) if seq >= seg.first_seq else 0
                total += seg.size - seg.start_of(i)
            return total

    def read_commits(self, after_seq: int, max_ops: int) -> list[Commit]:
        """The commits after op `after_seq`, in order, as written: at least one if there is any, and no more once
        they hold `max_ops` ops. `LookupError` if the log no longer holds them, or op `after_seq` ends no commit."""
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
                if seg.last.seq <= after_seq:
                    continue
                i = seg.commit_after(after_seq) if after_seq >= seg.first_seq else 0
                j = i
                while j < len(seg.lasts) and want > 0:
                    want -= seg.lasts[j] - (seg.lasts[j - 1] if j else seg.base.seq)
                    j += 1
                start = seg.start_of(i)
                plan.append((seg.path, start, [end - start for end in seg.ends[i:j]]))
                after_seq = seg.lasts[j - 1]
        out: list[Commit] = []
        for path, start, ends in plan:
            try:
                with open(path, "rb") as f:
                    data = os.pread(f.fileno(), ends[-1], start)
            except FileNotFoundError:  # dropped by a checkpoint since it was planned: as if asked a moment later
                raise LookupError(f"ops after {after_seq} were dropped from the log while being read") from None
            if len(data) != ends[-1]:
                raise SpoolCorruption(f"segment {path}: commits end early at byte {start + len(data)}; refusing to "
                                      "serve from a corrupt spool")
            at = 0
            for end in ends:
                try:
                    commit = r.parse_commit(data, end - r.COMMIT_BYTES)
                except r.RecordError as exc:
                    raise SpoolCorruption(f"segment {path}: at byte {start + exc.offset}: {exc.why}; refusing to "
                                          "serve from a corrupt spool") from None
                out.append(commit._replace(data=data[at:end]))
                at = end
        return out

    def _holding(self, seq: int) -> Segment | None:
        for seg in self._segments:
            if seg.first_seq <= seq <= seg.last.seq:
                return seg
        return None

    # Writing (the writer thread).

    def append(self, commits: list[Commit] | tuple[Commit, ...]) -> None:
        """One group commit, durable on return (see the rules); OSError if it failed, with nothing kept."""
        seg = self._writable()
        start = seg.size
        ends = []
        at = start
        for c in commits:
            at += len(c.data)
            ends.append(at)
        buf = b"".join([c.data for c in commits]) if len(commits) > 1 else commits[0].data
        try:
            written = 0
            while written < len(buf):
                written += os.pwrite(self._fd, memoryview(buf)[written:] if written else buf, start + written)
            os.fdatasync(self._fd)
        except OSError:
            try:
                os.ftruncate(self._fd, start)
            except OSError as again:
                log.error("segment %s: could not cut a failed commit back off: %s", seg.path, again)
            raise
        with self._lock:
            seg.size = at
            seg.ends.extend(ends)
            seg.lasts.extend([c.last_seq for c in commits])
            seg.last = commits[-1].point

    def _writable(self) -> Segment:
        seg = self._segments[-1] if self._segments else None
        if seg is not None and (seg.size < self.segment_bytes or not seg.ends):
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


def _scan(path: Path, prev: ChainPoint | None, *, last: bool, replay_after: int,
          replay: Replay | None, check_all: bool = False) -> Segment:
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
    size, view = len(data), memoryview(data)
    pos = good = r.HEADER_BYTES
    chain_after = -1 if check_all else replay_after
    bodies: list[bytes] = []  # the ops of the commit being read, when it is replayed
    ops = 0
    replaying = replay is not None and point.seq >= replay_after
    try:
        while pos < size:
            if pos + r.FRAME_BYTES > size:
                raise r.RecordError(pos, f"a record frame cut off after {size - pos} bytes")
            length, crc = _frame_from(data, pos)
            start = pos + r.FRAME_BYTES
            end = start + length
            if length < 2 or length > r.MAX_PAYLOAD or end > size:
                raise r.RecordError(pos, f"a record of impossible length {length}" if end <= size
                                    else f"a record of {length} bytes cut off after {size - start}")
            if _crc32(view[start:end]) != crc:
                raise r.RecordError(pos, "a record whose CRC does not match")
            kind = data[start]
            if kind == r.OP:
                ops += 1
                if replaying:
                    bodies.append(data[start + 1:end])
            elif kind == r.COMMIT:
                c = r.parse_commit(data, pos)
                why = follows(point, c.epoch, c.last_seq, c.ops)
                if not why and c.ops != ops:
                    why = f"it is for {c.ops} ops, but {ops} op records come before it"
                if not why and c.last_seq > chain_after \
                        and checksum(point.checksum, c.epoch, c.last_seq, c.ops, view[good:pos]) != c.checksum:
                    why = f"ops {c.first_seq}..{c.last_seq}: their checksum does not chain"
                if why:
                    raise damaged(f"the commit at byte {pos}: {why}")
                if replaying:
                    for seq, body in enumerate(bodies, c.first_seq):
                        replay(seq, body)
                    bodies.clear()
                seg.ends.append(end)
                seg.lasts.append(c.last_seq)
                point = c.point
                ops = 0
                good = end
                replaying = replay is not None and point.seq >= replay_after
            else:
                raise r.RecordError(pos, f"a record of unknown kind {kind}")
            pos = end
    except r.RecordError as exc:
        if not (last and r.find_commit_after(data, exc.offset) is None):
            raise damaged(str(exc)) from None  # its str names the offset
        # a torn last write (see the rules)
    seg.last = point
    seg.unfinished = size - good
    if good < size and not last:
        raise damaged(f"{size - good} bytes after its last commit")
    if good < size and not check_all:
        log.warning("segment %s: %d bytes after the last commit were cut off (a write a crash cut short, never "
                    "acknowledged)", path, size - good)
        with open(path, "r+b") as f:
            f.truncate(good)
            os.fdatasync(f.fileno())
    seg.size = good
    return seg

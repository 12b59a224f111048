"""`pairmq spool verify DIR`: read a spool directory and say whether a node could serve from it (docs/spool.md).

Rules:
- Read-only: no lock is taken, nothing is cut, removed or renamed, so it may run beside a node serving
  from the directory. What such a node may be doing at that moment reads as what it is: the last
  segment growing (an unfinished write at its end, which the node would cut off at open if it died
  now), a checkpoint or a segment replaced or dropped while it is read (then: run again).
- It checks what `Spool.open` checks and reports every fact it checked: each segment's header, every
  record's frame and CRC, every op's place in the chain (seq, epoch, checksum) across all segments,
  each commit record against the ops before it; the newest checkpoint's header, records, count and
  SHA-256; that the log reaches back to the checkpoint and holds its point (the same history); every
  op decodes. The state (checkpoint, then the log after it) is replayed for its totals.
- The first fault found ends the check: one sentence naming the file and the byte offset. An
  unfinished write at the end of the last segment is not a fault (segments.py tells it from damage
  the same way: no sound commit anywhere after it).
- Pure of the terminal: `verify(directory)` returns a `Report`; the CLI renders it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from pathlib import Path

from . import records as r
from .chain import GENESIS, ChainPoint, checksum
from .codec import decode_op
from .errors import OpCodecError
from .state import StateModel, check_op
from .store import LOCK_NAME, OLD_LAYOUT, old_layout_sentence


class NotASpool(ValueError):
    """The path is not a spool directory at all (a usage mistake, not damage)."""


class _Damage(Exception):
    pass


@dataclasses.dataclass(frozen=True, slots=True)
class SegmentFacts:
    name: str
    base: ChainPoint  # the point its first op follows
    last: ChainPoint  # its last committed op's (base while it holds none)
    first_epoch: int
    bytes: int  # the file's size as read
    commits: int
    ops: int
    unfinished_bytes: int  # after the last commit: a write not (yet) durable, cut off at the next open


@dataclasses.dataclass(frozen=True, slots=True)
class CheckpointFacts:
    name: str
    point: ChainPoint | None  # None: an older checkpoint whose header does not read
    ops: int
    bytes: int
    verified: bool  # False: an older checkpoint (the next one written removes it), header read only


@dataclasses.dataclass(frozen=True, slots=True)
class Totals:
    sessions: int
    queued_messages: int
    retained: int
    stored_messages: int
    stored_bytes: int


@dataclasses.dataclass(frozen=True, slots=True)
class Report:
    directory: Path
    in_use: bool  # a process holds the spool's lock (a node serving from it)
    checkpoints: tuple[CheckpointFacts, ...]
    segments: tuple[SegmentFacts, ...]
    leftovers: tuple[str, ...]  # `.new` files a crash left (removed at the next open)
    base: ChainPoint | None  # the log's base and head (None: the check stopped before)
    head: ChainPoint | None
    totals: Totals | None
    damage: str | None  # one sentence, or None: sound

    @property
    def sound(self) -> bool:
        return self.damage is None


def verify(directory: Path | str) -> Report:
    directory = Path(directory)
    if not directory.is_dir():
        raise NotASpool(f"{directory} is not a directory")
    segment_paths = sorted(directory.glob("*" + r.SEGMENT_SUFFIX))
    checkpoint_paths = sorted(directory.glob("*" + r.CHECKPOINT_SUFFIX))
    old = (directory / OLD_LAYOUT).exists()
    if not (segment_paths or checkpoint_paths or old or (directory / LOCK_NAME).exists()):
        raise NotASpool(f"{directory} holds no spool (no segment, checkpoint, {OLD_LAYOUT} or {LOCK_NAME})")
    check = _Check(directory)
    try:
        if old:
            raise _Damage(old_layout_sentence(directory))
        check.run(checkpoint_paths, segment_paths)
        damage = None
    except _Damage as exc:
        damage = str(exc)
    except FileNotFoundError as exc:
        damage = (f"{exc.filename} went away while it was read (a node serving from this spool replaced it); "
                  "run the check again")
    return Report(directory, _lock_held(directory / LOCK_NAME), tuple(check.checkpoints), tuple(check.segments),
                  tuple(sorted(p.name for p in directory.glob("*.new"))), check.base, check.head,
                  check.totals if damage is None else None, damage)


class _Check:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.checkpoints: list[CheckpointFacts] = []
        self.segments: list[SegmentFacts] = []
        self.base: ChainPoint | None = None
        self.head: ChainPoint | None = None
        self.totals: Totals | None = None
        self.model = StateModel()

    def run(self, checkpoint_paths: list[Path], segment_paths: list[Path]) -> None:
        point = GENESIS
        for path in checkpoint_paths[:-1]:  # never read by a node (the next checkpoint removes them)
            try:
                older = _header(path, r.CHECKPOINT_MAGIC)
            except _Damage:
                older = None
            self.checkpoints.append(CheckpointFacts(path.name, older, 0, path.stat().st_size, False))
        if checkpoint_paths:
            point = self._checkpoint(checkpoint_paths[-1])
        on_log = point if point.seq == 0 else None
        prev: ChainPoint | None = None
        for i, path in enumerate(segment_paths):
            facts, found = self._segment(path, prev, last=i == len(segment_paths) - 1, checkpoint=point)
            self.segments.append(facts)
            on_log = found or on_log
            prev = facts.last
        self.base = self.segments[0].base if self.segments else point
        self.head = self.segments[-1].last if self.segments else point
        if self.base.seq > point.seq:
            holds = f"the checkpoint is at op {point.seq}" if checkpoint_paths else "there is no checkpoint"
            raise _Damage(f"segment {segment_paths[0]} starts after op {self.base.seq}, but {holds}: ops "
                          f"{point.seq + 1}..{self.base.seq} are missing")
        if self.head.seq < point.seq:
            raise _Damage(f"the log ends at op {self.head.seq}, before the checkpoint {checkpoint_paths[-1]} at op "
                          f"{point.seq}")
        if self.base.seq == point.seq:
            on_log = self.base
        if on_log != point:
            raise _Damage(f"checkpoint {checkpoint_paths[-1]} holds op {point.seq} with another checksum or epoch "
                          "than the log: it is not on this log (another history)")
        m = self.model
        self.totals = Totals(len(m.sessions), sum(len(s.queue) for s in m.sessions.values()), len(m.retained),
                             len(m.messages), m.stored_bytes)

    def _apply(self, path: Path, offset: int, seq: int, body: bytes) -> None:
        try:
            op = decode_op(body)
            check_op(op)
        except (OpCodecError, ValueError) as exc:
            raise _Damage(f"{_kind(path)} {path} is damaged at byte {offset}: an op that does not decode "
                          f"({exc})") from None
        self.model.apply(seq, op, len(body))

    def _checkpoint(self, path: Path) -> ChainPoint:
        data = path.read_bytes()
        point = _parse_header(path, data, r.CHECKPOINT_MAGIC)
        if path.name != r.checkpoint_name(point.seq):
            raise _Damage(f"checkpoint {path}: its header holds op {point.seq}, its name says otherwise")
        pos, n = r.HEADER_BYTES, 0
        try:
            while True:
                payload, end = r.next_record(data, pos)
                if payload[0] == r.CHECKPOINT_END:
                    ops, digest = r.parse_end(payload, pos)
                    if ops != n:
                        raise r.RecordError(pos, f"its end counts {ops} ops, the file holds {n}")
                    if hashlib.sha256(data[:pos]).digest() != digest:
                        raise r.RecordError(pos, "the SHA-256 at its end does not match its contents")
                    if end != len(data):
                        raise r.RecordError(end, f"{len(data) - end} bytes after its end")
                    break
                if payload[0] != r.SNAPSHOT_OP:
                    raise r.RecordError(pos, f"a record of kind {payload[0]} in a checkpoint")
                seq, body = r.parse_snapshot_op(payload, pos)
                self._apply(path, pos, seq, body)
                n += 1
                pos = end
        except r.RecordError as exc:
            raise _Damage(f"checkpoint {path} is damaged at byte {exc.offset}: {exc.why}") from None
        self.checkpoints.append(CheckpointFacts(path.name, point, n, len(data), True))
        return point

    def _segment(self, path: Path, prev: ChainPoint | None, *, last: bool,
                 checkpoint: ChainPoint) -> tuple[SegmentFacts, ChainPoint | None]:
        """The segment's facts, and the point of the checkpoint's op if this segment holds it."""
        def damaged(offset: int, why: str) -> _Damage:
            return _Damage(f"segment {path} is damaged at byte {offset}: {why}")

        data = path.read_bytes()
        base = _parse_header(path, data, r.SEGMENT_MAGIC)
        if path.name != r.segment_name(base.seq + 1):
            raise damaged(0, f"its header says its first op is {base.seq + 1}, its name says otherwise")
        if prev is not None and base != prev:
            raise damaged(0, f"it follows op {base.seq} (epoch {base.epoch}), but the segment before ends at op "
                             f"{prev.seq} (epoch {prev.epoch}){' with another checksum' if base.seq == prev.seq else ''}")
        point = committed = base
        found = pending_found = None
        pending: list[tuple[int, int, bytes]] = []  # (offset, seq, body) of the commit being read
        pending_start = 0
        commits = ops = 0
        pos = good = r.HEADER_BYTES
        while pos < len(data):
            try:
                payload, end = r.next_record(data, pos)
                kind = payload[0]
                if kind == r.OP:
                    entry = r.parse_op(payload, pos)
                    if entry.seq != point.seq + 1:
                        raise damaged(pos, f"op {entry.seq} follows op {point.seq}")
                    if entry.epoch < point.epoch:
                        raise damaged(pos, f"op {entry.seq} has epoch {entry.epoch}, older than op {point.seq}'s")
                    if checksum(point.checksum, entry.epoch, entry.seq, entry.body) != entry.checksum:
                        raise damaged(pos, f"op {entry.seq}'s checksum does not chain to op {point.seq}'s")
                    if not pending:
                        pending_start = pos
                    pending.append((pos, entry.seq, entry.body))
                    point = entry.point
                    if entry.seq == checkpoint.seq:
                        pending_found = point
                elif kind == r.COMMIT:
                    commit = r.parse_commit(payload, pos)
                    if not pending or commit.start != pending_start or commit.last_seq != point.seq \
                            or commit.ops != len(pending):
                        raise damaged(pos, "a commit record that does not match the ops before it")
                    for at, seq, body in pending:
                        if seq > checkpoint.seq:
                            self._apply(path, at, seq, body)
                    commits += 1
                    ops += len(pending)
                    pending.clear()
                    committed, found, pending_found = point, found or pending_found, None
                    good = end
                else:
                    raise r.RecordError(pos, f"a record of unknown kind {kind}")
            except r.RecordError as exc:
                if last and r.find_commit_after(data, exc.offset) is None:
                    break
                raise damaged(exc.offset, exc.why) from None
            pos = end
        if good < len(data) and not last:
            raise damaged(good, f"{len(data) - good} bytes after its last commit")
        return SegmentFacts(path.name, base, committed, _first_epoch(data, base), len(data), commits, ops,
                            len(data) - good), found


def _first_epoch(data: bytes, base: ChainPoint) -> int:
    """The epoch of a segment's first op (its base's while it holds none)."""
    try:
        payload, _ = r.next_record(data, r.HEADER_BYTES)
    except r.RecordError:
        return base.epoch
    return r.parse_op(payload, r.HEADER_BYTES).epoch if payload[0] == r.OP else base.epoch


def _kind(path: Path) -> str:
    return "checkpoint" if path.suffix == r.CHECKPOINT_SUFFIX else "segment"


def _parse_header(path: Path, data: bytes, magic: bytes) -> ChainPoint:
    try:
        return r.parse_header(data, magic)
    except r.RecordError as exc:
        raise _Damage(f"{_kind(path)} {path} is damaged at byte {exc.offset}: {exc.why}") from None


def _header(path: Path, magic: bytes) -> ChainPoint:
    with open(path, "rb") as f:
        return _parse_header(path, f.read(r.HEADER_BYTES), magic)


def _lock_held(lock: Path) -> bool:
    """Whether a process holds `lock` (flock), read from /proc/locks: taking the lock, even shared and for an
    instant, could make a node that starts in that instant refuse its spool."""
    try:
        st = os.stat(lock)
        with open("/proc/locks") as f:
            lines = f.readlines()
    except OSError:
        return False
    want = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    return any(len(fields) > 5 and fields[1] == "FLOCK" and fields[5] == want
               for fields in (line.split() for line in lines))

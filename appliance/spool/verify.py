"""`pairmq spool verify DIR`: read a spool directory and say whether a node could serve from it (docs/spool.md).

Rules:
- Read-only: no lock is taken, nothing is cut, removed or renamed, so it may run beside a node serving
  from the directory. What such a node may be doing at that moment reads as what it is: the last
  segment growing (an unfinished write at its end, which the node would cut off at open if it died
  now), a checkpoint or a segment replaced or dropped while it is read (then: run again).
- It runs the store's own checks (checkpoint.py, segments.py, store.py), with the chain of every commit
  checked, not only of those after the checkpoint: the newest checkpoint whole, each segment's header
  and records, the log reaching back to the checkpoint and holding its point; the state replayed for
  its totals. An unfinished write at the end of the last segment is not a fault.
- The first fault found ends the check: the store's sentence, naming the file and the byte offset.
- Pure of the terminal: `verify(directory)` returns a `Report`; the CLI renders it.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from . import checkpoint as ckpt
from . import records as r
from .chain import GENESIS, ChainPoint
from .segments import SegmentLog
from .state import StateModel
from .store import LOCK_NAME, OLD_LAYOUT, check_on_log, old_layout_sentence, replayer
from ..errors import SpoolCorruption


class NotASpool(ValueError):
    """The path is not a spool directory at all (a usage mistake, not damage)."""


@dataclasses.dataclass(frozen=True, slots=True)
class SegmentFacts:
    name: str
    base: ChainPoint  # the point its first op follows
    last: ChainPoint  # its last committed op's (base while it holds none)
    first_epoch: int  # its first op's (its base's while it holds none)
    bytes: int  # its committed bytes
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
    checkpoints = [CheckpointFacts(p.name, _point_or_none(p), 0, p.stat().st_size, False)
                   for p in checkpoint_paths[:-1]]
    segments: list[SegmentFacts] = []
    base = head = totals = damage = None
    try:
        if old:
            raise SpoolCorruption(old_layout_sentence(directory))
        model, point = StateModel(), GENESIS
        if checkpoint_paths:
            point, ops = ckpt.load(checkpoint_paths[-1], model)
            checkpoints.append(CheckpointFacts(checkpoint_paths[-1].name, point, ops,
                                               checkpoint_paths[-1].stat().st_size, True))
        log = SegmentLog.open(directory, point, replay_after=point.seq, replay=replayer(directory, model),
                              check_all=True)
        segments = [SegmentFacts(s.path.name, s.base, s.last, log.point_at(s.lasts[0]).epoch if s.ends else
                                 s.base.epoch, s.size, s.commits, s.ops, s.unfinished) for s in log.segment_list()]
        base, head = log.base, log.head
        check_on_log(directory, log, point)
        totals = Totals(len(model.sessions), sum(len(s.queue) for s in model.sessions.values()), len(model.retained),
                        len(model.messages), model.stored_bytes)
    except SpoolCorruption as exc:
        damage = str(exc).removesuffix("; refusing to serve from a corrupt spool")
    except FileNotFoundError as exc:
        damage = (f"{exc.filename} went away while it was read (a node serving from this spool replaced it); "
                  "run the check again")
    return Report(directory, _lock_held(directory / LOCK_NAME), tuple(checkpoints), tuple(segments),
                  tuple(sorted(p.name for p in directory.glob("*.new"))), base, head, totals, damage)


def _point_or_none(path: Path) -> ChainPoint | None:
    try:
        return ckpt.read_point(path)
    except SpoolCorruption:
        return None


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

"""The durable spool on disk: the op log's segments and a checkpoint, in one directory (DESIGN §4).

Rules:
- The op log is the store (docs/spool.md): segment files of framed op records in chained commits, appended by
  group commits (segments.py), and checkpoints, the whole state at one point (checkpoint.py). The
  state itself lives in memory (state.py `StateModel`): opening loads the newest checkpoint and
  replays the log after it; each group commit applies its ops once they are durable.
- Opening refuses a spool it cannot trust, with `SpoolCorruption` naming the file and the fault: a
  damaged or foreign segment or checkpoint, a chain that breaks, a log that does not reach back to
  the checkpoint, a checkpoint that is not on the log. A write a crash cut short at the end of the
  last segment is not damage (segments.py says how it is told apart) and is cut off.
- A directory holding the old layout (`spool.db`, SQLite) is refused with one sentence saying what to
  do: `pairmq spool migrate DIR` converts it offline; moved aside, the node starts empty and takes a
  full resync from its mate. Nothing of it is ever deleted here.
- One process at a time: `spool.lock` is held (flock) while a `Spool` is open.
- Threads: the writer thread appends a commit outside `lock`, then applies it under `lock` and moves
  the model's head; readers (`load_state`, `read_commits`, `log_point`...) take it for what they copy.
  A copy of the state (a checkpoint, a full resync's image) names the model's head, never the log's,
  which is ahead of the state while a commit is written and not yet applied. `close` closes the writer
  (after what it holds) first.
- Checkpoints: the writer asks for one when the log since the last one holds more bytes than
  `checkpoint_bytes` or than the stored messages themselves (so a checkpoint costs at most about as
  much writing as the log it replaces), and `close` writes one when the log since the last holds
  anything. After a checkpoint, older checkpoints go, and so do the segments whose every op is both
  in it and older than the last `keep_ops` ops (what an incremental resync may still ask for).
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
from pathlib import Path

from . import checkpoint as ckpt
from . import records as r
from .chain import GENESIS, ChainPoint, Commit
from .codec import decode_op
from .errors import OpCodecError, SpoolLocked
from .segments import SEGMENT_BYTES, SegmentLog, fsync_dir
from .state import DEFAULT_MAX_MESSAGE_IDS, SpoolState, StateModel, check_op
from ..errors import SpoolCorruption
from ..private_files import private_dir

log = logging.getLogger(__name__)
LOCK_NAME = "spool.lock"
OLD_LAYOUT = "spool.db"
CHECKPOINT_BYTES = 64 << 20


class SpoolOldLayout(SpoolCorruption):
    """A spool directory from before the op log became the store (SQLite's spool.db)."""


def old_layout_sentence(directory: Path) -> str:
    return (f"spool {directory} holds the old SQLite layout ({OLD_LAYOUT}), which this version no longer reads: "
            f"convert it with `pairmq spool migrate {directory}` (offline), or move it aside and let this node "
            "take a full resync from its mate")


class Spool:
    """An open, verified spool directory. Reading only: the one writer is `SpoolWriter`."""

    def __init__(self, directory: Path, lock_fd: int, model: StateModel, log_: SegmentLog,
                 checkpoint: ChainPoint) -> None:
        self.path = directory  # named in every sentence about this spool
        self.directory = directory
        self._lock_fd = lock_fd
        self.model = model
        self.log = log_
        self.head = log_.head  # as of opening; the writer's `durable` moves on from here
        self.checkpoint = checkpoint  # the newest checkpoint's point (GENESIS: none)
        self.checkpoint_bytes = CHECKPOINT_BYTES
        self.keep_ops = 100_000  # the writer sets its own: the ops a checkpoint leaves in the log
        self.writer = None  # the one SpoolWriter, which registers itself
        self.lock = threading.RLock()  # the model and the log's end: see the rules
        self._checkpointing = threading.Lock()
        self._closing = threading.Lock()  # not `lock`: the writer thread takes that while close joins it

    @classmethod
    def open(cls, directory: Path | str, *, max_message_ids: int = DEFAULT_MAX_MESSAGE_IDS,
             segment_bytes: int = SEGMENT_BYTES) -> Spool:
        """Open (or create) the spool in `directory` and verify it; `SpoolCorruption` if it cannot be trusted."""
        directory = private_dir(Path(directory))
        lock_fd = os.open(directory / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(lock_fd)
            raise SpoolLocked(f"spool {directory}: another process has it open") from None
        try:
            if (directory / OLD_LAYOUT).exists():
                raise SpoolOldLayout(old_layout_sentence(directory))
            model, log_, point = _recover(directory, max_message_ids, segment_bytes)
        except BaseException:
            os.close(lock_fd)
            raise
        return cls(directory, lock_fd, model, log_, point)

    def close(self, checkpoint: bool = True) -> None:
        """Close the writer (committing what it holds), checkpoint what the log holds since the last one (unless
        `checkpoint` is False: a spool about to be replaced by a full resync's), then let another process have
        the spool."""
        with self._closing:
            if self._lock_fd < 0:
                return
            if self.writer is not None:
                self.writer.close()  # joins the writer thread
            try:
                if checkpoint and self.log.head.seq > self.checkpoint.seq:
                    self.write_checkpoint()
            except OSError as exc:  # a full disk: the next open replays a longer log instead
                log.warning("spool %s: no checkpoint at close: %s", self.path, exc)
            self.log.close()
            os.close(self._lock_fd)
            self._lock_fd = -1

    def __enter__(self) -> Spool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # Reading (any thread).

    def load_state(self) -> SpoolState:
        """Everything the spool holds, for the broker to rebuild from (a copy: the writer goes on)."""
        with self.lock:
            return self.model.state()  # at the model's head (see the rules)

    def log_point(self, seq: int) -> ChainPoint | None:
        """The log's point at op `seq` (the base's for seq == base), or None if no commit of the log ends there."""
        return self.log.point_at(seq)

    def log_base(self) -> ChainPoint:
        """The point the log starts after (it moves on as old segments are dropped)."""
        return self.log.base

    def log_bytes(self, after_seq: int) -> int:
        """The log's bytes after `after_seq` (an incremental resync's size, for its progress)."""
        return self.log.bytes_after(after_seq)

    def read_commits(self, after_seq: int, max_ops: int) -> list[Commit]:
        """The committed commits after op `after_seq`, about `max_ops` ops of them, in order and as written (for the
        mate link's resync); it reads files: call it off the event loop. `LookupError` if the log no longer holds
        them (send a snapshot)."""
        assert max_ops > 0
        return self.log.read_commits(after_seq, max_ops)

    # Checkpoints and compaction.

    def wants_checkpoint(self, stored_bytes: int) -> bool:
        since = self.log.bytes_after(self.checkpoint.seq) if self.log.head.seq > self.checkpoint.seq else 0
        return since > max(self.checkpoint_bytes, stored_bytes)

    def write_checkpoint(self) -> ChainPoint:
        """Checkpoint the state at the log's head, then drop what it made redundant (see the rules)."""
        with self._checkpointing:
            with self.lock:  # a consistent copy (at the model's head); written outside the lock, while commits go on
                state = self.model.state()
            ckpt.write_checkpoint(self.directory, state)
            old, self.checkpoint = self.checkpoint, state.head
            for path in self.directory.glob("*" + r.CHECKPOINT_SUFFIX):
                if path.name != r.checkpoint_name(state.head.seq):
                    path.unlink(missing_ok=True)
            keep_after = min(state.head.seq, self.log.head.seq - self.keep_ops)
            self.log.drop_through(keep_after)
            log.info("spool %s: checkpoint at op %d (the one before was at op %d)", self.path, state.head.seq, old.seq)
            return state.head


def install(checkpoint_path: Path, directory: Path) -> None:
    """Replace everything a closed spool in `directory` holds with the (synced) checkpoint at `checkpoint_path`."""
    directory = Path(directory)
    target = directory / Path(checkpoint_path).name
    # In beside the old files first, under the name a crash's leftover goes by (removed at open): a swap that
    # fails here, the received file gone or on another file system, leaves the old spool whole.
    arriving = target.with_name(target.name + ".new")
    os.replace(checkpoint_path, arriving)
    for path in [*directory.glob("*" + r.SEGMENT_SUFFIX), *directory.glob("*" + r.CHECKPOINT_SUFFIX)]:
        path.unlink()
    os.replace(arriving, target)
    fsync_dir(directory)


def _recover(directory: Path, max_message_ids: int, segment_bytes: int) -> tuple[StateModel, SegmentLog, ChainPoint]:
    for stale in [*directory.glob("*.new")]:
        stale.unlink()  # a checkpoint or segment a crash left unfinished: never in use
    checkpoints = sorted(directory.glob("*" + r.CHECKPOINT_SUFFIX))
    model = StateModel(max_message_ids)
    point = GENESIS
    if checkpoints:
        point, _ = ckpt.load(checkpoints[-1], model)

    log_ = SegmentLog.open(directory, point, replay_after=point.seq, replay=replayer(directory, model),
                           segment_bytes=segment_bytes)
    check_on_log(directory, log_, point)
    model.head = log_.head
    return model, log_, point


def replayer(directory: Path, model: StateModel):
    """Apply one op of the log to `model` at open; `SpoolCorruption` if it does not decode (its CRC held)."""
    def replay(seq: int, body: bytes) -> None:
        try:
            op = decode_op(body)
            check_op(op)
        except (OpCodecError, ValueError) as exc:
            raise SpoolCorruption(f"spool {directory}: op {seq} is malformed ({exc}); refusing to serve from a "
                                  "corrupt spool") from None
        model.apply(seq, op, len(body))
    return replay


def check_on_log(directory: Path, log_: SegmentLog, point: ChainPoint) -> None:
    """`SpoolCorruption` unless the log reaches back to the checkpoint at `point` and holds that very point."""
    base, head = log_.base, log_.head
    if base.seq > point.seq:
        raise SpoolCorruption(f"spool {directory}: its log starts after op {base.seq}, but its checkpoint is at op "
                              f"{point.seq} (ops {point.seq + 1}..{base.seq} are missing); refusing to serve from a "
                              "corrupt spool")
    if head.seq < point.seq:
        raise SpoolCorruption(f"spool {directory}: its log ends at op {head.seq}, before its checkpoint at op "
                              f"{point.seq}; refusing to serve from a corrupt spool")
    if log_.point_at(point.seq) != point:
        raise SpoolCorruption(f"spool {directory}: its checkpoint at op {point.seq} is not on its log (another "
                              "history); refusing to serve from a corrupt spool")

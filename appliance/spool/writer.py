"""The spool's one writer: a thread that group-commits submitted ops (DESIGN §4).

Rules:
- `submit` is called on the caller's thread (the event loop) and never blocks
  on I/O: it encodes the ops and makes them one commit at once (their seqs,
  their records and the commit's chained checksum: chain.py), so the mate link
  can ship its bytes while the local commit runs, and queues it. Its future
  resolves with that commit only after the group commit holding it is durable
  (written and fdatasync'ed: segments.py).
  Futures resolve in seq order; a `concurrent.futures` future's callbacks run
  in the writer thread (keep them short), an asyncio one's on its loop: one
  call_soon_threadsafe settles a whole group commit, and none is made while an
  earlier one still waits on that loop (it settles the later ones too).
- A submission wakes the writer thread only if it waits for work: while it
  commits, what is queued is taken, all of it, once the fdatasync returned.
- The thread drains every queued submission, up to `max_batch_ops` ops or
  `max_batch_bytes`, into ONE group commit: one write and one fdatasync of
  their commits' bytes as they are, then their ops applied to the spool's
  state in memory. A submission is never split.
- The standby's submissions (`submit_commits`) are the active's commits as
  they arrived: their bytes are appended unchanged.
- Bounded: at most `max_pending_ops` ops queued or committing; past that
  `submit` raises `SpoolBusy` (the broker watches `pending_ops` and stops
  reading publishers well before). Stored bodies are bounded by
  `max_spool_bytes`: a submission whose new bodies would pass it (counting
  bodies still in flight, not counting frees until they commit) is refused
  with `SpoolFull` before it gets a seq.
- A full disk fails the whole batch with `SpoolFull`; the write is cut back
  off the segment and so is every submission queued behind it (their commits chained on
  the failed ones): the head returns to the last committed op and the writer
  carries on. None of those ops may be acknowledged; a mate that was shipped
  them holds a divergent unacknowledged tail, which resync discards.
- A rollback starts a new `history` (a number). A submitter whose state was
  built on an older history (the broker core that made ops chained on the
  rolled-back ones) passes the history it was built on and is refused with
  `SpoolFull` until it rebuilds: otherwise a later op of that core could
  commit ahead of the rolled-back earlier ones its clients will resend, and a
  publisher's messages would be stored out of order (docs/reliability.md).
  `fence()` starts a new history without a rollback.
- Any other failure (an I/O error, our own bug) fails everything pending and
  stops the writer: later submissions raise that error.
- Checkpoints (store.py's rules) are written by a thread of their own when the spool asks for one,
  so a commit never waits for a checkpoint; the segments a checkpoint made redundant go then, except
  the last `keep_ops` ops, which an incremental resync may still ask for.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import dataclasses
import logging
import errno
import threading
import time
from collections.abc import Callable

from . import ops as o
from . import records as r
from .chain import ChainPoint, Commit
from .errors import ChainError, SpoolBusy, SpoolFull
from .outgoing import encode_ops
from .received import read_commits
from .state import DEFAULT_MAX_MESSAGE_IDS
from .store import Spool
from ..errors import LocalProtocolError

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, slots=True)
class WriterLimits:
    max_batch_ops: int = 10_000
    max_batch_bytes: int = 8 << 20
    max_pending_ops: int = 100_000
    max_spool_bytes: int = 4 << 30  # stored message bodies (their encoded MessageStored ops)
    keep_ops: int = 100_000  # op log kept for the mate link's incremental resync
    max_message_ids: int = DEFAULT_MAX_MESSAGE_IDS

    def __post_init__(self) -> None:
        assert 0 < self.max_batch_ops <= self.max_pending_ops
        assert self.max_batch_bytes > 0 and self.max_spool_bytes > 0
        assert self.keep_ops > 0


@dataclasses.dataclass(frozen=True, slots=True)
class WriterMetrics:
    commits: int
    ops: int
    submissions: int
    failed_batches: int
    ignored_ops: int  # no-ops by the rules of state.py: a broker bug worth a look
    mean_batch_ops: float
    last_commit_ms: float  # write to fdatasync returned
    max_commit_ms: float
    pending_ops: int
    stored_bytes: int
    durable: ChainPoint


@dataclasses.dataclass(slots=True)
class Submission:
    """What `submit` returns: its commits (ship them to the mate now) and a future resolved with them when durable."""

    commits: tuple[Commit, ...]
    future: concurrent.futures.Future | asyncio.Future
    ops: tuple[o.Op, ...] = ()
    sizes: tuple[int, ...] = ()  # each op's encoded size
    added_bytes: int = 0
    nbytes: int = 0
    nops: int = 0
    loop: asyncio.AbstractEventLoop | None = None


class SpoolWriter:
    """Owns the spool's write connection in a dedicated thread; see the rules above."""

    def __init__(self, spool: Spool, limits: WriterLimits = WriterLimits(), *,
                 on_commit: Callable[[Commit], None] | None = None,
                 on_rollback: Callable[[ChainPoint], None] | None = None,
                 on_commit_seconds: Callable[[float], None] | None = None) -> None:
        assert spool.writer is None, f"spool {spool.path} already has a writer"
        self.spool = spool
        self.limits = limits
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._queue: collections.deque[Submission] = collections.deque()
        self._closing = False
        self._broken: BaseException | None = None
        self._pending_ops = 0
        self._pending_added = 0
        self._commits = self._ops = self._submissions = self._failed = 0
        self._last_ms = self._max_ms = 0.0
        self._ignored = 0
        self.history = 0  # bumped by every rollback and every fence(); see the rules
        self._model = spool.model
        spool.keep_ops = limits.keep_ops
        spool.model.max_message_ids = limits.max_message_ids
        self._stored_bytes = spool.model.stored_bytes
        self.durable = self.head = spool.log.head
        self._checkpointer: threading.Thread | None = None
        self._handoffs = _Handoffs()
        self._idle = False  # the writer thread waits for work (under the lock)
        # The mate link's taps. `on_commit(commit)` runs under the writer's lock on the submitting
        # thread, right after the commit is made, so commits are seen in seq order and can be shipped
        # while the local commit runs; it must not submit. `on_rollback(head)` runs on the writer thread
        # after a failed batch took the head back to `head`.
        self.on_commit = on_commit
        self.on_rollback = on_rollback
        self.on_commit_seconds = on_commit_seconds  # each group commit's write to fdatasync (a histogram), this thread
        self._thread = threading.Thread(target=self._run, name=f"spool-writer {spool.path}", daemon=True)
        self._thread.start()
        spool.writer = self

    # Caller side (any thread).

    @property
    def pending_ops(self) -> int:
        """Ops submitted but not yet durable: the backlog the broker shrinks its windows by."""
        return self._pending_ops

    def submit(self, ops: list[o.Op] | tuple[o.Op, ...], epoch: int, history: int | None = None) -> Submission:
        """Queue `ops`, written in `epoch`, as one commit; the future resolves with (that commit,) once durable.

        Refusals (nothing queued, no seq given): `SpoolBusy`, `SpoolFull` (also when `history` is given and is
        no longer the writer's), `OpCodecError`/ValueError for an op that cannot be encoded or is outside its
        domain, `LocalProtocolError` for an epoch older than the head's.
        """
        return self._submit(ops, epoch, None, concurrent.futures.Future(), history)

    def submit_async(self, ops: list[o.Op] | tuple[o.Op, ...], epoch: int, history: int | None = None) -> Submission:
        """As `submit`, from a coroutine: the future belongs to the running loop and resolves on it."""
        loop = asyncio.get_running_loop()
        return self._submit(ops, epoch, loop, loop.create_future(), history)

    def fence(self) -> int:
        """Start a new history without a rollback: submissions naming an older one are refused from now on."""
        with self._lock:
            self.history += 1
            return self.history

    async def commit(self, ops: list[o.Op] | tuple[o.Op, ...], epoch: int) -> tuple[Commit, ...]:
        """Submit and wait until durable."""
        return await self.submit_async(ops, epoch).future

    def submit_commits(self, commits: list[Commit], loop: asyncio.AbstractEventLoop | None = None, *,
                       chained: bool = False) -> Submission:
        """The standby's path: commits received from the active, appended as they came and applied.

        `ChainError` if they do not follow the head, `RecordError` if a record is malformed, `OpCodecError` if an
        op is, ValueError if an op is outside its domain (state.check_op): all the peer's fault; nothing is queued
        then. `chained`: the caller verified that the commits chain on our head (the mate link's standby end
        does), so their checksums are not computed again here.
        """
        ops, sizes, added = read_commits(commits)
        future = loop.create_future() if loop else concurrent.futures.Future()
        with self._lock:
            self._admit(len(ops), added, None)
            if chained:
                for c in commits:
                    if c.first_seq != self.head.seq + 1:
                        raise ChainError(c.last_seq, f"ops {c.first_seq}..{c.last_seq} do not follow op {self.head.seq}")
                    self.head = c.point
            else:
                self.head = r.verify_chain(commits, self.head)
            sub = Submission(tuple(commits), future, ops, sizes, added, loop=loop)
            self._enqueue(sub)
        if not commits:
            self._handoffs.settle([(sub, (), None)])
        return sub

    def metrics(self) -> WriterMetrics:
        with self._lock:
            return WriterMetrics(self._commits, self._ops, self._submissions, self._failed, self._ignored,
                                 self._ops / self._commits if self._commits else 0.0, self._last_ms, self._max_ms,
                                 self._pending_ops, self._stored_bytes, self.durable)

    def close(self, timeout_s: float = 30.0) -> None:
        """Commit what is queued, then stop the thread and close the connection."""
        with self._lock:
            self._closing = True
            self._wake.notify()
        self._thread.join(timeout_s)
        assert not self._thread.is_alive(), "the spool writer did not stop"
        if self.spool.writer is self:
            self.spool.writer = None

    def __enter__(self) -> SpoolWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _submit(self, ops, epoch: int, loop, future, history: int | None) -> Submission:
        ops = tuple(ops)
        bodies, sizes, added = encode_ops(ops)
        with self._lock:
            if history is not None and history != self.history:
                raise SpoolFull(f"spool {self.spool.path}: these ops were made on history {history}, which a failed "
                                f"commit ended (now {self.history}); refused until the submitter rebuilds")
            self._admit(len(ops), added, epoch)
            commits = (r.make_commit(self.head, epoch, bodies),) if bodies else ()
            sub = Submission(commits, future, ops, sizes, added, loop=loop)
            if commits:
                self.head = commits[0].point
                self._enqueue(sub)
                if self.on_commit is not None:
                    self.on_commit(commits[0])
        if not commits:
            self._handoffs.settle([(sub, (), None)])  # outside the lock: a callback may submit again
        return sub

    def _admit(self, nops: int, added: int, epoch: int | None) -> None:
        """An error if the writer cannot take `nops` ops whose new bodies add `added` bytes; under the lock.

        Nothing has a seq yet, so a refusal leaves no trace.
        """
        if self._broken is not None:
            raise self._broken
        if self._closing:
            raise LocalProtocolError(f"spool {self.spool.path}: the writer is closed")
        if epoch is not None and epoch < self.head.epoch:
            raise LocalProtocolError(f"spool {self.spool.path}: ops of epoch {epoch} after epoch {self.head.epoch}")
        if nops > self.limits.max_batch_ops:
            raise ValueError(f"a submission of {nops} ops is larger than a batch ({self.limits.max_batch_ops})")
        if self._pending_ops + nops > self.limits.max_pending_ops:
            raise SpoolBusy(f"spool {self.spool.path}: {self._pending_ops} ops wait for commit (limit "
                            f"{self.limits.max_pending_ops}); stop reading publishers until commits catch up")
        if added and self._stored_bytes + self._pending_added + added > self.limits.max_spool_bytes:
            raise SpoolFull(f"spool {self.spool.path}: storing {added} more bytes would pass the limit of "
                            f"{self.limits.max_spool_bytes} bytes ({self._stored_bytes} stored, "
                            f"{self._pending_added} in flight); refused, nothing applied")

    def _enqueue(self, sub: Submission) -> None:
        if not sub.commits:
            return
        sub.nbytes = sum(sub.sizes)
        sub.nops = len(sub.ops)
        self._pending_ops += sub.nops
        self._pending_added += sub.added_bytes
        self._submissions += 1
        self._queue.append(sub)
        if self._idle:  # busy, it takes this after its fdatasync without a wake-up
            self._wake.notify()

    # The writer thread.

    def _run(self) -> None:
        while (batch := self._next_batch()) is not None:
            self._commit(batch)
            if self._broken is None:
                self._maybe_checkpoint()
        if self._checkpointer is not None:
            self._checkpointer.join()

    def _next_batch(self) -> list[Submission] | None:
        limits = self.limits
        with self._lock:
            while not self._queue and not self._closing and self._broken is None:
                self._idle = True
                self._wake.wait()
                self._idle = False
            if not self._queue or self._broken is not None:
                return None
            batch, n, nbytes = [], 0, 0
            while self._queue:
                nxt = self._queue[0]
                if batch and (n + nxt.nops > limits.max_batch_ops
                              or nbytes + nxt.nbytes > limits.max_batch_bytes):
                    break
                batch.append(self._queue.popleft())
                n += nxt.nops
                nbytes += nxt.nbytes
            return batch

    def _commit(self, batch: list[Submission]) -> None:
        commits: list[Commit] = []
        for sub in batch:
            commits += sub.commits
        started = time.monotonic()
        try:
            self.spool.log.append(commits)
        except Exception as exc:  # noqa: BLE001 - every failure is reported to the batch's submitters
            self._rollback(batch, exc)
            return
        elapsed_ms = (time.monotonic() - started) * 1000
        if self.on_commit_seconds is not None:
            self.on_commit_seconds(elapsed_ms / 1000)
        model = self._model
        ignored_before = model.ignored
        with self.spool.lock:
            for sub in batch:
                model.apply_all(sub.commits[0].first_seq, sub.ops, sub.sizes)
            model.head = commits[-1].point
        n = sum(sub.nops for sub in batch)
        with self._lock:
            self.durable = commits[-1].point
            self._pending_ops -= n
            self._pending_added -= sum(sub.added_bytes for sub in batch)
            self._stored_bytes = model.stored_bytes
            self._commits += 1
            self._ops += n
            self._ignored += model.ignored - ignored_before
            self._last_ms = elapsed_ms
            self._max_ms = max(self._max_ms, elapsed_ms)
        self._handoffs.settle([(sub, sub.commits, None) for sub in batch])

    def _rollback(self, batch: list[Submission], exc: Exception) -> None:
        full = isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)
        if full:
            error: BaseException = SpoolFull(f"spool {self.spool.path}: the disk is full ({exc}); the batch of "
                                             f"{sum(s.nops for s in batch)} ops was rolled back")
            chained: BaseException = SpoolFull(f"spool {self.spool.path}: the disk is full; an earlier batch these "
                                               "ops chained on was rolled back")
        else:
            log.error("spool %s: commit failed, the writer stops: %r", self.spool.path, exc)
            error = chained = exc
        with self._lock:
            behind = list(self._queue)
            self._queue.clear()
            self.head = self.durable
            self._pending_ops = 0
            self._pending_added = 0
            self._failed += 1
            self.history += 1
            if not full:
                self._broken = error
        if self.on_rollback is not None:
            self.on_rollback(self.durable)
        self._handoffs.settle([(sub, None, error) for sub in batch] + [(sub, None, chained) for sub in behind])

    def _maybe_checkpoint(self) -> None:
        if self._checkpointer is not None and self._checkpointer.is_alive():
            return
        if not self.spool.wants_checkpoint(self._stored_bytes):
            return
        self._checkpointer = threading.Thread(target=self._checkpoint, name=f"spool-checkpoint {self.spool.path}",
                                              daemon=True)
        self._checkpointer.start()

    def _checkpoint(self) -> None:
        try:
            self.spool.write_checkpoint()
        except OSError as exc:  # e.g. a full disk: the log just stays longer; the next commit asks again
            log.warning("spool %s: could not write a checkpoint: %s", self.spool.path, exc)


class _Handoff:
    """Outcomes for one event loop: at most one call_soon_threadsafe waits on that loop at a time, and it
    settles every outcome posted until it runs (a loop slower than the writer is woken once, not per commit)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._lock = threading.Lock()
        self._items: list[tuple[asyncio.Future, object, BaseException | None]] = []

    def post(self, items: list[tuple[asyncio.Future, object, BaseException | None]]) -> None:
        with self._lock:
            scheduled = bool(self._items)
            self._items += items
        if not scheduled:
            try:
                self.loop.call_soon_threadsafe(self._run)
            except RuntimeError:  # the loop is closed: nobody waits any more
                with self._lock:
                    self._items.clear()

    def _run(self) -> None:
        with self._lock:
            items, self._items = self._items, []
        for future, result, error in items:
            if not future.done():
                future.set_exception(error) if error is not None else future.set_result(result)


class _Handoffs:
    """The writer's `_Handoff` per loop (a process has one loop; tests make and close many)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_loop: dict[asyncio.AbstractEventLoop, _Handoff] = {}

    def settle(self, outcomes: list[tuple[Submission, object, BaseException | None]]) -> None:
        """Resolve futures: concurrent ones here, asyncio ones on their loop (see `_Handoff`)."""
        by_loop: dict[asyncio.AbstractEventLoop, list] = {}
        for sub, result, error in outcomes:
            if sub.loop is None:
                if sub.future.set_running_or_notify_cancel():
                    sub.future.set_exception(error) if error is not None else sub.future.set_result(result)
            else:
                by_loop.setdefault(sub.loop, []).append((sub.future, result, error))
        for loop, items in by_loop.items():
            self._for(loop).post(items)

    def _for(self, loop: asyncio.AbstractEventLoop) -> _Handoff:
        with self._lock:
            handoff = self._by_loop.get(loop)
            if handoff is None:
                for old in [lp for lp in self._by_loop if lp.is_closed()]:
                    del self._by_loop[old]
                handoff = self._by_loop[loop] = _Handoff(loop)
            return handoff

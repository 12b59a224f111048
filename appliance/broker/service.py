"""The broker's asyncio adapter: runs the core's effects against sockets and the spool.

Rules:
- Effects run in order. `Persist` hands its ops to the spool writer; its
  `then` effects run in the done-callback of that group commit. Commits finish
  in submission order, so acknowledgements keep the order of the PUBLISHes.
- A commit that fails (a full disk) must not leave the in-memory state ahead
  of the durable one: every client is dropped with 0x97 and the core is
  rebuilt from the spool. Nothing unacknowledged was promised, so nothing
  acknowledged is lost; clients retry.
- The core is rebuilt only from a spool with nothing of the old core's still
  in flight, and the old core writes nothing after the failure: every
  submission names the writer `history` its core was built on, which a
  rollback (or our `fence()` on a refusal) ends. Otherwise a later PUBLISH
  the old core read before it learned of the failure could commit ahead of
  the rolled-back earlier ones its publisher resends (a QoS 2 stream
  reordered when the disk fills; docs/reliability.md).
- Persists are coalesced: those made while one event-loop callback runs (one
  read of a socket, one commit's callbacks) go to the writer as ONE submission
  at the end of that callback (`call_soon`), at most `max_batch_ops` ops each;
  their `then` effects run in order once it is durable. Commits still finish
  in submission order, so nothing overtakes an earlier Persist. Just before
  that submission the core's `flush` runs: the acks and pumps of the callback.
- Ops nobody waits for (a `Persist` without `then`: a subscriber's acks, the
  in-flight marks of QoS 1 sends, rule 5 of docs/broker.md) are held back up
  to DEFER_MS and ride in the next submission that someone waits for. Why: a
  commit of those alone, started just before a publisher's next PUBLISHes
  arrive, made those wait a whole extra commit (fsync) on both nodes, and the
  durable QoS 1 stream paid two or three commits per window, not one. Order is
  kept (they go first in that submission). Losing them to a crash is what
  rule 5 already allows (a redelivery). They are submitted at DEFER_MS, by a
  handover's drain (`submit_deferred`) and at a stop while serving; at
  DEFER_MS a node that no longer serves drops them instead: its core is
  rebuilt from the spool before it serves again, and its spool may be the
  mate link's to write by then. Their message events are written when they
  are made, not when submitted (docs/events.md: a delivery's time is when
  it was sent); `message_spooled` still waits for the commit.
- Sends are coalesced too: the packets for one connection during one callback
  go out in one write at its end (a Close writes what was before it first).
- With a standby (`release`, docs/mate_link.md), the effects behind a commit
  also wait for the release rule (the standby's ack, or its lease surely over),
  in commit order; `release_held` runs what it allows, called by the mate
  link the moment the standby acknowledges.
- Writes never wait for the socket to drain here; the listener stops reading a
  client whose output backs up or whose in-flight window is full. `packet`
  returns a future that resolves once the effects it queued behind a commit
  have run, which is what the window counts. The packets of one callback share
  one future, resolved behind the last of their effects (one future per read,
  not per PUBLISH). With `observe_ack`, each packet that waits is stamped when
  read and observed when that future resolves (its acks went out with it), the
  batch in one call.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Callable, Final, Protocol

from ..clock import wall_ms
from ..mqtt.overload import MateBackpressure
from ..mqtt.wire import ReasonCode as RC
from ..spool.errors import SpoolBusy, SpoolFull
from ..spool.local import LocalSpool
from ..spool.store import Spool
from ..spool.writer import SpoolWriter, WriterLimits
from .core import BrokerCore, restore
from .effects import Close, Connacked, Durable, Persist, Send
from .message_events import MessageEvents

log = logging.getLogger("pairmq.broker")
TICK_S = 1.0
DEFER_MS = 100  # the longest an op nobody waits for is held back (see the rules)


def writer_limits(max_message_ids: int, spool_max_bytes: int | None = None) -> WriterLimits:
    """The spool writer's limits for a core with these: the spool keeps as many message ids as the core (the
    same ones: both evict the oldest accepted)."""
    limits = WriterLimits(max_message_ids=max_message_ids)
    if spool_max_bytes is not None:
        # The core refuses publishes (0x97) at spool_max_bytes by its own count, which frees a body at once;
        # the writer frees only at commit. Its limit is a backstop above, for what is still in flight.
        limits = dataclasses.replace(limits, max_spool_bytes=spool_max_bytes + spool_max_bytes // 4 + (8 << 20))
    return limits


class ReleaseRule(Protocol):
    """May the effects behind the commit ending at op `seq` run now (docs/mate_link.md)?"""

    def allows(self, seq: int) -> bool: ...


class _Resolve:
    """The adapter's own effect: resolve `packet()`'s future once the effects before it have run; `waiting`
    packets waited on it, all handed over by one callback (one read) that began at `read_at` (perf_counter): the
    publish-to-ack histogram's start."""

    future: Final[asyncio.Future[None]]
    read_at: Final[float]
    waiting: Final[int]

    def __init__(self, future: asyncio.Future[None], read_at: float = 0.0, waiting: int = 0) -> None:
        self.future = future
        self.read_at = read_at
        self.waiting = waiting


class BrokerService:
    """`local`: the node's spool and writer (shared with the mate link). `release`: the release rule, None
    without a standby (effects run at local durability). `serving()`: whether this node serves now; session
    expiry, delayed wills and message expiry run only then (a standby expiring sessions or publishing wills
    from its stale core would write its own ops into its spool). `mate_over_lag()`: the live mate link's
    unacknowledged backlog is over max_lag (appliance/mqtt/overload.py: the listener stops reading
    publishers meanwhile). `message_events`: set when the node logs them."""

    def __init__(self, local: LocalSpool, *, epoch: Callable[[], int], node_name: str = "pairmq",
                 core_factory: Callable[[], BrokerCore] | None = None, defer_ms: int = DEFER_MS,
                 release: ReleaseRule | None = None, serving: Callable[[], bool] = lambda: True,
                 mate_over_lag: Callable[[], bool] = lambda: False,
                 message_events: MessageEvents | None = None,
                 observe_ack: Callable[[float, int], None] | None = None) -> None:
        self.local = local
        self._observe_ack = observe_ack  # (seconds from a read to its packets' effects, how many): a batch a call
        self._read_at = 0.0  # when this callback handed over its first packet that waits
        self._waiting = 0  # how many of its packets wait
        self._core_factory: Callable[[], BrokerCore] = core_factory or (lambda: BrokerCore(node_name=node_name))
        self._history = self.writer.history  # the writer history self.core will be built on (see the rules)
        self.core = self._fresh_core()
        self._rebuild_waits = False  # a rebuild waits for the old core's last submission to settle
        self._epoch = epoch
        self.conns: dict[int, Any] = {}  # the listener's connections (mqtt/connection.py)
        self._next_conn = 0
        self._tick_task: asyncio.Task[None] | None = None
        self.commit_failures = 0
        self._ops: list[Any] = []  # ops of the Persists not yet submitted (see the rules)
        self._thens: list[tuple[Any, ...]] = []  # their `then` tuples, in order
        self._flush_scheduled = False
        self._defer_ms = defer_ms
        self._defer_timer: asyncio.TimerHandle | None = None  # armed while held-back ops wait (see the rules)
        self.deferred_submissions = 0  # submissions of held-back ops alone, at DEFER_MS or a drain
        self._evented = 0  # how many of `_ops` already went to message_events (held back ones)
        self._held_future: asyncio.Future[Any] | None = None  # their commit, as message_events sees it
        self._last: asyncio.Future[Any] | None = None  # the latest submission's future
        self._out: dict[int, list[Any]] = {}  # conn id -> packets to write at the end of this callback (in order)
        self._batch_done: asyncio.Future[None] | None = None  # what `packet` returned during this callback
        self._release = release
        self.serving = serving
        # (last op seq, then, core): what the rule holds
        self._held: collections.deque[tuple[int, tuple[Any, ...], BrokerCore]] = collections.deque()
        self.released_seq = 0  # the last op whose effects ran: what a re-admitted standby must hold
        self.mate_over_lag = mate_over_lag
        self.backpressure = MateBackpressure()  # its counters are this service's view's
        self.message_events = message_events
        self._loop_cache: asyncio.AbstractEventLoop | None = None  # see `_loop`

    def _loop(self) -> asyncio.AbstractEventLoop:
        """The running loop, asked once: on Python 3.11 each get_running_loop() is a getpid() system call, and
        this runs on every read. A closed one (the service outlived an asyncio.run) is asked again."""
        loop = self._loop_cache
        if loop is None or loop.is_closed():
            loop = self._loop_cache = asyncio.get_running_loop()
        return loop

    @classmethod
    def open(cls, spool_dir: Path, *, spool_max_bytes: int | None = None,
             on_lost: Callable[[str], None] | None = None, **kw: Any) -> BrokerService:
        """A service on a spool of its own (tests, tools); a node's wiring makes the LocalSpool itself."""
        factory: Callable[[], BrokerCore] = kw.get("core_factory") or (
            lambda: BrokerCore(node_name=kw.get("node_name", "pairmq")))
        limits = writer_limits(factory().limits.max_message_ids, spool_max_bytes)
        return cls(LocalSpool(spool_dir, limits, on_lost=on_lost), **kw)

    @property
    def spool(self) -> Spool:
        return self.local.spool

    @property
    def writer(self) -> SpoolWriter:
        return self.local.writer

    def _fresh_core(self) -> BrokerCore:
        """A core restored from the spool; the caller sets `_history` to the writer's, read before this."""
        core = self._core_factory()
        restore(core, self.spool.load_state(), wall_ms())
        return core

    def set_limits(self, limits: Any) -> None:
        """New limits (config-sync) on the core now; a rebuilt core gets them from the core factory."""
        self.core.limits = limits
        self.core.router.limits = limits

    async def start(self) -> None:
        self._loop_cache = asyncio.get_running_loop()
        self._tick_task = self._loop_cache.create_task(self._ticks())

    async def stop(self) -> None:
        if self._tick_task:
            self._tick_task.cancel()
        if self.serving():
            self.submit_deferred()
        self.spool.close()

    async def _ticks(self) -> None:
        while True:
            await asyncio.sleep(TICK_S)
            if self.serving():  # a standby's core is inert: its spool is the mate link's to write
                self.execute(self.core.tick(wall_ms()))

    # --- called by the listener's connections ---------------------------------------------

    def connect(self, conn: Any, packet: Any, username: str | None = None) -> int:
        self._next_conn += 1
        conn_id = self._next_conn
        self.conns[conn_id] = conn
        self.execute(self.core.connect(conn_id, packet, wall_ms(), username=username))
        return conn_id

    def client_id(self, conn_id: int) -> str | None:
        """The client id the core gave `conn_id` (assigned when its CONNECT had none); None once it is gone."""
        conn = self.core.connections.get(conn_id)
        return conn.client_id if conn is not None else None

    def packet(self, conn_id: int, packet: Any) -> asyncio.Future[None] | None:
        """Run the packet's effects. Returns a future that resolves once those waiting for a commit have run,
        or None when nothing waits: the listener's in-flight window counts the packet until then."""
        if conn_id not in self.core.connections:
            return None
        ops_before, thens_before = len(self._ops), len(self._thens)
        self.execute(self.core.packet(conn_id, packet, wall_ms()))
        if not self._flush_scheduled:
            self._schedule()  # acks leave work for the core's flush
        if len(self._ops) == ops_before and len(self._thens) == thens_before:
            return None
        if not self._waiting and self._observe_ack is not None:
            self._read_at = time.perf_counter()
        self._waiting += 1
        # One future for every packet of this callback that waits (see the rules): `_end_of_callback` queues
        # its `_Resolve` behind all of their effects, so it resolves once the last of them has run.
        done = self._batch_done
        if done is None:
            done = self._batch_done = self._loop().create_future()
        return done

    def lost(self, conn_id: int, disconnect: Any = None) -> None:
        self.conns.pop(conn_id, None)
        if conn_id in self.core.connections:
            self.execute(self.core.connection_lost(conn_id, wall_ms(), disconnect=disconnect))

    # --- effects ---------------------------------------------------------------------------

    def execute(self, effects: Iterable[Any]) -> None:
        for effect in effects:
            # No subclasses of the effects: `type(...) is` tests, the most frequent first (compiled, each also
            # narrows `effect`, so its fields are read natively).
            if type(effect) is Send:
                out = self._out.get(effect.conn)
                if out is None:
                    self._out[effect.conn] = [effect.packet]
                    self._schedule()
                else:
                    out.append(effect.packet)
            elif type(effect) is Persist:
                self._persist(effect)
            elif type(effect) is _Resolve:
                if not effect.future.done():
                    effect.future.set_result(None)
                if effect.waiting and self._observe_ack is not None:  # read_at is stamped only with it
                    self._observe_ack(time.perf_counter() - effect.read_at, effect.waiting)
            elif type(effect) is Close:
                self._write(effect.conn, self._out.pop(effect.conn, None))  # what it was sent goes out first
                conn = self.conns.pop(effect.conn, None)
                if conn is not None:
                    conn.close_with(effect.reason_code, effect.reason)
                if effect.conn in self.core.connections:
                    self.execute(self.core.connection_lost(effect.conn, wall_ms()))
            elif type(effect) is Durable:
                self.execute(self.core.durable(effect, wall_ms()))
            elif type(effect) is Connacked:
                self.execute(self.core.connacked(effect, wall_ms()))
            else:
                raise AssertionError(f"unknown effect {effect!r}")

    def _persist(self, effect: Persist) -> None:
        if not effect.ops:
            self._after_earlier(effect.then)
            return
        limit = self.writer.limits.max_batch_ops
        ops = effect.ops
        if len(self._ops) + len(ops) > limit:
            self._flush()
        # One effect past a commit's bound (a SUBSCRIBE matching that many retained messages) goes in slices,
        # in order: its `then` rides with the last, which commits after every earlier one.
        while len(ops) > limit:
            self._ops += ops[:limit]
            ops = ops[limit:]
            self._flush()
        self._ops += ops
        if effect.then:
            self._thens.append(effect.then)
        self._schedule()

    def _schedule(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop().call_soon(self._end_of_callback)

    def _end_of_callback(self) -> None:
        self._flush_scheduled = False
        self.execute(self.core.flush(wall_ms()))
        if self._batch_done is not None:
            resolve, self._batch_done = (_Resolve(self._batch_done, self._read_at, self._waiting),), None
            self._waiting = 0
            if self._ops:
                self._thens.append(resolve)
            else:  # a batch split at max_batch_ops submitted them all already: wait behind that submission
                self._after_earlier(resolve)
        if self._thens:
            self._flush()
        elif self._ops:
            if self._defer_timer is None:
                self._defer_timer = self._loop().call_later(self._defer_ms / 1000, self._deferred_due)
            self._events_of_held()
        out, self._out = self._out, {}
        for conn_id, packets in out.items():
            self._write(conn_id, packets)

    def _write(self, conn_id: int, packets: list[Any] | None) -> None:
        conn = self.conns.get(conn_id)
        if conn is None or not packets:
            return
        send_many = getattr(conn, "send_many", None)  # one write; a connection without it gets one per packet
        if send_many is not None:
            send_many(packets)
        else:
            for packet in packets:
                conn.send_nowait(packet)

    def _deferred_due(self) -> None:
        self._defer_timer = None
        if self._ops and not self._thens:
            if self.serving():
                self.deferred_submissions += 1
                self._flush()
            else:
                self._discard_ops()  # see the rules: this core is rebuilt before the node serves again

    def _events_of_held(self) -> None:
        """Message events of the ops held back since the last call, now (see the rules)."""
        if self.message_events is None or self._evented == len(self._ops):
            return
        if self._held_future is None:
            self._held_future = self._loop().create_future()
        self.message_events.submitted(self._ops[self._evented:], self._epoch(), self._held_future)
        self._evented = len(self._ops)

    def _discard_ops(self) -> None:
        """Forget the ops not submitted (and their effects): they belong to a core that is being replaced."""
        self._ops, self._thens, self._evented = [], [], 0
        self._batch_done = None  # as its packets' effects: never run (their connections are dropped)
        self._waiting = 0
        if self._held_future is not None:
            self._held_future.cancel()  # their message_spooled events never come
            self._held_future = None

    @property
    def deferred_ops(self) -> int:
        """Ops held back now: made, not yet handed to the writer, nobody waiting for them (see the rules)."""
        return 0 if self._thens else len(self._ops)

    def submit_deferred(self) -> None:
        """Submit the ops held back now. A handover's drain calls it (the node's gate is closed then, but it is
        still the active and the mate must get every op), as does a stop while serving."""
        if self._ops:
            self.deferred_submissions += not self._thens
            self._flush()

    def _flush(self) -> None:
        if self._defer_timer is not None:
            self._defer_timer.cancel()
            self._defer_timer = None
        if not self._ops:
            return
        op_list, thens, evented, held_future = self._ops, self._thens, self._evented, self._held_future
        self._ops, self._thens, self._evented, self._held_future = [], [], 0, None
        epoch = self._epoch()
        try:
            submission = self.writer.submit_async(op_list, epoch, history=self._history)
        except (SpoolFull, SpoolBusy) as exc:
            if held_future is not None:
                held_future.cancel()
            self._commit_failed(exc)
            return
        core = self.core
        then = thens[0] if len(thens) == 1 else tuple([e for t in thens for e in t])
        future: asyncio.Future[Any] = submission.future  # type: ignore[assignment]  # submit_async's: the loop's
        future.add_done_callback(lambda fut: self._committed(fut, then, core))
        if held_future is not None:
            target = held_future
            future.add_done_callback(lambda fut: _copy_outcome(fut, target))
        if self.message_events is not None and evented < len(op_list):  # docs/events.md: read off the ops
            self.message_events.submitted(op_list[evented:], epoch, future)
        self._last = future

    def _after_earlier(self, then: tuple[Any, ...]) -> None:
        """A Persist without ops: its effects still wait behind every earlier Persist (e.g. a 3.1.1
        publisher's refusal closes the connection only after the PUBACKs of what it published before)."""
        if self._ops:
            self._thens.append(then)  # now someone waits for the ops held back: submit them at the end of this callback
            self._schedule()
        elif self._last is not None and not self._last.done():
            core = self.core
            self._last.add_done_callback(lambda fut: self._committed(fut, then, core))
        elif self._held:
            self._held.append((self._held[-1][0], then, self.core))  # behind what the release rule holds
        else:
            self.execute(then)

    def _committed(self, fut: asyncio.Future[Any], then: tuple[Any, ...], core: BrokerCore) -> None:
        exc = fut.exception()  # read even when ignored: asyncio logs an unread one ("never retrieved")
        if core is not self.core:
            return  # the core was rebuilt after a failed commit: these effects belong to the old one
        if exc is not None:
            self._commit_failed(exc)
            return
        commits = fut.result()
        seq = commits[-1].last_seq if commits else self.writer.durable.seq
        if self._held or (self._release is not None and not self._release.allows(seq)):
            self._held.append((seq, then, core))
            return
        self.released_seq = max(self.released_seq, seq)
        self.execute(then)
        self._schedule()  # Durable effects leave pumps for the core's flush

    def release_held(self) -> int:
        """The release rule may allow more now (the standby acknowledged, or its lease ran out): run it, in
        commit order. Returns how many commits' effects ran."""
        if self.message_events is not None:
            self.message_events.check_replicated()
        ran = 0
        while self._held and (self._release is None or self._release.allows(self._held[0][0])):
            seq, then, core = self._held.popleft()
            self.released_seq = max(self.released_seq, seq)
            if core is self.core:
                self.execute(then)
                ran += 1
        if ran:
            self._schedule()
        return ran

    @property
    def held_commits(self) -> int:
        return len(self._held)

    # --- taking activity: the core is rebuilt from the spool the mate link kept ------------------------

    async def rebuild_core_off_loop(self) -> None:
        """`rebuild_core`, with the spool read and the new core restored in a worker thread: a big spool
        (seconds of work) must not stall the event loop, whose stamps prove to the quorum
        that this node is alive (R6); nothing else touches the new core until it is swapped in."""
        history = self.writer.history  # read before the spool: a rollback after it costs one more rebuild
        state = await asyncio.to_thread(self.spool.load_state)
        core = self._core_factory()
        await asyncio.to_thread(restore, core, state, wall_ms())
        core.counters, core.outcomes = self.core.counters, self.core.outcomes
        self._held.clear()
        self._discard_ops()  # held back by the old core (see the rules)
        self.conns.clear()
        self.core, self._history, self._rebuild_waits = core, history, False

    def rebuild_core(self) -> None:
        """Taking activity: the core is rebuilt from the spool the mate link kept (no connection survives)."""
        counters, outcomes = self.core.counters, self.core.outcomes
        self._held.clear()
        self._discard_ops()  # held back by the old core (see the rules)
        self.conns.clear()
        self._history, self._rebuild_waits = self.writer.history, False
        self.core = self._fresh_core()
        self.core.counters, self.core.outcomes = counters, outcomes

    def _commit_failed(self, exc: BaseException) -> None:
        self._discard_ops()  # they belong to the core being replaced
        self.commit_failures += 1
        if not self._rebuild_waits:  # one line per failure, not one per refused submission while it waits
            log.error("spool commit failed (%s): dropping every client and rebuilding from the spool", exc)
        self._drop_clients(f"the message spool cannot take more: {exc}")
        last = self._last
        if last is not None and not last.done():
            # A refusal at submission (SpoolBusy, the writer's byte limit) while earlier ops of this core are
            # still in flight: they may yet commit, so the spool is not final. Fence the writer (this core's
            # `_history` is then refused) and rebuild once the last of them settled.
            self.writer.fence()
            if not self._rebuild_waits:
                self._rebuild_waits = True
                last.add_done_callback(self._rebuild_when_settled)
            return
        self._rebuild_after_failure()

    def _rebuild_when_settled(self, _fut: asyncio.Future[Any]) -> None:
        if self._rebuild_waits:
            self._rebuild_after_failure()

    def _drop_clients(self, why: str) -> None:
        for conn_id, conn in list(self.conns.items()):
            conn.close_with(RC.QUOTA_EXCEEDED, why)
        self.conns.clear()

    def _rebuild_after_failure(self) -> None:
        self._rebuild_waits = False
        self._drop_clients("the message spool could not take more; reconnect")  # any that came while we waited
        counters, outcomes = self.core.counters, self.core.outcomes
        self._history = self.writer.history
        self.core = self._fresh_core()
        self.core.counters, self.core.outcomes = counters, outcomes  # what was counted so far stays counted

    # --- the management API's view -----------------------------------------------------------

    def view(self) -> dict[str, Any]:
        core, m = self.core, self.writer.metrics()
        return {
            "limits": {"session_queue_max_messages": core.limits.max_queued_messages,
                       "session_queue_max_bytes": core.limits.max_queued_bytes,
                       "spool_max_bytes": core.limits.max_spool_bytes},
            "counters": {"publish_refused_queue_full": 0, "publish_refused_spool_full": 0, **core.counters,
                         "commit_failures": self.commit_failures,
                         "delivery_withheld_not_authorized": core.router.withheld},
            "sessions": len(core.sessions),
            "queued_messages": sum(len(s.queue) for s in core.sessions.values()),
            "stored_bytes": core.router.stored_bytes,
            "writer": {"commits": m.commits, "submissions": m.submissions, "ops": m.ops,
                       "mean_batch_ops": round(m.mean_batch_ops, 1), "deferred_ops": self.deferred_ops,
                       "deferred_submissions": self.deferred_submissions,
                       "last_commit_ms": round(m.last_commit_ms, 3), "max_commit_ms": round(m.max_commit_ms, 3),
                       "pending_ops": m.pending_ops, "stored_bytes": m.stored_bytes,
                       "failed_batches": m.failed_batches,
                       "durable_seq": m.durable.seq},
            "message_ids": len(core.message_ids),
            "mate_backpressure": self.backpressure.view(),
        }


def _copy_outcome(source: asyncio.Future[Any], target: asyncio.Future[Any]) -> None:
    """The held-back ops' commit, for message_events: a failure is a cancel (no exception left unread)."""
    if target.done():
        return
    if source.cancelled() or source.exception() is not None:
        target.cancel()
    else:
        target.set_result(source.result())

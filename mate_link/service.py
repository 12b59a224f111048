"""The mate link on a node: the active's server and the standby's dialler around the sans-I/O ends.

Rules:
- The active listens on TCP 8301 (its node address). A link is accepted only while the node may
  serve (`may_serve()`, asked again once the handshake is done); a newer link from the standby
  replaces an older one. Every op the spool writer gives a seq is handed to the link at once; what
  the commits of one loop turn make to send goes out in one drain on the next (one socket send).
- The standby dials the active it knows of (`active_address()`), retrying every `redial_s`, and
  applies what it receives through its own writer: commits via `submit_commits`, a snapshot via
  `SnapshotBuilder` and a swap of its spool files (`LocalSpool.replace_spool`). Both ends reach the
  node's spool and writer through the LocalSpool the node's wiring hands them.
- The standby hands each OPS frame's commits to its writer as the frame is read, unless something is
  queued ahead of them (a snapshot's batches, or more than PIPELINE_MAX_OPS not yet durable): then they
  wait their turn in order. It acknowledges from the writer's settled futures, in order: one ACK for
  all that one group commit made durable, never an op not yet durable.
- Log reads, snapshot builds and snapshot batches run in a worker thread; the event loop only
  moves bytes and drives the two ends' state machines.
- A full resync ships the spool's image (spool/image.py): a checkpoint of the active's state written
  for it in a worker thread, then streamed in IMAGE
  pieces, never more than IMAGE_UNSENT_MAX queued unsealed (no round trip per piece); the standby
  writes each piece in a worker thread as it arrives and checks the whole (size, SHA-256, the
  checkpoint's header and point) before it swaps it in; the active reads the image back
  while it streams it and sends IMAGE_END only if they passed. A refused image is logged, counted
  (`bad_image`, on the side that refused it) and the link closes; the standby's spool is untouched. The standby stops reading while more than
  IMAGE_QUEUED_MAX_BYTES of pieces wait to be written (bounded memory; TCP holds the active back),
  and a piece written counts as hearing from the active: the silence is ours then, not the active's.
- A thread cannot be cancelled: when the standby's link ends (or the node stops it to take over) while
  a snapshot batch, its finish or the spool swap runs in a thread, we wait for that thread before
  anything else touches the builder or the spool (`_in_thread`, `_wait_out`): abandoning the builder
  under a running batch would close its file under it (tests/processes/test_snapshot_storm.py).
- A `LinkFault`, a bad frame or silence past the link timeout closes the link; the standby dials
  again and resyncs from its head. Nothing here decides activity: the quorum core reads
  `caught_up(now)` (MateSync's input) and the broker reads `acked_seq` (what it may release); every
  acknowledgement that moves `acked_seq` calls `on_acked` at once, on the event loop.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import logging
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

from pairmq.appliance.clock import now_ms
from pairmq.appliance.errors import RemoteProtocolError, SpoolCorruption
from pairmq.appliance.roles import Role
from pairmq.appliance.spool.chain import ChainPoint, Commit
from pairmq.appliance.spool.errors import ChainError
from pairmq.appliance.spool.image import ImageReceiver, ImageRefused, SpoolImage, image_dir
from pairmq.appliance.spool.install import SnapshotBuilder
from pairmq.appliance.spool.local import LocalSpool
from pairmq.appliance.spool.writer import Submission

from .active import ActiveLink, LinkFault, LinkLimits, MakeSnapshot, PlanNeeded, ReadCommits
from .messages import Catchup, Message, Pong
from .resync import plan_resync
from .secure import ActiveHandshake, StandbyHandshake
from .standby import Apply, ImageChunk, ImageDone, SnapshotBatch, SnapshotDone, StandbyLink
from .transport import LinkCounters, MateConnection

log = logging.getLogger("pairmq.mate_link")
TICK_S = 0.05
STOP_RETRY_S = 0.1
PIPELINE_MAX_OPS = 20_000  # a standby's ops handed to its writer and not yet durable
IMAGE_PIECE_BYTES = 1 << 20  # one IMAGE message
IMAGE_UNSENT_MAX = 16  # IMAGE messages queued and not yet sealed: the active queues no more
IMAGE_WAIT_S = 0.002
IMAGE_QUEUED_MAX_BYTES = 32 << 20  # a standby's IMAGE pieces received, not yet written: past it, it stops reading
CATCHUP_SWITCH_S = 0.0005  # a standby's GIL switch interval while it catches up (see _catching_up)


_usual_switch_s: float | None = None  # the process's GIL switch interval outside a catch-up


def _catching_up(yes: bool) -> None:
    """A standby's catch-up runs with a short GIL switch interval (CATCHUP_SWITCH_S), the rest of the time with
    the process's usual one. Its event loop (decoding, verifying) and its spool writer (SQLite, which gives the GIL
    up at each statement) then trade the GIL often, so the writer does not wait out the loop's whole interval to
    take it back after each statement (docs/benchmarks.md, "Replication"). Process-wide, so only while the node
    is a standby catching up: on an active, a short interval costs QoS 1 throughput (appliance/node/process.py)."""
    global _usual_switch_s
    if yes and _usual_switch_s is None:
        _usual_switch_s = sys.getswitchinterval()
        sys.setswitchinterval(CATCHUP_SWITCH_S)
    elif not yes and _usual_switch_s is not None:
        sys.setswitchinterval(_usual_switch_s)
        _usual_switch_s = None


async def _wait_out(aw):
    """Await `aw` to its end even if we are cancelled meanwhile, then pass the cancellation on."""
    fut = asyncio.ensure_future(aw)
    cancelled = False
    while not fut.done():
        try:
            await asyncio.wait({fut})  # unlike `await fut`, a cancel of ours does not reach `fut`
        except asyncio.CancelledError:
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError
    return fut.result()


async def _in_thread(fn, *args, undo: Callable[[object], None] | None = None):
    """`fn(*args)` in a worker thread; if we are cancelled meanwhile, only once the thread is done (see the
    rules), and then `undo` what it returned, since nobody takes it."""
    fut = asyncio.ensure_future(asyncio.to_thread(fn, *args))
    try:
        return await _wait_out(fut)
    except asyncio.CancelledError:
        if undo is not None and not fut.cancelled() and fut.exception() is None:
            undo(fut.result())
        raise


class _Replication:
    """What both ends' adapters share: the live link, its connection, counters and the tick."""

    link: ActiveLink | StandbyLink | None
    conn: MateConnection | None
    counters: LinkCounters

    async def _ticks(self) -> None:
        """Pings go out and silence past the link timeout closes the link."""
        while True:
            await asyncio.sleep(TICK_S)
            if self.link is not None and not self.conn.closed:
                try:
                    self.link.handle_timer(now_ms())
                except RemoteProtocolError as exc:
                    self.counters["timeout"] += 1
                    self.conn.close(str(exc))
                    continue
                self._drain()

    def _drain(self) -> None:
        raise NotImplementedError


class ActiveReplication(_Replication):
    def __init__(self, *, secret: bytes, group: str, me: Role, spool: LocalSpool, epoch: Callable[[], int],
                 may_serve: Callable[[], bool], limits: LinkLimits = LinkLimits(),
                 on_acked: Callable[[int], None] = lambda seq: None,
                 on_round_trip: Callable[[float], None] = lambda seconds: None) -> None:
        self._secret, self._group, self._me = secret, group, me
        self._on_round_trip = on_round_trip  # each PONG's round trip in seconds (a metrics histogram)
        self.local = spool
        self._epoch = epoch
        self._may_serve = may_serve
        self.limits = limits
        self._on_acked = on_acked
        self.counters = LinkCounters()
        self.link: ActiveLink | None = None
        self.conn: MateConnection | None = None
        self._server: asyncio.Server | None = None
        self._ticker: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._imaging: asyncio.Lock | None = None  # one spool image at a time (they share a directory)
        self._drain_pending = False  # a drain for new commits is queued on the loop
        self.links_made = 0

    async def start(self, host: str, port: int) -> None:
        self._loop = asyncio.get_running_loop()
        self._imaging = asyncio.Lock()
        self.local.tap(self._on_commit, lambda head: self._loop.call_soon_threadsafe(self._rolled_back, head))
        self._server = await self._loop.create_server(self._new_connection, host, port, reuse_address=True)
        self._ticker = self._loop.create_task(self._ticks())

    @property
    def bound_port(self) -> int:
        return self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._ticker:
            self._ticker.cancel()
        if self.conn:
            self.conn.close("node stopping")
        if self._server:
            self._server.close()
        self.local.tap(None, None)

    # --- views ---------------------------------------------------------------------------

    def caught_up(self, now: int) -> bool:
        return not self.behind(now)

    def behind(self, now: int) -> str:
        """Why the standby is not caught up ("" if it is): ActiveLink.behind, or no live session."""
        if self.link is None or self.conn is None or self.conn.closed:
            return "is not connected on the mate link"
        return self.link.behind(now)

    def caught_up_now(self) -> bool:
        return self.caught_up(now_ms())

    @property
    def acked_seq(self) -> int:
        return self.link.acked_seq if self.link is not None else 0

    @property
    def over_max_lag(self) -> bool:
        return self.link is not None and not self.conn.closed and self.link.over_max_lag

    # --- connections ----------------------------------------------------------------------

    def _new_connection(self) -> MateConnection:
        return MateConnection(ActiveHandshake(self._secret, self._group, self._me, os.urandom(32)),
                              counters=self.counters, on_established=self._established,
                              on_message=self._message, on_closed=self._closed)

    def _established(self, conn: MateConnection) -> None:
        if not self._may_serve():
            conn.close("this node is not active")
            return
        if self.conn is not None:
            self.conn.close("replaced by a newer link from the standby")
        self.conn = conn
        self.link = ActiveLink(self._epoch(), self.local.writer.head, now_ms(), self.limits)
        self.links_made += 1
        log.info("mate link up with %s (epoch %d)", conn.peer, self.link.epoch)

    def _message(self, conn: MateConnection, m: Message) -> None:
        if conn is not self.conn:
            return
        before = self.link.acked_seq
        self.link.receive(m, now_ms())
        if self.link.acked_seq > before:
            self._on_acked(self.link.acked_seq)
        elif type(m) is Pong and self.link.round_trip_ms is not None:
            self._on_round_trip(self.link.round_trip_ms / 1000)
        self._drain()

    def _closed(self, conn: MateConnection, why: str) -> None:
        if conn is self.conn:
            log.warning("mate link with %s down: %s", conn.peer, why)

    def _on_commit(self, commit: Commit) -> None:
        if self.link is not None and not self.conn.closed:
            self.link.local_submitted(commit)
            if not self._drain_pending:  # under the writer's lock now: send from the loop's next turn, once
                self._drain_pending = True  # for every commit made before it runs
                self._loop.call_soon(self._drain_commits)

    def _drain_commits(self) -> None:
        self._drain_pending = False
        self._drain()

    def _rolled_back(self, head: ChainPoint) -> None:
        if self.link is not None and not self.conn.closed:
            try:
                self.link.local_rolled_back(head)
            except LinkFault as exc:
                self.conn.close(str(exc))

    def _drain(self) -> None:
        link, conn = self.link, self.conn
        if link is None or conn.closed:
            return
        conn.send(link.messages_to_send())
        for request in link.requests():
            self._loop.create_task(self._serve(link, conn, request))

    async def _serve(self, link: ActiveLink, conn: MateConnection, request) -> None:
        spool = self.local.spool
        try:
            if isinstance(request, PlanNeeded):
                base = await asyncio.to_thread(spool.log_base)
                point = await asyncio.to_thread(spool.log_point, request.standby_head.seq)
                plan = plan_resync(base, link.head, request.standby_head,
                                   lambda seq: point.checksum if point is not None and seq == point.seq else None)
                log.info("mate link: standby at op %d: %s", request.standby_head.seq, plan.reason)
                to_go = (await asyncio.to_thread(spool.log_bytes, plan.after_seq)
                         if plan.catchup is Catchup.INCREMENTAL else 0)
                if conn is self.conn and not conn.closed:
                    link.planned(plan, to_go)
            elif isinstance(request, ReadCommits):
                commits = await asyncio.to_thread(spool.read_commits, request.after_seq, request.max_ops)
                if conn is self.conn and not conn.closed:
                    link.commits_read(commits)
            elif isinstance(request, MakeSnapshot):
                await self._send_image(link, conn)
        except LookupError as exc:  # the log was truncated under a catch-up: start over
            conn.close(f"resync restarts: {exc}")
            return
        except (OSError, SpoolCorruption) as exc:  # our spool cannot be read: this link cannot serve
            log.error("mate link: reading our spool for the standby failed: %r", exc)
            conn.close(f"reading the active's spool failed: {exc}")
            return
        self._drain()

    async def _send_image(self, link: ActiveLink, conn: MateConnection) -> None:
        """The full resync: checkpoint the state for the standby, stream the checkpoint, then IMAGE_END."""
        async with self._imaging:  # one image at a time; an earlier link's ends at its next piece
            if conn is self.conn and not conn.closed:
                spool = self.local.spool
                out_dir = image_dir(spool.directory, self.local.writer.metrics().stored_bytes,
                                    linked=spool.checkpoint.seq > 0)
                try:
                    await self._stream_image(link, conn, spool, out_dir)
                except OSError as exc:  # our disk: no image for this link
                    log.error("mate link: cannot make or send the spool image: %r", exc)
                    conn.close(f"the spool image failed here: {exc}")
                except SpoolCorruption as exc:  # its pages failed their check: never ended, never installed
                    self.counters["bad_image"] += 1
                    log.error("mate link: our spool image is not sound, not sent: %s", exc)
                    conn.close(f"the active's spool image is damaged: {exc}")
                finally:
                    await asyncio.to_thread(shutil.rmtree, out_dir, True)

    async def _stream_image(self, link: ActiveLink, conn: MateConnection, spool, out_dir: Path) -> None:
        image = await asyncio.to_thread(SpoolImage, spool, out_dir)
        try:
            await self._stream_pieces(link, conn, image)
        finally:
            await asyncio.to_thread(image.close)

    async def _stream_pieces(self, link: ActiveLink, conn: MateConnection, image: SpoolImage) -> None:
        info = image.info
        log.info("mate link: spool image of %d bytes at op %d for the standby (%s)", info.size, info.point.seq,
                 info.how)
        digest, offset = hashlib.sha256(), 0
        pieces = image.chunks(digest)
        # It is read back while it goes out (spool/image.py): the standby relies on that and the SHA-256.
        checked = asyncio.ensure_future(asyncio.to_thread(image.check))
        try:
            while (data := await asyncio.to_thread(next, pieces, None)) is not None:
                if conn is not self.conn or conn.closed:
                    return
                for at in range(0, len(data), IMAGE_PIECE_BYTES):
                    link.snapshot_image_chunk(offset + at, info.size, data[at:at + IMAGE_PIECE_BYTES])
                offset += len(data)
                self._drain()
                while conn.unsent > IMAGE_UNSENT_MAX and not conn.closed:
                    await asyncio.sleep(IMAGE_WAIT_S)
        finally:
            pieces.close()
            await _wait_out(checked)  # before the image is released; raises SpoolCorruption if it failed
        if conn is self.conn and not conn.closed:
            log.info("mate link: spool image sent (%d bytes, read back whole)", offset)
            link.snapshot_image_done(info.point, offset, digest.digest())
            self._drain()


class StandbyReplication(_Replication):
    def __init__(self, *, secret: bytes, group: str, me: Role, spool: LocalSpool,
                 active_address: Callable[[], tuple[str, int] | None], incarnation: int,
                 highest_epoch: Callable[[], int], incoming_dir: Path, redial_s: float = 0.2,
                 link_timeout_ms: int = 1_000) -> None:
        self._secret, self._group, self._me = secret, group, me
        self.local = spool
        self._active_address = active_address
        self._incarnation = incarnation
        self._highest_epoch = highest_epoch
        self._incoming_dir = Path(incoming_dir)
        self._redial_s = redial_s
        self._link_timeout_ms = link_timeout_ms
        self.counters = LinkCounters()
        self.link: StandbyLink | None = None
        self.conn: MateConnection | None = None
        self._builder: SnapshotBuilder | None = None
        self._task: asyncio.Task | None = None
        self._closed: asyncio.Event | None = None
        self._work: asyncio.Queue | None = None
        self._image_queued = 0  # bytes of IMAGE pieces received and not yet written
        self._backlog = 0  # requests queued for the worker or being applied by it
        self._pending: collections.deque[Submission] = collections.deque()  # ops handed to the writer, unacked
        self._all_durable: asyncio.Event | None = None  # set while _pending is empty
        self.links_made = 0
        self.snapshots_installed = 0
        self._stopping = False
        self._last_progress = None  # an earlier link's catch-up (standby.ResyncProgress), shown until a new one

    async def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        """End the dialler for good. One `cancel()` is not enough on Python 3.11: `asyncio.wait_for` swallows
        a cancellation that lands as the connect it waits for completes (gh-86296), and the redial loop would
        run on while a take-over awaits it forever. So: a flag the loop checks, and cancel again until the
        task is done."""
        self._stopping = True
        while self._task is not None and not self._task.done():
            self._task.cancel()
            await asyncio.wait({self._task}, timeout=STOP_RETRY_S)
        if self.conn:
            self.conn.close("node stopping")
        _catching_up(False)  # a frame read since the link's end may have set it again

    @property
    def durable_seq(self) -> int:
        return self.link.durable.seq if self.link is not None else 0

    def progress(self, now: int) -> dict | None:
        """The latest catch-up's progress (the redundancy view's `resync`), None if no link needed one."""
        p = self.link.progress if self.link is not None and self.link.progress is not None else self._last_progress
        return None if p is None else p.view(now)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._stopping:
            address = self._active_address()
            if address is not None:
                try:
                    await self._one_link(loop, address)
                except OSError as exc:
                    log.debug("mate link: cannot reach %s: %s", address, exc)
            await asyncio.sleep(self._redial_s)

    async def _one_link(self, loop: asyncio.AbstractEventLoop, address: tuple[str, int]) -> None:
        self._closed = asyncio.Event()
        self._work = asyncio.Queue()
        self._image_queued = 0
        self._backlog = 0
        self._pending = collections.deque()
        self._all_durable = asyncio.Event()
        self._all_durable.set()
        established = asyncio.Event()
        conn = MateConnection(StandbyHandshake(self._secret, self._group, self._me, os.urandom(32)),
                              counters=self.counters, on_established=lambda c: established.set(),
                              on_message=self._message, on_closed=lambda c, why: self._closed.set())
        await asyncio.wait_for(loop.create_connection(lambda: conn, *address), 2.0)
        self.conn = conn
        worker = loop.create_task(self._apply_in_order())
        ticker = loop.create_task(self._ticks())
        try:
            await asyncio.wait_for(established.wait(), 5.0)
            if self.link is not None and self.link.progress is not None:
                self._last_progress = self.link.progress
            self.link = StandbyLink(self.local.writer.head, self._incarnation, self._highest_epoch(), now_ms(),
                                    link_timeout_ms=self._link_timeout_ms)
            self.links_made += 1
            self._drain()
            await self._closed.wait()
            if self.link.plan is not None and not self._stopping:  # a link that was up, not a refused redial
                log.warning("mate link to the active %s down: %s", conn.peer, conn.close_reason)
        except TimeoutError:
            conn.close("no handshake")
        finally:
            worker.cancel()
            ticker.cancel()
            try:  # the worker may be inside a snapshot thread: the builder is ours again only once it ended
                await _wait_out(asyncio.gather(worker, ticker, return_exceptions=True))
            finally:
                if self._builder is not None:
                    self._builder.abandon()
                    self._builder = None
                _catching_up(False)  # last: the worker's last _drain may have set it again

    def _message(self, conn: MateConnection, m: Message) -> None:
        if conn is self.conn and self.link is not None:
            self.link.receive(m, now_ms())
            self._drain()

    def _drain(self) -> None:
        if self.link is None or self.conn.closed:
            return
        _catching_up(self.link.resyncing)
        self.conn.send(self.link.messages_to_send())
        for request in self.link.requests():
            if isinstance(request, Apply) and not self._backlog and self.local.writer.pending_ops <= PIPELINE_MAX_OPS:
                # Nothing queued ahead: straight to the writer, without a worker's turn per OPS frame.
                if not self._submit_checked(request, self.conn):
                    return
                continue
            if isinstance(request, ImageChunk):
                self._image_queued += len(request.data)
                if self._image_queued > IMAGE_QUEUED_MAX_BYTES:
                    self.conn.transport.pause_reading()  # bounded: the active's pieces wait in TCP meanwhile
            self._backlog += 1
            self._work.put_nowait(request)

    async def _apply_in_order(self) -> None:
        """Apply queued requests in order: a snapshot batch must land before the ops after it. Ops are handed to
        the writer at once, without waiting for the previous batch's commit (so decoding the next batch overlaps
        committing this one, and the writer group-commits what queued up); `_durable` acknowledges them once
        durable, in order. At most PIPELINE_MAX_OPS wait for their commit; past it, ops queue here."""
        try:
            while True:
                request = await self._work.get()
                try:
                    if not await self._apply_one(request):
                        return
                finally:
                    self._backlog -= 1
                self._drain()
        except Exception as exc:  # noqa: BLE001 - our side failed (our disk, our bug): end the link, redial
            # Otherwise the worker would die silently and the link stay up applying nothing: no ack ever again.
            log.error("mate link: applying what the active sent failed here: %r", exc)
            if self.conn is not None:
                self.conn.close(f"applying failed on the standby: {exc}")

    def _submit_checked(self, request: Apply, conn: MateConnection) -> bool:
        """Hand `request` to the writer; False (link closed) if the active's ops are refused."""
        try:
            self._submit(request)
        except (RemoteProtocolError, ChainError, ValueError) as exc:
            self._refuse(conn, exc)
            return False
        except Exception as exc:  # noqa: BLE001 - our side (our disk, our bug): as in _apply_in_order
            log.error("mate link: applying what the active sent failed here: %r", exc)
            conn.close(f"applying failed on the standby: {exc}")
            return False
        return True

    def _submit(self, request: Apply) -> None:
        sub = self.local.writer.submit_commits(  # StandbyLink verified their chain
            list(request.commits), asyncio.get_running_loop(), chained=True)
        self._pending.append(sub)
        self._all_durable.clear()
        pending = self._pending
        sub.future.add_done_callback(lambda _f: self._durable(pending))

    def _durable(self, pending: collections.deque[Submission]) -> None:
        """Acknowledge, once, everything at the front of `pending` the writer has made durable (commits settle in
        order, one loop wake-up for a whole group commit: so one ACK per group commit)."""
        if pending is not self._pending:
            return  # an earlier link's: nobody acknowledges it any more
        link, conn = self.link, self.conn
        last, nops, nbytes = None, 0, 0
        while pending and pending[0].future.done():
            sub = pending[0]
            if sub.future.cancelled() or sub.future.exception() is not None:
                # our spool failed the commit: nothing of it is acknowledged, and the link starts over
                exc = None if sub.future.cancelled() else sub.future.exception()
                conn.close(f"applying the active's ops failed here: {exc!r}")
                return
            pending.popleft()
            commits = sub.future.result()
            if commits:
                last = commits[-1].point
            nops += sub.nops
            nbytes += sub.nbytes
        if not pending:
            self._all_durable.set()
        if last is None or conn.closed:
            return
        link.applied(last)
        running = link.progress is not None and link.progress.finished_ms is None
        link.progressed(nops, nbytes, now_ms())
        if running and link.progress.finished_ms is not None:
            p = link.progress
            log.info("mate link: catch-up done: %d ops (%d bytes of ops) in %d ms", p.ops_done, p.bytes_done,
                     p.finished_ms - p.started_ms)
        self._drain()

    def _refuse(self, conn: MateConnection, exc: Exception) -> None:
        """The active sent what we refuse (a bad op, a bad image): counted, the link closed."""
        self.counters["bad_image" if isinstance(exc, ImageRefused) else "bad_ops"] += 1
        log.warning("mate link: refused what the active sent: %s", exc)
        conn.close(f"refused what the active sent: {exc}")

    async def _apply_one(self, request) -> bool:
        """False once the link is closed because of what the active sent."""
        link, conn = self.link, self.conn
        try:
            if isinstance(request, Apply):
                while self.local.writer.pending_ops > PIPELINE_MAX_OPS and self._pending:
                    # Wait for the oldest commit only, not for all of them: the writer keeps a batch to work on.
                    await asyncio.wait({self._pending[0].future})
                self._submit(request)
            elif isinstance(request, SnapshotBatch):
                if request.first:
                    self._builder = await _in_thread(  # the id history keeps our spool's bound
                        SnapshotBuilder, self._incoming_dir, self.local.writer.limits.max_message_ids,
                        undo=SnapshotBuilder.abandon)
                await _in_thread(self._builder.add, request.bodies)
                link.progressed(len(request.bodies), sum(map(len, request.bodies)), now_ms())
            elif isinstance(request, ImageChunk):
                if request.first:
                    self._builder = await _in_thread(ImageReceiver, self._incoming_dir, undo=ImageReceiver.abandon)
                await _in_thread(self._builder.write, request.offset, [request.data])
                self._image_queued -= len(request.data)
                if self._image_queued <= IMAGE_QUEUED_MAX_BYTES // 2 and not conn.closed:
                    conn.transport.resume_reading()
                link.consumed(now_ms())
                link.progressed(0, len(request.data), now_ms())
            elif isinstance(request, ImageDone):
                await self._all_durable.wait()
                receiver = self._builder
                log.info("mate link: spool image received (%d bytes): checking it", request.size)
                await _in_thread(receiver.finish, request.point, request.size, request.digest)
                self._builder = None  # swapped in now, or never: not to abandon
                log.info("mate link: spool image checked: swapping it in")
                await _in_thread(self.local.replace_spool, receiver)
                if not conn.closed:
                    link.snapshot_installed(request.point, now_ms())
                self.snapshots_installed += 1
                log.info("mate link: full resync (spool image, %d bytes) installed at op %d", request.size,
                         request.point.seq)
            elif isinstance(request, SnapshotDone):
                await self._all_durable.wait()
                await _in_thread(self._builder.finish, request.point)
                builder, self._builder = self._builder, None  # swapped in now, or never: not to abandon
                await _in_thread(self.local.replace_spool, builder)
                if not conn.closed:
                    link.snapshot_installed(request.point, now_ms())
                self.snapshots_installed += 1
                log.info("mate link: full resync installed at op %d", request.point.seq)
        except (RemoteProtocolError, ChainError, ValueError) as exc:  # the peer's bad op: counted, link closed
            self._refuse(conn, exc)
            return False
        return True


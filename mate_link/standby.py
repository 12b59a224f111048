"""The standby's end of the mate link: join, follow the plan, verify and apply ops, acknowledge. Sans-I/O.

Rules:
- The first message is our JOIN (head, incarnation); the first we accept is the active's PLAN.
- A PLAN other than IN_STEP makes us `resyncing` until we hold its target: the node drops its
  in-sync lease at once, since catch-up batches can end inside one of the active's submissions
  (tests/harness/replication_sim.py replays it); a new lease comes only from the active's grant.
- Epoch fence: a message from an epoch lower than the highest we have seen is refused
  (`LinkFault`): a deposed active must not write into us.
- The plan's catch-up must start at our head (INCREMENTAL after our seq, IN_STEP at our head);
  anything else is the active's bug or an attack, and the link closes.
- A SNAPSHOT replaces our state whole: its batches are handed to the adapter (`SnapshotBatch`),
  which builds a new spool beside the old one and swaps it in only at the batch marked last
  (`SnapshotDone(point)`); until then our old state stands. OPS before the snapshot ended are refused.
  We ACK the snapshot's point only once the adapter reports it installed (`snapshot_installed`).
  The active may instead ship its spool's file image (IMAGE pieces, then IMAGE_END with the size,
  digest and head; spool/image.py): pieces must arrive in order (each at the offset where the last
  ended) and never mix with SNAPSHOT batches; the adapter writes them (`ImageChunk`) and checks
  and installs the whole (`ImageDone`); the same ACK rule holds.
- OPS carry commits as the active wrote them; each must continue our chain (its first op right after
  our head, its epoch not older, its chained checksum: spool/chain.py); they go to the adapter
  (`Apply`) to be appended as they came; only after `applied(point)` do we ACK that seq.
- We ACK the highest durable op, once per durable batch, never an op we have not written.
- PING is answered with PONG; silence for `link_timeout_ms` ends the link (the adapter redials).
  We PING too, when a whole `ping_interval_ms` passed in which we sent nothing else: the active's
  PINGs queue behind what it sends (a snapshot is seconds of data), so answering them alone would
  leave it hearing nothing from us meanwhile; while we ACK or PONG, it hears us anyway (any message
  counts), and a PING then would only cost both ends a frame. So the active hears us at least every
  2 × `ping_interval_ms`.
- Progress (`progress`, for `pairmq show redundancy`): a catch-up counts what the adapter reports
  applied (`progressed`) against what the PLAN (INCREMENTAL: ops and bytes to go) or the SNAPSHOT
  (its whole size) announced. The announced sizes are shown, never trusted: nothing above uses them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from pairmq.appliance.spool.records import verify_chain
from pairmq.appliance.spool.chain import ChainPoint, Commit
from pairmq.appliance.spool.errors import ChainError

from .active import LinkFault
from .messages import Ack, Catchup, Image, ImageEnd, Join, Message, Ops, Ping, Plan, Pong, Snapshot

# The requests to the adapter (`requests()`) are immutable by `Final`, with explicit `__init__`s (compiled:
# docs/build.md).


@dataclass(slots=True, init=False, unsafe_hash=True)
class Apply:
    commits: Final[tuple[Commit, ...]]

    def __init__(self, commits: tuple[Commit, ...]) -> None:
        self.commits = commits


@dataclass(slots=True, init=False, unsafe_hash=True)
class SnapshotBatch:
    bodies: Final[tuple[bytes, ...]]
    first: Final[bool]

    def __init__(self, bodies: tuple[bytes, ...], first: bool) -> None:
        self.bodies = bodies
        self.first = first


@dataclass(slots=True, init=False, unsafe_hash=True)
class SnapshotDone:
    point: Final[ChainPoint]

    def __init__(self, point: ChainPoint) -> None:
        self.point = point


@dataclass(slots=True, init=False, unsafe_hash=True)
class ImageChunk:
    offset: Final[int]
    data: Final[bytes]
    first: Final[bool]

    def __init__(self, offset: int, data: bytes, first: bool) -> None:
        self.offset = offset
        self.data = data
        self.first = first


@dataclass(slots=True, init=False, unsafe_hash=True)
class ImageDone:
    point: Final[ChainPoint]
    size: Final[int]
    digest: Final[bytes]

    def __init__(self, point: ChainPoint, size: int, digest: bytes) -> None:
        self.point = point
        self.size = size
        self.digest = digest


@dataclass(slots=True, init=False)
class ResyncProgress:
    """One catch-up as this standby applies it: ops and op-body bytes done durably, and announced in all."""
    kind: Catchup
    started_ms: int
    ops_total: int
    bytes_total: int
    ops_done: int
    bytes_done: int
    finished_ms: int | None
    image: bool  # a snapshot shipped as the spool's file image: its progress is in bytes

    def __init__(self, kind: Catchup, started_ms: int, ops_total: int, bytes_total: int, ops_done: int = 0,
                 bytes_done: int = 0, finished_ms: int | None = None, image: bool = False) -> None:
        self.kind = kind
        self.started_ms = started_ms
        self.ops_total = ops_total
        self.bytes_total = bytes_total
        self.ops_done = ops_done
        self.bytes_done = bytes_done
        self.finished_ms = finished_ms
        self.image = image

    def view(self, now_ms: int) -> dict[str, Any]:
        """The redundancy view's `resync` (rates over the whole catch-up so far; ETA at that rate)."""
        elapsed_ms = max(1, (self.finished_ms if self.finished_ms is not None else now_ms) - self.started_ms)
        running = self.finished_ms is None
        # None: not known yet (a snapshot's size comes with its first batch, once the active has built it).
        known = not running or self.kind is not Catchup.SNAPSHOT or self.ops_total > 0 or self.bytes_total > 0
        ops_to_go = max(0, self.ops_total - self.ops_done) if running else 0
        bytes_to_go = max(0, self.bytes_total - self.bytes_done) if running else 0
        rate = self.ops_done * 1000 / elapsed_ms
        if self.image:  # an image's pages are not ops: its ETA goes by bytes
            to_go, rate_for_eta = bytes_to_go, self.bytes_done * 1000 / elapsed_ms
        else:
            to_go, rate_for_eta = ops_to_go, rate
        eta_ms = 0 if not running else round(to_go * 1000 / rate_for_eta) if known and rate_for_eta else None
        return {"kind": self.kind.name.lower(), "state": "running" if running else "done",
                "ops_done": self.ops_done, "ops_to_go": ops_to_go if known else None, "bytes_done": self.bytes_done,
                "bytes_to_go": bytes_to_go if known else None, "elapsed_ms": elapsed_ms, "ops_per_s": round(rate, 1),
                "bytes_per_s": round(self.bytes_done * 1000 / elapsed_ms, 1), "eta_ms": eta_ms}


class StandbyLink:
    def __init__(self, head: ChainPoint, incarnation: int, highest_epoch: int, now_ms: int, *,
                 link_timeout_ms: int = 1_000, ping_interval_ms: int = 100) -> None:
        self._out: list[Message] = []  # to send (`messages_to_send`), as the active's end (active.Endpoint)
        self._requests: list[object] = []  # for the adapter (`requests`)
        self.head = head  # the last op handed to the adapter to apply (verified to chain)
        self.durable = head  # the last op the adapter reports written
        self.highest_epoch = highest_epoch
        self.link_timeout_ms = link_timeout_ms
        self.ping_interval_ms = ping_interval_ms
        self._next_ping = now_ms + ping_interval_ms
        self._spoke = False  # we sent something since the last ping check (see handle_timer)
        self.plan: Plan | None = None
        self._resync_until = 0  # a catch-up PLAN's target: until we hold it, our in-sync lease is void
        self.heard_at = now_ms
        self._in_snapshot = False
        self._snapshot_batches = 0
        self._image_bytes: int | None = None  # an image snapshot's bytes so far (None: not an image)
        self._snapshot_uninstalled = False  # a SNAPSHOT plan until the adapter installed it
        self._acked = head.seq
        self.progress: ResyncProgress | None = None  # the catch-up of this link, if it needed one
        self._out.append(Join(highest_epoch, head, incarnation))

    def messages_to_send(self) -> list[Message]:
        out, self._out = self._out, []
        if out:
            self._spoke = True
        return out

    def requests(self) -> list[object]:
        out, self._requests = self._requests, []
        return out

    @property
    def resyncing(self) -> bool:
        """A catch-up is under way (see _on_plan): the node must not hold an in-sync lease meanwhile."""
        return self._in_snapshot or self.durable.seq < self._resync_until

    @property
    def caught_up_to(self) -> int:
        """The active's head when it planned (progress: durable.seq of this)."""
        return self.plan.target.seq if self.plan else 0

    def receive(self, m: Message, now_ms: int) -> None:
        if m.epoch < self.highest_epoch:
            raise LinkFault(f"a message from epoch {m.epoch}; epoch {self.highest_epoch} is newer")
        self.highest_epoch = m.epoch
        self.heard_at = now_ms
        if isinstance(m, Ping):
            self._out.append(Pong(self.highest_epoch, m.sent_ms))
            return
        if isinstance(m, Pong):
            return
        if self.plan is None:
            if not isinstance(m, Plan):
                raise LinkFault(f"{type(m).__name__} before the active's PLAN")
            self._on_plan(m, now_ms)
        elif isinstance(m, Snapshot):
            self._on_snapshot(m)
        elif isinstance(m, Image):
            self._on_image(m)
        elif isinstance(m, ImageEnd):
            self._on_image_end(m)
        elif isinstance(m, Ops):
            self._on_ops(m)
        else:
            raise LinkFault(f"an active does not send {type(m).__name__} after its PLAN")

    def _on_plan(self, m: Plan, now_ms: int) -> None:
        if m.catchup is Catchup.IN_STEP and m.target != self.head:
            raise LinkFault(f"IN_STEP at op {m.target.seq}, but we are at op {self.head.seq}")
        if m.catchup is Catchup.INCREMENTAL and m.after_seq != self.head.seq:
            raise LinkFault(f"INCREMENTAL after op {m.after_seq}, but we are at op {self.head.seq}")
        self.plan = m
        self._in_snapshot = m.catchup is Catchup.SNAPSHOT
        # A catch-up is applied in batches that may end inside one of the active's submissions: a standby
        # taking over between two of them would hold half of one. So whoever needs catching up gives up its
        # in-sync lease now (the node clears it) and earns it again only from the active's grant, which waits
        # until the standby acknowledged the whole catch-up (ActiveLink.caught_up).
        self._resync_until = m.target.seq if m.catchup is not Catchup.IN_STEP else 0
        if m.catchup is Catchup.INCREMENTAL:
            self.progress = ResyncProgress(m.catchup, now_ms, m.target.seq - m.after_seq, m.bytes_to_go)
        elif m.catchup is Catchup.SNAPSHOT:
            self.progress = ResyncProgress(m.catchup, now_ms, 0, 0)  # sizes come with the first SNAPSHOT
            self._snapshot_uninstalled = True

    def _catchup(self) -> tuple[Plan, ResyncProgress]:
        """The PLAN and its progress, inside a snapshot catch-up (where _on_plan made both)."""
        assert self.plan is not None and self.progress is not None, "a snapshot catch-up without its PLAN"
        return self.plan, self.progress

    def _on_snapshot(self, m: Snapshot) -> None:
        if not self._in_snapshot or self._image_bytes is not None:
            raise LinkFault("a SNAPSHOT outside a snapshot catch-up" if not self._in_snapshot
                            else "a SNAPSHOT batch inside a spool image")
        plan, progress = self._catchup()
        self._requests.append(SnapshotBatch(m.bodies, first=self._snapshot_batches == 0))
        if self._snapshot_batches == 0:
            progress.ops_total, progress.bytes_total = m.ops_total, m.bytes_total
        self._snapshot_batches += 1
        if m.last is not None:
            self._in_snapshot = False
            progress.ops_total += max(0, plan.target.seq - m.last.seq)  # the ops that follow it
            self.head = m.last  # the ops that follow chain on the snapshot's point
            self._requests.append(SnapshotDone(m.last))

    def _on_image(self, m: Image) -> None:
        if not self._in_snapshot or self._snapshot_batches:
            raise LinkFault("an IMAGE outside a snapshot catch-up" if not self._in_snapshot
                            else "an IMAGE piece after SNAPSHOT batches")
        _, progress = self._catchup()
        first = self._image_bytes is None
        received = self._image_bytes or 0
        if first:
            progress.image, progress.bytes_total = True, m.total
        if m.offset != received:
            raise LinkFault(f"an IMAGE piece at byte {m.offset}, but {received} bytes arrived so far")
        self._image_bytes = received + len(m.data)
        self._requests.append(ImageChunk(m.offset, m.data, first))

    def _on_image_end(self, m: ImageEnd) -> None:
        if not self._in_snapshot:
            raise LinkFault("an IMAGE_END outside a snapshot catch-up")
        if self._image_bytes is None:
            raise LinkFault("an IMAGE_END before any IMAGE piece")
        if m.size != self._image_bytes:
            raise LinkFault(f"an IMAGE_END for {m.size} bytes, but {self._image_bytes} arrived (truncated or padded)")
        plan, progress = self._catchup()
        self._in_snapshot = False
        progress.ops_total += max(0, plan.target.seq - m.point.seq)  # the ops that follow it
        self.head = m.point  # the ops that follow chain on the image's head
        self._requests.append(ImageDone(m.point, m.size, m.digest))

    def _on_ops(self, m: Ops) -> None:
        if self._in_snapshot:
            raise LinkFault("OPS before the snapshot ended")
        self.head = continue_chain(m.commits, self.head, m.epoch)
        if m.commits:
            self._requests.append(Apply(m.commits))

    def applied(self, point: ChainPoint) -> None:
        """The adapter wrote everything up to `point` durably."""
        assert point.seq <= self.head.seq, "applied an op that was never handed over"
        if point.seq > self.durable.seq:
            self.durable = point
        if self.durable.seq > self._acked:
            self._acked = self.durable.seq
            self._out.append(Ack(self.highest_epoch, self._acked))

    def snapshot_installed(self, point: ChainPoint, now_ms: int = 0) -> None:
        """The adapter swapped in the snapshot's spool: everything up to `point` is durable (our older,
        possibly diverged, ops are gone)."""
        self.durable = point
        self._acked = point.seq
        self._out.append(Ack(self.highest_epoch, point.seq))
        self._snapshot_uninstalled = False
        self.progressed(0, 0, now_ms)

    def progressed(self, ops: int, nbytes: int, now_ms: int) -> None:
        """The adapter made `ops` ops (`nbytes` of bodies) of the catch-up durable (a snapshot batch written
        to the spool being built, or applied ops)."""
        p, plan = self.progress, self.plan
        if p is None or plan is None or p.finished_ms is not None:
            return
        p.ops_done += ops
        p.bytes_done += nbytes
        if not self._snapshot_uninstalled and self.durable.seq >= plan.target.seq:
            p.finished_ms = now_ms

    def consumed(self, now_ms: int) -> None:
        """The adapter is still consuming what the active sent (it stopped reading meanwhile, to bound what it
        holds): that silence is ours, not the active's."""
        self.heard_at = max(self.heard_at, now_ms)

    def handle_timer(self, now_ms: int) -> None:
        if now_ms - self.heard_at > self.link_timeout_ms:
            raise LinkFault(f"nothing from the active for {now_ms - self.heard_at} ms")
        if now_ms >= self._next_ping:
            if not self._spoke and not self._out:
                self._out.append(Ping(self.highest_epoch, now_ms))
            self._spoke = False
            self._next_ping = now_ms + self.ping_interval_ms

    def get_timer(self) -> int:
        return min(self._next_ping, self.heard_at + self.link_timeout_ms + 1)


def continue_chain(commits: tuple[Commit, ...], prev: ChainPoint, sender_epoch: int) -> ChainPoint:
    """The point after `commits` if they continue `prev` (chain.py's rules) and none claims an epoch newer than its
    sender's; else LinkFault naming the first that does not. One digest per commit, over its op records as they came."""
    for c in commits:
        if c.epoch > sender_epoch:
            raise LinkFault(f"ops {c.first_seq}..{c.last_seq} claim epoch {c.epoch}, newer than their sender's "
                            f"{sender_epoch}")
    try:
        return verify_chain(commits, prev)
    except ChainError as exc:
        raise LinkFault(f"the ops do not continue our log: {exc}") from None

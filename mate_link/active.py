"""The active's end of the mate link: ship the op log to the standby, learn what it holds. Sans-I/O.

Rules:
- Nothing is shipped before the standby's JOIN: its head decides the catch-up (resync.py).
- Catch-up reads the log through the adapter (`ReadCommits` / `commits_read`, `MakeSnapshot` /
  `snapshot_ready`), never more than `max_inflight_ops` ahead of the standby's acks, so a standby
  far behind costs bounded memory. A snapshot is a batch of op bodies that rebuild the state as of
  a point, then the ops after that point follow as an incremental catch-up.
- What is shipped is commits (spool/chain.py), the bytes the segment holds, never re-encoded; a commit
  is one submission of the writer and is never split.
- LIVE once everything up to our head was shipped: from then on every commit the writer makes
  (`local_submitted`, before its local write even finishes) is shipped at once, in order; commits
  made before the adapter takes the messages ride in one OPS message (whole commits, at most
  `max_batch_ops` and `max_batch_bytes` of them together): one frame per turn, not per submission.
  Log reads see durable commits only, so the last stretch of a catch-up comes from the commits the
  writer handed us recently (a bounded buffer), which bridges the read to the live stream.
- `acked_seq` only grows; an ACK for an op we never shipped is the peer's fault (`LinkFault`).
- caught up = LIVE, heard within `link_timeout_ms`, and at most `INSYNC_LAG_FACTOR` x `max_lag_ops`
  ops unacknowledged. That is the quorum core's `MateSync.caught_up` input: losing it drops the
  standby from sync for the epoch, and acknowledgements then wait until the standby's in-sync lease
  has surely ended. A snapshot counts as acknowledged only when the standby acks its point (after
  installing it); ops up to that point do not count as lag meanwhile. The factor leaves room for
  what publishers had in flight when backpressure began, so backpressure (not a lost sync and a
  lease wait) is what a merely slow standby causes.
- Backpressure: `over_max_lag` while LIVE and more than `max_lag_ops` ops or `max_lag_bytes` bytes
  are unacknowledged: the broker stops reading publishers until it drains. Not during a catch-up:
  that runs from the log at its own pace (`max_inflight_ops`) and must not interrupt service.
- Every message carries our epoch; a JOIN or ACK from a higher epoch means someone newer is active:
  `LinkFault` (the quorum core hears of it through heartbeats; the link just closes).
"""

from __future__ import annotations

import collections
import dataclasses
import enum

from pairmq.appliance.errors import RemoteProtocolError
from pairmq.appliance.spool.chain import ChainPoint, Commit

from .messages import Ack, Catchup, Image, ImageEnd, Join, Message, Ops, Ping, Plan, Pong, Snapshot
from .resync import ResyncPlan


class LinkFault(RemoteProtocolError):
    """The peer broke the mate link protocol; the link closes (and is counted)."""


class Phase(enum.Enum):
    AWAIT_JOIN = "awaiting join"
    SNAPSHOT = "sending snapshot"
    CATCHING_UP = "catching up"
    LIVE = "live"


INSYNC_LAG_FACTOR = 4


@dataclasses.dataclass(frozen=True, slots=True)
class LinkLimits:
    max_batch_ops: int = 1_000
    max_batch_bytes: int = 1 << 20
    max_inflight_ops: int = 50_000  # catch-up runs at most this far ahead of the acks
    max_lag_ops: int = 10_000
    max_lag_bytes: int = 64 << 20
    max_recent_ops: int = 100_000  # the writer's max_pending_ops: every op not yet committed is here
    ping_interval_ms: int = 100
    link_timeout_ms: int = 1_000


@dataclasses.dataclass(frozen=True, slots=True)
class ReadCommits:
    after_seq: int
    max_ops: int


@dataclasses.dataclass(frozen=True, slots=True)
class MakeSnapshot:
    pass


@dataclasses.dataclass(frozen=True, slots=True)
class PlanNeeded:
    """Decide the catch-up for this JOIN (resync.plan_resync over our log), then call `planned`."""
    standby_head: ChainPoint


class Endpoint:
    """What both ends share: the messages to send and the requests for the adapter, drained by it."""

    def __init__(self) -> None:
        self._out: list[Message] = []
        self._requests: list[object] = []

    def messages_to_send(self) -> list[Message]:
        out, self._out = self._out, []
        return out

    def requests(self) -> list[object]:
        out, self._requests = self._requests, []
        return out


class ActiveLink(Endpoint):
    def __init__(self, epoch: int, head: ChainPoint, now_ms: int, limits: LinkLimits = LinkLimits()) -> None:
        super().__init__()
        self.epoch = epoch
        self.head = head  # the last op the writer gave a seq
        self.limits = limits
        self.phase = Phase.AWAIT_JOIN
        self.shipped_seq = 0
        self.acked_seq = 0
        self.live_from_seq = 0  # where the live stream (whole submissions only) began
        self._lag_floor = 0  # a snapshot's point: ops up to it are not lag, though unacknowledged until installed
        self.standby_incarnation = 0
        self.plan: ResyncPlan | None = None
        self.heard_at = now_ms
        self.round_trip_ms: int | None = None
        self._next_ping = now_ms
        self._reading = False
        self._recent: collections.deque[Commit] = collections.deque()
        self._recent_ops = 0  # ops in `_recent`, kept within limits.max_recent_ops
        self._unacked_bytes: collections.deque[tuple[int, int]] = collections.deque()  # (seq, bytes)
        self.unacked_bytes = 0
        self.catchup_done_ops = 0
        self.catchup_total_ops = 0
        self._live_tail: Ops | None = None  # the live OPS not yet taken by the adapter, which later commits join
        self._live_tail_size = (0, 0)  # its ops and bytes

    # --- inputs -------------------------------------------------------------------------------

    def receive(self, m: Message, now_ms: int) -> None:
        if m.epoch > self.epoch:
            raise LinkFault(f"the standby speaks for epoch {m.epoch}, newer than ours ({self.epoch})")
        self.heard_at = now_ms
        if isinstance(m, Join):
            if self.phase is not Phase.AWAIT_JOIN:
                raise LinkFault("a second JOIN on one link")
            self.standby_incarnation = m.incarnation
            self._requests.append(PlanNeeded(m.head))
        elif isinstance(m, Ack):
            self._on_ack(m.seq)
        elif isinstance(m, Ping):
            self._out.append(Pong(self.epoch, m.sent_ms))
        elif isinstance(m, Pong):
            self.round_trip_ms = max(0, now_ms - m.echoed_ms)
        else:
            raise LinkFault(f"a standby does not send {type(m).__name__}")

    def planned(self, plan: ResyncPlan, bytes_to_go: int = 0) -> None:
        """The adapter's answer to PlanNeeded (`bytes_to_go`: an INCREMENTAL catch-up's op bytes, for progress)."""
        assert self.phase is Phase.AWAIT_JOIN and self.plan is None
        self.plan = plan
        self._out.append(Plan(self.epoch, plan.catchup, plan.after_seq, self.head, bytes_to_go))
        self.catchup_total_ops = plan.ops_to_go
        if plan.catchup is Catchup.SNAPSHOT:
            self.phase = Phase.SNAPSHOT
            self._requests.append(MakeSnapshot())
            return
        self.shipped_seq = self.acked_seq = plan.after_seq
        self.phase = Phase.CATCHING_UP
        self._continue_catchup()

    def snapshot_ready(self, bodies: list[bytes], point: ChainPoint) -> None:
        """The state as of `point`, as op bodies; the ops after `point` follow as a catch-up."""
        assert self.phase is Phase.SNAPSHOT
        batch: list[bytes] = []
        size = 0
        n, total = len(bodies), sum(map(len, bodies))
        for body in bodies:
            if batch and (len(batch) >= self.limits.max_batch_ops or size + len(body) > self.limits.max_batch_bytes):
                self._out.append(Snapshot(self.epoch, tuple(batch), None, n, total))
                batch, size = [], 0
            batch.append(body)
            size += len(body)
        self._out.append(Snapshot(self.epoch, tuple(batch), point, n, total))
        self._snapshot_shipped(point)

    def snapshot_image_chunk(self, offset: int, total: int, data: bytes) -> None:
        """A piece of the spool's file image (spool/image.py), the adapter's answer to MakeSnapshot in pieces."""
        assert self.phase is Phase.SNAPSHOT
        self._out.append(Image(self.epoch, offset, total, data))

    def snapshot_image_done(self, point: ChainPoint, size: int, digest: bytes) -> None:
        """The whole image went out: it holds the state as of `point`; the ops after it follow as a catch-up."""
        assert self.phase is Phase.SNAPSHOT
        self._out.append(ImageEnd(self.epoch, point, size, digest))
        self._snapshot_shipped(point)

    def _snapshot_shipped(self, point: ChainPoint) -> None:
        # Shipped, not acknowledged: the standby holds the snapshot only once it has installed it and
        # acked `point` (then it is caught up: redundancy Up). Lag and catch-up room count from `point`.
        self.shipped_seq = self._lag_floor = point.seq
        self.catchup_total_ops = self.head.seq - point.seq
        self.phase = Phase.CATCHING_UP
        self._continue_catchup()

    def commits_read(self, commits: list[Commit]) -> None:
        """The adapter's answer to ReadCommits: the next commits of the log (maybe none)."""
        self._reading = False
        if self.phase is not Phase.CATCHING_UP:
            return
        fresh = [c for c in commits if c.last_seq > self.shipped_seq]
        if fresh and fresh[0].first_seq != self.shipped_seq + 1:
            raise AssertionError(f"the log read skipped from op {self.shipped_seq} to {fresh[0].first_seq}")
        self._ship(fresh)
        self.catchup_done_ops += sum(c.ops for c in fresh)
        if fresh:
            self._continue_catchup()  # nothing new: wait for the next commit, ack or timer

    def local_submitted(self, commit: Commit) -> None:
        """The writer made this commit (in seq order); ship it now if we are LIVE."""
        self.head = commit.point
        self._recent.append(commit)
        self._recent_ops += commit.ops
        while self._recent_ops > self.limits.max_recent_ops and len(self._recent) > 1:
            self._recent_ops -= self._recent.popleft().ops
        if self.phase is Phase.LIVE:
            assert commit.first_seq == self.shipped_seq + 1, (commit.first_seq, self.shipped_seq)
            self._ship([commit], whole=True)
        elif self.phase is Phase.CATCHING_UP:
            self._continue_catchup()

    def local_rolled_back(self, head: ChainPoint) -> None:
        """A failed commit took the writer's head back: the standby may hold ops that no longer exist.
        Nothing of them was acknowledged; the link must restart so the standby resyncs. The rolled-back ops
        leave `_recent` too: a catch-up still to come would otherwise bridge with them, and the next
        submission, which reuses their seqs, would follow ops that no longer exist (and fail the assertion in
        `local_submitted`)."""
        self.head = head
        while self._recent and self._recent[-1].last_seq > head.seq:
            self._recent_ops -= self._recent.pop().ops
        if self.shipped_seq > head.seq:
            raise LinkFault(f"ops {head.seq + 1}..{self.shipped_seq} were shipped then rolled back; resync")

    def handle_timer(self, now_ms: int) -> None:
        if self.phase is Phase.CATCHING_UP:
            self._continue_catchup()  # a read that found nothing new is retried here
        if now_ms >= self._next_ping:
            self._out.append(Ping(self.epoch, now_ms))
            self._next_ping = now_ms + self.limits.ping_interval_ms
        if now_ms - self.heard_at > self.limits.link_timeout_ms:
            raise LinkFault(f"nothing from the standby for {now_ms - self.heard_at} ms")

    def get_timer(self) -> int:
        return min(self._next_ping, self.heard_at + self.limits.link_timeout_ms + 1)

    # --- views --------------------------------------------------------------------------------

    def caught_up(self, now_ms: int) -> bool:
        """LIVE, heard lately, within the lag bound, and the standby acknowledged everything up to where the
        live stream began: from there on every OPS holds whole submissions, so what it holds is never half of
        one (catch-up batches from log reads may end anywhere)."""
        return not self.behind(now_ms)

    def behind(self, now_ms: int) -> str:
        """Why the standby is not caught up, as the quorum core's decision sentence says it ("" if it is)."""
        if self.phase is not Phase.LIVE:
            return f"is not caught up on the mate link ({self.phase.value})"
        if now_ms - self.heard_at > self.limits.link_timeout_ms:
            return f"was not heard on the mate link for {now_ms - self.heard_at} ms"
        if self.acked_seq < self.live_from_seq:
            return "is not caught up on the mate link (its catch-up not yet acknowledged)"
        if self.head.seq - self.acked_seq > INSYNC_LAG_FACTOR * self.limits.max_lag_ops:
            return f"fell behind on the mate link ({self.head.seq - self.acked_seq} ops unacknowledged)"
        return ""

    @property
    def over_max_lag(self) -> bool:
        return self.phase is Phase.LIVE and (self.shipped_seq - max(self.acked_seq, self._lag_floor)
                                             > self.limits.max_lag_ops or self.unacked_bytes > self.limits.max_lag_bytes)

    # --- internals ----------------------------------------------------------------------------

    def _on_ack(self, seq: int) -> None:
        if seq > self.shipped_seq:
            raise LinkFault(f"an ACK for op {seq}, but we shipped only up to {self.shipped_seq}")
        if seq <= self.acked_seq:
            return
        self.acked_seq = seq
        while self._unacked_bytes and self._unacked_bytes[0][0] <= seq:
            self.unacked_bytes -= self._unacked_bytes.popleft()[1]
        if self.phase is Phase.CATCHING_UP:
            self._continue_catchup()

    def _ship(self, commits: list[Commit], whole: bool = False) -> None:
        """Batches of OPS, whole commits only: the standby applies a commit atomically, and a submission split
        across two could leave it, at a failover, holding half of one (a message queued without the QoS 2 record
        that stops its retransmission from being routed again). `whole`: all in one message."""
        if whole:  # the live path, once per submission
            if commits:
                total = sum(len(c.data) for c in commits)
                ops = sum(c.ops for c in commits)
                tail = self._live_tail
                if (tail is not None and self._out and self._out[-1] is tail
                        and self._live_tail_size[0] + ops <= self.limits.max_batch_ops
                        and self._live_tail_size[1] + total <= self.limits.max_batch_bytes):
                    self._live_tail = self._out[-1] = Ops(self.epoch, tail.commits + tuple(commits))
                    self._live_tail_size = (self._live_tail_size[0] + ops, self._live_tail_size[1] + total)
                else:  # nothing of this turn unsent (the adapter took it), or it is full
                    self._live_tail = Ops(self.epoch, tuple(commits))
                    self._live_tail_size = (ops, total)
                    self._out.append(self._live_tail)
                self.shipped_seq = commits[-1].last_seq
                self._unacked_bytes.append((self.shipped_seq, total))
                self.unacked_bytes += total
            return
        batch: list[Commit] = []
        ops = size = total = 0
        for c in commits:
            if batch and (ops + c.ops > self.limits.max_batch_ops or size + len(c.data) > self.limits.max_batch_bytes):
                self._out.append(Ops(self.epoch, tuple(batch)))
                batch, ops, size = [], 0, 0
            batch.append(c)
            ops += c.ops
            size += len(c.data)
            total += len(c.data)
        if batch:
            self._out.append(Ops(self.epoch, tuple(batch)))
            self.shipped_seq = batch[-1].last_seq
            self._unacked_bytes.append((self.shipped_seq, total))
            self.unacked_bytes += total

    def _continue_catchup(self) -> None:
        if self._recent and self._recent[0].first_seq <= self.shipped_seq + 1 <= self._recent[-1].last_seq:
            bridge = [c for c in self._recent if c.last_seq > self.shipped_seq]
            assert bridge[0].first_seq == self.shipped_seq + 1, "a catch-up ended inside a commit"
            self._ship(bridge)
            self.catchup_done_ops += sum(c.ops for c in bridge)
        if self.shipped_seq >= self.head.seq:
            self.phase = Phase.LIVE
            self.live_from_seq = self.shipped_seq
            return
        room = self.limits.max_inflight_ops - (self.shipped_seq - max(self.acked_seq, self._lag_floor))
        if room > 0 and not self._reading:
            self._reading = True
            self._requests.append(ReadCommits(self.shipped_seq, min(room, self.limits.max_batch_ops * 10)))

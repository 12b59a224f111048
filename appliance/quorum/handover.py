"""Planned handover of activity: the quorum core's part (docs/mate_link.md), sans-I/O.

Rules:
H1 One handover for every cause: `pairmq redundancy release-activity`, `revert-activity`, auto-revert
   and SIGTERM on the active all go through `QuorumCore.begin_handover`.
H2 Begin, on the active only. Refused (one sentence, nothing changes) when the node is not active, a
   handover is already under way, or the mate is not in sync and seen; `force` skips the last check
   and is a plain step-down (the mate takes over by R2 once allowed, or not at all if it cannot).
   Not forced: the MQTT gate closes at once (`may_serve` is false while draining), so no client packet
   is taken and no acknowledgement leaves, before anything can let the mate take activity.
H3 Drain. The adapter waits until the mate acknowledged every op of the spool (its final op N) and
   then calls `finish_handover(N)`. The wait is bounded (`DRAIN_MS`); past it, or once the mate falls
   out of sync, the handover is aborted and the node serves again: its heartbeats kept claiming
   activity throughout, so its lease never lapsed and the mate never had a shortcut.
H4 Yield. The node steps down at epoch E with its mate still synced. From then on, while it is a
   standby, knows no epoch above E and is not bidding, every heartbeat it sends carries FLAG_YIELDED
   (and FLAG_MATE_IN_SYNC: "you hold everything I acknowledged") with spool position (E, N).
H5 A receiver R takes such a heartbeat from X (STANDBY, YIELDED, no bid, epoch equal to the highest
   R knows) as the end of X's activity claims: R's lease + margin silence for X is over at once, so
   the mate may bid and R may vote without waiting. Sound because X stopped serving before it sent
   the heartbeat (the gate closed in H2, the step-down in H4); X can serve again only by winning an
   epoch above E, which takes a vote from R or from the third node, and a voter that voted above E
   knows an epoch above E and ignores the yield; the replay mark accepts X's heartbeats only in
   sequence order, so a yield replayed or delayed past a newer heartbeat of X is refused; a yield of
   an older epoch than R knows is ignored. A lost yield costs nothing: the next heartbeat repeats it.
H6 The yielder does not bid for `quiet_ms` (lease + margin) after yielding: the mate takes over, the
   yielder votes for it. If the mate has not taken activity by then (it died mid-handover), the
   yielder bids by the normal rules, eligible as "yielded epoch E and nobody took it" (its known epoch
   is still E: any activation above E needed a vote from it or from the monitor, and either then
   knows the higher epoch). So the group recovers within the normal failover time.
H7 Auto-revert (`group.auto_revert`, off by default): an active backup whose primary has been seen
   and in sync for `REVERT_SETTLE_MS` asks for a handover (decision "auto_revert"), again every
   `REVERT_RETRY_MS` while it still holds activity. Nothing else makes a node bid back.
"""

from __future__ import annotations

import dataclasses

from ..errors import LocalProtocolError
from ..roles import Role
from .decisions import DecisionKind
from .wire import FLAG_YIELDED, Activity, Heartbeat

DRAIN_MS = 2_000  # the longest a handover keeps clients waiting for the mate's acks before serving again
REVERT_SETTLE_MS = 1_000  # the primary in sync this long before auto-revert moves activity back to it
REVERT_RETRY_MS = 5_000


@dataclasses.dataclass(slots=True)
class Draining:
    started_at: int
    deadline: int
    why: str


@dataclasses.dataclass(slots=True)
class HandoverState:
    """What the core remembers of handovers: one draining at most, the epoch it yielded, the bid hold."""

    draining: Draining | None = None
    yielded_epoch: int = 0
    no_bid_until: int = 0
    revert_synced_since: int | None = None
    revert_next_at: int = 0
    completed: int = 0
    aborted: int = 0

    def refusal(self, *, active: bool, mate: str, mate_synced: bool, sees_mate: bool, force: bool) -> str:
        """H2: why a handover may not begin ("" when it may)."""
        if not active:
            return "this node does not hold activity; run release-activity against the active node"
        if self.draining is not None:
            return "a handover is already under way"
        if force:
            return ""
        if not sees_mate:
            return (f"the {mate} is not reachable, so no node could take over with every acknowledged message; "
                    f"repeat with --force to step down anyway")
        if not mate_synced:
            return (f"the {mate} is not in sync (redundancy Down), so releasing would leave no node with every "
                    f"acknowledged message; repeat with --force to step down anyway")
        return ""

    def begin(self, now_ms: int, why: str) -> None:
        self.draining = Draining(now_ms, now_ms + DRAIN_MS, why)

    def yielded(self, now_ms: int, epoch: int, quiet_ms: int) -> None:
        """H4/H6."""
        self.draining = None
        self.yielded_epoch = epoch
        self.no_bid_until = now_ms + quiet_ms
        self.completed += 1

    def holds_yield(self, known_epoch: int, bidding: bool = False) -> bool:
        """H4: our heartbeats say "yielded" while nobody we know of took a later epoch."""
        return self.yielded_epoch != 0 and self.yielded_epoch == known_epoch and not bidding

    def revert_due(self, now_ms: int, mate_ready: bool) -> bool:
        """H7, on an active backup with auto-revert on: is it time to hand activity back?"""
        if not mate_ready or self.draining is not None:
            self.revert_synced_since = None
            return False
        if self.revert_synced_since is None:
            self.revert_synced_since = now_ms
        if now_ms - self.revert_synced_since < REVERT_SETTLE_MS or now_ms < self.revert_next_at:
            return False
        self.revert_next_at = now_ms + REVERT_RETRY_MS
        return True

    def timers(self) -> list[int]:
        out = [self.no_bid_until]
        if self.draining is not None:
            out.append(self.draining.deadline)
        if self.revert_synced_since is not None:
            out += [self.revert_synced_since + REVERT_SETTLE_MS, self.revert_next_at]
        return out


class HandoverRules:
    """QuorumCore's handover rules (H2-H5, H7), kept here beside their state; they use the core's own
    lease, mate-sync, step-down and decision machinery."""

    def begin_handover(self, now_ms: int, why: str, *, force: bool = False) -> None:
        """H2: close the gate and drain (or, forced without an in-sync mate, step down). Raises
        LocalProtocolError with one sentence when refused; nothing changes then."""
        self._now = now_ms
        self._expire(now_ms)
        mate = self.role.mate() if self.role.routes_messages else None
        active = self.activity is Activity.ACTIVE
        refusal = self.handover.refusal(
            active=active, mate=mate.value if mate else "mate", force=force,
            mate_synced=active and self.mate_sync.synced, sees_mate=mate is not None and self.sees(mate, now_ms))
        if refusal:
            raise LocalProtocolError(refusal)
        if force and not (self.mate_sync.synced and self.sees(mate, now_ms)):
            self._step_down(now_ms, f"{why} (forced, {mate.value} not in sync) → stepping down")
            self.handover.no_bid_until = now_ms + self.timing.quiet_ms
            return
        self.handover.begin(now_ms, why)
        self._decide(now_ms, DecisionKind.HANDOVER,
                     f"{self.role.value}: {why} → stopped taking client packets, waiting "
                     f"for the {mate.value} to hold every op, epoch {self.active_epoch}")

    def finish_handover(self, now_ms: int, final_seq: int) -> bool:
        """H3/H4: the mate acknowledged every op through `final_seq`: yield. False if the handover ended."""
        self._now = now_ms
        self._expire(now_ms)
        drain = self.handover.draining
        if drain is None or self.activity is not Activity.ACTIVE:
            return False
        mate = self.role.mate()
        self._check_mate_sync(now_ms)
        if not (self.mate_sync.synced and self.sees(mate, now_ms)):
            self.abort_handover(now_ms, f"the {mate.value} fell out of sync")
            return False
        epoch = self.active_epoch
        self.set_spool_position(epoch, final_seq)
        self.handover.yielded(now_ms, epoch, self.timing.quiet_ms)
        self._step_down(now_ms, f"{drain.why}: the {mate.value} holds every op through {final_seq} "
                                f"→ handing activity over")
        return True

    def abort_handover(self, now_ms: int, why: str) -> None:
        """H3: the handover ends without a yield; the node serves again if its lease still runs."""
        if self.handover.draining is None:
            return
        self.handover.draining = None
        self.handover.aborted += 1
        again = "serving again" if self.may_serve(now_ms) else "not serving"
        self._decide(now_ms, DecisionKind.HANDOVER_ABORTED,
                     f"{self.role.value}: handover aborted: {why} → {again}, "
                     f"epoch {self.active_epoch or self.state.epoch}")

    def _yield_from(self, hb: Heartbeat) -> bool:
        return (hb.has(FLAG_YIELDED) and hb.activity is Activity.STANDBY and not hb.bid_epoch
                and hb.epoch == self.state.epoch)

    def _consider_auto_revert(self, now_ms: int) -> None:
        if not self.auto_revert or self.role is not Role.BACKUP:
            return
        mate = self.role.mate()
        ready = self.mate_sync.synced and self.sees(mate, now_ms) and self.may_serve(now_ms)
        if self.handover.revert_due(now_ms, ready):
            self._decide(now_ms, DecisionKind.AUTO_REVERT,
                         f"{self.role.value}: auto-revert: {mate.value} in sync and seen "
                         f"→ handing activity back to the {mate.value}")


def _secs(ms: int) -> str:
    return f"{ms / 1000:.2f} s"

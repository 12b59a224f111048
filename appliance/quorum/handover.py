"""Planned handover of activity: the quorum core's part (issue 4), sans-I/O.

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

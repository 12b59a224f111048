"""The in-sync lease between the active and its mate (DESIGN §4), sans-I/O.

Rules:
- The active grants its mate an in-sync lease by echoing the mate's heartbeat
  with FLAG_MATE_IN_SYNC; the mate holds it until (send time of the echoed
  heartbeat) + insync_ms. The active knows that lease surely ends by
  (when it received that heartbeat) + insync_ms: its `grant_bound`.
- The active may acknowledge on local durability alone only after
  `grant_bound`. From that instant the mate misses data of this epoch, so the
  active drops it from sync. So does a mate restart (new incarnation) or the
  mate link's word that the mate fell behind. Only the mate link's word that
  it caught up again (it acknowledged every op whose effects were released)
  re-admits it (`readmit`).
- At activation the mate counts as synced only if it is seen and either holds
  an in-sync lease or has exactly our data position.
- An active that steps down with its mate still synced says so in its standby
  heartbeats: the mate then holds that epoch's data for good (FOREVER), and
  stays eligible to take over however long the election takes.
- A newer epoch won by someone else voids whatever the mate held of the old one.
"""

from __future__ import annotations

import dataclasses

from ..roles import Role
from .wire import FLAG_MATE_IN_SYNC, FLAG_SELF_IN_SYNC, Activity, Heartbeat

FOREVER = 1 << 62


@dataclasses.dataclass(slots=True)
class MateSync:
    """Active side: does our mate still hold everything we acknowledged this epoch?"""

    insync_ms: int
    caught_up: bool = True  # the mate link's word; True until it exists
    behind: str = "fell behind"  # and why not, when it is not: "is not connected on the mate link"...
    synced: bool = False
    incarnation: int = 0
    grant_bound: int = 0
    closed_in_sync: bool = False  # after stepping down: the mate held everything we acknowledged

    def activate(self, now_ms: int, mate_hb: Heartbeat | None, sees_mate: bool, position: tuple[int, int]) -> None:
        self.synced = sees_mate and mate_hb is not None and (
            mate_hb.has(FLAG_SELF_IN_SYNC) or (mate_hb.spool_epoch, mate_hb.spool_seq) == position)
        self.incarnation = mate_hb.incarnation if self.synced else 0
        self.grant_bound = now_ms
        self.closed_in_sync = False

    def granting(self, sees_mate: bool) -> bool:
        return self.synced and self.caught_up and sees_mate

    def drop_reason(self, now_ms: int, mate_hb: Heartbeat | None, sees_mate: bool) -> str:
        """Why the mate just fell out of sync ("" if it did not); it then stays out for the epoch."""
        if not self.synced:
            return ""
        why = ""
        if mate_hb is not None and mate_hb.incarnation != self.incarnation:
            why = "restarted"
        elif not self.caught_up:
            why = self.behind
        elif now_ms >= self.grant_bound and not self.granting(sees_mate):
            why = "unseen past its in-sync lease"
        if why:
            self.synced = False
        return why

    def readmit(self, incarnation: int) -> None:
        """The mate link's word: the mate caught up again and holds every op whose effects were released."""
        self.synced = True
        self.incarnation = incarnation

    def granted(self, mate_heard_at: int) -> None:
        """We are about to echo the mate's latest heartbeat (received at `mate_heard_at`) with a grant."""
        self.grant_bound = max(self.grant_bound, mate_heard_at + self.insync_ms)

    def step_down(self) -> None:
        self.closed_in_sync = self.synced


@dataclasses.dataclass(slots=True)
class InSyncLease:
    """Standby side: the lease the active grants us."""

    insync_ms: int
    until: int = 0
    epoch: int = 0

    def holds(self, now_ms: int) -> bool:
        return now_ms < self.until

    def on_mate(self, hb: Heartbeat, echo_at: int | None, now_ms: int, *, epoch: int, me: Role,
                incarnation: int) -> str:
        """Take the mate's heartbeat into account; return a sentence when our status changed."""
        if hb.epoch != epoch:
            return ""
        if hb.activity is Activity.ACTIVE:
            if not hb.has(FLAG_MATE_IN_SYNC):
                was = self.holds(now_ms) and self.epoch == hb.epoch
                self.until = 0
                return f"{hb.sender.value} (active, epoch {hb.epoch}) reports us out of sync" if was else ""
            if echo_at is None:
                return ""
            news = "" if self.holds(now_ms) else f"in sync with {hb.sender.value} (active, epoch {hb.epoch})"
            self.until = max(self.until, echo_at + self.insync_ms)
            self.epoch = hb.epoch
            return news
        if hb.activity is Activity.STANDBY and hb.has(FLAG_MATE_IN_SYNC) and self.until != FOREVER:
            view = hb.view_of(me)
            if view is None or view.incarnation != incarnation:
                return ""
            self.until, self.epoch = FOREVER, hb.epoch
            return f"{hb.sender.value} closed epoch {hb.epoch} with us in sync"
        return ""

    def newer_epoch(self, epoch: int, ours_to_win: int) -> None:
        if epoch > self.epoch and epoch != ours_to_win:
            self.until = 0

    def clear(self) -> None:
        self.until = 0

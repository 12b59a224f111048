"""Which decision the quorum core may make in which activity, and where each one leads (R5 of core.py).

Rules:
- Every decision has a kind, and the table below is the only place activity changes: a decision
  made in activity A leads to TRANSITIONS[A][kind]. Only `activate` (standby → active) and
  `step_down` (active → standby) change it; the monitor's activity is NONE for good.
- A kind missing from an activity's row is our own bug (e.g. a vote while active, a bid from the
  monitor): `next_activity` raises AssertionError and nothing changes.
"""

from __future__ import annotations

import enum

from .wire import Activity


class DecisionKind(enum.StrEnum):
    """The kinds a `Decision` carries; a `StrEnum` so that logs, the event log and the API show the plain word."""

    BOOT = "boot"
    BID = "bid"
    BID_END = "bid_end"
    VOTE = "vote"
    REFUSE = "refuse"
    ACTIVATE = "activate"
    STEP_DOWN = "step_down"
    EPOCH = "epoch"
    SYNC = "sync"
    FORCE = "force"
    STORAGE = "storage"
    HANDOVER = "handover"
    HANDOVER_ABORTED = "handover_aborted"
    AUTO_REVERT = "auto_revert"


_K = DecisionKind
_STAY_MONITOR = (_K.BOOT, _K.VOTE, _K.REFUSE, _K.EPOCH, _K.STORAGE)
_STAY_STANDBY = (_K.BOOT, _K.BID, _K.BID_END, _K.VOTE, _K.REFUSE, _K.EPOCH, _K.SYNC, _K.FORCE, _K.STORAGE)
_STAY_ACTIVE = (_K.SYNC, _K.STORAGE, _K.HANDOVER, _K.HANDOVER_ABORTED, _K.AUTO_REVERT)

TRANSITIONS: dict[Activity, dict[DecisionKind, Activity]] = {
    Activity.NONE: {k: Activity.NONE for k in _STAY_MONITOR},
    Activity.STANDBY: {**{k: Activity.STANDBY for k in _STAY_STANDBY}, _K.ACTIVATE: Activity.ACTIVE},
    Activity.ACTIVE: {**{k: Activity.ACTIVE for k in _STAY_ACTIVE}, _K.STEP_DOWN: Activity.STANDBY},
}


def next_activity(activity: Activity, kind: DecisionKind) -> Activity:
    """The activity a `kind` decision made in `activity` leads to; AssertionError if the table forbids it."""
    after = TRANSITIONS[activity].get(kind)
    if after is None:
        raise AssertionError(f"a {kind} decision is not legal while {activity.name.lower()}")
    return after

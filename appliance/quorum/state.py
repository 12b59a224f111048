"""The quorum core's records: its timers, what it keeps on disk, and the decisions it reports."""

from __future__ import annotations

import dataclasses
import enum
from typing import Protocol

from ..roles import Role
from .decisions import DecisionKind


class RedundancyStatus(enum.Enum):
    UP = "Up"
    DOWN = "Down"


@dataclasses.dataclass(frozen=True, slots=True)
class Timing:
    heartbeat_interval_ms: int
    lease_ms: int
    takeover_margin_ms: int
    insync_ms: int
    broker_stall_ms: int = 5000

    @classmethod
    def from_timers(cls, timers) -> "Timing":
        return cls(timers.heartbeat_interval_ms, timers.lease_ms, timers.takeover_margin_ms, timers.insync_ms,
                   timers.broker_stall_ms)

    @property
    def quiet_ms(self) -> int:
        """Silence from a claimant after which none of its leases can be live."""
        return self.lease_ms + self.takeover_margin_ms


@dataclasses.dataclass(slots=True)
class PersistentState:
    """What must survive a crash; saved durably before it is acted on."""

    incarnation: int = 0
    epoch: int = 0  # highest epoch known (activated, granted, or seen)
    voted_epoch: int = 0  # highest epoch we granted a vote in (ourselves included)
    voted_for: Role | None = None
    spool_epoch: int = 0  # how up to date our data is (until the spool exists: the epoch we last served or synced)
    spool_seq: int = 0


class StableStore(Protocol):
    def load(self) -> PersistentState: ...

    def save(self, state: PersistentState) -> None:
        """Durable when it returns."""


@dataclasses.dataclass(frozen=True, slots=True)
class Decision:
    at_ms: int
    role: Role
    kind: DecisionKind
    epoch: int
    reason: str

    def __str__(self) -> str:
        return self.reason

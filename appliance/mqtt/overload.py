"""Overload policy (DESIGN §5, HiveMQ-style): each client's inbound in-flight window, as a function of load.

Rules:

- A client's in-flight count is the number of its PUBLISH, SUBSCRIBE and
  UNSUBSCRIBE packets whose effects are not complete yet (QoS 1/2 and
  SUBSCRIBE/UNSUBSCRIBE: waiting for the spool's group commit). While that
  count has reached the window, the listener stops reading the client's
  socket; it reads again as soon as there is room.
- The window is `max_window` (100) while the node is idle. It shrinks linearly
  towards `min_window` (1) as either input rises from its low mark to its high
  mark; the worse input decides. Inputs: the spool writer's commit backlog
  (ops submitted, not yet durable) and the event loop's lag (how late a
  periodic timer fired).
- It shrinks at once, and grows back at most doubling every
  `grow_interval_ms`: when load comes and goes, throttled clients do not all
  burst back together.
- The window never leaves [min_window, max_window]; min_window >= 1, so every
  client can always have one packet in progress and nobody is starved.

- Mate-link backpressure (DESIGN §4, `MateBackpressure`): while the standby's
  unacknowledged backlog on the live mate link is over `max_lag` ops or bytes
  (`ActiveLink.over_max_lag`), a connection that hands over a QoS 1/2 PUBLISH
  (what adds ops) is not read again until the backlog is back under the bound.
  Everything else keeps being read: subscribers' acks free the queue, and the
  backlog drains by the standby's acks, never by a held publisher. Each held
  connection finishes what it sent (its in-flight publishes still complete).

Theory of operation: the listener samples both inputs on its lag timer and
calls `update(now_ms, backlog_ops, lag_ms)`; the returned window applies to
every client. It asks `MateBackpressure.over` as each QoS 1/2 PUBLISH is
handled (so a burst is cut at once) and `sample` on the lag timer (which ends
an episode and lets the held publishers be read again). Time is a parameter:
nothing here reads a clock.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True, slots=True)
class OverloadLimits:
    max_window: int = 100
    min_window: int = 1
    backlog_low_ops: int = 2_000  # the spool writer refuses (SpoolBusy) at 100,000 pending
    backlog_high_ops: int = 50_000
    lag_low_ms: float = 20.0
    lag_high_ms: float = 250.0  # half the default lease: the loop must keep heartbeats far from it
    grow_interval_ms: int = 100

    def __post_init__(self) -> None:
        if not 1 <= self.min_window <= self.max_window:
            raise ValueError(f"need 1 <= min_window <= max_window, got {self.min_window}, {self.max_window}")
        if not 0 <= self.backlog_low_ops < self.backlog_high_ops:
            raise ValueError("need 0 <= backlog_low_ops < backlog_high_ops")
        if not 0 <= self.lag_low_ms < self.lag_high_ms:
            raise ValueError("need 0 <= lag_low_ms < lag_high_ms")
        if self.grow_interval_ms <= 0:
            raise ValueError("grow_interval_ms must be positive")


class WindowPolicy:
    """The shared inbound window; see the rules above."""

    __slots__ = ("limits", "window", "load", "_grown_at_ms")

    def __init__(self, limits: OverloadLimits = OverloadLimits()) -> None:
        self.limits = limits
        self.window = limits.max_window
        self.load = 0.0  # 0 idle .. 1 at or past a high mark: the last sample's
        self._grown_at_ms: int | None = None

    def target(self, backlog_ops: int, lag_ms: float) -> int:
        """The window this load asks for, before the growth limit."""
        lim = self.limits
        self.load = max(_fraction(backlog_ops, lim.backlog_low_ops, lim.backlog_high_ops),
                        _fraction(lag_ms, lim.lag_low_ms, lim.lag_high_ms))
        span = lim.max_window - lim.min_window
        return lim.max_window - round(span * self.load)

    def update(self, now_ms: int, backlog_ops: int, lag_ms: float) -> int:
        """Take one load sample; returns the new window."""
        want = self.target(backlog_ops, lag_ms)
        if want < self.window:
            self.window = want
            self._grown_at_ms = now_ms
        elif want > self.window:
            if self._grown_at_ms is None or now_ms - self._grown_at_ms >= self.limits.grow_interval_ms:
                self.window = min(want, self.window * 2)
                self._grown_at_ms = now_ms
        return self.window


def _fraction(value: float, low: float, high: float) -> float:
    if value <= low:
        return 0.0
    if value >= high:
        return 1.0
    return (value - low) / (high - low)


class MateBackpressure:
    """Publishers held for the mate link's backlog; see the rules above. Counters for the management API."""

    __slots__ = ("holding", "episodes", "publishers_held", "held_ms", "_since_ms")

    def __init__(self) -> None:
        self.holding = False
        self.episodes = 0  # times the backlog passed the bound
        self.publishers_held = 0  # times a publisher's socket stopped being read for it
        self.held_ms = 0  # total time spent holding, finished episodes
        self._since_ms = 0

    def over(self, now_ms: int, lagging: bool) -> bool:
        """A QoS 1/2 PUBLISH was handled: should its connection stop being read? (Counted if so.)"""
        if not self.holding:
            if not lagging:
                return False
            self.holding, self._since_ms = True, now_ms
            self.episodes += 1
        self.publishers_held += 1
        return True

    def sample(self, now_ms: int, lagging: bool) -> int | None:
        """On the lag timer: the episode's length in ms when it ends now (read the held publishers again)."""
        if not self.holding or lagging:
            return None
        self.holding = False
        took = max(0, now_ms - self._since_ms)
        self.held_ms += took
        return took

    def view(self) -> dict[str, object]:
        return {"holding": self.holding, "episodes": self.episodes, "publishers_held": self.publishers_held,
                "held_ms": self.held_ms}

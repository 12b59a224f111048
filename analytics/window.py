"""--since/--until: the period a summary covers, and which segments can hold events of it.

Rules:
- A bound is ISO 8601 (a date, or a date and time; UTC unless it names an
  offset) or relative to now: a number and a unit, `90s`, `30m`, `2h`, `7d`,
  `1w`, meaning that long ago. since <= ts < until; either may be open.
- A segment is one node's log from its first event to the next segment's
  first event (the node writes in time order and rotates): a segment that
  ends before `since` or starts at or after `until` is never read. The
  active segment has no end. A segment whose first line gives no time has
  no known start, and the one before it ends at the next known start.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import re

_RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)\s*(s|m|h|d|w)$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
FIRST_LINE_BYTES = 64 * 1024


class WindowError(ValueError):
    """A bound that does not parse, or an empty window: one sentence."""


@dataclasses.dataclass(frozen=True, slots=True)
class Window:
    since: float | None = None  # seconds since the epoch
    until: float | None = None

    def days(self) -> tuple[str | None, str | None]:
        """The table's `day` partitions the window touches (yyyy-mm-dd, inclusive)."""
        day = lambda t: None if t is None else _utc(t).strftime("%Y-%m-%d")  # noqa: E731
        return day(self.since), day(self.until)

    def describe(self) -> dict:
        iso = lambda t: None if t is None else _utc(t).isoformat()  # noqa: E731
        return {"since": iso(self.since), "until": iso(self.until)}


def _utc(t: float) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc)


def parse_bound(text: str, now: float, flag: str) -> float:
    """Seconds since the epoch of `text` (see the rules), `now` being the present."""
    got = _RELATIVE.match(text.strip().lower())
    if got:
        return now - float(got.group(1)) * _UNIT_S[got.group(2)]
    try:
        when = datetime.datetime.fromisoformat(text.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise WindowError(f"{flag} {text!r} is neither an ISO 8601 time (2026-11-28T14:00) nor a time ago "
                          "(90s, 30m, 2h, 7d, 1w)") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.timezone.utc)
    return when.timestamp()


def parse(since: str | None, until: str | None, now: float) -> Window | None:
    """The window of --since/--until, None when neither is given."""
    if since is None and until is None:
        return None
    w = Window(since and parse_bound(since, now, "--since"), until and parse_bound(until, now, "--until"))
    if w.since is not None and w.until is not None and w.since >= w.until:
        raise WindowError(f"--since ({_utc(w.since).isoformat()}) must be before --until "
                          f"({_utc(w.until).isoformat()})")
    return w


def first_ts(head: bytes) -> float | None:
    """The time of a segment's first line, from its first bytes; None if it does not say."""
    try:
        value = json.loads(head.split(b"\n", 1)[0])
        ts = value.get("ts") if isinstance(value, dict) else None
        return float(ts) if isinstance(ts, (int, float)) and not isinstance(ts, bool) else None
    except ValueError:
        return None


def overlapping(logs: list[tuple[str, list[float | None]]], window: Window) -> list[int]:
    """The indexes (into each log's list, flattened in order) of the segments that can hold events of `window`.
    `logs`: per node's log, its segments' first times in the order written (the active one last, open-ended)."""
    keep, index = [], 0
    for _, starts in logs:
        for k, start in enumerate(starts):
            end = next((s for s in starts[k + 1:] if s is not None), None)
            before = window.since is not None and end is not None and end < window.since
            after = window.until is not None and start is not None and start >= window.until
            if not (before or after):
                keep.append(index)
            index += 1
    return keep

"""A node's spooled event log: JSON Lines in rotated, size- and age-bounded segments (DESIGN §7, docs/events.md).

Rules:
- `write` never blocks and never raises: it stamps the record's times and
  appends it to a bounded in-memory queue (under a lock held only for an
  append, and by the writer for a swap of the whole queue); one writer thread
  encodes and writes. The broker loop pays an append, not a JSON encoding or
  a write. `write_lines` queues several events made at one moment (a
  submission's message events) as one entry, their lines made by the writer
  (`eventlines`, compiled).
- A full queue (the disk slower than the events) loses the event but counts
  it (an entry of several, all of them); the writer records the count as an
  `events_lost` event once it can.
  Nothing is lost silently.
- A failed write (a full disk) stops event logging for good: one clear error
  in the node's log, `failed` says why, `lost` counts every event since. The
  broker never notices.
- The active segment is `events.jsonl`. It is closed (renamed to
  `events-<node>-<seq>.jsonl`, seq increasing, never reused) when it passes
  `segment_max_bytes` or `segment_max_age_s`, and at start-up if a previous
  run left it behind (a kill -9). A closed segment never changes again, which
  is what lets analytics ingest it once.
- Closed segments beyond `retain_max_bytes` in total are deleted, oldest first.
- Refusals are throttled (`RefusalThrottle`), so that a flood of refused
  connections cannot push the useful events out of retention: per kind in
  `REFUSAL_EVENTS` and per source address, at most `refusal_events_per_s`
  are written a second; the rest are counted and summed in one
  `events_suppressed` event per kind once the second is over (its count
  exact, the busiest sources named). Counted, never lost silently.
- Every record carries v (the schema version), ts (wall clock, seconds),
  mono_ms (CLOCK_MONOTONIC, ms: lines up several nodes on one machine),
  node and event. What each event adds is in docs/events.md.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import threading
import time
from pathlib import Path
from typing import Any, Callable

from . import eventlines
from .errors import ConfigError
from .private_files import private_dir, private_opener

log = logging.getLogger("pairmq.events")

ACTIVE_NAME = "events.jsonl"
_CLOSED = re.compile(r"^events-(?P<node>[a-z]+)-(?P<seq>\d{8})\.jsonl$")
WRITER_WAKE_S = 0.02  # how long an event may wait in the queue when few arrive


@dataclasses.dataclass(frozen=True, slots=True)
class EventSettings:
    """The group file's optional [events] table."""

    message_events: bool = True  # per-message events (published, spooled, ...); False: only the group's events
    message_sample_ratio: float = 1.0  # the share of messages whose events are written (by message id)
    segment_max_bytes: int = 64 * 1024 * 1024
    segment_max_age_s: int = 3600
    retain_max_bytes: int = 1024 * 1024 * 1024
    queue_max_events: int = 200_000
    refusal_events_per_s: int = 10  # per kind and source address (see the rules)

    RANGES = {
        "refusal_events_per_s": (1, 1_000_000),
        "segment_max_bytes": (4096, 1 << 34),
        "segment_max_age_s": (1, 7 * 86400),
        "retain_max_bytes": (65536, 1 << 44),
        "queue_max_events": (100, 10_000_000),
    }

    def validate(self) -> None:
        for name, (low, high) in self.RANGES.items():
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
                raise ConfigError(f"events.{name} must be a whole number from {low:,} to {high:,}, not {value!r}")
        ratio = self.message_sample_ratio
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0.0 <= ratio <= 1.0:
            raise ConfigError(f"events.message_sample_ratio must be a number from 0 to 1, not {ratio!r}")
        if not isinstance(self.message_events, bool):
            raise ConfigError(f"events.message_events must be true or false, not {self.message_events!r}")
        if self.retain_max_bytes < self.segment_max_bytes:
            raise ConfigError("events.retain_max_bytes must be at least events.segment_max_bytes "
                              f"({self.retain_max_bytes:,} < {self.segment_max_bytes:,})")


def segments(directory: Path) -> list[Path]:
    """A node's segments in the order they were written: closed ones by sequence, then the active one."""
    closed = sorted((p for p in directory.glob("events-*.jsonl") if _CLOSED.match(p.name)),
                    key=lambda p: int(_CLOSED.match(p.name)["seq"]))
    active = directory / ACTIVE_NAME
    return closed + ([active] if active.exists() else [])


def read_events(directory: Path) -> list[dict]:
    """Every event of one node's log, in order (tests and benchmarks; a torn last line is skipped)."""
    out = []
    for path in segments(directory):
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


# Events that say "someone was refused": what a hostile peer can make us write as fast as it can connect.
REFUSAL_EVENTS = frozenset({"client_refused", "bad_packet", "connection_refused", "tls_refused"})
SUPPRESSED_WINDOW_MS = 1000
SUPPRESSED_MAX_SOURCES = 10_000  # per kind and window; sources past it are counted as one "other"
SUPPRESSED_NAMED_SOURCES = 20  # a summary names the busiest ones


def _source(fields) -> str:
    """The address part of a refusal's peer ("host:port" or "[v6]:port")."""
    peer = fields.get("peer") if isinstance(fields, dict) else None
    if not isinstance(peer, str):
        return "?"
    if peer.startswith("["):
        return peer[1:peer.find("]")] if "]" in peer else peer
    return peer.rpartition(":")[0] or peer


class _Window:
    __slots__ = ("start_ms", "seen", "suppressed", "other", "total")

    def __init__(self, start_ms: int) -> None:
        self.start_ms = start_ms
        self.seen: dict[str, int] = {}
        self.suppressed: dict[str, int] = {}
        self.other = 0  # suppressed from sources past SUPPRESSED_MAX_SOURCES
        self.total = 0


class RefusalThrottle:
    """Per kind and source, at most `per_source` events a window; the rest counted, then summed (no I/O, no clock)."""

    def __init__(self, per_source: int, kinds: frozenset[str] = REFUSAL_EVENTS,
                 window_ms: int = SUPPRESSED_WINDOW_MS) -> None:
        self.per_source = per_source
        self.kinds = kinds
        self.window_ms = window_ms
        self.suppressed = 0
        self._windows: dict[str, _Window] = {}

    def admit(self, kind: str, fields, now_ms: int) -> bool:
        """True: write this event; False: it was counted for the summary."""
        window = self._windows.get(kind)
        if window is None:
            window = self._windows[kind] = _Window(now_ms)
        source = _source(fields)
        seen = window.seen
        if source in seen or len(seen) < SUPPRESSED_MAX_SOURCES:
            n = seen[source] = seen.get(source, 0) + 1
            if n <= self.per_source:
                return True
            window.suppressed[source] = window.suppressed.get(source, 0) + 1
        else:
            window.other += 1
        window.total += 1
        self.suppressed += 1
        return False

    def due(self, now_ms: int, closing: bool = False) -> list[dict]:
        """The summaries of the windows over by `now_ms` (every window when `closing`): their fields, for an
        `events_suppressed` event each."""
        out = []
        for kind, window in list(self._windows.items()):
            if now_ms - window.start_ms < self.window_ms and not closing:
                continue
            del self._windows[kind]
            if window.total:
                out.append(_summary(kind, window, now_ms))
        return out


def _summary(kind: str, window: _Window, now_ms: int) -> dict:
    busiest = sorted(window.suppressed.items(), key=lambda item: -item[1])
    named = dict(busiest[:SUPPRESSED_NAMED_SOURCES])
    unnamed = window.total - sum(named.values())
    seconds = round((now_ms - window.start_ms) / 1000, 1)
    where = ", ".join(f"{n} from {source}" for source, n in named.items())
    if unnamed:
        where += f", {unnamed} from other sources"
    return {"kind": kind, "count": window.total, "window_s": seconds, "by_source": named,
            "other_sources": unnamed,
            "reason": f"suppressed {window.total} {kind} events in the last {seconds} s ({where})"}


class EventLog:
    def __init__(self, directory: Path, node: str, settings: EventSettings = EventSettings(),
                 clock=time.time, mono=time.monotonic_ns) -> None:
        private_dir(directory)
        self.directory = directory
        self.path = directory / ACTIVE_NAME
        self.node = node
        self._node_json = json.dumps(node)
        self.settings = settings
        self._clock, self._mono = clock, mono
        self.written = 0
        self.lost = 0  # queue overflow, or after a failure
        self.failed: str | None = None
        self.rotations = 0
        # The queue: (ts, mono_ms, event, count, render, args) entries, `count` events each, their lines made by
        # render(stamp, event, *args). A producer holds the lock for an append, the writer for a swap of the list.
        self._lock = threading.Lock()
        self._entries: list[tuple] = []
        self._queued = 0  # events in `_entries`
        self._overflow = 0  # lost to a full queue, not yet recorded in the log
        self.throttle = RefusalThrottle(settings.refusal_events_per_s)  # the writer thread's alone
        self._wake = threading.Event()
        self._closing = False
        self._seq = max((int(_CLOSED.match(p.name)["seq"]) for p in directory.glob("events-*.jsonl")
                         if _CLOSED.match(p.name)), default=0)
        self._file = None
        self._opened_at = 0.0
        try:
            if self.path.exists() and self.path.stat().st_size > 0:
                self._close_segment()  # a previous run's (kill -9): closed as it is
            self._open()
        except OSError as exc:
            self._fail(exc)
        self._thread = threading.Thread(target=self._run, name=f"eventlog-{node}", daemon=True)
        self._thread.start()

    # --- producers (any thread) ---------------------------------------------------------------

    def write(self, event: str, **fields) -> None:
        self._put((self._clock(), self._mono() // 1_000_000, event, 1, eventlines.line, (fields,)))

    def write_lines(self, event: str, count: int, render: Callable[..., str], *args: Any) -> None:
        """`count` events made at one moment (one clock read, one queue entry), for the message path: the writer
        thread makes their lines with `render(stamp, event, *args)` (`eventlines`: each line the stamp, its event's
        name and members, a newline), so the caller builds no dict. A render that raises is written as one
        `render_error` line of `event`, the rest counted as lost; the writer goes on."""
        self._put((self._clock(), self._mono() // 1_000_000, event, count, render, args))

    def _put(self, entry: tuple) -> None:
        count = entry[3]
        with self._lock:
            if self.failed is not None or self._closing:
                self.lost += count
            elif self._queued + count > self.settings.queue_max_events:
                self._overflow += count
                self.lost += count
            else:
                self._entries.append(entry)
                self._queued += count

    def view(self) -> dict:
        return {"written": self.written, "lost": self.lost, "failed": self.failed, "rotations": self.rotations,
                "queued": self._queued, "segment": str(self.path), "suppressed": self.throttle.suppressed}

    def close(self) -> None:
        """Write what is queued, then stop. Events written after this are counted as lost."""
        with self._lock:
            self._closing = True
        self._wake.set()
        self._thread.join(timeout=10)

    # --- the writer thread -----------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            self._wake.wait(WRITER_WAKE_S)
            self._wake.clear()
            closing = self._closing
            self._drain()
            self._maybe_rotate()
            if closing:
                break
        if self._file is not None:
            try:
                self._file.close()
            except OSError:
                pass

    def _drain(self) -> None:
        with self._lock:
            entries, self._entries, self._queued = self._entries, [], 0
            lost, self._overflow = self._overflow, 0
        node, throttle = self._node_json, self.throttle
        texts: list[str] = []  # each one line or more, every line ended by a newline
        lines = 0
        for ts, mono_ms, event, count, render, args in entries:
            if event in throttle.kinds:
                lines += self._summaries(texts, mono_ms)  # a window over before this event is summed before it
                if not throttle.admit(event, args[0], mono_ms):
                    continue
            stamp = eventlines.stamp(node, ts, mono_ms)
            try:
                texts.append(render(stamp, event, *args))
                lines += count
            except Exception as exc:  # noqa: BLE001 - a bug of the caller's: the line says so, the log goes on
                texts.append(eventlines.line(stamp, event, {"render_error": repr(exc)}))
                lines += 1
                with self._lock:
                    self.lost += count - 1
        lines += self._summaries(texts, self._mono() // 1_000_000, self._closing)
        if lost:
            texts.append(eventlines.line(eventlines.stamp(node, self._clock(), self._mono() // 1_000_000),
                                         "events_lost", {"count": lost, "reason": "event queue full"}))
            lines += 1
        if texts:
            self._write_texts(texts, lines)

    def _write_texts(self, texts: list[str], lines: int) -> None:
        """One write while the segment's limit is not reached (a drain's lines are mostly well under it)."""
        if self.failed is not None:
            with self._lock:
                self.lost += lines
            return
        text, written = "".join(texts), self.written
        try:
            size = self._file.tell()
            if size + len(text) < self.settings.segment_max_bytes:  # ASCII: json escapes everything else
                self._write(text, lines)
            else:
                split = text.split("\n")[:-1]
                lines = len(split)
                self._write_across(split, size)
        except OSError as exc:
            with self._lock:
                self.lost += lines - (self.written - written)
            self._fail(exc)

    def _write_across(self, lines: list[str], size: int) -> None:
        """Lines that reach the segment's limit: a segment ends within one line of it, however big the batch."""
        limit, start = self.settings.segment_max_bytes, 0
        for i, text in enumerate(lines):
            size += len(text) + 1
            if size >= limit:
                self._write("\n".join(lines[start:i + 1]) + "\n", i + 1 - start)
                start, size = i + 1, 0
                self._rotate()
        self._write("\n".join(lines[start:]) + "\n", len(lines) - start)

    def _summaries(self, texts: list[str], now_ms: int, closing: bool = False) -> int:
        due = self.throttle.due(now_ms, closing)
        for fields in due:
            texts.append(eventlines.line(eventlines.stamp(self._node_json, self._clock(), now_ms), "events_suppressed",
                                         fields))
        return len(due)

    def _write(self, text: str, lines: int) -> None:
        if lines:
            self._file.write(text)
            self._file.flush()
            self.written += lines

    def _maybe_rotate(self) -> None:
        """Age counts even on an idle node: an hour-old segment closes though nothing was written since."""
        if self.failed is not None or self._file is None:
            return
        try:
            size = self._file.tell()
            if size and (size >= self.settings.segment_max_bytes
                         or self._clock() - self._opened_at >= self.settings.segment_max_age_s):
                self._rotate()
        except OSError as exc:
            self._fail(exc)

    def _open(self) -> None:
        self._file = open(self.path, "a", encoding="utf-8", opener=private_opener)
        self._opened_at = self._clock()

    def _close_segment(self) -> None:
        self._seq += 1
        os.replace(self.path, self.directory / f"events-{self.node}-{self._seq:08d}.jsonl")
        self.rotations += 1

    def _rotate(self) -> None:
        self._file.close()
        self._close_segment()
        self._open()
        self._retain()

    def _retain(self) -> None:
        closed = [p for p in segments(self.directory) if p.name != ACTIVE_NAME]
        sizes = [p.stat().st_size for p in closed]
        total = sum(sizes)
        for path, size in zip(closed, sizes):
            if total <= self.settings.retain_max_bytes:
                break
            path.unlink(missing_ok=True)
            total -= size

    def _fail(self, exc: OSError) -> None:
        self.failed = f"{exc.strerror or exc} ({self.path})"
        log.error("%s: event logging stopped: writing %s failed: %s; the broker carries on, events are counted "
                  "as lost", self.node, self.path, exc.strerror or exc)

"""Append-only JSON Lines event log under a node's data directory.

This is the first, minimal form of DESIGN §7's spooled event logs: one line
per event with wall-clock and monotonic timestamps (the monotonic one lets
tests on one machine line up several nodes' events exactly). Rotation, the
versioned schema and sampling come with the analytics work.

Two threads write here (the broker loop and the heartbeat thread): one lock
keeps each record one whole line, and none lands after `close`.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

SCHEMA_VERSION = 1


class EventLog:
    def __init__(self, directory: Path, node: str) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / "events.jsonl"
        self.node = node
        self.failures = 0
        self._lock = threading.Lock()
        self._file = open(self.path, "a", encoding="utf-8", buffering=1)

    def write(self, event: str, **fields) -> None:
        record = {"v": SCHEMA_VERSION, "ts": time.time(), "mono_ms": time.monotonic_ns() // 1_000_000,
                  "node": self.node, "event": event, **fields}
        line = json.dumps(record, separators=(",", ":"), default=str) + "\n"
        with self._lock:
            if self._file.closed:
                return  # a late decision during shutdown: the log already said node_stopped
            try:
                self._file.write(line)
            except OSError:
                self.failures += 1  # a full disk stops event logging, never the broker

    def close(self) -> None:
        with self._lock:
            try:
                self._file.close()
            except OSError:
                pass

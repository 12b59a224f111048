"""The one way into the quorum core from outside the heartbeat thread.

Rules:
- The core is not thread-safe: `call(fn)` runs `fn(core, now_ms)` under the heartbeat thread's lock,
  with the clock read inside the lock, so a caller that waited for it never asks with a stale `now`.
- Only the heartbeat thread sends: a caller that changed the core (a forced bid, a handover step)
  calls `wake()` and that thread flushes what the core produced.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Callable, TypeVar

from ..clock import now_ms
from ..quorum.core import QuorumCore

T = TypeVar("T")


class QuorumHandle:
    def __init__(self, core: QuorumCore, lock: AbstractContextManager[object], wake: Callable[[], None]) -> None:
        self._core = core
        self._lock = lock
        self._wake = wake

    def call(self, fn: Callable[[QuorumCore, int], T]) -> T:
        with self._lock:
            return fn(self._core, now_ms())

    def wake(self) -> None:
        self._wake()

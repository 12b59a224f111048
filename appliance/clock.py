"""The one clock the adapters read; cores never read it, they are given `now_ms` (STYLE.md practice 2).

- `now_ms`: monotonic, for deadlines, leases and timers; it shares no origin across hosts or boots.
- `wall_ms`: Unix time, only for what a person or another host reads (expiry stamps, change logs).
"""

from __future__ import annotations

import time


def now_ms() -> int:
    return time.monotonic_ns() // 1_000_000


def wall_ms() -> int:
    return time.time_ns() // 1_000_000

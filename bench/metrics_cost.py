"""What the /metrics histograms cost on the message path, per acknowledged PUBLISH.

    python bench/metrics_cost.py [--n 1000000] [--rounds 5]

Theory of operation
-------------------
The broker stamps each PUBLISH that waits for durability when it is read (one `time.perf_counter()` and a
list append) and observes it once its acknowledgement is released (one more `perf_counter()` per batch and
one `Histogram.observe` per PUBLISH): appliance/broker/service.py. This measures that per-message work
against a peer measured in the same run, in the same process: a bare `perf_counter()` call, the cheapest
thing the path does anyway. Best of --rounds, so other load on the machine inflates neither side.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pairmq.appliance.instruments import NodeInstruments  # noqa: E402


def per_message_ns(n: int) -> float:
    """Stamp n reads, then observe them as one released batch would (appliance/broker/service.py)."""
    observe = NodeInstruments().publish_ack.observe
    clock = time.perf_counter
    started = time.perf_counter_ns()
    read_at: list[float] = []
    for _ in range(n):
        read_at.append(clock())
        if len(read_at) == 100:  # a batch of 100 waiting PUBLISHes released at once
            now = clock()
            for t in read_at:
                observe(now - t)
            read_at.clear()
    return (time.perf_counter_ns() - started) / n


def peer_ns(n: int) -> float:
    clock = time.perf_counter
    started = time.perf_counter_ns()
    for _ in range(n):
        clock()
    return (time.perf_counter_ns() - started) / n


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    ours = min(per_message_ns(args.n) for _ in range(args.rounds))
    peer = min(peer_ns(args.n) for _ in range(args.rounds))
    print(f"per acknowledged PUBLISH: {ours:.0f} ns (stamp + observe); a bare perf_counter() call: {peer:.0f} ns; "
          f"ratio {ours / peer:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

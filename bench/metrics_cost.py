"""What the /metrics histograms cost on the message path, per acknowledged PUBLISH.

    python bench/metrics_cost.py [--n 1000000] [--rounds 5] [--per-read 10]

Theory of operation
-------------------
The broker counts each packet that waits for durability, stamps the read that brought it once (one
`time.perf_counter()` per read), and observes a read's packets together once their acknowledgements are released
(one more `perf_counter()` and one `BatchHistogram.observe_n`): appliance/broker/service.py. This measures that
per-message work, with `--per-read` PUBLISHes per read, against a peer measured in the same run, in the same
process: a bare `perf_counter()` call, the cheapest thing the path does anyway. Best of --rounds, so other load
on the machine inflates neither side.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pairmq.appliance.instruments import NodeInstruments  # noqa: E402


def per_message_ns(n: int, per_read: int) -> float:
    """Count n waiting reads' packets, stamp each read, observe each read's packets as their released batch would
    (appliance/broker/service.py)."""
    observe = NodeInstruments().publish_ack.observe_n
    clock = time.perf_counter
    started = time.perf_counter_ns()
    waiting, read_at = 0, 0.0
    for _ in range(n):
        if not waiting:
            read_at = clock()
        waiting += 1
        if waiting == per_read:  # the read's packets released at once
            observe(clock() - read_at, waiting)
            waiting = 0
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
    parser.add_argument("--per-read", type=int, default=10, help="waiting PUBLISHes one read brings")
    args = parser.parse_args()
    ours = min(per_message_ns(args.n, args.per_read) for _ in range(args.rounds))
    peer = min(peer_ns(args.n) for _ in range(args.rounds))
    print(f"per acknowledged PUBLISH: {ours:.0f} ns (stamp + observe); a bare perf_counter() call: {peer:.0f} ns; "
          f"ratio {ours / peer:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Restart with a full spool: a group whose nodes hold many queued messages starts, and serves again.

    python bench/restart.py [--messages 1000000] [--payload 1024]

Theory of operation
-------------------
Both routing nodes' spools are built before any node starts (bench/spoolfill.py: the same ops, so the
same chain: the backup is in step with the primary, as after a clean shutdown of a group). Then the whole
group starts, and a client probes both hosts (tests/harness/probe.py, one CONNECT to each) until one
answers CONNACK 0. The time from starting the processes to that CONNACK is what a client sees of the
restart: loading the spool (the newest checkpoint, then the log after it), the broker core rebuilt
from it, the quorum's decision. Each routing node's own account of its spool load is read from its
log beside it. The goal: 1,000,000 queued 1 KiB messages serve again within 5 s (issue 23).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from pairmq.appliance.config import Limits  # noqa: E402
from pairmq.appliance.roles import Role  # noqa: E402
from bench.brokers import log  # noqa: E402
from bench.spoolfill import fill  # noqa: E402
from tests.harness.group import Group  # noqa: E402

GOAL_S = 5.0
TIMEOUT_S = 600.0


def measure(workdir: Path, messages: int, payload_bytes: int) -> dict:
    limits = Limits(session_queue_max_messages=max(messages, 100_000), session_queue_max_bytes=1 << 40,
                    spool_max_bytes=1 << 42)
    g = Group(workdir / "restart", limits=limits)  # the default timers: a restart as in production
    t = time.monotonic()
    for role in (Role.PRIMARY, Role.BACKUP):
        fill(g.config.node(role).data_dir / "spool", messages, payload_bytes)
    spool = g.config.node(Role.PRIMARY).data_dir / "spool"
    on_disk = sum(p.stat().st_size for p in spool.iterdir())
    log(f"  built both spools ({messages:,} messages of {payload_bytes} B, {on_disk / 1e6:,.0f} MB each) in "
        f"{time.monotonic() - t:.1f} s")
    with g:
        started = time.monotonic()
        g.start()
        while True:
            codes = g.probe_once(in_process=True)
            if 0 in codes.values():
                serving_s = time.monotonic() - started
                break
            if time.monotonic() - started > TIMEOUT_S:
                raise RuntimeError(f"no CONNACK 0 within {TIMEOUT_S:.0f} s\n{g.logs_tail()}")
            time.sleep(0.05)
        active = next(role for role, code in codes.items() if code == 0)
    return {"messages": messages, "payload_bytes": payload_bytes, "spool_mb": on_disk / 1e6,
            "serving_s": serving_s, "active": active.value}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--payload", type=int, default=1024)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = measure(Path(tmp), args.messages, args.payload)
    ok = out["serving_s"] <= GOAL_S
    print(f"group start → first CONNACK 0 ({out['active']}): {out['serving_s']:.2f} s with {out['messages']:,} "
          f"queued messages ({out['spool_mb']:,.0f} MB spool); goal ≤ {GOAL_S:.0f} s: {'met' if ok else 'missed'}")


if __name__ == "__main__":
    main()

"""S2 across failover, on the sans-I/O parts: thousands of seeded schedules of a broker with a
standby fed by the real mate-link ends (tests/harness/replication_sim.py), with late commits, a slow or
cut link, resyncs (incremental and snapshot), restarts and failovers. Every acknowledged message
reaches its subscribers, QoS 2 exactly once, in per-publisher order; retransmits by message id
after a failover are suppressed by the id history B holds (never stored twice).

PAIRMQ_REPL_SIM_SCHEDULES sets how many (default 1000); a failure names its seed and
`run_replicated_schedule(seed)` replays it. Seeds 0-499 are test_replication_handover.py's too: run in the
same session, each runs once (tests/harness/replication_sim.py `schedule_counts`).
"""

import os

import pytest

from tests.harness.replication_sim import schedule_counts

SCHEDULES = int(os.environ.get("PAIRMQ_REPL_SIM_SCHEDULES", "1000"))
BATCHES = 4


@pytest.mark.parametrize("batch", range(BATCHES))
def test_every_acknowledged_message_survives_failover(batch):
    totals = {"acknowledged": 0, "failovers": 0, "resyncs": 0, "suppressed after a failover": 0}
    for seed in range(batch, SCHEDULES, BATCHES):
        counts = schedule_counts(seed)  # raises on any violation, naming the seed
        totals["acknowledged"] += counts.acknowledged
        totals["failovers"] += counts.failovers
        totals["resyncs"] += counts.resyncs
        totals["suppressed after a failover"] += counts.suppressed_after_failover
    # The schedules must really exercise what they check: failovers with acknowledged traffic behind them.
    n = SCHEDULES // BATCHES
    assert totals["failovers"] > n // 3 and totals["acknowledged"] > 5 * n and totals["resyncs"] > n, totals
    assert totals["suppressed after a failover"] > n // 10, totals
    print(f"batch {batch}: {totals}")

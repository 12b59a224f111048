"""Thousands of seeded schedules through the broker core with late commits and crashes
(tests/harness/broker_sim.py): no acknowledged message lost, QoS 2 exactly once, per-publisher order.

PAIRMQ_BROKER_SIM_SCHEDULES sets how many (default 600; a failure names its seed, and
`run_schedule(seed)` replays it).
"""

import os

import pytest

from tests.harness.broker_sim import run_schedule, topic_matches

SCHEDULES = int(os.environ.get("PAIRMQ_BROKER_SIM_SCHEDULES", "600"))
BATCHES = 6


@pytest.mark.parametrize("batch", range(BATCHES))
def test_random_schedules_keep_every_acknowledged_message(batch):
    totals = {"acknowledged": 0, "delivered": 0, "crashes": 0, "retransmits by message id": 0}
    for seed in range(batch, SCHEDULES, BATCHES):
        sim = run_schedule(seed)
        totals["acknowledged"] += sum(len(c.acknowledged) for c in sim.clients)
        totals["delivered"] += sum(len(c.delivered) for c in sim.clients)
        totals["crashes"] += sim.crashes
        totals["retransmits by message id"] += sum(c.retransmits for c in sim.clients)
    # The schedules must really exercise what they check.
    assert totals["acknowledged"] > 5 * (SCHEDULES // BATCHES), totals
    assert totals["crashes"] > SCHEDULES // BATCHES, totals
    assert totals["retransmits by message id"] > SCHEDULES // BATCHES, totals
    print(f"batch {batch}: {totals}")


def test_the_oracle_matcher():
    assert topic_matches("cars/+/door", "cars/1/door") and not topic_matches("cars/+/door", "cars/1/2/door")
    assert topic_matches("cars/#", "cars") and topic_matches("#", "pay/eu") and not topic_matches("pay/#", "cars/1")

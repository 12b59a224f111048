"""Thousands of seeded random fault schedules against the quorum cores.

Each schedule mixes crashes, restarts, SIGSTOP-style pauses, symmetric and
one-way partitions, loss, delay, duplication and replayed datagrams, and checks
S1, S3 and epoch monotonicity after every step (tests/harness/simulator.py). CI runs
PAIRMQ_SIM_SCHEDULES (default 2,000) fixed seeds in BATCHES tests, which the suite's
workers share (tests/conftest.py); a failure prints its seed and the per-node trace,
and `random_schedule(seed)` replays it.
"""

import pytest

from tests.harness.simulator import random_schedule, seed_batches

BATCHES = seed_batches(2000, 8)  # one core each: the scheduler spreads them over the workers


def test_the_batches_cover_every_seed_once(monkeypatch):
    monkeypatch.setenv("PAIRMQ_SIM_SCHEDULES", "1001")
    monkeypatch.setenv("PAIRMQ_SIM_FIRST_SEED", "7")
    assert [seed for batch in seed_batches(2000, 8) for seed in batch] == list(range(7, 1008))


@pytest.mark.parametrize("batch", range(len(BATCHES)))
def test_random_fault_schedules_keep_s1_s3_and_epochs(batch):
    seeds = BATCHES[batch]
    steps = activations = 0
    for seed in seeds:
        sim = random_schedule(seed, trace=False)
        steps += sim.steps
        activations += len(sim.activations)
    # The schedules must actually exercise failovers, not just idle.
    assert activations > len(seeds)
    print(f"batch {batch}: {len(seeds)} schedules, {steps} steps, {activations} activations, no violation")

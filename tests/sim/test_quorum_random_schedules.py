"""Thousands of seeded random fault schedules against the quorum cores.

Each schedule mixes crashes, restarts, SIGSTOP-style pauses, symmetric and
one-way partitions, loss, delay, duplication and replayed datagrams, and checks
S1, S3 and epoch monotonicity after every step (tests/harness/simulator.py). CI runs
PAIRMQ_SIM_SCHEDULES (default 2,000) fixed seeds in BATCHES tests, which the suite's
workers share (tests/conftest.py); a failure prints its seed and the per-node trace,
and `random_schedule(seed)` replays it.
"""

import os

import pytest

from tests.harness.simulator import random_schedule

SCHEDULES = int(os.environ.get("PAIRMQ_SIM_SCHEDULES", "2000"))
FIRST_SEED = int(os.environ.get("PAIRMQ_SIM_FIRST_SEED", "0"))
BATCHES = 8  # one core each: the scheduler spreads them, where a process pool inside one test hid its second core


def seeds_of(batch: int) -> range:
    first, last = FIRST_SEED + SCHEDULES * batch // BATCHES, FIRST_SEED + SCHEDULES * (batch + 1) // BATCHES
    return range(first, last)


def test_the_batches_cover_every_seed_once():
    assert [s for b in range(BATCHES) for s in seeds_of(b)] == list(range(FIRST_SEED, FIRST_SEED + SCHEDULES))


@pytest.mark.parametrize("batch", range(BATCHES))
def test_random_fault_schedules_keep_s1_s3_and_epochs(batch):
    seeds = seeds_of(batch)
    steps = activations = 0
    for seed in seeds:
        sim = random_schedule(seed, trace=False)
        steps += sim.steps
        activations += len(sim.activations)
    # The schedules must actually exercise failovers, not just idle.
    assert activations > len(seeds)
    print(f"batch {batch}: {len(seeds)} schedules, {steps} steps, {activations} activations, no violation")

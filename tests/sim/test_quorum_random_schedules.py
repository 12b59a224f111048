"""Thousands of seeded random fault schedules against the quorum cores.

Each schedule mixes crashes, restarts, SIGSTOP-style pauses, symmetric and
one-way partitions, loss, delay, duplication and replayed datagrams, and checks
S1, S3 and epoch monotonicity after every step (tests/harness/simulator.py). CI runs
PAIRMQ_SIM_SCHEDULES (default 2,000) fixed seeds on both cores; a failure
prints its seed and the per-node trace, and `random_schedule(seed)` replays it.
"""

import os
from concurrent.futures import ProcessPoolExecutor

from tests.harness.simulator import random_schedule

SCHEDULES = int(os.environ.get("PAIRMQ_SIM_SCHEDULES", "2000"))
FIRST_SEED = int(os.environ.get("PAIRMQ_SIM_FIRST_SEED", "0"))


def _run_batch(seeds: range) -> tuple[int, int, int]:
    steps = activations = 0
    for seed in seeds:
        sim = random_schedule(seed, trace=False)
        steps += sim.steps
        activations += len(sim.activations)
    return len(seeds), steps, activations


def _replay_with_trace(seed: int) -> None:
    random_schedule(seed, trace=True)


def test_random_fault_schedules_keep_s1_s3_and_epochs():
    workers = max(1, min(2, os.cpu_count() or 1))
    chunk = 50
    batches = [range(s, min(s + chunk, FIRST_SEED + SCHEDULES)) for s in range(FIRST_SEED, FIRST_SEED + SCHEDULES, chunk)]
    total = steps = activations = 0
    with ProcessPoolExecutor(workers) as pool:
        for batch, result in zip(batches, pool.map(_run_batch, batches)):
            n, s, a = result
            total, steps, activations = total + n, steps + s, activations + a
    assert total == SCHEDULES
    # The schedules must actually exercise failovers, not just idle.
    assert activations > SCHEDULES
    print(f"{total} schedules, {steps} steps, {activations} activations, no violation")

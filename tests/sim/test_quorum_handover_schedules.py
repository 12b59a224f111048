"""Thousands of seeded random schedules with planned handovers mixed into the faults.

Releases (forced or not, with drains from 1 ms to past the 2 s bound), reverts and auto-revert (on in
half the schedules) interleave with crashes, restarts, pauses, one-way and symmetric partitions, loss,
delay, duplication, replays and broker stalls; S1, S3 and epoch monotonicity are checked after every
step (tests/harness/simulator.py). A failure prints its seed; `random_schedule(seed, handovers=True)` replays it.
"""

import pytest

from tests.harness.simulator import random_schedule, seed_batches

# 1,000 by default: they come on top of test_quorum_random_schedules.py's 2,000, and CI's
# 15-minute budget is shared. PAIRMQ_SIM_SCHEDULES=N runs N here too, for a longer soak.
BATCHES = seed_batches(1000, 4)  # one test and one core each: the suite's workers share them (tests/conftest.py)


def _run_batch(seeds: range) -> tuple[int, int, int, int]:
    activations = begun = yields = refused = 0
    for seed in seeds:
        sim = random_schedule(seed, trace=False, handovers=True)
        activations += len(sim.activations)
        begun += sum(1 for _, _, what in sim.handovers if what == "begun")
        refused += sum(1 for _, _, what in sim.handovers if what.startswith("refused"))
        yields += sum(1 for _, d in sim.decisions if d.kind == "step_down" and "handing activity over" in d.reason)
    return activations, begun, yields, refused


@pytest.mark.parametrize("batch", range(len(BATCHES)))
def test_random_schedules_with_handovers_keep_s1_s3_and_epochs(batch):
    seeds = BATCHES[batch]
    activations, begun, yields, refused = _run_batch(seeds)
    # The schedules must exercise handovers that complete, not only refusals.
    assert yields > len(seeds) // 2 and begun > yields and refused > 0
    print(f"batch {batch}, {len(seeds)} schedules: {activations} activations, {begun} handovers begun, {yields} "
          f"completed (yielded), {refused} refused; no violation")

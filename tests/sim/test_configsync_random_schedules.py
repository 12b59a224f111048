"""Config-sync over 2,000 seeded schedules: changes, cut links, crashes, restarts and failovers.

After every schedule, healed, both nodes hold the same version and digest and the active sees its
standby In-Sync (C1); a change the standby confirmed survives every failover (C2); no store is ever
half-applied (C3). A failure names its seed: `ConfigSyncSim(seed).run(STEPS)` replays it.
"""

from __future__ import annotations

import pytest

from tests.harness.configsync_sim import ConfigSyncSim

SCHEDULES = 2_000
STEPS = 60


@pytest.mark.parametrize("block", range(10))
def test_config_sync_converges_and_keeps_confirmed_changes(block):
    totals = dict(changes=0, refused=0, snapshots=0, failovers=0)
    for seed in range(block * SCHEDULES // 10, (block + 1) * SCHEDULES // 10):
        sim = ConfigSyncSim(seed)
        sim.run(STEPS)
        for key in totals:
            totals[key] += getattr(sim, key)
    # The schedules must really exercise what they claim to.
    assert totals["changes"] > 1_000 and totals["refused"] > 50, totals
    assert totals["snapshots"] > 10 and totals["failovers"] > 100, totals

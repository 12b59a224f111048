"""S2 across planned handovers on the sans-I/O parts (tests/harness/replication_sim.py): the new active serves
from its own replicated spool, so a handover that did not wait for the standby's acks loses messages.

A fixed schedule hands over A → B, publishes, hands back B → A; then seeded random schedules mix
handovers with late commits, cut links, resyncs, crashes and failovers. Every acknowledged message
reaches its subscribers, QoS 2 exactly once, in per-publisher order (BrokerSim's checks).
"""

import os

from tests.harness.replication_sim import ReplicatedSim, schedule_counts

SCHEDULES = int(os.environ.get("PAIRMQ_REPL_SIM_SCHEDULES", "1000")) // 2


def _traffic(sim: ReplicatedSim, steps: int) -> None:
    """Random traffic and faults, then heal and let the link catch up (B in sync again, unless a crash
    failed over to it)."""
    for _ in range(steps):
        sim.step()
    sim.heal()
    sim._settle_link()


def test_handover_a_to_b_then_back_loses_nothing():
    sim = ReplicatedSim(11)  # a seed whose first 450 steps crash nothing (a failover ends handovers)
    sim.setup()
    _traffic(sim, 150)
    acked_before = sum(len(c.acknowledged) for c in sim.clients)
    epoch = sim.epoch
    assert sim.handover(), "B was in sync: the handover must happen"
    assert sim.epoch == epoch + 1 and sim.b_head == sim.head  # A, now the standby, rejoined in step
    _traffic(sim, 150)
    assert sim.handover(), "the old active stands by in sync: the handover back must happen"
    _traffic(sim, 150)
    sim.heal()
    sim.check()
    acked = sum(len(c.acknowledged) for c in sim.clients)
    print(f"{sim.handovers} handovers, {acked} acknowledged ({acked_before} before the first), all delivered")
    assert sim.handovers >= 2 and acked > acked_before > 0  # the random steps hand over too


def test_handover_refused_without_an_in_sync_standby():
    sim = ReplicatedSim(3)
    sim.setup()
    sim.cut()
    assert not sim.handover() and sim.handovers == 0


def test_random_schedules_with_handovers_keep_s2():
    handovers = acknowledged = 0
    for seed in range(SCHEDULES):  # test_replication_random_schedules.py's first seeds too: each runs once
        counts = schedule_counts(seed)  # raises on any violation, naming the seed
        handovers += counts.handovers
        acknowledged += counts.acknowledged
    assert handovers > SCHEDULES // 10 and acknowledged > 5 * SCHEDULES
    print(f"{SCHEDULES} schedules: {handovers} handovers, {acknowledged} acknowledged, none lost")

"""Rule R9 (appliance/quorum/core.py): an active acknowledging alone releases only what a peer echoed back.

Hand-written incidents on the deterministic simulator (S1, S3 and epochs checked at every step); the
active's mate link is driven by hand the way appliance/node/replication.py's sync drives it.
"""

from pairmq.appliance.config import Timers
from pairmq.appliance.roles import Role
from tests.harness.simulator import Simulation

P, B, M = Role.PRIMARY, Role.BACKUP, Role.MONITOR
TIMERS = Timers()


def tell(sim: Simulation, role: Role, fn):
    """Run `fn(core, now)` on `role`'s core at the simulator's instant, then send what it produced."""
    node = sim.nodes[role]
    result = fn(node.core, node.local(sim.t))
    sim._after(node)
    return result


def sync(sim: Simulation, role: Role, *, caught_up: bool, released: int, durable: int) -> int:
    """One sync of the active's mate link (appliance/node/replication.py): returns the release bound."""
    def fn(core, now):
        core.mate_link(now, caught_up, "fell behind" if caught_up else "is not connected on the mate link")
        core.released_position(now, released, durable)
        return core.release_bound(now)
    return tell(sim, role, fn)


def active_backup_with_the_primary_out_of_sync(seed: int = 11) -> Simulation:
    """The netns incident's start: the backup active at epoch 2, then its mate link cut past the lease."""
    sim = Simulation(seed)
    sim.run_until(2_000)
    sim.crash(P)
    assert sim.first_serving_after(sim.t, sim.t + 3_000, B) is not None
    sim.restart(P)
    for _ in range(30):  # in sync again: the link caught up, released 940 and acked by the primary
        sim.run_for(50)
        sync(sim, B, caught_up=True, released=940, durable=940)
    assert sim.core(P).in_sync(sim.nodes[P].local(sim.t))
    assert sync(sim, B, caught_up=True, released=940, durable=940) == -1, "in sync: only the mate releases"
    assert (sim.core(P).state.spool_epoch, sim.core(P).state.spool_seq) == (2, 940)
    sync(sim, B, caught_up=False, released=940, durable=940)  # TCP 8301 cut: heartbeats go on
    sim.run_for(TIMERS.insync_ms + 100)
    assert not sim.core(P).in_sync(sim.nodes[P].local(sim.t))
    return sim


def test_an_active_alone_releases_only_a_position_a_peer_echoed_back():
    sim = active_backup_with_the_primary_out_of_sync()
    assert sync(sim, B, caught_up=False, released=940, durable=940) == 940, "nothing new: the old echo stands"
    assert sync(sim, B, caught_up=False, released=940, durable=1039) == 940, "advertised, not yet echoed"
    assert sim.core(B).state.spool_seq == 1039 and sim.nodes[B].store._state.spool_seq == 1039, "on disk first"
    sim.run_for(10)  # the advertisement left at once and the peers answered it at once, not at their next tick
    assert tell(sim, B, lambda core, now: core.release_bound(now)) == 1039
    assert sim.core(M).peers[B].hb.spool_seq == 1039 and sim.core(P).peers[B].hb.spool_seq == 1039


def test_the_out_of_sync_survivor_refuses_activity_when_only_the_monitor_heard_the_position():
    sim = active_backup_with_the_primary_out_of_sync()
    sim.cut(B, P)  # the primary never hears the advertisement itself
    sync(sim, B, caught_up=False, released=940, durable=1039)
    bound = 0
    while bound < 1039:
        sim.run_for(10)
        bound = sync(sim, B, caught_up=False, released=940, durable=1039)
    assert sim.core(P).peers[B].hb.spool_seq == 940, "the primary's own copy is stale: only the monitor's is not"
    sim.crash(B)  # right after releasing 99 acknowledgements alone
    sim.heal()
    sim.run_for(4 * TIMERS.lease_ms)
    assert sim.serving() == []
    assert [r for r in sim.reasons(P, "activate") if "epoch 3" in r] == []
    assert tell(sim, P, lambda core, now: core._bid_obstacle(now)) == "cannot show it is up to date"
    assert tell(sim, P, lambda core, now: core._eligible_reason(now)) == (False, "backup is more up to date")


def test_truly_equal_survivors_the_primary_still_wins_the_tie():
    sim = active_backup_with_the_primary_out_of_sync()
    sync(sim, B, caught_up=False, released=940, durable=940)  # nothing published while alone
    sim.run_for(200)
    sim.crash(B)
    assert sim.first_serving_after(sim.t, sim.t + 4 * TIMERS.lease_ms, P) is not None
    [activation] = [r for r in sim.reasons(P, "activate") if "epoch 3" in r]
    assert "most up to date (spool 2/940 vs 2/940)" in activation


def test_in_sync_acknowledgements_wait_only_for_the_mate():
    sim = Simulation(3)
    sim.run_until(2_000)
    for _ in range(20):
        sim.run_for(50)
        assert sync(sim, P, caught_up=True, released=10, durable=25) == -1
    assert sim.core(P).state.spool_seq == 10, "in sync the released position is advertised, not the durable one"


def test_in_sync_the_position_reaches_disk_from_the_timer_not_from_the_caller():
    """The broker loop's sync never waits for a save while the mate is in sync: the core's timer (the heartbeat
    thread's) writes the position at most POSITION_SAVE_MS later, and a restart in between claims less."""
    from pairmq.appliance.quorum.core import POSITION_SAVE_MS

    sim = Simulation(12)
    sim.run_until(2_000)
    active = sim.serving()[0]
    store = sim.nodes[active].store
    for _ in range(30):  # the mate caught up and in sync
        sim.run_for(50)
        sync(sim, active, caught_up=True, released=10, durable=10)
    assert sync(sim, active, caught_up=True, released=10, durable=10) == -1, "in sync: only the mate releases"
    sim.run_for(POSITION_SAVE_MS + 100)  # any earlier position is on disk by now
    saves = store.saves
    sync(sim, active, caught_up=True, released=500, durable=500)
    assert sim.core(active).state.spool_seq == 500, "advertised at once, from memory"
    assert (store.saves, store._state.spool_seq) == (saves, 10), "the caller did not save"
    sim.run_for(POSITION_SAVE_MS + 100)
    assert store._state.spool_seq == 500 and store.saves == saves + 1, "the timer saved it, once"
    sim.run_for(POSITION_SAVE_MS + 100)
    assert store.saves == saves + 1, "nothing new: no save"


def test_alone_the_position_is_still_on_disk_before_the_call_returns():
    sim = active_backup_with_the_primary_out_of_sync()
    saves = sim.nodes[B].store.saves
    sync(sim, B, caught_up=False, released=940, durable=1200)
    assert sim.nodes[B].store._state.spool_seq == 1200 and sim.nodes[B].store.saves == saves + 1, "R9: disk first"

"""Hand-written incidents for each quorum rule, on the deterministic simulator.

Each test names the incident it replays; the simulator checks S1, S3 and
epoch monotonicity after every step, so each test also proves those hold.
"""

import pytest

from pairmq.appliance.config import Timers
from pairmq.appliance.errors import LocalProtocolError
from pairmq.appliance.roles import Role
from tests.harness.simulator import Simulation

P, B, M = Role.PRIMARY, Role.BACKUP, Role.MONITOR
TIMERS = Timers()
BUDGET_MS = TIMERS.expected_failover_ms + 200  # well under the 2 s the issue allows


def started(seed: int = 7) -> Simulation:
    sim = Simulation(seed)
    sim.run_until(2_000)
    assert sim.serving() == [P]
    assert sim.core(B).in_sync(sim.nodes[B].local(sim.t))
    return sim


def test_group_start_elects_primary_with_reasons():
    sim = Simulation(1)
    t = sim.first_serving_after(0, 3_000)
    assert sim.serving() == [P]
    assert t <= TIMERS.lease_ms + TIMERS.takeover_margin_ms + 50
    [activation] = sim.reasons(P, "activate")
    assert activation.startswith("primary: nobody active")
    assert "concurs" in activation and activation.endswith("→ taking activity, epoch 1")
    assert any("granting epoch 1 to primary" in r for r in sim.reasons(M, "vote"))


def test_kill_active_backup_takes_over_within_budget():
    sim = started()
    kill = sim.t
    sim.crash(P)
    t = sim.first_serving_after(kill, kill + 3_000)
    assert sim.serving() == [B]
    assert t - kill <= BUDGET_MS
    [activation] = sim.reasons(B, "activate")
    assert activation.startswith("backup: primary unseen 0.6")
    assert "monitor concurs, in sync → taking activity, epoch 2" in activation


def test_sigstop_active_for_three_leases_then_sigcont_never_two_serve():
    sim = started()
    sim.pause(P)
    sim.run_for(3 * TIMERS.lease_ms)
    assert sim.serving() == [B]
    sim.resume(P)  # its socket's queued datagrams are read after the clock jumped
    sim.run_for(2_000)
    assert sim.serving() == [B]
    assert any("lease expired" in r or "epoch 2" in r for r in sim.reasons(P, "step_down"))


def test_old_primary_restarted_comes_back_standby():
    sim = started()
    sim.crash(P)
    sim.run_for(2_000)
    sim.restart(P)
    sim.run_for(3_000)
    assert sim.serving() == [B]
    assert sim.core(P).activity.name == "STANDBY"
    assert sim.core(P).state.epoch == 2


def test_monitor_isolated_nothing_changes():
    sim = started()
    decisions_before = len(sim.reasons(P, "activate")) + len(sim.reasons(B, "activate"))
    sim.isolate(M)
    sim.run_for(5_000)
    assert sim.serving() == [P]
    assert len(sim.reasons(P, "activate")) + len(sim.reasons(B, "activate")) == decisions_before
    assert not sim.reasons(P, "step_down")


def test_partition_primary_backup_link_only_no_failover():
    sim = started()
    sim.cut(P, B)
    sim.run_for(5_000)
    assert sim.serving() == [P]
    assert not sim.reasons(B, "activate")
    refusals = sim.reasons(M, "refuse")
    assert all("primary claimed activity" in r for r in refusals)


def test_active_cut_off_from_both_stops_serving_and_backup_takes_over():
    sim = started()
    cut = sim.t
    sim.isolate(P)
    sim.run_for(TIMERS.lease_ms + 1)
    assert P not in sim.serving(), "the isolated active must stop when its lease runs out"
    t = sim.first_serving_after(sim.t, cut + 3_000, role=B)
    assert t is not None and t - cut <= BUDGET_MS
    sim.heal()
    sim.run_for(3_000)
    assert sim.serving() == [B]


@pytest.mark.parametrize("src,dst", [(P, B), (B, P)])
def test_partition_active_from_standby_one_way(src, dst):
    sim = started()
    sim.cut_one_way(src, dst)
    sim.run_for(5_000)
    # The monitor still hears the active's claims, so it refuses the backup: no failover.
    assert sim.serving() == [P]


@pytest.mark.parametrize("src,dst", [(P, M), (M, P)])
def test_partition_active_from_monitor_one_way(src, dst):
    sim = started()
    sim.cut_one_way(src, dst)
    sim.run_for(5_000)
    assert sim.serving() == [P]


def test_active_loses_all_inbound_traffic_then_backup_serves():
    sim = started()
    sim.cut_one_way(B, P)
    sim.cut_one_way(M, P)
    sim.run_for(5_000)
    # The primary hears no echo, so its lease ends; its heartbeats still reach the
    # others, now claiming standby, so they know nobody serves and elect the backup.
    assert sim.serving() == [B]


def test_monitor_down_during_failover_nobody_takes_over_alone():
    sim = started()
    sim.crash(M)
    sim.run_for(500)
    sim.crash(P)
    sim.run_for(5_000)
    assert sim.serving() == [], "with no peer to see, the backup must not serve (S3)"
    # The restarted monitor never heard the primary, so nobody can prove the backup
    # holds everything the primary acknowledged while the monitor was away.
    sim.restart(M)
    sim.run_for(3_000)
    assert sim.serving() == []
    assert sim.reasons(B, "activate") == []
    sim.force(B)
    assert sim.first_serving_after(sim.t, sim.t + 3_000, role=B) is not None


def test_a_forced_bid_wins_a_restarted_monitors_vote_even_if_the_candidate_thinks_itself_up_to_date():
    """The backup served after the primary died, so its spool is ahead of the primary's as it remembers it;
    the monitor restarted since, never heard the primary and cannot confirm that. Only the operator's forced
    bid can bring service back, and it must say it is forced even though the backup calls itself eligible."""
    sim = started()
    sim.crash(P)
    assert sim.first_serving_after(sim.t, sim.t + 3_000, role=B) is not None
    sim.core(B).set_spool_position(sim.core(B).active_epoch, 5)  # it acknowledged messages at its epoch
    sim.crash(M)
    sim.run_for(2_000)
    assert sim.serving() == []
    sim.restart(M)
    sim.run_for(3_000)
    assert sim.serving() == [], "the monitor cannot know the backup holds what the primary acknowledged"
    sim.force(B)
    assert sim.first_serving_after(sim.t, sim.t + 3_000, role=B) is not None


def test_higher_epoch_fences_the_active():
    sim = started()
    sim.cut(P, B)
    sim.cut(P, M)
    sim.run_for(2_000)
    assert sim.serving() == [B]
    sim.heal()
    sim.run_for(1_000)
    assert sim.serving() == [B]
    assert sim.core(P).state.epoch == sim.core(B).active_epoch


def test_replayed_and_duplicated_heartbeats_change_nothing():
    sim = started()
    sim.set_network(duplicate=0.5, delay_ms=(0, 40))
    sim.replay_rate = 0.5
    sim.run_for(10_000)
    assert sim.serving() == [P]
    assert sim.core(P).state.epoch == 1
    rejected = sum(sim.core(r).auth.rejected["replayed"] + sim.core(r).auth.rejected["stale"] for r in Role)
    assert rejected > 100


def test_standby_out_of_sync_does_not_take_over():
    sim = started()
    sim.crash(P)
    sim.run_for(2_000)
    sim.restart(P)  # comes back standby, but missed epoch 2: not in sync, not most up to date
    sim.run_for(2_000)
    bids_before = len(sim.reasons(P, "bid"))
    sim.crash(B)
    sim.run_for(5_000)
    assert sim.serving() == []
    assert len(sim.reasons(P, "bid")) == bids_before, "the restarted primary missed epoch 2 and must not bid"


def test_the_mate_link_s_reason_is_the_decision_s_when_the_standby_leaves_and_rejoins_sync():
    """The sentence names why (not connected, behind by how much...), not a blanket "fell behind": right after a
    failover the new active's standby is simply not connected on the mate link yet."""
    sim = started()
    core, now = sim.core(P), sim.nodes[P].local(sim.t)
    core.mate_link(now, False, "is not connected on the mate link")
    sim._after(sim.nodes[P])
    assert sim.reasons(P, "sync")[-1] == ("primary: backup is not connected on the mate link → redundancy down, "
                                         "backup out of sync for epoch 1")
    core.mate_link(now, True)
    sim._after(sim.nodes[P])
    assert sim.reasons(P, "sync")[-1] == "primary: backup caught up on the mate link → in sync, epoch 1"


def test_operator_force_needs_data_loss_acknowledgement_then_wins():
    sim = started()
    sim.crash(P)
    sim.run_for(2_000)
    sim.restart(P)
    sim.run_for(2_000)
    sim.crash(B)
    sim.run_for(3_000)
    assert sim.serving() == []
    with pytest.raises(LocalProtocolError, match="data loss|acknowledg"):
        sim.core(P).request_force(sim.nodes[P].local(sim.t), acknowledge_data_loss=False)
    sim.force(P)
    t = sim.first_serving_after(sim.t, sim.t + 3_000, role=P)
    assert t is not None
    assert "forced by operator" in sim.reasons(P, "activate")[-1]


def test_start_up_most_up_to_date_node_wins_even_if_backup():
    sim = Simulation(3)
    for role in (P, B, M):
        sim.crash(role)
    sim.nodes[B].store._state.spool_epoch = 4
    sim.nodes[B].store._state.spool_seq = 10
    sim.nodes[P].store._state.spool_epoch = 4
    sim.nodes[P].store._state.spool_seq = 9
    for role in (P, B, M):
        sim.nodes[role].store._state.epoch = 4
        sim.restart(role)
    sim.first_serving_after(sim.t, sim.t + 3_000)
    assert sim.serving() == [B]
    assert "most up to date (spool 4/10 vs 4/9)" in sim.reasons(B, "activate")[0]


def test_start_up_without_proof_waits_for_operator():
    sim = Simulation(4)
    sim.crash(B)
    for role in (P, M):
        sim.crash(role)
        sim.nodes[role].store._state.epoch = 3
        sim.restart(role)
    sim.run_for(5_000)
    assert sim.serving() == [], "the backup may hold newer data nobody here has seen"
    sim.force(P)
    assert sim.first_serving_after(sim.t, sim.t + 3_000, role=P) is not None


def test_clock_drift_and_jitter_keep_single_active():
    for seed in range(20):
        sim = Simulation(seed, drift_ppm=1_000)
        sim.set_network(loss=0.2, delay_ms=(0, 120), duplicate=0.1)
        sim.run_until(20_000)  # invariants are checked at every step
        assert len(sim.serving()) <= 1


def test_broker_loop_stalled_past_the_bound_active_releases_activity_to_backup():
    """R6: heartbeats run on their own thread, so a hung broker loop alone must not keep activity."""
    sim = started()
    bids_before = len(sim.reasons(P, "bid"))
    stalled_at = sim.t
    sim.stall_broker(P)
    sim.run_for(TIMERS.broker_stall_ms - 100)
    assert sim.serving() == [P], "a stall shorter than the bound changes nothing"
    t = sim.first_serving_after(sim.t, stalled_at + TIMERS.broker_stall_ms + 3_000, role=B)
    assert t is not None and sim.serving() == [B]
    assert t - stalled_at <= TIMERS.broker_stall_ms + TIMERS.heartbeat_interval_ms + BUDGET_MS
    [step_down] = sim.reasons(P, "step_down")
    assert step_down.startswith("primary: broker event loop stalled 5.0")
    assert step_down.endswith("s → releasing activity, epoch 1")
    [activation] = sim.reasons(B, "activate")
    assert activation.startswith("backup: primary gave up activity")
    # The primary's heartbeat thread still votes: either voter may be the one that concurs.
    assert activation.endswith("concurs, in sync → taking activity, epoch 2")
    sim.run_for(3_000)
    assert sim.serving() == [B] and len(sim.reasons(P, "bid")) == bids_before, "a stalled broker never bids"
    sim.unstall_broker(P)
    sim.run_for(3_000)
    assert sim.serving() == [B]
    assert sim.core(P).activity.name == "STANDBY"


def test_overload_stall_shorter_than_the_bound_never_fails_over():
    """A storm stalls the broker loop for seconds; the heartbeat thread keeps the lease all along."""
    sim = started()
    for _ in range(5):
        sim.stall_broker(P)
        sim.run_for(TIMERS.broker_stall_ms // 2)
        sim.unstall_broker(P)
        sim.run_for(200)
    assert sim.serving() == [P]
    assert not sim.reasons(P, "step_down") and not sim.reasons(B, "bid") and not sim.reasons(B, "activate")


def test_stalled_standby_does_not_bid_when_the_active_dies():
    sim = started()
    bids_before = len(sim.reasons(B, "bid"))
    sim.stall_broker(B)
    sim.run_for(TIMERS.broker_stall_ms + 100)
    sim.crash(P)
    sim.run_for(TIMERS.lease_ms + TIMERS.takeover_margin_ms + 2 * TIMERS.heartbeat_interval_ms)
    assert sim.serving() == [] and len(sim.reasons(B, "bid")) == bids_before, "it could not serve the clients it took"
    sim.unstall_broker(B)  # back while still in sync: the usual takeover follows at once
    t = sim.first_serving_after(sim.t, sim.t + TIMERS.heartbeat_interval_ms * 3, role=B)
    assert t is not None and sim.serving() == [B]

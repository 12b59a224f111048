"""Hand-written incidents for the planned handover rules (appliance/quorum/handover.py, H1-H7), on the
deterministic simulator: every step also checks S1, S3 and epoch monotonicity."""

import pytest

from pairmq.appliance.config import Timers
from pairmq.appliance.errors import LocalProtocolError
from pairmq.appliance.roles import Role
from tests.harness.simulator import Simulation

P, B, M = Role.PRIMARY, Role.BACKUP, Role.MONITOR
TIMERS = Timers()
QUIET_MS = TIMERS.lease_ms + TIMERS.takeover_margin_ms


def started(seed: int = 7, **kw) -> Simulation:
    sim = Simulation(seed, **kw)
    sim.run_until(2_000)
    assert sim.serving() == [P]
    assert sim.core(B).in_sync(sim.nodes[B].local(sim.t))
    return sim


def now(sim, role):
    return sim.nodes[role].local(sim.t)


def test_release_hands_over_to_the_in_sync_backup_well_before_a_failover():
    sim = started()
    t0 = sim.t
    assert sim.release(P, drain_ms=5)
    assert sim.serving() == []  # H2: the gate closed at once, before anything let the backup in
    t = sim.first_serving_after(t0, t0 + 3_000)
    assert sim.serving() == [B]
    assert t - t0 < 100, "a handover must not wait out lease + margin"
    [handover] = sim.reasons(P, "handover")
    assert handover == "primary: operator released activity → stopped taking client packets, waiting for the " \
                       "backup to hold every op, epoch 1"
    assert sim.reasons(P, "step_down")[-1] == ("primary: operator released activity: the backup holds every op "
                                               "through 0 → handing activity over, epoch 1")
    activation = sim.reasons(B, "activate")[-1]
    assert activation.startswith("backup: primary handed activity over (yielded epoch 1)")
    assert activation.endswith("in sync → taking activity, epoch 2")
    # H6: the old active does not bid back; it stands by, in sync with the new active.
    sim.run_for(3_000)
    assert sim.serving() == [B]
    assert sim.core(P).in_sync(now(sim, P))
    assert not [d for t, d in sim.decisions if t > t0 and d.role is P and d.kind == "bid"]


def test_revert_moves_activity_back_to_the_primary():
    sim = started()
    sim.release(P)
    sim.run_for(1_500)
    assert sim.serving() == [B]
    t0 = sim.t
    assert sim.revert()
    t = sim.first_serving_after(t0, t0 + 3_000, P)
    assert sim.serving() == [P] and t - t0 < 100
    assert sim.core(P).active_epoch == 3


def test_release_refused_on_a_standby_and_without_an_in_sync_mate():
    sim = started()
    with pytest.raises(LocalProtocolError, match="does not hold activity"):
        sim.core(B).begin_handover(now(sim, B), "operator released activity")
    sim.crash(B)
    sim.run_for(2_000)
    assert sim.serving() == [P]
    with pytest.raises(LocalProtocolError, match="backup is not reachable.*--force"):
        sim.core(P).begin_handover(now(sim, P), "operator released activity")
    assert sim.serving() == [P]  # refused: nothing changed


def test_forced_release_without_a_mate_is_a_plain_step_down_and_the_group_recovers():
    sim = started()
    sim.crash(B)
    sim.run_for(2_000)
    t0 = sim.t
    assert sim.release(P, force=True)
    assert sim.serving() == []
    assert sim.reasons(P, "step_down")[-1] == ("primary: operator released activity (forced, backup not in sync) "
                                               "→ stepping down, epoch 1")
    # Nobody else can serve; the primary bids again by the normal rules once its hold is over.
    t = sim.first_serving_after(t0, t0 + 5_000)
    assert sim.serving() == [P] and t - t0 >= QUIET_MS
    assert sim.core(P).active_epoch == 2


def test_backup_dying_mid_drain_aborts_and_the_primary_serves_again():
    sim = started()
    t0 = sim.t
    sim.release(P, drain_ms=3_000)  # the drain outlasts the 2 s bound
    sim.crash(B)
    t = sim.first_serving_after(t0, t0 + 5_000)
    assert sim.serving() == [P]
    assert sim.core(P).active_epoch == 1  # it never stepped down
    aborted = sim.reasons(P, "handover_aborted")[-1]
    assert aborted.startswith("primary: handover aborted: ") and aborted.endswith("→ serving again, epoch 1")
    assert t - t0 <= 2_100


def test_backup_dying_right_after_the_yield_the_old_active_takes_back_within_a_failover():
    sim = started()
    sim.cut(B, P)
    sim.cut(B, M)  # the backup never hears the yield, nor can it bid: it is as good as dead
    t0 = sim.t
    sim.core(P).begin_handover(now(sim, P), "operator released activity")
    sim.core(P).finish_handover(now(sim, P), 0)  # the mate acked everything just before it went
    sim._after(sim.nodes[P])
    sim.crash(B)
    t = sim.first_serving_after(t0, t0 + 5_000)
    assert sim.serving() == [P]
    assert t - t0 <= TIMERS.expected_failover_ms + 300
    activation = sim.reasons(P, "activate")[-1]
    assert "yielded epoch 1 and nobody took it" in activation and activation.endswith("epoch 2")


def test_lost_yields_only_delay_the_takeover():
    sim = started()
    sim.set_network(loss=0.5)
    t0 = sim.t
    sim.release(P)
    t = sim.first_serving_after(t0, t0 + 3_000, B)
    assert sim.serving() == [B] and t - t0 < QUIET_MS


def test_stale_yield_of_an_older_epoch_is_ignored():
    sim = started()
    sim.release(P)
    sim.run_for(1_000)
    assert sim.serving() == [B]
    sim.revert()
    sim.run_for(1_000)
    assert sim.serving() == [P]
    # Replay everything the primary and backup ever sent, yields of epochs 1 and 2 included: nothing moves.
    for role, data in list(sim._history):
        for dst in role.peers():
            sim._push(sim.t + 1, "deliver", (dst, data))
    sim.run_for(2_000)
    assert sim.serving() == [P] and sim.core(P).active_epoch == 3
    assert sim.core(M).auth.rejected["replayed"] > 0


def test_auto_revert_moves_activity_back_once_the_primary_is_in_sync():
    sim = started(auto_revert=True, mate_link=True)
    sim.crash(P)
    sim.run_for(2_000)
    assert sim.serving() == [B]
    sim.restart(P)
    t0 = sim.t
    t = sim.first_serving_after(t0, t0 + 6_000, P)
    assert t is not None and sim.serving() == [P]
    assert any(r.startswith("backup: auto-revert: primary in sync and seen") for r in sim.reasons(B, "auto_revert"))
    sim.run_for(5_000)
    assert sim.serving() == [P], "auto-revert must not bounce back"


def test_auto_revert_is_off_by_default():
    sim = started(mate_link=True)
    sim.crash(P)
    sim.run_for(2_000)
    sim.restart(P)
    sim.run_for(6_000)
    assert sim.serving() == [B]
    assert not sim.reasons(B, "auto_revert")

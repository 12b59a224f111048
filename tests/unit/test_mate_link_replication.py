"""The two ends of the mate link (mate_link/active.py, standby.py) wired together in memory.

`Pair` plays both adapters: messages go through the real codec; the active's log is a list of
chained commits with a committed prefix; the standby "writes" what it is told to apply when the
test says so. No sockets, no clock: `now` is a number.
"""

from __future__ import annotations

import pytest

from pairmq.appliance.spool.chain import GENESIS, ChainPoint
from pairmq.appliance.spool.records import make_commit
from tests.harness import oplog
from tests.harness.oplog import read_commits
from pairmq.mate_link.active import ActiveLink, LinkFault, LinkLimits, MakeSnapshot, Phase, PlanNeeded, ReadCommits
from pairmq.mate_link.messages import Ack, Catchup, Ops, Ping, Plan, decode, encode
from pairmq.mate_link.resync import plan_resync
from pairmq.mate_link.standby import Apply, SnapshotBatch, SnapshotDone, StandbyLink

EPOCH = 5


class Pair:
    def __init__(self, active_ops: int, standby_head: ChainPoint = GENESIS, *, limits=LinkLimits(),
                 committed: int | None = None, auto_apply: bool = True) -> None:
        self.log = chained([[b"op%d" % i] for i in range(1, active_ops + 1)])  # one op a commit
        self.committed = active_ops if committed is None else committed
        self.now = 0
        head = self.log[-1].point if self.log else GENESIS
        self.active = ActiveLink(EPOCH, head, self.now, limits)
        self.standby = StandbyLink(standby_head, incarnation=3, highest_epoch=EPOCH - 1, now_ms=self.now)
        self.auto_apply = auto_apply
        self.to_apply: list[Apply] = []
        self.snapshot: list[bytes] = []
        self.wire: list[object] = []  # every message, decoded, in the order sent
        self.reads: list[ReadCommits] = []

    def checksum_at(self, seq: int):
        return next((c.checksum for c in self.log if c.last_seq == seq), None)

    def pump(self, rounds: int = 50) -> None:
        for _ in range(rounds):
            moved = False
            for m in self.standby.messages_to_send():
                moved = True
                self.wire.append(m)
                self.active.receive(decode(encode(m)), self.now)
            for r in self.active.requests():
                moved = True
                self._serve_active(r)
            for m in self.active.messages_to_send():
                moved = True
                self.wire.append(m)
                self.standby.receive(decode(encode(m)), self.now)
            for r in self.standby.requests():
                moved = True
                self._serve_standby(r)
            if self.auto_apply:
                moved |= self.apply_all()
            if not moved:
                return

    def _serve_active(self, r) -> None:
        if isinstance(r, PlanNeeded):
            self.active.planned(plan_resync(GENESIS, self.active.head, r.standby_head, self.checksum_at))
        elif isinstance(r, ReadCommits):
            self.reads.append(r)
            self.active.commits_read(read_commits(self.log, r.after_seq, self.committed, r.max_ops))
        elif isinstance(r, MakeSnapshot):
            point = next(c.point for c in self.log if c.last_seq == self.committed)
            self.active.snapshot_ready([b"state%d" % i for i in range(2500)], point)

    def _serve_standby(self, r) -> None:
        if isinstance(r, Apply):
            self.to_apply.append(r)
        elif isinstance(r, SnapshotBatch):
            if r.first:
                self.snapshot = []
            self.snapshot += r.bodies
        elif isinstance(r, SnapshotDone):
            self.snapshot_point = r.point
            self.standby.snapshot_installed(r.point)

    def apply_all(self) -> bool:
        if not self.to_apply:
            return False
        last = self.to_apply[-1].commits[-1].point
        self.to_apply.clear()
        self.standby.applied(last)
        return True

    def write_locally(self, n: int) -> None:
        """The active's writer makes one commit of n more ops; it is durable at once."""
        new = make_commit(self.log[-1].point if self.log else GENESIS, EPOCH, [b"live%d" % i for i in range(n)])
        self.log.append(new)
        self.committed = new.last_seq
        self.active.local_submitted(new)


def chained(groups, prev=GENESIS, epoch=EPOCH):
    """Commits of the op bodies in each group, chained after `prev`."""
    return oplog.chained(groups, prev, epoch)


def test_an_empty_standby_catches_up_incrementally_then_follows_live():
    p = Pair(25)
    p.pump()
    assert isinstance(p.wire[1], Plan) and p.wire[1].catchup is Catchup.INCREMENTAL
    assert p.active.phase is Phase.LIVE and p.active.acked_seq == 25 and p.standby.durable == p.log[-1].point
    assert p.active.caught_up(p.now)
    p.write_locally(3)
    p.pump()
    assert p.active.acked_seq == 28 == p.standby.durable.seq


def test_a_snapshot_counts_only_once_the_standby_installed_it():
    """Found by tests/netns/test_replication_faults.py: the active took the snapshot's point as acknowledged when it
    shipped it, so with nothing newer to send the link was caught up (and the standby granted in sync) while
    the standby was still building the snapshot; the active's kill then lost what only the snapshot held."""
    diverged = make_commit(GENESIS, EPOCH - 1, [b"old"] * 3).point
    p = Pair(12, diverged)
    held: list[SnapshotDone] = []
    serve = p._serve_standby
    p._serve_standby = lambda r: held.append(r) if isinstance(r, SnapshotDone) else serve(r)
    p.pump()
    assert p.wire[1].catchup is Catchup.SNAPSHOT and held
    assert p.active.phase is Phase.LIVE and p.active.acked_seq == 0
    assert not p.active.caught_up(p.now) and not p.active.over_max_lag
    assert p.active.behind(p.now) == "is not caught up on the mate link (its catch-up not yet acknowledged)"
    serve(held.pop())
    p.pump()
    assert p.active.acked_seq == 12 and p.active.caught_up(p.now)


def test_a_standby_in_step_gets_only_live_ops():
    p = Pair(10)
    p.standby = StandbyLink(p.log[-1].point, 3, EPOCH, 0)
    p.pump()
    assert p.wire[1].catchup is Catchup.IN_STEP and not p.reads
    p.write_locally(2)
    p.pump()
    assert [type(m) for m in p.wire[2:]] == [Ops, Ack]


def test_live_commits_made_before_the_adapter_drains_ride_in_one_ops_message():
    p = Pair(10)
    p.standby = StandbyLink(p.log[-1].point, 3, EPOCH, 0)
    p.pump()
    for n in (2, 1, 3):
        p.write_locally(n)
    p.pump()
    ops = [m for m in p.wire if isinstance(m, Ops)]
    assert len(ops) == 1 and [c.ops for c in ops[0].commits] == [2, 1, 3]  # whole commits, in order
    assert p.active.acked_seq == 16 == p.standby.durable.seq and p.active.unacked_bytes == 0
    p.write_locally(1)  # the adapter took the last one: a new message
    p.pump()
    assert len([m for m in p.wire if isinstance(m, Ops)]) == 2 and p.active.acked_seq == 17


def _commit_bytes(n: int) -> int:
    return len(make_commit(GENESIS, EPOCH, [b"live%d" % i for i in range(n)]).data)


@pytest.mark.parametrize("limits, sizes", [
    (LinkLimits(max_batch_ops=4), [[3], [2, 2], [4], [1]]),
    (LinkLimits(max_batch_bytes=_commit_bytes(1) + _commit_bytes(2)), [[1, 2], [3], [1]]),
])
def test_a_merged_live_ops_message_stays_within_the_batch_limits(limits, sizes):
    p = Pair(10, limits=limits)
    p.standby = StandbyLink(p.log[-1].point, 3, EPOCH, 0)
    p.pump()
    for n in [n for group in sizes for n in group]:
        p.write_locally(n)
    p.active.receive(Ping(EPOCH, 0), p.now)  # a PONG queued between two commits: the OPS after it is new
    p.write_locally(1)
    p.pump()
    ops = [m for m in p.wire if isinstance(m, Ops)]
    assert [[c.ops for c in m.commits] for m in ops] == sizes + [[1]]
    assert p.active.acked_seq == p.log[-1].last_seq == p.standby.durable.seq


def test_a_diverged_standby_gets_a_snapshot_then_the_ops_after_it():
    diverged = make_commit(GENESIS, EPOCH - 1, [b"old"] * 3).point
    p = Pair(12, diverged, committed=10)
    p.pump()
    assert p.wire[1].catchup is Catchup.SNAPSHOT
    assert len(p.snapshot) == 2500 and p.snapshot_point == p.log[9].point
    assert p.active.phase is Phase.CATCHING_UP  # ops 11..12 are not committed yet; no read can find them
    p.committed = 12
    p.active.handle_timer(p.now)
    p.pump()
    assert p.active.phase is Phase.LIVE and p.standby.durable == p.log[-1].point


def test_the_last_stretch_of_a_catchup_comes_from_the_writers_recent_commits():
    p = Pair(0)
    p.write_locally(20)
    p.write_locally(10)
    p.committed = 20  # ops 21..30 have seqs but their commit is still running
    p.pump()
    assert p.active.phase is Phase.LIVE and p.standby.durable.seq == 30


def test_catchup_never_runs_more_than_max_inflight_ops_ahead_of_the_acks():
    p = Pair(500, limits=LinkLimits(max_inflight_ops=40, max_batch_ops=16), auto_apply=False)
    for _ in range(30):
        p.pump(rounds=3)
        assert p.active.shipped_seq - p.active.acked_seq <= 40
        p.apply_all()
    p.auto_apply = True
    p.pump(rounds=200)
    assert p.standby.durable.seq == 500 and all(r.max_ops <= 40 for r in p.reads)


def test_unacknowledged_backlog_raises_backpressure_until_acked():
    p = Pair(0, limits=LinkLimits(max_lag_ops=5), auto_apply=False)
    p.pump()
    p.write_locally(6)
    p.pump()
    assert p.active.over_max_lag and p.active.caught_up(p.now)  # held publishers, still in sync
    p.write_locally(15)  # what was in flight: past INSYNC_LAG_FACTOR x max_lag_ops the standby leaves sync
    p.pump()
    assert p.active.over_max_lag and not p.active.caught_up(p.now)
    assert p.active.behind(p.now) == "fell behind on the mate link (21 ops unacknowledged)"
    p.apply_all()
    p.pump()
    assert not p.active.over_max_lag and p.active.caught_up(p.now)


def test_ops_that_do_not_chain_close_the_link():
    p = Pair(5)
    p.pump()
    forged = make_commit(ChainPoint(EPOCH, 5, b"x" * 16), EPOCH, [b"forged"])
    with pytest.raises(LinkFault, match="do not continue our log"):
        p.standby.receive(Ops(EPOCH, (forged,)), 0)


@pytest.mark.parametrize("spoil, match", [
    (lambda cs: cs[:1] + cs[2:], "ops 5..6 follow op 2 \\(op 3 is missing\\)"),
    (lambda cs: cs[:1] + [cs[1]._replace(data=cs[1].data.replace(b"op3", b"opX"))] + cs[2:],
     "ops 3..4: their checksum does not chain"),
    (lambda cs: cs[:1] + [cs[1]._replace(checksum=bytes(16))] + cs[2:], "ops 3..4: their checksum does not chain"),
    (lambda cs: cs[:1] + [cs[1]._replace(epoch=EPOCH + 1)] + cs[2:],
     "ops 3..4 claim epoch 6, newer than their sender's 5"),
    (lambda cs: cs[:2] + [cs[1]] + cs[2:], "ops 3..4 repeat or go back after op 4"),
])
def test_a_catch_up_batch_is_checked_commit_by_commit_and_a_bad_one_named(spoil, match):
    """The standby's chain check (standby.continue_chain) over a whole batch: any commit out of place, changed,
    with another checksum or from a newer epoch refuses the batch, naming its ops; nothing reaches the writer."""
    standby = StandbyLink(GENESIS, 1, EPOCH, 0)
    standby.receive(Plan(EPOCH, Catchup.INCREMENTAL, 0, ChainPoint(EPOCH, 6, b"t" * 16)), 0)
    good = chained([[b"op1", b"op2"], [b"op3", b"op4"], [b"op5", b"op6"]])
    standby.requests()
    with pytest.raises(LinkFault, match=match):
        standby.receive(Ops(EPOCH, tuple(spoil(list(good)))), 0)
    assert standby.requests() == [] and standby.head == GENESIS
    standby.receive(Ops(EPOCH, tuple(good)), 0)  # the same batch, sound, goes through whole
    assert standby.head == good[-1].point and standby.requests() == [Apply(tuple(good))]


def test_a_deposed_active_cannot_write_into_the_standby():
    p = Pair(5)
    p.pump()
    p.standby.receive(Ping(EPOCH + 1, 0), 0)  # a newer active spoke
    with pytest.raises(LinkFault, match="newer"):
        p.standby.receive(Ops(EPOCH, ()), 0)


@pytest.mark.parametrize("bad, match", [
    (lambda p: p.active.receive(Ack(EPOCH, 99), 0), "shipped only"),
    (lambda p: p.active.receive(p.wire[0], 0), "second JOIN"),
    (lambda p: p.active.receive(Ops(EPOCH, ()), 0), "does not send"),
    (lambda p: p.active.receive(Ack(EPOCH + 1, 1), 0), "newer than ours"),
    (lambda p: p.active.handle_timer(5_000), "nothing from the standby"),
    (lambda p: p.standby.handle_timer(5_000), "nothing from the active"),
])
def test_protocol_faults_are_named(bad, match):
    p = Pair(3)
    p.pump()
    with pytest.raises(LinkFault, match=match):
        bad(p)


def test_a_plan_that_does_not_start_at_our_head_is_refused():
    s = StandbyLink(GENESIS, 1, EPOCH, 0)
    with pytest.raises(LinkFault, match="INCREMENTAL after op 7"):
        s.receive(Plan(EPOCH, Catchup.INCREMENTAL, 7, GENESIS), 0)


def test_a_rollback_of_shipped_ops_forces_a_resync():
    p = Pair(3)
    p.pump()
    p.write_locally(2)
    with pytest.raises(LinkFault, match="rolled back"):
        p.active.local_rolled_back(p.log[2].point)


def test_the_standby_pings_only_after_an_interval_in_which_it_sent_nothing():
    """The active hears us by any message: an interval with an ACK or a PONG needs no PING, a silent one does."""
    p = Pair(3)
    p.pump()
    standby, interval = p.standby, p.standby.ping_interval_ms
    sent = standby.messages_to_send()
    assert sent == []
    standby.receive(Ping(EPOCH, 7), 10)  # the active's PING: we answer it, and so we spoke in this interval
    assert [type(m).__name__ for m in standby.messages_to_send()] == ["Pong"]
    standby.handle_timer(interval)
    assert standby.messages_to_send() == []  # the PONG was enough
    standby.handle_timer(2 * interval)  # a whole interval without a word from us
    pings = standby.messages_to_send()
    assert [type(m).__name__ for m in pings] == ["Ping"] and pings[0].sent_ms == 2 * interval
    standby.handle_timer(3 * interval)  # that PING was a word: no second one right behind it
    assert standby.messages_to_send() == []
    standby.handle_timer(4 * interval)
    assert [type(m).__name__ for m in standby.messages_to_send()] == ["Ping"]

"""The broker simulator with a standby: S2 across a failover, with the mate link's real ends.

Node A is active: the sans-I/O BrokerCore, its spool (a StateModel) and op log (chained commits).
Node B is its standby: a StateModel fed by the mate link's two ends (mate_link/active.py and
standby.py), their messages going through the real codec over a channel that delivers in order,
late, or not at all (the link is cut and redialled; B rejoins by the resync plan, incremental or
snapshot). Everything shares one model clock.

The release rule under test (DESIGN §4): the effects behind a commit (PUBACK/PUBREC, deliveries)
run once A's commit is durable AND B has acknowledged those ops, or, with no in-sync standby, once
B's in-sync lease has surely ended (`LEASE` after A last saw it caught up). B may take over only
while that lease holds. So whatever a client was told reached B first, or B cannot take over.

A crash of A while B holds the lease is a failover: B's spool becomes the active one (a new core
restored from it) and every client reconnects to B. Otherwise A restarts from its own spool and B
resyncs. The checks are BrokerSim's: S2, QoS 2 exactly once, per-publisher order, CONNACK first,
and no (publisher, message id) stored twice along the history the serving node holds: publishers
retransmit acknowledged id-carrying messages after reconnecting, so after a failover it is B's
replicated id history that must suppress them.

A planned handover (appliance/planned_handover.py) moves activity between the two spools: A stops
taking packets, ships and commits everything, waits until B acknowledged its head (the final op),
runs the effects that waited for those acks (the last PUBACKs), drops every client, and B takes
activity with the next epoch serving from *its own* spool; A becomes the standby (the two slots
swap spools) and rejoins over a new link, in step. A handover back is the same step again.
Refused (nothing happens) when B is not in sync.
"""

from __future__ import annotations

import collections
import dataclasses
import functools

from pairmq.appliance.broker.core import BrokerCore, Persist, restore
from pairmq.appliance.spool import ops
from pairmq.appliance.spool.chain import GENESIS
from pairmq.appliance.spool.records import make_commit, op_bodies
from tests.harness.oplog import read_commits
from pairmq.appliance.spool.codec import decode_op, encode_op
from pairmq.appliance.spool.snapshot import snapshot_ops, snapshot_seq
from pairmq.appliance.spool.state import StateModel
from pairmq.mate_link.active import ActiveLink, LinkFault, LinkLimits, MakeSnapshot, Phase, PlanNeeded, ReadCommits
from pairmq.mate_link.messages import decode, encode
from pairmq.mate_link.resync import plan_resync
from pairmq.mate_link.standby import Apply, SnapshotBatch, SnapshotDone, StandbyLink
from tests.harness.broker_sim import BrokerSim, SimFailure, run_schedule

LEASE_MS = 300
LIMITS = LinkLimits(max_batch_ops=8, max_inflight_ops=40, link_timeout_ms=10**12)


class ReplicatedSim(BrokerSim):
    def __init__(self, seed: int) -> None:
        super().__init__(seed)
        self.epoch = 1
        self.log: list = []  # A's op log: every commit made (durable or not)
        self.head = GENESIS  # A's writer head
        self.durable_seq = 0  # A's last committed op
        self.held: collections.deque = collections.deque()  # (seq, then) behind the release rule
        self.b_state, self.b_head = StateModel(), GENESIS  # B's spool (durable) and its head
        self.b_applying: collections.deque = collections.deque()
        self.b_acked = 0  # the highest op B ever acknowledged (it stays durable on B)
        self.snapshot: list[bytes] = []
        self.link: ActiveLink | None = None
        self.standby: StandbyLink | None = None
        self.a2b: collections.deque = collections.deque()
        self.b2a: collections.deque = collections.deque()
        self.grant_at = -(10**12)
        self.failovers = self.resyncs = self.local_releases = self.link_faults = self.handovers = 0
        self.released_seq = 0  # the highest op whose effects ran
        self.b_lease_void = False  # B gave its lease up (a catch-up began) and was not granted one since

    def status(self) -> str:
        return (f"failovers {self.failovers}, handovers {self.handovers}, resyncs {self.resyncs}, "
                f"B at op {self.b_head.seq}")

    # --- A's adapter: ops get seqs at submit (and are shipped), effects wait for the release rule ----

    def on_persist(self, e: Persist) -> None:
        bodies = [encode_op(op) for op in e.ops]
        commit = make_commit(self.head, self.epoch, bodies) if bodies else None
        if commit is not None:
            self.head = commit.point
            self.log.append(commit)
            if self.link is not None:
                self.link.local_submitted(commit)
                self._pump_link()
        self.pending.append((e, commit))

    def commit(self, groups: int) -> None:
        for _ in range(min(groups, len(self.pending))):
            persist, commit = self.pending.pop(0)
            if commit is not None:
                for seq, op in zip(range(commit.first_seq, commit.last_seq + 1), persist.ops):
                    if not self.committed.apply(seq, op):
                        raise SimFailure(f"A's spool ignored op {seq}: {op}")
                    if isinstance(op, (ops.MessageStored, ops.MessageRouted)):
                        self.note_stored(op, seq)
                self.durable_seq = commit.last_seq
            self.held.append((commit.last_seq if commit is not None else self.head.seq, persist.then))
        self.release()

    def release(self) -> None:
        standby_gone = self.failovers or self.now > self.grant_at + LEASE_MS
        while self.held and self.held[0][0] <= self.durable_seq:
            seq, then = self.held[0]
            if seq > self.b_acked and not standby_gone:
                return
            self.local_releases += seq > self.b_acked
            self.released_seq = max(self.released_seq, seq)
            self.held.popleft()
            self.run(then)

    # --- the link ----------------------------------------------------------------------------------

    def in_sync(self) -> bool:
        """B may be granted its in-sync lease: the link is caught up (LIVE, and B holds whole submissions
        only) AND B acknowledged every op whose effects were released. (LIVE alone only means everything
        was shipped: an op released on local durability while B was out may still be on its way, and a
        failover then would lose it; and a submission split across catch-up batches left B, at a failover,
        with a QoS 2 message queued but not its dedupe record.)"""
        return (self.link is not None and not self.failovers and self.link.caught_up(self.now)
                and self.b_acked >= self.released_seq)

    def dial(self) -> None:
        self.link = ActiveLink(self.epoch, self.head, self.now, LIMITS)
        self.standby = StandbyLink(self.b_head, 1, self.epoch, self.now)
        self.resyncs += 1
        self._pump_link()

    def cut(self) -> None:
        self.link = self.standby = None
        self.a2b.clear(), self.b2a.clear(), self.b_applying.clear()

    def _pump_link(self) -> None:
        """Move what both ends produced: messages onto the channel, requests to the two adapters."""
        moved = True
        while moved and self.link is not None:
            moved = False
            for m in self.link.messages_to_send():
                moved = True
                self.a2b.append(encode(m))
            for r in self.link.requests():
                moved = True
                self._serve_active(r)
            for m in self.standby.messages_to_send():
                moved = True
                self.b2a.append(encode(m))
            for r in self.standby.requests():
                moved = True
                self._serve_standby(r)

    def _serve_active(self, r) -> None:
        if isinstance(r, PlanNeeded):
            def checksum_at(seq):
                return next((c.checksum for c in self.log if c.last_seq == seq <= self.durable_seq), None)
            self.link.planned(plan_resync(GENESIS, self.link.head, r.standby_head, checksum_at))
        elif isinstance(r, ReadCommits):
            self.link.commits_read(read_commits(self.log, r.after_seq, self.durable_seq, r.max_ops))
        elif isinstance(r, MakeSnapshot):
            point = next(c.point for c in self.log if c.last_seq == self.durable_seq) if self.durable_seq else GENESIS
            self.link.snapshot_ready([encode_op(op) for op in snapshot_ops(self.committed.state())], point)

    def _serve_standby(self, r) -> None:
        if isinstance(r, Apply):
            self.b_applying.append(r)
        elif isinstance(r, SnapshotBatch):
            self.snapshot = ([] if r.first else self.snapshot) + list(r.bodies)
        elif isinstance(r, SnapshotDone):
            self._install_snapshot(r.point)

    def _install_snapshot(self, point) -> None:
        state = StateModel()
        for i, body in enumerate(self.snapshot):
            state.apply(snapshot_seq(i), decode_op(body))
        self.b_state, self.b_head = state, point
        self.standby.snapshot_installed(point)

    def deliver_to_b(self) -> None:
        if self.link is not None and self.a2b:
            self._guarded(lambda: self.standby.receive(decode(self.a2b.popleft()), self.now))
            if self.standby is not None and self.standby.resyncing:
                self.b_lease_void = True  # B gives its lease up before it applies any catch-up batch

    def deliver_to_a(self) -> None:
        if self.link is not None and self.b2a:
            self._guarded(lambda: self.link.receive(decode(self.b2a.popleft()), self.now))
            if self.link is not None:
                self.b_acked = max(self.b_acked, self.link.acked_seq)
            self.release()

    def b_apply(self) -> None:
        if self.link is not None and self.b_applying:
            apply = self.b_applying.popleft()
            for c in apply.commits:
                for seq, body in enumerate(op_bodies(c), c.first_seq):
                    self.b_state.apply(seq, decode_op(body))
            self.b_head = apply.commits[-1].point
            self._guarded(lambda: self.standby.applied(self.b_head))

    def _guarded(self, action) -> None:
        """A fault either end raises closes the link, as the real adapter does; B redials later."""
        try:
            action()
            self._pump_link()
        except LinkFault:
            self.link_faults += 1
            self.cut()

    # --- faults --------------------------------------------------------------------------------------

    def crash(self) -> None:
        """A dies. With B in its lease: failover to B. Else A restarts from its spool and B resyncs."""
        self.crashes += 1
        eligible = not self.failovers and not self.b_lease_void and self.now <= self.grant_at + LEASE_MS
        self.pending.clear(), self.held.clear()
        for c in self.clients:
            self._gone(c)
        self.cut()
        if eligible:
            self.failovers += 1
            self.epoch += 1
            self.committed, self.head = self.b_state, self.b_head
            for stored in self.stored_ids.values():  # what B never got is not part of the history any more
                for msg_id in [m for m, seq in stored.items() if seq > self.b_head.seq]:
                    del stored[msg_id]
            self.durable_seq = self.b_head.seq
            self.log = []  # B serves alone from here: nothing is shipped any more
        else:
            self.log = [c for c in self.log if c.last_seq <= self.durable_seq]
            self.head = self.log[-1].point if self.log else GENESIS
        self.core = BrokerCore(limits=self.limits)
        restore(self.core, self.committed.state(dataclasses.replace(GENESIS, seq=self.head.seq)), self.now)

    def handover(self) -> bool:
        """The planned handover described above; False when refused (B not in sync)."""
        if self.failovers or not self.in_sync():
            return False
        for _ in range(10_000):  # drain: no client packet is taken meanwhile
            self.commit(len(self.pending))
            self.deliver_to_b(), self.b_apply(), self.deliver_to_a()
            if self.link is None:
                return False  # the link broke: aborted, A serves on
            if not self.pending and self.b_acked >= self.head.seq and not self.a2b and not self.b2a:
                break
        else:
            raise SimFailure("the handover's drain never finished")
        self.release()
        if self.held:
            raise SimFailure(f"effects still held after the drain: {[seq for seq, _ in self.held]}")
        if self.b_head != self.head:
            raise SimFailure(f"B acknowledged through {self.b_acked} but holds {self.b_head}, A's head {self.head}")
        for c in self.clients:
            self._gone(c)
        self.cut()
        self.handovers += 1
        self.epoch += 1
        # B serves from its own spool; A's spool becomes the standby's. Their op logs are one chain.
        self.committed, self.b_state = self.b_state, self.committed
        self.log = [c for c in self.log if c.last_seq <= self.b_head.seq]
        self.durable_seq = self.head.seq
        self.b_acked = self.released_seq = self.head.seq
        self.core = BrokerCore(limits=self.limits)
        restore(self.core, self.committed.state(dataclasses.replace(GENESIS, seq=self.head.seq)), self.now)
        self.dial()
        self._settle_link()
        return True

    # --- schedules ------------------------------------------------------------------------------------

    def setup(self) -> None:
        self.dial()
        self._settle_link()
        super().setup()
        self._settle_link()

    def _settle_link(self) -> None:
        for _ in range(10_000):
            if not (self.a2b or self.b2a or self.b_applying or self.pending):
                break
            self.commit(len(self.pending))
            self.deliver_to_b(), self.b_apply(), self.deliver_to_a()
        if self.in_sync():
            self.grant_at = self.now
            self.b_lease_void = False
        self.release()

    def step(self) -> None:
        roll = self.rng.random()
        if not self.failovers and roll < 0.45:
            self.steps += 1
            if self.link is None:
                if roll < 0.05:
                    self.dial()
            elif roll < 0.15:
                self.deliver_to_b()
            elif roll < 0.25:
                self.b_apply()
            elif roll < 0.35:
                self.deliver_to_a()
            elif roll < 0.355:
                self.cut()
            elif roll < 0.36:
                self.handover()
            elif roll < 0.45:
                self.now += self.rng.randint(1, 150)
                self.run(self.core.tick(self.now))
                self.release()
        else:
            super().step()
        if self.in_sync():
            self.grant_at = self.now  # A saw B caught up: B's in-sync lease runs from here
            self.b_lease_void = False

    def heal(self, max_rounds: int = 200) -> None:
        if not self.failovers:
            if self.link is None:
                self.dial()
            self._settle_link()
        self.now += LEASE_MS + 1  # whatever still waits for a standby that went away is released locally
        self.release()
        super().heal(max_rounds)
        self.release()


def run_replicated_schedule(seed: int, steps: int = 600) -> ReplicatedSim:
    return run_schedule(seed, steps, ReplicatedSim)


@dataclasses.dataclass(frozen=True, slots=True)
class ScheduleCounts:
    """What one default schedule exercised (its checks already passed)."""

    acknowledged: int
    failovers: int
    resyncs: int
    handovers: int
    suppressed_after_failover: int  # retransmits B's replicated id history dropped, when B took over


@functools.cache
def schedule_counts(seed: int) -> ScheduleCounts:
    """run_replicated_schedule(seed), counted, once per test run: a schedule is a pure function of its seed, and
    test_replication_handover.py and test_replication_random_schedules.py both check seeds 0-499 (the first
    for its handovers, the second for its failovers). Running one twice checks nothing new."""
    sim = run_replicated_schedule(seed)
    return ScheduleCounts(
        acknowledged=sum(len(c.acknowledged) for c in sim.clients), failovers=sim.failovers, resyncs=sim.resyncs,
        handovers=sim.handovers,
        # the core is B's, rebuilt at the failover: what it suppressed came from B's history
        suppressed_after_failover=sim.core.counters.get("publish_duplicates_suppressed", 0) if sim.failovers else 0)

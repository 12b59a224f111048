"""S2 when the active acknowledges alone: seeded schedules of the quorum cores with a data model.

The quorum simulator (tests/harness/simulator.py) carries no data; here each routing node also has an op
log, the active a release rule, and the mate link a shipping and acking delay, driven the way
appliance/node/replication.py drives them: every SYNC_MS (plus a random event-loop lag) the sync tells
the core whether the mate is caught up and our released and durable positions, then reads how far
effects may be released without the mate (`release_bound`) and releases what it allows. A commit's
effects otherwise run as soon as the rule allows (a publish, a mate ack, a peer's echo), and an op held
alone has its position advertised at once. Without rule R9 a release and the heartbeat that advertises
it are apart by up to a sync and a heartbeat, and faults land in between: the mate link
cut (TCP only, heartbeats go on), heartbeat loss, delay and cuts, and kill -9 of the active at a random
instant after it began acknowledging alone.

Checked at every activation: the new active holds every op ever acknowledged to a publisher (S2), on top
of the base simulator's S1, S3 and epoch checks. PAIRMQ_SIM_SCHEDULES / 8 schedules (default 250); a
failure names its seed and `release_schedule(seed)` replays it with a trace.
"""

from __future__ import annotations

import os

from pairmq.appliance.roles import Role
from tests.harness.simulator import Simulation

P, B, M = Role.PRIMARY, Role.BACKUP, Role.MONITOR
SCHEDULES = max(50, int(os.environ.get("PAIRMQ_SIM_SCHEDULES", "2000")) // 8)
SYNC_MS = 50


class _Data:
    """One routing node's op log and, while it serves, its release state."""

    def __init__(self) -> None:
        self.log: list[int] = []  # op ids; an op's seq is its index + 1 (durable at once: the model's commit)
        self.boot()

    def boot(self) -> None:
        """A fresh process: nothing held, nothing released, no mate link."""
        self.held: list[int] = []  # seqs whose acknowledgements wait for the release rule
        self.released = 0
        self.alone = 0  # acknowledgements released without the mate's ack
        self.mate_acked = 0
        self.alone_bound = -1
        self.link = 0  # generation of the live mate-link session (0: none)
        self.resynced = False


class ReleaseSimulation(Simulation):
    def __init__(self, seed: int, *, trace: bool) -> None:
        self.data = {P: _Data(), B: _Data()}
        self.acked: set[int] = set()
        self.died_alone = False  # the active killed at the end had acknowledged alone
        self.mate_cut = False
        self._next_op = 0
        self._link_gen = 0
        self._app: list[tuple[int, int, str, object]] = []
        super().__init__(seed, trace=trace, drift_ppm=300)
        for role in (P, B):
            self._app_push(self.rng.randrange(SYNC_MS), "sync", role)
        self._app_push(10, "publish", None)

    # --- the adapter's side ---------------------------------------------------------------------

    def run_until(self, t_end: int) -> None:
        while self._app and self._app[0][0] <= t_end:
            t, _, kind, payload = self._app.pop(0)
            super().run_until(t)
            getattr(self, f"_on_{kind}")(payload)
        super().run_until(t_end)

    def crash(self, role: Role) -> None:
        super().crash(role)
        if role in self.data:
            self.data[role].boot()

    def _app_push(self, t: int, kind: str, payload: object) -> None:
        self._tick += 1
        entry = (t, self._tick, kind, payload)
        i = len(self._app)
        while i and self._app[i - 1][:2] > entry[:2]:
            i -= 1
        self._app.insert(i, entry)

    def _serving(self, role: Role) -> bool:
        node = self.nodes[role]
        return node.core is not None and node.core.may_serve(node.local(self.t))

    def _on_publish(self, _: object) -> None:
        self._app_push(self.t + self.rng.randint(5, 40), "publish", None)
        active = next((r for r in (P, B) if self._serving(r)), None)
        if active is None:
            return
        data = self.data[active]
        for _ in range(self.rng.randint(1, 3)):
            self._next_op += 1
            data.log.append(self._next_op)
            data.held.append(len(data.log))
        self._release(active)
        if data.held and data.alone_bound >= 0:  # held alone: advertise at once (Replication.advertise_soon)
            self._advertise(active)
        if data.link:
            self._app_push(self.t + self.rng.randint(1, 30), "mate_ack", (active, data.link, len(data.log)))

    def _on_mate_ack(self, payload: tuple[Role, int, int]) -> None:
        active, link, seq = payload
        data, standby = self.data[active], self.data[active.mate()]
        if data.link != link or not data.resynced or self.mate_cut:  # a cut link carries nothing more
            return
        if seq > len(standby.log):  # acks may arrive out of order: the standby's log only grows
            standby.log = list(data.log[:seq])
        data.mate_acked = max(data.mate_acked, seq)
        self._release(active)

    def _on_resynced(self, payload: tuple[Role, int]) -> None:
        active, link = payload
        data = self.data[active]
        if data.link != link or self.mate_cut:
            return
        self.data[active.mate()].log = list(data.log)  # a divergent unacknowledged tail is discarded
        data.mate_acked, data.resynced = len(data.log), True

    def _on_sync(self, role: Role) -> None:
        self._app_push(self.t + SYNC_MS + self.rng.choice((0, 0, 0, 5, 30, 120, 300)), "sync", role)
        node, data = self.nodes[role], self.data[role]
        if node.core is None or node.paused:
            return
        self._link_mate(role)
        now = node.local(self.t)
        core = node.core
        caught_up = bool(data.link) and data.resynced and data.mate_acked >= data.released
        core.mate_link(now, caught_up, "fell behind" if data.link else "is not connected on the mate link")
        core.released_position(now, data.released, len(data.log))
        data.alone_bound = core.release_bound(now)
        self._after(node)
        self._release(role)

    def _advertise(self, role: Role) -> None:
        node, data = self.nodes[role], self.data[role]
        now = node.local(self.t)
        node.core.released_position(now, data.released, len(data.log))
        data.alone_bound = node.core.release_bound(now)
        self._after(node)
        self._release(role)

    def _deliver(self, node, datagram: bytes) -> None:
        """A peer's echo of our advertised position releases at once and advertises what became durable
        meanwhile (the heartbeat thread's hook, `Replication.echoed`)."""
        echoes = node.core.position_echoes
        super()._deliver(node, datagram)
        if node.core.position_echoes != echoes and node.role in self.data:
            self._advertise(node.role)

    def _link_mate(self, role: Role) -> None:
        """The mate link of an active `role`: a session while the TCP link and both processes are up."""
        data, mate = self.data[role], role.mate()
        up = self._serving(role) and not self.mate_cut and self.nodes[mate].core is not None \
            and not self.nodes[mate].paused and not self._serving(mate)
        if up and not data.link:
            self._link_gen += 1
            data.link, data.resynced, data.mate_acked = self._link_gen, False, 0
            mate_node = self.nodes[mate]
            mate_node.core.void_insync_lease(mate_node.local(self.t), "catching up on the mate link")
            self._after(mate_node)
            self._app_push(self.t + self.rng.randint(20, 300), "resynced", (role, data.link))
        elif not up and data.link:
            data.link, data.resynced = 0, False

    def _release(self, role: Role) -> None:
        data = self.data[role]
        while data.held and (data.held[0] <= data.mate_acked or data.held[0] <= data.alone_bound):
            seq = data.held.pop(0)
            data.released = max(data.released, seq)
            self.acked.add(data.log[seq - 1])
            if seq > data.mate_acked:
                data.alone += 1

    def _after(self, node) -> None:
        before = len(self.activations)
        super()._after(node)
        if len(self.activations) > before and node.role in self.data:
            missing = self.acked - set(self.data[node.role].log)
            if missing:
                self._fail(f"S2 violated: {node.role.value} took activity without {len(missing)} acknowledged "
                           f"op(s), e.g. {sorted(missing)[:5]}")


def release_schedule(seed: int, *, trace: bool = True) -> ReleaseSimulation:
    """Start, maybe move activity to the backup, cut the mate link, let the active acknowledge alone under
    heartbeat faults, kill it at a random instant, and let the survivor decide."""
    sim = ReleaseSimulation(seed, trace=trace)
    rng = sim.rng
    sim.run_until(rng.randint(1500, 2500))
    if rng.random() < 0.75:  # the netns test's shape: the backup active, the primary back in sync
        sim.crash(P)
        sim.run_for(1500)
        sim.restart(P)
        sim.run_for(rng.randint(1500, 2500))
    for _ in range(rng.randint(1, 3)):
        fault = rng.choice(("mate_cut", "mate_cut", "network", "cut_hb", "heal", "heal_mate"))
        if fault == "mate_cut":
            sim.mate_cut = True
        elif fault == "heal_mate":
            sim.mate_cut = False
        elif fault == "network":
            sim.set_network(loss=rng.choice((0.0, 0.05, 0.3)), delay_ms=rng.choice(((0, 2), (1, 30), (0, 120))))
        elif fault == "cut_hb":
            a, b = rng.sample(list(Role), 2)
            sim.cut_one_way(a, b) if rng.random() < 0.5 else sim.cut(a, b)
        else:
            sim.heal()
        sim.run_for(rng.choice((100, 400, 900)))
    sim.mate_cut = True
    for data in sim.data.values():
        data.alone = 0  # count from the cut on
    if rng.random() < 0.8:  # kill it within a few heartbeats of its first acknowledgement alone
        deadline = sim.t + 3 * sim.timing.insync_ms
        while sim.t < deadline and not any(sim.data[r].alone and sim._serving(r) for r in (P, B)):
            sim.run_for(5)
        sim.run_for(rng.randint(0, 3 * SYNC_MS))
    else:
        sim.run_for(sim.timing.insync_ms + rng.randint(0, 400))  # past the mate's in-sync lease: alone
    active = [r for r in (P, B) if sim._serving(r)]
    if active:
        sim.died_alone = sim.data[active[0]].alone > 0
        sim.crash(active[0])
    sim.run_for(2 * sim.timing.quiet_ms + 400)
    return sim


def test_acknowledgements_alone_survive_the_death_of_the_active():
    alone = takeovers = 0
    for seed in range(SCHEDULES):
        sim = release_schedule(seed, trace=False)
        alone += sim.died_alone
        takeovers += any(t >= sim.t - 2 * sim.timing.quiet_ms - 400 for t, _, _ in sim.activations)
    # The schedules must exercise the window: an active killed after acknowledging alone, most of the time.
    assert alone > SCHEDULES // 2, (alone, takeovers)
    print(f"{SCHEDULES} schedules: {alone} killed the active after it acknowledged alone, {takeovers} ended in a "
          f"takeover by the survivor, no S2 violation")

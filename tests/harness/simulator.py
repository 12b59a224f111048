"""A seeded, deterministic simulator of a whole PairMQ group (STYLE.md practice 5).

All three quorum cores run in one process over a simulated clock and network.
Every source of nondeterminism comes from one `random.Random(seed)`:
message delay, loss, duplication, replay of old datagrams, clock offsets and
drift, and the fault schedule. After every step the invariants are checked:

  S1  at most one node may serve at any instant;
  S3  a serving node has received a datagram from a peer within its lease;
  E   epochs of successive activations strictly increase, and no node's
      durable epoch ever goes backwards.

Planned handovers (appliance/quorum/handover.py) join the faults: `release`
(the operator's release-activity, forced or not), `revert` (revert-activity on
an active backup) and auto-revert (`auto_revert=True`: a node asked to hand
back by its core does so). The node adapter's drain is a delay: the core is
told the mate holds every op `drain_ms` later, when it may or may not still be
true (the core re-checks). With `mate_link=True` the active's timer also
passes on the mate link's word "caught up" (the quorum model has no data, so
a seen mate is caught up), which re-admits a restarted mate to sync.

A violation raises `InvariantViolation` with the seed and the trace: one line
per node per step for the last steps, enough to replay and read the failure.
"""

from __future__ import annotations

import dataclasses
import os
import heapq
import random
from collections import deque

from pairmq.appliance.config import Timers
from pairmq.appliance.errors import LocalProtocolError
from pairmq.appliance.quorum.auth import HeartbeatAuth
from pairmq.appliance.quorum.core import PersistentState, QuorumCore, Timing
from pairmq.appliance.quorum.wire import Activity
from pairmq.appliance.roles import Role

SECRET = bytes(range(32))
GROUP = "sim"
TRACE_LINES = 120
SOCKET_BUFFER = 64  # datagrams a paused node's socket holds before the kernel drops more


class InvariantViolation(AssertionError):
    pass


class MemoryStore:
    """A stable store whose contents survive the simulated crash of its node."""

    def __init__(self) -> None:
        self._state = PersistentState()
        self.saves = 0
        self.failure: OSError | None = None  # set: every save raises it, as a failing disk would (core rule R8)

    def load(self) -> PersistentState:
        return dataclasses.replace(self._state)

    def save(self, state: PersistentState) -> None:
        if self.failure is not None:
            raise self.failure
        assert state.epoch >= self._state.epoch, "durable epoch went backwards"
        self._state = dataclasses.replace(state)
        self.saves += 1


@dataclasses.dataclass
class Link:
    blocked: bool = False
    loss: float = 0.0
    delay_ms: tuple[int, int] = (0, 2)
    duplicate: float = 0.0


class SimNode:
    def __init__(self, role: Role, rng: random.Random, drift_ppm: int) -> None:
        self.role = role
        self.store = MemoryStore()
        self.offset = rng.randrange(0, 10**9)  # monotonic clocks share no origin
        self.rate = 1 + rng.uniform(-drift_ppm, drift_ppm) / 1e6
        self.core: QuorumCore | None = None
        self.paused = False
        self.broker_stalled = False  # the heartbeat thread runs, the broker's event loop does not
        self.inbox: deque[bytes] = deque()
        self.timer_gen = 0
        self.armed_at: int | None = None  # the instant of the pending timer event of generation timer_gen
        self.last_rx_global: int | None = None

    def local(self, t: int) -> int:
        return self.offset + int(t * self.rate)

    def global_at(self, local_ms: int) -> int:
        t = int((local_ms - self.offset) / self.rate)
        while self.local(t) < local_ms:
            t += 1
        return t


class Simulation:
    def __init__(self, seed: int, *, timers: Timers = Timers(), drift_ppm: int = 200, trace: bool = True,
                 auto_revert: bool = False, mate_link: bool = False) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.timing = Timing.from_timers(timers)
        self._s3_window_ms = int(self.timing.lease_ms * 1.01) + 1
        self.t = 0
        self.nodes = {r: SimNode(r, self.rng, drift_ppm) for r in Role}
        self.links = {(a, b): Link() for a in Role for b in Role if a is not b}
        self.replay_rate = 0.0  # chance per delivery that an old datagram is injected too
        self._history: list[tuple[Role, bytes]] = []
        self._queue: list[tuple[int, int, str, object]] = []
        self._tick = 0
        self.activations: list[tuple[int, Role, int]] = []
        self.decisions: list[tuple[int, object]] = []
        self.trace: deque[str] = deque(maxlen=TRACE_LINES) if trace else deque(maxlen=0)
        self.steps = 0
        self.auto_revert = auto_revert
        self.mate_link = mate_link
        self.handovers: list[tuple[int, Role, str]] = []  # (t, role, "begun" | "refused: ...")
        for role in Role:
            self._boot(role)

    # --- faults -----------------------------------------------------------------

    def cut(self, a: Role, b: Role) -> None:
        self.links[(a, b)].blocked = self.links[(b, a)].blocked = True

    def cut_one_way(self, src: Role, dst: Role) -> None:
        self.links[(src, dst)].blocked = True

    def isolate(self, role: Role) -> None:
        for peer in role.peers():
            self.cut(role, peer)

    def heal(self) -> None:
        for link in self.links.values():
            link.blocked = False

    def set_network(self, *, loss: float = 0.0, delay_ms: tuple[int, int] = (0, 2), duplicate: float = 0.0) -> None:
        for link in self.links.values():
            link.loss, link.delay_ms, link.duplicate = loss, delay_ms, duplicate

    def crash(self, role: Role) -> None:
        node = self.nodes[role]
        node.core = None
        node.paused = False
        node.broker_stalled = False  # a restarted process has a fresh event loop
        node.inbox.clear()
        node.timer_gen, node.armed_at = node.timer_gen + 1, None
        self._log(f"CRASH {role.value}")

    def restart(self, role: Role) -> None:
        if self.nodes[role].core is None:
            self._boot(role)
            self._log(f"RESTART {role.value}")

    def pause(self, role: Role) -> None:
        node = self.nodes[role]
        if node.core is not None and not node.paused:
            node.paused = True
            node.timer_gen, node.armed_at = node.timer_gen + 1, None
            self._log(f"PAUSE {role.value}")

    def resume(self, role: Role) -> None:
        node = self.nodes[role]
        if node.core is None or not node.paused:
            return
        node.paused = False
        self._log(f"RESUME {role.value}")
        while node.inbox:  # what the socket buffered, read at resume time (after the clock jumped)
            self._deliver(node, node.inbox.popleft())
        self._arm(node)

    def stall_broker(self, role: Role) -> None:
        """A hung broker event loop: heartbeats go on (their own thread), liveness stamps stop."""
        self.nodes[role].broker_stalled = True
        self._log(f"STALL {role.value}'s broker")

    def unstall_broker(self, role: Role) -> None:
        self.nodes[role].broker_stalled = False
        self._log(f"UNSTALL {role.value}'s broker")

    def force(self, role: Role) -> None:
        node = self.nodes[role]
        self._stamp(node)
        node.core.request_force(node.local(self.t), acknowledge_data_loss=True)
        self._after(node)

    def release(self, role: Role, *, force: bool = False, why: str = "operator released activity",
                drain_ms: int = 5) -> bool:
        """The operator's release-activity on `role` (or revert/auto-revert/SIGTERM: one handover)."""
        node = self.nodes[role]
        if node.core is None or node.paused:
            return False
        self._stamp(node)
        try:
            node.core.begin_handover(node.local(self.t), why, force=force)
        except LocalProtocolError as exc:
            self.handovers.append((self.t, role, f"refused: {exc}"))
            self._after(node)
            return False
        self.handovers.append((self.t, role, "begun"))
        self._log(f"RELEASE {role.value}{' forced' if force else ''}")
        self._push(self.t + drain_ms, "drained", (role, node.core))
        self._after(node)
        return True

    def revert(self, drain_ms: int = 5) -> bool:
        """revert-activity: the active backup hands activity to the primary."""
        return self.release(Role.BACKUP, why="operator reverted activity to the primary", drain_ms=drain_ms)

    # --- running ------------------------------------------------------------------

    def run_until(self, t_end: int) -> None:
        queue, pop = self._queue, heapq.heappop
        while queue and queue[0][0] <= t_end:
            t, _, kind, payload = pop(queue)
            if t > self.t:
                self.t = t
            if kind == "timer":
                role, gen = payload
                node = self.nodes[role]
                if node.core is None or node.paused or gen != node.timer_gen:
                    continue
                node.armed_at = None
                self._stamp(node)
                now = node.local(self.t)
                if self.mate_link and node.core.may_serve(now):
                    node.core.mate_link(now, True)
                node.core.handle_timer(now)
                self._after(node)
            elif kind == "deliver":
                role, data = payload
                node = self.nodes[role]
                if node.core is None:
                    continue
                if node.paused:
                    if len(node.inbox) < SOCKET_BUFFER:
                        node.inbox.append(data)
                    continue
                self._deliver(node, data)
            elif kind == "auto_revert":
                self.release(payload, why="auto-revert")
            elif kind == "drained":
                role, core = payload
                node = self.nodes[role]
                if node.core is not core:
                    continue
                if node.paused:  # the adapter's drain loop is stopped too; it finishes after resume
                    self._push(self.t + 10, kind, payload)
                    continue
                self._stamp(node)
                node.core.finish_handover(node.local(self.t), final_seq=0)
                self._after(node)
            self.steps += 1
            self.check()
        self.t = max(self.t, t_end)
        self.check()

    def run_for(self, ms: int) -> None:
        self.run_until(self.t + ms)

    # --- observation ------------------------------------------------------------

    def serving(self) -> list[Role]:
        return [r for r, n in self.nodes.items() if n.core is not None and n.core.may_serve(n.local(self.t))]

    def core(self, role: Role) -> QuorumCore:
        return self.nodes[role].core

    def first_serving_after(self, t_from: int, t_limit: int, role: Role | None = None) -> int | None:
        """Run until some node (or `role`) serves; return the instant, or None by t_limit."""
        step = 5
        self.run_until(max(self.t, t_from))
        while self.t < t_limit:
            serving = self.serving()
            if serving and (role is None or role in serving):
                return self.t
            self.run_for(step)
        return None

    def reasons(self, role: Role, kind: str | None = None) -> list[str]:
        return [d.reason for _, d in self.decisions if d.role is role and (kind is None or d.kind == kind)]

    def check(self) -> None:
        # After every step, so written for speed: a node not ACTIVE cannot serve, and most steps have
        # one active node or none (the same answer as serving(), without its list and clock readings).
        t = self.t
        serving = [n for n in self.nodes.values()
                   if n.core is not None and n.core.activity is Activity.ACTIVE and n.core.may_serve(n.local(t))]
        if len(serving) > 1:
            self._fail(f"S1 violated: {', '.join(n.role.value for n in serving)} serve at once")
        for node in serving:
            if node.last_rx_global is None or t - node.last_rx_global > self._s3_window_ms:
                self._fail(f"S3 violated: {node.role.value} serves without hearing a peer for "
                           f"{'ever' if node.last_rx_global is None else t - node.last_rx_global} ms")

    def status_line(self) -> str:
        parts = []
        for role, node in self.nodes.items():
            if node.core is None:
                parts.append(f"{role.value[:1].upper()}:down")
                continue
            c = node.core
            now = node.local(self.t)
            what = "SERVE" if c.may_serve(now) else c.activity.name.lower()
            seen = "".join(r.value[0] for r in c.peers if c.sees(r, now))
            extra = f" bid{c.bid_epoch}" if c.bid_epoch else ""
            lease = f" lease+{c.lease_expiry - now}" if c.may_serve(now) else ""
            parts.append(f"{role.value[:1].upper()}:{what} e{c.state.epoch}/v{c.state.voted_epoch}"
                         f"{extra}{lease} sees[{seen}]{' paused' if node.paused else ''}")
        return f"t={self.t:>7} " + " | ".join(parts)

    # --- internals ----------------------------------------------------------------

    def _boot(self, role: Role) -> None:
        node = self.nodes[role]
        auth = HeartbeatAuth(SECRET, GROUP, role)
        node.core = QuorumCore(role, auth, self.timing, node.store, node.local(self.t))
        node.core.auto_revert = self.auto_revert
        node.paused = False
        node.last_rx_global = None
        self._after(node)

    def _stamp(self, node: SimNode) -> None:
        """What the node adapter does before every core call: pass on the broker loop's latest stamp."""
        if not node.broker_stalled:
            node.core.broker_alive(node.local(self.t))

    def _deliver(self, node: SimNode, data: bytes) -> None:
        now = node.local(self.t)
        if not node.broker_stalled:  # _stamp, inline: once per delivery
            node.core.broker_alive(now)
        hb = node.core.receive(data, now)
        if hb is not None:
            node.last_rx_global = self.t
        self._after(node)

    def _after(self, node: SimNode) -> None:
        core = node.core
        for data in core.datagrams_to_send():
            self._history.append((node.role, data))
            for peer in node.role.peers():
                self._send(node.role, peer, data)
        revert = False
        for d in core.decisions():
            revert |= d.kind == "auto_revert"
            self.decisions.append((self.t, d))
            self._log(f"{d.kind.upper()} {d.reason}")
            if d.kind == "activate":
                if self.activations and d.epoch <= max(e for _, _, e in self.activations):
                    self._fail(f"epoch did not increase: {node.role.value} activated at {d.epoch} after "
                               f"{self.activations}")
                self.activations.append((self.t, node.role, d.epoch))
        if revert:
            self._push(self.t + 1, "auto_revert", node.role)
        self._arm(node)

    def _arm(self, node: SimNode) -> None:
        if node.core is None or node.paused:
            return
        when = node.global_at(node.core.get_timer())
        if when < self.t:
            when = self.t
        if when == node.armed_at:  # the pending event still stands (most deliveries leave the timer as it was)
            return
        node.timer_gen += 1
        node.armed_at = when
        self._push(when, "timer", (node.role, node.timer_gen))

    def _send(self, src: Role, dst: Role, data: bytes) -> None:
        link = self.links[(src, dst)]
        if link.blocked or self.rng.random() < link.loss:
            return
        copies = 2 if self.rng.random() < link.duplicate else 1
        for _ in range(copies):
            self._push(self.t + self.rng.randint(*link.delay_ms), "deliver", (dst, data))
        if self.replay_rate and self._history and self.rng.random() < self.replay_rate:
            _, old = self._history[self.rng.randrange(len(self._history))]
            self._push(self.t + self.rng.randint(0, 50), "deliver", (self.rng.choice(list(Role)), old))

    def _push(self, t: int, kind: str, payload: object) -> None:
        self._tick += 1
        heapq.heappush(self._queue, (t, self._tick, kind, payload))

    def _log(self, event: str) -> None:
        if self.trace.maxlen:
            self.trace.append(f"t={self.t:>7} {event}")
            self.trace.append(self.status_line())

    def _fail(self, what: str) -> None:
        lines = "\n".join(self.trace)
        raise InvariantViolation(f"seed {self.seed}: {what}\n{self.status_line()}\n--- last steps ---\n{lines}")


# --- random schedules -------------------------------------------------------------

FAULTS = ("cut", "cut_one_way", "isolate", "heal", "crash", "restart", "pause", "resume", "network", "replay",
          "stall_broker", "unstall_broker")
HANDOVERS = ("release", "release", "release_forced", "revert")


def random_schedule(seed: int, duration_ms: int = 12_000, *, trace: bool = True,
                    handovers: bool = False) -> Simulation:
    """Run one random fault schedule to the end, checking invariants at every step. With `handovers`,
    releases, reverts and auto-revert (on in half the schedules) are mixed with the faults."""
    rng = random.Random(seed ^ 0x5EED)
    sim = Simulation(seed, drift_ppm=300, trace=trace, auto_revert=handovers and rng.random() < 0.5,
                     mate_link=handovers)
    roles = list(Role)
    sim.run_until(rng.randint(500, 1500))
    choices = FAULTS + HANDOVERS * 3 if handovers else FAULTS
    while sim.t < duration_ms:
        fault = rng.choice(choices)
        a, b = rng.sample(roles, 2)
        if fault in ("release", "release_forced"):
            active = sim.serving()
            sim.release(active[0] if active and rng.random() < 0.9 else a, force=fault == "release_forced",
                        drain_ms=rng.choice((1, 5, 40, 300, 2500)))
        elif fault == "revert":
            sim.revert(drain_ms=rng.choice((1, 5, 40)))
        elif fault == "cut":
            sim.cut(a, b)
        elif fault == "cut_one_way":
            sim.cut_one_way(a, b)
        elif fault == "isolate":
            sim.isolate(a)
        elif fault == "heal":
            sim.heal()
        elif fault == "crash":
            sim.crash(a)
        elif fault == "restart":
            sim.restart(a)
        elif fault == "pause":
            sim.pause(a)
        elif fault == "resume":
            sim.resume(a)
        elif fault == "network":
            sim.set_network(loss=rng.choice((0.0, 0.05, 0.3)), delay_ms=rng.choice(((0, 2), (1, 30), (0, 200))),
                            duplicate=rng.choice((0.0, 0.1)))
        elif fault == "stall_broker":
            sim.stall_broker(a)
        elif fault == "unstall_broker":
            sim.unstall_broker(a)
        elif fault == "replay":
            sim.replay_rate = rng.choice((0.0, 0.05, 0.3))
        sim.run_for(rng.choice((50, 200, 400, 700, 1200, 2500)))
    # End healed, so every schedule also shows the group recovering.
    sim.heal()
    sim.set_network()
    sim.replay_rate = 0.0
    for role in Role:
        sim.resume(role)
        sim.restart(role)
        sim.unstall_broker(role)
    sim.run_for(4_000)
    return sim


def seed_batches(default_schedules: int, batches: int) -> list[range]:
    """PAIRMQ_SIM_SCHEDULES seeds from PAIRMQ_SIM_FIRST_SEED, cut into `batches` ranges that cover each seed once:
    one test a batch, so the suite's workers share a simulation's cores."""
    schedules = int(os.environ.get("PAIRMQ_SIM_SCHEDULES", str(default_schedules)))
    first = int(os.environ.get("PAIRMQ_SIM_FIRST_SEED", "0"))
    return [range(first + schedules * b // batches, first + schedules * (b + 1) // batches) for b in range(batches)]

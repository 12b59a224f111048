"""A seeded simulator for config-sync: two routing nodes' stores and the real exchange ends.

Each step, the schedule picks one of: an operator change on the active (valid or not), delivery of
a message in flight (in order; a link delivers or is cut), a link cut, a crash and restart of
either node (its store survives, its link does not), a failover (the standby takes activity with
the next epoch; the old active, if up, becomes standby), timer ticks. The stores are real
(`ConfigStore` on SQLite in memory); the ends are configsync/exchange.py's.

Checks, after every step:
- C1 convergence: once both nodes are up, the link is live and nothing is in flight, the standby
  has the active's version and digest, and the active sees it In-Sync.
- C2 confirmed changes survive: a change the standby acknowledged (confirmed on both nodes) is in
  the active's history after any failover, by version and chain.
- C3 no half-applied change: every store's document equals its changes replayed (the store checks
  itself on reopen) and its digest is its document's.
- Divergent changes a standby discards are reported, and only changes the new active never had.
"""

from __future__ import annotations

import collections
import random

from pairmq.appliance.broker.access import hash_password
from pairmq.configsync.exchange import ActiveEnd, ConfigLinkFault, Snapshot, StandbyEnd, SyncStatus, decode, encode
from pairmq.configsync.store import ConfigStore

RECORD = hash_password(b"pw", b"s" * 16, n=2, r=1, p=1).to_document()
USERS = ("ann", "bob", "cy")


class SimFailure(AssertionError):
    pass


def random_change(rng: random.Random) -> dict:
    kind = rng.choice(["user.set", "user.delete", "anonymous.set", "acl.add", "acl.delete", "limits.set",
                       "overload.set", "auto_revert.set", "bad"])
    if kind == "user.set":
        return {"kind": kind, "username": rng.choice(USERS), "record": RECORD}
    if kind == "user.delete":
        return {"kind": kind, "username": rng.choice(USERS)}
    if kind == "anonymous.set":
        return {"kind": kind, "allowed": rng.random() < 0.5}
    if kind == "acl.add":
        return {"kind": kind, "rule": {"effect": "allow", "action": "both", "filter": f"t/{rng.randrange(5)}/#",
                                       "who": "all"}}
    if kind == "acl.delete":
        return {"kind": kind, "index": rng.randrange(3)}
    if kind == "limits.set":
        return {"kind": kind, "name": "session_queue_max_messages", "value": rng.choice([None, 10, 1000])}
    if kind == "overload.set":
        return {"kind": kind, "name": "max_window", "value": rng.choice([None, 5, 50, 0])}
    if kind == "auto_revert.set":
        return {"kind": kind, "enabled": rng.choice([None, True, False])}
    return {"kind": "limits.set", "name": "nonsense", "value": 1}


class Node:
    def __init__(self, name: str) -> None:
        self.name = name
        self.store = ConfigStore(":memory:")
        self.up = True
        self.discarded_reports: list[int] = []


class ConfigSyncSim:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.seed = seed
        self.now = 0
        self.nodes = {"A": Node("A"), "B": Node("B")}
        self.active = "A"
        self.epoch = 1
        self.active_end: ActiveEnd | None = None
        self.standby_end: StandbyEnd | None = None
        self.to_standby: collections.deque = collections.deque()
        self.to_active: collections.deque = collections.deque()
        self.confirmed: dict[int, str] = {}  # version -> chain, acknowledged by the standby
        self.trace: list[str] = []
        self.changes = self.refused = self.snapshots = self.failovers = 0

    @property
    def standby(self) -> str:
        return "B" if self.active == "A" else "A"

    # --- the schedule ---

    def run(self, steps: int) -> None:
        for _ in range(steps):
            self.step()
        self.heal()
        self.check()
        self.converged()

    def step(self) -> None:
        self.now += self.rng.choice([1, 10, 100])
        r = self.rng.random()
        if r < 0.25:
            self.operator_change()
        elif r < 0.70:
            self.deliver()
        elif r < 0.76:
            self.cut("cut")
        elif r < 0.82:
            self.crash(self.rng.choice("AB"))
        elif r < 0.88:
            self.restart_any()
        elif r < 0.92:
            self.failover()
        else:
            self.connect()
        self.check()

    def operator_change(self) -> None:
        node = self.nodes[self.active]
        if not node.up:
            return
        try:
            entry = node.store.apply(random_change(self.rng), self.now)
        except Exception as exc:  # noqa: BLE001 - only ConfigChangeError is expected
            if type(exc).__name__ != "ConfigChangeError":
                raise
            self.refused += 1
            return
        self.changes += 1
        self.log(f"change {entry.version} on {self.active}")
        if self.active_end is not None:
            self.active_end.committed(entry)
            self.to_standby.extend(encode(m) for m in self.active_end.messages_to_send())

    def connect(self) -> None:
        a, s = self.nodes[self.active], self.nodes[self.standby]
        if self.active_end is not None or not (a.up and s.up):
            return
        self.active_end = ActiveEnd(self.epoch, a.store, self.now)
        self.standby_end = StandbyEnd(self.epoch_seen(s), self.now)
        self.standby_end.hello(s.store.head, s.store.recent_chains(64))
        self.to_active.extend(encode(m) for m in self.standby_end.messages_to_send())
        self.log("link up")

    def epoch_seen(self, node: Node) -> int:
        return getattr(node, "epoch_seen", 0)

    def deliver(self) -> None:
        if self.active_end is None:
            return
        queue = self.to_standby if (self.rng.random() < 0.5 and self.to_standby) or not self.to_active else \
            self.to_active
        if not queue:
            return
        data = queue.popleft()
        try:
            if queue is self.to_active:
                self.active_end.receive(decode(data), self.now)
                self.to_standby.extend(encode(m) for m in self.active_end.messages_to_send())
                if self.active_end.acked is not None:
                    self.note_confirmed()
            else:
                self.standby_receive(decode(data))
        except ConfigLinkFault as exc:
            self.cut(f"fault: {exc}")

    def standby_receive(self, message) -> None:
        node = self.nodes[self.standby]
        for effect in self.standby_end.receive(message, self.now):
            if isinstance(effect, Snapshot):
                mine = node.store.changes_after(max(effect.common, 0)) or []
                node.discarded_reports.extend(e.version for e in mine)
                for e in mine:  # a change we discard must not be one the snapshot holds
                    if e.version <= effect.version and e.chain == self.nodes[self.active].store.chain_at(e.version):
                        raise SimFailure(f"seed {self.seed}: discarded change {e.version} that the active has")
                node.store.install(effect.version, effect.chain, effect.document)
                self.snapshots += 1
            else:
                node.store.apply_entries(effect.entries)
            node.epoch_seen = self.standby_end.epoch_seen
            self.standby_end.ack(node.store.head)
        self.to_active.extend(encode(m) for m in self.standby_end.messages_to_send())

    def note_confirmed(self) -> None:
        acked = self.active_end.acked
        store = self.nodes[self.active].store
        if acked.version <= store.head.version and acked.digest:
            chain_value = store.chain_at(acked.version)
            standby = self.nodes[self.standby].store
            if chain_value is not None and standby.chain_at(acked.version) == chain_value:
                for v in range(max(self.confirmed, default=0) + 1, acked.version + 1):
                    c = store.chain_at(v)
                    if c is not None:
                        self.confirmed[v] = c

    def cut(self, why: str) -> None:
        if self.active_end is not None:
            self.log(f"link cut ({why})")
        self.active_end = self.standby_end = None
        self.to_standby.clear()
        self.to_active.clear()

    def crash(self, name: str) -> None:
        node = self.nodes[name]
        if node.up:
            node.up = False
            self.cut(f"{name} crashed")
            self.log(f"{name} down")

    def restart_any(self) -> None:
        for node in self.nodes.values():
            if not node.up:
                node.up = True
                self.log(f"{node.name} up")
                return

    def failover(self) -> None:
        """The standby takes activity (the quorum core decides when; any moment is possible here)."""
        if not self.nodes[self.standby].up:
            return
        self.cut("failover")
        self.active = self.standby
        self.epoch += 1
        self.nodes[self.active].epoch_seen = self.epoch
        self.failovers += 1
        self.log(f"{self.active} active, epoch {self.epoch}")
        store = self.nodes[self.active].store
        for version, chain_value in self.confirmed.items():
            if store.chain_at(version) not in (chain_value, None) or version > store.head.version:
                raise SimFailure(f"seed {self.seed}: confirmed change {version} lost by the failover\n{self.story()}")
        # A confirmed change older than our history is covered by the head's chain; forget what is settled.
        self.confirmed = {v: c for v, c in self.confirmed.items() if store.chain_at(v) is not None}

    def heal(self) -> None:
        for node in self.nodes.values():
            node.up = True
        self.connect()
        for _ in range(10_000):
            if not (self.to_standby or self.to_active):
                return
            self.deliver()
            if self.active_end is None:
                self.connect()
        raise SimFailure(f"seed {self.seed}: the exchange never went quiet\n{self.story()}")

    # --- the checks ---

    def check(self) -> None:
        for node in self.nodes.values():
            store = node.store
            if store.document.digest() != store.head.digest:
                raise SimFailure(f"seed {self.seed}: {node.name}'s digest is not its document's\n{self.story()}")

    def converged(self) -> None:
        a, s = self.nodes[self.active].store, self.nodes[self.standby].store
        if (a.head.version, a.head.digest) != (s.head.version, s.head.digest):
            raise SimFailure(f"seed {self.seed}: after healing the standby has version {s.head.version}, the active "
                             f"{a.head.version} (digests equal: {a.head.digest == s.head.digest})\n{self.story()}")
        if self.active_end.status() is not SyncStatus.IN_SYNC:
            raise SimFailure(f"seed {self.seed}: converged but the active says {self.active_end.status()}")

    def log(self, line: str) -> None:
        a, b = self.nodes["A"].store.head, self.nodes["B"].store.head
        self.trace.append(f"t={self.now} {line} | A v{a.version} B v{b.version} active {self.active}")
        del self.trace[:-40]

    def story(self) -> str:
        return "\n".join(self.trace)

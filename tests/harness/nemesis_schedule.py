"""The nemesis's plan: which fault, on what, for how long -- drawn from a seed, no I/O.

Rules:
1. A schedule is a pure function of (seed, length, mode): `random.Random(seed)` draws every choice,
   so a failing seed names its whole fault sequence. Timing is not reproducible (real processes on a
   shared machine), the sequence of faults is.
2. Targets are symbolic -- "active", "standby", "monitor", and links between them or the client host --
   and are resolved against the group when the step is applied: after a failover the backup is the
   active, and a fault aimed at "the active" must follow it.
3. Every step has a heal; the runner applies the fault, holds it `hold_s`, heals, then waits for the
   group to recover (one node serving, its mate in sync) before the next step.
4. Mode "cover" (CI) draws every kind once, in a seeded order, then random steps if `length` asks for
   more; mode "random" (soak) draws every step's kind uniformly.
"""

from __future__ import annotations

import dataclasses
import random

# What each kind does (applied by tests/harness/nemesis.py):
KINDS = {
    "kill9": "kill -9 a node, restart it after hold_s",
    "pause": "SIGSTOP a node for hold_s (longer than the 0.5 s lease), then SIGCONT",
    "partition": "cut a link both ways in the switch for hold_s",
    "one_way": "cut one direction of a link for hold_s",
    "loss": "drop loss_pct % of a host's IP packets for hold_s",
    "delay": "tc on a host's veth for hold_s: netem delay/jitter/reorder, or a tbf rate limit if the kernel has no netem",
    "disk_full": "fill the active's data file system (its spool) for hold_s, then free it",
    "monitor_failover": "kill -9 the monitor and the active together; restart both after hold_s",
    "flap": "cut and heal a link every period_s for hold_s",
    "release_revert": "release activity to the mate, then revert it to the primary, `repeats` times (management API)",
}
NODES = ("active", "standby", "monitor")
HOSTS = ("active", "standby", "monitor", "client")
LINKS = tuple((a, b) for i, a in enumerate(HOSTS) for b in HOSTS[i + 1:])  # every pair once
LEASE_S = 0.5


@dataclasses.dataclass(frozen=True)
class Step:
    index: int
    kind: str
    target: tuple[str, ...]  # symbolic: a node, or a (src, dst) link
    hold_s: float
    params: dict = dataclasses.field(default_factory=dict)

    def describe(self) -> str:
        extra = "".join(f" {k}={v}" for k, v in sorted(self.params.items()))
        return f"#{self.index} {self.kind} {'->'.join(self.target)} for {self.hold_s:.2f} s{extra}"

    def json(self) -> dict:
        return {"index": self.index, "kind": self.kind, "target": list(self.target), "hold_s": self.hold_s,
                "params": dict(self.params)}


def _draw(rng: random.Random, index: int, kind: str) -> Step:
    hold = round(rng.uniform(1.0, 4.0), 2)
    if kind in ("kill9", "pause"):
        node = rng.choice(NODES)
        if kind == "pause":
            hold = round(rng.uniform(1.5 * LEASE_S, 6 * LEASE_S), 2)
        return Step(index, kind, (node,), hold)
    if kind in ("partition", "flap"):
        params = {"period_s": round(rng.uniform(0.1, 0.3), 2)} if kind == "flap" else {}
        return Step(index, kind, rng.choice(LINKS), hold, params)
    if kind == "one_way":
        a, b = rng.choice(LINKS)
        return Step(index, kind, (a, b) if rng.random() < 0.5 else (b, a), hold)
    if kind == "loss":
        return Step(index, kind, (rng.choice(HOSTS),), hold, {"loss_pct": rng.choice((5, 10, 20, 40))})
    if kind == "delay":
        return Step(index, kind, (rng.choice(HOSTS),), hold,
                    {"delay_ms": rng.choice((20, 50, 100)), "reorder_pct": rng.choice((0, 10, 25))})
    if kind in ("disk_full", "monitor_failover"):
        return Step(index, kind, ("active",) if kind == "disk_full" else ("monitor", "active"), hold)
    if kind == "release_revert":
        return Step(index, kind, ("active",), 0.0, {"repeats": rng.randint(1, 3)})
    raise ValueError(f"unknown fault kind {kind!r}; kinds are {', '.join(KINDS)}")


def schedule(seed: int, length: int, mode: str = "random", kinds: tuple[str, ...] = tuple(KINDS)) -> list[Step]:
    """`length` steps from `seed`; mode "cover" starts with every kind once (so length >= len(kinds))."""
    if mode not in ("cover", "random"):
        raise ValueError(f"mode must be 'cover' or 'random', not {mode!r}")
    unknown = [k for k in kinds if k not in KINDS]
    if unknown or not kinds:
        raise ValueError(f"unknown fault kinds {unknown}; kinds are {', '.join(KINDS)}")
    if length < 1:
        raise ValueError(f"a schedule needs at least one step, not {length}")
    rng = random.Random(seed)
    order: list[str] = []
    if mode == "cover":
        order = list(kinds)
        rng.shuffle(order)
    while len(order) < length:
        order.append(rng.choice(kinds))
    return [_draw(rng, i, kind) for i, kind in enumerate(order)]

"""How a joining standby catches up with the active (DESIGN §4 "Resync"), as a pure decision.

Rules, in order:
1. The standby's head is the active's head: IN_STEP, live ops only.
2. The standby's head is a point of the active's log (a commit's end) that the log still holds (same seq,
   same checksum; the checksum digests the whole history up to it, so equal checksums mean equal
   histories): INCREMENTAL, the ops after it.
3. Anything else is SNAPSHOT, with the reason:
   - the active dropped those ops from its log already (it starts after the standby's head);
   - the standby is ahead of the active, or its op at that seq differs: its tail diverged (ops
     written by an old active and never acknowledged through the mate). That tail is discarded;
     the spool keeps materialized state, not a log it could rewind, so it is rebuilt whole.
The decision never reads a clock or a file: `checksum_at(seq)` is the caller's lookup of its log.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from pairmq.appliance.spool.chain import ChainPoint

from .messages import Catchup


@dataclasses.dataclass(frozen=True, slots=True)
class ResyncPlan:
    catchup: Catchup
    after_seq: int  # INCREMENTAL: ship ops with seq > after_seq; SNAPSHOT: 0
    ops_to_go: int  # INCREMENTAL: how many ops; SNAPSHOT: the active's head seq (a measure of history)
    reason: str


def plan_resync(active_base: ChainPoint, active_head: ChainPoint, standby_head: ChainPoint,
                checksum_at: Callable[[int], bytes | None]) -> ResyncPlan:
    if standby_head == active_head:
        return ResyncPlan(Catchup.IN_STEP, active_head.seq, 0, f"in step at op {active_head.seq}")
    if standby_head.seq > active_head.seq:
        return _snapshot(active_head, f"the standby is ahead (op {standby_head.seq} > our {active_head.seq}): "
                                      "its tail diverged and is discarded")
    if standby_head.seq < active_base.seq:
        return _snapshot(active_head, f"our log starts after op {active_base.seq}; the standby is at op "
                                      f"{standby_head.seq}")
    ours = active_base.checksum if standby_head.seq == active_base.seq else checksum_at(standby_head.seq)
    if ours is None:
        return _snapshot(active_head, f"no commit of our log ends at op {standby_head.seq} (dropped, or the standby's tail diverged)")
    if ours != standby_head.checksum:
        return _snapshot(active_head, f"the standby's op {standby_head.seq} differs from ours: its tail diverged "
                                      "and is discarded")
    to_go = active_head.seq - standby_head.seq
    return ResyncPlan(Catchup.INCREMENTAL, standby_head.seq, to_go,
                      f"{to_go} ops behind (after op {standby_head.seq}, epoch {standby_head.epoch})")


def _snapshot(active_head: ChainPoint, reason: str) -> ResyncPlan:
    return ResyncPlan(Catchup.SNAPSHOT, 0, active_head.seq, reason)

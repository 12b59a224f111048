"""The redundancy view (GET /api/v1/redundancy, `pairmq show redundancy`): pure functions of the quorum
core at `now`, called under the quorum lock; a routing node adds its broker's and mate link's fields."""

from __future__ import annotations

from ..quorum.core import QuorumCore
from ..quorum.wire import Activity
from ..roles import Role


def routing_activity_label(core: QuorumCore, role: Role, now: int) -> str:
    if core.may_serve(now):
        return "Local Active"
    if core.active_role(now) is role.mate():
        return "Mate Active"
    return "Standby"


def failover_silence_ms(core: QuorumCore, role: Role, now: int) -> int | None:
    """At a bid: how long the active mate has been silent; None when this bid replaces no failed active (a
    boot, or a planned handover the mate still takes part in)."""
    mate = core.peers[role.mate()]
    if mate.hb is None or mate.hb.activity is not Activity.ACTIVE or core.sees(mate.role, now):
        return None
    return now - mate.heard_at


def decision_json(d, now: int) -> dict:
    return {"kind": d.kind, "epoch": d.epoch, "reason": d.reason, "ms_ago": now - d.at_ms}


def redundancy_view(core: QuorumCore, now: int, *, group: str, role: Role, address: str, activity: str,
                    started_at: int, store_view: dict, events_view: dict, keyring, heartbeats) -> dict:
    """What every node shows; a routing node overrides `serving`, `in_sync`, `resync`, `mate_link_refusals`,
    `vip` and `mqtt` (their keys stay in this order)."""
    active = core.active_role(now)
    peers = []
    for peer_role, peer in core.peers.items():
        hb = peer.hb
        peers.append({
            "role": peer_role.value,
            "seen": core.sees(peer_role, now),
            "heard_ms_ago": None if peer.heard_at is None else now - peer.heard_at,
            "activity": None if hb is None else hb.activity.name.lower(),
            "epoch": None if hb is None else hb.epoch,
        })
    decisions = [decision_json(d, now) for d in core.history]
    return {
        "schema": 1,
        "group": group,
        "role": role.value,
        "address": address,
        "activity": activity,
        "serving": core.may_serve(now),
        "epoch": core.state.epoch,
        "active_role": active.value if active else None,
        "redundancy_status": core.redundancy_status(now).value,
        "in_sync": None,
        "resync": None,
        "mate_link_refusals": None,
        "incarnation": core.state.incarnation,
        # R8 (appliance/quorum/core.py): a quorum state that cannot be saved is not acted on; say so here.
        "quorum_state": {**store_view, "save_error": core.save_error},
        "uptime_ms": now - started_at,
        "lease_remaining_ms": max(0, core.lease_expiry - now) if core.may_serve(now) else 0,
        "peers": peers,
        "last_decision": decisions[-1] if decisions else None,
        "decisions": decisions,
        "event_log": events_view,
        "vip": None,
        "accepted_heartbeats": core.auth.accepted,
        "rejected_heartbeats": dict(core.auth.rejected),
        "keyring": {**keyring.view(), "fingerprints": keyring.fingerprints()},  # never a secret
        "heartbeat_thread": {"broker_loop_age_ms": now - heartbeats.broker_alive_at,
                             "broker_stall_ms": core.timing.broker_stall_ms,
                             "max_timer_late_ms": heartbeats.max_timer_late_ms,
                             "send_errors": heartbeats.send_errors},
        "mqtt": None,
    }

"""`pairmq redundancy ...`: operator actions on a group's activity."""

from __future__ import annotations

from pairmq.appliance.config import GroupConfig
from pairmq.appliance.errors import PairMQError
from pairmq.appliance.roles import Role

from . import api
from .terminal import Terminal

DATA_LOSS_REFUSAL = (
    "forcing activity skips the check that this node holds every acknowledged message, so messages that "
    "only the other node had may be lost for good; if you accept that, repeat with --i-understand-data-loss"
)


HANDOVER_TIMEOUT_S = 10.0  # the node answers once the handover is over (its drain is bounded at 2 s)


def force_activity(term: Terminal, config: GroupConfig, role: Role, *, understood: bool) -> int:
    if not understood:
        raise PairMQError(DATA_LOSS_REFUSAL)
    if role is Role.MONITOR:
        raise PairMQError("the monitor never holds activity; force the primary or the backup")
    result = api.force_activity(config, role, _token(config))
    term.record(**{**result, "node": role.value, "action": "force-activity"})
    term.note(f"{role.value}: {result.get('result', 'forced bid started')}; "
              f"follow it with `pairmq show redundancy --watch`")
    return 0


def release_activity(term: Terminal, config: GroupConfig, role: Role | None, *, force: bool) -> int:
    """A planned handover from the active node (or `role`) to its mate; refused unless the mate is in sync,
    unless forced (then a plain step-down)."""
    role = role or _active_role(config)
    with term.status(f"{role.value}: handing activity over to its mate (draining, then the mate takes over)"):
        result = api.redundancy_action(config, role, "release-activity", {"force": force}, _token(config),
                                       timeout_s=HANDOVER_TIMEOUT_S)
    return _report(term, role, result)


def revert_activity(term: Terminal, config: GroupConfig) -> int:
    """Move activity back to the primary: a planned handover on the active backup."""
    active = _active_role(config)
    if active is Role.PRIMARY:
        raise PairMQError("the primary already holds activity; there is nothing to revert")
    with term.status(f"{active.value}: handing activity back to the primary"):
        result = api.redundancy_action(config, active, "revert-activity", {}, _token(config),
                                       timeout_s=HANDOVER_TIMEOUT_S)
    return _report(term, active, result)


def _report(term: Terminal, role: Role, result: dict) -> int:
    term.record(**{**result, "node": role.value})
    if result.get("result") == "handed over":
        now = f"the {result['active']} is active" if result.get("active") else "the mate takes over"
        term.note(f"{role.value}: handed activity over in {result.get('drain_ms', 0)} ms at op "
                  f"{result.get('final_op', 0)}; {now}")
    else:
        term.note(str(result.get("reason") or f"{role.value}: {result.get('result', 'done')}"))
    return 0


def _active_role(config: GroupConfig) -> Role:
    nodes = api.fetch_redundancy(config)
    api.require_one_reachable(config, nodes)
    for node in nodes:
        if node.get("reachable") and node.get("serving"):
            return Role(node["role"])
    raise PairMQError(f"no node of group {config.name!r} holds activity right now; nothing to hand over")


def _token(config: GroupConfig) -> str:
    return api.token(config)

"""`pairmq redundancy ...`: operator actions on a group's activity."""

from __future__ import annotations

from appliance.config import GroupConfig, load_secret
from appliance.errors import PairMQError
from appliance.roles import Role

from . import api
from .terminal import Terminal

DATA_LOSS_REFUSAL = (
    "forcing activity skips the check that this node holds every acknowledged message, so messages that "
    "only the other node had may be lost for good; if you accept that, repeat with --i-understand-data-loss"
)


def force_activity(term: Terminal, config: GroupConfig, role: Role, *, understood: bool) -> int:
    if not understood:
        raise PairMQError(DATA_LOSS_REFUSAL)
    if role is Role.MONITOR:
        raise PairMQError("the monitor never holds activity; force the primary or the backup")
    from appliance.node import management_token

    token = management_token(load_secret(config))
    result = api.force_activity(config, role, token)
    term.note(f"{role.value}: {result.get('result', 'forced bid started')}; "
              f"follow it with `pairmq show redundancy --watch`")
    return 0

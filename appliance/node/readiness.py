"""What a node tells systemd, and when (docs/operations.md, "Installing with systemd").

Rules:
- READY=1 means "joined its group", checked every JOIN_POLL_S once the sockets are open and the quorum
  has settled (the heartbeat thread's on_ready: a peer seen, or quiet_ms waited out seeing nobody):
  1. a node that sees no peer is ready at once, saying so: it is up and waiting, and systemd must
     not take a lone first host for a failed start;
  2. a routing node whose mate holds activity (a standby) waits for an authenticated mate-link
     session to the active, i.e. its resync has begun. Not for "in sync": a resync lasts as long as
     the spool is big, and redundancy Up/Down is the CLI's business, not the service manager's;
  3. another routing node waits until someone holds activity, at most JOIN_DECISION_QUIETS x
     quiet_ms (a start-up bid settles within about two; beyond that, taking activity may need an
     operator's data-loss acknowledgement, which is not a reason for systemd to fail the start);
  4. the monitor is ready once it sees a peer (or by rule 1).
  The status sentence sent with READY=1 says which rule held.
- WATCHDOG=1 comes from the event loop itself, every half WatchdogSec (WATCHDOG_USEC / 2): a hung
  loop stops the pings and systemd restarts the node. Never from the heartbeat thread, which keeps
  running when the loop hangs.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Callable

from ..quorum.core import QuorumCore
from ..roles import Role
from . import sd_notify
from ..clock import now_ms
from .quorum_handle import QuorumHandle

log = logging.getLogger("pairmq.node")

JOIN_POLL_S = 0.05
JOIN_DECISION_QUIETS = 10


async def watchdog_pings() -> None:
    interval = sd_notify.watchdog_interval_s()
    while interval is not None:
        sd_notify.notify("WATCHDOG=1")
        await asyncio.sleep(interval)


async def announce_ready(quorum: QuorumHandle, role: Role, standby_linked: Callable[[], bool | None]) -> None:
    """Wait until the node has joined its group (the rules above), then send READY=1 with a status.
    `standby_linked()`: whether the standby's mate link has made a session; None off a routing node."""
    settled_at = now_ms()
    while (status := quorum.call(lambda core, now: joined(core, role, standby_linked, settled_at, now))) is None:
        await asyncio.sleep(JOIN_POLL_S)
    log.info("%s", status)
    sd_notify.notify(f"READY=1\nSTATUS={status}")


def joined(core: QuorumCore, role: Role, standby_linked: Callable[[], bool | None], settled_at: int,
           now: int) -> str | None:
    """The READY=1 status sentence once the node has joined its group, None while it has not."""
    seen = [r.value for r in core.peers if core.sees(r, now)]
    active = core.active_role(now)
    me = role.value
    if not seen:
        return f"{me}: no peer seen within {core.timing.quiet_ms} ms of start; running, waiting for the group"
    routing = role.routes_messages
    if routing and active is role.mate():
        if not standby_linked():
            return None
        return f"{me}: joined as standby (sees {', '.join(seen)}); mate link to the active {active.value} is up"
    waited_ms = now - settled_at
    if active is None and routing and waited_ms < JOIN_DECISION_QUIETS * core.timing.quiet_ms:
        return None
    holder = f"the active is {active.value}" if active is not None else f"nobody is active after {waited_ms} ms"
    return f"{me}: joined (sees {', '.join(seen)}); {holder}"

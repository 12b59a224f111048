"""What the management API may read of its node and ask of it: narrow ports the node's wiring builds.

Rules:
- The API never holds the node: every read and every change goes through a field here, so what the API
  can touch is listed in this file and nowhere else, and the API imports no node module.
- `quorum(fn)` runs `fn(core)` on the quorum core under the heartbeat thread's lock and returns its
  result; the API never takes that lock itself. `now_ms` is the monotonic clock the core runs on.
- A monitor routes no messages: `routing` is None there, and the routes that need it say so.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiohttp import web

from ..config import GroupConfig
from ..eventlog import EventLog
from ..keyring import CurrentKeyring, Keyring
from ..roles import Role
from .auth import ApiAuth
from .decisions import DecisionFeed
from .listener import ConnectionCaps



@dataclasses.dataclass(frozen=True, slots=True)
class RoutingPorts:
    """A routing node's broker reads and configuration entry points."""

    spool_view: Callable[[], dict]  # the broker's limits, refusal counters and spool writer
    sessions: Callable[[], Mapping[str, Any]]  # the current broker core's sessions by client id
    listeners: Callable[[], list[tuple[Any, bool]]]  # the MQTT listeners running now, each with "is it TLS"
    mate_link: Callable[[], tuple[bool, Any]]  # whether a mate link is up; the active's link while it ships
    configuration: Any  # NodeConfiguration: its sync, store, document, limits() and auto_revert()


@dataclasses.dataclass(frozen=True, slots=True)
class ApiPorts:
    """Everything the management API is given of its node, at construction, by the node's wiring."""

    role: Role
    config: GroupConfig
    keys: CurrentKeyring  # the secrets held now; requests are signed with their management keys
    decisions: DecisionFeed
    events: EventLog
    now_ms: Callable[[], int]
    quorum: Callable[[Callable[[Any], Any]], Any]
    may_serve: Callable[[], bool]
    redundancy_view: Callable[[], dict]
    force_activity: Callable[[bool], None]  # acknowledge_data_loss; raises LocalProtocolError when refused
    handover: Callable[..., Awaitable[Any]]  # (why, *, force, revert) -> HandoverOutcome; LocalProtocolError
    install_keyring: Callable[[Keyring, str, int], None]  # (new keyring, step, key id): secret_rotation.py
    routing: RoutingPorts | None
    instruments: Any = None  # NodeInstruments (appliance/instruments.py): the registry /metrics renders

    @property
    def address(self) -> str:
        return self.config.node(self.role).address

    def management_address(self, role: Role) -> str:
        return f"{self.config.node(role).address}:{self.config.ports.management}"

    def active_role(self) -> Role | None:
        return self.quorum(lambda core: core.active_role(self.now_ms()))

    def active_management_address(self) -> str | None:
        """host:port of the active node's management API, as this node sees it; None if none is active."""
        active = self.active_role()
        return None if active is None else self.management_address(active)


# The app's keys: its one handle on its node, its credentials and its connection caps.
PORTS = web.AppKey("ports", ApiPorts)
AUTH = web.AppKey("auth", ApiAuth)
CAPS = web.AppKey("caps", ConnectionCaps)

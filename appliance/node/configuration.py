"""A routing node's replicated configuration: its store, config-sync, and what a change does here.

Rules:
- The store (`<data_dir>/config/config.db`, configsync/store.py) is opened at start; a corrupt
  store stops the node with one sentence (`ConfigStoreCorrupt`): never serve a configuration we
  cannot trust.
- Import: an access file from before config-sync (`<data_dir>/config/access.json`) is imported
  once, as the first change (`document.replace`), while the store is still at version 0. Both
  nodes of a new group import the same file to the same change, so their histories agree; files
  that differ are settled by the active's snapshot like any divergence (and reported). The file is
  not read again: changes go through the management API on the active (`pairmq config ...`).
- A change takes effect at once on the node that applies it (the active through the API, the
  standby through config-sync): the access policy for the next CONNECT and the next packet; a
  deleted user's clients, and anonymous clients when anonymous access is turned off, are
  disconnected (v5 DISCONNECT 0x87 "not authorized"), and on the node that serves a deleted
  user's sessions are deleted too (the ops reach the standby by the mate link like any other);
  a revoked rule withholds the next delivery (access.py); limits on the broker core; overload settings
  on the listeners. Limits and overload settings not set here keep the group file's / built-in
  defaults.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Callable

from pairmq.configsync.document import ConfigDocument
from pairmq.configsync.service import ConfigSync
from pairmq.configsync.store import ConfigStore, store_path

from ..access_file import access_path, load_access
from ..broker.service import wall_ms
from ..config import GroupConfig
from ..mqtt.wire import ReasonCode
from ..roles import Role
from .quorum_handle import QuorumHandle

log = logging.getLogger("pairmq.configuration")


class NodeConfiguration:
    """`on_changed(before, after)` makes a new document the one in force (`apply_change`, called by the node
    with its broker and listeners); `may_serve()` is the node's gate."""

    def __init__(self, data_dir: Path, config: GroupConfig, role: Role, quorum: QuorumHandle, secret: bytes, *,
                 epoch: Callable[[], int], may_serve: Callable[[], bool],
                 on_changed: Callable[[ConfigDocument, ConfigDocument], None], events: Callable[..., None]) -> None:
        self._config, self._role, self._quorum = config, role, quorum
        self._on_changed = on_changed
        self.store = ConfigStore(store_path(data_dir))
        self.imported = self._import_access_file(access_path(data_dir))
        self._applied = self.store.document
        self.sync = ConfigSync(self.store, secret=secret, group=config.name, me=role,
                               epoch=epoch, is_active=may_serve,
                               active_address=self._active_config_sync_address,
                               active_name=self._active_management_address,
                               on_changed=self._changed, event=lambda kind, fields: events(kind, **fields))

    @property
    def document(self) -> ConfigDocument:
        return self.store.document

    async def start(self, address: str) -> None:
        await self.sync.start(address, self._config.ports.config_sync)

    async def stop(self) -> None:
        await self.sync.stop()
        self.store.close()

    def limits(self):
        return self.document.effective_limits(self._config.limits)

    def auto_revert(self) -> bool:
        return self.document.effective_auto_revert(self._config.auto_revert)

    # --- internals ---

    def _import_access_file(self, path) -> bool:
        if self.store.head.version != 0:
            return False
        policy = load_access(path)  # a malformed file is a ConfigError sentence: the node does not start
        if policy is None:
            return False
        document = ConfigDocument(access=policy).to_json()
        self.store.apply({"kind": "document.replace", "document": document}, 0)
        log.info("%s: imported %s into the configuration store as version 1", self._role.value, path)
        return True

    def _active_role(self) -> Role | None:
        active = self._quorum.call(lambda core, now: core.active_role(now))
        return None if active is None or active is self._role else active

    def _active_config_sync_address(self) -> tuple[str, int] | None:
        active = self._active_role()
        if active is None:
            return None
        return self._config.node(active).address, self._config.ports.config_sync

    def _active_management_address(self) -> str | None:
        active = self._active_role()
        if active is None:
            return None
        return f"{self._config.node(active).address}:{self._config.ports.management}"

    def _changed(self, what: str) -> None:
        """Make the store's document the one in force on this node."""
        before, doc = self._applied, self.store.document
        self._applied = doc
        log.info("%s: configuration version %d: %s", self._role.value, self.store.head.version, what)
        self._on_changed(before, doc)


def apply_change(before: ConfigDocument, doc: ConfigDocument, *, authn, listeners: list, broker,
                 may_serve: Callable[[], bool], apply_limits: Callable[[object], None], limits: object,
                 quorum: QuorumHandle, auto_revert: bool, events: Callable[..., None]) -> None:
    """What a new document does on a routing node (the rules above): `limits` and `auto_revert` are its
    effective values."""
    authn.policy = doc.access
    authn.note = ""
    gone = set(before.access.users) - set(doc.access.users)
    anonymous_off = before.access.allow_anonymous and not doc.access.allow_anonymous

    def unwelcome(conn) -> bool:
        return conn.username in gone if conn.username is not None else anonymous_off

    for listener in listeners:
        if gone or anonymous_off:
            dropped = listener.drop_clients(ReasonCode.NOT_AUTHORIZED, only=unwelcome)
            if dropped:
                events("clients_dropped_by_config", count=dropped, users=sorted(gone), anonymous=anonymous_off)
        if doc.overload != before.overload:
            listener.set_overload(doc.effective_overload())
    if gone and may_serve():
        broker.execute(broker.core.remove_users(gone, wall_ms()))
    if doc.limits != before.limits:
        apply_limits(limits)
    if doc.auto_revert != before.auto_revert:
        def set_auto_revert(core, now) -> None:
            core.auto_revert = auto_revert

        quorum.call(set_auto_revert)

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

from pairmq.configsync.document import ConfigDocument
from pairmq.configsync.service import ConfigSync
from pairmq.configsync.store import ConfigStore, store_path

from .access_file import access_path, load_access
from .mqtt.wire import ReasonCode

log = logging.getLogger("pairmq.configuration")


class NodeConfiguration:
    def __init__(self, node, secret: bytes) -> None:
        self.node = node
        data_dir = node.spec.data_dir
        self.store = ConfigStore(store_path(data_dir))
        self.imported = self._import_access_file(access_path(data_dir))
        self._applied = self.store.document
        self.sync = ConfigSync(self.store, secret=secret, group=node.config.name, me=node.role,
                               epoch=node.current_epoch, is_active=node.may_serve,
                               active_address=self._active_config_sync_address,
                               active_name=self._active_management_address,
                               on_changed=self._changed, event=lambda kind, fields: node.events.write(kind, **fields))

    @property
    def document(self) -> ConfigDocument:
        return self.store.document

    async def start(self) -> None:
        await self.sync.start(self.node.spec.address, self.node.config.ports.config_sync)

    async def stop(self) -> None:
        await self.sync.stop()
        self.store.close()

    def limits(self):
        return self.document.effective_limits(self.node.config.limits)

    def auto_revert(self) -> bool:
        return self.document.effective_auto_revert(self.node.config.auto_revert)

    # --- internals ---

    def _import_access_file(self, path) -> bool:
        if self.store.head.version != 0:
            return False
        policy = load_access(path)  # a malformed file is a ConfigError sentence: the node does not start
        if policy is None:
            return False
        document = ConfigDocument(access=policy).to_json()
        self.store.apply({"kind": "document.replace", "document": document}, 0)
        log.info("%s: imported %s into the configuration store as version 1", self.node.role.value, path)
        return True

    def _active_role(self):
        node = self.node
        with node.heartbeats.lock:
            from .clock import now_ms

            active = node.core.active_role(now_ms())
        return None if active is None or active is node.role else active

    def _active_config_sync_address(self) -> tuple[str, int] | None:
        active = self._active_role()
        if active is None:
            return None
        return self.node.config.node(active).address, self.node.config.ports.config_sync

    def _active_management_address(self) -> str | None:
        active = self._active_role()
        if active is None:
            return None
        return f"{self.node.config.node(active).address}:{self.node.config.ports.management}"

    def _changed(self, what: str) -> None:
        """Make the store's document the one in force on this node."""
        node, before, doc = self.node, self._applied, self.store.document
        self._applied = doc
        log.info("%s: configuration version %d: %s", node.role.value, self.store.head.version, what)
        if node.authn is not None:
            node.authn.policy = doc.access
            node.authn.note = ""
        gone = set(before.access.users) - set(doc.access.users)
        anonymous_off = before.access.allow_anonymous and not doc.access.allow_anonymous

        def unwelcome(conn) -> bool:
            return conn.username in gone if conn.username is not None else anonymous_off

        for listener in (node.listener, node.tls_listener):
            if listener is None:
                continue
            if gone or anonymous_off:
                dropped = listener.drop_clients(ReasonCode.NOT_AUTHORIZED, only=unwelcome)
                if dropped:
                    node.events.write("clients_dropped_by_config", count=dropped, users=sorted(gone),
                                      anonymous=anonymous_off)
            if doc.overload != before.overload:
                listener.set_overload(doc.effective_overload())
        if gone and node.broker is not None and node.may_serve():
            from .broker.service import wall_ms

            node.broker.execute(node.broker.core.remove_users(gone, wall_ms()))
        if node.broker is not None and doc.limits != before.limits:
            node.apply_limits(self.limits())
        if doc.auto_revert != before.auto_revert:
            with node.heartbeats.lock:
                node.core.auto_revert = self.auto_revert()

"""Config-sync on a routing node: the active's server on TCP 8302 and the standby's follower.

Rules:
- Changes are taken only while this node is active (`is_active()`); `apply` on a standby raises
  `NotActive` naming the active, which the management API turns into its refusal.
- A change is committed to our store first, takes effect at once (`on_changed`), and is shipped
  to the standby; `confirm` waits (bounded) until the standby acknowledged it, so the API can say
  whether it is on both nodes.
- The link is the mate link's secure channel (mutual challenge–response under the group secret,
  ephemeral X25519 keys, so a recorded session stays sealed even after the secret leaks; sealed
  frames) with config-sync's own keys (`purpose="config-sync"`): a mate-link peer cannot
  speak here, nor a stranger. Bad frames and broken rules are counted by reason and close the link.
- The active accepts a standby's link only while it is active; a newer link replaces an older one.
  The standby dials the active it knows of every `REDIAL_S`, says HELLO, and applies what it gets:
  changes through `ConfigStore.apply_entries` (whole or nothing), a snapshot through
  `ConfigStore.install`, reporting the changes of its own that the snapshot discards.
- Status (`view`): on the active, the standby's In-Sync / Syncing / Out-Of-Sync; on the standby,
  its own (In-Sync once it acknowledged the head the active announced in its last message).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable

from pairmq.appliance.clock import now_ms, wall_ms
from pairmq.appliance.errors import PairMQError, RemoteProtocolError
from pairmq.appliance.roles import Role
from pairmq.mate_link.secure import ActiveHandshake, StandbyHandshake
from pairmq.mate_link.transport import LinkCounters, MateConnection

from .changes import Entry, describe
from .document import ConfigChangeError
from .exchange import Ack, ActiveEnd, Changes, Message, Snapshot, StandbyEnd, SyncStatus, decode, encode
from .store import ConfigStore

log = logging.getLogger("pairmq.configsync")
PURPOSE = "config-sync"
TICK_S = 0.05
REDIAL_S = 0.1


class NotActive(PairMQError):
    """A change sent to a node that is not active."""

    def __init__(self, active: str | None) -> None:
        where = f"the active node is {active}" if active else "no node is active right now"
        super().__init__(f"configuration changes are taken only on the active node; {where}")
        self.active = active


class ConfigSync:
    def __init__(self, store: ConfigStore, *, secret: bytes, group: str, me: Role,
                 epoch: Callable[[], int], is_active: Callable[[], bool],
                 active_address: Callable[[], tuple[str, int] | None],
                 active_name: Callable[[], str | None],
                 on_changed: Callable[[str], None], event: Callable[[str, dict], None]) -> None:
        self.store = store
        self._secret, self._group, self._me = secret, group, me
        self._epoch, self._is_active = epoch, is_active
        self._active_address, self._active_name = active_address, active_name
        self._on_changed, self._event = on_changed, event
        self.counters = LinkCounters()
        self.conn: MateConnection | None = None  # the active's link to its standby
        self.end: ActiveEnd | None = None
        self._server: asyncio.Server | None = None
        self._task: asyncio.Task | None = None
        self._stopping = False  # the follower checks it too: a cancel can be lost in 3.11's wait_for
        self._follow_conn: MateConnection | None = None
        self._standby_end: StandbyEnd | None = None
        self._standby_status = SyncStatus.OUT_OF_SYNC
        self._acked = asyncio.Condition()
        self.snapshots_installed = 0
        self.discarded: list[dict] = []  # our own changes a snapshot discarded, newest last (bounded)

    @property
    def follow_conn(self) -> MateConnection | None:
        """The connection this node follows its mate's configuration on, while it stands by."""
        return self._follow_conn

    # --- lifecycle ---

    async def start(self, address: str, port: int) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(self._new_connection, address, port, reuse_address=True)
        self._task = loop.create_task(self._run())

    async def stop(self) -> None:
        self._stopping = True
        if self._task:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        for conn in (self.conn, self._follow_conn):
            if conn is not None:
                conn.close("node stopping")
        if self._server is not None:
            self._server.close()

    # --- changes (the management API, on the active) ---

    def apply(self, change: dict) -> Entry:
        if not self._is_active():
            raise NotActive(self._active_name())
        entry = self.store.apply(change, wall_ms())
        self._event("config_change", {"version": entry.version, "kind": change["kind"], "what": describe(change),
                                      "digest": self.store.head.digest})
        self._on_changed(describe(change))
        if self.end is not None and self.conn is not None and not self.conn.closed:
            self.end.committed(entry)
            self.conn.send(self.end.messages_to_send())
        return entry

    async def confirm(self, version: int, timeout_s: float = 1.0) -> bool:
        """True once the standby acknowledged `version`; False when it did not within the timeout."""
        async def acked() -> None:
            async with self._acked:
                await self._acked.wait_for(lambda: self._standby_acked() >= version)
        try:
            await asyncio.wait_for(acked(), timeout_s)
            return True
        except TimeoutError:
            return False

    def _standby_acked(self) -> int:
        if self.end is None or self.conn is None or self.conn.closed or self.end.acked is None:
            return -1
        return self.end.acked.version

    # --- status ---

    def mate_joined(self) -> bool:
        """On the active: the standby's config-sync link is up and it caught up when it joined (it may stand by)."""
        return self.end is not None and self.conn is not None and not self.conn.closed and self.end.joined()

    def status(self) -> SyncStatus:
        if self._is_active():
            if self.end is None or self.conn is None or self.conn.closed:
                return SyncStatus.OUT_OF_SYNC
            return self.end.status()
        return self._standby_status

    def view(self) -> dict:
        head = self.store.head
        out = {"status": self.status().value, "version": head.version, "digest": head.digest,
               "refusals": dict(self.counters), "snapshots_installed": self.snapshots_installed,
               "discarded_changes": self.discarded[-20:]}
        if self._is_active() and self.end is not None and self.end.acked is not None:
            out["mate"] = {"version": self.end.acked.version, "digest": self.end.acked.digest,
                           "last_join": self.end.plan}
        return out

    # --- the active's side ---

    def _new_connection(self) -> MateConnection:
        handshake = ActiveHandshake(self._secret, self._group, self._me, os.urandom(32), PURPOSE)
        return MateConnection(handshake, counters=self.counters, on_established=self._established,
                              on_message=self._active_message, on_closed=lambda c, why: self._wake(),
                              codec=(encode, decode))

    def _established(self, conn: MateConnection) -> None:
        if not self._is_active():
            conn.close("this node is not active")
            return
        if self.conn is not None:
            self.conn.close("replaced by a newer link from the standby")
        self.conn, self.end = conn, ActiveEnd(self._epoch(), self.store, now_ms())
        log.info("config-sync link up with %s", conn.peer)

    def _active_message(self, conn: MateConnection, message: Message) -> None:
        if conn is not self.conn:
            return
        self.end.receive(message, now_ms())  # a ConfigLinkFault closes the link (counted)
        conn.send(self.end.messages_to_send())
        if isinstance(message, Ack):
            self._wake()

    def _wake(self) -> None:
        async def notify() -> None:
            async with self._acked:
                self._acked.notify_all()
        asyncio.get_running_loop().create_task(notify())

    # --- the loop: tick the active's link, or follow the active ---

    async def _run(self) -> None:
        follower: asyncio.Task | None = None
        try:
            while True:
                now = now_ms()
                if self._is_active():
                    if follower is not None:
                        await _ended(follower)
                        follower = None
                    if self.conn is not None and not self.conn.closed:
                        if self.end.expired(now):
                            self.conn.close("the standby went silent")
                        else:
                            self.end.handle_timer(now)
                            self.conn.send(self.end.messages_to_send())
                else:
                    if self.conn is not None:
                        self.conn.close("this node is no longer active")
                        self.conn = self.end = None
                    if follower is None or follower.done():
                        follower = asyncio.get_running_loop().create_task(self._follow())
                await asyncio.sleep(TICK_S)
        finally:  # stopping: the follower goes with us (left behind, it kept the process from exiting)
            if follower is not None:
                self._stopping = True
                if self._follow_conn is not None:
                    self._follow_conn.close("node stopping")
                await _ended(follower)

    async def _follow(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._is_active() and not self._stopping:
            address = self._active_address()
            if address is not None:
                with contextlib.suppress(OSError, TimeoutError):
                    await self._one_link(loop, address)
            self._standby_status = SyncStatus.OUT_OF_SYNC
            await asyncio.sleep(REDIAL_S)

    async def _one_link(self, loop: asyncio.AbstractEventLoop, address: tuple[str, int]) -> None:
        closed, established = asyncio.Event(), asyncio.Event()
        handshake = StandbyHandshake(self._secret, self._group, self._me, os.urandom(32), PURPOSE)
        conn = MateConnection(handshake, counters=self.counters, on_established=lambda c: established.set(),
                              on_message=self._standby_message, on_closed=lambda c, why: closed.set(),
                              codec=(encode, decode))
        await asyncio.wait_for(loop.create_connection(lambda: conn, *address), 2.0)
        try:
            await asyncio.wait_for(established.wait(), 5.0)
            self._follow_conn = conn
            self._standby_end = StandbyEnd(self._epoch(), now_ms())
            self._standby_status = SyncStatus.SYNCING
            self._standby_end.hello(self.store.head, self.store.recent_chains(64))
            conn.send(self._standby_end.messages_to_send())
            while not closed.is_set() and not self._stopping:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(closed.wait(), TICK_S * 5)
                if self._standby_end.expired(now_ms()) or self._is_active():
                    conn.close("the active went silent" if not self._is_active() else "we are active now")
        finally:
            conn.close("link ended")
            self._follow_conn = None

    def _standby_message(self, conn: MateConnection, message: Message) -> None:
        if conn is not self._follow_conn:
            return
        for effect in self._standby_end.receive(message, now_ms()):
            try:
                if isinstance(effect, Snapshot):
                    self._install(effect)
                elif isinstance(effect, Changes):
                    self.store.apply_entries(effect.entries)
                    self._on_changed(f"{len(effect.entries)} change(s) from the active, now version "
                                     f"{self.store.head.version}")
            except ConfigChangeError as exc:
                self.counters["bad_change"] += 1
                raise RemoteProtocolError(f"refused what the active sent: {exc}") from None
            self._standby_end.ack(self.store.head)
            self._standby_status = SyncStatus.IN_SYNC
        conn.send(self._standby_end.messages_to_send())

    def _install(self, snapshot: Snapshot) -> None:
        ours = self.store.changes_after(max(snapshot.common, 0)) or []
        for entry in ours:
            self.discarded.append({"version": entry.version, "what": describe(entry.change)})
            self._event("config_change_discarded", {"version": entry.version, "what": describe(entry.change),
                                                    "reason": snapshot.reason})
            log.warning("config-sync: discarding our change %d (%s): %s", entry.version, describe(entry.change),
                        snapshot.reason)
        del self.discarded[:-100]
        self.store.install(snapshot.version, snapshot.chain, snapshot.document)
        self.snapshots_installed += 1
        self._event("config_snapshot_installed", {"version": snapshot.version, "reason": snapshot.reason,
                                                  "discarded": len(ours)})
        self._on_changed(f"snapshot from the active at version {snapshot.version} ({snapshot.reason})")


async def _ended(task: asyncio.Task) -> None:
    """Cancel `task` and wait for its end."""
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)

"""What a monitor process runs: the quorum core on its heartbeat thread, its decisions, the management
API and readiness. A routing node (appliance/node/routing.py) is this plus a broker.

Start-up is an explicit sequence: load the group file and secret, open the stable store (bumping the
boot incarnation), start the heartbeat thread (it binds the heartbeat socket), the parts a subclass
adds, and the management API, then run until SIGTERM/SIGINT; shutdown runs the same list backwards.

Two threads:
- the heartbeat thread (appliance/node/heartbeats.py) runs the quorum core's I/O and timer, so a
  stalled event loop cannot cost an active its lease;
- the main thread runs the asyncio loop: management API (and a routing node's broker), and a
  liveness stamp every ALIVE_STAMP_S that the core's rule R6 reads.
Every call into the core goes through `self.quorum` (appliance/node/quorum_handle.py). Everything the
node decides is logged as a decision sentence and written to its event log.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal

from pairmq.appliance.config import GroupConfig, load_keyring
from pairmq.appliance.api.app import ManagementServer
from pairmq.appliance.api.decisions import DecisionFeed
from pairmq.appliance.api.ports import ApiPorts, RoutingPorts
from pairmq.appliance.api.secret_rotation import KeyringInstaller
from pairmq.appliance.errors import LocalProtocolError, PairMQError
from pairmq.appliance.eventlog import EventLog
from pairmq.appliance.keyring import STATE_FILE, CurrentKeyring, startup_keyring
from pairmq.appliance.node import readiness, sd_notify, views
from pairmq.appliance.hooks_settings import HookEvent
from pairmq.appliance.instruments import NodeInstruments
from pairmq.appliance.node.heartbeats import HeartbeatThread
from pairmq.appliance.node.hooks import WATCH_S, HookRunner, RedundancyWatch, decision_event, redundancy_sentence
from pairmq.appliance.clock import now_ms
from pairmq.appliance.node.quorum_handle import QuorumHandle
from pairmq.appliance.private_files import private_dir
from pairmq.appliance.quorum.auth import HeartbeatAuth
from pairmq.appliance.quorum.core import QuorumCore, Timing
from pairmq.appliance.quorum.decisions import DecisionKind
from pairmq.appliance.roles import Role
from pairmq.appliance.stable_file import FileStore

log = logging.getLogger("pairmq.node")

ALIVE_STAMP_S = 0.1  # the event loop's liveness stamp; R6's bound (timers.broker_stall_ms) is ~50 of these
QUIET_KINDS = frozenset({DecisionKind.BOOT, DecisionKind.BID, DecisionKind.BID_END, DecisionKind.REFUSE,
                         DecisionKind.SYNC})  # logged at INFO; every other decision at WARNING


class MonitorNode:
    """Wires one QuorumCore to its sockets, its event log and the management API."""

    def __init__(self, config: GroupConfig, role: Role) -> None:
        self.config = config
        self.role = role
        self.spec = config.node(role)
        private_dir(self.spec.data_dir)  # appliance/private_files.py: whatever made it, only we read it
        # The persisted keyring wins over the secret file unless the file is newer (appliance/keyring.py).
        self.keyring_path = self.spec.data_dir / STATE_FILE
        self.keys = CurrentKeyring(startup_keyring(load_keyring(config), self.keyring_path))
        self.events = EventLog(self.spec.data_dir / "events", role.value, config.events)
        self.instruments = NodeInstruments()  # /metrics' histograms and process collectors, this node's own
        # Activity hooks: queued after each decision is applied, run on the loop, never awaited by a decision.
        self.hooks = HookRunner(config.hooks, group=config.name, role=role.value, events=self.events.write)
        self._redundancy = RedundancyWatch()
        self.store = FileStore(self.spec.data_dir / "quorum.json")
        self.core = QuorumCore(role, HeartbeatAuth(self.keys.keys, config.name, role, send_key_id=self.keys.send_id),
                               Timing.from_timers(config.timers), self.store, now_ms())
        self.core.auto_revert = config.auto_revert
        self.decisions = DecisionFeed(role.value, self.core.state.incarnation)  # GET /api/v1/decisions/stream
        self.started_at = now_ms()
        self.heartbeats = HeartbeatThread(
            self.core, (self.spec.address, config.ports.heartbeat),
            [(config.node(r).address, config.ports.heartbeat) for r in role.peers()],
            on_decision=self._act_on, on_ready=lambda: self._post(self._quorum_ready), on_lag=self._on_lag,
            on_crash=self._on_heartbeat_crash, before_send=self._before_heartbeats_leave,
            on_position_echoed=lambda: self._post(self._position_echoed))
        self.quorum = QuorumHandle(self.core, self.heartbeats.lock, self.heartbeats.wake)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = asyncio.Event()
        self._failure: str | None = None
        self._ready = {"quorum": False, "sockets": False}  # then READY=1 once joined (appliance/node/readiness.py)
        self._joining: asyncio.Task | None = None
        self._add_parts()
        self.management = ManagementServer(self._api_ports())

    def _add_parts(self) -> None:
        """What a subclass adds before the management API is built (a routing node: its broker and links)."""

    def _api_ports(self) -> ApiPorts:
        """What the management API is given of this node (appliance/api/ports.py)."""
        def quorum(fn):
            return self.quorum.call(lambda core, now: fn(core))

        installer = KeyringInstaller(self.role, self.keys, self.keyring_path, quorum, self.events, self._keyed_links)
        return ApiPorts(role=self.role, config=self.config, keys=self.keys, decisions=self.decisions,
                        events=self.events, now_ms=now_ms, quorum=quorum, may_serve=self.may_serve,
                        redundancy_view=self.redundancy_view, force_activity=self.force_activity,
                        handover=self.handover, install_keyring=installer.install, routing=self._routing_ports(),
                        instruments=self.instruments)

    def _routing_ports(self) -> RoutingPorts | None:
        """A routing node's broker reads and configuration entry points; a monitor has none."""
        return None

    def _keyed_links(self) -> list:
        """The connections a secret rotation step rekeys (a routing node's mate link and config-sync)."""
        return []

    # --- what the management API and the MQTT gate ask ---------------------------------

    def may_serve(self) -> bool:
        return self.quorum.call(lambda core, now: core.may_serve(now))

    def active_server_reference(self) -> str | None:
        active = self.quorum.call(lambda core, now: core.active_role(now))
        if active is None or active is self.role:
            return None
        return self.config.mqtt_reference(active)

    def current_epoch(self) -> int:
        return self.quorum.call(lambda core, now: core.active_epoch or core.state.epoch)

    async def handover(self, why: str, *, force: bool = False, revert: bool = False):
        """release-activity / revert-activity (management API). Raises LocalProtocolError when refused."""
        raise LocalProtocolError("the monitor never holds activity")

    def force_activity(self, acknowledge_data_loss: bool) -> None:
        self.quorum.call(lambda core, now: core.request_force(now, acknowledge_data_loss=acknowledge_data_loss))
        self.quorum.wake()  # its thread sends the bid and writes the decision

    # --- running -------------------------------------------------------------------

    async def run(self) -> None:
        loop = self._loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, self._on_sigterm)
        loop.add_signal_handler(signal.SIGINT, self._stopping.set)
        loop.add_signal_handler(signal.SIGHUP, self._on_sighup)  # `systemctl reload`; never fatal
        stamp = asyncio.create_task(self._stamp_alive())
        pings = asyncio.create_task(readiness.watchdog_pings())  # from the start: a spool load is loop work too
        try:
            await self._before_heartbeats()
            self.heartbeats.start()
            await self._start_parts()
            await self.management.start()
        except BaseException:
            stamp.cancel()
            pings.cancel()
            await self._shutdown()
            raise
        log.info("%s: listening on %s (heartbeats :%d on their own thread, management :%d)", self.role.value,
                 self.spec.address, self.config.ports.heartbeat, self.config.ports.management)
        self._mark_ready("sockets")
        watchdog = asyncio.create_task(self._watchdog())
        redundancy = asyncio.create_task(self._watch_redundancy()) if self.hooks.enabled else None
        try:
            await self._stopping.wait()
        finally:
            watchdog.cancel()
            if redundancy is not None:
                redundancy.cancel()
            stamp.cancel()
            pings.cancel()
            if self._joining is not None:
                self._joining.cancel()
            await self._shutdown()
        if self._failure:
            raise PairMQError(self._failure)

    async def _before_heartbeats(self) -> None:
        """What must happen before the first heartbeat leaves (a routing node: its virtual IP)."""

    async def _start_parts(self) -> None:
        """Between the heartbeat thread and the management API (a routing node: broker, links, listeners)."""

    async def _stop_front(self) -> None:
        """First at shutdown: whatever serves clients."""

    async def _stop_back(self) -> None:
        """After the management API: what the parts started, before the heartbeat thread stops."""

    async def _shutdown(self) -> None:
        sd_notify.notify("STOPPING=1")
        await self._stop_front()
        with contextlib.suppress(Exception):
            await self.management.stop()
        await self._stop_back()
        await self.hooks.close()  # a fault hook about what stops the node still runs (bounded: node/hooks.py)
        self.heartbeats.stop()
        self.events.write("node_stopped", role=self.role.value)
        self.events.close()

    def stop(self) -> None:
        self._stopping.set()

    def _on_sigterm(self) -> None:
        sd_notify.notify("STOPPING=1")  # now: systemctl shows "deactivating" at once
        self._stopping.set()

    def _on_sighup(self) -> None:
        log.info("%s: SIGHUP: nothing to reload; users, ACLs, limits and overload settings are changed with "
                 "`pairmq config ...` on the active node and config-synced", self.role.value)

    async def _stamp_alive(self) -> None:
        """R6's input: proof that this loop still runs. Heartbeats no longer do, they have their own thread."""
        while True:
            self.heartbeats.broker_alive_at = now_ms()
            await asyncio.sleep(ALIVE_STAMP_S)

    async def _watchdog(self) -> None:
        """Once a second, from the event loop: write the node_alive pulse and log rejected heartbeats as one
        summed event (a flood costs one line a second)."""
        logged = self.quorum.call(lambda core, now: dict(core.auth.rejected))
        while True:
            self._each_second()
            # The analytics job's pulse: the last one a killed node wrote bounds when it stopped serving.
            self.events.write("node_alive", serving=self._serves(), epoch=self.current_epoch())
            self._log_denials()
            rejected = self.quorum.call(lambda core, now: dict(core.auth.rejected))
            delta = {reason: rejected[reason] - logged.get(reason, 0) for reason in rejected}
            if any(delta.values()):
                self.events.write("heartbeats_rejected", **{k: v for k, v in delta.items() if v})
                log.info("%s: rejected heartbeats in the last second: %s", self.role.value,
                         ", ".join(f"{v} {k}" for k, v in delta.items() if v))
                logged = rejected
            await asyncio.sleep(1.0)

    def _each_second(self) -> None:
        """Before the pulse (a routing node flushes its message-event counts)."""

    def _serves(self) -> bool:
        return False

    def _log_denials(self) -> None:
        """After the pulse (a routing node logs what its ACL and TLS refused)."""

    # --- what the heartbeat thread hands over ----------------------------------------

    def _post(self, callback) -> None:
        """Run `callback` on the event loop (from the heartbeat thread)."""
        if self._loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is already closed: shutting down
                self._loop.call_soon_threadsafe(callback)

    def _act_on(self, decision) -> None:
        """On the heartbeat thread: log, publish and record the decision; a subclass follows it."""
        level = logging.INFO if decision.kind in QUIET_KINDS else logging.WARNING
        log.log(level, "%s", decision.reason)
        self.decisions.publish(decision, now_ms())
        self.events.write("redundancy_decision", kind=decision.kind, epoch=decision.epoch, reason=decision.reason,
                          core_ms=decision.at_ms)
        self._follow(decision)
        if decision.kind in (DecisionKind.ACTIVATE, DecisionKind.STEP_DOWN):
            sd_notify.notify(f"STATUS={decision.reason}")
        if decision.kind is DecisionKind.BID:
            self._observe_detection()
        if self.hooks.enabled:  # after the decision is applied; the hook only queues (appliance/node/hooks.py)
            failed = decision.kind is DecisionKind.STORAGE and self.quorum.call(
                lambda core, now: core.save_error is not None)
            event = decision_event(decision.kind, routes_messages=self.role.routes_messages, storage_failed=failed)
            if event is not None:
                self._post(lambda: self.hooks.notify(event, decision.epoch, decision.reason))

    def _observe_detection(self) -> None:
        """A standby's bid after the active it saw went silent: how long that silence lasted (a histogram)."""
        if self.role.routes_messages:
            silent_ms = self.quorum.call(lambda core, now: views.failover_silence_ms(core, self.role, now))
            if silent_ms is not None:
                self.instruments.failover_detection.observe(silent_ms / 1000)

    async def _watch_redundancy(self) -> None:
        """The redundancy hooks: Up/Down is derived from what the core sees, so it is sampled, not decided."""
        while True:
            up, epoch, reason = self.quorum.call(lambda core, now: redundancy_sentence(core, self.role, now))
            event = self._redundancy.change(up)
            if event is not None:
                self.hooks.notify(event, epoch, reason)
            await asyncio.sleep(WATCH_S)

    def _follow(self, decision) -> None:
        """What a decision does beyond the record (a routing node: clients, virtual IP, broker core)."""

    def _before_heartbeats_leave(self, decisions) -> None:
        """On the heartbeat thread, before a step-down's heartbeat leaves (a routing node: its virtual IP)."""

    def _position_echoed(self) -> None:
        """On the loop: a peer echoed the position we advertised alone (a routing node: release up to it)."""

    def _quorum_ready(self) -> None:
        self._mark_ready("quorum")

    def _mark_ready(self, part: str) -> None:
        """Once the sockets are open and the quorum has settled (seen a peer or waited out boot): join."""
        self._ready[part] = True
        if all(self._ready.values()) and self._joining is None:
            self._joining = self._loop.create_task(
                readiness.announce_ready(self.quorum, self.role, self._standby_linked))

    def _standby_linked(self) -> bool | None:
        """Whether this node's standby mate link has made a session; None: not a routing node."""
        return None

    def _on_lag(self, max_ms: int, timer_late_ms: int) -> None:
        """On the heartbeat thread, when the event loop's stamps resume after a gap."""
        level = logging.WARNING if max_ms > self.config.timers.lease_ms else logging.INFO
        log.log(level, "%s: the broker event loop stalled up to %d ms; heartbeat timer at most %d ms late",
                self.role.value, max_ms, timer_late_ms)
        self.events.write("broker_loop_lag", max_ms=max_ms, max_timer_late_ms=timer_late_ms)

    def _fail(self, sentence: str) -> None:
        """Stop the node with `sentence` as its exit error (from any thread); the fault hook is queued first."""
        self._failure = sentence
        if self.hooks.enabled:
            epoch = self.core.state.epoch  # read without the lock: a failing heartbeat thread may be the caller
            self._post(lambda: self.hooks.notify(HookEvent.FAULT, epoch, sentence))
        self._post(self._stopping.set)

    def _on_heartbeat_crash(self, exc: BaseException) -> None:
        self.events.write("heartbeat_thread_failed", error=repr(exc))
        self._fail(f"the {self.role.value} node's heartbeat thread failed: {exc!r} (traceback in the log)")

    # --- views --------------------------------------------------------------------

    def activity_label(self, now: int) -> str:
        return "Monitor"

    def redundancy_view(self) -> dict:
        return self.quorum.call(self._redundancy_view)

    def _redundancy_view(self, core: QuorumCore, now: int) -> dict:
        return views.redundancy_view(
            core, now, group=self.config.name, role=self.role, address=self.spec.address,
            activity=self.activity_label(now), started_at=self.started_at, store_view=self.store.view(),
            events_view=self.events.view(), keyring=self.keys.keyring, heartbeats=self.heartbeats)

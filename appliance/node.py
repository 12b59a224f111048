"""One PairMQ node process: the quorum core's thread, the broker's event loop, and the gate between them.

Start-up is an explicit sequence: load the group file and secret, open the
stable store (bumping the boot incarnation), start the heartbeat thread (it
binds the heartbeat socket), the MQTT listener and the management API, then
run until SIGTERM/SIGINT; shutdown runs the same list backwards. SIGTERM on
the active hands activity over first when the mate is in sync (bounded by the
handover's own 2 s drain bound), so `systemctl stop` is a planned handover.

Two threads:
- the heartbeat thread (appliance/heartbeats.py) runs the quorum core's I/O
  and timer, so a broker loop stalled by a connection storm cannot cost the
  active its lease;
- the main thread runs the asyncio loop: MQTT listener, broker, management
  API, and a liveness stamp every ALIVE_STAMP_S that the core's rule R6 reads.
Every call into the core holds `self.heartbeats.lock`. A step-down reaches the
broker by `call_soon_threadsafe` (clients dropped); safety does not wait for
it, because the MQTT gate asks the core's time-based lease on every packet.
Everything the node does is logged as a decision sentence and written to its
event log.

With a [vip] table, a routing node holds the virtual IP while it is active
(appliance/vip.py): removed first at start-up (a node killed -9 left it), added
on "activate", removed on "step_down" before the step-down's heartbeat leaves,
and first thing at shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import secrets
import signal
import time

from . import readiness, sd_notify
from .api.app import ManagementServer
from .api.decisions import DecisionFeed
from .api.ports import ApiPorts, RoutingPorts
from .api.secret_rotation import KeyringInstaller
from .config import GroupConfig, load_keyring
from .errors import LocalProtocolError, PairMQError
from .eventlog import EventLog
from .heartbeats import HeartbeatThread
from .private_files import private_dir
from .keyring import STATE_FILE, CurrentKeyring, startup_keyring
from .planned_handover import HandoverRunner
from .quorum.auth import HeartbeatAuth
from .quorum.core import QuorumCore, Timing
from .quorum.wire import Activity
from .roles import Role
from .stable_file import FileStore

log = logging.getLogger("pairmq.node")

MQTT_REASON_USE_ANOTHER_SERVER = 0x9C
MQTT_REASON_SERVER_SHUTTING_DOWN = 0x8B
ALIVE_STAMP_S = 0.1  # the broker loop's liveness stamp; R6's bound (timers.broker_stall_ms) is ~50 of these

# The heartbeat thread needs the GIL, and a full (generation 2) garbage collection holds it throughout:
# ~0.7 us per tracked object, ~300 ms with 10,000 clients connected. A connection storm grows the heap in
# 25% steps, and with CPython's default thresholds (700, 10, 10) each step ran one, back to back: the
# heartbeat timer ran up to 350 ms late and 2 of 10 storms still cost the lease. Allowing a full collection
# only after 1,000 younger ones (instead of 10) keeps them out of a storm: 0 of 27 storms, timer at most
# 215 ms late (docs/benchmarks.md, "Storm vs. lease"). Cyclic garbage old enough to reach generation 2
# waits longer to be freed; reference counting frees everything else as before.
GC_THRESHOLDS = (700, 10, 1000)
# sys.getswitchinterval() stays at its 5 ms: 1 ms halved the heartbeat timer's worst lateness in storms
# (82 vs 195 ms, both far inside the 500 ms lease) but cost about a third of QoS 1 throughput. Only a standby
# catching up on the mate link runs at a shorter one meanwhile (mate_link/service.py _catching_up).


def now_ms() -> int:
    return time.monotonic_ns() // 1_000_000


class Node:
    """Wires one QuorumCore to its sockets. Also the MQTT listener's activity gate."""

    def __init__(self, config: GroupConfig, role: Role) -> None:
        self.config = config
        self.role = role
        self.spec = config.node(role)
        private_dir(self.spec.data_dir)  # appliance/private_files.py: whatever made it, only we read it
        # The persisted keyring wins over the secret file unless the file is newer (appliance/keyring.py).
        self.keyring_path = self.spec.data_dir / STATE_FILE
        secret = self.keys = CurrentKeyring(startup_keyring(load_keyring(config), self.keyring_path))
        self.events = EventLog(self.spec.data_dir / "events", role.value, config.events)
        self.vip = None
        if config.vip is not None and role.routes_messages:
            from .vip import VipHolder

            self.vip = VipHolder(config.vip, config.vip.interfaces[role],
                                 on_event=lambda kind, fields: self.events.write(kind, **fields))
        self.store = FileStore(self.spec.data_dir / "quorum.json")
        self.core = QuorumCore(role, HeartbeatAuth(secret.keys, config.name, role, send_key_id=secret.send_id),
                               Timing.from_timers(config.timers),
                               self.store, now_ms())
        self.core.auto_revert = config.auto_revert
        self.decisions = DecisionFeed(role.value, self.core.state.incarnation)  # GET /api/v1/decisions/stream
        self.handovers = HandoverRunner(self)
        self.started_at = now_ms()
        self.listener = None
        self.tls_listener = None
        self.broker = None
        self.replication = None
        self.authn = None
        self.configuration = None
        if role.routes_messages:
            from .broker.authn import Authenticator
            from .configuration import NodeConfiguration

            # A corrupt configuration store or a malformed access file to import stops the node here with
            # one sentence: never guess a policy.
            self.configuration = NodeConfiguration(self, secret)
            self.core.auto_revert = self.configuration.auto_revert()  # config-sync's, else the group file's
            limits = self.configuration.limits()
            self.authn = Authenticator(self.configuration.document.access,
                                       per_address_per_min=limits.login_checks_per_address_per_min,
                                       per_user_per_min=limits.login_checks_per_user_per_min,
                                       owner_refusal=lambda client_id, user: self.broker.core.owner_refusal(
                                           client_id, user))
            from .broker.core import BrokerCore, limits_from_config
            from .broker.service import BrokerService

            self._core_limits = limits_from_config(limits)

            def new_core() -> BrokerCore:
                return BrokerCore(node_name=role.value, limits=self._core_limits,
                                  id_source=lambda: "pairmq-" + secrets.token_hex(8),
                                  authorize=lambda user, action, topic: self.authn.policy.authorize(user, action, topic),
                                  may_receive=lambda user, topic: self.authn.policy.may_receive(user, topic))

            # A corrupt spool stops the node here with a SpoolCorruption sentence: never serve from it.
            self.broker = BrokerService(self.spec.data_dir / "spool", epoch=self.current_epoch,
                                        core_factory=new_core, spool_max_bytes=limits.spool_max_bytes)
            self.broker.serving = self.may_serve
            self.broker.on_spool_lost = self._on_spool_lost
            from .replication import Replication

            self.replication = Replication(self, secret)
            if config.events.message_events:
                from .broker.message_events import MessageEvents

                self.broker.message_events = MessageEvents(self.events, config.events.message_sample_ratio,
                                                           acked_seq=lambda: self.replication.active.acked_seq)
        self.heartbeats = HeartbeatThread(
            self.core, (self.spec.address, config.ports.heartbeat),
            [(config.node(r).address, config.ports.heartbeat) for r in role.peers()],
            on_decision=self._act_on, on_ready=lambda: self._post(self._quorum_ready), on_lag=self._on_lag,
            on_crash=self._on_heartbeat_crash, before_send=self._before_heartbeats_leave)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = asyncio.Event()
        self._failure: str | None = None
        self._ready = {"quorum": False, "sockets": False}  # then READY=1 once joined (appliance/readiness.py)
        self._joining: asyncio.Task | None = None
        self.management = ManagementServer(api_ports(self))

    # --- the activity gate (what the MQTT listener asks, from the broker loop) ------

    def may_serve(self) -> bool:
        """The lease, and (routing nodes) a broker core rebuilt for this epoch from the replicated spool."""
        with self.heartbeats.lock:
            serving, epoch = self.core.may_serve(now_ms()), self.core.active_epoch
        return serving and (self.replication is None or self.replication.ready(epoch))

    def active_server_reference(self) -> str | None:
        with self.heartbeats.lock:
            active = self.core.active_role(now_ms())
        if active is None or active is self.role:
            return None
        return self.config.mqtt_reference(active)

    def current_epoch(self) -> int:
        with self.heartbeats.lock:
            return self.core.active_epoch or self.core.state.epoch

    # --- running -------------------------------------------------------------------

    async def run(self) -> None:
        loop = self._loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, self._on_sigterm)
        loop.add_signal_handler(signal.SIGINT, self._stopping.set)
        loop.add_signal_handler(signal.SIGHUP, self._on_sighup)  # `systemctl reload`; never fatal, even on a monitor
        stamp = asyncio.create_task(self._stamp_alive())
        pings = asyncio.create_task(readiness.watchdog_pings())  # from the start: a spool load is loop work too
        try:
            if self.vip is not None:  # before anything else: a node killed -9 while active left it on the interface
                await asyncio.to_thread(self.vip.release, "left by an earlier run of this node (removed at start-up)")
                self.vip.start()
            self.heartbeats.start()
            if self.role.routes_messages:
                from .mqtt.budget import preauth_from_config
                from .mqtt.listener import MqttListener

                check = self._credential_check
                limits = self.configuration.limits()
                front = dict(preauth=preauth_from_config(limits), max_output_bytes=limits.mqtt_output_max_bytes)
                overload = self.configuration.document.effective_overload()
                vip = self.config.vip.address if self.config.vip else None  # the listeners accept there too
                self.listener = MqttListener(self.spec.address, self.config.ports.mqtt, self, overload=overload,
                                             on_event=self._mqtt_event, broker=self.broker, credential_check=check,
                                             virtual_ip=vip, **front)
                if self.config.tls is not None:
                    from .tls import server_context

                    self.tls_listener = MqttListener(self.spec.address, self.config.ports.mqtt_tls, self, overload=overload,
                                                     on_event=self._mqtt_event, broker=self.broker,
                                                     credential_check=check, ssl=server_context(self.config.tls),
                                                     virtual_ip=vip, **front)
                await self.broker.start()
                await self.replication.start()
                await self.configuration.start()
                await self.listener.start()
                if self.tls_listener is not None:
                    await self.tls_listener.start()
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
        try:
            await self._stopping.wait()
        finally:
            watchdog.cancel()
            stamp.cancel()
            pings.cancel()
            if self._joining is not None:
                self._joining.cancel()
            await self._shutdown()
        if self._failure:
            raise PairMQError(self._failure)

    async def _shutdown(self) -> None:
        sd_notify.notify("STOPPING=1")
        if self.vip is not None:  # first: a stopping node serves nobody
            await asyncio.to_thread(self.vip.stop, f"the {self.role.value} node is stopping")
        for listener in (self.listener, self.tls_listener):
            with contextlib.suppress(Exception):
                if listener:
                    listener.drop_clients(MQTT_REASON_SERVER_SHUTTING_DOWN)
                    await listener.stop()
        if self.authn is not None:
            self.authn.close()
        with contextlib.suppress(Exception):
            await self.management.stop()
        if self.replication is not None:
            with contextlib.suppress(Exception):
                await self.replication.stop()
        if self.configuration is not None:
            with contextlib.suppress(Exception):
                await self.configuration.stop()
        if self.broker is not None:
            with contextlib.suppress(Exception):
                await self.broker.stop()
        self.heartbeats.stop()
        self._flush_event_counts()
        self.events.write("node_stopped", role=self.role.value)
        self.events.close()

    def stop(self) -> None:
        self._stopping.set()

    def _on_sigterm(self) -> None:
        """Hand activity over first if we hold it and the mate is in sync; stop in any case."""
        sd_notify.notify("STOPPING=1")  # now, not after the handover: systemctl shows "deactivating" at once
        with self.heartbeats.lock:
            active = self.core.activity is Activity.ACTIVE and self.core.handover.draining is None
        if not active or self.replication is None:
            self._stopping.set()
            return
        log.info("%s: SIGTERM while active: handing activity over before stopping", self.role.value)
        self._loop.create_task(self._handover_then_stop())

    async def _handover_then_stop(self) -> None:
        try:
            outcome = await self.handovers.run_on_sigterm()
            log.warning("%s", outcome.sentence)  # the sentence names this node
        except LocalProtocolError as exc:
            log.warning("%s: SIGTERM: no handover (%s); stopping", self.role.value, exc)
        except Exception:
            log.exception("%s: SIGTERM: the handover failed; stopping", self.role.value)
        self._stopping.set()

    async def handover(self, why: str, *, force: bool = False, revert: bool = False):
        """release-activity / revert-activity (management API). Raises LocalProtocolError when refused."""
        if revert and self.role is Role.PRIMARY:
            with self.heartbeats.lock:
                serving = self.core.may_serve(now_ms())
            raise LocalProtocolError("the primary already holds activity; there is nothing to revert" if serving
                                     else "revert-activity runs on the active backup")
        return await self.handovers.run(why, force=force)

    async def _stamp_alive(self) -> None:
        """R6's input: proof that this loop still runs. Heartbeats no longer do, they have their own thread."""
        while True:
            self.heartbeats.broker_alive_at = now_ms()
            await asyncio.sleep(ALIVE_STAMP_S)

    async def _watchdog(self) -> None:
        """Once a second, from the event loop: flush event counts, write the node_alive pulse and
        log rejected heartbeats as one summed event (a flood costs one line a second)."""
        with self.heartbeats.lock:
            logged = dict(self.core.auth.rejected)
        denied_logged: dict = {}
        while True:
            self._flush_event_counts()
            # The analytics job's pulse: the last one a killed node wrote bounds when it stopped serving.
            self.events.write("node_alive", serving=self.role.routes_messages and self.may_serve(),
                              epoch=self.current_epoch())
            if self.authn is not None:
                denied_logged = self._log_denials(denied_logged)
            with self.heartbeats.lock:
                rejected = dict(self.core.auth.rejected)
            delta = {reason: rejected[reason] - logged.get(reason, 0) for reason in rejected}
            if any(delta.values()):
                self.events.write("heartbeats_rejected", **{k: v for k, v in delta.items() if v})
                log.info("%s: rejected heartbeats in the last second: %s", self.role.value,
                         ", ".join(f"{v} {k}" for k, v in delta.items() if v))
                logged = rejected
            await asyncio.sleep(1.0)

    def _flush_event_counts(self) -> None:
        if self.broker is not None and self.broker.message_events is not None:
            self.broker.message_events.flush_counts()

    # --- what the heartbeat thread hands over ----------------------------------------

    def force_activity(self, acknowledge_data_loss: bool) -> None:
        with self.heartbeats.lock:
            self.core.request_force(now_ms(), acknowledge_data_loss=acknowledge_data_loss)
        self.heartbeats.wake()  # its thread sends the bid and writes the decision

    def _post(self, callback) -> None:
        """Run `callback` on the broker loop (from the heartbeat thread)."""
        if self._loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is already closed: shutting down
                self._loop.call_soon_threadsafe(callback)

    def _act_on(self, decision) -> None:
        """On the heartbeat thread: the gate already follows the core; only the clients wait for the loop."""
        level = logging.INFO if decision.kind in ("refuse", "sync", "boot", "bid", "bid_end") else logging.WARNING
        log.log(level, "%s", decision.reason)
        self.decisions.publish(decision, now_ms())
        self.events.write("redundancy_decision", kind=decision.kind, epoch=decision.epoch, reason=decision.reason,
                          core_ms=decision.at_ms)
        if decision.kind == "step_down" and self.listener is not None:
            self._post(self._drop_clients_after_step_down)
        if decision.kind == "auto_revert":
            self._post(self._auto_revert)
        if decision.kind == "activate" and self.vip is not None:
            self.vip.hold(decision.reason)
        if decision.kind == "activate" and self.replication is not None:
            self._post(self.replication.poke)  # rebuild the broker core now, not at the next 50 ms sync
        if decision.kind in ("activate", "step_down"):
            sd_notify.notify(f"STATUS={decision.reason}")

    def _before_heartbeats_leave(self, decisions) -> None:
        """On the heartbeat thread, before a step-down's heartbeat (maybe a yield the mate acts on) leaves."""
        if self.vip is not None:
            for decision in decisions:
                if decision.kind == "step_down":
                    self.vip.release(decision.reason)

    def _auto_revert(self) -> None:
        async def revert() -> None:
            try:
                outcome = await self.handovers.run("auto-revert")
                log.warning("%s", outcome.sentence)  # the sentence names this node
            except LocalProtocolError as exc:  # the core asks again later (handover.REVERT_RETRY_MS)
                log.info("%s: auto-revert not now: %s", self.role.value, exc)

        self._loop.create_task(revert())

    def _quorum_ready(self) -> None:
        self._mark_ready("quorum")

    def _mark_ready(self, part: str) -> None:
        """Once the sockets are open and the quorum has settled (seen a peer or waited out boot): join."""
        self._ready[part] = True
        if all(self._ready.values()) and self._joining is None:
            self._joining = self._loop.create_task(readiness.announce_ready(self))

    def _drop_clients_after_step_down(self) -> None:
        reference = self.active_server_reference()
        with self.heartbeats.lock:
            yielded = self.core.handover.holds_yield(self.core.state.epoch)
        if reference is None and yielded:  # we handed over: the mate is the only node that can take activity
            reference = self.config.mqtt_reference(self.role.mate())
        for listener in (self.listener, self.tls_listener):
            if listener is not None:
                listener.drop_clients(MQTT_REASON_USE_ANOTHER_SERVER, reference)

    def _on_lag(self, max_ms: int, timer_late_ms: int) -> None:
        """On the heartbeat thread, when the broker loop's stamps resume after a gap."""
        level = logging.WARNING if max_ms > self.config.timers.lease_ms else logging.INFO
        log.log(level, "%s: the broker event loop stalled up to %d ms; heartbeat timer at most %d ms late",
                self.role.value, max_ms, timer_late_ms)
        self.events.write("broker_loop_lag", max_ms=max_ms, max_timer_late_ms=timer_late_ms)

    def _on_spool_lost(self, why: str) -> None:
        """In a mate-link worker thread: a full resync swapped files but the spool did not open again."""
        self._failure = f"the {self.role.value} node stops: {why}"
        self.events.write("spool_lost", error=why)
        self._post(self._stopping.set)

    def _on_heartbeat_crash(self, exc: BaseException) -> None:
        self._failure = f"the {self.role.value} node's heartbeat thread failed: {exc!r} (traceback in the log)"
        self.events.write("heartbeat_thread_failed", error=repr(exc))
        self._post(self._stopping.set)

    # --- access (users, passwords, ACLs) ----------------------------------------------

    async def _credential_check(self, connect, peer: str):
        return await self.authn.check(connect, peer)

    def _on_sighup(self) -> None:
        log.info("%s: SIGHUP: nothing to reload; users, ACLs, limits and overload settings are changed with "
                 "`pairmq config ...` on the active node and config-synced", self.role.value)

    def config_mate_joined(self) -> bool:
        return self.configuration is None or self.configuration.sync.mate_joined()

    def apply_limits(self, limits) -> None:
        """New limits from config-sync, on the broker core now and on every core rebuilt later."""
        from .broker.core import limits_from_config

        self._core_limits = limits_from_config(limits)
        self.broker.core.limits = self._core_limits
        self.broker.core.router.limits = self._core_limits
        self.authn.throttle.per_address_per_min = limits.login_checks_per_address_per_min
        self.authn.throttle.per_user_per_min = limits.login_checks_per_user_per_min
        from .mqtt.budget import preauth_from_config

        for listener in (self.listener, self.tls_listener):
            if listener is not None:
                listener.set_limits(preauth_from_config(limits), limits.mqtt_output_max_bytes)

    def _log_denials(self, logged: dict) -> dict:
        """Publishes and subscriptions the ACL refused, and failed TLS handshakes, in the last second: one summed
        event each (a flood of them costs a line a second, like rejected heartbeats)."""
        tls = self.tls_listener
        if tls is not None and tls.tls_handshake_failures > logged.get("tls", 0):
            count = tls.tls_handshake_failures - logged.get("tls", 0)
            self.events.write("tls_handshake_failed", count=count, last_reason=tls.last_tls_handshake_failure)
            log.info("%s: %d failed TLS handshakes on port %d in the last second (last: %s)", self.role.value, count,
                     self.config.ports.mqtt_tls, tls.last_tls_handshake_failure)
        counters = self.broker.core.counters
        now = {k: counters.get(k, 0) for k in ("publish_not_authorized", "subscribe_not_authorized")}
        delta = {k: v - logged.get(k, 0) for k, v in now.items() if v - logged.get(k, 0) > 0}
        if delta:
            self.events.write("access_denied", **delta)
            log.info("%s: the ACL refused in the last second: %s", self.role.value,
                     ", ".join(f"{v} {k}" for k, v in delta.items()))
        return {**now, "tls": tls.tls_handshake_failures if tls is not None else 0}

    def _mqtt_event(self, kind: str, fields: dict) -> None:
        if kind in ("client_accepted", "client_refused", "bad_packet", "connection_refused"):  # bad_packet: a rejected frame
            self.events.write(kind, epoch=self.current_epoch(), **fields)

    # --- views --------------------------------------------------------------------

    def activity_label(self, now: int) -> str:
        if self.role is Role.MONITOR:
            return "Monitor"
        if self.core.may_serve(now):
            return "Local Active"
        if self.core.active_role(now) is self.role.mate():
            return "Mate Active"
        return "Standby"

    def redundancy_view(self) -> dict:
        with self.heartbeats.lock:
            return self._redundancy_view(now_ms())

    def _redundancy_view(self, now: int) -> dict:
        core = self.core
        active = core.active_role(now)
        peers = []
        for role, peer in core.peers.items():
            hb = peer.hb
            peers.append({
                "role": role.value,
                "seen": core.sees(role, now),
                "heard_ms_ago": None if peer.heard_at is None else now - peer.heard_at,
                "activity": None if hb is None else hb.activity.name.lower(),
                "epoch": None if hb is None else hb.epoch,
            })
        decisions = [_decision_json(d, now) for d in core.history]
        return {
            "schema": 1,
            "group": self.config.name,
            "role": self.role.value,
            "address": self.spec.address,
            "activity": self.activity_label(now),
            # What the MQTT gate answers: the lease, and a broker core rebuilt for this epoch (replication.py).
            "serving": core.may_serve(now) and (self.replication is None or self.replication.ready(core.active_epoch)),
            "epoch": core.state.epoch,
            "active_role": active.value if active else None,
            "redundancy_status": core.redundancy_status(now).value,
            "in_sync": None if self.role is Role.MONITOR else (core.activity is Activity.ACTIVE or core.in_sync(now)),
            # A standby's latest catch-up on the mate link (mate_link/standby.py ResyncProgress.view), else None.
            "resync": None if self.replication is None or self.replication.standby is None
            else self.replication.standby.progress(now),
            "mate_link_refusals": None if self.replication is None else self.replication.refusals(),
            "incarnation": core.state.incarnation,
            # R8 (appliance/quorum/core.py): a quorum state that cannot be saved is not acted on; say so here.
            "quorum_state": {**self.store.view(), "save_error": core.save_error},
            "uptime_ms": now - self.started_at,
            "lease_remaining_ms": max(0, core.lease_expiry - now) if core.may_serve(now) else 0,
            "peers": peers,
            "last_decision": decisions[-1] if decisions else None,
            "decisions": decisions,
            "event_log": self.events.view(),
            "vip": None if self.vip is None else self.vip.view(),
            "accepted_heartbeats": core.auth.accepted,
            "rejected_heartbeats": dict(core.auth.rejected),
            "keyring": {**self.keys.keyring.view(), "fingerprints": self.keys.keyring.fingerprints()},  # never a secret
            "heartbeat_thread": {"broker_loop_age_ms": now - self.heartbeats.broker_alive_at,
                                 "broker_stall_ms": core.timing.broker_stall_ms,
                                 "max_timer_late_ms": self.heartbeats.max_timer_late_ms,
                                 "send_errors": self.heartbeats.send_errors},
            "mqtt": None if self.listener is None else {
                "address": self.config.mqtt_reference(self.role), **self.listener.stats(),
                "clients": self.listener.client_count + (self.tls_listener.client_count if self.tls_listener else 0),
                "tls_address": (f"{self.spec.address}:{self.config.ports.mqtt_tls}" if self.tls_listener else None),
                "tls_handshake_failures": self.tls_listener.tls_handshake_failures if self.tls_listener else 0,
                "access": self.authn.view(),
                "refused": {k: v for k, v in self.broker.core.counters.items() if k.endswith("not_authorized")}},
        }


def _decision_json(d, now: int) -> dict:
    return {"kind": d.kind, "epoch": d.epoch, "reason": d.reason, "ms_ago": now - d.at_ms}


def api_ports(node: Node) -> ApiPorts:
    """The management API's narrow handles on this node (appliance/api/ports.py); the API never holds the node."""

    def quorum(fn):
        with node.heartbeats.lock:
            return fn(node.core)

    def keyed_links() -> list:
        links = []
        if node.replication is not None:
            standby = node.replication.standby
            links += [("mate link", node.replication.active.conn),
                      ("mate link", standby.conn if standby is not None else None)]
        if node.configuration is not None:
            links += [("config-sync", node.configuration.sync.conn),
                      ("config-sync", node.configuration.sync._follow_conn)]
        return links

    def listeners() -> list:
        return [(x, tls) for x, tls in ((node.listener, False), (node.tls_listener, True)) if x is not None]

    def mate_link() -> tuple:
        active, standby = node.replication.active, node.replication.standby
        link = active.link if active.conn is not None and not active.conn.closed else None
        return link is not None or (standby is not None and standby.link is not None), link

    routing = None if node.broker is None else RoutingPorts(
        spool_view=node.broker.view, sessions=lambda: node.broker.core.sessions, listeners=listeners,
        mate_link=mate_link, configuration=node.configuration)
    installer = KeyringInstaller(node.role, node.keys, node.keyring_path, quorum, node.events, keyed_links)
    return ApiPorts(role=node.role, config=node.config, keys=node.keys, decisions=node.decisions, events=node.events,
                    now_ms=now_ms, quorum=quorum, may_serve=node.may_serve, redundancy_view=node.redundancy_view,
                    force_activity=node.force_activity, handover=node.handover, install_keyring=installer.install,
                    routing=routing)


def run_node(config: GroupConfig, role: Role) -> None:
    """Run one node in the foreground until SIGTERM (what systemd runs)."""
    gc.set_threshold(*GC_THRESHOLDS)
    try:
        import uvloop  # noqa: F401
        runner = uvloop.run
    except ImportError:
        runner = asyncio.run
    node = Node(config, role)
    runner(node.run())

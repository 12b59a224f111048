"""A message-routing node (primary or backup): a MonitorNode (monitor/node.py) plus the broker,
its MQTT listeners, the mate link (replication.py), config-sync (configuration.py), planned handovers
(handover.py) and the optional virtual IP (vip.py). This module is wiring: each part gets the narrow
dependencies it needs at construction.

The MQTT gate (`may_serve`): the quorum core's lease, and a broker core rebuilt for this epoch from the
replicated spool. The listener asks it on every packet, so safety does not wait for a step-down to
reach the event loop (`call_soon_threadsafe`, clients dropped).

SIGTERM on the active hands activity over first when the mate is in sync (bounded by the handover's own
2 s drain bound), so `systemctl stop` is a planned handover.

With a [vip] table, the node holds the virtual IP while it is active (vip.py): removed first at
start-up (a node killed -9 left it), added on "activate", removed on "step_down" before the step-down's
heartbeat leaves, and first thing at shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets

from pairmq.monitor.node import MonitorNode

from ..api.ports import RoutingPorts
from ..api.reads import spool_disk
from ..clock import now_ms
from ..broker.authn import Authenticator
from ..broker.core import BrokerCore, limits_from_config
from ..broker import outcomes
from ..broker.message_events import MessageEvents
from ..broker.service import BrokerService, writer_limits
from ..broker.sys_topics import Redundancy
from ..config import GroupConfig
from ..errors import LocalProtocolError
from ..mqtt.budget import preauth_from_config
from ..mqtt.listener import MqttListener
from ..mqtt.websockets import WebSocketLimits
from ..quorum.core import QuorumCore
from ..quorum.decisions import DecisionKind
from ..quorum.state import RedundancyStatus
from ..quorum.wire import Activity
from ..roles import Role
from ..spool.local import LocalSpool
from . import sd_notify, views
from .configuration import NodeConfiguration, apply_change
from .handover import HandoverRunner
from .replication import MateRelease, Replication, active_end
from .sys_publisher import SysPublisher, SysSources

log = logging.getLogger("pairmq.node")

MQTT_REASON_USE_ANOTHER_SERVER = 0x9C
MQTT_REASON_SERVER_SHUTTING_DOWN = 0x8B


class RoutingNode(MonitorNode):
    def __init__(self, config: GroupConfig, role: Role) -> None:
        assert role.routes_messages, role
        super().__init__(config, role)

    def _add_parts(self) -> None:
        config, role, secret = self.config, self.role, self.keys
        self.vip = None
        self.sys_topics: SysPublisher | None = None  # from _start_parts
        if config.vip is not None:
            from .vip import VipHolder  # pyroute2 and scapy only where a virtual IP is configured

            self.vip = VipHolder(config.vip, config.vip.interfaces[role],
                                 on_event=lambda kind, fields: self.events.write(kind, **fields))
        self.listener: MqttListener | None = None
        self.tls_listener: MqttListener | None = None
        self.ws_listener: MqttListener | None = None  # MQTT over WebSockets (8083)
        self.wss_listener: MqttListener | None = None  # ... over TLS (8084), with [tls]
        self._denials_logged: dict = {}  # what _log_denials reported so far
        # A corrupt configuration store or a malformed access file to import stops the node here with
        # one sentence: never guess a policy.
        self.configuration = NodeConfiguration(
            self.spec.data_dir, config, role, self.quorum, secret, epoch=self.current_epoch,
            may_serve=self.may_serve, on_changed=self._config_changed, events=self.events.write)
        self.core.auto_revert = self.configuration.auto_revert()  # config-sync's, else the group file's
        limits = self.configuration.limits()
        self.authn = Authenticator(self.configuration.document.access,
                                   per_address_per_min=limits.login_checks_per_address_per_min,
                                   per_user_per_min=limits.login_checks_per_user_per_min,
                                   owner_refusal=lambda client_id, user: self.broker.core.owner_refusal(
                                       client_id, user))
        self._core_limits = limits_from_config(limits)
        # A corrupt spool stops the node here with a SpoolCorruption sentence: never serve from it.
        spool = LocalSpool(self.spec.data_dir / "spool",
                           writer_limits(self._core_limits.max_message_ids, limits.spool_max_bytes),
                           on_lost=self._on_spool_lost, on_commit_seconds=self.instruments.spool_commit.observe)
        active = active_end(config, role, spool, secret, epoch=self.current_epoch, may_serve=self.may_serve,
                            on_acked=self._mate_acked,
                            on_round_trip=self.instruments.replication_round_trip.observe)
        release = MateRelease(active, ask=lambda: self.replication.advertise_soon())
        events = None
        if config.events.message_events:
            events = MessageEvents(self.events, config.events.message_sample_ratio, acked_seq=lambda: active.acked_seq,
                                   mate_needed=lambda: release.need_mate)
        self.broker = BrokerService(spool, epoch=self.current_epoch, core_factory=self._new_broker_core,
                                    release=release, serving=self.may_serve,
                                    mate_over_lag=lambda: active.over_max_lag, message_events=events,
                                    observe_ack=self.instruments.publish_ack.observe_n)
        self.replication = Replication(self.quorum, config, role, spool=spool, broker=self.broker, active=active,
                                       release=release, secret=secret, data_dir=self.spec.data_dir,
                                       epoch=self.current_epoch, may_serve=self.may_serve,
                                       config_mate_joined=self.configuration.sync.mate_joined)
        self.handovers = HandoverRunner(self.quorum, role, self.broker,
                                        mate_reference=config.mqtt_reference(role.mate()),
                                        acked_seq=lambda: active.acked_seq,
                                        listeners=self._listeners, events=self.events.write)

    def _mate_acked(self, seq: int) -> None:
        """The mate acknowledged through `seq` (on the broker loop): what it now holds is released at once."""
        self.broker.release_held()

    def _new_broker_core(self) -> BrokerCore:
        authn = self.authn
        return BrokerCore(node_name=self.role.value, limits=self._core_limits,
                          id_source=lambda: "pairmq-" + secrets.token_hex(8),
                          authorize=lambda user, action, topic: authn.policy.authorize(user, action, topic),
                          may_receive=lambda user, topic: authn.policy.may_receive(user, topic))

    def _listeners(self) -> list[MqttListener]:
        return [lst for lst in (self.listener, self.tls_listener, self.ws_listener, self.wss_listener)
                if lst is not None]

    # --- the activity gate (what the MQTT listener asks, from the broker loop) ------

    def may_serve(self) -> bool:
        """The lease, and a broker core rebuilt for this epoch from the replicated spool. Asked per read: it reads
        what the quorum core published at its lock's last release, taking no lock (heartbeats.py)."""
        until, epoch = self.heartbeats.lock.gate
        return now_ms() < until and self.replication.ready(epoch)

    def _serves(self) -> bool:
        return self.may_serve()

    def _routing_ports(self) -> RoutingPorts:
        def listeners() -> list:
            return [(x, tls) for x, tls in ((self.listener, False), (self.tls_listener, True), (self.ws_listener, False),
                                            (self.wss_listener, True)) if x is not None]

        def mate_link() -> tuple:
            active, standby = self.replication.active, self.replication.standby
            link = active.link if active.conn is not None and not active.conn.closed else None
            return link is not None or (standby is not None and standby.link is not None), link

        def spool_view() -> dict:
            return {**self.broker.view(), "disk": spool_disk(self.broker.spool)}

        return RoutingPorts(spool_view=spool_view, sessions=lambda: self.broker.core.sessions,
                            listeners=listeners, mate_link=mate_link, configuration=self.configuration)

    def _keyed_links(self) -> list:
        standby = self.replication.standby
        return [("mate link", self.replication.active.conn), ("mate link", standby.conn if standby else None),
                ("config-sync", self.configuration.sync.conn), ("config-sync", self.configuration.sync.follow_conn)]

    # --- running -------------------------------------------------------------------

    async def _before_heartbeats(self) -> None:
        if self.vip is not None:  # before anything else: a node killed -9 while active left it on the interface
            await asyncio.to_thread(self.vip.release, "left by an earlier run of this node (removed at start-up)")
            self.vip.start()

    async def _start_parts(self) -> None:
        config = self.config
        limits = self.configuration.limits()
        front = dict(preauth=preauth_from_config(limits), max_output_bytes=limits.mqtt_output_max_bytes,
                     max_keep_alive_s=limits.max_keepalive_s)
        overload = self.configuration.document.effective_overload()
        vip = config.vip.address if config.vip else None  # the listeners accept there too
        self.listener = MqttListener(self.spec.address, config.ports.mqtt, self, overload=overload,
                                     on_event=self._mqtt_event, broker=self.broker,
                                     credential_check=self.authn.check, virtual_ip=vip, **front)
        self.ws_listener = MqttListener(self.spec.address, config.ports.mqtt_ws, self, overload=overload,
                                        on_event=self._mqtt_event, broker=self.broker,
                                        credential_check=self.authn.check, virtual_ip=vip,
                                        websocket=WebSocketLimits(), **front)
        if config.tls is not None:
            from ..tls import certificate_identity, server_context

            source = config.tls.use_identity_as_username
            tls = dict(identity=certificate_identity(source) if source is not None else None,
                       credential_check=self.authn.check_certified if source is not None else self.authn.check)
            # A context each: the listener counts its handshake failures through its context.
            self.tls_listener = MqttListener(self.spec.address, config.ports.mqtt_tls, self, overload=overload,
                                             on_event=self._mqtt_event, broker=self.broker, virtual_ip=vip,
                                             ssl=server_context(config.tls), **tls, **front)
            self.wss_listener = MqttListener(self.spec.address, config.ports.mqtt_wss, self, overload=overload,
                                             on_event=self._mqtt_event, broker=self.broker, virtual_ip=vip,
                                             ssl=server_context(config.tls), websocket=WebSocketLimits(), **tls,
                                             **front)
        await self.broker.start()
        await self.replication.start(self.spec.address)
        await self.configuration.start(self.spec.address)
        for listener in self._listeners():
            await listener.start()
        self.sys_topics = SysPublisher(config.sys.interval_s, SysSources(
            serving=self.may_serve, broker=lambda: self.broker, listeners=self._listeners,
            redundancy=self._sys_redundancy, started_ms=self.started_at))
        self.sys_topics.start()

    def _sys_redundancy(self) -> Redundancy:
        def read(core: QuorumCore, now: int) -> tuple:
            return core.active_epoch or core.state.epoch, core.redundancy_status(now) is RedundancyStatus.UP

        epoch, in_sync = self.quorum.call(read)
        return Redundancy("active", epoch, in_sync, self.configuration.sync.status().value)

    async def _stop_front(self) -> None:
        if self.sys_topics is not None:
            self.sys_topics.stop()
        if self.vip is not None:  # first: a stopping node serves nobody
            await asyncio.to_thread(self.vip.stop, f"the {self.role.value} node is stopping")
        for listener in self._listeners():
            with contextlib.suppress(Exception):
                listener.drop_clients(MQTT_REASON_SERVER_SHUTTING_DOWN)
                await listener.stop()
        self.authn.close()

    async def _stop_back(self) -> None:
        for part in (self.replication, self.configuration, self.broker):
            with contextlib.suppress(Exception):
                await part.stop()
        self._each_second()  # the last message-event counts

    def _on_sigterm(self) -> None:
        """Hand activity over first if we hold it and the mate is in sync; stop in any case."""
        sd_notify.notify("STOPPING=1")  # now, not after the handover: systemctl shows "deactivating" at once
        active = self.quorum.call(
            lambda core, now: core.activity is Activity.ACTIVE and core.handover.draining is None)
        if not active:
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
        if revert and self.role is Role.PRIMARY:
            serving = self.quorum.call(lambda core, now: core.may_serve(now))
            raise LocalProtocolError("the primary already holds activity; there is nothing to revert" if serving
                                     else "revert-activity runs on the active backup")
        return await self.handovers.run(why, force=force)

    def _each_second(self) -> None:
        if self.broker.message_events is not None:
            self.broker.message_events.flush_counts()
        core = self.broker.core
        if core.outcomes:  # what became of the last second's PUBLISHes: one line (broker/outcomes.py)
            counts, core.outcomes = core.outcomes, {}
            self.events.write("publish_outcomes", epoch=self.current_epoch(), outcomes=outcomes.as_event(counts))

    # --- what the heartbeat thread hands over ----------------------------------------

    def _follow(self, decision) -> None:
        """On the heartbeat thread: the gate already follows the core; only the clients wait for the loop."""
        if decision.kind == DecisionKind.STEP_DOWN:
            self._post(self._drop_clients_after_step_down)
        if decision.kind == DecisionKind.AUTO_REVERT:
            self._post(self._auto_revert)
        if decision.kind == DecisionKind.ACTIVATE and self.vip is not None:
            self.vip.hold(decision.reason)
        if decision.kind == DecisionKind.ACTIVATE:
            self._post(self.replication.poke)  # rebuild the broker core now, not at the next 50 ms sync

    def _position_echoed(self) -> None:
        self.replication.echoed()

    def _before_heartbeats_leave(self, decisions) -> None:
        """A step-down's heartbeat (maybe a yield the mate acts on) leaves only once the VIP is gone."""
        if self.vip is not None:
            for decision in decisions:
                if decision.kind == DecisionKind.STEP_DOWN:
                    self.vip.release(decision.reason)

    def _auto_revert(self) -> None:
        async def revert() -> None:
            try:
                outcome = await self.handovers.run("auto-revert")
                log.warning("%s", outcome.sentence)  # the sentence names this node
            except LocalProtocolError as exc:  # the core asks again later (handover.REVERT_RETRY_MS)
                log.info("%s: auto-revert not now: %s", self.role.value, exc)

        self._loop.create_task(revert())

    def _standby_linked(self) -> bool | None:
        return self.replication.standby_linked()

    def _drop_clients_after_step_down(self) -> None:
        reference = self.active_server_reference()
        yielded = self.quorum.call(lambda core, now: core.handover.holds_yield(core.state.epoch))
        if reference is None and yielded:  # we handed over: the mate is the only node that can take activity
            reference = self.config.mqtt_reference(self.role.mate())
        for listener in self._listeners():
            listener.drop_clients(MQTT_REASON_USE_ANOTHER_SERVER, reference)

    def _on_spool_lost(self, why: str) -> None:
        """In a mate-link worker thread: a full resync swapped files but the spool did not open again."""
        self.events.write("spool_lost", error=why)
        self._fail(f"the {self.role.value} node stops: {why}")

    # --- configuration (users, passwords, ACLs, limits) -----------------------------------

    def _config_changed(self, before, doc) -> None:
        configuration = self.configuration
        apply_change(before, doc, authn=self.authn, listeners=self._listeners(), broker=self.broker,
                     may_serve=self.may_serve, apply_limits=self.apply_limits, limits=configuration.limits(),
                     quorum=self.quorum, auto_revert=configuration.auto_revert(), events=self.events.write)

    def config_mate_joined(self) -> bool:
        return self.configuration.sync.mate_joined()

    def apply_limits(self, limits) -> None:
        """New limits from config-sync, on the broker core now and on every core rebuilt later."""
        self._core_limits = limits_from_config(limits)
        self.broker.set_limits(self._core_limits)
        self.authn.throttle.per_address_per_min = limits.login_checks_per_address_per_min
        self.authn.throttle.per_user_per_min = limits.login_checks_per_user_per_min
        for listener in self._listeners():
            listener.set_limits(preauth_from_config(limits), limits.mqtt_output_max_bytes, limits.max_keepalive_s)

    def _log_denials(self) -> None:
        """Publishes and subscriptions the ACL refused, and failed TLS handshakes, in the last second: one summed
        event each (a flood of them costs a line a second, like rejected heartbeats)."""
        logged = self._denials_logged
        for tls in (self.tls_listener, self.wss_listener):  # 8883 and 8084
            if tls is None:
                continue
            key = f"tls:{tls.requested_port}"
            if tls.tls_handshake_failures > logged.get(key, 0):
                count = tls.tls_handshake_failures - logged.get(key, 0)
                self.events.write("tls_handshake_failed", count=count, port=tls.requested_port,
                                  last_reason=tls.last_tls_handshake_failure)
                log.info("%s: %d failed TLS handshakes on port %d in the last second (last: %s)", self.role.value,
                         count, tls.requested_port, tls.last_tls_handshake_failure)
            logged[key] = tls.tls_handshake_failures
        counters = self.broker.core.counters
        now = {k: counters.get(k, 0) for k in ("publish_not_authorized", "subscribe_not_authorized")}
        delta = {k: v - logged.get(k, 0) for k, v in now.items() if v - logged.get(k, 0) > 0}
        if delta:
            self.events.write("access_denied", **delta)
            log.info("%s: the ACL refused in the last second: %s", self.role.value,
                     ", ".join(f"{v} {k}" for k, v in delta.items()))
        self._denials_logged = {**{k: v for k, v in logged.items() if k.startswith("tls:")}, **now}

    def _mqtt_event(self, kind: str, fields: dict) -> None:
        if kind in ("client_accepted", "client_refused", "bad_packet", "connection_refused", "tls_refused"):  # bad_packet: a rejected frame
            self.events.write(kind, epoch=self.current_epoch(), **fields)

    # --- views --------------------------------------------------------------------

    def activity_label(self, now: int) -> str:
        return views.routing_activity_label(self.core, self.role, now)

    def _redundancy_view(self, core: QuorumCore, now: int) -> dict:
        view = super()._redundancy_view(core, now)
        replication, standby = self.replication, self.replication.standby
        view.update({
            # What the MQTT gate answers: the lease, and a broker core rebuilt for this epoch (replication.py).
            "serving": core.may_serve(now) and replication.ready(core.active_epoch),
            "in_sync": core.activity is Activity.ACTIVE or core.in_sync(now),
            # A standby's latest catch-up on the mate link (mate_link/standby.py ResyncProgress.view), else None.
            "resync": None if standby is None else standby.progress(now),
            "mate_link_refusals": replication.refusals(),
            "vip": None if self.vip is None else self.vip.view(),
            "mqtt": None if self.listener is None else self._mqtt_view(),
        })
        return view

    def _mqtt_view(self) -> dict:
        listener, tls = self.listener, self.tls_listener
        return {
            "address": self.config.mqtt_reference(self.role), **listener.stats(),
            "clients": listener.client_count + (tls.client_count if tls else 0),
            "tls_address": (f"{self.spec.address}:{self.config.ports.mqtt_tls}" if tls else None),
            "tls_handshake_failures": tls.tls_handshake_failures if tls else 0,
            "access": self.authn.view(),
            "refused": {k: v for k, v in self.broker.core.counters.items() if k.endswith("not_authorized")}}

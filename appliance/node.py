"""One PairMQ node process: the asyncio adapter around the quorum core.

Start-up is an explicit sequence: load the group file and secret, open the
stable store (bumping the boot incarnation), bind the heartbeat socket, the
MQTT listener and the management API, then run until SIGTERM/SIGINT. The core
decides; this module only moves bytes, re-arms the core's one timer, persists
nothing itself, and acts on decisions (dropping clients the instant activity
ends). Everything the node does is logged as a decision sentence and written
to its event log.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import signal
import socket
import time

from . import sd_notify
from .config import GroupConfig, load_secret
from .eventlog import EventLog
from .management import ManagementServer
from .quorum.auth import HeartbeatAuth
from .quorum.core import QuorumCore, Timing
from .quorum.wire import Activity
from .roles import Role
from .stable_file import FileStore

log = logging.getLogger("pairmq.node")

MQTT_REASON_USE_ANOTHER_SERVER = 0x9C
MQTT_REASON_SERVER_SHUTTING_DOWN = 0x8B


def now_ms() -> int:
    return time.monotonic_ns() // 1_000_000


class _HeartbeatProtocol(asyncio.DatagramProtocol):
    def __init__(self, node: "Node") -> None:
        self.node = node

    def datagram_received(self, data: bytes, addr) -> None:
        self.node.on_datagram(data)

    def error_received(self, exc: Exception) -> None:
        self.node.send_errors += 1


class Node:
    """Wires one QuorumCore to its sockets. Also the MQTT listener's activity gate."""

    def __init__(self, config: GroupConfig, role: Role) -> None:
        self.config = config
        self.role = role
        self.spec = config.node(role)
        self.spec.data_dir.mkdir(parents=True, exist_ok=True)
        secret = load_secret(config)
        self.management_token = management_token(secret)
        self.events = EventLog(self.spec.data_dir / "events", role.value)
        self.store = FileStore(self.spec.data_dir / "quorum.json")
        self.core = QuorumCore(role, HeartbeatAuth(secret, config.name, role), Timing.from_timers(config.timers),
                               self.store, now_ms())
        self.started_at = now_ms()
        self.send_errors = 0
        self.listener = None
        self.broker = None
        if role.routes_messages:
            from .broker.core import BrokerCore, limits_from_config
            from .broker.service import BrokerService

            core_limits = limits_from_config(config.limits)

            def new_core() -> BrokerCore:
                return BrokerCore(node_name=role.value, limits=core_limits,
                                  id_source=lambda: "pairmq-" + secrets.token_hex(8))

            # A corrupt spool stops the node here with a SpoolCorruption sentence: never serve from it.
            self.broker = BrokerService(self.spec.data_dir / "spool",
                                        epoch=lambda: self.core.active_epoch or self.core.state.epoch,
                                        core_factory=new_core, spool_max_bytes=config.limits.spool_max_bytes)
        self._transport: asyncio.DatagramTransport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._peer_addresses = [(config.node(r).address, config.ports.heartbeat) for r in role.peers()]
        self._ready = False
        self._stopping = asyncio.Event()
        self.management = ManagementServer(self)

    # --- the activity gate (what the MQTT listener asks) -----------------------

    def may_serve(self) -> bool:
        return self.core.may_serve(now_ms())

    def active_server_reference(self) -> str | None:
        active = self.core.active_role(now_ms())
        if active is None or active is self.role:
            return None
        return self.config.mqtt_reference(active)

    # --- running -------------------------------------------------------------------

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stopping.set)
        sock = socket.socket(socket.AF_INET6 if ":" in self.spec.address else socket.AF_INET, socket.SOCK_DGRAM)
        # No SO_REUSEADDR: on UDP it would let a second node on this address steal our heartbeats.
        sock.bind((self.spec.address, self.config.ports.heartbeat))
        self._transport, _ = await loop.create_datagram_endpoint(lambda: _HeartbeatProtocol(self), sock=sock)
        if self.role.routes_messages:
            from .mqtt.listener import MqttListener

            self.listener = MqttListener(self.spec.address, self.config.ports.mqtt, self, on_event=self._mqtt_event,
                                         broker=self.broker)
            await self.broker.start()
            await self.listener.start()
        try:
            await self.management.start()
        except BaseException:
            await self._shutdown()
            raise
        self._flush()
        log.info("%s: listening on %s (heartbeats :%d, management :%d)", self.role.value, self.spec.address,
                 self.config.ports.heartbeat, self.config.ports.management)
        watchdog = asyncio.create_task(self._watchdog())
        try:
            await self._stopping.wait()
        finally:
            watchdog.cancel()
            await self._shutdown()

    async def _shutdown(self) -> None:
        sd_notify.notify("STOPPING=1")
        if self._timer:
            self._timer.cancel()
        with contextlib.suppress(Exception):
            if self.listener:
                self.listener.drop_clients(MQTT_REASON_SERVER_SHUTTING_DOWN)
                await self.listener.stop()
        with contextlib.suppress(Exception):
            await self.management.stop()
        if self.broker is not None:
            with contextlib.suppress(Exception):
                await self.broker.stop()
        if self._transport:
            self._transport.close()
        self.events.write("node_stopped", role=self.role.value)
        self.events.close()

    def stop(self) -> None:
        self._stopping.set()

    async def _watchdog(self) -> None:
        """Once a second, from the event loop itself: ping systemd's watchdog (a hung loop gets
        restarted) and log rejected heartbeats as one summed event (a flood costs one line a second)."""
        logged = dict(self.core.auth.rejected)
        while True:
            sd_notify.notify("WATCHDOG=1")
            rejected = dict(self.core.auth.rejected)
            delta = {reason: rejected[reason] - logged.get(reason, 0) for reason in rejected}
            if any(delta.values()):
                self.events.write("heartbeats_rejected", **{k: v for k, v in delta.items() if v})
                log.info("%s: rejected heartbeats in the last second: %s", self.role.value,
                         ", ".join(f"{v} {k}" for k, v in delta.items() if v))
                logged = rejected
            await asyncio.sleep(1.0)

    # --- core I/O --------------------------------------------------------------------

    def on_datagram(self, data: bytes) -> None:
        self.core.receive_datagram(data, now_ms())
        self._flush()

    def _on_timer(self) -> None:
        self._timer = None
        self.core.handle_timer(now_ms())
        self._flush()

    def force_activity(self, acknowledge_data_loss: bool) -> None:
        self.core.request_force(now_ms(), acknowledge_data_loss=acknowledge_data_loss)
        self._flush()

    def _flush(self) -> None:
        """Send what the core produced, act on its decisions, re-arm its timer."""
        if self._transport is not None:
            for data in self.core.datagrams_to_send():
                for addr in self._peer_addresses:
                    try:
                        self._transport.sendto(data, addr)
                    except OSError:
                        self.send_errors += 1
        for decision in self.core.decisions():
            self._act_on(decision)
        if self._timer:
            self._timer.cancel()
        delay = max(0.0, (self.core.get_timer() - now_ms()) / 1000)
        self._timer = asyncio.get_running_loop().call_later(delay, self._on_timer)
        if not self._ready and (now_ms() >= self.core.boot_at + self.core.timing.quiet_ms
                                or any(self.core.sees(r, now_ms()) for r in self.core.peers)):
            self._ready = True
            sd_notify.notify("READY=1")

    def _act_on(self, decision) -> None:
        level = logging.INFO if decision.kind in ("refuse", "sync", "boot", "bid", "bid_end") else logging.WARNING
        log.log(level, "%s", decision.reason)
        self.events.write("redundancy_decision", kind=decision.kind, epoch=decision.epoch, reason=decision.reason,
                          core_ms=decision.at_ms)
        if decision.kind == "step_down" and self.listener is not None:
            self.listener.drop_clients(MQTT_REASON_USE_ANOTHER_SERVER, self.active_server_reference())
        if decision.kind in ("activate", "step_down"):
            sd_notify.notify(f"STATUS={decision.reason}")

    def _mqtt_event(self, kind: str, fields: dict) -> None:
        if kind in ("client_accepted", "client_refused"):
            self.events.write(kind, epoch=self.core.active_epoch or self.core.state.epoch, **fields)

    # --- views --------------------------------------------------------------------

    def activity_label(self, now: int) -> str:
        if self.role is Role.MONITOR:
            return "Monitor"
        if self.core.may_serve(now):
            return "Local Active"
        if self.core.active_role(now) is self.role.mate():
            return "Mate Active"
        return "Standby"

    def message_spool_view(self) -> dict | None:
        """The broker's limits, refusal counters and spool writer (management API); None off a routing node."""
        return None if self.broker is None else self.broker.view()

    def redundancy_view(self) -> dict:
        now = now_ms()
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
            "serving": core.may_serve(now),
            "epoch": core.state.epoch,
            "active_role": active.value if active else None,
            "redundancy_status": core.redundancy_status(now).value,
            "in_sync": None if self.role is Role.MONITOR else (core.activity is Activity.ACTIVE or core.in_sync(now)),
            "incarnation": core.state.incarnation,
            "uptime_ms": now - self.started_at,
            "lease_remaining_ms": max(0, core.lease_expiry - now) if core.may_serve(now) else 0,
            "peers": peers,
            "last_decision": decisions[-1] if decisions else None,
            "decisions": decisions,
            "accepted_heartbeats": core.auth.accepted,
            "rejected_heartbeats": dict(core.auth.rejected),
            "mqtt": None if self.listener is None else {
                "address": self.config.mqtt_reference(self.role), "clients": self.listener.client_count},
        }


def _decision_json(d, now: int) -> dict:
    return {"kind": d.kind, "epoch": d.epoch, "reason": d.reason, "ms_ago": now - d.at_ms}


def management_token(secret: bytes) -> str:
    """The bearer token for changes through the management API, derived from the group secret."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    return HKDF(algorithm=hashes.SHA256(), length=24, salt=b"pairmq-group-secret",
                info=b"pairmq/management-token/v1").derive(secret).hex()


def run_node(config: GroupConfig, role: Role) -> None:
    """Run one node in the foreground until SIGTERM (what systemd runs)."""
    try:
        import uvloop  # noqa: F401
        runner = uvloop.run
    except ImportError:
        runner = asyncio.run
    node = Node(config, role)
    runner(node.run())

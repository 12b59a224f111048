"""A host-list MQTT client for PairMQ groups: an application sees no error across a failover.

    from pairmq.cli.hostlist import HostListClient

    client = HostListClient(["10.0.0.1:1883", "10.0.0.2:1883"], client_id="door-controller")
    client.start()                                   # returns once connected to the active node
    handle = client.publish("cars/7/door", b"unlock", qos=1)
    handle.wait(timeout_s=10)                        # True once the active acknowledged it (after replication)
    client.subscribe("cars/7/state", qos=1, on_message=lambda topic, payload: ...)
    client.stop()

Rules:
- One paho-mqtt client (MQTT 5), one thread that drives its network loop and its connections: no
  races between a reconnect and the loop.
- Connecting walks the host list in order. A CONNACK "use another server" (0x9C) or "server moved"
  (0x9D) with a Server Reference, and a DISCONNECT carrying one (a handover), send it to that host
  next; any other failure tries the next host, with a short bounded back-off once every host failed.
- The session is persistent (clean start off, `session_expiry_s`): the group replicates it, so after a
  failover the new active still holds the subscriptions, queued messages and QoS 2 state. When a
  server has no session for us (session present = 0), the client subscribes again.
- Publishes are never refused by the client for lack of a connection: they wait in the client's own
  FIFO, which feeds paho only while fewer than `WINDOW` messages are unacknowledged (the server's
  Receive Maximum is 100). paho resends its unacknowledged messages (DUP) on the next connection,
  whichever host it is, and nothing newer can overtake them: per-publisher order holds across a
  failover (paho alone would send a new publish ahead of its own queued backlog). Each QoS 1/2
  publish carries a message id (user property `MESSAGE_ID_PROPERTY`) so the group can drop the
  copy a retransmit after failover would otherwise create (docs/broker.md, duplicate suppression).
- Bounded: at most `max_queued` unacknowledged messages (paho's queue); beyond, publish raises.
- A publish the server answers with a failure reason code (PUBACK/PUBREC >= 0x80: not authorized,
  quota exceeded, ...) was not stored: `PublishHandle.wait` raises `PublishRefused` naming the code,
  never reports it acknowledged. A failover is not a refusal: the publish is resent, as above.
- A CONNACK that no node of the group would answer differently (bad user name or password, not
  authorized, banned, a protocol the server does not take: `PERMANENT_REFUSALS`; users and rights
  are config-synced) ends the client with `fail_fast`: `start` raises `ConnectionRefused` naming it
  in words at once, and a later one sets `failure`. Without it, such a refusal is one more failed
  host, and a timeout names the most relevant cause seen: a permanent refusal from any node before
  a busy or unavailable server, before a connection error, before a standby's redirect.
- Each SUBACK is kept per filter (`suback_codes`, `wait_subscribed`): a code >= 0x80 is a denial.
- `protocol` 5 (the default) speaks MQTT 5; 4 speaks MQTT 3.1.1 (no redirects, no message ids, a
  clean session when `session_expiry_s` is 0).
"""

from __future__ import annotations

import collections
import ssl
import threading
import time
import uuid
from collections.abc import Callable

import paho.mqtt.client as mqtt
from paho.mqtt.enums import MessageState
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from pairmq.appliance.errors import PairMQError

MESSAGE_ID_PROPERTY = "pairmq-msg-id"
USE_ANOTHER_SERVER, SERVER_MOVED = 0x9C, 0x9D
# CONNACK reason codes no other node of the group would answer differently.
PERMANENT_REFUSALS = frozenset({0x81, 0x82, 0x84, 0x85, 0x86, 0x87, 0x8A, 0x8C})
PROTOCOLS = {5: mqtt.MQTTv5, 4: mqtt.MQTTv311, 3: mqtt.MQTTv31}
LOOP_STEP_S = 0.005
WINDOW = 100  # at most this many handed to paho and unacknowledged: PairMQ's Receive Maximum


class ClientError(PairMQError):
    """The client cannot do what was asked (no host reachable in time, queue full, bad host list)."""


class PublishRefused(ClientError):
    """The server refused a publish with a failure reason code: it was not stored and is not delivered."""


class ConnectionRefused(ClientError):
    """A node refused the connection for a reason no other node would answer differently."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def reason_words(code: int, name: str) -> str:
    """`bad user name or password (0x86)`: paho's name of a reason code, as a sentence fragment."""
    return f"{name[:1].lower()}{name[1:]} (0x{code:02X})"


def _relevance(code: int | None) -> int:
    """How much a failed connection attempt explains (higher first): refusals that will not change, then
    those that may (busy, unavailable), then no answer at all, then a redirect (it only points elsewhere)."""
    if code in PERMANENT_REFUSALS:
        return 3
    if code in (USE_ANOTHER_SERVER, SERVER_MOVED):
        return 0
    return 2 if code is not None else 1


def parse_hosts(hosts: list[str] | str, default_port: int = 1883) -> list[tuple[str, int]]:
    items = hosts.split(",") if isinstance(hosts, str) else list(hosts)
    parsed = []
    for item in (i.strip() for i in items):
        host, _, port = item.rpartition(":") if ":" in item else (item, "", str(default_port))
        try:
            number = int(port)
        except ValueError:
            number = -1
        if not host or not 1 <= number <= 65535:
            raise ClientError(f"{item!r} is not HOST[:PORT] (a port from 1 to 65535)")
        parsed.append((host, number))
    if not parsed:
        raise ClientError("the host list is empty")
    return parsed


class PublishHandle:
    def __init__(self, topic: str, payload: bytes, qos: int, retain: bool, properties, message_id: str | None):
        self.topic, self.payload, self.qos, self.retain = topic, payload, qos, retain
        self.properties, self.message_id = properties, message_id
        self.acknowledged = threading.Event()  # set when the server answered: accepted or refused
        self.refusal: str | None = None  # why, when the answer was a failure reason code
        self.reason_code: int | None = None  # that code

    def wait(self, timeout_s: float) -> bool:
        """True once the server acknowledged the message (PUBACK / PUBCOMP; QoS 0: once written), False if
        it has not within `timeout_s`; raises PublishRefused if the server refused it."""
        if not self.acknowledged.wait(timeout_s):
            return False
        if self.refusal is not None:
            raise PublishRefused(self.refusal)
        return True


class _Paho(mqtt.Client):
    """paho-mqtt 2.2 ignores a PUBREC's reason code and sends PUBREL anyway; MQTT 5 (4.3.3) says a PUBREC
    >= 0x80 ends the QoS 2 exchange: the message was refused. Report it as the publish's answer instead."""

    def _handle_pubrec(self):
        from paho.mqtt import _packet

        result = _packet.decode_pubrec(self._in_packet["command"], self._in_packet["packet"], self._protocol)
        if result.reason is None or not result.reason.is_failure:
            return super()._handle_pubrec()
        with self._out_message_mutex:
            if result.mid in self._out_messages:
                return self._do_on_publish(result.mid, result.reason, result.properties)
        return mqtt.MQTTErrorCode.MQTT_ERR_SUCCESS


def _connect_error(exc: OSError) -> str:
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"TLS: certificate verify failed ({exc.verify_message})"
    if isinstance(exc, ssl.SSLError):
        return f"TLS: {exc.reason or exc}"
    return exc.strerror or str(exc)


class HostListClient:
    def __init__(self, hosts: list[str] | str, client_id: str, *, session_expiry_s: int = 3600,
                 keepalive_s: int = 10, username: str | None = None, password: str | None = None,
                 connect_timeout_s: float = 2.0, max_backoff_s: float = 0.5, max_queued: int = 100_000,
                 message_ids: bool = True, transport: str = "tcp", tls: ssl.SSLContext | None = None,
                 protocol: int = 5, fail_fast: bool = False, default_port: int = 1883) -> None:
        """`transport` "websockets" speaks MQTT over WebSockets (path /mqtt, ports 8083/8084); `tls` adds TLS."""
        if protocol not in PROTOCOLS:
            raise ClientError(f"MQTT protocol version {protocol} is not one of {', '.join(map(str, PROTOCOLS))}")
        self.hosts = parse_hosts(hosts, default_port)
        self.protocol = protocol
        self.fail_fast = fail_fast
        self.client_id = client_id
        self.session_expiry_s = session_expiry_s
        self.keepalive_s = keepalive_s
        self.connect_timeout_s = connect_timeout_s
        self.max_backoff_s = max_backoff_s
        self.message_ids = message_ids and protocol == 5
        v3 = {} if protocol == 5 else {"clean_session": session_expiry_s == 0}
        self.paho = _Paho(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=PROTOCOLS[protocol],
                          reconnect_on_failure=False, transport=transport, **v3)
        if transport == "websockets":
            self.paho.ws_set_options(path="/mqtt")
        if tls is not None:
            self.paho.tls_set_context(tls)
        self.paho.max_inflight_messages_set(WINDOW)
        self.paho.connect_timeout = connect_timeout_s
        if username is not None:
            self.paho.username_pw_set(username, password)
        self.paho.on_connect = self._on_connect
        self.paho.on_disconnect = self._on_disconnect
        self.paho.on_message = self._on_message
        self.paho.on_publish = self._on_publish
        self.paho.on_subscribe = self._on_subscribe
        self._pending: collections.deque[PublishHandle] = collections.deque()
        self._handed: dict[int, PublishHandle] = {}  # paho's mid -> handle, until acknowledged
        self.max_queued = max_queued
        self.connected = threading.Event()
        self.current: tuple[str, int] | None = None
        self.connects = self.failovers = 0
        self.history: list[str] = []  # one line per connection event, for tests and `pairmq sub -v`
        self._subscriptions: dict[str, tuple[int, Callable | None, bool]] = {}
        self._suback_mids: dict[int, list[str]] = {}  # SUBSCRIBE packet id -> its filters, until the SUBACK
        self._early_subacks: dict[int, list[int]] = {}  # a SUBACK that overtook the recording of its mid
        self.suback_codes: dict[str, int] = {}  # filter -> the latest SUBACK reason code
        self._lock = threading.Lock()
        self._subacked = threading.Condition(self._lock)
        self.failure: str | None = None  # set (with fail_fast) when a node refused us for good
        self._failure_code = 0
        self._settled = threading.Event()  # connected, or refused for good
        self._causes: list[tuple[int, str]] = []  # (relevance, what happened) per failed attempt
        self._redirect: tuple[str, int] | None = None
        self._answer: threading.Event = threading.Event()
        self._answer_code: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # --- the application's side ---

    def start(self, timeout_s: float = 10.0) -> None:
        self._thread = threading.Thread(target=self._run, name=f"hostlist-{self.client_id}", daemon=True)
        self._thread.start()
        self._settled.wait(timeout_s)
        if self.failure is not None:
            self.stop()
            raise ConnectionRefused(self.failure, self._failure_code)
        if not self.connected.is_set():
            raise ClientError(f"no host of {self._hosts_text()} accepted {self.client_id!r} within {timeout_s:g} s "
                              f"({self.most_relevant_cause()})")

    def most_relevant_cause(self) -> str:
        """What best explains why no host accepted us (the latest of the most relevant kind)."""
        if not self._causes:
            return self.history[-1] if self.history else "no answer"
        best = max(relevance for relevance, _ in self._causes)
        return [text for relevance, text in self._causes if relevance == best][-1]

    def wait_subscribed(self, timeout_s: float) -> dict[str, int] | None:
        """Every current filter's SUBACK reason code once all have one, or None after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        with self._subacked:
            while not set(self._subscriptions) <= set(self.suback_codes):
                left = deadline - time.monotonic()
                if left <= 0 or self.failure is not None:
                    return None
                self._subacked.wait(min(left, 0.1))
            return {f: self.suback_codes[f] for f in self._subscriptions}

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        try:
            self.paho.disconnect()
        except Exception:  # noqa: BLE001 - already gone
            pass

    def publish(self, topic: str, payload: bytes, qos: int = 1, retain: bool = False) -> PublishHandle:
        """Queue a message; it is sent in order, on whichever node is active. Never fails for lack of a
        connection; raises ClientError only when `max_queued` messages are already waiting."""
        props, message_id = None, None
        if qos > 0 and self.message_ids:
            message_id = uuid.uuid4().hex
            props = Properties(PacketTypes.PUBLISH)
            props.UserProperty = [(MESSAGE_ID_PROPERTY, message_id)]
        handle = PublishHandle(topic, payload, qos, retain, props, message_id)
        with self._lock:
            if len(self._pending) + len(self._handed) >= self.max_queued:
                raise ClientError(f"{self.max_queued} messages are waiting for acknowledgement; wait for some "
                                  f"before publishing more")
            self._pending.append(handle)
        return handle

    def subscribe(self, topic_filter: str, qos: int = 1, on_message: Callable | None = None, *,
                  whole_message: bool = False):
        """`on_message(topic, payload)` for each message, or `on_message(message)` (paho's, with its QoS and
        retain flag) when `whole_message`."""
        with self._lock:
            self._subscriptions[topic_filter] = (qos, on_message, whole_message)
            self.suback_codes.pop(topic_filter, None)
        if self.connected.is_set():
            self._send_subscribe([topic_filter], qos)

    def _send_subscribe(self, filters: list[str], qos: int) -> None:
        _rc, mid = self.paho.subscribe(filters[0], qos) if len(filters) == 1 else \
            self.paho.subscribe([(f, qos) for f in filters])
        with self._lock:
            early = self._early_subacks.pop(mid, None)
            if early is None:
                self._suback_mids[mid] = filters
            else:
                self._record_subacks(filters, early)

    # --- the connection thread ---

    def _run(self) -> None:
        index, failures = 0, 0
        while not self._stop.is_set():
            target = self._redirect or self.hosts[index % len(self.hosts)]
            self._redirect = None
            if self._connect_once(target):
                failures = 0
                self._serve()
                continue
            if self._redirect is None:
                index += 1
                failures += 1
                if failures % len(self.hosts) == 0:
                    self._stop.wait(min(self.max_backoff_s, 0.05 * failures))

    def _connect_once(self, target: tuple[str, int]) -> bool:
        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = self.session_expiry_s
        self._answer.clear()
        self._answer_code = None
        self._keep_pubrel_states()
        v5 = {"clean_start": False, "properties": props} if self.protocol == 5 else {}
        try:
            self.paho.connect(target[0], target[1], keepalive=self.keepalive_s, **v5)
        except (OSError, ssl.SSLError) as exc:
            what = f"{target[0]}:{target[1]}: {_connect_error(exc)}"
            self.history.append(what)
            self._causes.append((_relevance(None), what))
            return False
        deadline = time.monotonic() + self.connect_timeout_s
        while not self._answer.is_set() and time.monotonic() < deadline and not self._stop.is_set():
            self.paho.loop(LOOP_STEP_S)
        if self._answer_code == 0:
            if self.current is not None and self.current != target:
                self.failovers += 1
            self.current = target
            self.connects += 1
            return True
        self.paho.disconnect()
        self.paho.loop(LOOP_STEP_S)
        if self._answer_code is None:
            what = f"{target[0]}:{target[1]}: no CONNACK within {self.connect_timeout_s:g} s"
            self.history.append(what)
            self._causes.append((_relevance(None), what))
        return False

    def _keep_pubrel_states(self) -> None:
        """paho 2.2 resets a QoS 2 message waiting for PUBCOMP to "resend PUBREL" on each connect, but a
        second connect before a CONNACK 0 (a refused host, a standby's 0x9C) turns that into "publish":
        the message would be sent again as new after its PUBREL, and delivered twice. Undo that first."""
        with self.paho._out_message_mutex:
            for message in self.paho._out_messages.values():
                if message.state == MessageState.MQTT_MS_RESEND_PUBREL:
                    message.state = MessageState.MQTT_MS_WAIT_FOR_PUBCOMP

    def _serve(self) -> None:
        """Drive the network loop until the connection ends (or stop), feeding paho from our FIFO."""
        while not self._stop.is_set() and self.connected.is_set():
            self._feed()
            rc = self.paho.loop(LOOP_STEP_S)
            if rc not in (mqtt.MQTT_ERR_SUCCESS, mqtt.MQTT_ERR_AGAIN) and self.connected.is_set():
                self.connected.clear()
                self.history.append(f"{self._here()}: connection lost ({mqtt.error_string(rc)})")

    def _feed(self) -> None:
        with self._lock:
            while self._pending and len(self._handed) < WINDOW:
                handle = self._pending.popleft()
                info = self.paho.publish(handle.topic, handle.payload, qos=handle.qos, retain=handle.retain,
                                         properties=handle.properties)
                if handle.qos == 0:
                    handle.acknowledged.set()
                else:
                    self._handed[info.mid] = handle

    # --- paho callbacks (on the connection thread) ---

    def _on_publish(self, client, userdata, mid, reason, props) -> None:
        with self._lock:
            handle = self._handed.pop(mid, None)
        if handle is not None:
            # 0x92 "packet identifier not found" answers a PUBREL resent after a failover for an exchange
            # the group had completed: the message was stored and delivered, not refused.
            if getattr(reason, "is_failure", False) and reason.value != 0x92:
                handle.reason_code = reason.value
                handle.refusal = (f"the server refused the publish to {handle.topic!r}: "
                                  f"{reason.getName()} (0x{reason.value:02X})")
            handle.acknowledged.set()


    def _on_connect(self, client, userdata, flags, reason, props) -> None:
        code = reason.value
        self._answer_code = code
        self._answer.set()
        if code == 0:
            self.history.append(f"{self._here()}: connected (session present: {bool(flags.session_present)})")
            # A present session holds the filters it acknowledged; one never acknowledged (registered before the
            # first connection, or its SUBACK lost with a connection) is sent again either way.
            with self._lock:
                subscriptions = [(f, qos) for f, (qos, _callback, _whole) in self._subscriptions.items()
                                 if not flags.session_present or f not in self.suback_codes]
            for topic_filter, qos in subscriptions:
                self._send_subscribe([topic_filter], qos)
            self.connected.set()
            self._settled.set()
            return
        reference = getattr(props, "ServerReference", None) if props is not None else None
        self.history.append(f"{self._here()}: refused 0x{code:02X}" + (f" → {reference}" if reference else ""))
        words = f"{self._here()} refused {self.client_id!r}: {reason_words(code, reason.getName())}"
        self._causes.append((_relevance(code), words + (f", pointing to {reference}" if reference else "")))
        if code in PERMANENT_REFUSALS and self.fail_fast:
            self.failure, self._failure_code = words, code
            self._stop.set()
            self._settled.set()
            with self._subacked:
                self._subacked.notify_all()
            return
        if code in (USE_ANOTHER_SERVER, SERVER_MOVED) and reference:
            self._follow(reference)

    def _on_subscribe(self, client, userdata, mid, reason_codes, props) -> None:
        codes = [getattr(r, "value", r) for r in reason_codes]
        with self._lock:
            filters = self._suback_mids.pop(mid, None)
            if filters is None:
                self._early_subacks[mid] = codes
                return
            self._record_subacks(filters, codes)

    def _record_subacks(self, filters: list[str], codes: list[int]) -> None:
        """Under the lock."""
        for topic_filter, code in zip(filters, codes):
            self.suback_codes[topic_filter] = code
        self._subacked.notify_all()

    def _on_disconnect(self, client, userdata, flags, reason, props) -> None:
        reference = getattr(props, "ServerReference", None) if props is not None else None
        if self.connected.is_set():
            self.history.append(f"{self._here()}: disconnected 0x{reason.value:02X}"
                                + (f" → {reference}" if reference else ""))
        self.connected.clear()
        if reference:
            self._follow(reference)

    def _on_message(self, client, userdata, message) -> None:
        with self._lock:
            callbacks = [(cb, whole) for f, (_q, cb, whole) in self._subscriptions.items()
                         if cb is not None and mqtt.topic_matches_sub(f, message.topic)]
        for callback, whole in callbacks[:1]:
            if whole:
                callback(message)
            else:
                callback(message.topic, message.payload)

    def _follow(self, reference: str) -> None:
        try:
            self._redirect = parse_hosts(reference.split()[0])[0]
        except ClientError:
            self.history.append(f"ignored a server reference that is not HOST:PORT: {reference[:100]!r}")

    def _here(self) -> str:
        host = self.paho._host
        return f"{host}:{self.paho._port}"

    def _hosts_text(self) -> str:
        return ",".join(f"{h}:{p}" for h, p in self.hosts)

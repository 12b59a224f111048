"""A host-list QoS 1 publisher (paho-mqtt, MQTT 5) for handover tests and bench/handover.py.

It publishes a sequence-numbered stream one message at a time: each waits for its PUBACK; a message
whose connection dropped first is sent again on the next connection (at least once). Connecting
tries the host list in order and follows a Server Reference (CONNACK or DISCONNECT 0x9C) first.
Everything it saw is kept with CLOCK_MONOTONIC times, so a caller can measure unavailability:
the last PUBACK from one server to the first CONNACK 0 from the next.
"""

from __future__ import annotations

import dataclasses
import threading
import time

import paho.mqtt.client as mqtt

USE_ANOTHER_SERVER = 0x9C
PUBACK_WAIT_S = 3.0


class Closed(Exception):
    """The publisher was closed while a publish waited for its acknowledgement."""


@dataclasses.dataclass
class Disconnect:
    at: float
    host: str
    reason: int
    server_reference: str | None


@dataclasses.dataclass
class Connection:
    host: str
    connack_at: float
    last_puback_at: float | None = None


class HostListPublisher:
    def __init__(self, hosts: list[str], client_id: str, topic: str, *, port: int = 1883) -> None:
        self.hosts, self.client_id, self.topic, self.port = hosts, client_id, topic, port
        self.acked: list[int] = []
        self.connections: list[Connection] = []
        self.disconnects: list[Disconnect] = []
        self.refusals: list[tuple[str, int]] = []
        self._client: mqtt.Client | None = None
        self._host = ""
        self._lost = threading.Event()  # the current client's: each client sets only its own
        self._closed = threading.Event()
        self._prefer: str | None = None

    # --- connecting ---------------------------------------------------------------------

    def connect(self, timeout_s: float = 15.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not self._closed.is_set():
            order = ([self._prefer] if self._prefer else []) + [h for h in self.hosts if h != self._prefer]
            self._prefer = None
            for host in order:
                if self._try(host):
                    return
            time.sleep(0.005)
        if self._closed.is_set():
            raise Closed(f"{self.client_id}: closed while connecting")
        raise AssertionError(f"{self.client_id}: no server in {self.hosts} accepted a CONNECT within {timeout_s} s")

    def _try(self, host: str) -> bool:
        result: dict = {}
        done = threading.Event()
        # An abandoned client's late DISCONNECT (a takeover, 0x8E) must not mark its successor lost: that
        # successor would reconnect and take over in turn, and the two would ping-pong.
        lost = threading.Event()
        c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=self.client_id, protocol=mqtt.MQTTv5)

        def on_connect(cl, ud, flags, rc, props):
            result["rc"], result["ref"] = rc.value, getattr(props, "ServerReference", None)
            result["at"] = time.monotonic()
            done.set()

        def on_disconnect(cl, ud, flags, rc, props):
            if "rc" not in result:
                done.set()
                return
            self.disconnects.append(Disconnect(time.monotonic(), host, rc.value, getattr(props, "ServerReference", None)))
            lost.set()

        c.on_connect, c.on_disconnect = on_connect, on_disconnect
        try:
            c.connect(host, self.port, keepalive=30, clean_start=True)
        except OSError:
            return False
        # Wait for the CONNACK on this thread: paho's network thread would retry a refused connection
        # after its 1 s reconnect delay, and stopping it waits that long.
        deadline = time.monotonic() + 2.0
        while not done.is_set() and time.monotonic() < deadline:
            if c.loop(timeout=0.005) != mqtt.MQTT_ERR_SUCCESS and not done.is_set():
                break
        if result.get("rc") != 0:
            c.disconnect()
            if "rc" in result:
                self.refusals.append((host, result["rc"]))
                if result["rc"] == USE_ANOTHER_SERVER and result["ref"]:
                    self._prefer = result["ref"].split(":")[0]
            return False
        self._lost = lost
        c.loop_start()
        self._client, self._host = c, host
        self.connections.append(Connection(host, result["at"]))
        return True

    def _reconnect(self) -> None:
        if self._client is not None:
            old, self._client = self._client, None
            old.disconnect()  # no automatic reconnect; its thread ends on its own
            threading.Thread(target=old.loop_stop, daemon=True).start()
        last = self.disconnects[-1] if self.disconnects else None
        if last is not None and last.server_reference:
            self._prefer = last.server_reference.split(":")[0]
        self.connect()

    # --- publishing ------------------------------------------------------------------------

    def publish(self, seq: int) -> None:
        """Publish `seq` until a server acknowledges it (reconnecting through the host list as needed)."""
        while True:
            if self._closed.is_set():
                raise Closed(f"{self.client_id}: closed while publishing {seq}")
            if self._client is None or self._lost.is_set():
                self._reconnect()
            info = self._client.publish(self.topic, str(seq).encode(), qos=1)
            if info.rc not in (mqtt.MQTT_ERR_SUCCESS, mqtt.MQTT_ERR_AGAIN):
                self._lost.set()  # the server closed the connection before paho's thread told us: no error
                continue
            deadline = time.monotonic() + PUBACK_WAIT_S
            while not info.is_published() and not self._lost.is_set() and time.monotonic() < deadline:
                time.sleep(0.0005)
            if info.is_published():
                self.acked.append(seq)
                self.connections[-1].last_puback_at = time.monotonic()
                return
            self._lost.set()

    def close(self) -> None:
        """Stop: a publish under way on another thread raises Closed instead of reconnecting."""
        self._closed.set()
        if self._client is not None:
            self._client.disconnect()
            self._client.loop_stop()
            self._client = None

    def gaps_ms(self) -> list[float]:
        """Unavailability at each change of server: last PUBACK from one → first CONNACK 0 from the next."""
        out = []
        for before, after in zip(self.connections, self.connections[1:]):
            if before.host != after.host and before.last_puback_at is not None:
                out.append((after.connack_at - before.last_puback_at) * 1000)
        return out

"""Plain paho-mqtt helpers for process tests: a connected MQTT 5 client, and a persistent subscriber
"fleet" that goes offline and later resumes its session to collect what was acknowledged."""

from __future__ import annotations

import queue
import threading
import time

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties


def client(client_id: str, host: str, *, persistent: bool, max_inflight: int = 20) -> tuple[mqtt.Client, queue.Queue]:
    """A connected paho-mqtt MQTT 5 client on its loop thread, and the queue its messages arrive on."""
    got: queue.Queue = queue.Queue()
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5)
    c.max_inflight_messages_set(max_inflight)  # paho's own default is 20
    c.on_message = lambda cl, ud, msg: got.put(msg.payload)
    connected = threading.Event()
    c.on_connect = lambda cl, ud, flags, rc, props: connected.set() if rc == 0 else None
    props = Properties(PacketTypes.CONNECT)
    if persistent:
        props.SessionExpiryInterval = 3600
    c.connect(host, 1883, keepalive=30, clean_start=not persistent, properties=props)
    c.loop_start()
    if not connected.wait(5):
        # paho's loop thread would go on reconnecting, into the next test's group on the same addresses
        c.disconnect()
        c.loop_stop()
        raise AssertionError(f"{client_id}: no CONNACK from {host}")
    return c, got


def subscribe_then_go_offline(host: str) -> None:
    """The persistent subscriber "fleet" subscribes, then disconnects: its messages queue in its session."""
    sub, _ = client("fleet", host, persistent=True)
    try:
        assert sub.subscribe("cars/+/door", qos=1)[0] == mqtt.MQTT_ERR_SUCCESS
        time.sleep(0.5)  # the SUBACK (and its replication) before the subscriber goes away
    finally:
        sub.disconnect()
        sub.loop_stop()


def resume_and_collect(host: str, acknowledged: list[bytes]) -> tuple[list[bytes], list[bytes]]:
    """"fleet" resumes its session on `host`: (what it received, which acknowledged messages are missing)."""
    sub, got = client("fleet", host, persistent=True)
    received: list[bytes] = []
    deadline = time.monotonic() + 10
    try:
        while time.monotonic() < deadline and not set(acknowledged) <= set(received):
            try:
                received.append(got.get(timeout=0.5))
            except queue.Empty:
                pass
    finally:
        sub.disconnect()
        sub.loop_stop()
    return received, sorted(set(acknowledged) - set(received), key=int)

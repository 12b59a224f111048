"""MQTT over WebSockets against live groups: paho-mqtt (transport="websockets") publishing and subscribing on
8083 in 3.1.1 and 5.0, and the host-list client riding a failover over WebSockets and over TLS WebSockets
(8084), with the same assertions as over TCP (tests/harness/ride.py)."""

from __future__ import annotations

import ssl
import threading

import paho.mqtt.client as mqtt
import pytest

from pairmq.appliance.config import TlsConfig
from pairmq.appliance.roles import Role
from tests.harness.certs import make_pki
from tests.harness.group import LOOPBACK, active_group
from tests.harness.ride import ride_a_failover

P = Role.PRIMARY


def ws_client(client_id: str, version: int, context: ssl.SSLContext | None = None) -> mqtt.Client:
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=version,
                         transport="websockets")
    client.ws_set_options(path="/mqtt")
    if context is not None:
        client.tls_set_context(context)
    return client


@pytest.mark.processes
@pytest.mark.parametrize("version", [mqtt.MQTTv311, mqtt.MQTTv5])
def test_paho_publishes_and_subscribes_over_websockets(tmp_path, version):
    with active_group(tmp_path / "group") as group:
        port = group.config.ports.mqtt_ws
        got: list[tuple[str, bytes, int]] = []
        done = threading.Event()

        def on_message(client, userdata, message):
            got.append((message.topic, message.payload, message.qos))
            if len(got) == 3:
                done.set()

        sub, pub = ws_client("ws-sub", version), ws_client("ws-pub", version)
        subscribed = threading.Event()
        sub.on_message = on_message
        sub.on_subscribe = lambda *a: subscribed.set()
        sub.connect(group.address(P), port)
        sub.subscribe("ws/#", qos=1)
        sub.loop_start()
        pub.connect(group.address(P), port)
        pub.loop_start()
        try:
            assert subscribed.wait(10)
            infos = [pub.publish("ws/a", b"zero", qos=0), pub.publish("ws/b", b"one" * 20_000, qos=1),
                     pub.publish("ws/c", b"two", qos=2)]
            for info in infos:
                info.wait_for_publish(10)
                assert info.rc == mqtt.MQTT_ERR_SUCCESS
            assert done.wait(10), got
            assert sorted(got) == [("ws/a", b"zero", 0), ("ws/b", b"one" * 20_000, 1), ("ws/c", b"two", 1)]
            clients = group.api(P, "/api/v1/clients")["clients"]
            assert {c["client_id"] for c in clients} >= {"ws-sub", "ws-pub"}
        finally:
            for client in (pub, sub):
                client.loop_stop()
                client.disconnect()


@pytest.mark.processes
@pytest.mark.timeout(180)
@pytest.mark.parametrize("fault", ["kill -9", "release-activity"])
def test_the_host_list_client_over_websockets_rides_a_failover(tmp_path, fault):
    with active_group(tmp_path / "group") as group:
        ride_a_failover(group, fault, port=group.config.ports.mqtt_ws, transport="websockets")


@pytest.mark.processes
@pytest.mark.timeout(180)
def test_the_host_list_client_over_tls_websockets_rides_a_failover(tmp_path):
    pki = make_pki(tmp_path / "pki", addresses=tuple(LOOPBACK.values()))
    context = ssl.create_default_context(cafile=str(pki.ca_file))
    with active_group(tmp_path / "group", tls=TlsConfig(pki.cert_file, pki.key_file)) as group:
        ride_a_failover(group, "kill -9", port=group.config.ports.mqtt_wss, transport="websockets", tls=context)

"""S2 with real node processes: messages a publisher got PUBACK for survive kill -9 of the active,
because the active released each PUBACK only once the backup's mate link had the message.

paho-mqtt clients over loopback: a persistent subscriber goes offline, a publisher sends a QoS 1
stream to the primary, the primary is killed, and the subscriber resumes its session on the backup.
"""

from __future__ import annotations

import queue
import threading
import time

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from appliance.roles import Role
from tests.group import active_group

pytestmark = pytest.mark.processes
P, B = Role.PRIMARY, Role.BACKUP
MESSAGES = 300


def client(client_id: str, host: str, *, persistent: bool, max_inflight: int = 20) -> tuple[mqtt.Client, queue.Queue]:
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
    assert connected.wait(5), f"{client_id}: no CONNACK from {host}"
    return c, got


def subscribe_then_go_offline(host: str) -> None:
    """The persistent subscriber "fleet" subscribes, then disconnects: its messages queue in its session."""
    sub, _ = client("fleet", host, persistent=True)
    assert sub.subscribe("cars/+/door", qos=1)[0] == mqtt.MQTT_ERR_SUCCESS
    time.sleep(0.5)  # the SUBACK (and its replication) before the subscriber goes away
    sub.disconnect()
    sub.loop_stop()


def resume_and_collect(host: str, acknowledged: list[bytes]) -> tuple[list[bytes], list[bytes]]:
    """"fleet" resumes its session on `host`: (what it received, which acknowledged messages are missing)."""
    sub, got = client("fleet", host, persistent=True)
    received: list[bytes] = []
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not set(acknowledged) <= set(received):
        try:
            received.append(got.get(timeout=0.5))
        except queue.Empty:
            pass
    sub.disconnect()
    sub.loop_stop()
    return received, sorted(set(acknowledged) - set(received), key=int)


@pytest.fixture
def group(tmp_path):
    with active_group(tmp_path / "group") as g:
        yield g


def test_acknowledged_messages_survive_kill_9_of_the_active(group):
    subscribe_then_go_offline(group.address(P))

    pub, _ = client("car-7", group.address(P), persistent=False)
    acked: list[bytes] = []
    lock = threading.Lock()
    sent: dict[int, bytes] = {}
    pub.on_publish = lambda cl, ud, mid, rc, props: (lock.acquire(), acked.append(sent[mid]), lock.release())
    for i in range(MESSAGES):
        with lock:
            info = pub.publish("cars/7/door", f"{i}".encode(), qos=1)
            sent[info.mid] = f"{i}".encode()
    group.wait_for("some PUBACKs", lambda: len(acked) > MESSAGES // 3, timeout_s=10)
    group.kill(P)  # mid-stream: the rest is unacknowledged, and may or may not have been stored
    with lock:
        acknowledged = list(acked)
    pub.loop_stop()

    group.wait_for("the backup to take over", lambda: group.probe_once()[B] == 0, timeout_s=10)
    received, missing = resume_and_collect(group.address(B), acknowledged)
    print(f"{len(acknowledged)} acknowledged by the primary before kill -9, {len(received)} received from the "
          f"backup, {len(missing)} missing")
    assert not missing, f"acknowledged but lost at failover: {missing[:10]}"
    firsts = [int(x) for i, x in enumerate(received) if x not in received[:i]]
    assert firsts == sorted(firsts), "per-publisher order"


def test_the_old_primary_resyncs_as_standby_then_takes_over_with_everything(group):
    """kill -9 the primary; the backup serves more traffic; the primary restarts, resyncs from the backup
    (its unacknowledged tail, if any, discarded) and stands by in sync; kill -9 the backup: the primary
    serves every message acknowledged by either."""
    subscribe_then_go_offline(group.address(P))

    def publish(host: str, first: int, count: int) -> list[bytes]:
        pub, _ = client(f"car-{first}", host, persistent=False)
        infos = [(pub.publish("cars/7/door", f"{i}".encode(), qos=1), f"{i}".encode()) for i in range(first, first + count)]
        for info, _payload in infos:
            info.wait_for_publish(10)
        pub.disconnect()
        pub.loop_stop()
        return [payload for info, payload in infos if info.is_published()]

    acknowledged = publish(group.address(P), 0, 50)
    group.kill(P)
    group.wait_for("the backup to take over", lambda: group.probe_once()[B] == 0, timeout_s=10)
    acknowledged += publish(group.address(B), 50, 50)
    group.start(P)
    group.wait_for("the old primary to resync and stand by in sync", lambda: any(
        "in sync with backup" in d["reason"] for d in group.decisions(P, "sync")), timeout_s=20)
    acknowledged += publish(group.address(B), 100, 50)
    time.sleep(0.5)
    group.kill(B)
    group.wait_for("the primary to take over again", lambda: group.probe_once()[P] == 0, timeout_s=10)

    received, missing = resume_and_collect(group.address(P), acknowledged)
    print(f"{len(acknowledged)} acknowledged across two failovers and a resync, {len(received)} received, "
          f"{len(missing)} missing")
    assert len(acknowledged) == 150 and not missing, f"lost: {missing[:10]}"

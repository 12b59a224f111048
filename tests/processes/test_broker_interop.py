"""The rig the `test_broker_interop_*` modules share (this module holds no tests).

Each of those modules runs one real group (the module-scoped `group` fixture;
the primary is active and serves MQTT on 127.0.0.1:1883) and drives it with
real clients: paho-mqtt (3.1.1 and 5.0) through `Paho`, mosquitto_pub/sub
through `mosquitto`, and `Raw`, MQTT written by hand on a socket for what paho
hides or refuses: DUP and packet ids, alias-only PUBLISHes, not acking,
invalid filters.

Waits are on events: a paho callback, a raw packet, a subprocess exit. "Nothing
arrived" is shown with a barrier instead of a sleep: a marker published after
the fact (it arrives behind anything routed before it), or, on a raw socket, a
PINGREQ whose PINGRESP comes behind anything the broker already wrote. Markers
go at QoS 2: paho hands a QoS 2 message to the application only at its PUBREL,
so a QoS 1 marker could overtake it. A raw barrier only covers what the broker
had written: what an ack of ours lets out waits for that ack's commit, so it is
waited for as a packet first. Only the time-based features (keep alive, will
delay, message expiry) wait on the clock.
"""

from __future__ import annotations

import queue
import re
import subprocess
import threading
import uuid
from dataclasses import dataclass, field

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

from tests.harness.group import active_group
from tests.harness.mqttraw import (  # noqa: F401  (re-exported for the test_broker_interop_* modules)
    CONNACK, DISCONNECT, HOST, PINGRESP, PORT, PUBACK, PUBCOMP, PUBLISH, PUBREC, PUBREL, SUBACK, UNSUBACK, V5, V311,
    WAIT_S, Raw, RawPacket,
)

VERSIONS = pytest.mark.parametrize("version", [V311, V5], ids=["v311", "v5"])


@pytest.fixture(scope="module")
def group(tmp_path_factory):
    """One group for the whole module; the primary is active and serves MQTT on 127.0.0.1:1883."""
    with active_group(tmp_path_factory.mktemp("interop") / "group") as g:
        yield g


@pytest.fixture
def topic(request, group) -> str:
    """A topic (and client id prefix) no other test uses."""
    name = re.sub(r"[^A-Za-z0-9_-]", "_", request.node.name)[:40]
    return f"interop/{name}/{uuid.uuid4().hex[:8]}"


def cid(topic: str, who: str) -> str:
    return f"{topic.split('/', 2)[2]}-{who}"


# --- paho ---------------------------------------------------------------------------------


def props(packet_type: int, **values) -> Properties:
    p = Properties(packet_type)
    for name, value in values.items():
        setattr(p, name, value)
    return p


@dataclass
class Received:
    topic: str
    payload: bytes
    qos: int
    retain: bool
    properties: dict = field(default_factory=dict)


class Paho:
    """A paho client on its own loop thread; every reply is waited for, never slept for."""

    def __init__(self, client_id: str = "", *, version: int = V5, clean: bool = True, expiry_s: int | None = None,
                 keepalive: int = 60, will: dict | None = None, connect_props: dict | None = None) -> None:
        self.version = version
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id,
                                  protocol=mqtt.MQTTv5 if version == V5 else mqtt.MQTTv311,
                                  clean_session=None if version == V5 else clean, reconnect_on_failure=False)
        self.messages: queue.Queue[Received] = queue.Queue()
        self.disconnects: queue.Queue = queue.Queue()
        self._connack: queue.Queue = queue.Queue()
        self._acks: dict[int, tuple] = {}
        self._acked = threading.Condition()
        c = self.client
        c.on_connect = lambda _c, _u, flags, rc, p: self._connack.put((flags.session_present, rc.value, p))
        c.on_disconnect = lambda _c, _u, _f, rc, p: self.disconnects.put((rc.value, p))
        c.on_message = lambda _c, _u, m: self.messages.put(
            Received(m.topic, m.payload, m.qos, bool(m.retain), _props_dict(getattr(m, "properties", None))))
        c.on_publish = lambda _c, _u, mid, rc, p: self._ack(mid, (rc.value, p))
        c.on_subscribe = lambda _c, _u, mid, rcs, p: self._ack(mid, ([r.value for r in rcs], p))
        c.on_unsubscribe = lambda _c, _u, mid, rcs, p: self._ack(mid, ([r.value for r in rcs], p))
        if will is not None:
            c.will_set(**will)
        if version == V5:
            cp = dict(connect_props or {})
            if expiry_s is not None:
                cp["SessionExpiryInterval"] = expiry_s
            c.connect(HOST, PORT, keepalive, clean_start=clean,
                      properties=props(PacketTypes.CONNECT, **cp) if cp else None)
        else:
            c.connect(HOST, PORT, keepalive)
        c.loop_start()
        self.session_present, self.reason_code, self.connack_props = self._connack.get(timeout=WAIT_S)
        assert self.reason_code == 0, f"CONNACK 0x{self.reason_code:02X}"

    def _ack(self, mid: int, result: tuple) -> None:
        with self._acked:
            self._acks[mid] = result
            self._acked.notify_all()

    def _wait_ack(self, mid: int) -> tuple:
        with self._acked:
            assert self._acked.wait_for(lambda: mid in self._acks, WAIT_S), f"no ack for mid {mid}"
            return self._acks.pop(mid)

    def subscribe(self, *filters, qos: int = 1, options: SubscribeOptions | None = None,
                  sub_id: int | None = None) -> list[int]:
        """SUBSCRIBE and wait for the SUBACK: its codes."""
        p = props(PacketTypes.SUBSCRIBE, SubscriptionIdentifier=sub_id) if sub_id else None
        if options is not None:
            topics = [(f, options) for f in filters]
        else:
            topics = [(f, qos) for f in filters]
        rc, mid = self.client.subscribe(topics, properties=p)
        assert rc == mqtt.MQTT_ERR_SUCCESS
        return self._wait_ack(mid)[0]

    def unsubscribe(self, *filters) -> list[int]:
        rc, mid = self.client.unsubscribe(list(filters))
        assert rc == mqtt.MQTT_ERR_SUCCESS
        codes = self._wait_ack(mid)[0]
        return codes

    def publish(self, topic: str, payload: bytes | str = b"", qos: int = 0, retain: bool = False,
                **properties) -> tuple[int, object]:
        """PUBLISH; for QoS 1/2 wait for the broker's ack: (reason code, its properties)."""
        p = props(PacketTypes.PUBLISH, **properties) if properties else None
        info = self.client.publish(topic, payload, qos, retain, properties=p)
        assert info.rc == mqtt.MQTT_ERR_SUCCESS
        return self._wait_ack(info.mid)

    def get(self, timeout_s: float = WAIT_S) -> Received:
        try:
            return self.messages.get(timeout=timeout_s)
        except queue.Empty:
            raise AssertionError(f"no message within {timeout_s} s") from None

    def until(self, marker_topic: str) -> list[Received]:
        """Every message received before the first one on `marker_topic` (which must come)."""
        out = []
        while (m := self.get()).topic != marker_topic:
            out.append(m)
        return out

    def disconnect(self) -> None:
        """DISCONNECT, and wait until the broker has handled it: it closes the connection then.

        (paho closes its socket at once; a duplicate of it keeps the connection open to see the
        broker's FIN. Without that wait, a reconnect with the same client id may reach the broker
        first and take the session over instead of finding it ended.)
        """
        witness = self.client.socket().dup()
        try:
            self.client.disconnect()
            self.client.loop_stop()
            witness.settimeout(WAIT_S)
            try:
                while witness.recv(65536):
                    pass
            except ConnectionResetError:
                pass
        finally:
            witness.close()

    def stop(self) -> None:
        """The fixture's teardown: disconnect whatever a test left connected (which also wakes the loop)."""
        if self.client.is_connected():
            self.client.disconnect()
        self.client.loop_stop()


def _props_dict(p) -> dict:
    if p is None:
        return {}
    attributes = vars(p)  # paho keeps each property it received as an attribute named like "ContentType"
    return {key: attributes[key] for key in (name.replace(" ", "") for name in p.names) if key in attributes}


@pytest.fixture
def clients():
    """Make paho clients; whatever a test leaves connected is cut at teardown."""
    made: list[Paho] = []

    def make(*args, **kwargs) -> Paho:
        client = Paho(*args, **kwargs)
        made.append(client)
        return client

    yield make
    for client in made:
        client.stop()


# --- a raw-socket client --------------------------------------------------------------------
# --- a raw-socket client (tests/harness/mqttraw.py) -----------------------------------------------

@pytest.fixture
def raws():
    made: list[Raw] = []

    def make(version: int = V5) -> Raw:
        made.append(Raw(version))
        return made[-1]

    yield make
    for r in made:
        r.close()


# --- mosquitto ----------------------------------------------------------------------------


def mosquitto(tool: str, version: int, *args: str, timeout_s: float = 10) -> subprocess.CompletedProcess:
    argv = [tool, "-h", HOST, "-p", str(PORT), "-V", "mqttv5" if version == V5 else "mqttv311", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)


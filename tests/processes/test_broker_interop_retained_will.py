"""Interop against a real group: retained messages and wills (immediate, suppressed, delayed).

Shared rig and clients: tests/processes/test_broker_interop.py.
"""

from __future__ import annotations

import selectors
import signal
import subprocess
import time

from tests.processes.test_broker_interop import (  # noqa: F401  (group, topic, clients, raws are fixtures)
    HOST, PORT, V5, VERSIONS, WAIT_S, cid, clients, group, mosquitto, raws, topic,
)


# === retained ==================================================================================


@VERSIONS
def test_retained_set_replace_and_delete_with_mosquitto(clients, topic, version):
    def pub(*args: str) -> None:
        done = mosquitto("mosquitto_pub", version, "-t", topic, "-r", "-q", "1", *args)
        assert done.returncode == 0, done.stderr

    def first_retained() -> str:
        got = mosquitto("mosquitto_sub", version, "-t", topic, "-q", "2", "-C", "1", "-W", "5", "-F", "%r %q %p")
        assert got.returncode == 0, got.stderr
        return got.stdout.strip()

    pub("-m", "one")
    assert first_retained() == "1 1 one"
    pub("-m", "two")
    assert first_retained() == "1 1 two", "a retained message replaces the previous one"
    pub("-n")  # an empty retained message deletes it
    sub = clients(cid(topic, "late"), version=version)
    sub.subscribe(topic, qos=1)
    sub.subscribe(f"{topic}/marker", qos=2)
    clients(cid(topic, "marker"), version=version).publish(f"{topic}/marker", b"", qos=2)
    assert sub.until(f"{topic}/marker") == [], "nothing retained any more"


@VERSIONS
def test_retained_message_goes_out_at_the_lower_of_its_qos_and_the_subscriptions(clients, topic, version):
    pub = clients(cid(topic, "pub"), version=version)
    pub.publish(topic, b"kept at qos 1", qos=1, retain=True)
    try:
        for sub_qos, expected in ((2, 1), (0, 0)):
            sub = clients(cid(topic, f"q{sub_qos}"), version=version)
            sub.subscribe(topic, qos=sub_qos)
            got = sub.get()
            assert (got.payload, got.qos, got.retain) == (b"kept at qos 1", expected, True)
    finally:
        pub.publish(topic, b"", qos=1, retain=True)


# === wills =====================================================================================


def _will(topic: str, *, delay_s: int | None = None, qos: int = 1, retain: bool = False) -> tuple:
    will_props = [(0x18, delay_s)] if delay_s is not None else []
    return (f"{topic}/will", b"gone: " + topic.encode(), qos, retain, will_props)


def _connect_with_will(raw, topic: str, who: str, will: tuple | None, *, session_expiry_s: int = 0, clean: bool = True):
    props = [(0x11, session_expiry_s)] if raw.version == V5 and session_expiry_s else []
    connack = raw.connect(cid(topic, who), clean=clean, properties=props, will=will)
    assert connack.reason_and_props()[0] == 0
    return connack


@VERSIONS
def test_will_published_when_the_connection_drops(clients, raws, topic, version):
    watcher = clients(cid(topic, "watcher"), version=version)
    watcher.subscribe(f"{topic}/#", qos=2)
    raw = raws(version)
    _connect_with_will(raw, topic, "mortal", _will(topic, qos=2))
    raw.close()  # no DISCONNECT
    got = watcher.get()
    assert (got.topic, got.payload, got.qos) == (f"{topic}/will", b"gone: " + topic.encode(), 2)


@VERSIONS
def test_will_published_when_mosquitto_sub_is_killed(clients, topic, version):
    """mosquitto_sub with a will, told apart from "still connecting" by a retained "ready" it prints."""
    watcher = clients(cid(topic, "watcher"), version=version)
    watcher.subscribe(f"{topic}/will", qos=1)
    watcher.publish(f"{topic}/ready", b"ready", qos=1, retain=True)
    argv = ["mosquitto_sub", "-h", HOST, "-p", str(PORT), "-V", "mqttv5" if version == V5 else "mqttv311",
            "-i", cid(topic, "msub"), "-t", f"{topic}/ready", "--will-topic", f"{topic}/will",
            "--will-payload", "killed", "--will-qos", "1"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            assert sel.select(WAIT_S), "mosquitto_sub never printed the retained 'ready'"
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGKILL)
        proc.wait(WAIT_S)
        got = watcher.get()
        assert (got.topic, got.payload, got.qos) == (f"{topic}/will", b"killed", 1)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(WAIT_S)
        watcher.publish(f"{topic}/ready", b"", qos=1, retain=True)


@VERSIONS
def test_no_will_after_a_clean_disconnect(clients, raws, topic, version):
    watcher = clients(cid(topic, "watcher"), version=version)
    watcher.subscribe(f"{topic}/#", qos=1)
    raw = raws(version)
    _connect_with_will(raw, topic, "polite", _will(topic))
    raw.disconnect()
    assert raw.closed() == [], "the broker closes after a DISCONNECT (having handled it)"
    clients(cid(topic, "marker"), version=version).publish(f"{topic}/marker", b"", qos=2)
    assert watcher.until(f"{topic}/marker") == []


def test_v5_disconnect_with_will_message_publishes_the_will(clients, raws, topic):
    watcher = clients(cid(topic, "watcher"), version=V5)
    watcher.subscribe(f"{topic}/#", qos=1)
    raw = raws(V5)
    _connect_with_will(raw, topic, "asks", _will(topic))
    raw.send(0xE0, b"\x04")  # DISCONNECT 0x04: Disconnect with Will Message
    assert raw.closed() == []
    assert watcher.get().topic == f"{topic}/will"


def test_v5_will_delay(clients, raws, topic):
    watcher = clients(cid(topic, "watcher"), version=V5)
    watcher.subscribe(f"{topic}/#", qos=1)
    marker = clients(cid(topic, "marker"), version=V5)
    raw = raws(V5)
    _connect_with_will(raw, topic, "delayed", _will(topic, delay_s=2), session_expiry_s=300)
    raw.close()
    dropped = time.monotonic()
    marker.publish(f"{topic}/marker", b"", qos=2)
    assert watcher.until(f"{topic}/marker") == [], "not at once"
    got = watcher.get(timeout_s=10)
    waited = time.monotonic() - dropped
    assert got.topic == f"{topic}/will"
    assert waited >= 1.9, f"will after {waited:.2f} s, before its 2 s delay"  # never early


def test_v5_will_delay_cancelled_by_reconnecting(clients, raws, topic):
    watcher = clients(cid(topic, "watcher"), version=V5)
    watcher.subscribe(f"{topic}/#", qos=1)
    first = raws(V5)
    _connect_with_will(first, topic, "returns", _will(topic, delay_s=1), session_expiry_s=300)
    first.close()
    again = raws(V5)
    assert _connect_with_will(again, topic, "returns", None, session_expiry_s=300, clean=False).body[0] == 1
    time.sleep(2.2)  # past the will delay and two broker ticks: the cancelled will must not appear
    clients(cid(topic, "marker"), version=V5).publish(f"{topic}/marker", b"", qos=2)
    assert watcher.until(f"{topic}/marker") == []


def test_v5_will_delay_cut_short_by_session_expiry(clients, raws, topic):
    watcher = clients(cid(topic, "watcher"), version=V5)
    watcher.subscribe(f"{topic}/#", qos=1)
    raw = raws(V5)
    _connect_with_will(raw, topic, "short", _will(topic, delay_s=60), session_expiry_s=1)
    raw.close()
    got = watcher.get(timeout_s=20)  # the will goes when the session ends, well before its 60 s delay
    assert got.topic == f"{topic}/will"

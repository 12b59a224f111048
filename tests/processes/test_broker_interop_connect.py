"""Interop against a real group: CONNECT/CONNACK, keep alive, takeover, clean start, session expiry.

Shared rig and clients: tests/processes/test_broker_interop.py.
"""

from __future__ import annotations

import time

from tests.processes.test_broker_interop import (  # noqa: F401  (group, topic, clients, raws are fixtures)
    DISCONNECT, V5, V311, VERSIONS, WAIT_S, cid, clients, group, raws, topic,
)


# === CONNECT / CONNACK ========================================================================


def test_v5_empty_client_id_gets_an_assigned_one(clients, topic):
    first = clients("", version=V5)
    second = clients("", version=V5)
    a = first.connack_props.AssignedClientIdentifier
    b = second.connack_props.AssignedClientIdentifier
    assert a and b and a != b
    # The assigned id is a real session: it routes.
    first.subscribe(topic, qos=1)
    second.publish(topic, b"to the assigned id", qos=1)
    assert first.get().payload == b"to the assigned id"


def test_v311_empty_client_id_clean_session_is_accepted_and_without_clean_session_refused(raws, topic):
    assert raws(V311).connect("", clean=True).body == b"\x00\x00"
    refused = raws(V311)
    assert refused.connect("", clean=False).body == b"\x00\x02", "identifier rejected"
    assert refused.closed() == []


@VERSIONS
def test_session_present_flag_on_resume(clients, topic, version):
    client_id = cid(topic, "resume")
    first = clients(client_id, version=version, clean=False, expiry_s=300)
    assert first.session_present is False
    first.subscribe(topic, qos=1)
    first.disconnect()
    resumed = clients(client_id, version=version, clean=False, expiry_s=300)
    assert resumed.session_present is True
    resumed.disconnect()
    fresh = clients(client_id, version=version, clean=True, expiry_s=0)
    assert fresh.session_present is False


@VERSIONS
def test_keep_alive_is_enforced_at_one_and_a_half_times(raws, topic, version):
    raw = raws(version)
    assert raw.connect(cid(topic, "silent"), keepalive=1).body[1] == 0
    started = time.monotonic()
    last = raw.closed(timeout_s=5)
    took = time.monotonic() - started
    assert took >= 1.0, f"dropped after {took:.2f} s, before the keep alive had passed"  # never early; the exact deadline is the listener's unit test
    if version == V5:
        assert [p.type for p in last] == [DISCONNECT] and last[0].reason_and_props()[0] == 0x8D
    else:
        assert last == []


def test_keep_alive_pings_keep_the_connection(raws, topic):
    raw = raws(V5)
    raw.connect(cid(topic, "pinger"), keepalive=1)
    for _ in range(3):
        time.sleep(0.7)  # inside the 1.5 s window: the client's own ping schedule
        assert raw.barrier() == []


@VERSIONS
def test_session_takeover(clients, topic, version):
    client_id = cid(topic, "twin")
    first = clients(client_id, version=version, clean=False, expiry_s=300)
    first.subscribe(topic, qos=1)
    second = clients(client_id, version=version, clean=False, expiry_s=300)
    assert second.session_present is True, "the session moves to the new connection"
    reason, _ = first.disconnects.get(timeout=WAIT_S)
    if version == V5:
        assert reason == 0x8E, f"expected Session taken over, got 0x{reason:02X}"
    second.publish(topic, b"to the new connection", qos=1)
    assert second.get().payload == b"to the new connection"
    assert first.messages.empty()


# === clean session / clean start and session expiry =========================================


@VERSIONS
def test_persistent_session_gets_qos1_and_qos2_published_while_offline(clients, topic, version):
    client_id = cid(topic, "away")
    sub = clients(client_id, version=version, clean=False, expiry_s=300)
    assert sub.subscribe(f"{topic}/#", qos=2) == [2]
    sub.disconnect()
    pub = clients(version=version)
    assert pub.publish(f"{topic}/one", b"q1", qos=1)[0] == 0
    assert pub.publish(f"{topic}/two", b"q2", qos=2)[0] == 0
    back = clients(client_id, version=version, clean=False, expiry_s=300)
    assert back.session_present is True
    got = [back.get(), back.get()]
    assert [(m.topic, m.payload, m.qos) for m in got] == [(f"{topic}/one", b"q1", 1), (f"{topic}/two", b"q2", 2)]


@VERSIONS
def test_clean_start_discards_the_session(clients, topic, version):
    client_id = cid(topic, "forgetful")
    sub = clients(client_id, version=version, clean=False, expiry_s=300)
    sub.subscribe(topic, qos=1)
    sub.disconnect()
    pub = clients(version=version)
    pub.publish(topic, b"queued for the old session", qos=1)
    fresh = clients(client_id, version=version, clean=True, expiry_s=300)
    assert fresh.session_present is False
    fresh.subscribe(f"{topic}/marker", qos=2)
    pub.publish(topic, b"the old subscription is gone too", qos=1)
    pub.publish(f"{topic}/marker", b"", qos=2)
    assert fresh.until(f"{topic}/marker") == []


def test_v5_session_expiry_zero_ends_the_session_at_disconnect(clients, topic):
    client_id = cid(topic, "brief")
    sub = clients(client_id, version=V5, clean=False, expiry_s=0)
    sub.subscribe(topic, qos=1)
    sub.disconnect()
    again = clients(client_id, version=V5, clean=False, expiry_s=300)
    assert again.session_present is False


def test_v5_session_expiry_interval_ends_an_offline_session(clients, raws, topic):
    """The session's end is seen as its will (delay 60 s, cut short by Session Expiry 1 s): then it is gone."""
    watcher = clients(cid(topic, "watcher"), version=V5)
    watcher.subscribe(f"{topic}/will", qos=1)
    client_id = cid(topic, "short")
    raw = raws(V5)
    raw.connect(client_id, clean=False, properties=[(0x11, 1)],
                will=(f"{topic}/will", b"session over", 1, False, [(0x18, 60)]))
    raw.subscribe(1, topic, 1)
    raw.close()
    assert watcher.get().payload == b"session over"
    back = clients(client_id, version=V5, clean=False, expiry_s=300)
    assert back.session_present is False
    back.subscribe(f"{topic}/marker", qos=2)
    watcher.publish(topic, b"to the expired subscription", qos=1)
    watcher.publish(f"{topic}/marker", b"", qos=2)
    assert back.until(f"{topic}/marker") == []


def test_v5_session_expiry_beyond_the_limit_is_capped_in_connack(clients, topic):
    month = clients(cid(topic, "month"), version=V5, clean=True, expiry_s=30 * 24 * 3600)
    assert month.connack_props.SessionExpiryInterval == 7 * 24 * 3600
    asked = clients(cid(topic, "hour"), version=V5, clean=True, expiry_s=3600)
    assert not hasattr(asked.connack_props, "SessionExpiryInterval"), "granted as asked: not repeated"


def test_v5_connack_announces_the_brokers_limits(clients, topic):
    p = clients(cid(topic, "curious"), version=V5).connack_props
    assert (p.ReceiveMaximum, p.TopicAliasMaximum, p.MaximumPacketSize) == (100, 64, 1024 * 1024)

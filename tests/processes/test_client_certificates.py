"""TLS client certificates against a live group: [tls] require_certificate, ca_file and
use_identity_as_username = "cn". mosquitto_pub authenticates by certificate on 8883 (the CN becomes the user
name, its ACL applies, a password sent with it changes nothing); a certificate from another CA, none at all, and
a certificate whose identity is no user are refused; paho over TLS WebSockets (8084) is authenticated the same
way. The CAs and certificates are made here with `cryptography` (tests/harness/certs.py)."""

from __future__ import annotations

import os
import re
import queue
import ssl
import subprocess
import uuid

import paho.mqtt.client as mqtt
import pytest

from pairmq.appliance.broker.access import AccessPolicy, Action, Effect, Rule, hash_password
from pairmq.appliance.config import TlsConfig
from pairmq.appliance.roles import Role
from tests.harness.certs import ClientCa, make_pki
from tests.harness.group import LOOPBACK, Group

P = Role.PRIMARY
RULES = (("allow", "both", "alice/#", "user:alice"), ("allow", "subscribe", "#", "user:watcher"))
WAIT_S = 10


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    directory = tmp_path_factory.mktemp("certs")
    server = make_pki(directory / "server", tuple(LOOPBACK.values()))
    clients, rogue = ClientCa(directory / "clients"), ClientCa(directory / "rogue", "Someone else's CA")
    return {"server": server, "clients": clients, "alice": clients.issue("alice"),
            "mallory": clients.issue("mallory"), "rogue alice": rogue.issue("alice")}


@pytest.fixture(scope="module")
def group(tmp_path_factory, pki):
    users = {name: hash_password(f"{name}-pw".encode(), os.urandom(16)) for name in ("alice", "watcher")}
    policy = AccessPolicy(False, users, tuple(Rule(Effect(e), Action(a), f, w) for e, a, f, w in RULES))
    server = pki["server"]
    tls = TlsConfig(server.cert_file, server.key_file, require_certificate=True, ca_file=pki["clients"].ca_file,
                    use_identity_as_username="cn")
    with Group(tmp_path_factory.mktemp("certs-group") / "group", access=policy, tls=tls) as g:
        g.start()
        g.wait_for("the primary to serve", lambda: g.serving(P), timeout_s=20)
        yield g


@pytest.fixture
def watcher(group):
    """A subscriber to everything, on 1883 with a password (no certificate there)."""
    messages: queue.Queue = queue.Queue()
    subscribed = queue.Queue()
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"watcher-{uuid.uuid4().hex[:6]}")
    c.username_pw_set("watcher", "watcher-pw")
    c.on_message = lambda _c, _u, m: messages.put((m.topic, m.payload))
    c.on_subscribe = lambda *a: subscribed.put(True)
    c.connect(group.address(P), group.config.ports.mqtt)
    c.subscribe("#", 1)
    c.loop_start()
    subscribed.get(timeout=WAIT_S)
    yield messages
    c.loop_stop()
    c.disconnect()


def mosquitto_pub(group, pki, who: str | None, topic: str, *extra: str) -> subprocess.CompletedProcess:
    command = ["mosquitto_pub", "-h", group.address(P), "-p", str(group.config.ports.mqtt_tls),
               "--cafile", str(pki["server"].ca_file), "-t", topic, "-m", f"from {who}", "-q", "1", "-V", "mqttv5",
               *extra]
    if who is not None:
        cert, key = pki[who]
        command += ["--cert", str(cert), "--key", str(key)]
    return subprocess.run(command, capture_output=True, text=True, timeout=30)


def drain(messages: queue.Queue, timeout_s: float = 1.0) -> list[tuple[str, bytes]]:
    out = []
    try:
        while True:
            out.append(messages.get(timeout=timeout_s))
    except queue.Empty:
        return out


@pytest.mark.processes
def test_mosquitto_pub_is_authenticated_by_its_certificate_and_the_identitys_acl_applies(group, pki, watcher):
    allowed = mosquitto_pub(group, pki, "alice", "alice/door")
    assert allowed.returncode == 0, allowed.stderr
    denied = mosquitto_pub(group, pki, "alice", "bob/door")  # alice's ACL has no bob/#: PUBACK 0x87
    assert "not authorized" in (denied.stdout + denied.stderr).lower(), denied
    # A user name and password sent with the certificate change nothing: the certificate's CN is the user.
    posing = mosquitto_pub(group, pki, "alice", "alice/posing", "-u", "watcher", "-P", "wrong")
    assert posing.returncode == 0, posing.stderr
    assert sorted(drain(watcher)) == [("alice/door", b"from alice"), ("alice/posing", b"from alice")]
    group.wait_for("the ACL refusal in the event log", lambda: any(
        e["event"] == "access_denied" and e.get("publish_not_authorized") for e in group.events(P)))


@pytest.mark.processes
def test_a_certificate_whose_identity_is_not_a_user_is_refused(group, pki, watcher):
    result = mosquitto_pub(group, pki, "mallory", "alice/door")
    assert result.returncode != 0
    assert "not authori" in (result.stdout + result.stderr).lower(), result
    assert drain(watcher) == []
    group.wait_for("a client_refused event naming the identity", lambda: any(
        e["event"] == "client_refused" and "mallory" in e.get("reason", "") for e in group.events(P)))


@pytest.mark.processes
@pytest.mark.parametrize("who", ["rogue alice", None], ids=["another CA", "no certificate"])
def test_a_certificate_from_another_ca_or_none_fails_the_tls_handshake(group, pki, watcher, who):
    result = mosquitto_pub(group, pki, who, "alice/door")
    assert result.returncode != 0
    assert drain(watcher) == []
    reason = "certificate verify failed" if who else "did not return a certificate"
    group.wait_for("a tls_refused event with the peer and the reason", lambda: any(
        e["event"] == "tls_refused" and reason in e["reason"].lower() and re.fullmatch(r"127\.[0-9.]+:[0-9]+", e["peer"])
        for e in group.events(P)))
    group.wait_for("the summed tls_handshake_failed event", lambda: any(
        e["event"] == "tls_handshake_failed" and reason in e["last_reason"].lower() for e in group.events(P)))


@pytest.mark.processes
def test_paho_over_tls_websockets_is_authenticated_by_its_certificate(group, pki, watcher):
    context = ssl.create_default_context(cafile=str(pki["server"].ca_file))
    cert, key = pki["alice"]
    context.load_cert_chain(str(cert), str(key))
    connacks: queue.Queue = queue.Queue()
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="alice-browser", protocol=mqtt.MQTTv5,
                    transport="websockets")
    c.ws_set_options(path="/mqtt")
    c.tls_set_context(context)
    c.on_connect = lambda _c, _u, flags, rc, p: connacks.put(rc.value)
    c.connect(group.address(P), group.config.ports.mqtt_wss)
    c.loop_start()
    try:
        assert connacks.get(timeout=WAIT_S) == 0
        c.publish("alice/wss", b"over 8084", qos=1).wait_for_publish(WAIT_S)
        c.publish("elsewhere/wss", b"denied", qos=1).wait_for_publish(WAIT_S)
        assert drain(watcher) == [("alice/wss", b"over 8084")]
    finally:
        c.loop_stop()
        c.disconnect()

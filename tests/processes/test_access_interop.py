"""Authentication, ACLs and TLS against a real group, with paho-mqtt (3.1.1, 5.0) and mosquitto_pub/sub.

One group for the module: the primary serves MQTT on 127.0.0.1:1883 and, with
a certificate from a test CA made here, MQTT over TLS on 127.0.0.1:8883. Its
configuration holds two users and this ACL (first match wins):

    0 deny  publish   secret/#  all
    1 allow both      alice/#   user:alice
    2 allow subscribe public/#  all
    3 allow publish   public/#  users
    4 allow subscribe secret/#  user:bob

Anonymous clients are refused, except in the tests that switch that on (and
off again) through the configuration API on the active (config-sync).
"""

from __future__ import annotations

import asyncio
import os
import queue
import signal
import socket
import ssl
import struct
import subprocess
import time
import uuid

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from pairmq.appliance.broker.access import AccessPolicy, Action, Effect, Rule, hash_password
from pairmq.appliance.roles import Role
from tests.harness import config_api
from tests.harness.certs import make_pki
from tests.harness.group import LOOPBACK, Group

HOST, PORT, TLS_PORT = LOOPBACK[Role.PRIMARY], 1883, 8883
WAIT_S = 5.0
V311, V5 = 4, 5
VERSIONS = pytest.mark.parametrize("version", [V311, V5], ids=["v311", "v5"])
PASSWORDS = {"alice": "alice-pw", "bob": "bob-pw"}
RULES = (("deny", "publish", "secret/#", "all"), ("allow", "both", "alice/#", "user:alice"),
         ("allow", "subscribe", "public/#", "all"), ("allow", "publish", "public/#", "users"),
         ("allow", "subscribe", "secret/#", "user:bob"))


def the_policy(anonymous: bool = False) -> AccessPolicy:
    users = {name: hash_password(pw.encode(), os.urandom(16)) for name, pw in PASSWORDS.items()}
    return AccessPolicy(anonymous, users, tuple(Rule(Effect(e), Action(a), f, w) for e, a, f, w in RULES))


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"), (LOOPBACK[Role.PRIMARY], LOOPBACK[Role.BACKUP]))


@pytest.fixture(scope="module")
def group(tmp_path_factory, pki):
    from pairmq.appliance.config import TlsConfig

    with Group(tmp_path_factory.mktemp("access") / "group", access=the_policy(),
               tls=TlsConfig(pki.cert_file, pki.key_file)) as g:
        g.start()
        g.wait_for("the primary to serve", lambda: _serving(g), timeout_s=20)
        yield g


def _serving(g: Group) -> bool:
    try:
        view = node_view(g)
    except OSError:
        return False
    return view["serving"]


def node_view(g: Group) -> dict:
    return g.api(Role.PRIMARY, "/api/v1/redundancy")


def set_policy(g: Group, policy: AccessPolicy) -> None:
    """Replace the access policy on the active primary (config-sync); it is in force when this returns."""
    config_api.set_policy(g, policy)


@pytest.fixture
def topic_id():
    return uuid.uuid4().hex[:8]


# --- paho ----------------------------------------------------------------------------------


class Client:
    """paho on its loop thread; connect() returns the CONNACK code instead of asserting on it."""

    def __init__(self, version: int, *, user: str | None = None, password: str | None = None,
                 port: int = PORT, ca_file=None, will: dict | None = None) -> None:
        self.version = version
        self.c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"acc-{uuid.uuid4().hex[:10]}",
                             protocol=mqtt.MQTTv5 if version == V5 else mqtt.MQTTv311, reconnect_on_failure=False)
        if user is not None:
            self.c.username_pw_set(user, password)
        if ca_file is not None:
            self.c.tls_set(ca_certs=str(ca_file))
        if will is not None:
            self.c.will_set(**will)
        self.port = port
        self.connacks, self.messages, self.acks = queue.Queue(), queue.Queue(), queue.Queue()
        self.disconnects = queue.Queue()
        self.c.on_disconnect = lambda _c, _u, flags, rc, p: self.disconnects.put(rc.value)
        self.c.on_connect = lambda _c, _u, flags, rc, p: self.connacks.put((rc.value, p))
        self.c.on_message = lambda _c, _u, m: self.messages.put((m.topic, m.payload))
        self.c.on_publish = lambda _c, _u, mid, rc, p: self.acks.put((mid, rc.value))
        self.c.on_subscribe = lambda _c, _u, mid, rcs, p: self.acks.put((mid, [r.value for r in rcs]))

    def connect(self) -> tuple[int, object]:
        self.c.connect(HOST, self.port, 30)
        self.c.loop_start()
        try:
            return self.connacks.get(timeout=WAIT_S)
        except queue.Empty:
            raise AssertionError("no CONNACK") from None

    def publish(self, topic: str, payload: bytes, qos: int) -> int:
        info = self.c.publish(topic, payload, qos)
        mid, code = self.acks.get(timeout=WAIT_S)
        assert mid == info.mid
        return code

    def subscribe(self, *filters: str, qos: int = 1) -> list[int]:
        _rc, mid = self.c.subscribe([(f, qos) for f in filters])
        got, codes = self.acks.get(timeout=WAIT_S)
        assert got == mid
        return codes

    def received_until(self, marker: str) -> list[str]:
        out = []
        while True:
            try:
                t, _payload = self.messages.get(timeout=WAIT_S)
            except queue.Empty:
                raise AssertionError(f"the marker {marker} never came; got {out}") from None
            if t == marker:
                return out
            out.append(t)

    def stop(self) -> None:
        self.c.disconnect()
        self.c.loop_stop()


@pytest.fixture
def clients():
    made = []

    def make(*args, **kwargs) -> Client:
        client = Client(*args, **kwargs)
        made.append(client)
        return client

    yield make
    for client in made:
        client.stop()


# --- logging in ------------------------------------------------------------------------------


@VERSIONS
def test_good_login(group, clients, version):
    assert clients(version, user="alice", password="alice-pw").connect()[0] == 0


@VERSIONS
@pytest.mark.parametrize("user, password", [("alice", "wrong"), ("alice", ""), ("nobody", "alice-pw")])
def test_bad_user_name_or_password(group, clients, version, user, password):
    assert clients(version, user=user, password=password).connect()[0] == 0x86


@VERSIONS
def test_anonymous_is_refused_when_not_configured(group, clients, version):
    code, props = clients(version).connect()
    assert code == 0x87
    if version == V5:
        assert "anonymous connections are not allowed" in props.ReasonString


def test_raw_311_return_codes(group):
    """What paho maps for us, on the wire: 3.1.1 CONNACK return codes 4 and 5."""
    def connack(payload_flags: int, tail: bytes) -> bytes:
        body = b"\x00\x04MQTT\x04" + bytes([0x02 | payload_flags]) + b"\x00\x1e" + b"\x00\x03raw" + tail
        with socket.create_connection((HOST, PORT), timeout=WAIT_S) as s:
            s.sendall(bytes([0x10, len(body)]) + body)
            return s.recv(16)
    assert connack(0xC0, b"\x00\x05alice\x00\x05wrong") == b"\x20\x02\x00\x04"
    assert connack(0, b"") == b"\x20\x02\x00\x05"


def test_anonymous_allowed_when_configured_then_refused_again(group, clients):
    set_policy(group, the_policy(anonymous=True))
    try:
        anon = clients(V5)
        assert anon.connect()[0] == 0
        assert anon.subscribe("public/#", "alice/#") == [1, 0x87]
        assert anon.publish("public/x", b"p", 1) == 0x87  # publishing to public/ is for users only
    finally:
        set_policy(group, the_policy(anonymous=False))
    assert clients(V5).connect()[0] == 0x87
    # Already connected anonymously: turning anonymous access off disconnects it, telling it why.
    assert anon.disconnects.get(timeout=WAIT_S) == 0x87


def test_an_acl_change_meets_a_connected_client_at_its_next_packet(group, clients):
    alice = clients(V5, user="alice", password="alice-pw")
    assert alice.connect()[0] == 0
    assert alice.publish("alice/x", b"p", 1) in (0, 0x10)  # success (0x10: no subscriber yet)
    without_rule_1 = the_policy()
    without_rule_1 = AccessPolicy(False, without_rule_1.users, without_rule_1.rules[:1] + without_rule_1.rules[2:])
    set_policy(group, without_rule_1)
    try:
        assert alice.publish("alice/x", b"p", 1) == 0x87  # v5 §3.3.4: the next packet meets the new policy
        assert alice.subscribe("alice/a") == [0x87]
    finally:
        set_policy(group, the_policy())


def test_without_users_and_anonymous_off_everyone_is_refused_and_told_why(group, clients):
    set_policy(group, AccessPolicy())
    try:
        code, props = clients(V5).connect()
        assert code == 0x87
        assert "anonymous connections are not allowed" in props.ReasonString
        assert clients(V5, user="alice", password="alice-pw").connect()[0] == 0x86
    finally:
        set_policy(group, the_policy())


def test_a_malformed_change_keeps_the_policy_and_names_the_field(group, clients):
    status, reply = config_api.call(group, Role.PRIMARY, "/api/v1/config/changes", {"changes": [
        {"kind": "document.replace", "document": {"version": 1, "access": {"version": 1, "allow_anonymous": "yes"}}}]})
    assert status == 400 and "allow_anonymous must be true or false" in reply["error"], reply
    assert clients(V5, user="alice", password="alice-pw").connect()[0] == 0  # the policy holds


def test_sighup_is_harmless_on_every_node(group, clients):
    """`systemctl reload`: configuration is changed through the API now, so SIGHUP only says so."""
    for role in Role:
        group.signal(role, signal.SIGHUP)
    time.sleep(0.5)
    assert all(group.procs[role].poll() is None for role in Role)
    assert clients(V5, user="alice", password="alice-pw").connect()[0] == 0
    assert "SIGHUP: nothing to reload" in (group.dir / "primary.log").read_text()


# --- ACLs --------------------------------------------------------------------------------------


@VERSIONS
def test_acl_denied_publish(group, clients, version, topic_id):
    bob = clients(V5, user="bob", password="bob-pw")
    assert bob.connect()[0] == 0
    assert bob.subscribe("secret/#", "public/#", qos=1) == [1, 1]
    alice = clients(version, user="alice", password="alice-pw")
    assert alice.connect()[0] == 0
    counted = node_view(group)["mqtt"]["refused"].get("publish_not_authorized", 0)
    expected = 0x87 if version == V5 else 0  # 3.1.1 has no negative ack: acked and dropped
    assert alice.publish(f"secret/{topic_id}/q1", b"no", 1) == expected
    # paho ignores a PUBREC's reason code and sends PUBREL anyway, which we answer with PUBCOMP 0x92 (packet
    # id not found: the exchange ended at our PUBREC 0x87, seen on the wire in test_raw_v5_pubrec_0x87).
    assert alice.publish(f"secret/{topic_id}/q2", b"no", 2) == (0x92 if version == V5 else 0)
    alice.publish(f"secret/{topic_id}/q0", b"no", 0)  # paho reports QoS 0 as sent; we drop it
    assert alice.publish(f"public/{topic_id}/marker", b"yes", 2) == 0
    assert bob.received_until(f"public/{topic_id}/marker") == []
    assert alice.c.is_connected()
    group.wait_for("the refusals to be counted", lambda: node_view(group)["mqtt"]["refused"].get(
        "publish_not_authorized", 0) >= counted + 3)
    group.wait_for("an access_denied event", lambda: any(
        e["event"] == "access_denied" and e.get("publish_not_authorized") for e in group.events(Role.PRIMARY)))


def test_raw_v5_pubrec_0x87(group):
    body = b"\x00\x04MQTT\x05\xc2\x00\x1e\x00" + b"\x00\x03r5q" + b"\x00\x05alice\x00\x08alice-pw"
    with socket.create_connection((HOST, PORT), timeout=WAIT_S) as s:
        s.sendall(bytes([0x10, len(body)]) + body)
        assert s.recv(3)[:1] == b"\x20"
        s.recv(4096)  # the rest of the CONNACK (properties)
        publish = b"\x00\x08secret/x" + b"\x00\x07" + b"\x00" + b"no"
        s.sendall(bytes([0x34, len(publish)]) + publish)
        pubrec = s.recv(4096)
    assert pubrec[0] == 0x50 and pubrec[2:4] == b"\x00\x07" and pubrec[4] == 0x87, pubrec
    assert b"not authorized to publish to secret/x" in pubrec


@VERSIONS
def test_acl_denied_subscribe_per_filter(group, clients, version):
    alice = clients(version, user="alice", password="alice-pw")
    assert alice.connect()[0] == 0
    denied = 0x87 if version == V5 else 0x80
    assert alice.subscribe("alice/b/+", "#", "public/x", "secret/#", "+/b", "$share/g/alice/q") == \
        [1, denied, 1, denied, denied, 1]


def test_allowed_traffic_flows(group, clients, topic_id):
    alice = clients(V311, user="alice", password="alice-pw")
    assert alice.connect()[0] == 0
    assert alice.subscribe(f"alice/{topic_id}/#") == [1]
    assert alice.publish(f"alice/{topic_id}/x", b"hi", 1) == 0
    assert alice.publish(f"alice/{topic_id}/m", b"", 2) == 0
    assert alice.received_until(f"alice/{topic_id}/m") == [f"alice/{topic_id}/x"]


def test_a_will_to_a_denied_topic_refuses_the_connect(group, clients):
    client = clients(V5, user="alice", password="alice-pw", will={"topic": "secret/will", "payload": b"x"})
    code, props = client.connect()
    assert code == 0x87
    assert "will" in props.ReasonString
    assert clients(V5, user="alice", password="alice-pw",
                   will={"topic": "alice/will", "payload": b"x"}).connect()[0] == 0


# --- mosquitto clients -------------------------------------------------------------------------


def mosquitto(*args, timeout=10) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), capture_output=True, text=True, timeout=timeout)


def sub_gets_pub(common: list[str], topic: str, message: str, sub_extra: list[str] = ()) -> str:
    """mosquitto_sub waits for one QoS 1 message while mosquitto_pub repeats `message` until it arrives
    (the subscription is in place only once the first copy gets through); returns what the sub printed."""
    sub = subprocess.Popen(["mosquitto_sub", *common, "-t", topic, "-C", "1", "-W", "10", "-q", "1", *sub_extra],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 8
        while sub.poll() is None and time.monotonic() < deadline:
            pub = mosquitto("mosquitto_pub", *common, "-t", topic, "-m", message, "-q", "1")
            assert pub.returncode == 0, pub.stderr
            try:
                sub.wait(0.3)
            except subprocess.TimeoutExpired:
                pass
        out, err = sub.communicate(timeout=5)
    finally:
        if sub.poll() is None:
            sub.kill()
    assert sub.returncode == 0, err
    return out.strip()


@pytest.mark.parametrize("version", ["mqttv311", "mqttv5"])
def test_mosquitto_clients_with_passwords(group, version, topic_id):
    topic = f"alice/{topic_id}/m"
    common = ["-h", HOST, "-p", str(PORT), "-V", version, "-u", "alice", "-P", "alice-pw"]
    assert sub_gets_pub(common, topic, "hello", ["-i", f"ms-{topic_id}"]) == "hello"
    bad = mosquitto("mosquitto_pub", "-h", HOST, "-p", str(PORT), "-V", version, "-u", "alice", "-P", "nope",
                    "-t", topic, "-m", "x")
    assert bad.returncode != 0
    assert "bad user name or password" in bad.stderr.lower(), bad.stderr
    anon = mosquitto("mosquitto_pub", "-h", HOST, "-p", str(PORT), "-V", version, "-t", topic, "-m", "x")
    assert anon.returncode != 0
    assert "not authori" in anon.stderr.lower(), anon.stderr


def test_mosquitto_sub_denied_subscription(group):
    result = mosquitto("mosquitto_sub", "-h", HOST, "-p", str(PORT), "-V", "mqttv5", "-u", "alice", "-P",
                       "alice-pw", "-t", "secret/#", "-C", "1", "-W", "3")
    assert "All subscription requests were denied." in result.stderr, result  # mosquitto_sub then exits 0


# --- TLS ---------------------------------------------------------------------------------------


@VERSIONS
def test_tls_login_and_traffic_with_paho(group, clients, pki, version, topic_id):
    alice = clients(version, user="alice", password="alice-pw", port=TLS_PORT, ca_file=pki.ca_file)
    assert alice.connect()[0] == 0
    assert alice.c.socket().version() in ("TLSv1.2", "TLSv1.3")
    assert alice.subscribe(f"alice/{topic_id}/#") == [1]
    plain = clients(V5, user="alice", password="alice-pw")
    assert plain.connect()[0] == 0
    assert plain.publish(f"alice/{topic_id}/m", b"over tls", 1) == 0  # plain in, TLS out: one broker
    assert alice.messages.get(timeout=WAIT_S) == (f"alice/{topic_id}/m", b"over tls")
    assert clients(version, user="alice", password="bad", port=TLS_PORT, ca_file=pki.ca_file).connect()[0] == 0x86


def test_tls_with_mosquitto_clients(group, pki, topic_id):
    topic = f"alice/{topic_id}/tls"
    common = ["-h", HOST, "-p", str(TLS_PORT), "--cafile", str(pki.ca_file), "-u", "alice", "-P", "alice-pw"]
    assert sub_gets_pub(common, topic, "secure") == "secure"


def test_a_client_that_does_not_trust_the_ca_is_refused_by_itself(group, tmp_path):
    other = make_pki(tmp_path / "other")
    result = mosquitto("mosquitto_pub", "-h", HOST, "-p", str(TLS_PORT), "--cafile", str(other.ca_file), "-u",
                       "alice", "-P", "alice-pw", "-t", "alice/x", "-m", "x")
    assert result.returncode != 0


def test_plain_mqtt_to_the_tls_port_is_closed_and_counted(group):
    before = node_view(group)["mqtt"]["tls_handshake_failures"]
    connect = b"\x10\x10\x00\x04MQTT\x04\x02\x00\x1e\x00\x04abcd"
    with socket.create_connection((HOST, TLS_PORT), timeout=WAIT_S) as s:
        s.sendall(connect)
        data = b""
        try:  # the node closes it: a socket left open would raise TimeoutError here
            while chunk := s.recv(4096):
                data += chunk
        except ConnectionResetError:
            pass
    assert not data.startswith(b"\x20")  # never a CONNACK
    # paho speaking plain MQTT to it fails to connect, too.
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv311)
    c.username_pw_set("alice", "alice-pw")
    with pytest.raises((OSError, ConnectionError)):
        c.connect(HOST, TLS_PORT, 30)
        for _ in range(20):
            if c.loop(0.2) != mqtt.MQTT_ERR_SUCCESS:
                raise ConnectionError("closed")
    group.wait_for("the failures to be counted", lambda: node_view(group)["mqtt"]["tls_handshake_failures"] >= before + 2)
    group.wait_for("a summed tls_handshake_failed event", lambda: any(
        e["event"] == "tls_handshake_failed" and e["count"] >= 1 and e["last_reason"]
        for e in group.events(Role.PRIMARY)))


@pytest.mark.filterwarnings("ignore:ssl.TLSVersion:DeprecationWarning")
def test_tls_below_1_2_is_refused(group, pki):
    before = node_view(group)["mqtt"]["tls_handshake_failures"]
    context = ssl.create_default_context(cafile=str(pki.ca_file))
    try:
        context.minimum_version = ssl.TLSVersion.TLSv1
        context.maximum_version = ssl.TLSVersion.TLSv1_1
        context.set_ciphers("DEFAULT:@SECLEVEL=0")
    except (ValueError, ssl.SSLError) as exc:
        pytest.fail(f"this OpenSSL cannot even offer TLS 1.1, so the refusal cannot be shown: {exc}")
    with socket.create_connection((HOST, TLS_PORT), timeout=WAIT_S) as raw:
        with pytest.raises((ssl.SSLError, ConnectionError)):
            context.wrap_socket(raw, server_hostname=HOST)
    group.wait_for("the failure to be counted", lambda: node_view(group)["mqtt"]["tls_handshake_failures"] > before)


# --- a reconnect storm -------------------------------------------------------------------------


async def _connect_once(user: str, password: str, client_id: str) -> int:
    body = (b"\x00\x04MQTT\x04\xc2\x00\x1e" + struct.pack("!H", len(client_id)) + client_id.encode()
            + struct.pack("!H", len(user)) + user.encode() + struct.pack("!H", len(password)) + password.encode())
    reader, writer = await asyncio.open_connection(HOST, PORT)
    try:
        writer.write(bytes([0x10, len(body)]) + body)
        connack = await asyncio.wait_for(reader.readexactly(4), 20)
        writer.write(b"\xe0\x00")  # DISCONNECT
        await writer.drain()
        return connack[3]
    finally:
        writer.close()


async def _storm(total: int, concurrency: int, password: str = "alice-pw") -> tuple[list[int], list[float]]:
    codes: list[int] = []
    pings: list[float] = []
    done = asyncio.Event()

    async def pinger():
        """A connected client's PINGREQ round trips while the storm runs: the loop must keep answering."""
        reader, writer = await asyncio.open_connection(HOST, PORT)
        body = b"\x00\x04MQTT\x04\xc2\x00\x1e\x00\x04ping\x00\x03bob\x00\x06bob-pw"
        writer.write(bytes([0x10, len(body)]) + body)
        assert (await reader.readexactly(4))[3] == 0
        while not done.is_set():
            start = time.perf_counter()
            writer.write(b"\xc0\x00")
            assert await reader.readexactly(2) == b"\xd0\x00"
            pings.append(time.perf_counter() - start)
            await asyncio.sleep(0.02)
        writer.close()

    async def worker(n: int):
        for i in range(n):
            guess = password if password == "alice-pw" else f"{password}-{uuid.uuid4().hex}"  # each guess new
            codes.append(await _connect_once("alice", guess, f"storm-{n}-{i}-{uuid.uuid4().hex[:6]}"))

    ping_task = asyncio.create_task(pinger())
    await asyncio.sleep(0.2)
    await asyncio.gather(*(worker(total // concurrency) for _ in range(concurrency)))
    done.set()
    await ping_task
    return codes, pings


def test_a_reconnect_storm_costs_one_scrypt_and_does_not_block_the_loop(group):
    set_policy(group, the_policy())  # fresh salts: nothing cached, the storm starts cold
    before = node_view(group)["mqtt"]["access"]
    start = time.monotonic()
    codes, pings = asyncio.run(_storm(total=1000, concurrency=50))
    elapsed = time.monotonic() - start
    after = node_view(group)["mqtt"]["access"]
    assert codes == [0] * 1000
    runs = after.get("scrypt_runs", 0) - before.get("scrypt_runs", 0)
    hits = after.get("cache_hits", 0) - before.get("cache_hits", 0)
    shared = after.get("shared_scrypt", 0) - before.get("shared_scrypt", 0)
    pings.sort()
    print(f"\n1000 authenticated reconnects (50 at a time) in {elapsed:.2f} s: {runs} scrypt runs, {shared} waits on "
          f"a running one, {hits} cache hits;"
          f" PINGREQ round trips during the storm: median {pings[len(pings) // 2] * 1000:.1f} ms, "
          f"max {pings[-1] * 1000:.1f} ms over {len(pings)}")
    assert runs == 2  # alice's (the storm, 50 at once: one shared scrypt) and bob's (the pinger)
    assert hits + shared == 999  # every other alice CONNECT: a cache hit, or a wait on that one scrypt
    assert pings, "a connected client's pings went unanswered during the storm"  # their latency: bench/hostile.py


def test_a_storm_of_wrong_passwords_runs_every_scrypt_off_the_loop(group):
    """Failures are not cached: distinct wrong guesses cost one scrypt each, queued on 2 threads, while a
    connected client's pings keep being answered; past the address's budget (limits.
    login_checks_per_address_per_min, 30) the rest are refused at once with "server unavailable"."""
    # the pinger's own login must not be counted: alone, or after a policy change, its credential is cold
    assert asyncio.run(_connect_once("bob", "bob-pw", f"warm-{uuid.uuid4().hex[:6]}")) == 0
    before = node_view(group)["mqtt"]["access"]
    start = time.monotonic()
    codes, pings = asyncio.run(_storm(total=60, concurrency=30, password="guess"))
    elapsed = time.monotonic() - start
    after = node_view(group)["mqtt"]["access"]
    runs = after.get("scrypt_runs", 0) - before.get("scrypt_runs", 0)
    pings.sort()
    print(f"\n60 wrong-password CONNECTs (30 at a time) in {elapsed:.2f} s: {runs} scrypt runs; PINGREQ round "
          f"trips meanwhile: median {pings[len(pings) // 2] * 1000:.1f} ms, max {pings[-1] * 1000:.1f} ms "
          f"over {len(pings)}")
    assert sorted(set(codes)) == [3, 4] and codes.count(4) < 45  # the budget: a minute's worth, refilling
    assert runs == codes.count(4)  # a throttled CONNECT costs no scrypt
    assert len(pings) >= 5, pings  # answered meanwhile; their latency: bench/hostile.py


"""`$SYS` statistics, `$` topics, the keep-alive cap and the drain after our closes, against a real group.

One group for the module (the primary active on PAIRMQ_TEST_LOOPBACK:1883), publishing `$SYS` every second,
with this ACL (first match wins; anonymous clients allowed):

    0 allow subscribe  $SYS/#             user:watcher
    1 deny  subscribe  $SYS/broker/bytes/# user:partial
    2 allow subscribe  $SYS/#             user:partial
    3 allow both       #                  all
    4 allow both       $foo/#             all

The drain after our closes is tested last: 0x93 on every try, and its bounds against a client that keeps
writing or never closes. Clients: mosquitto_sub/mosquitto_pub, paho-mqtt (tests/processes/test_broker_interop.py)
and raw sockets. Statistics are read as deltas: the figures are the node's since it started, and other tests of
the module move them too.
"""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import time

import pytest

from pairmq.appliance.broker.access import AccessPolicy, Action, Effect, Rule, hash_password
from pairmq.appliance.config import SysTopics
from pairmq.appliance.roles import Role
from tests.harness.group import active_group
from tests.harness.mqttraw import (
    CONNACK, DISCONNECT, PUBREC, Raw, RawPacket, encode_props, utf8, vbi,
)
from tests.processes.test_broker_interop import (  # noqa: F401  (clients, raws, topic are fixtures)
    HOST, PORT, V5, V311, VERSIONS, WAIT_S, cid, clients, raws, topic,
)
from tests.processes.test_cli_config import run as config_cli

PASSWORDS = {"watcher": "watcher-pw", "partial": "partial-pw"}
RULES = (("allow", "subscribe", "$SYS/#", "user:watcher"), ("deny", "subscribe", "$SYS/broker/bytes/#", "user:partial"),
         ("allow", "subscribe", "$SYS/#", "user:partial"), ("allow", "both", "#", "all"),
         ("allow", "both", "$foo/#", "all"))
TOPIC_NAME_INVALID, RECEIVE_MAXIMUM_EXCEEDED, KEEP_ALIVE_TIMEOUT = 0x90, 0x93, 0x8D
SERVER_KEEP_ALIVE = 0x13


def the_policy() -> AccessPolicy:
    users = {name: hash_password(pw.encode(), os.urandom(16)) for name, pw in PASSWORDS.items()}
    return AccessPolicy(True, users, tuple(Rule(Effect(e), Action(a), f, w) for e, a, f, w in RULES))


@pytest.fixture(scope="module")
def group(tmp_path_factory):
    with active_group(tmp_path_factory.mktemp("sys") / "group", access=the_policy(),
                      sys=SysTopics(interval_s=1)) as g:
        yield g


class SysReader:
    """mosquitto_sub on `$SYS/#` (v5, as `user`), its lines read on a thread: the latest value of each topic."""

    def __init__(self, user: str | None, *topic_filters: str) -> None:
        argv = ["mosquitto_sub", "-h", HOST, "-p", str(PORT), "-V", "mqttv5", "-F", "%t =>%p"]
        for topic_filter in topic_filters or ("$SYS/#",):
            argv += ["-t", topic_filter]
        if user is not None:
            argv += ["-u", user, "-P", PASSWORDS[user]]
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.values: dict[str, str] = {}
        self._changed = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            topic, _, payload = line.rstrip("\n").partition(" =>")  # mosquitto's names hold spaces
            with self._changed:
                self.values[topic] = payload
                self._changed.notify_all()

    def wait(self, topic: str, predicate, timeout_s: float = 10.0) -> str:
        """The first value of `topic` (an integer where it is one) that satisfies `predicate`."""
        def value():
            text = self.values.get(topic)
            return None if text is None else int(text) if text.lstrip("-").isdigit() else text

        with self._changed:
            ok = self._changed.wait_for(lambda: value() is not None and predicate(value()), timeout_s)
            assert ok, f"{topic} stayed {self.values.get(topic)!r}"
            return value()

    def stop(self) -> str:
        self.proc.terminate()
        _, err = self.proc.communicate(timeout=WAIT_S)
        return err


@pytest.fixture
def sys_reader(group):
    made: list[SysReader] = []

    def make(user: str | None = "watcher", *topic_filters: str) -> SysReader:
        made.append(SysReader(user, *topic_filters))
        return made[-1]

    yield make
    for reader in made:
        reader.stop()


B = "$SYS/broker/"


# --- $SYS ----------------------------------------------------------------------------------------


def test_mosquitto_sub_reads_the_broker_statistics(group, sys_reader, clients, topic):
    sys = sys_reader()
    assert sys.wait(B + "version", lambda v: v.startswith("pairmq version "))
    assert sys.wait(B + "uptime", lambda v: v.endswith(" seconds") and int(v.split()[0]) >= 0)
    assert sys.wait(B + "redundancy/activity", lambda v: True) == "active"
    epoch = group.api(Role.PRIMARY, "/api/v1/redundancy")["epoch"]
    assert sys.wait(B + "redundancy/epoch", lambda v: True) == epoch
    assert sys.wait(B + "redundancy/in_sync", lambda v: v == "true")
    assert sys.wait(B + "redundancy/config_sync", lambda v: v == "In-Sync")
    connected = sys.wait(B + "clients/connected", lambda v: v >= 1)  # mosquitto_sub itself, at least
    received = sys.wait(B + "publish/messages/received", lambda v: v >= 0)

    n, m = 4, 7
    made = [clients(cid(topic, f"c{i}"), version=V5 if i % 2 else V311) for i in range(n)]
    for i in range(m):
        made[0].publish(f"{topic}/x", f"m{i}", qos=1)
    assert sys.wait(B + "clients/connected", lambda v: v == connected + n) == connected + n
    assert sys.wait(B + "publish/messages/received", lambda v: v == received + m) == received + m
    assert sys.wait(B + "clients/maximum", lambda v: v >= connected + n)
    assert sys.wait(B + "clients/total", lambda v: v >= connected + n)
    for c in made:
        c.disconnect()
    assert sys.wait(B + "clients/connected", lambda v: v == connected) == connected
    for name in ("messages/received", "messages/sent", "bytes/received", "bytes/sent", "subscriptions/count",
                 "retained messages/count", "store/messages/count", "store/messages/bytes",
                 "load/messages/received/1min", "load/bytes/sent/15min"):
        sys.wait(B + name, lambda v: True)
    assert float(sys.values[B + "load/publish/received/1min"]) >= 0


def test_a_new_subscriber_gets_every_value_retained_at_once(group, sys_reader):
    first = sys_reader()
    first.wait(B + "uptime", lambda v: True)
    got = subprocess.run(["mosquitto_sub", "-h", HOST, "-p", str(PORT), "-u", "watcher", "-P", PASSWORDS["watcher"],
                          "-t", B + "clients/#", "-t", B + "redundancy/#", "-v", "--retained-only", "-W", "2"],
                         capture_output=True, text=True, timeout=10)
    topics = {line.split(" ", 1)[0] for line in got.stdout.splitlines()}
    assert {B + "clients/connected", B + "clients/total", B + "redundancy/epoch"} <= topics, got


def test_sys_is_withheld_where_the_acl_does_not_allow_reading_it(group, sys_reader, clients, topic):
    anonymous = clients(cid(topic, "anon"), version=V5)
    assert anonymous.subscribe("$SYS/#", qos=0) == [0x87]
    assert anonymous.subscribe("#", qos=0) == [0], "`#` never matches $SYS anyway"
    partial = sys_reader("partial")
    partial.wait(B + "clients/connected", lambda v: v >= 1)
    watcher = sys_reader("watcher")
    watcher.wait(B + "bytes/received", lambda v: v > 0)
    uptime = watcher.wait(B + "uptime", lambda v: True)
    watcher.wait(B + "uptime", lambda v: v != uptime)  # a later publication, which partial got too
    anonymous.publish(f"{topic}/marker", b"", qos=2)
    assert [m.topic for m in anonymous.until(f"{topic}/marker") if m.topic.startswith("$")] == []
    assert not [t for t in partial.values if t.startswith(B + "bytes/")], "withheld, live and retained"
    assert B + "uptime" in partial.values


def test_sys_is_never_spooled(group, sys_reader):
    sys = sys_reader()
    uptime = sys.wait(B + "uptime", lambda v: True)
    ops = group.api(Role.PRIMARY, "/api/v1/message-spool")["writer"]["ops"]
    for _ in range(2):
        uptime = sys.wait(B + "uptime", lambda v, u=uptime: v != u)  # two more publications
    assert group.api(Role.PRIMARY, "/api/v1/message-spool")["writer"]["ops"] == ops


# --- $ topics --------------------------------------------------------------------------------------


@VERSIONS
def test_a_dollar_topic_other_than_sys_is_delivered_to_its_exact_subscriber_only(clients, topic, version):
    exact = clients(cid(topic, "exact"), version=version)
    assert exact.subscribe(f"$foo/{topic}", qos=1) == [1]
    every = clients(cid(topic, "every"), version=version)
    every.subscribe("#", "+/#", qos=1)
    pub = clients(cid(topic, "pub"), version=version)
    assert pub.publish(f"$foo/{topic}", b"dollar", qos=1)[0] == 0
    pub.publish(f"{topic}/marker", b"", qos=2)
    got = exact.get()
    assert (got.topic, got.payload) == (f"$foo/{topic}", b"dollar")
    assert [m.topic for m in every.until(f"{topic}/marker") if m.topic.startswith("$")] == []
    assert pub.disconnects.empty()


def _watching(sys_reader, *topic_filters: str) -> SysReader:
    """A watcher of `topic_filters` known to be subscribed (it got the retained uptime), and a way to wait for
    the next $SYS publication."""
    watcher = sys_reader("watcher", B + "uptime", *topic_filters)
    watcher.wait(B + "uptime", lambda v: True)
    return watcher


def _next_publication(watcher: SysReader) -> None:
    uptime = watcher.values[B + "uptime"]
    watcher.wait(B + "uptime", lambda v: v != uptime)


def test_v5_publish_to_sys_is_refused_with_0x90(clients, topic, sys_reader):
    watcher = _watching(sys_reader, f"$SYS/{topic}")
    pub = clients(cid(topic, "pub"), version=V5)
    reason, props = pub.publish(f"$SYS/{topic}", b"forged", qos=1)
    assert reason == TOPIC_NAME_INVALID and props.ReasonString == "topics under $SYS are the broker's"
    pub.publish(f"$SYS/{topic}", b"forged", qos=0)
    assert pub.publish(f"{topic}/after", b"", qos=2)[0] in (0, 0x10)  # the connection stays
    assert pub.disconnects.empty()
    _next_publication(watcher)
    assert set(watcher.values) == {B + "uptime"}


def test_v311_publish_to_sys_is_acknowledged_and_dropped_and_the_connection_stays(clients, topic, sys_reader):
    watcher = _watching(sys_reader, f"$SYS/{topic}/#")
    pub = clients(cid(topic, "pub"), version=V311)
    assert pub.publish(f"$SYS/{topic}/q1", b"forged", qos=1)[0] == 0
    assert pub.publish(f"$SYS/{topic}/q2", b"forged", qos=2)[0] == 0
    assert pub.publish(f"{topic}/after", b"still here", qos=1)[0] == 0
    assert pub.disconnects.empty()
    sub = subprocess.run(["mosquitto_sub", "-h", HOST, "-p", str(PORT), "-u", "watcher", "-P", PASSWORDS["watcher"],
                          "-t", f"$SYS/{topic}/#", "--retained-only", "-W", "1"], capture_output=True, text=True,
                         timeout=10)
    _next_publication(watcher)
    assert sub.stdout == "" and set(watcher.values) == {B + "uptime"}, "nothing was routed or retained"


# --- max_keepalive_s --------------------------------------------------------------------------------


@pytest.fixture
def keepalive_cap(group):
    def set_cap(seconds: int) -> None:
        result = config_cli(group, "limits", "set", "max_keepalive_s", str(seconds))
        assert result.returncode == 0, result.stderr

    yield set_cap
    assert config_cli(group, "limits", "unset", "max_keepalive_s").returncode == 0


def _connect_until(raws, version: int, client_id: str, keepalive: int, check) -> RawPacket:
    """CONNECT until `check(connack)` (the limit reaches the listener a moment after the API answers)."""
    deadline = time.monotonic() + WAIT_S
    while True:
        raw = raws(version)
        connack = raw.connect(client_id, keepalive=keepalive)
        if check(connack) or time.monotonic() > deadline:
            return connack
        raw.close()


def test_max_keepalive_in_v5_connack_and_its_enforcement(raws, topic, keepalive_cap):
    keepalive_cap(30)
    has_cap = lambda c: c.reason_and_props()[1].get(SERVER_KEEP_ALIVE) == 30  # noqa: E731
    assert has_cap(_connect_until(raws, V5, cid(topic, "long"), 600, has_cap)), "lowered to the cap"
    connack = raws(V5).connect(cid(topic, "zero"), keepalive=0)
    assert connack.reason_and_props() == (0, connack.reason_and_props()[1])
    assert connack.reason_and_props()[1][SERVER_KEEP_ALIVE] == 30, "0 (no keep alive) is given the cap too"
    assert SERVER_KEEP_ALIVE not in raws(V5).connect(cid(topic, "short"), keepalive=10).reason_and_props()[1]

    keepalive_cap(1)
    is_one = lambda c: c.reason_and_props()[1].get(SERVER_KEEP_ALIVE) == 1  # noqa: E731
    deadline = time.monotonic() + WAIT_S
    while True:  # the raw that got the new cap is the one to watch
        silent = raws(V5)
        connack = silent.connect(cid(topic, "silent"), keepalive=0)
        if is_one(connack) or time.monotonic() > deadline:
            break
    assert is_one(connack)
    got = silent.closed(timeout_s=10)  # silent: no PINGREQ within 1.5 x 1 s
    assert [p.type for p in got] == [DISCONNECT] and got[0].reason_and_props()[0] == KEEP_ALIVE_TIMEOUT


def test_max_keepalive_refuses_a_v311_client_asking_for_more_with_return_code_2(raws, topic, keepalive_cap, clients):
    keepalive_cap(30)
    refused = lambda c: c is not None and c.body[1] == 2  # noqa: E731
    assert refused(_connect_until(raws, V311, cid(topic, "long"), 600, refused))
    assert raws(V311).connect(cid(topic, "zero"), keepalive=0).body[1] == 2, "0 is over any cap"
    assert raws(V311).connect(cid(topic, "short"), keepalive=30).body[1] == 0
    mosq = subprocess.run(["mosquitto_pub", "-h", HOST, "-p", str(PORT), "-V", "mqttv311", "-k", "60", "-t",
                           f"{topic}/t", "-m", "x"], capture_output=True, text=True, timeout=10)
    assert mosq.returncode != 0 and "identifier rejected" in (mosq.stderr + mosq.stdout).lower(), mosq


# --- the drain after our DISCONNECT -------------------------------------------------------------------


def _publish_qos2(packet_id: int, topic_name: str) -> bytes:
    body = utf8(topic_name) + packet_id.to_bytes(2, "big") + encode_props([]) + b"x"
    return bytes([0x34]) + vbi(len(body)) + body


def test_receive_maximum_exceeded_arrives_as_0x93_every_time_not_as_a_reset(topic):
    """The client keeps writing after the 101st unfinished QoS 2 PUBLISH; each of 20 tries must read the
    DISCONNECT and then the server's FIN, never "connection reset by peer"."""
    for attempt in range(20):
        raw = Raw(V5)
        assert raw.connect(cid(topic, f"deep{attempt}")).type == CONNACK
        sock = raw.sock
        sock.sendall(b"".join(_publish_qos2(pid, f"{topic}/t") for pid in range(1, 102)))
        extra = b"".join(_publish_qos2(pid, f"{topic}/t") for pid in range(102, 400))
        try:
            for i in range(0, len(extra), 512):  # more than the limit, as a careless client would
                sock.sendall(extra[i:i + 512])
        except (BrokenPipeError, ConnectionResetError) as exc:
            pytest.fail(f"try {attempt}: the server reset the connection while we wrote: {exc}")
        sock.shutdown(socket.SHUT_WR)
        packets = []
        sock.settimeout(WAIT_S)
        while True:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                pytest.fail(f"try {attempt}: reset after {len(packets)} packets, before the server's FIN")
            if not chunk:
                break
            raw._buf += chunk
            while (packet := raw._frame()) is not None:
                packets.append(packet)
        raw.close()
        assert [p.type for p in packets] == [PUBREC] * (len(packets) - 1) + [DISCONNECT], f"try {attempt}"
        assert packets[-1].reason_and_props()[0] == RECEIVE_MAXIMUM_EXCEEDED, f"try {attempt}"


def _past_receive_maximum(topic: str, name: str) -> Raw:
    """A v5 client that has just been sent DISCONNECT 0x93 (and our FIN)."""
    raw = Raw(V5)
    assert raw.connect(cid(topic, name)).type == CONNACK
    raw.sock.sendall(b"".join(_publish_qos2(pid, f"{topic}/t") for pid in range(1, 102)))
    while (packet := raw.recv()) is not None and packet.type != DISCONNECT:
        pass
    assert packet is not None and packet.reason_and_props()[0] == RECEIVE_MAXIMUM_EXCEEDED
    return raw


def test_the_drain_is_bounded_for_a_client_that_keeps_writing(topic):
    """1 MiB or 1 s, whichever comes first: then the server aborts, and our writes fail."""
    raw = _past_receive_maximum(topic, "flood")
    junk = _publish_qos2(1, f"{topic}/t" + "x" * 60_000)
    sent = 0
    with pytest.raises((ConnectionResetError, BrokenPipeError)):
        while sent < 64 * 1024 * 1024:  # far past the drain's 1 MiB: the server must stop reading first
            raw.sock.sendall(junk)
            sent += len(junk)
    raw.close()


def test_the_drain_is_bounded_in_time_for_a_client_that_never_closes(group, topic):
    def connections() -> int:
        return group.api(Role.PRIMARY, "/api/v1/redundancy")["mqtt"]["connections"]

    before = connections()
    raw = _past_receive_maximum(topic, "idle")
    assert raw.recv() is None, "our FIN follows the DISCONNECT at once"
    group.wait_for("the server to give up the half-closed connection", lambda: connections() <= before,
                   timeout_s=WAIT_S)
    raw.close()

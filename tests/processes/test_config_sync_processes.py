"""Config-sync with real node processes (docs/config_sync.md): changes on the active reach the standby at once, survive
a failover and are enforced by the new active on real paho-mqtt clients; a standby refuses changes and names
the active; a bad change is refused whole; a node that was down catches up; concurrent changes keep one order."""

from __future__ import annotations

import concurrent.futures
import threading
import time

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from pairmq.appliance.broker.access import AccessPolicy, hash_password
from pairmq.appliance.roles import Role
from tests.harness.config_api import call, change, config, wait_for_version
from tests.harness.group import active_group

P, B = Role.PRIMARY, Role.BACKUP
RECORD = hash_password(b"door-pw", b"s" * 16, n=1 << 10, r=8, p=1).to_document()
USERS_ONLY = AccessPolicy(allow_anonymous=False)


@pytest.fixture
def group(tmp_path):
    with active_group(tmp_path / "group") as g:
        yield g


def connect(host: str, user: str | None = None, password: str | None = None, client_id: str = "cfg-test"):
    """(CONNACK reason code, client or None, disconnect reasons seen)."""
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5)
    if user is not None:
        c.username_pw_set(user, password)
    answered, result, dropped = threading.Event(), [], []
    c.on_connect = lambda cl, ud, flags, rc, props: (result.append(rc.value), answered.set())
    c.on_disconnect = lambda cl, ud, flags, rc, props: dropped.append(rc.value)
    c.connect(host, 1883, keepalive=30, properties=Properties(PacketTypes.CONNECT))
    c.loop_start()
    assert answered.wait(10), f"no CONNACK from {host}"
    if result[0] != 0:
        c.loop_stop()
        return result[0], None, dropped
    return 0, c, dropped


def test_after_a_failover_the_new_active_enforces_the_changes(group):
    change(group, P, {"kind": "user.set", "username": "door", "record": RECORD},
           {"kind": "user.set", "username": "gone", "record": RECORD},
           {"kind": "acl.add", "rule": {"effect": "allow", "action": "both", "filter": "cars/#", "who": "users"}},
           {"kind": "anonymous.set", "allowed": False},
           {"kind": "user.delete", "username": "gone"})
    group.kill(P)
    group.wait_for("the backup to take over", lambda: group.probe_once()[B] in (0, 0x87, 5), timeout_s=10)
    code, door, _ = connect(group.address(B), "door", "door-pw")
    assert code == 0, f"door refused by the new active: 0x{code:02X}"
    assert connect(group.address(B), "gone", "door-pw")[0] == 0x86  # the removed user: bad user name or password
    assert connect(group.address(B))[0] == 0x87  # anonymous: not authorized
    blocked = door.publish("payments/1", b"x", qos=1)
    blocked.wait_for_publish(5)
    allowed = door.publish("cars/1/door", b"open", qos=1)
    allowed.wait_for_publish(5)
    assert allowed.is_published() and allowed.rc == 0
    counters = call(group, B, "/api/v1/redundancy")[1]["mqtt"]["refused"]
    assert counters.get("publish_not_authorized", 0) >= 1, counters  # the ACL blocked payments/1
    door.disconnect()
    door.loop_stop()


def test_a_node_down_during_changes_catches_up_on_rejoin(group):
    group.kill(B)
    group.wait_for("the primary to see the backup gone",
                   lambda: call(group, P, "/api/v1/config-sync")[1]["status"] == "Out-Of-Sync", timeout_s=10)
    base = config(group, P)["version"]
    for n in range(5):
        reply = change(group, P, {"kind": "overload.set", "name": "max_window", "value": 50 + n})
        assert reply["confirmed_by_standby"] is False and reply["config_sync"] == "Out-Of-Sync"
    group.start(B)
    took = wait_for_version(group, B, base + 5, timeout_s=20)
    assert config(group, B)["digest"] == config(group, P)["digest"]
    assert config(group, B)["overload"]["set"] == {"max_window": 54}
    group.wait_for("In-Sync", lambda: call(group, P, "/api/v1/config-sync")[1]["status"] == "In-Sync", timeout_s=5)
    print(f"the restarted backup caught up 5 changes {took:.1f} s after its start")


def test_limits_and_overload_settings_take_effect_at_once(group):
    """A queue limit changed through config-sync refuses the next publish past it (v5 PUBACK 0x97) on the active,
    and after a failover on the backup; an overload setting changes the listener's window at once."""
    change(group, P, {"kind": "limits.set", "name": "session_queue_max_messages", "value": 3},
           {"kind": "overload.set", "name": "max_window", "value": 7})
    window = call(group, P, "/api/v1/redundancy")[1]["mqtt"]["window"]
    assert 1 <= window <= 7, f"the listener's window is {window} after max_window = 7 (it was 100)"

    props = Properties(PacketTypes.CONNECT)
    props.SessionExpiryInterval = 600
    slow = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="slow", protocol=mqtt.MQTTv5)
    slow.connect(group.address(P), 1883, properties=props)
    slow.loop_start()
    slow.subscribe("lim/#", qos=1)
    time.sleep(0.5)
    slow.disconnect()
    slow.loop_stop()

    def publish_codes(host: str, count: int) -> list[int]:
        codes: dict[int, int] = {}
        pub = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"lim-{host}", protocol=mqtt.MQTTv5)
        pub.on_publish = lambda c, u, mid, rc, p: codes.__setitem__(mid, rc.value)
        pub.connect(host, 1883)
        pub.loop_start()
        mids = []
        for i in range(count):
            info = pub.publish("lim/x", str(i).encode(), qos=1)
            info.wait_for_publish(5)
            mids.append(info.mid)
        pub.disconnect()
        pub.loop_stop()
        return [codes.get(mid) for mid in mids]

    assert publish_codes(group.address(P), 5) == [0, 0, 0, 0x97, 0x97]
    group.kill(P)
    group.wait_for("the backup to take over", lambda: group.probe_once()[B] == 0, timeout_s=10)
    assert publish_codes(group.address(B), 1) == [0x97]  # the queue still holds 3: the backup enforces 3 too
    assert 1 <= call(group, B, "/api/v1/redundancy")[1]["mqtt"]["window"] <= 7


class TestOnOneGroup:
    """Tests that neither kill nor restart a node, and count versions from what they find: they share one group
    (a group's start is most of each one's time). The class's group ends before the next test starts its own."""

    @pytest.fixture(scope="class")
    @classmethod
    def group(cls, tmp_path_factory):
        with active_group(tmp_path_factory.mktemp("shared") / "group") as g:
            yield g

    def test_a_change_on_the_active_reaches_the_standby_within_a_second(self, group):
        base = config(group, P)["version"]
        reply = change(group, P, {"kind": "user.set", "username": "door", "record": RECORD})
        assert reply["version"] == base + 1 and reply["confirmed_by_standby"] is True, reply
        assert reply["applied"][0]["what"] == "set the password of user 'door'"
        took = wait_for_version(group, B, base + 1, timeout_s=1.0)
        assert config(group, B)["digest"] == config(group, P)["digest"]
        status = call(group, P, "/api/v1/config-sync")[1]
        assert status["status"] == "In-Sync" and status["mate"]["version"] == base + 1, status
        assert call(group, B, "/api/v1/config-sync")[1]["status"] == "In-Sync"
        print(f"change on the primary seen on the backup after {took * 1000:.0f} ms")

    def test_a_change_sent_to_the_standby_is_refused_with_the_active_address(self, group):
        before = config(group, B)["version"]
        status, reply = call(group, B, "/api/v1/config/changes", {"changes": [{"kind": "anonymous.set",
                                                                               "allowed": False}]})
        assert status == 409, reply
        active = f"{group.address(P)}:{group.config.ports.management}"
        assert reply["active"] == active and f"the active node is {active}" in reply["error"]
        assert config(group, B)["version"] == before == config(group, P)["version"]

    def test_a_malformed_change_is_refused_whole_with_its_field(self, group):
        before = config(group, P)
        bad = [{"kind": "anonymous.set", "allowed": False},  # fine alone, but the batch fails as a whole
               {"kind": "acl.add", "rule": {"effect": "allow", "action": "publish", "filter": "a/#/b", "who": "all"}}]
        status, reply = call(group, P, "/api/v1/config/changes", {"changes": bad})
        assert status == 400 and "changes[1].rule.filter" in reply["error"], reply
        status, reply = call(group, P, "/api/v1/config/changes",
                             {"changes": [{"kind": "limits.set", "name": "spool_max_bytes", "value": -1}]})
        assert status == 400 and "spool_max_bytes must be a whole number" in reply["error"], reply
        status, reply = call(group, P, "/api/v1/config/changes", {"changes": [{"kind": "anonymous.set",
                                                                               "allowed": False}]}, token=False)
        assert status == 401
        after = config(group, P)
        assert (after["version"], after["digest"]) == (before["version"], before["digest"])
        assert config(group, B)["version"] == before["version"]
        code, client, _ = connect(group.address(P))
        assert code == 0  # anonymous still allowed: nothing half-applied
        client.disconnect()  # the group goes on: a client left looping would reconnect and take over "cfg-test"
        client.loop_stop()

    def test_a_deleted_user_is_disconnected(self, group):
        change(group, P, {"kind": "user.set", "username": "door", "record": RECORD})
        code, door, dropped = connect(group.address(P), "door", "door-pw")
        assert code == 0
        change(group, P, {"kind": "user.delete", "username": "door"})
        deadline = time.monotonic() + 5
        while not dropped and time.monotonic() < deadline:
            time.sleep(0.05)
        door.loop_stop()
        assert dropped and dropped[0] == 0x87, f"the deleted user's client was not told 'not authorized': {dropped}"

    def test_concurrent_changes_keep_a_single_order(self, group):
        base = config(group, P)["version"]
        changes = [{"kind": "limits.set", "name": "session_queue_max_messages", "value": 1000 + i} for i in range(20)]
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            replies = list(pool.map(lambda c: change(group, P, c), changes))
        versions = sorted(r["applied"][0]["version"] for r in replies)
        assert versions == list(range(base + 1, base + 21))
        wait_for_version(group, B, base + 20)
        primary, backup = config(group, P), config(group, B)
        assert primary["digest"] == backup["digest"] and primary["history"] == backup["history"]
        last = max(replies, key=lambda r: r["applied"][0]["version"])["applied"][0]["what"]
        limit = primary["limits"]["set"]["session_queue_max_messages"]
        assert last == f"limits.session_queue_max_messages set to {limit:,}"

    def test_only_the_mate_with_the_secret_speaks_on_8302(self, group):
        """Config-sync's link is authenticated like the mate link, with keys of its own. The active proves itself
        first: a stranger without the secret, and a mate-link handshake (right secret, wrong purpose), cannot
        verify that proof, so they learn nothing and cannot go on; a forged proof and garbage are refused and
        counted by the active; nothing changes and the real standby stays in sync."""
        import os
        import socket
        import struct

        from pairmq.appliance.config import load_secret
        from pairmq.mate_link.secure import HandshakeFailed, StandbyHandshake

        address = (group.address(P), group.config.ports.config_sync)
        before = config(group, P)

        def challenge_for(handshake) -> str:
            """Run `handshake` against the active until it fails; the reason our side refused the active."""
            with socket.create_connection(address, timeout=5) as s:
                s.sendall(handshake.data_to_send())
                try:
                    while chunk := s.recv(4096):
                        handshake.receive_data(chunk)
                except HandshakeFailed as exc:
                    return exc.reason
            return "closed"

        stranger = StandbyHandshake(b"not the group secret" * 2, group.config.name, B, os.urandom(32), "config-sync")
        assert challenge_for(stranger) == "bad_proof"
        mate_link_peer = StandbyHandshake(load_secret(group.config), group.config.name, B, os.urandom(32))
        assert challenge_for(mate_link_peer) == "bad_proof"

        with socket.create_connection(address, timeout=5) as s:  # a forged PROOF after the challenge
            forger = StandbyHandshake(b"x" * 32, group.config.name, B, os.urandom(32), "config-sync")
            s.sendall(forger.data_to_send())
            s.recv(4096)
            s.sendall(struct.pack(">I", 32) + os.urandom(32))
            s.settimeout(5)
            assert s.recv(4096) == b""  # closed on us
        with socket.create_connection(address, timeout=5) as s:
            s.sendall(b"\x00\x00\x00\x05hello, config")
            s.settimeout(5)
            assert s.recv(4096) == b""
        refusals = call(group, P, "/api/v1/config-sync")[1]["refusals"]
        assert refusals.get("malformed", 0) >= 1 and refusals.get("bad_proof", 0) >= 1, refusals
        after = config(group, P)
        assert (after["version"], after["digest"]) == (before["version"], before["digest"])
        group.wait_for("the real standby still in sync", group.config_in_sync, timeout_s=5)

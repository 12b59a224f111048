"""Hostile users against a real group: sessions owned by their user, the ACL at delivery, user removal.

One group for the module (anonymous refused). Its ACL, first match wins:

    0 allow both      alice/#           user:alice
    1 allow both      public/#          users
    2 deny  subscribe test/nosubscribe  all
    3 allow both      #                 user:bob

mallory may use public/# only. Clients are raw sockets (tests/harness/mqttraw.py) so that
CONNACK codes, session-present and exactly what was delivered are seen as sent. The
tests run in file order: the last ones fail over to the backup and check there.
"""

from __future__ import annotations

import os
import struct
import uuid

import pytest

from pairmq.appliance.broker.access import AccessPolicy, Action, Effect, Rule, hash_password
from pairmq.appliance.roles import Role
from tests.harness import config_api
from tests.harness.group import LOOPBACK, Group
from tests.harness.mqttraw import CONNACK, DISCONNECT, PORT, PUBACK, PUBLISH, V5, V311, Raw, encode_props, utf8

P, B = Role.PRIMARY, Role.BACKUP
PASSWORDS = {"alice": "alice-password", "bob": "bob-password", "mallory": "mallory-password",
             "carol": "carol-password"}
RULES = (("allow", "both", "alice/#", "user:alice"), ("allow", "both", "public/#", "users"),
         ("deny", "subscribe", "test/nosubscribe", "all"), ("allow", "both", "#", "user:bob"))
NOT_AUTHORIZED_V5, NOT_AUTHORIZED_V311 = 0x87, 5
SESSION_EXPIRY = 0x11


def the_policy() -> AccessPolicy:
    users = {name: hash_password(pw.encode(), os.urandom(16)) for name, pw in PASSWORDS.items()}
    return AccessPolicy(False, users, tuple(Rule(Effect(e), Action(a), f, w) for e, a, f, w in RULES))


@pytest.fixture(scope="module")
def group(tmp_path_factory):
    with Group(tmp_path_factory.mktemp("hostile-sessions") / "group", access=the_policy()) as g:
        g.start()
        g.wait_for("the primary to serve", lambda: serving(g, P), timeout_s=30)
        g.wait_for("the backup to be in sync", g.backup_in_sync, timeout_s=30)
        yield g


def serving(g: Group, role: Role) -> bool:
    try:
        return g.api(role, "/api/v1/redundancy")["serving"]
    except OSError:
        return False


def login(user: str | None, client_id: str, *, clean: bool, version: int = V5, host: str | None = None,
          password: str | None = None) -> tuple[Raw, int, bool]:
    """CONNECT as `user` (its password unless given): (client, CONNACK code, session present)."""
    raw = Raw(version, host or LOOPBACK[P], PORT)
    flags = (0x02 if clean else 0) | (0xC0 if user is not None else 0)
    body = utf8("MQTT") + bytes([version, flags]) + struct.pack("!H", 60)
    if version == V5:
        body += encode_props([(SESSION_EXPIRY, 3600)])
    body += utf8(client_id)
    if user is not None:
        secret = (password if password is not None else PASSWORDS[user]).encode()
        body += utf8(user) + struct.pack("!H", len(secret)) + secret
    raw.send(0x10, body)
    connack = raw.recv()
    assert connack is not None and connack.type == CONNACK, connack
    return raw, connack.reason_and_props()[0], bool(connack.body[0] & 1)


def published(raw: Raw) -> list[str]:
    """The topics of the PUBLISHes delivered before a PINGRESP (QoS 1 ones acked)."""
    topics: list[str] = []
    for packet in raw.barrier():
        take(raw, packet, topics)
    return topics


def take(raw: Raw, packet, topics: list[str]) -> None:
    """A PUBLISH's topic into `topics`, acked if it is QoS 1; other packets are passed over."""
    if packet.type == PUBLISH:
        topic, packet_id, _props, _payload = packet.publish()
        topics.append(topic)
        if packet_id:
            raw.ack(PUBACK, packet_id)


def publish(topic: str, host: str, *, retain: bool = False) -> None:
    """bob (allowed everywhere) publishes one QoS 1 message and waits for its PUBACK."""
    raw, code, _ = login("bob", f"pub-{uuid.uuid4().hex[:8]}", clean=True, host=host)
    assert code == 0
    body = utf8(topic) + struct.pack("!H", 1) + encode_props([]) + b"payload"
    raw.send(0x30 | (1 << 1) | (1 if retain else 0), body)
    assert raw.expect(PUBACK).reason_and_props()[0] in (0, 0x10)
    raw.close()


def receive_until_marker(raw: Raw, marker: str) -> list[str]:
    """Topics delivered up to and including `marker` (one publisher's messages arrive in order)."""
    got: list[str] = []
    while marker not in got:
        packet = raw.recv()
        assert packet is not None, f"closed while waiting for {marker} (had {got})"
        take(raw, packet, got)
    return got


def subscribe(raw: Raw, topic_filter: str, packet_id: int = 1) -> int:
    return raw.subscribe(packet_id, topic_filter, 1).codes()[0]


def offline_alice_with_a_queued_message(host: str, client_id: str, version: int) -> None:
    alice, code, _ = login("alice", client_id, clean=False, version=version, host=host)
    assert code == 0
    assert subscribe(alice, "alice/inbox") == 1
    alice.disconnect()
    alice.close()
    publish("alice/inbox", host)


# --- sessions owned by their user ----------------------------------------------------------------


@pytest.mark.parametrize("version", [V311, V5], ids=["v311", "v5"])
def test_another_user_cannot_resume_a_stored_session(group, version):
    client_id = f"alice-{uuid.uuid4().hex[:8]}"
    offline_alice_with_a_queued_message(LOOPBACK[P], client_id, version)
    mallory, code, present = login("mallory", client_id, clean=False, version=version)
    assert code == (NOT_AUTHORIZED_V5 if version == V5 else NOT_AUTHORIZED_V311) and not present
    assert mallory.closed() == []  # refused: nothing of alice's session was sent
    alice, code, present = login("alice", client_id, clean=False, version=version)
    assert (code, present) == (0, True)
    assert published(alice) == ["alice/inbox"]  # still queued for its owner
    alice.close()


def test_another_user_cannot_take_a_live_session_over(group):
    client_id = f"alice-{uuid.uuid4().hex[:8]}"
    alice, code, _ = login("alice", client_id, clean=False)
    assert code == 0 and subscribe(alice, "alice/live") == 1
    for clean in (False, True):
        mallory, code, present = login("mallory", client_id, clean=clean)
        assert (code, present) == (NOT_AUTHORIZED_V5, False)
        mallory.close()
    publish("alice/live", LOOPBACK[P])
    assert receive_until_marker(alice, "alice/live") == ["alice/live"]  # alice was never kicked off
    alice.close()


def test_by_the_switch_another_user_gets_a_clean_session_never_the_old_one(group):
    client_id = f"alice-{uuid.uuid4().hex[:8]}"
    offline_alice_with_a_queued_message(LOOPBACK[P], client_id, V5)
    config_api.change(group, P, {"kind": "limits.set", "name": "session_other_user_clean_start", "value": 1})
    try:
        mallory, code, present = login("mallory", client_id, clean=False)
        assert (code, present) == (0, False)
        assert subscribe(mallory, "public/marker") == 1
        publish("public/marker", LOOPBACK[P])
        assert receive_until_marker(mallory, "public/marker") == ["public/marker"]  # nothing of alice's
        mallory.disconnect()
        alice, code, present = login("alice", client_id, clean=False)
        assert (code, present) == (0, False)  # alice's old session was discarded, not kept for her
        alice.close()
    finally:
        config_api.change(group, P, {"kind": "limits.set", "name": "session_other_user_clean_start", "value": None})


# --- the ACL at delivery ---------------------------------------------------------------------------


def test_a_wildcard_overlapping_a_deny_rule_is_granted_and_the_denied_topic_withheld(group):
    # mosquitto's case: `deny subscribe test/nosubscribe` + `allow both #` grants `#`, `+/+`, `TopicA/#`
    publish("test/nosubscribe", LOOPBACK[P], retain=True)
    publish("TopicA/retained", LOOPBACK[P], retain=True)
    bob, code, _ = login("bob", f"bob-{uuid.uuid4().hex[:8]}", clean=True)
    assert code == 0
    filters = [("TopicA/#", 1), ("+/+", 1), ("#", 1), ("test/nosubscribe", 1)]
    assert bob.subscribe_many(1, filters).codes() == [1, 1, 1, NOT_AUTHORIZED_V5]
    publish("test/nosubscribe", LOOPBACK[P])
    publish("test/other", LOOPBACK[P])
    got = receive_until_marker(bob, "test/other")  # the retained copies were queued before it
    assert "TopicA/retained" in got and "test/nosubscribe" not in got
    bob.close()


def revoke_alice(g: Group, role: Role) -> dict:
    return config_api.change(g, role, {"kind": "acl.delete", "index": 0})


def restore_alice(g: Group, role: Role) -> None:
    policy = the_policy()
    current = AccessPolicy.from_document(config_api.call(g, role, "/api/v1/config/document")[1]["document"]["access"])
    config_api.set_policy(g, AccessPolicy(False, current.users, policy.rules), role)


def test_a_revoked_rule_withholds_the_next_delivery_live_and_queued(group):
    host = LOOPBACK[P]
    live_id, stored_id = f"alice-{uuid.uuid4().hex[:8]}", f"alice-{uuid.uuid4().hex[:8]}"
    offline_alice_with_a_queued_message(host, stored_id, V5)
    alice, code, _ = login("alice", live_id, clean=True)
    assert code == 0 and subscribe(alice, "alice/inbox") == 1 and subscribe(alice, "public/marker", 2) == 1
    revoke_alice(group, P)
    try:
        publish("alice/inbox", host)
        publish("public/marker", host)
        assert receive_until_marker(alice, "public/marker") == ["public/marker"]
        stored, code, present = login("alice", stored_id, clean=False)
        assert (code, present) == (0, True)
        assert published(stored) == []  # queued before the revocation, withheld at delivery
    finally:
        restore_alice(group, P)


def test_removing_a_user_ends_its_connections_and_sessions(group):
    client_id = f"carol-{uuid.uuid4().hex[:8]}"
    carol, code, _ = login("carol", client_id, clean=False)
    assert code == 0 and subscribe(carol, "public/carol") == 1
    record = config_api.call(group, P, "/api/v1/config/document")[1]["document"]["access"]["users"]["carol"]
    config_api.change(group, P, {"kind": "user.delete", "username": "carol"})
    closing = carol.closed()
    assert [p.reason_and_props()[0] for p in closing if p.type == DISCONNECT] == [NOT_AUTHORIZED_V5]
    config_api.change(group, P, {"kind": "user.set", "username": "carol", "record": record})
    carol, code, present = login("carol", client_id, clean=False)
    assert (code, present) == (0, False)  # the session went with the user
    carol.close()


# --- after a failover: the owner and the ACL hold on the backup ----------------------------------------------


def test_after_a_failover_the_backup_keeps_owners_and_follows_the_acl(group):
    client_id = f"alice-{uuid.uuid4().hex[:8]}"
    offline_alice_with_a_queued_message(LOOPBACK[P], client_id, V5)
    group.wait_for("the backup to be in sync", group.backup_in_sync, timeout_s=30)
    group.kill(P)
    group.wait_for("the backup to serve", lambda: serving(group, B), timeout_s=30)
    host = LOOPBACK[B]
    mallory, code, present = login("mallory", client_id, clean=False, host=host)
    assert (code, present) == (NOT_AUTHORIZED_V5, False)
    alice, code, present = login("alice", client_id, clean=False, host=host)
    assert (code, present) == (0, True)
    assert published(alice) == ["alice/inbox"]
    assert subscribe(alice, "public/marker", 2) == 1
    revoke_alice(group, B)
    publish("alice/inbox", host)
    publish("public/marker", host)
    assert receive_until_marker(alice, "public/marker") == ["public/marker"]
    alice.close()

"""The access policy (appliance/broker/access.py): hashing, ACL evaluation, the document's checks.

Pure functions, no sockets: subsumption and overlap are also checked against
brute force over a small topic universe (hypothesis), since a subscription
granted by mistake would leak every message it matches.
"""

import hashlib
import itertools
import sys
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pairmq.appliance.broker.access import (
    AccessDocumentError, AccessPolicy, Action, Effect, Rule, VerifiedCache, hash_password, overlaps, subsumes,
    verify_password,
)

FAST = dict(n=16, r=1, p=1)  # scrypt parameters for tests that are not about its cost
SALT = b"0123456789abcdef"


def policy(*rules, anonymous=True, users=("alice", "bob")) -> AccessPolicy:
    record = hash_password(b"pw", SALT, **FAST)
    return AccessPolicy(anonymous, {u: record for u in users},
                        tuple(Rule(Effect(e), Action(a), f, w) for e, a, f, w in rules))


# --- passwords ---------------------------------------------------------------------------


def test_hash_and_verify():
    record = hash_password(b"s3cret", SALT)
    assert (record.n, record.r, record.p, len(record.hash)) == (16384, 8, 1, 32)
    assert verify_password(record, b"s3cret")
    assert not verify_password(record, b"s3creT")
    assert not verify_password(record, b"")
    assert hash_password(b"s3cret", b"another salt 16b").hash != record.hash


def test_a_short_salt_is_refused():
    with pytest.raises(ValueError, match="salt"):
        hash_password(b"pw", b"short")


def test_scrypt_releases_the_gil():
    """The node verifies passwords in threads: that only helps if the event loop's thread keeps running.

    With the switch interval out of reach, the only way the main thread (which gives the GIL up only in its
    `sleep(0)`) gets a turn while the worker is inside scrypt is scrypt releasing the GIL; a call that held it
    (a regular expression, say) leaves it no turn there at all."""
    inside = threading.Event()
    done = threading.Event()

    def work():
        for _ in range(4):
            inside.set()
            hashlib.scrypt(b"pw", salt=SALT, n=1 << 15, r=8, p=1, maxmem=64 << 20)
            inside.clear()
        done.set()

    switch_interval = sys.getswitchinterval()
    sys.setswitchinterval(60)
    try:
        thread = threading.Thread(target=work)
        turns_inside = 0
        thread.start()
        while not done.is_set():
            time.sleep(0)
            turns_inside += inside.is_set()
        thread.join()
    finally:
        sys.setswitchinterval(switch_interval)
    assert turns_inside > 0


def test_verified_cache_is_keyed_bounded_and_forgets_old_records():
    cache = VerifiedCache(b"k" * 32, capacity=2)
    rec = hash_password(b"pw", SALT, **FAST)
    a, b, c = (cache.token(u, b"pw", rec) for u in ("a", "b", "c"))
    assert b"pw" not in a and len(a) == 32
    assert VerifiedCache(b"j" * 32).token("a", b"pw", rec) != a  # the key matters
    cache.add(a)
    cache.add(b)
    assert a in cache  # touches a: b is now the oldest
    cache.add(c)
    assert len(cache) == 2 and a in cache and c in cache and b not in cache
    new_record = hash_password(b"pw", b"fedcba9876543210", **FAST)
    assert cache.token("a", b"pw", new_record) not in cache  # passwd: the old entry no longer applies
    # Length prefixes: ("ab", "c") and ("a", "bc") are different credentials.
    assert cache.token("ab", b"c", rec) != cache.token("a", b"bc", rec)


# --- filters -------------------------------------------------------------------------------


def lv(text):
    return tuple(text.split("/"))


@pytest.mark.parametrize("outer, inner, expected", [
    ("a/#", "a/b/+", True), ("a/#", "a", True), ("a/#", "a/#", True), ("a/#", "#", False), ("a/#", "+/b", False),
    ("a/+", "a/b", True), ("a/+", "a/+", True), ("a/+", "a/#", False), ("a/+", "a/b/c", False), ("a/+", "a", False),
    ("#", "#", True), ("#", "a/#", True), ("#", "$SYS/#", False), ("+/x", "$SYS/x", False), ("$SYS/#", "$SYS/a", True),
    ("a/b", "a/b", True), ("a/b", "a/+", False), ("a/b", "a/b/#", False), ("+/+", "a/+", True), ("+", "", True),
])
def test_subsumes(outer, inner, expected):
    assert subsumes(lv(outer), lv(inner)) is expected


@pytest.mark.parametrize("a, b, expected", [
    ("secret/#", "#", True), ("secret/#", "+/x", True), ("secret/#", "public/#", False), ("a/+", "+/b", True),
    ("a/b", "a/c", False), ("a/#", "a", True), ("a", "a/b", False), ("#", "$SYS/a", False), ("$SYS/#", "+/a", False),
    ("+", "$x", False), ("a/+/c", "a/b/#", True), ("a/+/c", "a/b/d", False),
])
def test_overlaps(a, b, expected):
    assert overlaps(lv(a), lv(b)) is expected
    assert overlaps(lv(b), lv(a)) is expected


LEVELS = ["a", "b", "$s", ""]
TOPICS = [lv("/".join(t)) for n in (1, 2, 3) for t in itertools.product(LEVELS, repeat=n)]


def brute_matches(filter_levels, topic) -> bool:
    for i, f in enumerate(filter_levels):
        if f == "#":
            return not (i == 0 and topic[0].startswith("$"))
        if i >= len(topic):
            return False
        if f == "+":
            if i == 0 and topic[0].startswith("$"):
                return False
        elif f != topic[i]:
            return False
    return len(topic) == len(filter_levels)


filters = st.lists(st.sampled_from(["a", "b", "$s", "", "+"]), min_size=0, max_size=2).flatmap(
    lambda head: st.sampled_from([head + ["#"], head]) if head else st.just(["#"])).map(tuple)


@settings(max_examples=400, deadline=None)
@given(filters, filters)
def test_subsumes_and_overlaps_agree_with_brute_force(a, b):
    """On topics of up to 3 levels (filters here have at most 3): exactly the set relations."""
    in_a = {t for t in TOPICS if brute_matches(a, t)}
    in_b = {t for t in TOPICS if brute_matches(b, t)}
    assert overlaps(a, b) == bool(in_a & in_b), (a, b)
    if len(b) <= 3 and b[-1] != "#" or len(b) <= 2:
        assert subsumes(a, b) == (in_b <= in_a), (a, b)


# --- ACL evaluation --------------------------------------------------------------------------


def test_no_acl_allows_everything_to_known_users_and_allowed_anonymous():
    p = policy()
    assert p.authorize("alice", "publish", "any/topic")
    assert p.authorize(None, "subscribe", "#")
    assert not p.authorize("mallory", "publish", "x")  # not a user (deleted while connected)
    assert not policy(anonymous=False).authorize(None, "publish", "x")  # anonymous turned off meanwhile


def test_first_match_wins_and_default_deny_once_any_rule_exists():
    p = policy(("deny", "publish", "a/secret", "user:alice"), ("allow", "both", "a/#", "users"),
               ("allow", "subscribe", "public/#", "anonymous"))
    assert not p.authorize("alice", "publish", "a/secret")
    assert p.authorize("bob", "publish", "a/secret")
    assert p.authorize("alice", "publish", "a/x")
    assert not p.authorize("alice", "publish", "b")  # no rule: denied
    assert p.authorize(None, "subscribe", "public/+/t")
    assert not p.authorize(None, "publish", "public/x")  # the anonymous rule is subscribe-only
    assert not p.authorize(None, "subscribe", "a/#")


def test_subscribe_needs_an_allow_rule_that_subsumes_the_filter():
    p = policy(("allow", "subscribe", "a/#", "all"))
    assert p.authorize("alice", "subscribe", "a/b/+")
    assert p.authorize("alice", "subscribe", "a")
    assert not p.authorize("alice", "subscribe", "#")
    assert not p.authorize("alice", "subscribe", "+/b")
    assert p.authorize("alice", "subscribe", "$share/g/a/b")  # judged by the filter after the group
    assert not p.authorize("alice", "subscribe", "$share/g/#")


def test_a_deny_rule_refuses_the_subscriptions_it_covers_and_withholds_the_rest_at_delivery():
    # A deny rule refuses only the filters it covers; one it merely overlaps (`#`, `+/x`) is withheld at delivery.
    p = policy(("deny", "subscribe", "secret/#", "all"), ("allow", "subscribe", "#", "all"))
    assert p.authorize("alice", "subscribe", "#")
    assert p.authorize("alice", "subscribe", "+/x")
    assert not p.authorize("alice", "subscribe", "secret/#")
    assert not p.authorize("alice", "subscribe", "secret/a/+")
    assert p.authorize("alice", "subscribe", "public/#")
    assert p.authorize("alice", "subscribe", "$SYS/#") is False  # `#` in the rule does not reach $ topics
    assert not p.may_receive("alice", "secret/x") and p.may_receive("alice", "public/x")
    assert p.may_receive("alice", "x")


def test_mosquitto_deny_one_topic_keeps_broad_subscriptions():
    p = policy(("deny", "subscribe", "test/nosubscribe", "all"), ("allow", "both", "#", "all"))
    assert all(p.authorize(None, "subscribe", f) for f in ("#", "+/+", "TopicA/#"))
    assert not p.authorize(None, "subscribe", "test/nosubscribe")
    assert not p.may_receive(None, "test/nosubscribe") and p.may_receive(None, "test/other")


def test_receive_decisions_follow_the_policy_in_force():
    p = policy(("allow", "both", "alice/#", "user:alice"), ("allow", "both", "bob/#", "user:bob"))
    assert p.may_receive("alice", "alice/x") and not p.may_receive("bob", "alice/x")
    revoked = p.without_rule(0)
    assert not revoked.may_receive("alice", "alice/x")  # a new policy: the cached decision is not reused
    assert p.may_receive("alice", "alice/x")
    assert not policy().without_user("alice").may_receive("alice", "x")  # a user that no longer exists


def test_user_rules_name_one_user():
    p = policy(("allow", "publish", "alice/#", "user:alice"))
    assert p.authorize("alice", "publish", "alice/x")
    assert not p.authorize("bob", "publish", "alice/x")
    assert not p.authorize(None, "publish", "alice/x")


# --- the document ------------------------------------------------------------------------------


def good_doc() -> dict:
    return policy(("allow", "both", "a/#", "user:alice")).to_document()


def test_document_round_trip():
    doc = good_doc()
    assert AccessPolicy.from_document(doc).to_document() == doc
    assert AccessPolicy.from_document({"version": 1}) == AccessPolicy()


def edit(path, value):
    def apply(doc):
        target = doc
        for key in path[:-1]:
            target = target[key]
        if value is DELETE:
            del target[path[-1]]
        else:
            target[path[-1]] = value
        return doc
    return apply


DELETE = object()


@pytest.mark.parametrize("change, fragment", [
    (edit(["version"], 2), "version must be 1"),
    (edit(["extra"], 1), "unknown field 'extra'"),
    (edit(["allow_anonymous"], "yes"), "allow_anonymous must be true or false"),
    (edit(["users"], []), "users must be an object"),
    (edit(["users", ""], {}), "users['']: a username must be"),
    (edit(["users", "a\x00b"], {}), "control characters"),
    (edit(["users", "alice", "scheme"], "md5"), "users['alice'].scheme must be \"scrypt\""),
    (edit(["users", "alice", "n"], 1000), "users['alice'].n must be a power of two"),
    (edit(["users", "alice", "n"], True), "users['alice'].n must be a whole number"),
    (edit(["users", "alice", "r"], 0), "users['alice'].r must be a whole number 1..32"),
    (edit(["users", "alice", "salt"], "zz"), "users['alice'].salt must be 16..64 bytes as hex"),
    (edit(["users", "alice", "hash"], DELETE), "users['alice'].hash must be"),
    (edit(["users", "alice", "pepper"], 1), "users['alice']: unknown field 'pepper'"),
    (edit(["users", "alice"], "hash"), "users['alice'] must be a scrypt record"),
    (edit(["acl"], {}), "acl must be a list"),
    (edit(["acl", 0, "effect"], "maybe"), "acl[0].effect must be allow or deny"),
    (edit(["acl", 0, "action"], "read"), "acl[0].action must be publish, subscribe or both"),
    (edit(["acl", 0, "filter"], "a/#/b"), "acl[0].filter 'a/#/b'"),
    (edit(["acl", 0, "filter"], 5), "acl[0].filter must be a topic filter string"),
    (edit(["acl", 0, "filter"], "$share/g/a"), "acl[0].filter: rules name topics"),
    (edit(["acl", 0, "who"], "alice"), "acl[0].who must be all, users, anonymous or user:NAME"),
    (edit(["acl", 0, "who"], "user:"), "acl[0].who: a username must be"),
    (edit(["acl", 0, "because"], "x"), "acl[0]: unknown field 'because'"),
])
def test_malformed_documents_name_the_field(change, fragment):
    with pytest.raises(AccessDocumentError) as err:
        AccessPolicy.from_document(change(good_doc()))
    assert fragment in str(err.value)


def test_not_an_object():
    with pytest.raises(AccessDocumentError, match="must be a JSON object"):
        AccessPolicy.from_document([1])


def test_edits_validate_and_return_new_policies():
    p = AccessPolicy()
    q = p.with_rule(Rule(Effect.ALLOW, Action.PUBLISH, "a/+", "users"))
    assert p.rules == () and len(q.rules) == 1
    with pytest.raises(AccessDocumentError, match="acl\\[1\\].filter 'a/#/b'"):
        q.with_rule(Rule(Effect.ALLOW, Action.PUBLISH, "a/#/b", "users"))
    with pytest.raises(AccessDocumentError, match="no rule 3"):
        q.without_rule(3)
    assert q.without_rule(0).rules == ()
    record = hash_password(b"pw", SALT, **FAST)
    assert "alice" in p.with_user("alice", record).users
    assert p.with_user("alice", record).without_user("alice").users == {}

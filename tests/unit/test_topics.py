"""Topic validation, the subscription index and the retained index, driven directly."""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from pairmq.appliance.broker.retained import RetainedIndex
from pairmq.appliance.broker.topics import (
    Delivery, Match, SubscriptionIndex, TopicError, collapse_per_client,
    parse_shared, validate_topic_filter, validate_topic_name,
)
from pairmq.appliance.errors import RemoteProtocolError
from pairmq.appliance.mqtt.wire import MqttError, ReasonCode

R = ReasonCode


@dataclass(frozen=True, slots=True)
class Opts:
    qos: int = 0
    no_local: bool = False
    retain_as_published: bool = False
    subscription_id: int | None = None


def ref_matches(topic_filter: str, topic: str) -> bool:
    """The matching rules of §4.7, written the slow and obvious way."""
    f = topic_filter.split("/")
    t = topic.split("/")
    if t[0].startswith("$") and f[0] in ("+", "#"):
        return False
    for i, level in enumerate(f):
        if level == "#":
            return True
        if i >= len(t) or (level != "+" and level != t[i]):
            return False
    return len(f) == len(t)


def matched(index: SubscriptionIndex, topic: str) -> set[tuple[object, str]]:
    return {(m.client_id, m.filter) for m in index.match(topic)}


# --- the rules the cores live by ----------------------------------------------

# --- validation ---------------------------------------------------------------

@pytest.mark.parametrize("name", [
    "a", "/", "//", "sport/tennis/player1", "/finance", "finance/", "$SYS/broker",
    "ACCOUNTS", "Accounts payable", "é/ü/日本", "a" * 65_535, "é" * 32_767 + "a"])
def test_valid_topic_names(name):
    validate_topic_name(name)


@pytest.mark.parametrize("name, why", [
    ("", "empty"), ("sport/+", "wildcard"), ("sport/#", "wildcard"),
    ("a+b", "wildcard"), ("a#", "wildcard"), ("a\x00b", "U+0000"),
    ("a" * 65_536, "65535"), ("é" * 32_768, "65535"), ("\ud800", "UTF-8")])
def test_invalid_topic_names_are_0x90(name, why):
    with pytest.raises(TopicError) as info:
        validate_topic_name(name)
    err = info.value
    assert isinstance(err, MqttError) and isinstance(err, RemoteProtocolError)
    assert err.reason_code is R.TOPIC_NAME_INVALID
    assert why in err.message


def test_empty_topic_name_is_allowed_when_an_alias_will_supply_it():
    validate_topic_name("", allow_empty=True)
    with pytest.raises(TopicError):
        validate_topic_name("a/+", allow_empty=True)


@pytest.mark.parametrize("topic_filter", [
    "#", "+", "+/+", "/+", "sport/#", "sport/tennis/#", "sport/tennis/+",
    "+/tennis/#", "sport/+/player1", "$SYS/#", "$SYS/monitor/+", "/", "//",
    "$share/g/#", "$share", "a" * 65_535])
def test_valid_topic_filters(topic_filter):
    validate_topic_filter(topic_filter)


@pytest.mark.parametrize("topic_filter, why", [
    ("", "empty"), ("sport/tennis#", "'#'"), ("sport/tennis/#/ranking", "'#'"),
    ("#/a", "'#'"), ("##", "'#'"), ("sport+", "'+'"), ("a/+b/c", "'+'"),
    ("++", "'+'"), ("a\x00", "U+0000"), ("a" * 65_536, "65535")])
def test_invalid_topic_filters_are_0x8f(topic_filter, why):
    with pytest.raises(TopicError) as info:
        validate_topic_filter(topic_filter)
    assert info.value.reason_code is R.TOPIC_FILTER_INVALID
    assert why in info.value.message


@pytest.mark.parametrize("topic_filter, expected", [
    ("sport/#", (None, "sport/#")),
    ("$share", (None, "$share")),
    ("$shared/g/a", (None, "$shared/g/a")),
    ("$SYS/#", (None, "$SYS/#")),
    ("$share/g/a/b", ("g", "a/b")),
    ("$share/consumers/sport/+/player1", ("consumers", "sport/+/player1")),
    ("$share/g/#", ("g", "#")),
    ("$share/g//", ("g", "/")),
    ("$share/g/$SYS/#", ("g", "$SYS/#")),
])
def test_parse_shared(topic_filter, expected):
    assert parse_shared(topic_filter) == expected


@pytest.mark.parametrize("topic_filter", [
    "$share/x", "$share/x/", "$share//a", "$share/", "$share/#", "$share/+/a",
    "$share/a+/b", "$share/g/a#", "$share/g/#/a", "$share/g/a\x00"])
def test_invalid_shared_filters_are_0x8f(topic_filter):
    with pytest.raises(TopicError) as info:
        parse_shared(topic_filter)
    assert info.value.reason_code is R.TOPIC_FILTER_INVALID


# --- matching: the spec's examples ---------------------------------------------

SPEC_EXAMPLES = [
    # §4.7.1.2 multi-level wildcard
    ("sport/tennis/player1/#", "sport/tennis/player1", True),
    ("sport/tennis/player1/#", "sport/tennis/player1/ranking", True),
    ("sport/tennis/player1/#", "sport/tennis/player1/score/wimbledon", True),
    ("sport/#", "sport", True),
    ("#", "sport/tennis", True),
    ("#", "/", True),
    # §4.7.1.3 single-level wildcard
    ("sport/tennis/+", "sport/tennis/player1", True),
    ("sport/tennis/+", "sport/tennis/player2", True),
    ("sport/tennis/+", "sport/tennis/player1/ranking", False),
    ("sport/+", "sport", False),
    ("sport/+", "sport/", True),
    ("+/+", "/finance", True),
    ("/+", "/finance", True),
    ("+", "/finance", False),
    ("+/tennis/#", "sport/tennis/player1", True),
    ("sport/+/player1", "sport/tennis/player1", True),
    # §4.7.2 topics beginning with $
    ("#", "$SYS/monitor/Clients", False),
    ("+/monitor/Clients", "$SYS/monitor/Clients", False),
    ("$SYS/#", "$SYS/monitor/Clients", True),
    ("$SYS/monitor/+", "$SYS/monitor/Clients", True),
    ("+", "$SYS", False),
    ("#", "$", False),
    ("a/+", "a/$b", True),  # the $ rule binds only at the first level
    ("a/#", "a/$b/c", True),
    # §4.7.3 case-sensitive, spaces allowed, no normalisation
    ("ACCOUNTS", "Accounts", False),
    ("Accounts payable", "Accounts payable", True),
    ("a/b", "a//b", False),
]


@pytest.mark.parametrize("topic_filter, topic, expected", SPEC_EXAMPLES)
def test_spec_examples(topic_filter, topic, expected):
    assert ref_matches(topic_filter, topic) is expected
    index = SubscriptionIndex()
    index.subscribe("c", topic_filter, Opts())
    assert bool(index.match(topic)) is expected
    retained = RetainedIndex()
    retained.set(topic, b"v")
    assert bool(list(retained.matching(topic_filter))) is expected


def test_match_returns_who_with_which_options_through_which_filter():
    index = SubscriptionIndex()
    opts = Opts(qos=1)
    index.subscribe("c1", "sport/+", opts)
    index.subscribe("c2", "$share/g/sport/#", Opts(qos=2))
    got = sorted(index.match("sport/tennis"), key=lambda m: m.client_id)
    assert got == [Match("c1", opts, "sport/+", None),
                   Match("c2", Opts(qos=2), "$share/g/sport/#", "g")]
    assert got[0].options is opts


# --- subscribe / unsubscribe bookkeeping ---------------------------------------

def test_subscribe_replaces_the_same_filter_of_the_same_client():
    index = SubscriptionIndex()
    assert index.subscribe("c", "a/+", Opts(qos=0)) is False
    assert index.subscribe("c", "a/+", Opts(qos=2)) is True
    assert index.subscribe("d", "a/+", Opts(qos=1)) is False
    assert index.subscribe("c", "$share/g/a/+", Opts(qos=1)) is False
    assert index.subscribe("c", "$share/g/a/+", Opts(qos=0)) is True
    assert len(index) == 3
    assert {(m.client_id, m.options.qos) for m in index.match("a/b")} == {
        ("c", 2), ("d", 1), ("c", 0)}
    assert index.filters_of("c") == ["a/+", "$share/g/a/+"]


def test_unsubscribe_and_remove_client():
    index = SubscriptionIndex()
    index.subscribe("c", "a/#", Opts())
    index.subscribe("c", "$share/g/a/b", Opts())
    index.subscribe("d", "a/b", Opts())
    assert index.unsubscribe("c", "a/b") is False  # 0x11 No subscription existed
    assert index.unsubscribe("x", "a/b") is False
    assert index.unsubscribe("c", "a/#") is True
    assert index.unsubscribe("c", "a/#") is False
    assert matched(index, "a/b") == {("c", "$share/g/a/b"), ("d", "a/b")}
    assert index.remove_client("c") == 1
    assert index.remove_client("c") == 0
    assert matched(index, "a/b") == {("d", "a/b")}
    assert index.unsubscribe("d", "a/b") is True
    assert len(index) == 0 and index.match("a/b") == []
    assert index._root.children is None  # emptied nodes were pruned


def test_invalid_filters_change_nothing():
    index = SubscriptionIndex()
    for bad in ("a/#/b", "$share/x", "", "a+"):
        with pytest.raises(TopicError) as info:
            index.subscribe("c", bad, Opts())
        assert info.value.reason_code is R.TOPIC_FILTER_INVALID
        with pytest.raises(TopicError):
            index.unsubscribe("c", bad)
    assert len(index) == 0 and index._root.children is None


def test_deep_topics_do_not_recurse():
    index = SubscriptionIndex()
    deep = "/".join(["x"] * 30_000)
    validate_topic_name(deep)
    index.subscribe("c", deep, Opts())
    index.subscribe("c", "x/#", Opts())
    index.subscribe("c", "/".join(["+"] * 30_000), Opts())
    assert len(index.match(deep)) == 3
    index.remove_client("c")
    assert index._root.children is None
    retained = RetainedIndex()
    retained.set(deep, 1)
    assert list(retained.matching("#")) == [(deep, 1)]
    assert list(retained.matching("x/+/#")) == [(deep, 1)]
    assert retained.clear(deep) and len(retained) == 0


# --- overlapping subscriptions -------------------------------------------------

def test_overlapping_subscriptions_collapse_to_one_copy_per_client():
    index = SubscriptionIndex()
    index.subscribe("c", "sport/+", Opts(qos=1, subscription_id=3))
    index.subscribe("c", "sport/#", Opts(qos=2, subscription_id=7))
    index.subscribe("c", "#", Opts(qos=0))
    index.subscribe("c", "+/tennis", Opts(qos=0, subscription_id=3))
    index.subscribe("c", "sport/tennis", Opts(qos=0, subscription_id=0))  # 0: none
    index.subscribe("d", "sport/tennis", Opts(qos=0, retain_as_published=True))
    matches = index.match("sport/tennis")
    assert len(matches) == 6  # the index returns them all; the fold is the broker's
    assert collapse_per_client(matches) == {
        "c": Delivery(qos=2, subscription_ids=(3, 7), no_local=False,
                      retain_as_published=False),
        "d": Delivery(qos=0, subscription_ids=(), no_local=False,
                      retain_as_published=True),
    }


def test_collapse_drops_the_publishers_no_local_subscriptions_first():
    index = SubscriptionIndex()
    index.subscribe("p", "a/#", Opts(qos=2, no_local=True, subscription_id=1))
    index.subscribe("p", "a/b", Opts(qos=0, subscription_id=2))
    index.subscribe("q", "a/#", Opts(qos=1, no_local=True))
    index.subscribe("q", "a/+", Opts(qos=1, retain_as_published=True))
    matches = index.match("a/b")
    assert collapse_per_client(matches, publisher_id="p") == {
        "p": Delivery(0, (2,), False, False),
        "q": Delivery(1, (), False, True),
    }
    # Without the publisher only No Local subscriptions: no copy at all.
    index.unsubscribe("p", "a/b")
    assert "p" not in collapse_per_client(index.match("a/b"), publisher_id="p")
    # Without publisher_id the fold says whether every subscription was No Local.
    assert collapse_per_client(index.match("a/b"))["p"] == Delivery(2, (1,), True, False)


# --- shared subscriptions ------------------------------------------------------

def deliveries(index, topic, n, eligible=None) -> list[object]:
    out = []
    for _ in range(n):
        shared = [m for m in index.match(topic, eligible) if m.group is not None]
        assert len(shared) == 1
        out.append(shared[0].client_id)
    return out


def test_shared_group_round_robin_is_fair():
    index = SubscriptionIndex()
    for member in ("a", "b", "c"):
        index.subscribe(member, "$share/g/sensors/+", Opts(qos=1))
    got = deliveries(index, "sensors/t1", 300)
    assert got[:6] == ["a", "b", "c", "a", "b", "c"]
    assert collections.Counter(got) == {"a": 100, "b": 100, "c": 100}


def test_shared_member_removed_mid_way_and_one_joining():
    index = SubscriptionIndex()
    for member in ("a", "b", "c", "d"):
        index.subscribe(member, "$share/g/t", Opts())
    assert deliveries(index, "t", 5) == ["a", "b", "c", "d", "a"]
    index.unsubscribe("a", "$share/g/t")  # before the cursor: b still goes next
    assert deliveries(index, "t", 3) == ["b", "c", "d"]
    index.remove_client("c")  # at the cursor's left after d: rotation wraps to b
    assert deliveries(index, "t", 4) == ["b", "d", "b", "d"]
    index.subscribe("e", "$share/g/t", Opts())
    index.subscribe("b", "$share/g/t", Opts(qos=2))  # a replacement keeps b's turn
    got = deliveries(index, "t", 300)
    assert got[:3] == ["b", "d", "e"]
    assert collections.Counter(got) == {"b": 100, "d": 100, "e": 100}
    for member in ("b", "d", "e"):
        index.remove_client(member)
    assert index.match("t") == [] and index._root.children is None


def test_shared_member_removed_at_the_cursor():
    index = SubscriptionIndex()
    for member in ("a", "b", "c"):
        index.subscribe(member, "$share/g/t", Opts())
    assert deliveries(index, "t", 1) == ["a"]
    index.remove_client("b")  # b's turn was next; c inherits it
    assert deliveries(index, "t", 4) == ["c", "a", "c", "a"]


def test_shared_eligibility_skips_members_and_falls_back_when_none_is():
    index = SubscriptionIndex()
    for member in ("a", "b", "c"):
        index.subscribe(member, "$share/g/t", Opts())
    online = {"a", "c"}
    got = deliveries(index, "t", 100, eligible=online.__contains__)
    assert collections.Counter(got) == {"a": 50, "c": 50}
    online.clear()
    # Nobody can take it: whoever's turn it is still gets it, in rotation.
    assert deliveries(index, "t", 3, eligible=online.__contains__) == ["a", "b", "c"]
    online.add("b")
    assert deliveries(index, "t", 2, eligible=online.__contains__) == ["b", "b"]


def test_each_group_and_each_filter_is_its_own_shared_subscription():
    index = SubscriptionIndex()
    index.subscribe("a", "$share/g1/t/+", Opts())
    index.subscribe("b", "$share/g1/t/+", Opts())
    index.subscribe("a", "$share/g1/t/#", Opts())
    index.subscribe("c", "$share/g2/t/+", Opts())
    index.subscribe("b", "t/x", Opts())
    got = [(m.client_id, m.filter, m.group) for m in index.match("t/x")]
    assert sorted(got) == [("a", "$share/g1/t/#", "g1"), ("a", "$share/g1/t/+", "g1"),
                           ("b", "t/x", None), ("c", "$share/g2/t/+", "g2")]
    got = sorted((m.client_id, m.filter) for m in index.match("t/x"))
    assert got == [("a", "$share/g1/t/#"), ("b", "$share/g1/t/+"), ("b", "t/x"),
                   ("c", "$share/g2/t/+")]


def test_shared_filters_follow_the_dollar_rule():
    index = SubscriptionIndex()
    index.subscribe("a", "$share/g/#", Opts())
    index.subscribe("b", "$share/g/$SYS/#", Opts())
    assert matched(index, "$SYS/load") == {("b", "$share/g/$SYS/#")}
    assert matched(index, "load") == {("a", "$share/g/#")}


# --- retained messages ----------------------------------------------------------

def test_retained_set_get_clear_len():
    retained = RetainedIndex()
    assert retained.set("a/b", 1) is False
    assert retained.set("a/b", 2) is True
    assert retained.set("a", 3) is False
    assert len(retained) == 2 and retained.get("a/b") == 2 and "a" in retained
    assert retained.get("a/c") is None and retained.get("a/b/c", "none") == "none"
    assert retained.clear("a/b/c") is False and retained.clear("x") is False
    assert retained.clear("a/b") is True and retained.clear("a/b") is False
    assert len(retained) == 1 and "a/b" not in retained
    assert retained.clear("a") is True
    assert len(retained) == 0 and retained._root.children is None


def test_retained_matching():
    retained = RetainedIndex()
    topics = ["sport", "sport/", "sport/tennis", "sport/tennis/player1",
              "sport/golf/player1", "/finance", "$SYS/broker/uptime", "$SYS",
              "a/$b"]
    for i, topic in enumerate(topics):
        retained.set(topic, i)

    def found(topic_filter):
        return sorted(topic for topic, _ in retained.matching(topic_filter))

    assert found("#") == sorted(t for t in topics if not t.startswith("$"))
    assert found("sport/#") == ["sport", "sport/", "sport/golf/player1",
                                "sport/tennis", "sport/tennis/player1"]
    assert found("sport/+") == ["sport/", "sport/tennis"]
    assert found("sport/+/player1") == ["sport/golf/player1", "sport/tennis/player1"]
    assert found("+") == ["sport"]
    assert found("+/+") == ["/finance", "a/$b", "sport/", "sport/tennis"]
    assert found("$SYS/#") == ["$SYS", "$SYS/broker/uptime"]
    assert found("+/broker/uptime") == []
    assert found("sport") == ["sport"] and found("nope") == []
    assert dict(retained.matching("sport/tennis")) == {"sport/tennis": 2}


def test_retained_matching_survives_changes_mid_walk():
    retained = RetainedIndex()
    for i in range(50):
        retained.set(f"a/{i}/x", i)
    seen = []
    for topic, value in retained.matching("a/#"):
        seen.append(value)
        retained.clear(topic)
        retained.set(f"b/{value}", value)
    assert sorted(seen) == list(range(50)) and len(retained) == 50


# --- properties against the reference matcher -----------------------------------

LEVELS = st.sampled_from(["a", "b", "", "$s", "$SYS"])
TOPICS = st.lists(LEVELS, min_size=1, max_size=4).map("/".join)
FILTERS = st.builds(
    lambda levels, tail, share: share + "/".join(levels + tail),
    st.lists(st.sampled_from(["a", "b", "", "$s", "+"]), min_size=0, max_size=3),
    st.sampled_from([[], ["#"]]),
    st.sampled_from(["", "", "$share/g1/", "$share/g2/"]),
).filter(lambda f: f not in ("", "$share/g1/", "$share/g2/"))
CLIENTS = st.sampled_from(["c1", "c2", "c3"])


class SubscriptionModel(RuleBasedStateMachine):
    """The index against a plain dict of subscriptions and `ref_matches`."""

    def __init__(self):
        super().__init__()
        self.index = SubscriptionIndex()
        self.model: dict[tuple[str, str], Opts] = {}

    @rule(client=CLIENTS, topic_filter=FILTERS, qos=st.integers(0, 2))
    def subscribe(self, client, topic_filter, qos):
        replaced = self.index.subscribe(client, topic_filter, Opts(qos=qos))
        assert replaced == ((client, topic_filter) in self.model)
        self.model[client, topic_filter] = Opts(qos=qos)

    @rule(client=CLIENTS, topic_filter=FILTERS)
    def unsubscribe(self, client, topic_filter):
        existed = self.model.pop((client, topic_filter), None) is not None
        assert self.index.unsubscribe(client, topic_filter) == existed

    @rule(client=CLIENTS)
    def remove_client(self, client):
        mine = [key for key in self.model if key[0] == client]
        for key in mine:
            del self.model[key]
        assert self.index.remove_client(client) == len(mine)

    @rule(topic=TOPICS)
    def match(self, topic):
        got = self.index.match(topic)
        plain = {(m.client_id, m.filter, m.options) for m in got if m.group is None}
        assert len(plain) == len([m for m in got if m.group is None])
        groups: dict[tuple[str, str], set[str]] = collections.defaultdict(set)
        expected_plain = set()
        for (client, topic_filter), opts in self.model.items():
            group, inner = parse_shared(topic_filter)
            if not ref_matches(inner, topic):
                continue
            if group is None:
                expected_plain.add((client, topic_filter, opts))
            else:
                groups[group, inner].add(client)
        assert plain == expected_plain
        shared = [m for m in got if m.group is not None]
        assert sorted((m.group, parse_shared(m.filter)[1]) for m in shared) == sorted(groups)
        for m in shared:
            assert m.client_id in groups[m.group, parse_shared(m.filter)[1]]
            assert self.model[m.client_id, m.filter] == m.options

    @invariant()
    def sizes_agree(self):
        assert len(self.index) == len(self.model)
        if not self.model:
            assert self.index._root.children is None


TestSubscriptionModel = SubscriptionModel.TestCase
TestSubscriptionModel.settings = settings(max_examples=300, stateful_step_count=40,
                                          deadline=None)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(TOPICS, st.integers()), st.lists(FILTERS, max_size=5),
       st.lists(TOPICS, max_size=3))
def test_retained_matching_agrees_with_reference(stored, filters, cleared):
    retained = RetainedIndex()
    for topic, value in stored.items():
        retained.set(topic, value)
    for topic in cleared:
        assert retained.clear(topic) == (stored.pop(topic, None) is not None)
    assert len(retained) == len(stored)
    for topic_filter in filters:
        if topic_filter.startswith("$share/"):
            topic_filter = parse_shared(topic_filter)[1]
        got = list(retained.matching(topic_filter))
        assert len(got) == len(dict(got))  # each topic once
        assert dict(got) == {t: v for t, v in stored.items()
                             if ref_matches(topic_filter, t)}


@given(st.lists(st.sampled_from(["a", "b", "+", "#", "", "a+", "#a"]),
                min_size=1, max_size=4).map("/".join))
def test_filter_validation_agrees_with_reference(topic_filter):
    levels = topic_filter.split("/")
    ok = all(level in ("+", "#") or not ({"+", "#"} & set(level)) for level in levels)
    ok = ok and "#" not in levels[:-1] and topic_filter != ""
    try:
        validate_topic_filter(topic_filter)
    except TopicError:
        assert not ok
    else:
        assert ok


# --- scale -----------------------------------------------------------------------

def build_fleet(index: SubscriptionIndex, sites: int = 100, devices: int = 1000) -> None:
    """100k subscriptions shaped like a real fleet: one per device, plus fan-in."""
    for s in range(sites):
        for d in range(devices):
            index.subscribe(f"dev-{s}-{d}", f"fleet/site{s}/dev{d}/cmd/+", Opts(qos=1))
    index.subscribe("ops", "fleet/+/+/alarm", Opts(qos=2))
    index.subscribe("audit", "fleet/#", Opts())
    index.subscribe("worker-1", "$share/ingest/fleet/+/+/telemetry", Opts())
    index.subscribe("worker-2", "$share/ingest/fleet/+/+/telemetry", Opts())


def test_hundred_thousand_subscriptions_match_by_walk_not_scan():
    index = SubscriptionIndex()
    build_fleet(index)
    assert len(index) == 100_004
    assert matched(index, "fleet/site42/dev7/cmd/reboot") == {
        ("dev-42-7", "fleet/site42/dev7/cmd/+"), ("audit", "fleet/#")}
    assert {m.client_id for m in index.match("fleet/site3/dev9/telemetry")} in (
        {"audit", "worker-1"}, {"audit", "worker-2"})
    started = time.perf_counter()
    n = 20_000
    for _ in range(n):
        index.match("fleet/site42/dev7/cmd/reboot")
    elapsed = time.perf_counter() - started
    print(f"\n{n / elapsed:,.0f} matches/s over {len(index):,} subscriptions")
    for s in range(100):
        for d in range(1000):
            index.remove_client(f"dev-{s}-{d}")
    assert len(index) == 4


# --- the match cache ------------------------------------------------------


def test_a_cached_answer_follows_every_change():
    index = SubscriptionIndex()
    index.subscribe("c1", "a/+", Opts(qos=1))
    assert [(m.client_id, m.options.qos) for m in index.match("a/b")] == [("c1", 1)]
    assert "a/b" in index._cache  # no shared group: kept
    index.subscribe("c1", "a/+", Opts(qos=2))  # new options for the same filter
    assert [(m.client_id, m.options.qos) for m in index.match("a/b")] == [("c1", 2)]
    index.subscribe("c2", "#", Opts(qos=0))
    assert sorted(m.client_id for m in index.match("a/b")) == ["c1", "c2"]
    index.unsubscribe("c1", "a/+")
    assert [m.client_id for m in index.match("a/b")] == ["c2"]
    index.remove_client("c2")
    assert index.match("a/b") == []
    got = index.match("a/b")
    got.append("junk")  # a caller's list is its own
    assert index.match("a/b") == []


def test_shared_answers_are_never_kept():
    index = SubscriptionIndex()
    index.subscribe("c1", "$share/g/t", Opts(qos=1))
    index.subscribe("c2", "$share/g/t", Opts(qos=1))
    picks = [index.match("t")[0].client_id for _ in range(4)]
    assert picks == ["c1", "c2", "c1", "c2"] and "t" not in index._cache


def test_the_cache_is_bounded(monkeypatch):
    from pairmq.appliance.broker import topics
    monkeypatch.setattr(topics, "MATCH_CACHE_TOPICS", 8)
    index = SubscriptionIndex()
    index.subscribe("c1", "#", Opts(qos=1))
    for i in range(50):
        assert [m.client_id for m in index.match(f"t/{i}")] == ["c1"]
        assert len(index._cache) <= 8

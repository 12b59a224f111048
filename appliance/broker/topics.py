"""Topic names, topic filters and the subscription index (MQTT 5.0 §4.7-4.8).

Rules:

- A Topic Name is 1..65535 bytes of UTF-8 with no `+`, `#` or U+0000
  (0x90 Topic Name invalid). It may be empty only when the caller is about to
  resolve a Topic Alias (`allow_empty=True`).
- A Topic Filter is 1..65535 bytes of UTF-8 with no U+0000; `+` fills a whole
  level; `#` fills a whole level and is the last one (0x8F Topic Filter
  invalid).
- `$share/{ShareName}/{filter}` is a shared subscription: ShareName is
  non-empty and holds no `/`, `+` or `#`; the filter after it is a non-empty
  valid Topic Filter. `$share` alone, or `$shared/...`, is an ordinary filter.
- Matching: `+` matches exactly one level (possibly empty); `#` matches its
  parent level and every level below (`sport/#` matches `sport`). A topic
  whose first level starts with `$` is not matched by a filter whose first
  level is `+` or `#` (so `#` never sees `$SYS/...`).
- One subscription per (client, filter string as sent): subscribing again
  replaces the options (MQTT-3.8.4-3). `$share/g/a`, `$share/h/a` and `a` are
  three subscriptions.
- Overlapping non-shared subscriptions of one client all match; the broker
  folds them with `collapse_per_client` (one copy, highest QoS, every
  Subscription Identifier - MQTT-3.3.4-2..5).
- A shared subscription (group, filter) yields exactly one member per match,
  chosen round-robin over the members in subscription order. An `eligible`
  predicate lets the broker skip members (offline, queue full); if no member
  is eligible the member whose turn it is gets the message anyway, so a
  message matched by a group is never silently dropped by the index.

Theory of operation: filters live in a trie keyed by level. A node is one
filter; it holds that filter's non-shared subscriptions (client -> `Match`)
and its shared groups. `match(topic)` walks the topic level by level carrying
the set of nodes still alive (the literal child and the `+` child of each),
and collects the `#` child at every step and the nodes left at the end. Cost
is the number of trie nodes visited plus the size of the answer, never the
number of subscriptions. A per-client table of filter strings makes
`remove_client` proportional to that client's subscriptions; empty nodes are
pruned so a churn of clients does not leak nodes. The walks are loops, not
recursion: a 65535-byte topic can have 32768 levels.

Match cache: a topic's answer is kept (up to MATCH_CACHE_TOPICS topics, then
all are dropped) when it holds no shared group (a group's pick rotates per
match, so those are walked every time); any subscribe, unsubscribe or
remove_client drops the whole cache. Why: a stream of PUBLISHes to a few topics
would walk the same trie nodes for every message, on the durable QoS 1 path.

`options` is opaque to the index: it is stored in the `Match` and handed back.
`RetainedIndex` lives in `retained.py` and is re-exported here.
`collapse_per_client` is the one reader of it and only reads the attributes
named in `DeliveryOptions`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from pairmq.appliance.broker.retained import RetainedIndex, descend_creating
from pairmq.appliance.mqtt.wire import STRING_MAX_BYTES, MqttError, ReasonCode

__all__ = [
    "SHARE_PREFIX", "Delivery", "DeliveryOptions", "Match", "RetainedIndex",
    "SubscriptionIndex", "TopicError", "collapse_per_client", "parse_shared",
    "validate_topic_filter", "validate_topic_name",
]

SHARE_PREFIX = "$share/"


class TopicError(MqttError):
    """A topic name or filter the peer sent breaks §4.7 (0x90 or 0x8F)."""


def _name_error(message: str) -> TopicError:
    return TopicError(ReasonCode.TOPIC_NAME_INVALID, message)


def _filter_error(message: str) -> TopicError:
    return TopicError(ReasonCode.TOPIC_FILTER_INVALID, message)


def _utf8_length(text: str) -> int | None:
    """Encoded length in bytes, or None if `text` cannot be UTF-8 (a surrogate)."""
    if text.isascii():  # the common case, without encoding
        return len(text)
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError:
        return None


def validate_topic_name(name: str, *, allow_empty: bool = False) -> None:
    """Raise TopicError (0x90) unless `name` may be published to."""
    if not name:
        if allow_empty:
            return
        raise _name_error("topic name is empty")
    length = _utf8_length(name)
    if length is None or length > STRING_MAX_BYTES:
        raise _name_error("topic name is longer than 65535 bytes or not UTF-8")
    if "+" in name or "#" in name:
        raise _name_error(f"topic name {name[:64]!r} holds a wildcard")
    if "\x00" in name:
        raise _name_error("topic name contains U+0000")


def validate_topic_filter(topic_filter: str) -> None:
    """Raise TopicError (0x8F) unless `topic_filter` is a well-formed filter."""
    if not topic_filter:
        raise _filter_error("topic filter is empty")
    length = _utf8_length(topic_filter)
    if length is None or length > STRING_MAX_BYTES:
        raise _filter_error("topic filter is longer than 65535 bytes or not UTF-8")
    if "\x00" in topic_filter:
        raise _filter_error("topic filter contains U+0000")
    if "+" not in topic_filter and "#" not in topic_filter:
        return
    levels = topic_filter.split("/")
    last = len(levels) - 1
    for i, level in enumerate(levels):
        if "#" in level and (level != "#" or i != last):
            raise _filter_error(
                f"topic filter {topic_filter[:64]!r}: '#' must be a whole, last level")
        if "+" in level and level != "+":
            raise _filter_error(
                f"topic filter {topic_filter[:64]!r}: '+' must be a whole level")


def parse_shared(topic_filter: str) -> tuple[str | None, str]:
    """(ShareName, filter) of a `$share/...` filter, else (None, topic_filter).

    Validates the whole thing; raises TopicError (0x8F).
    """
    validate_topic_filter(topic_filter)
    if not topic_filter.startswith(SHARE_PREFIX):
        return None, topic_filter
    group, sep, inner = topic_filter[len(SHARE_PREFIX):].partition("/")
    if not group or "+" in group or "#" in group:
        raise _filter_error(
            f"shared subscription {topic_filter[:64]!r}: bad ShareName {group!r}")
    if not sep or not inner:
        raise _filter_error(
            f"shared subscription {topic_filter[:64]!r} has no topic filter")
    # `inner` is a suffix of a valid filter that starts on a level boundary,
    # so it is already a valid filter.
    return group, inner


@dataclass(frozen=True, slots=True)
class Match:
    """One subscription that matched: who, with what options, through what.

    `filter` is the string the client subscribed with (including any
    `$share/{group}/` prefix), i.e. the key to unsubscribe it; `group` is the
    ShareName for a shared subscription, else None.
    """

    client_id: Any
    options: Any
    filter: str
    group: str | None


class _SharedGroup:
    """Members of one (ShareName, filter) in subscription order, plus a cursor.

    `cursor` indexes the member whose turn is next. Removing a member before
    the cursor shifts it back so the rotation carries on where it was.
    """

    __slots__ = ("members", "by_client", "cursor")

    def __init__(self) -> None:
        self.members: list[Match] = []
        self.by_client: dict[Any, Match] = {}
        self.cursor = 0

    def put(self, match: Match) -> bool:
        old = self.by_client.get(match.client_id)
        self.by_client[match.client_id] = match
        if old is None:
            self.members.append(match)
            return False
        self.members[self.members.index(old)] = match  # keeps its turn
        return True

    def drop(self, client_id: Any) -> bool:
        old = self.by_client.pop(client_id, None)
        if old is None:
            return False
        i = self.members.index(old)
        del self.members[i]
        if i < self.cursor:
            self.cursor -= 1
        if self.cursor >= len(self.members):
            self.cursor = 0
        return True

    def pick(self, eligible: Callable[[Any], bool] | None) -> Match:
        members = self.members
        n = len(members)
        start = self.cursor
        chosen = start
        if eligible is not None:
            for step in range(n):
                i = (start + step) % n
                if eligible(members[i].client_id):
                    chosen = i
                    break
        self.cursor = (chosen + 1) % n
        return members[chosen]


class _Node:
    """One filter. Its three tables are created on first use (most nodes are
    leaves with one subscriber, or inner nodes with none), which roughly
    halves the memory of a large index."""

    __slots__ = ("children", "subs", "shared")

    def __init__(self) -> None:
        self.children: dict[str, _Node] | None = None
        self.subs: dict[Any, Match] | None = None
        self.shared: dict[str, _SharedGroup] | None = None


def _inner(topic_filter: str, group: str | None) -> str:
    """The filter part of a subscription string parse_shared already accepted."""
    return topic_filter if group is None else topic_filter[len(SHARE_PREFIX) + len(group) + 1:]


MATCH_CACHE_TOPICS = 4096  # topics whose matches are kept (see the theory of operation)


class SubscriptionIndex:
    """Every session's subscriptions, matched against a topic in one trie walk."""

    def __init__(self) -> None:
        self._root = _Node()
        self._by_client: dict[Any, dict[str, str | None]] = {}  # filter -> group
        self._count = 0
        self._cache: dict[str, list[Match]] = {}  # topic -> its matches, none shared (see the theory)

    def __len__(self) -> int:
        return self._count

    def filters_of(self, client_id: Any) -> list[str]:
        """The filter strings `client_id` is subscribed with, in order."""
        return list(self._by_client.get(client_id, ()))

    def subscribe(self, client_id: Any, topic_filter: str, options: Any) -> bool:
        """Add or replace; True if it replaced this client's same filter.

        Raises TopicError (0x8F) for an invalid filter, changing nothing.
        """
        group, inner = parse_shared(topic_filter)
        self._cache.clear()
        node: _Node = descend_creating(self._root, inner.split("/"), _Node)
        match = Match(client_id, options, topic_filter, group)
        if group is None:
            if node.subs is None:
                node.subs = {}
            replaced = client_id in node.subs
            node.subs[client_id] = match
        else:
            if node.shared is None:
                node.shared = {}
            shared = node.shared.get(group)
            if shared is None:
                shared = node.shared[group] = _SharedGroup()
            replaced = shared.put(match)
        if not replaced:
            filters = self._by_client.get(client_id)
            if filters is None:
                filters = self._by_client[client_id] = {}
            filters[topic_filter] = group
            self._count += 1
        return replaced

    def unsubscribe(self, client_id: Any, topic_filter: str) -> bool:
        """Remove one subscription; False if there was none (MQTT 5: 0x11).

        Raises TopicError (0x8F) for an invalid filter.
        """
        filters = self._by_client.get(client_id)
        if filters is None or topic_filter not in filters:
            parse_shared(topic_filter)  # an invalid filter is 0x8F, not 0x11
            return False
        group = filters.pop(topic_filter)
        if not filters:
            del self._by_client[client_id]
        self._remove(client_id, topic_filter, group)
        self._count -= 1
        return True

    def remove_client(self, client_id: Any) -> int:
        """Drop every subscription of `client_id`; returns how many there were."""
        filters = self._by_client.pop(client_id, {})
        for topic_filter, group in filters.items():
            self._remove(client_id, topic_filter, group)
        self._count -= len(filters)
        return len(filters)

    def _remove(self, client_id: Any, topic_filter: str, group: str | None) -> None:
        self._cache.clear()
        levels = _inner(topic_filter, group).split("/")
        path = [self._root]
        # Every dict on this path exists: the filter is subscribed (asserted, for the type checker).
        for level in levels:
            children = path[-1].children
            assert children is not None
            path.append(children[level])
        node = path[-1]
        if group is None:
            subs = node.subs
            assert subs is not None
            del subs[client_id]
            if not subs:
                node.subs = None
        else:
            shared_groups = node.shared
            assert shared_groups is not None
            shared = shared_groups[group]
            shared.drop(client_id)
            if not shared.members:
                del shared_groups[group]
                if not shared_groups:
                    node.shared = None
        for depth in range(len(levels), 0, -1):  # prune empty nodes bottom-up
            done = path[depth]
            if done.children or done.subs or done.shared:
                break
            parent = path[depth - 1]
            assert parent.children is not None
            del parent.children[levels[depth - 1]]
            if not parent.children:
                parent.children = None

    def match(self, topic: str,
              eligible: Callable[[Any], bool] | None = None) -> list[Match]:
        """Every subscription matching `topic`, one member per shared group.

        `topic` must be a valid topic name (the broker validated it on the way
        in). Each call advances the rotation of every shared group it matched.
        """
        cached = self._cache.get(topic)
        if cached is not None:
            return cached[:]
        out: list[Match] = []
        shared = self._walk(topic, out, eligible)
        if not shared:
            if len(self._cache) >= MATCH_CACHE_TOPICS:
                self._cache.clear()
            self._cache[topic] = out[:]
        return out

    def _walk(self, topic: str, out: list[Match], eligible: Callable[[Any], bool] | None) -> bool:
        """`match` without the cache; True if a shared group was matched (its answer is not to be kept)."""
        shared = False
        levels = topic.split("/")
        frontier = [self._root]
        skip_wild = topic.startswith("$")  # the $ rule binds only at level 0
        for level in levels:
            following: list[_Node] = []
            for node in frontier:
                children = node.children
                if not children:
                    continue
                child = children.get(level)
                if child is not None:
                    following.append(child)
                if skip_wild:
                    continue
                child = children.get("+")
                if child is not None:
                    following.append(child)
                child = children.get("#")
                if child is not None:
                    shared |= _collect(child, out, eligible)
            if not following:
                return shared
            frontier = following
            skip_wild = False
        for node in frontier:
            shared |= _collect(node, out, eligible)
            if node.children:
                child = node.children.get("#")
                if child is not None:
                    shared |= _collect(child, out, eligible)
        return shared


def _collect(node: _Node, out: list[Match],
             eligible: Callable[[Any], bool] | None) -> bool:
    """Add the node's matches to `out`; True if it has shared groups."""
    if node.subs:
        out.extend(node.subs.values())
    if node.shared:
        for shared in node.shared.values():
            out.append(shared.pick(eligible))
        return True
    return False


# --- one copy per client ---------------------------------------------------------

class DeliveryOptions(Protocol):
    """What `collapse_per_client` reads from a subscription's options."""

    qos: int
    no_local: bool
    retain_as_published: bool
    subscription_id: int | None  # None or 0 when the subscription has none


@dataclass(frozen=True, slots=True)
class Delivery:
    """The one copy a client gets of a message matched by its subscriptions.

    `qos` is the highest granted QoS among them (the broker still caps it at
    the message's QoS); `subscription_ids` are the distinct identifiers,
    ascending; `retain_as_published` is set if any subscription asked for it;
    `no_local` is set only if every contributing subscription had it.
    """

    qos: int
    subscription_ids: tuple[int, ...]
    no_local: bool
    retain_as_published: bool


def collapse_per_client(matches: Iterable[Match],
                        publisher_id: Any = None) -> dict[Any, Delivery]:
    """Fold overlapping matches into one `Delivery` per client.

    With `publisher_id`, the publisher's own No Local subscriptions are dropped
    first (MQTT-3.8.3-3), so a No Local subscription never raises the QoS of
    the copy the publisher still gets through another one.
    """
    folded: dict[Any, list[Any]] = {}
    for m in matches:
        o = m.options
        if o.no_local and publisher_id is not None and m.client_id == publisher_id:
            continue
        acc = folded.get(m.client_id)
        if acc is None:
            acc = folded[m.client_id] = [o.qos, set(), True, False]
        else:
            acc[0] = max(acc[0], o.qos)
        if o.subscription_id:  # None or 0: none (identifiers are 1..268435455)
            acc[1].add(o.subscription_id)
        acc[2] = acc[2] and bool(o.no_local)
        acc[3] = acc[3] or bool(o.retain_as_published)
    return {client: Delivery(qos, tuple(sorted(ids)), no_local, rap)
            for client, (qos, ids, no_local, rap) in folded.items()}

"""Retained messages, one per topic, found by filter (MQTT 5.0 §3.3.1.3, §4.7).

Rules:

- At most one retained value per topic name; `set` replaces it, `clear`
  removes it. Which PUBLISH clears (an empty retained payload) is the
  broker's rule, not this index's.
- `matching(filter)` yields the (topic, value) pairs the filter matches, with
  the same rules as subscriptions: `+` is one level, `#` is its parent level
  and everything below, and a filter whose first level is `+` or `#` does not
  match topics whose first level starts with `$`.
- Topics and filters are validated by the caller (`topics.validate_*`); a
  shared `$share/...` filter is not unwrapped here (the broker sends no
  retained messages for a new shared subscription, §4.8.2).

Theory of operation: a trie keyed by level; a node holding a value also holds
its topic string, so a walk yields without rebuilding names. `matching` walks
only the branches the filter can reach: a literal level is one dict lookup,
`+` fans out over the children, `#` yields the whole subtree. Emptied nodes
are pruned on `clear`. Walks use an explicit stack (topics can be 32768
levels deep). The yield order is unspecified. `matching` is lazy; it copies
each node's children before descending, so the index may be changed while a
walk is in progress without breaking it (a value set meanwhile may or may not
be seen).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

_ABSENT: Any = object()


class _Node:
    __slots__ = ("children", "topic", "value")

    def __init__(self) -> None:
        self.children: dict[str, _Node] | None = None  # made on first use
        self.topic = ""
        self.value: Any = _ABSENT


def descend_creating(root: Any, levels: Iterable[str], new_node: Callable[[], Any]) -> Any:
    """The trie node for `levels` under `root`, creating what is missing (children dicts on first use)."""
    node = root
    for level in levels:
        children = node.children
        if children is None:
            children = node.children = {}
        child = children.get(level)
        if child is None:
            child = children[level] = new_node()
        node = child
    return node


class RetainedIndex:
    """Retained values by topic name, searchable by topic filter."""

    def __init__(self) -> None:
        self._root = _Node()
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def __contains__(self, topic: str) -> bool:
        node = self._find(topic)
        return node is not None and node.value is not _ABSENT

    def get(self, topic: str, default: Any = None) -> Any:
        node = self._find(topic)
        if node is None or node.value is _ABSENT:
            return default
        return node.value

    def set(self, topic: str, value: Any) -> bool:
        """Store `value` as the retained message of `topic`; True if it replaced one."""
        node = descend_creating(self._root, topic.split("/"), _Node)
        replaced = node.value is not _ABSENT
        if not replaced:
            self._count += 1
            node.topic = topic
        node.value = value
        return replaced

    def clear(self, topic: str) -> bool:
        """Forget the retained message of `topic`; False if there was none."""
        levels = topic.split("/")
        path = [self._root]
        for level in levels:
            children = path[-1].children
            child = None if children is None else children.get(level)
            if child is None:
                return False
            path.append(child)
        node = path[-1]
        if node.value is _ABSENT:
            return False
        node.value = _ABSENT
        node.topic = ""
        self._count -= 1
        for depth in range(len(levels), 0, -1):
            done = path[depth]
            if done.children or done.value is not _ABSENT:
                break
            parent = path[depth - 1]
            assert parent.children is not None, "a node on the path has children"
            del parent.children[levels[depth - 1]]
            if not parent.children:
                parent.children = None
        return True

    def _find(self, topic: str) -> _Node | None:
        node = self._root
        for level in topic.split("/"):
            if node.children is None:
                return None
            child = node.children.get(level)
            if child is None:
                return None
            node = child
        return node

    def matching(self, topic_filter: str) -> Iterator[tuple[str, Any]]:
        """(topic, value) of every retained message `topic_filter` matches."""
        if "+" not in topic_filter and "#" not in topic_filter:
            node = self._find(topic_filter)
            if node is not None and node.value is not _ABSENT:
                yield node.topic, node.value
            return
        levels = topic_filter.split("/")
        n = len(levels)
        stack: list[tuple[_Node, int]] = [(self._root, 0)]
        while stack:
            node, i = stack.pop()
            if i == n:
                if node.value is not _ABSENT:
                    yield node.topic, node.value
                continue
            level = levels[i]
            children = node.children
            if level != "#" and not children:
                continue
            at_root = i == 0
            if level == "#":
                if node.value is not _ABSENT:  # `a/#` matches `a`
                    yield node.topic, node.value
                yield from _subtree(node, skip_dollar=at_root)
            elif level == "+":
                for key, child in list(children.items()):  # type: ignore[union-attr]  # not empty (above)
                    if not (at_root and key.startswith("$")):
                        stack.append((child, i + 1))
            else:
                child = children.get(level)  # type: ignore[union-attr]  # not empty (above)
                if child is not None:
                    stack.append((child, i + 1))


def _subtree(top: _Node, skip_dollar: bool) -> Iterator[tuple[str, Any]]:
    """Every value strictly below `top`."""
    stack = [child for key, child in (top.children or {}).items()
             if not (skip_dollar and key.startswith("$"))]
    while stack:
        node = stack.pop()
        if node.value is not _ABSENT:
            yield node.topic, node.value
        if node.children:
            stack.extend(node.children.values())

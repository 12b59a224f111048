"""Duplicate suppression by publisher-assigned message id (BlazingMQ's GUID history). Sans-I/O.

Rules:
- The id is the MQTT 5 user property `pairmq-msg-id` (PROPERTY) of a QoS 1 or QoS 2 PUBLISH; the
  host-list client (cli/hostlist.py) sets it. QoS 0 and 3.1.1 publishes (no properties) are never checked.
- The same message is the same (publishing client id, message id): ids need be unique only per
  publisher, and one client can never suppress another's messages by reusing its ids.
- An id is 1..MAX_ID_BYTES bytes of UTF-8 and appears at most once; otherwise the PUBLISH is refused
  (`BadMessageId`; the core answers 0x83 with a reason string) before anything is stored: ignoring
  a bad id would silently switch off the suppression its publisher counts on.
- An id accepted less than `window_ms` ago and still held (at most `max_ids`, the oldest evicted
  first) makes the PUBLISH a duplicate: acknowledged as accepted (PUBACK 0x00, or PUBREC 0x00 with
  its packet id recorded so PUBREL gets PUBCOMP), never routed again, counted.
- A duplicate does not refresh the id: the window runs from the first acceptance (as BlazingMQ).
  An id seen again after its window ended is a new message and is accepted (and recorded) again.
- `record` returns the `MessageIdSeen` op; the caller puts it in the same commit as the message, so
  a crash keeps both or neither. The op log carries it to the standby and into snapshots; the
  spool keeps the newest `max_ids` (appliance/spool/state.py) and `restore` brings back those
  still inside the window, so the new active after a failover suppresses the retransmit.

Theory of operation: an insertion-ordered dict keyed by (client id, message id) -> seen_at_ms.
Insertion order is acceptance order, which is what both bounds evict by. Times are the core's wall
clock (`now_ms` passed in): the window must survive a restart and a failover. A wall clock that
steps back only makes entries live longer (an entry from the future is held until its own age passes
the window).
"""

from __future__ import annotations

from collections.abc import Iterable

from ..mqtt.properties import Properties
from ..mqtt.properties import PropertyId as P
from ..spool import ops

PROPERTY = "pairmq-msg-id"
MAX_ID_BYTES = 128


class BadMessageId(ValueError):
    """The publisher's message id property is malformed (the remote side's fault)."""


def message_id_of(properties: Properties) -> str | None:
    """The PUBLISH's message id, None without one; BadMessageId if malformed (see the rules)."""
    pairs = properties.get(P.USER_PROPERTY)
    if not pairs:
        return None
    found = [value for key, value in pairs if key == PROPERTY]
    if not found:
        return None
    if len(found) > 1:
        raise BadMessageId(f"{PROPERTY} appears {len(found)} times (at most once)")
    value: str = found[0]
    size = len(value.encode("utf-8"))
    if not 1 <= size <= MAX_ID_BYTES:
        raise BadMessageId(f"{PROPERTY} must be 1 to {MAX_ID_BYTES} bytes of UTF-8, not {size}")
    return value


class MessageIdHistory:
    """The ids accepted lately, per publishing client; see the rules above."""

    __slots__ = ("window_ms", "max_ids", "_seen")

    def __init__(self, window_ms: int = 300_000, max_ids: int = 100_000) -> None:
        if window_ms <= 0 or max_ids <= 0:
            raise ValueError(f"need a positive window and bound, got {window_ms} ms and {max_ids} ids")
        self.window_ms = window_ms  # 5 minutes by default: far longer than a failover plus a client's retry
        self.max_ids = max_ids
        self._seen: dict[tuple[str, str], int] = {}  # (client id, message id) -> seen_at_ms, oldest first

    def __len__(self) -> int:
        return len(self._seen)

    def seen(self, client_id: str, message_id: str, now_ms: int) -> bool:
        """Was this id accepted from this client within the window (and is it still held)?"""
        self.expire(now_ms)
        key = (client_id, message_id)
        at = self._seen.get(key)
        if at is None:
            return False
        if now_ms - at >= self.window_ms:
            del self._seen[key]  # behind a younger-looking head (the clock stepped back): expired all the same
            return False
        return True

    def record(self, client_id: str, message_id: str, now_ms: int) -> ops.MessageIdSeen:
        """Remember an accepted id; returns the op to commit with the message."""
        key = (client_id, message_id)
        self._seen.pop(key, None)
        self._seen[key] = now_ms
        if len(self._seen) > self.max_ids:
            del self._seen[next(iter(self._seen))]
        return ops.MessageIdSeen(client_id, message_id, now_ms)

    def expire(self, now_ms: int) -> None:
        """Forget ids older than the window, oldest first (stops at the first one still young)."""
        seen, cutoff = self._seen, now_ms - self.window_ms
        while seen:
            key = next(iter(seen))
            if seen[key] > cutoff:
                return
            del seen[key]

    def restore(self, entries: Iterable[tuple[str, str, int]], now_ms: int) -> None:
        """From the spool: (client id, message id, seen_at_ms), oldest first; expired ones are dropped."""
        for client_id, message_id, seen_at_ms in entries:
            if now_ms - seen_at_ms < self.window_ms:
                self._seen.pop((client_id, message_id), None)
                self._seen[(client_id, message_id)] = seen_at_ms
                if len(self._seen) > self.max_ids:
                    del self._seen[next(iter(self._seen))]

    def entries(self) -> list[tuple[str, str, int]]:
        return [(c, m, at) for (c, m), at in self._seen.items()]

"""What became of each PUBLISH a client sent, counted per topic, QoS and outcome (docs/events.md).

Rules:
- One outcome per PUBLISH the broker took in (not a QoS 2 retransmission, not a duplicate it suppressed):
  `delivered`: a copy went out at once (QoS 0 copies) and none was queued;
  `queued`: stored for at least one subscriber's queue (QoS 1/2 copies, sent after the commit; the message
  events say what became of them); `no_subscriber`: no subscription took a copy (a retained one is still kept);
  `refused`: the ACL, a $SYS topic, a bad message id, a full queue or spool (the publisher was told, or, on
  3.1.1, its message acknowledged and dropped).
- Counting is one dict update on the broker loop; the node writes the counts and starts afresh once a second,
  one `publish_outcomes` line, so a flood of messages costs the log a line a second, not a line each.
- Bounded: at most MAX_KEYS (topic, QoS, outcome) keys a second; the rest are summed under OTHER_TOPICS.
"""

from __future__ import annotations

from typing import Final

DELIVERED: Final = "delivered"
QUEUED: Final = "queued"
NO_SUBSCRIBER: Final = "no_subscriber"
REFUSED: Final = "refused"
OUTCOMES: Final = (DELIVERED, QUEUED, NO_SUBSCRIBER, REFUSED)
MAX_KEYS: Final = 1000
OTHER_TOPICS: Final = "(other topics)"

Counts = dict[tuple[str, int, str], int]


def count(counts: Counts, topic: str, qos: int, outcome: str) -> None:
    key = (topic, qos, outcome)
    n = counts.get(key)
    if n is None:
        if len(counts) >= MAX_KEYS:
            key = (OTHER_TOPICS, qos, outcome)
            n = counts.get(key, 0)
        else:
            n = 0
    counts[key] = n + 1


def as_event(counts: Counts) -> list[dict]:
    """The `outcomes` field of a `publish_outcomes` event: one object per key, in a stable order."""
    return [{"topic": topic, "qos": qos, "outcome": outcome, "messages": n}
            for (topic, qos, outcome), n in sorted(counts.items())]

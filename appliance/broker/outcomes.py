"""What became of each PUBLISH a client sent, counted per topic, QoS and outcome (docs/events.md).

Rules:
- One outcome per PUBLISH the broker took in (not a QoS 2 retransmission, not a duplicate it suppressed):
  `delivered`: a copy went out at once (QoS 0 copies) and none was queued;
  `queued`: stored for at least one subscriber's queue (QoS 1/2 copies, sent after the commit; the message
  events say what became of them); `no_subscriber`: no subscription took a copy (a retained one is still kept);
  `refused`: the ACL, a $SYS topic, a bad message id, a full queue or spool (the publisher was told, or, on
  3.1.1, its message acknowledged and dropped).
- Counting is one list increment on the broker loop (`BrokerCore.count_outcome`, compiled with the router that
  decides the outcome: a row of 3 QoS x 4 outcomes per topic, no key built per message); the node takes the
  rows and starts afresh once a second, one `publish_outcomes` line, so a flood of messages costs the log a
  line a second, not a line each.
- Bounded: at most MAX_OUTCOME_TOPICS topics a second; the rest are summed under OTHER_TOPICS.
"""

from __future__ import annotations

from .core import MAX_OUTCOME_TOPICS, OTHER_TOPICS
from .routing import DELIVERED, NO_SUBSCRIBER, OUTCOME_NAMES, QUEUED, REFUSED

__all__ = ["DELIVERED", "MAX_OUTCOME_TOPICS", "NO_SUBSCRIBER", "OTHER_TOPICS", "OUTCOME_NAMES", "QUEUED", "REFUSED",
           "as_event"]


def as_event(counts: dict[str, list[int]]) -> list[dict]:
    """The `outcomes` field of a `publish_outcomes` event from BrokerCore.outcomes: one object per topic, QoS and
    outcome that happened, in a stable order."""
    return [{"topic": topic, "qos": i // 4, "outcome": OUTCOME_NAMES[i % 4], "messages": n}
            for topic, row in sorted(counts.items()) for i, n in enumerate(row) if n]

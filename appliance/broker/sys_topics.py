"""`$SYS` topics: the broker's own statistics, and the rules for `$` topic names. No I/O.

Rules:
- A topic name starting with `$` is reserved for the server's use only in
  `$SYS` (`is_sys_topic`). A client may publish to any other `$` topic
  (`$foo/bar`); wildcards at the first level never match it (topics.py), so
  only a subscription that names it gets it.
- A client's PUBLISH to `$SYS` or below is never routed: MQTT 5 gets 0x90
  (Topic Name invalid) in its PUBACK/PUBREC; 3.1.1, which has no negative
  ack, is acknowledged and the message dropped (the connection stays, as with
  mosquitto). A will on a `$SYS` topic is refused at CONNECT.
- The tree is published only by the active node, every `interval_s`
  (0: never), as retained QoS 0 messages. They live in memory only: never a
  spool op, never replicated, never counted against the spool. A node that
  takes activity starts from a core rebuilt from the spool, so no stale value
  of the old active survives; its first publication carries every topic, later
  ones only the values that changed (a new subscriber gets them all retained).
- Every copy goes through the ACL's read check, as any delivery does: a user
  without read access to `$SYS/...` gets nothing, live or retained.
- Names and units are mosquitto's (`sys_tree.c`) for the common set; PairMQ's
  own are under `$SYS/broker/redundancy/`. Load figures are per-minute rates
  smoothed over 1, 5 and 15 minutes, as mosquitto computes them.

Theory of operation: `SysTree.update(stats, now_s)` takes one `SysStats`
snapshot and returns the (topic, payload) pairs to publish; it keeps only the
maximum of connected clients, the load averages and the last values sent
(`forget_sent` when they went to a core that is gone).
`publish_in_memory(core, pairs, now_ms)` puts them into the broker core's
retained index under negative message ids (never a spool id) and returns the
`Send` effects for the live subscribers.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

from .session import Message, QueueEntry

SYS_ROOT = "$SYS"
SYS_RESERVED_REASON = "topics under $SYS are the broker's"
_LOAD_MINUTES = (1, 5, 15)


def is_sys_topic(topic: str) -> bool:
    """True for `$SYS` and every topic below it: the only `$` names a client may not publish to."""
    return topic == SYS_ROOT or topic.startswith(SYS_ROOT + "/")


@dataclasses.dataclass(frozen=True, slots=True)
class Redundancy:
    activity: str  # "active" (only the active publishes)
    epoch: int
    in_sync: bool  # the standby holds everything acknowledged: a failover now loses nothing
    config_sync: str  # "in sync", or why not


@dataclasses.dataclass(frozen=True, slots=True)
class SysStats:
    """Counters since this node started (they are the node's, not the group's) and the state now."""

    version: str
    uptime_s: int
    clients_connected: int
    clients_total: int  # sessions, connected or not
    packets_received: int
    packets_sent: int
    publish_received: int
    publish_sent: int
    publish_dropped: int
    bytes_received: int
    bytes_sent: int
    subscriptions: int
    retained: int
    stored_messages: int
    stored_bytes: int
    connections_opened: int
    redundancy: Redundancy


# mosquitto's load topics: (name under $SYS/broker/load/, SysStats counter)
_LOADS = (
    ("messages/received", "packets_received"), ("messages/sent", "packets_sent"),
    ("publish/received", "publish_received"), ("publish/sent", "publish_sent"),
    ("publish/dropped", "publish_dropped"),
    ("bytes/received", "bytes_received"), ("bytes/sent", "bytes_sent"),
    ("connections", "connections_opened"),
)


class SysTree:
    def __init__(self) -> None:
        self.clients_maximum = 0
        self._sent: dict[str, bytes] = {}
        self._loads: dict[str, float] = {}  # "<name>/<n>min" -> smoothed rate per minute
        self._last: tuple[float, SysStats] | None = None  # when and what the previous update saw

    def update(self, s: SysStats, now_s: float) -> list[tuple[str, bytes]]:
        """The pairs to publish now: all of them the first time, then those whose value changed."""
        self.clients_maximum = max(self.clients_maximum, s.clients_connected)
        values = self._values(s)
        values.update(self._load_values(s, now_s))
        out = [(topic, payload) for topic, payload in values.items() if self._sent.get(topic) != payload]
        self._sent.update(out)
        return out

    def forget_sent(self) -> None:
        """The values went to a core that is gone: the next update sends every topic again."""
        self._sent.clear()

    def _values(self, s: SysStats) -> dict[str, bytes]:
        b = SYS_ROOT + "/broker/"
        r = s.redundancy
        text = {
            "version": f"pairmq version {s.version}",
            "uptime": f"{s.uptime_s} seconds",
            "clients/connected": s.clients_connected,
            "clients/active": s.clients_connected,  # mosquitto's older name for the same figure
            "clients/total": s.clients_total,
            "clients/disconnected": max(0, s.clients_total - s.clients_connected),
            "clients/inactive": max(0, s.clients_total - s.clients_connected),
            "clients/maximum": self.clients_maximum,
            "messages/received": s.packets_received,
            "messages/sent": s.packets_sent,
            "messages/stored": s.stored_messages,
            "publish/messages/received": s.publish_received,
            "publish/messages/sent": s.publish_sent,
            "publish/messages/dropped": s.publish_dropped,
            "bytes/received": s.bytes_received,
            "bytes/sent": s.bytes_sent,
            "subscriptions/count": s.subscriptions,
            "retained messages/count": s.retained,
            "store/messages/count": s.stored_messages,
            "store/messages/bytes": s.stored_bytes,
            "redundancy/activity": r.activity,
            "redundancy/epoch": r.epoch,
            "redundancy/in_sync": "true" if r.in_sync else "false",
            "redundancy/config_sync": r.config_sync,
        }
        return {b + name: str(value).encode() for name, value in text.items()}

    def _load_values(self, s: SysStats, now_s: float) -> dict[str, bytes]:
        last, self._last = self._last, (now_s, s)
        if last is None or now_s <= last[0]:
            return {}  # a rate needs two snapshots
        interval_s = now_s - last[0]
        out: dict[str, bytes] = {}
        for name, field in _LOADS:
            # mosquitto: the interval's count as a rate per minute, folded into each average with weight
            # exp(-interval / window), so a burst fades over the window.
            rate = (getattr(s, field) - getattr(last[1], field)) * 60.0 / interval_s
            for minutes in _LOAD_MINUTES:
                key = f"{name}/{minutes}min"
                weight = math.exp(-interval_s / (60.0 * minutes))
                value = rate + weight * (self._loads.get(key, 0.0) - rate)
                self._loads[key] = value
                out[f"{SYS_ROOT}/broker/load/{key}"] = f"{value:.2f}".encode()
        return out


_sys_ids = itertools.count(-1, -1)  # below every spool message id, so never confused with one


def publish_in_memory(core, pairs: list[tuple[str, bytes]], now_ms: int) -> list:
    """Retain `pairs` in the core's memory (no op, no spool) and return the sends to live subscribers."""
    router = core.router
    effects: list = []
    for topic, payload in pairs:
        msg = Message(next(_sys_ids), topic, payload, 0, True, {}, 0, SYS_ROOT, now_ms, refs=1)
        old = router.retained.get(topic)
        if old is not None:
            router.retained.clear(topic)
            router._unref(old)
        router.messages[msg.msg_id] = msg
        router.retained.set(topic, msg.msg_id)
        # QoS 0 copies now, as `Router.route` sends them; the ACL's read check is in `_targets`.
        for client_id, (_qos, sub_ids, retain_flag) in router._targets(core, topic, SYS_ROOT, True).items():
            session = core.sessions.get(client_id)
            conn = core.connections.get(session.conn) if session is not None and session.conn is not None else None
            if conn is not None and conn.connacked:
                entry = QueueEntry(msg.msg_id, 0, retain_flag, sub_ids)
                effects += router.publish_packet(conn, session, entry, dup=False, msg=msg)
    return effects

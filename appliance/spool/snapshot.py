"""A spool's state as ops: what the mate link sends a standby that cannot catch up op by op.

Rules:
- `snapshot_ops(state)` lists ops that, applied in order to an empty spool, rebuild `state`
  exactly, except that queue entries get new `order` values in the same relative order: the i-th
  op is applied as seq `snapshot_seq(i)`, below zero, so the ops after the snapshot's head (seq
  head + 1 on) queue behind every rebuilt entry, whatever the snapshot's size.
- Bodies first (every `MessageStored`), then sessions with what they own, then retained topics,
  then the message-id history oldest first. Queue entries go in their global order, so each
  queue keeps its order.
- A copy whose PUBREC arrived holds no body (state.py), so its `MessagePubrecReceived` drops the
  reference its `MessageQueued` took. Those ops come last, after every queue entry and retained
  topic is rebuilt: earlier, the drop would delete a body that later copies of the same message
  (other subscribers' queues, a retained topic) still had to reference, and they would be lost.
- If no one else holds such a copy's message either, a placeholder body (empty topic and payload,
  one per message) is stored before its first copy, and the last of those late ops releases it:
  the rebuilt state holds no placeholder.
- Pure: no I/O, deterministic for a given state.
"""

from __future__ import annotations

from . import ops as o
from .state import SpoolState


def snapshot_ops(state: SpoolState) -> list[o.Op]:
    out: list[o.Op] = list(state.messages.values())
    entries = []
    for s in state.sessions.values():
        out.append(o.SessionOpened(s.client_id, s.protocol_version, s.expiry_s, s.connected_at_ms))
        if not s.connected:
            out.append(o.SessionDisconnected(s.client_id, s.disconnected_at_ms, s.expiry_s))
        out += s.subscriptions
        out += (o.InboundQos2Received(s.client_id, pid) for pid in s.inbound_qos2)
        if s.will is not None:
            out.append(s.will)
        entries += ((e.order, s.client_id, e) for e in s.queue)
    releases: list[o.Op] = []
    placeholders: set[int] = set()
    for _, client_id, e in sorted(entries, key=lambda t: t[0]):
        if e.pubrec_received and e.msg_id not in state.messages and e.msg_id not in placeholders:
            placeholders.add(e.msg_id)
            out.append(o.MessageStored(e.msg_id, "", b"", e.qos, False, b"", 0, "", 0))
        out.append(o.MessageQueued(client_id, e.msg_id, e.qos, e.retain, e.subscription_ids))
        if e.packet_id:
            out.append(o.MessageInflight(client_id, e.msg_id, e.packet_id))
        if e.pubrec_received:
            releases.append(o.MessagePubrecReceived(client_id, e.msg_id))
    out += (o.RetainedSet(topic, msg_id) for topic, msg_id in state.retained.items())
    out += releases
    out += (o.MessageIdSeen(client_id, message_id, seen_at_ms) for client_id, message_id, seen_at_ms in state.message_ids)
    return out


SNAPSHOT_SPAN = 1 << 40  # more ops than any snapshot holds


def snapshot_seq(i: int) -> int:
    """The seq the i-th op (from 0) of a snapshot is applied with: increasing, always below 0."""
    assert 0 <= i < SNAPSHOT_SPAN
    return i - SNAPSHOT_SPAN

"""A spool's state as ops: what the mate link sends a standby that cannot catch up op by op.

Rules:
- `snapshot_ops(state)` lists ops that, applied in order to an empty spool, rebuild `state`
  exactly, except that queue entries get new `order` values in the same relative order: the i-th
  op is applied as seq `snapshot_seq(i)`, below zero, so the ops after the snapshot's head (seq
  head + 1 on) queue behind every rebuilt entry, whatever the snapshot's size.
- A queue entry whose body comes right before it is one `MessageRouted` with it (ops.py).
- Sessions with what they own, then queue entries, then retained topics, then the message-id
  history oldest first. Each body (`MessageStored`) comes right before the first op that refers
  to it, so a standby applying the snapshot in batches finds it in the same transaction and counts
  its references in memory (sql.py `_fresh`) instead of updating a row per reference; a body no
  one refers to comes last. Queue entries go in their global order, so each queue keeps its order.
- A copy whose PUBREC arrived holds no body (state.py), so its `MessagePubrecReceived` drops the
  reference its `MessageQueued` took. Those ops come after every queue entry and retained topic is
  rebuilt: earlier, the drop would delete a body that later copies of the same message (other
  subscribers' queues, a retained topic) still had to reference, and they would be lost.
- If no one else holds such a copy's message either (the state has no body for it, or has one
  that nothing refers to), a placeholder body (empty topic and payload, one per message) is stored
  before its first copy, and the last of those late ops releases it: the rebuilt state holds no
  placeholder, and a body nothing refers to is stored after the releases, so none takes it away.
- Pure: no I/O, deterministic for a given state.
- `snapshot_items(state)` pairs each op with the seq to apply it with: a queue entry's own `order`
  for its `MessageQueued`, `snapshot_seq(i)` for the rest. A checkpoint (checkpoint.py) keeps these,
  so a state rebuilt from it is equal to the state it was written from, orders included.
"""

from __future__ import annotations

from . import ops as o
from .codec import encode_op


def dataclass_values(op: o.MessageStored) -> tuple:
    return (op.msg_id, op.topic, op.payload, op.qos, op.retain, op.properties, op.expiry_at_ms, op.publisher,
            op.created_at_ms)
from .state import SpoolState


def snapshot_ops(state: SpoolState) -> list[o.Op]:
    return [op for _, op in _items(state)]


def snapshot_items(state: SpoolState) -> list[tuple[int, bytes]]:
    """(seq to apply with, encoded op) for each op of the snapshot (see the rules)."""
    return [(snapshot_seq(i) if order is None else order, encode_op(op)) for i, (order, op) in enumerate(_items(state))]


def _items(state: SpoolState) -> list[tuple[int | None, o.Op]]:
    out: list = []
    orders: dict[int, int] = {}  # index in `out` of a MessageQueued -> its entry's order
    bodies = dict(state.messages)  # not yet in `out`

    def body_of(msg_id: int) -> None:
        if (b := bodies.pop(msg_id, None)) is not None:
            out.append(b)

    entries = []
    for s in state.sessions.values():
        out.append(o.SessionOpened(s.client_id, s.protocol_version, s.expiry_s, s.connected_at_ms))
        if s.owner is not None:
            out.append(o.SessionOwned(s.client_id, s.owner))
        if not s.connected:
            out.append(o.SessionDisconnected(s.client_id, s.disconnected_at_ms, s.expiry_s))
        out += s.subscriptions
        out += (o.InboundQos2Received(s.client_id, pid) for pid in s.inbound_qos2)
        if s.will is not None:
            body_of(s.will.msg_id)
            out.append(s.will)
        entries += ((e.order, s.client_id, e) for e in s.queue)
    releases: list[o.Op] = []
    placeholders: set[int] = set()
    held = {e.msg_id for _, _, e in entries if not e.pubrec_received}
    held.update(state.retained.values())
    held.update(s.will.msg_id for s in state.sessions.values() if s.will is not None)
    for _, client_id, e in sorted(entries, key=lambda t: t[0]):
        if e.pubrec_received and e.msg_id not in held:
            if e.msg_id not in placeholders:
                placeholders.add(e.msg_id)
                out.append(o.MessageStored(e.msg_id, "", b"", e.qos, False, b"", 0, "", 0))
        else:
            body_of(e.msg_id)
        last = out[-1] if out else None
        if type(last) is o.MessageStored and last.msg_id == e.msg_id:  # its body just went out: one op for both
            orders[len(out) - 1] = e.order
            out[-1] = o.MessageRouted(*dataclass_values(last), client_id, e.qos, e.retain, e.subscription_ids)
        else:
            orders[len(out)] = e.order
            out.append(o.MessageQueued(client_id, e.msg_id, e.qos, e.retain, e.subscription_ids))
        if e.packet_id:
            out.append(o.MessageInflight(client_id, e.msg_id, e.packet_id))
        if e.pubrec_received:
            releases.append(o.MessagePubrecReceived(client_id, e.msg_id))
    for topic, msg_id in state.retained.items():
        body_of(msg_id)
        out.append(o.RetainedSet(topic, msg_id))
    out += releases
    out += (o.MessageIdSeen(client_id, message_id, seen_at_ms)
            for client_id, message_id, seen_at_ms in state.message_ids)
    out += bodies.values()
    return [(orders.get(i), op) for i, op in enumerate(out)]



SNAPSHOT_SPAN = 1 << 40  # more ops than any snapshot holds


def snapshot_seq(i: int) -> int:
    """The seq the i-th op (from 0) of a snapshot is applied with: increasing, always below 0."""
    assert 0 <= i < SNAPSHOT_SPAN
    return i - SNAPSHOT_SPAN

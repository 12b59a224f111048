"""Per-message events (docs/events.md), read off the ops the broker hands its spool writer.

Rules:
- The broker core is not touched: every change it makes to a stored message
  is already an op (MessageStored, MessagesInflight, MessagesAcked,
  MessageDropped...), so the adapter passes each submission's ops here and
  this module turns them into events. Hence only stored messages (QoS 1/2
  with a subscriber's queue, or retained) have message events; QoS 0 copies
  are never stored and are not logged one by one.
- published: the op reached the writer (created_ms: when the PUBLISH was
  routed); spooled: its group commit is durable locally; replicated: the
  standby acknowledged a commit at or past it on the mate link (`after_resync`
  when the commit was made while acks did not wait for the standby: it was out
  of sync, and got the commit only when it caught up); delivered:
  sent to a subscriber (MessageInflight: the first send and every resend
  after a reconnect or a takeover, so a redelivery is a second `delivered`
  of the same client and message); acknowledged: the subscriber's PUBACK /
  PUBCOMP; expired / dropped: MessageDropped by reason.
- Sampling keeps or skips a message by its id (a fixed hash against the
  ratio), so every event of a kept message is kept and latencies stay whole.
  What is skipped is counted per event kind and written once a second as
  `message_events_unsampled`: never silently.
- Bounded: commits waiting for the standby's ack are held up to
  MAX_PENDING_COMMITS; older ones are counted as `replication_unobserved`.
"""

from __future__ import annotations

import collections
import json
from typing import Callable

from ..spool import ops

MAX_PENDING_COMMITS = 10_000
_STORED = frozenset((ops.MessageStored, ops.MessageRouted))  # a message_published each (`_on_stored`)
_HASH_MULT = 2654435761  # Knuth's multiplicative hash: spreads consecutive ids over the 32-bit range


_PUBLISHED = ',"msg_id":%d,"topic":%s,"qos":%d,"bytes":%d,"client":%s,"epoch":%d,"retain":%s,"created_ms":%d}'
# What json.dumps makes of a str (ASCII, escaped), without the encoder's Python-level dispatch around the C call.
_json_str = json.encoder.encode_basestring_ascii


def _published_members(value: tuple) -> str:
    """message_published's own members (docs/events.md), as EventLog.write_rendered appends them on the log's
    writer thread: by format, the strings by the C encoder (about half the CPU of a dict's encode, and no dict
    is built on the loop)."""
    op, epoch = value
    return _PUBLISHED % (op.msg_id, _json_str(op.topic), op.qos, len(op.payload), _json_str(op.publisher), epoch,
                         "true" if op.retain else "false", op.created_at_ms)


class MessageEvents:
    def __init__(self, events, sample_ratio: float = 1.0, acked_seq: Callable[[], int] | None = None,
                 mate_needed: Callable[[], bool] = lambda: True) -> None:
        self.events = events
        self._threshold = int(sample_ratio * (1 << 32))
        self._all = sample_ratio >= 1.0
        self._acked_seq = acked_seq
        self._mate_needed = mate_needed  # whether acks wait for the standby now (false: it is out of sync)
        self._pending: collections.deque = collections.deque()  # (seq, msg_ids, epoch, late) not yet replicated
        self.unsampled: dict[str, int] = {}

    def keep(self, msg_id: int) -> bool:
        return self._all or (msg_id * _HASH_MULT) & 0xFFFFFFFF < self._threshold

    def _skip(self, kind: str, n: int = 1) -> None:
        self.unsampled[kind] = self.unsampled.get(kind, 0) + n

    def _ids(self, kind: str, msg_ids) -> list[int]:
        kept = [m for m in msg_ids if self.keep(m)]
        if len(kept) != len(msg_ids):
            self._skip(kind, len(msg_ids) - len(kept))
        return kept

    def submitted(self, op_list: list, epoch: int, future) -> None:
        """One submission to the spool writer (on the broker loop): its ops, and the future of its commit."""
        stored: list[int] = []
        published: list[tuple] = []  # the message_published events of this submission, written at once
        handlers = self._handlers
        every = self._all
        for op in op_list:
            kind = type(op)
            if every and kind in _STORED:  # most ops of a durable stream: no handler call, no sampling test
                stored.append(op.msg_id)
                published.append((op, epoch))
                continue
            handler = handlers.get(kind)
            if handler is not None:
                if published:  # the log keeps the ops' order
                    self.events.write_rendered_many("message_published", _published_members, published)
                    published = []
                handler(self, op, epoch, stored)
        self.events.write_rendered_many("message_published", _published_members, published)
        if stored:
            future.add_done_callback(lambda fut: self._spooled(fut, stored, epoch))

    def _on_stored(self, op, epoch: int, stored: list) -> None:
        if not self.keep(op.msg_id):
            self._skip("message_published")
            return
        stored.append(op.msg_id)
        self.events.write_rendered("message_published", _published_members, (op, epoch))

    def _on_batch(self, kind: str, client_id: str, msg_ids, epoch: int) -> None:
        ids = msg_ids if self._all else self._ids(kind, msg_ids)
        if ids:
            self.events.write(kind, client=client_id, msg_ids=ids, epoch=epoch)

    def _on_dropped(self, op, epoch: int, stored: list) -> None:
        event = "message_expired" if op.reason == "expired" else "message_dropped"
        if self.keep(op.msg_id):
            self.events.write(event, client=op.client_id, msg_id=op.msg_id, reason=op.reason, epoch=epoch)
        else:
            self._skip(event)

    _handlers = {
        ops.MessageStored: _on_stored,
        ops.MessageRouted: _on_stored,
        ops.MessagesInflight: lambda self, op, epoch, _: self._on_batch("message_delivered", op.client_id,
                                                                        op.msg_ids, epoch),
        ops.MessageInflight: lambda self, op, epoch, _: self._on_batch("message_delivered", op.client_id,
                                                                       (op.msg_id,), epoch),
        ops.MessagesAcked: lambda self, op, epoch, _: self._on_batch("message_acknowledged", op.client_id,
                                                                     op.msg_ids, epoch),
        ops.MessageAcked: lambda self, op, epoch, _: self._on_batch("message_acknowledged", op.client_id,
                                                                    (op.msg_id,), epoch),
        ops.MessageDropped: _on_dropped,
    }

    def _spooled(self, fut, msg_ids: list[int], epoch: int) -> None:
        if fut.cancelled() or fut.exception() is not None:
            return  # the broker drops every client and rebuilds: these were never acknowledged
        commits = fut.result()
        seq = commits[-1].last_seq if commits else 0
        self.events.write("message_spooled", msg_ids=msg_ids, seq=seq, epoch=epoch)
        if self._acked_seq is not None:
            self._pending.append((seq, msg_ids, epoch, not self._mate_needed()))
            if len(self._pending) > MAX_PENDING_COMMITS:
                self._skip("replication_unobserved", len(self._pending.popleft()[1]))
            self.check_replicated()

    def check_replicated(self) -> None:
        """The standby may have acknowledged more (called whenever the mate link reports an ack)."""
        if not self._pending or self._acked_seq is None:
            return
        acked = self._acked_seq()
        while self._pending and self._pending[0][0] <= acked:
            seq, msg_ids, epoch, late = self._pending.popleft()
            if late:
                self.events.write("message_replicated", msg_ids=msg_ids, seq=seq, epoch=epoch, after_resync=True)
            else:
                self.events.write("message_replicated", msg_ids=msg_ids, seq=seq, epoch=epoch)

    def flush_counts(self) -> None:
        """Once a second (the node's watchdog) and at stop: what sampling skipped since the last call."""
        if self.unsampled:
            counts, self.unsampled = self.unsampled, {}
            self.events.write("message_events_unsampled", counts=counts)

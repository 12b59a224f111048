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
- The published events of a run of stored ops go to the log as one batch
  (one clock read, one queue entry), never ahead of an earlier op's event.
  The lines of every event with msg_ids are made on the log's writer thread
  (`eventlines`): the loop passes the ops and ids, never a dict.
  Compiled by mypyc (docs/build.md): ops are told apart by `isinstance`, the
  hot ones first.
"""

from __future__ import annotations

import collections
from typing import Any, Callable, Protocol

from ..eventlines import Stored, commit_line, delivery_line, published_lines
from ..spool.ops import (MessageAcked, MessageDropped, MessageInflight, MessageRouted, MessagesAcked,
                         MessagesInflight, MessageStored)

MAX_PENDING_COMMITS = 10_000
_HASH_MULT = 2654435761  # Knuth's multiplicative hash: spreads consecutive ids over the 32-bit range


class EventSink(Protocol):
    """What this module writes to: the node's EventLog (tests pass a recorder)."""

    def write(self, event: str, **fields: Any) -> None: ...

    def write_line(self, event: str, render: Callable[..., str], *args: Any) -> None: ...

    def write_many(self, event: str, render: Callable[[str, list[Any], Any], str], values: list[Any],
                   context: Any) -> None: ...


class MessageEvents:
    def __init__(self, events: EventSink, sample_ratio: float = 1.0, acked_seq: Callable[[], int] | None = None,
                 mate_needed: Callable[[], bool] = lambda: True) -> None:
        self.events = events
        self._threshold = int(sample_ratio * (1 << 32))
        self._all = sample_ratio >= 1.0
        self._acked_seq = acked_seq
        self._mate_needed = mate_needed  # whether acks wait for the standby now (false: it is out of sync)
        # (seq, msg_ids, epoch, late) of the commits not yet replicated
        self._pending: collections.deque[tuple[int, list[int], int, bool]] = collections.deque()
        self.unsampled: dict[str, int] = {}

    def keep(self, msg_id: int) -> bool:
        return self._all or (msg_id * _HASH_MULT) & 0xFFFFFFFF < self._threshold

    def _skip(self, kind: str, n: int = 1) -> None:
        self.unsampled[kind] = self.unsampled.get(kind, 0) + n

    def submitted(self, op_list: list[Any], epoch: int, future: Any) -> None:
        """One submission to the spool writer (on the broker loop): its ops, and the future of its commit."""
        stored: list[int] = []
        published: list[Stored] = []  # the stored ops since the last other event: one batch of message_published
        every = self._all
        for op in op_list:
            if isinstance(op, MessageRouted) or isinstance(op, MessageStored):
                msg_id = op.msg_id
                if every or self.keep(msg_id):
                    stored.append(msg_id)
                    published.append(op)
                else:
                    self._skip("message_published")
                continue
            if isinstance(op, MessagesInflight):
                published = self._published(published, epoch)
                self._batch("message_delivered", op.client_id, op.msg_ids, epoch)
            elif isinstance(op, MessagesAcked):
                published = self._published(published, epoch)
                self._batch("message_acknowledged", op.client_id, op.msg_ids, epoch)
            elif isinstance(op, MessageInflight):
                published = self._published(published, epoch)
                self._batch("message_delivered", op.client_id, (op.msg_id,), epoch)
            elif isinstance(op, MessageAcked):
                published = self._published(published, epoch)
                self._batch("message_acknowledged", op.client_id, (op.msg_id,), epoch)
            elif isinstance(op, MessageDropped):
                published = self._published(published, epoch)
                self._dropped(op, epoch)
        self._published(published, epoch)
        if stored:
            future.add_done_callback(lambda fut: self._spooled(fut, stored, epoch))

    def _published(self, published: list[Stored], epoch: int) -> list[Stored]:
        """Hand the batch on (the log keeps the ops' order); the list to gather the next one in."""
        if not published:
            return published
        self.events.write_many("message_published", published_lines, published, epoch)
        return []

    def _batch(self, kind: str, client_id: str, msg_ids: tuple[int, ...], epoch: int) -> None:
        if self._all:
            ids = msg_ids
        else:
            ids = tuple([m for m in msg_ids if self.keep(m)])
            if len(ids) != len(msg_ids):
                self._skip(kind, len(msg_ids) - len(ids))
        if ids:
            self.events.write_line(kind, delivery_line, client_id, ids, epoch)

    def _dropped(self, op: MessageDropped, epoch: int) -> None:
        event = "message_expired" if op.reason == "expired" else "message_dropped"
        if self.keep(op.msg_id):
            self.events.write(event, client=op.client_id, msg_id=op.msg_id, reason=op.reason, epoch=epoch)
        else:
            self._skip(event)

    def _spooled(self, fut: Any, msg_ids: list[int], epoch: int) -> None:
        if fut.cancelled() or fut.exception() is not None:
            return  # the broker drops every client and rebuilds: these were never acknowledged
        commits = fut.result()
        seq: int = commits[-1].last_seq if commits else 0
        self.events.write_line("message_spooled", commit_line, msg_ids, seq, epoch, False)
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
            self.events.write_line("message_replicated", commit_line, msg_ids, seq, epoch, late)

    def flush_counts(self) -> None:
        """Once a second (the node's watchdog) and at stop: what sampling skipped since the last call."""
        if self.unsampled:
            counts, self.unsampled = self.unsampled, {}
            self.events.write("message_events_unsampled", counts=counts)

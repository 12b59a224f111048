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
- One submission's events go to the log as one entry (one clock read), in
  the order of its ops; their lines are made on the log's writer thread
  (`submission_lines`, `commit_line` below): the loop passes the ops it
  kept, never a dict or a string. A commit's list of ids is made once for
  its spooled and its replicated line (`CommitIds`); what repeats from one
  stored op to the next (topic, qos, size, publisher, retain) once.
  Compiled by mypyc (docs/build.md): ops are told apart by `isinstance`, the
  hot ones first.
"""

from __future__ import annotations

import collections
from typing import Any, Callable, Final, Protocol, Union

from ..eventlines import ids_json, json_str
from ..spool.ops import (MessageAcked, MessageDropped, MessageInflight, MessageRouted, MessagesAcked,
                         MessagesInflight, MessageStored)

MAX_PENDING_COMMITS = 10_000
_HASH_MULT = 2654435761  # Knuth's multiplicative hash: spreads consecutive ids over the 32-bit range


class Delivery:
    """A message_delivered or message_acknowledged line: one batch op's client and the ids sampling kept."""

    def __init__(self, event: str, client: str, msg_ids: tuple[int, ...]) -> None:
        self.event: Final = event
        self.client: Final = client
        self.msg_ids: Final = msg_ids


class Dropped:
    """A message_expired or message_dropped line."""

    def __init__(self, event: str, client: str, msg_id: int, reason: str) -> None:
        self.event: Final = event
        self.client: Final = client
        self.msg_id: Final = msg_id
        self.reason: Final = reason


class CommitIds:
    """The ids of a commit's stored messages, for its message_spooled and message_replicated lines: their text is
    made once, by the first of them (on the writer thread, the only one that reads or sets it)."""

    def __init__(self, msg_ids: list[int]) -> None:
        self.msg_ids: Final = msg_ids
        self.text = ""


Item = Union[MessageRouted, MessageStored, Delivery, Dropped]  # a line of `submission_lines` each


class EventSink(Protocol):
    """What this module writes to: the node's EventLog (tests pass a recorder)."""

    def write(self, event: str, **fields: Any) -> None: ...

    def write_lines(self, event: str, count: int, render: Callable[..., str], *args: Any) -> None: ...


class MessageEvents:
    def __init__(self, events: EventSink, sample_ratio: float = 1.0, acked_seq: Callable[[], int] | None = None,
                 mate_needed: Callable[[], bool] = lambda: True) -> None:
        self.events = events
        self._threshold = int(sample_ratio * (1 << 32))
        self._all = sample_ratio >= 1.0
        self._acked_seq = acked_seq
        self._mate_needed = mate_needed  # whether acks wait for the standby now (false: it is out of sync)
        # (seq, ids, epoch, late) of the commits not yet replicated
        self._pending: collections.deque[tuple[int, CommitIds, int, bool]] = collections.deque()
        self.unsampled: dict[str, int] = {}

    def keep(self, msg_id: int) -> bool:
        return self._all or (msg_id * _HASH_MULT) & 0xFFFFFFFF < self._threshold

    def _skip(self, kind: str, n: int = 1) -> None:
        self.unsampled[kind] = self.unsampled.get(kind, 0) + n

    def submitted(self, op_list: list[Any], epoch: int, future: Any) -> None:
        """One submission to the spool writer (on the broker loop): its ops, and the future of its commit."""
        stored: list[int] = []
        items: list[Item] = []  # what makes a line, in the ops' order: made into lines on the log's writer thread
        every = self._all
        for op in op_list:
            if isinstance(op, MessageRouted) or isinstance(op, MessageStored):
                msg_id = op.msg_id
                if every or self.keep(msg_id):
                    stored.append(msg_id)
                    items.append(op)
                else:
                    self._skip("message_published")
            elif isinstance(op, MessagesInflight):
                self._delivery(items, "message_delivered", op.client_id, op.msg_ids)
            elif isinstance(op, MessagesAcked):
                self._delivery(items, "message_acknowledged", op.client_id, op.msg_ids)
            elif isinstance(op, MessageInflight):
                self._delivery(items, "message_delivered", op.client_id, (op.msg_id,))
            elif isinstance(op, MessageAcked):
                self._delivery(items, "message_acknowledged", op.client_id, (op.msg_id,))
            elif isinstance(op, MessageDropped):
                event = "message_expired" if op.reason == "expired" else "message_dropped"
                if self.keep(op.msg_id):
                    items.append(Dropped(event, op.client_id, op.msg_id, op.reason))
                else:
                    self._skip(event)
        if items:
            self.events.write_lines("message_events", len(items), submission_lines, items, epoch)
        if stored:
            ids = CommitIds(stored)
            future.add_done_callback(lambda fut: self._spooled(fut, ids, epoch))

    def _delivery(self, items: list[Item], event: str, client_id: str, msg_ids: tuple[int, ...]) -> None:
        if self._all:
            ids = msg_ids
        else:
            ids = tuple([m for m in msg_ids if self.keep(m)])
            if len(ids) != len(msg_ids):
                self._skip(event, len(msg_ids) - len(ids))
        if ids:
            items.append(Delivery(event, client_id, ids))

    def _spooled(self, fut: Any, ids: CommitIds, epoch: int) -> None:
        if fut.cancelled() or fut.exception() is not None:
            return  # the broker drops every client and rebuilds: these were never acknowledged
        commits = fut.result()
        seq: int = commits[-1].last_seq if commits else 0
        self.events.write_lines("message_spooled", 1, commit_line, ids, seq, epoch, False)
        if self._acked_seq is not None:
            self._pending.append((seq, ids, epoch, not self._mate_needed()))
            if len(self._pending) > MAX_PENDING_COMMITS:
                self._skip("replication_unobserved", len(self._pending.popleft()[1].msg_ids))
            self.check_replicated()

    def check_replicated(self) -> None:
        """The standby may have acknowledged more (called whenever the mate link reports an ack)."""
        if not self._pending or self._acked_seq is None:
            return
        acked = self._acked_seq()
        while self._pending and self._pending[0][0] <= acked:
            seq, ids, epoch, late = self._pending.popleft()
            self.events.write_lines("message_replicated", 1, commit_line, ids, seq, epoch, late)

    def flush_counts(self) -> None:
        """Once a second (the node's watchdog) and at stop: what sampling skipped since the last call."""
        if self.unsampled:
            counts, self.unsampled = self.unsampled, {}
            self.events.write("message_events_unsampled", counts=counts)


def submission_lines(stamp: str, event: str, items: list[Item], epoch: int) -> str:
    """The lines of what the loop kept of one submission's ops, in their order, one per item: message_published
    (msg_id, topic, qos, bytes, client, epoch, retain, created_ms) of a stored op, message_delivered or
    message_acknowledged (client, msg_ids, epoch) of a Delivery, message_expired or message_dropped (client,
    msg_id, reason, epoch) of a Dropped. `event` names the entry (a render_error line's), not its lines."""
    parts: list[str] = []
    published = f'{stamp}message_published","msg_id":'
    epoch_end = f',"epoch":{epoch}}}\n'
    epoch_list_end = "]" + epoch_end
    middle = ""  # a stored op's members from topic to created_ms's name: the same for most of a submission
    topic = client = ""
    size = qos = 0
    retain = False
    created, created_text = 0, "0"
    for item in items:
        if isinstance(item, MessageRouted) or isinstance(item, MessageStored):
            if (not middle or item.topic != topic or item.publisher != client or len(item.payload) != size
                    or item.qos != qos or item.retain != retain):
                topic, client, size, qos, retain = item.topic, item.publisher, len(item.payload), item.qos, item.retain
                middle = (f',"topic":{json_str(topic)},"qos":{qos},"bytes":{size},"client":{json_str(client)},'
                          f'"epoch":{epoch},"retain":{"true" if retain else "false"},"created_ms":')
            if item.created_at_ms != created:
                created = item.created_at_ms
                created_text = str(created)
            # pieces, not a line: the one join below copies each once
            parts.append(published)
            parts.append(str(item.msg_id))
            parts.append(middle)
            parts.append(created_text)
            parts.append("}\n")
        elif isinstance(item, Delivery):
            parts.append(f'{stamp}{item.event}","client":{json_str(item.client)},"msg_ids":[')
            parts.append(",".join([str(m) for m in item.msg_ids]))
            parts.append(epoch_list_end)
        else:
            parts.append(f'{stamp}{item.event}","client":{json_str(item.client)},"msg_id":{item.msg_id},'
                         f'"reason":{json_str(item.reason)}{epoch_end}')
    return "".join(parts)


def commit_line(stamp: str, event: str, ids: CommitIds, seq: int, epoch: int, after_resync: bool) -> str:
    """message_spooled's or message_replicated's line: msg_ids, seq, epoch, and after_resync only when true."""
    if not ids.text:
        ids.text = ids_json(ids.msg_ids)
    if after_resync:
        return f'{stamp}{event}","msg_ids":{ids.text},"seq":{seq},"epoch":{epoch},"after_resync":true}}\n'
    return f'{stamp}{event}","msg_ids":{ids.text},"seq":{seq},"epoch":{epoch}}}\n'

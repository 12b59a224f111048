"""An event log line's text (docs/events.md, "Schema"): the stamp every line opens with, a dict event's line, and
the message events' lines, a submission or a commit at a time.

Rules:
- A line is one JSON object, ASCII only (json's escapes for everything else), ended by a newline: the common
  members first, in their order (v, ts, mono_ms, node, event), then the event's own in the order given.
- Every line reads byte for byte as `json.dumps(..., separators=(",", ":"))` makes the same dict, key order kept:
  analytics reads these bytes, and tests/unit/test_eventlines.py holds them.
- Message events are made here, on the log's writer thread, from what the broker loop kept of a submission's ops
  (`submission_lines`) or of a commit (`commit_line`): the loop builds neither a dict nor a string for them, and
  the log takes one entry and one clock read per submission.
- A commit's list of ids is made once for its spooled and its replicated line (`CommitIds`).
- What repeats from one stored op to the next in a submission (topic, qos, size, publisher, retain: mostly one
  stream) is formatted once.
- No I/O, no clock: the writer passes the times its producers stamped. Compiled by mypyc (docs/build.md).
"""

from __future__ import annotations

import json
from typing import Any, Final, Sequence, Union

from .spool.ops import MessageRouted, MessageStored

SCHEMA_VERSION: Final = 2
_ENCODER: Final = json.JSONEncoder(separators=(",", ":"), default=str)
# What json.dumps makes of a str (ASCII, escaped), without the encoder's Python-level dispatch around the C call.
_json_str: Final = json.encoder.encode_basestring_ascii


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


Stored = Union[MessageRouted, MessageStored]  # a message_published line each
Item = Union[MessageRouted, MessageStored, Delivery, Dropped]  # a line of `submission_lines` each


def stamp(node_json: str, ts: float, mono_ms: int) -> str:
    """A line's common members, up to its event's name: '{"v":2,"ts":...,"mono_ms":...,"node":"...","event":"'."""
    return '{"v":%d,"ts":%.6f,"mono_ms":%d,"node":%s,"event":"' % (SCHEMA_VERSION, ts, mono_ms, node_json)


def line(stamp: str, event: str, fields: dict[str, Any]) -> str:
    """A dict event's line: `fields` as the C encoder makes them (anything it cannot encode as its str)."""
    if not fields:
        return f'{stamp}{event}"}}\n'
    return f'{stamp}{event}",{_ENCODER.encode(fields)[1:]}\n'


def ids_json(msg_ids: Sequence[int]) -> str:
    """A list of message ids as json.dumps makes it ("[1,2,3]")."""
    return "[" + ",".join([str(m) for m in msg_ids]) + "]"


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
                middle = (f',"topic":{_json_str(topic)},"qos":{qos},"bytes":{size},"client":{_json_str(client)},'
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
            parts.append(f'{stamp}{item.event}","client":{_json_str(item.client)},"msg_ids":[')
            parts.append(",".join([str(m) for m in item.msg_ids]))
            parts.append(epoch_list_end)
        else:
            parts.append(f'{stamp}{item.event}","client":{_json_str(item.client)},"msg_id":{item.msg_id},'
                         f'"reason":{_json_str(item.reason)}{epoch_end}')
    return "".join(parts)


def commit_line(stamp: str, event: str, ids: CommitIds, seq: int, epoch: int, after_resync: bool) -> str:
    """message_spooled's or message_replicated's line: msg_ids, seq, epoch, and after_resync only when true."""
    if not ids.text:
        ids.text = ids_json(ids.msg_ids)
    if after_resync:
        return f'{stamp}{event}","msg_ids":{ids.text},"seq":{seq},"epoch":{epoch},"after_resync":true}}\n'
    return f'{stamp}{event}","msg_ids":{ids.text},"seq":{seq},"epoch":{epoch}}}\n'

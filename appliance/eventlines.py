"""An event log line's text (docs/events.md, "Schema"): the head every line opens with, a dict event's members,
and message_published's lines, a batch at a time.

Rules:
- A line is one JSON object, ASCII only (json's escapes for everything else), ended by a newline: the common
  members first, in their order (v, ts, mono_ms, node, event), then the event's own in the order given.
- Every line reads byte for byte as `json.dumps(..., separators=(",", ":"))` makes the same dict, key order kept:
  analytics reads these bytes, and tests/unit/test_eventlines.py holds them.
- message_published is the busiest line, one per stored message: it is made here from the ops themselves, a whole
  batch in one call on the log's writer thread, so the broker loop builds neither a dict nor a string for it.
  The other message events carry a batch's `msg_ids` (every stored message's id is in four of them): a list of
  ints is formatted by one `%` with a "%d" per id, which writes the digits straight into the line.
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

Stored = Union[MessageRouted, MessageStored]  # a message_published each
_ID_FORMATS: Final[dict[int, str]] = {}  # n -> "[%d,...]" for n ids: json's bytes for a list of ints, made in C
_ID_FORMATS_MAX: Final = 256


def head(node: str, ts: float, mono_ms: int, event: str) -> str:
    """A line's common members, its brace left open for the event's own."""
    return '{"v":%d,"ts":%.6f,"mono_ms":%d,"node":%s,"event":"%s"' % (SCHEMA_VERSION, ts, mono_ms, _json_str(node),
                                                                      event)


def line(head: str, fields: dict[str, Any]) -> str:
    """A dict event's line: its head, then `fields` as the C encoder makes them (anything else as its str)."""
    if not fields:
        return head + "}\n"
    return f"{head},{_ENCODER.encode(fields)[1:]}\n"


def published_lines(head: str, ops: list[Stored], epoch: int) -> str:
    """message_published's line of each op (its msg_id, topic, qos, bytes, client, epoch, retain, created_ms).

    A batch is mostly one stream: a topic or a publisher repeated from the op before is not escaped again."""
    parts: list[str] = []
    topic, topic_json = "", '""'
    client, client_json = "", '""'
    retained = f',"epoch":{epoch},"retain":true,"created_ms":'
    plain = f',"epoch":{epoch},"retain":false,"created_ms":'
    for op in ops:
        if op.topic != topic:
            topic = op.topic
            topic_json = _json_str(topic)
        if op.publisher != client:
            client = op.publisher
            client_json = _json_str(client)
        parts.append(f'{head},"msg_id":{op.msg_id},"topic":{topic_json},"qos":{op.qos},"bytes":{len(op.payload)},'
                     f'"client":{client_json}{retained if op.retain else plain}{op.created_at_ms}}}\n')
    return "".join(parts)


def ids_json(msg_ids: Sequence[int]) -> str:
    """A list of message ids as json.dumps makes it ("[1,2,3]")."""
    n = len(msg_ids)
    form = _ID_FORMATS.get(n)
    if form is None:
        form = "[" + ",".join(["%d"] * n) + "]"
        if len(_ID_FORMATS) < _ID_FORMATS_MAX:
            _ID_FORMATS[n] = form
    return form % tuple(msg_ids)


def delivery_line(head: str, client: str, msg_ids: Sequence[int], epoch: int) -> str:
    """message_delivered's or message_acknowledged's line: client, msg_ids, epoch."""
    return f'{head},"client":{_json_str(client)},"msg_ids":{ids_json(msg_ids)},"epoch":{epoch}}}\n'


def commit_line(head: str, msg_ids: Sequence[int], seq: int, epoch: int, after_resync: bool) -> str:
    """message_spooled's or message_replicated's line: msg_ids, seq, epoch, and after_resync only when true."""
    if after_resync:
        return f'{head},"msg_ids":{ids_json(msg_ids)},"seq":{seq},"epoch":{epoch},"after_resync":true}}\n'
    return f'{head},"msg_ids":{ids_json(msg_ids)},"seq":{seq},"epoch":{epoch}}}\n'

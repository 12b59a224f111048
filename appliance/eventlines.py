"""An event log line's text (docs/events.md, "Schema"): the stamp every line opens with, a dict event's line, and
the pieces the message events' lines are made of (`broker/message_events.py` makes those, a submission at a time).

Rules:
- A line is one JSON object, ASCII only (json's escapes for everything else), ended by a newline: the common
  members first, in their order (v, ts, mono_ms, node, event), then the event's own in the order given.
- Every line reads byte for byte as `json.dumps(..., separators=(",", ":"))` makes the same dict, key order kept:
  analytics reads these bytes, and tests/unit/test_eventlines.py holds them.
- No I/O, no clock: the log's writer thread passes the times its producers stamped. Compiled by mypyc
  (docs/build.md).
"""

from __future__ import annotations

import json
from typing import Any, Final, Sequence

SCHEMA_VERSION: Final = 2
_ENCODER: Final = json.JSONEncoder(separators=(",", ":"), default=str)
# What json.dumps makes of a str (ASCII, escaped), without the encoder's Python-level dispatch around the C call.
json_str: Final = json.encoder.encode_basestring_ascii


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



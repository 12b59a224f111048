"""The domains of op fields (`check_op`), enforced when ops are submitted and when a standby receives them, and
verified when a state is loaded, so a damaged row is noticed.

Rules:
- QoS and retain handling are 0..2, protocol versions 3..5, packet ids 1..65535 (`_DOMAINS` says which fields).
- `MessagesInflight` and `MessagesAcked` hold at most `MAX_BATCH_ITEMS` messages (a window is at most 65535);
  a `MessagesInflight` has one packet id, in 1..65535, per message.
- Anything else is a `ValueError` naming the field and its domain.
- Compiled (docs/build.md): the standby runs this once per op it receives.
"""

from __future__ import annotations

from typing import Any, Final

from .ops import (
    InboundQos2Received, InboundQos2Released, MessageInflight, MessageQueued, MessageRouted, MessageStored,
    MessagesAcked, MessagesInflight, SessionOpened, Subscribed,
)


QOS: Final = range(3)
RETAIN_HANDLING: Final = range(3)
PROTOCOL_VERSIONS: Final = range(3, 6)
PACKET_IDS: Final = range(1, 0x10000)
MAX_BATCH_ITEMS: Final = 65535
_DOMAINS: Final[dict[type, tuple[tuple[str, range], ...]]] = {
    MessageStored: (("qos", QOS),),
    MessageQueued: (("qos", QOS),),
    MessageRouted: (("qos", QOS), ("queue_qos", QOS)),
    MessageInflight: (("packet_id", PACKET_IDS),),
    SessionOpened: (("protocol_version", PROTOCOL_VERSIONS),),
    Subscribed: (("qos", QOS), ("retain_handling", RETAIN_HANDLING)),
    InboundQos2Received: (("packet_id", PACKET_IDS),),
    InboundQos2Released: (("packet_id", PACKET_IDS),),
}


def check_op(op: Any) -> None:
    """ValueError if a field is outside its domain (see the rules)."""
    if isinstance(op, MessageRouted) and 0 <= op.qos < 3 and 0 <= op.queue_qos < 3:  # QOS, read typed
        return  # a durable message's op, the usual one
    kind = type(op)
    if kind is MessagesInflight or kind is MessagesAcked:
        if len(op.msg_ids) > MAX_BATCH_ITEMS:
            raise ValueError(f"{kind.__name__} of {len(op.msg_ids)} messages (at most {MAX_BATCH_ITEMS})")
        if kind is MessagesInflight:
            if len(op.packet_ids) != len(op.msg_ids):
                raise ValueError(f"MessagesInflight has {len(op.msg_ids)} msg_ids but {len(op.packet_ids)} "
                                 "packet_ids")
            bad = [p for p in op.packet_ids if p not in PACKET_IDS]
            if bad:
                raise ValueError(f"MessagesInflight.packet_ids item {bad[0]!r} is outside 1..65535")
        return
    for name, domain in _DOMAINS.get(kind, ()):
        value = getattr(op, name)
        if value not in domain:
            raise ValueError(f"{kind.__name__}.{name} {value!r} is outside {domain.start}..{domain.stop - 1}")

"""What the broker core asks its adapter to do: the effects of one input, executed in order.

Rules:
- Effects are made per message, so each has an explicit `__init__` (mypyc compiles it into a few stores) and
  is immutable by `Final`, which the type checker enforces, not by a runtime `frozen=True`, whose generated
  `__init__` sets each field through `object.__setattr__`.
- `Persist` hoists a `Persist` found in its `then` (see its docstring).
- eq, repr and hash are the dataclass's, as when these were frozen dataclasses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final


@dataclass(slots=True, init=False, unsafe_hash=True)
class Send:
    conn: Final[int]
    packet: Final[Any]

    def __init__(self, conn: int, packet: Any) -> None:
        self.conn = conn
        self.packet = packet


@dataclass(slots=True, init=False, unsafe_hash=True)
class Close:
    conn: Final[int]
    reason_code: Final[int]
    reason: Final[str]

    def __init__(self, conn: int, reason_code: int = 0, reason: str = "") -> None:
        self.conn = conn
        self.reason_code = reason_code
        self.reason = reason


@dataclass(slots=True, init=False, unsafe_hash=True)
class Persist:
    """Write `ops`; run `then` once they are durable.

    A `Persist` inside `then` is hoisted: its ops join this one's, its own `then` takes its place.
    Its ops describe changes the core already made in memory (a message marked in flight with a
    packet id); submitted only after this commit, a later input (a reconnect's DUP resend) could
    be sent and acknowledged ahead of them, and a crash would forget what the client was sent.
    """

    ops: Final[tuple[Any, ...]]
    then: Final[tuple[Any, ...]]

    def __init__(self, ops: tuple[Any, ...], then: tuple[Any, ...] = ()) -> None:
        for e in then:  # a plain loop: cheaper than a generator per Persist on the QoS 1 path
            if type(e) is Persist:
                ops, then = _hoisted(ops, then)
                break
        self.ops = ops
        self.then = then


def _hoisted(ops: tuple[Any, ...], then: tuple[Any, ...]) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """`ops` and `then` with each `Persist` of `then` replaced by its `then`, its ops joining `ops`."""
    ops_: list[Any] = list(ops)
    then_: list[Any] = []
    for e in then:
        if isinstance(e, Persist):
            ops_ += e.ops
            then_ += e.then
        else:
            then_.append(e)
    return tuple(ops_), tuple(then_)


@dataclass(slots=True, init=False, unsafe_hash=True)
class Connacked:
    """In the CONNACK's `then`, right behind it: the adapter hands this back to `BrokerCore.connacked`, which
    resends what was in flight and fills the window. Before it nothing is sent to the connection: a message
    routed while the session's commit runs would otherwise reach the client ahead of its CONNACK."""

    conn: Final[int]

    def __init__(self, conn: int) -> None:
        self.conn = conn


@dataclass(slots=True, init=False, unsafe_hash=True)
class Durable:
    """In a `Persist`'s `then`: the commit that queued `entries` is durable; the adapter hands this back to
    `BrokerCore.durable`, which marks them ready and fills the windows of `client_ids`."""

    entries: Final[tuple[Any, ...]]
    client_ids: Final[tuple[str, ...]]

    def __init__(self, entries: tuple[Any, ...], client_ids: tuple[str, ...] = ()) -> None:
        self.entries = entries
        self.client_ids = client_ids

"""The op log's chain: every op carries (epoch, seq, checksum) bound to its predecessor.

Rules:
- checksum(op n) = sha256(checksum(op n-1) || epoch u64 BE || seq u64 BE || op bytes)[:16].
  Before the first op stands `GENESIS` (epoch 0, seq 0, sixteen zero bytes).
- seq grows by exactly 1 from op to op (it never restarts, not even in a new
  epoch); epoch never decreases. So (epoch, seq) orders any two positions and
  the checksum of the last op digests the whole history up to it.
- `verify_chain` is what the store runs at start-up over its log and what the
  mate link runs over received ops: it names the first op that does not follow.
"""

from __future__ import annotations

import dataclasses
import hashlib
import struct
from collections.abc import Iterable
from typing import NamedTuple

from .errors import ChainError

CHECKSUM_BYTES = 16
_pack = struct.Struct(">QQ").pack
_sha256 = hashlib.sha256


@dataclasses.dataclass(frozen=True, slots=True)
class ChainPoint:
    """A position in the op log: the last op's epoch, seq and checksum."""

    epoch: int
    seq: int
    checksum: bytes

    @property
    def position(self) -> tuple[int, int]:
        return self.epoch, self.seq


GENESIS = ChainPoint(0, 0, bytes(CHECKSUM_BYTES))


class LogEntry(NamedTuple):
    """One op as the log holds it and the mate link ships it: `body` is `codec.encode_op(op)`.

    A named tuple rather than a dataclass: one is made per op on the message
    path, and its field order is the op log's column order, so entries go to
    `executemany` as they are.
    """

    epoch: int
    seq: int
    checksum: bytes
    body: bytes

    @property
    def point(self) -> ChainPoint:
        return ChainPoint(self.epoch, self.seq, self.checksum)


def checksum(prev: bytes, epoch: int, seq: int, body: bytes) -> bytes:
    return _sha256(prev + _pack(epoch, seq) + body).digest()[:CHECKSUM_BYTES]


def chain(prev: ChainPoint, epoch: int, bodies: Iterable[bytes]) -> list[LogEntry]:
    """New entries for `bodies`, written in `epoch` after `prev`."""
    assert epoch >= prev.epoch, f"epoch {epoch} is older than the log's {prev.epoch}"
    entries = []
    point_sum, seq = prev.checksum, prev.seq
    for body in bodies:
        seq += 1
        point_sum = _sha256(point_sum + _pack(epoch, seq) + body).digest()[:CHECKSUM_BYTES]
        entries.append(LogEntry(epoch, seq, point_sum, body))
    return entries


def verify_chain(entries: Iterable[LogEntry], prev: ChainPoint = GENESIS) -> ChainPoint:
    """The point after the last entry, if every entry follows its predecessor (the first one `prev`).

    Raises `ChainError` naming the first entry that does not follow, and why.
    """
    for e in entries:
        if e.seq != prev.seq + 1:
            raise ChainError(e.seq, f"op {e.seq} follows op {prev.seq} (op {prev.seq + 1} is missing)"
                             if e.seq > prev.seq + 1 else f"op {e.seq} repeats or goes back after op {prev.seq}")
        if e.epoch < prev.epoch:
            raise ChainError(e.seq, f"op {e.seq}'s epoch {e.epoch} is older than op {prev.seq}'s epoch {prev.epoch}")
        if len(e.checksum) != CHECKSUM_BYTES or checksum(prev.checksum, e.epoch, e.seq, e.body) != e.checksum:
            raise ChainError(e.seq, f"op {e.seq}'s checksum does not chain")
        prev = ChainPoint(e.epoch, e.seq, e.checksum)
    return prev

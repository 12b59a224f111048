"""The op log's chain: every commit carries (epoch, seq, checksum) bound to the commit before it.

Rules:
- A commit is a run of consecutive ops written together (one submission to the writer): its op
  records and one commit record (records.py), `Commit.data`, byte for byte as the segment holds
  them and as the mate link ships them.
- checksum(commit) = sha256(checksum(commit before) || epoch u64 BE || last seq u64 BE || ops u32 BE
  || its op records' bytes)[:16]. Before the first commit stands `GENESIS` (epoch 0, seq 0, sixteen
  zero bytes). One digest per commit, not per op: the records' own CRCs catch a flipped bit, the chain
  catches a history that is not ours.
- seq grows by exactly 1 from op to op (it never restarts, not even in a new epoch); a commit's
  last seq is the last one's plus its ops; epoch never decreases. So (epoch, seq) orders any two
  commit ends, and the checksum of the last commit digests the whole history up to it. A point of
  the log (`ChainPoint`) is always a commit's end.
- `records.verify_chain` is what the store runs at start-up over its log and what the mate link runs
  over received commits: it names the first commit that does not follow.
"""

from __future__ import annotations

import dataclasses
import hashlib
import struct
from typing import Final, NamedTuple

CHECKSUM_BYTES: Final = 16
_pack: Final = struct.Struct(">QQI").pack
_sha256: Final = hashlib.sha256


@dataclasses.dataclass(frozen=True, slots=True)
class ChainPoint:
    """A position in the op log: the last commit's epoch, last seq and checksum."""

    epoch: int
    seq: int
    checksum: bytes

    @property
    def position(self) -> tuple[int, int]:
        return self.epoch, self.seq


GENESIS = ChainPoint(0, 0, bytes(CHECKSUM_BYTES))


class Commit(NamedTuple):
    """One commit as the log holds it and the mate link ships it (records.py makes and parses `data`)."""

    epoch: int
    last_seq: int
    ops: int
    checksum: bytes
    data: bytes  # its op records, then its commit record

    @property
    def point(self) -> ChainPoint:
        return ChainPoint(self.epoch, self.last_seq, self.checksum)

    @property
    def first_seq(self) -> int:
        return self.last_seq - self.ops + 1


def checksum(prev: bytes, epoch: int, last_seq: int, ops: int, op_records: bytes | bytearray | memoryview) -> bytes:
    digest = _sha256(prev + _pack(epoch, last_seq, ops))
    digest.update(op_records)
    return digest.digest()[:CHECKSUM_BYTES]


def follows(prev: ChainPoint, epoch: int, last_seq: int, ops: int) -> str:
    """Why a commit of these fields cannot follow `prev` ("" if it can, checksum aside)."""
    first = last_seq - ops + 1
    if ops < 1:
        return f"a commit of {ops} ops ending at op {last_seq}"
    if first != prev.seq + 1:
        return (f"ops {first}..{last_seq} follow op {prev.seq} (op {prev.seq + 1} is missing)" if first > prev.seq + 1
                else f"ops {first}..{last_seq} repeat or go back after op {prev.seq}")
    if epoch < prev.epoch:
        return f"ops {first}..{last_seq} have epoch {epoch}, older than op {prev.seq}'s epoch {prev.epoch}"
    return ""

"""The standby's per-op work on the commits it receives from the active, in one compiled pass (docs/build.md).

Rules:
- Every op record of every commit is read (its frame and CRC checked: records.op_bodies), decoded (codec.py) and
  checked against its field domains (domains.py); the first that fails raises (`RecordError`, `OpCodecError`,
  ValueError: the peer's fault) and nothing is returned.
- With the ops come each one's encoded size and the bytes the bodies they store add (state.stored_size_of): what
  the writer admits against its byte limit and the state model counts.
"""

from __future__ import annotations

from collections.abc import Sequence

from ._opcodec import decode_op
from .chain import Commit
from .domains import check_op
from .ops import MessageRouted, MessageStored, Op
from .records import op_bodies
from .state import stored_size_of


def read_commits(commits: Sequence[Commit]) -> tuple[tuple[Op, ...], tuple[int, ...], int]:
    """(the ops of `commits` in order, each op's encoded size, the bytes their stored bodies add)."""
    ops: list[Op] = []
    sizes: list[int] = []
    added = 0
    for commit in commits:
        for body in op_bodies(commit):
            op = decode_op(body)
            check_op(op)
            size = len(body)
            ops.append(op)
            sizes.append(size)
            if type(op) is MessageRouted or type(op) is MessageStored:
                added += stored_size_of(op, size)
    return tuple(ops), tuple(sizes), added


def added_bytes(ops: Sequence[Op], sizes: Sequence[int]) -> int:
    """The bytes the bodies `ops` store add (their encoded sizes `sizes`)."""
    added = 0
    for i in range(len(ops)):
        op = ops[i]
        if type(op) is MessageRouted or type(op) is MessageStored:
            added += stored_size_of(op, sizes[i])
    return added

"""The active's per-op work on a submission before it becomes a commit, in one compiled pass (docs/build.md);
received.py is the standby's.

Rules:
- Every op is encoded (codec.py) first, then each is checked against its field domains (domains.py): the first
  that fails raises (`OpCodecError`, ValueError: our own bug, refused before anything is queued).
- With the bodies come each one's size and the bytes the bodies they store add (state.stored_size_of): what the
  writer admits against its byte limit and the state model counts.
"""

from __future__ import annotations

from collections.abc import Sequence

from ._opcodec import encode_op
from .domains import check_op
from .ops import MessageRouted, MessageStored, Op
from .state import stored_size_of


def encode_ops(ops: Sequence[Op]) -> tuple[list[bytes], tuple[int, ...], int]:
    """(each op's body, each body's size, the bytes the stored bodies add)."""
    bodies: list[bytes] = [encode_op(op) for op in ops]
    sizes: list[int] = []
    added = 0
    for i in range(len(bodies)):
        op = ops[i]
        check_op(op)
        size = len(bodies[i])
        sizes.append(size)
        if type(op) is MessageRouted or type(op) is MessageStored:
            added += stored_size_of(op, size)
    return bodies, tuple(sizes), added

"""The op log seen from tests: commits made from op bodies, and the (seq, op bytes) a log holds."""

from __future__ import annotations

from pairmq.appliance.spool.chain import GENESIS, ChainPoint, Commit
from pairmq.appliance.spool.records import make_commit, op_bodies


def chained(groups, prev: ChainPoint = GENESIS, epoch: int = 1) -> list[Commit]:
    """A commit of each group of op bodies, chained after `prev`."""
    out = []
    for bodies in groups:
        out.append(make_commit(prev, epoch, bodies))
        prev = out[-1].point
    return out


def ops_of(commits) -> list[tuple[int, bytes]]:
    """(seq, op bytes) of every op of `commits`, in order."""
    return [(seq, body) for c in commits for seq, body in enumerate(op_bodies(c), c.first_seq)]


def logged_ops(spool, after_seq: int = 0) -> list[tuple[int, bytes]]:
    """(seq, op bytes) of every op an open spool's log holds after `after_seq`."""
    return ops_of(spool.read_commits(after_seq, 1 << 40))


def read_commits(log, after_seq: int, durable_seq: int, max_ops: int) -> list[Commit]:
    """A log read as `SegmentLog.read_commits` makes it, from a list of commits of which those up to op
    `durable_seq` are durable: whole commits after `after_seq`, until they hold `max_ops` ops."""
    out, ops = [], 0
    for c in log:
        if after_seq < c.last_seq <= durable_seq and ops < max_ops:
            out.append(c)
            ops += c.ops
    return out

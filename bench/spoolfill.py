"""Spools with many queued messages, built directly with the spool writer API (bench/replication.py's resync).

Generating 1,000,000 messages through MQTT takes ~100 s at 10k msg/s; the writer takes the same ops
(the one the broker itself writes for a publish to an offline persistent subscriber: MessageRouted)
much faster. What the node later loads is exactly what the broker would have
written, so the resync it measures is the real one.

    fill(spool_dir, messages, payload_bytes)   a session "bench-resync-sub" (MQTT 3.1.1, never expires,
                                               offline, subscribed to bench/resync at QoS 1) with
                                               `messages` QoS 1 messages queued
"""

from __future__ import annotations

from pathlib import Path

from pairmq.appliance.broker.session import NEVER
from pairmq.appliance.spool import ops as o
from pairmq.appliance.spool.chain import ChainPoint
from pairmq.appliance.spool.store import Spool
from pairmq.appliance.spool.writer import SpoolWriter, WriterLimits

CLIENT_ID = "bench-resync-sub"
TOPIC = "bench/resync"
EPOCH = 1
MESSAGES_PER_SUBMISSION = 1_000


def session_ops() -> list[o.Op]:
    return [o.SessionOpened(CLIENT_ID, 4, NEVER, 0), o.Subscribed(CLIENT_ID, TOPIC, 1),
            o.SessionDisconnected(CLIENT_ID, 0, NEVER)]


def message_ops(first_msg_id: int, n: int, payload: bytes) -> list[o.Op]:
    out: list[o.Op] = []
    for msg_id in range(first_msg_id, first_msg_id + n):
        out.append(o.MessageRouted(msg_id, TOPIC, payload, 1, False, b"", 0, "bench-pub", 0, CLIENT_ID, 1, False))
    return out


def fill(spool_dir: Path, messages: int, payload_bytes: int, *, first_msg_id: int = 1, with_session: bool = True,
         keep_ops: int = WriterLimits().keep_ops) -> ChainPoint:
    """Append the session (if `with_session`) and `messages` queued messages to the spool in `spool_dir`
    (created if missing); returns its head. `keep_ops` bounds the op log as a node's writer would (a node
    keeps 100,000); a larger value keeps every op, for an incremental resync of all of them. The ops are written
    in epoch 1, or in the spool's own epoch if it is later (a test's diverged tail on a node that already
    wrote in a later epoch)."""
    payload = bytes(i % 251 for i in range(payload_bytes))
    limits = WriterLimits(keep_ops=keep_ops, max_spool_bytes=1 << 40, max_pending_ops=200_000)
    with Spool.open(spool_dir) as spool:
        writer = SpoolWriter(spool, limits)
        epoch = max(EPOCH, spool.head.epoch)
        last = None
        if with_session:
            last = writer.submit(session_ops(), epoch)
        for at in range(0, messages, MESSAGES_PER_SUBMISSION):
            n = min(MESSAGES_PER_SUBMISSION, messages - at)
            last = writer.submit(message_ops(first_msg_id + at, n, payload), epoch)
            if writer.pending_ops > limits.max_pending_ops // 2:
                last.future.result()  # bounded: let the commits catch up
        if last is not None:
            last.future.result()
        head = writer.durable
        writer.close()
    return head

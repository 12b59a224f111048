"""A spool directory of the old layout (SQLite's `spool.db`), written by the old layout's own code
(appliance/spool/legacy/sql.py), for tests of the refusal at start and of `pairmq spool migrate`."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from pairmq.appliance.broker.session import NEVER
from pairmq.appliance.spool import ops as o
from pairmq.appliance.spool.chain import GENESIS, ChainPoint
from pairmq.appliance.spool.codec import encode_op
from pairmq.appliance.spool.legacy.sql import SqlApplier, chain, create
from pairmq.appliance.spool.state import DEFAULT_MAX_MESSAGE_IDS


def write_old_spool(directory: Path, op_list: list[o.Op], epoch: int = 1) -> ChainPoint:
    """`directory/spool.db` holding `op_list` applied and logged in one commit; its head."""
    directory.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(directory / "spool.db", isolation_level=None)
    try:
        create(conn)
        applier = SqlApplier(conn, DEFAULT_MAX_MESSAGE_IDS)
        entries = chain(GENESIS, epoch, [encode_op(op) for op in op_list])
        conn.execute("BEGIN")
        for entry, op in zip(entries, op_list):
            assert applier.apply(entry.seq, op, entry.body), op
        applier.finish(entries)
        conn.execute("COMMIT")
    finally:
        conn.close()
    return entries[-1].point


def offline_session(client_id: str, topic_filter: str, payloads: list[bytes], *, first_msg_id: int = 1) -> list[o.Op]:
    """The ops of an MQTT 3.1.1 persistent session, now offline, subscribed to `topic_filter` at QoS 1 and holding
    one queued QoS 1 message per payload (published on `topic_filter` without its wildcard)."""
    topic = topic_filter.rstrip("#/") + "/kept"
    out: list[o.Op] = [o.SessionOpened(client_id, 4, NEVER, 1_000), o.Subscribed(client_id, topic_filter, 1),
                       o.SessionDisconnected(client_id, 2_000, NEVER)]
    for i, payload in enumerate(payloads, start=first_msg_id):
        out += [o.MessageStored(i, topic, payload, 1, False, b"", 0, "publisher", 3_000),
                o.MessageQueued(client_id, i, 1, False)]
    return out

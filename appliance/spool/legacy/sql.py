"""The spool's SQLite schema and the op application rules (state.py) as SQL.

Theory of operation: `SqlApplier` runs in the writer thread inside one
transaction per group commit. It keeps in memory only what makes the hot path
cheap and can be reloaded from the file after a rollback: the set of session
ids, the size of the message-id history, the highest msg_id stored and
`stored_bytes`. Bodies stored in the current transaction stay in memory
(`_fresh`, with their reference counts) and reach the table in multi-row
INSERTs at `finish` (`insert_rows`): the usual publish (store, then queue for
each subscriber, in one batch) then costs no UPDATE of a count. Queue entries use
the seq of their `MessageQueued` as rowid, so a queue reads back in order and
appending is a rowid append.
"""

from __future__ import annotations

import functools
import hashlib
import sqlite3
import struct
import zlib
from typing import NamedTuple

from .. import ops as o
from ..chain import CHECKSUM_BYTES, ChainPoint
from ..codec import encode_uints
from ..state import stored_size

SCHEMA_VERSION = 2  # 2: message_ids keyed by (client_id, message_id)
APPLICATION_ID = 0x50514D53  # "PQMS": a PairMQ spool
# A new spool's page size: a ~1.1 KB row of a 1 KiB message packs fourteen to a 16 KiB page, three to a 4 KiB one
# (a full resync's image is 19% smaller). An existing spool keeps its own; an image carries the active's.
PAGE_SIZE = 16384

SCHEMA = """
CREATE TABLE meta (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    head_epoch INTEGER NOT NULL, head_seq INTEGER NOT NULL, head_checksum BLOB NOT NULL,
    base_epoch INTEGER NOT NULL, base_seq INTEGER NOT NULL, base_checksum BLOB NOT NULL,
    stored_bytes INTEGER NOT NULL
) STRICT;
CREATE TABLE oplog (
    seq INTEGER PRIMARY KEY, epoch INTEGER NOT NULL, checksum BLOB NOT NULL, body BLOB NOT NULL
) STRICT;
CREATE TABLE messages (
    msg_id INTEGER PRIMARY KEY, refs INTEGER NOT NULL, size INTEGER NOT NULL, crc INTEGER NOT NULL,
    body BLOB NOT NULL
) STRICT;
CREATE TABLE sessions (
    client_id TEXT PRIMARY KEY, protocol_version INTEGER NOT NULL, expiry_s INTEGER NOT NULL,
    connected_at_ms INTEGER NOT NULL, disconnected_at_ms INTEGER NOT NULL, connected INTEGER NOT NULL
) STRICT, WITHOUT ROWID;
CREATE TABLE subscriptions (
    client_id TEXT NOT NULL, topic_filter TEXT NOT NULL, qos INTEGER NOT NULL, no_local INTEGER NOT NULL,
    retain_as_published INTEGER NOT NULL, retain_handling INTEGER NOT NULL, subscription_id INTEGER NOT NULL,
    PRIMARY KEY (client_id, topic_filter)
) STRICT, WITHOUT ROWID;
CREATE TABLE queue (
    seq INTEGER PRIMARY KEY, client_id TEXT NOT NULL, msg_id INTEGER NOT NULL, qos INTEGER NOT NULL,
    retain INTEGER NOT NULL, subscription_ids BLOB NOT NULL, packet_id INTEGER NOT NULL, pubrec INTEGER NOT NULL,
    UNIQUE (client_id, msg_id)
) STRICT;
CREATE TABLE retained (topic TEXT PRIMARY KEY, msg_id INTEGER NOT NULL) STRICT, WITHOUT ROWID;
CREATE TABLE inbound_qos2 (
    client_id TEXT NOT NULL, packet_id INTEGER NOT NULL, PRIMARY KEY (client_id, packet_id)
) STRICT, WITHOUT ROWID;
CREATE TABLE wills (
    client_id TEXT PRIMARY KEY, msg_id INTEGER NOT NULL, delay_s INTEGER NOT NULL
) STRICT, WITHOUT ROWID;
CREATE TABLE message_ids (
    seq INTEGER PRIMARY KEY, client_id TEXT NOT NULL, message_id TEXT NOT NULL, seen_at_ms INTEGER NOT NULL,
    UNIQUE (client_id, message_id)
) STRICT;
"""
# Added after schema 2 without a new version: a spool from before it gets the table when it is opened for
# writing (`SqlApplier`), and reads as having no owners until then (load.py).
OWNERS_TABLE = """CREATE TABLE IF NOT EXISTS session_owners (
    client_id TEXT PRIMARY KEY, owner TEXT NOT NULL
) STRICT, WITHOUT ROWID"""
TABLES = ("meta", "oplog", "messages", "sessions", "subscriptions", "queue", "retained", "inbound_qos2", "wills",
          "message_ids")


class LogEntry(NamedTuple):
    """One row of the old layout's op log: every op carried a checksum of its own."""

    epoch: int
    seq: int
    checksum: bytes
    body: bytes

    @property
    def point(self) -> ChainPoint:
        return ChainPoint(self.epoch, self.seq, self.checksum)


def chain(prev: ChainPoint, epoch: int, bodies: list[bytes]) -> list[LogEntry]:
    """The old layout's entries for `bodies` after `prev`: sha256(prev || epoch || seq || body)[:16] per op."""
    entries, point_sum, seq = [], prev.checksum, prev.seq
    for body in bodies:
        seq += 1
        point_sum = hashlib.sha256(point_sum + struct.pack(">QQ", epoch, seq) + body).digest()[:CHECKSUM_BYTES]
        entries.append(LogEntry(epoch, seq, point_sum, body))
    return entries


def create(conn: sqlite3.Connection) -> None:
    """Lay out an empty spool in a fresh database file (the caller makes the file appear atomically)."""
    conn.execute(f"PRAGMA page_size={PAGE_SIZE}")  # before the first write: fixed for the file's life in WAL mode
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA application_id={APPLICATION_ID}")
    conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
    conn.executescript(SCHEMA)
    conn.execute(OWNERS_TABLE)
    conn.execute("INSERT INTO meta VALUES (1, 0, 0, ?, 0, 0, ?, 0)", (bytes(16), bytes(16)))


def read_meta(conn: sqlite3.Connection) -> tuple[ChainPoint, ChainPoint, int]:
    """(head, base, stored_bytes); base is the point before the oldest op kept in the log."""
    (he, hs, hc, be, bs, bc, stored), = conn.execute(
        "SELECT head_epoch, head_seq, head_checksum, base_epoch, base_seq, base_checksum, stored_bytes FROM meta")
    return ChainPoint(he, hs, hc), ChainPoint(be, bs, bc), stored


_RUN_TYPES = (o.MessageStored, o.MessageQueued)  # what `apply_many` applies in bulk
_IN_CHUNK = 500  # ids in one "IN (...)" (SQLite allows 32766 parameters)
_NO_IDS = encode_uints(())  # the subscription-id column of most queue rows, made once


def _marks(n: int) -> str:
    return ",".join("?" * n)


_ROWS_PER_INSERT = 2048  # rows per multi-row INSERT at most: a power of two (see insert_rows); 8 columns x 2048
# = 16,384 parameters, within the 32,766 of SQLite's default build


@functools.lru_cache(maxsize=64)
def _insert_sql(head: str, width: int, rows: int) -> str:
    return f"{head} VALUES " + ",".join([f"({_marks(width)})"] * rows)


def insert_rows(conn: sqlite3.Connection, head: str, rows, width: int) -> None:
    """`conn.executemany(f"{head} VALUES (?, ...)", rows)` (rows of `width` values), with the same outcome, as
    multi-row INSERTs of up to _ROWS_PER_INSERT rows.

    Why: executemany runs one sqlite3_step per row and gives the GIL up around each. While another thread of
    the process runs Python (the standby's event loop decoding the next batch of a catch-up), taking it back
    waits out that thread's switch interval (5 ms), row after row: `bench/sqlite_steps.py` inserts queued
    messages 21-48x faster this way beside a busy Python thread, 0.9-1.2x alone. Chunks are powers of two, so
    each `head` prepares a handful of statements, cached by the connection."""
    n, i = len(rows), 0
    while i < n:
        k = _ROWS_PER_INSERT
        while k > n - i:
            k >>= 1
        conn.execute(_insert_sql(head, width, k), [v for row in rows[i:i + k] for v in row])
        i += k


class SqlApplier:
    """Applies ops to the open transaction of `conn` by the rules of state.py."""

    def __init__(self, conn: sqlite3.Connection, max_message_ids: int) -> None:
        self.conn = conn
        self.max_message_ids = max_message_ids
        self.ignored = 0
        conn.execute(OWNERS_TABLE)
        self.reload()
        # Only the ops the old layout knew: it never held one added after it (MessageRouted).
        self._handlers = {cls: getattr(self, "_" + cls.__name__) for cls in o.OP_TYPES.values()
                          if hasattr(self, "_" + cls.__name__)}

    def reload(self) -> None:
        """Re-read the in-memory helpers from the file (after a rollback)."""
        self.sessions = {cid for cid, in self.conn.execute("SELECT client_id FROM sessions")}
        (self.max_msg_id,), = self.conn.execute("SELECT coalesce(max(msg_id), -1) FROM messages")
        self._fresh: dict[int, list] = {}  # msg_id -> [refs, size, crc, body], stored in this transaction
        (self.message_id_count,), = self.conn.execute("SELECT count(*) FROM message_ids")
        _, _, self.stored_bytes = read_meta(self.conn)

    def apply(self, seq: int, op: o.Op, body: bytes) -> bool:
        applied = self._handlers[type(op)](seq, op, body)
        self.ignored += not applied
        return applied

    def apply_many(self, entries: tuple[LogEntry, ...], ops: tuple[o.Op, ...]) -> None:
        """`apply` for each (entry, op) in order, with the same outcome; a run of queued messages (MessageStored and
        MessageQueued ops, what a catch-up is mostly made of) goes in with one executemany (`_apply_run`)."""
        i, n = 0, len(ops)
        while i < n:
            j = i
            while j < n and type(ops[j]) in _RUN_TYPES:
                j += 1
            if j - i < 2 or not self._apply_run(entries, ops, i, j):
                for k in range(i, j):
                    self.apply(entries[k].seq, ops[k], entries[k].body)
            if j < n:
                self.apply(entries[j].seq, ops[j], entries[j].body)
                j += 1
            i = j

    def _apply_run(self, entries: tuple[LogEntry, ...], ops: tuple[o.Op, ...], i: int, j: int) -> bool:
        """ops[i:j] (MessageStored/MessageQueued only) in bulk, or False with nothing changed. Taken only when the
        per-op rules would apply every one of them: each stored msg_id new (above every id held, rising) and each
        queue entry for a live session and a message stored earlier in the run; a queue row the table already
        has (UNIQUE) makes the INSERT fail, the savepoint undoes it and the caller applies the run op by op."""
        stored: dict[int, list] = {}
        rows = []
        top, sessions, added = self.max_msg_id, self.sessions, 0
        for k in range(i, j):
            op = ops[k]
            if type(op) is o.MessageStored:
                msg_id = op.msg_id
                if msg_id <= top or msg_id in self._fresh:
                    return False
                body = entries[k].body
                size = stored_size(body)
                stored[msg_id] = [0, size, zlib.crc32(body), body]
                top, added = msg_id, added + size
            else:
                held = stored.get(op.msg_id)
                if held is None or op.client_id not in sessions:
                    return False
                held[0] += 1
                rows.append((entries[k].seq, op.client_id, op.msg_id, op.qos, op.retain,
                             encode_uints(op.subscription_ids), 0, 0))
        self.conn.execute("SAVEPOINT apply_run")
        try:
            insert_rows(self.conn, "INSERT INTO queue (seq, client_id, msg_id, qos, retain, subscription_ids, "
                        "packet_id, pubrec)", rows, 8)
        except sqlite3.IntegrityError:
            self.conn.execute("ROLLBACK TO apply_run")
            self.conn.execute("RELEASE apply_run")
            return False
        self.conn.execute("RELEASE apply_run")
        self._fresh.update(stored)
        self.max_msg_id, self.stored_bytes = top, self.stored_bytes + added
        return True

    def write_fresh_bodies(self) -> None:
        """Write the bodies stored in this transaction (with their final reference counts)."""
        if self._fresh:
            insert_rows(self.conn, "INSERT INTO messages (msg_id, refs, size, crc, body)",
                        [(msg_id, *row) for msg_id, row in self._fresh.items()], 5)
            self._fresh.clear()

    def finish(self, entries: list[LogEntry], new_base: LogEntry | None = None) -> None:
        """Write the fresh bodies, append the entries to the op log and move the head, in the same transaction.

        `new_base`: one of `entries`, a bulk catch-up's last op that the log need not hold (writer.py's rules):
        the entries up to it are not logged, the log's older rows go and its base moves to it."""
        self.write_fresh_bodies()
        last = entries[-1]
        if new_base is not None:
            entries = [e for e in entries if e.seq > new_base.seq]
            self.conn.execute("DELETE FROM oplog WHERE seq <= ?", (new_base.seq,))
            self.conn.execute("UPDATE meta SET base_epoch = ?, base_seq = ?, base_checksum = ?",
                              (new_base.epoch, new_base.seq, new_base.checksum))
        insert_rows(self.conn, "INSERT INTO oplog (epoch, seq, checksum, body)", entries, 4)
        self.conn.execute("UPDATE meta SET head_epoch = ?, head_seq = ?, head_checksum = ?, stored_bytes = ?",
                          (last.epoch, last.seq, last.checksum, self.stored_bytes))

    def truncate_log(self, keep_after: int) -> int:
        """Drop ops with seq <= keep_after (their effect lives on in the state); returns how many."""
        row = self.conn.execute("SELECT epoch, checksum FROM oplog WHERE seq = ?", (keep_after,)).fetchone()
        if row is None:
            return 0
        dropped = self.conn.execute("DELETE FROM oplog WHERE seq <= ?", (keep_after,)).rowcount
        self.conn.execute("UPDATE meta SET base_epoch = ?, base_seq = ?, base_checksum = ?",
                          (row[0], keep_after, row[1]))
        return dropped

    # References to bodies.

    def _take(self, msg_id: int) -> bool:
        fresh = self._fresh.get(msg_id)
        if fresh is not None:
            fresh[0] += 1
            return True
        return self.conn.execute("UPDATE messages SET refs = refs + 1 WHERE msg_id = ?", (msg_id,)).rowcount == 1

    def _release(self, msg_id: int) -> None:
        fresh = self._fresh.get(msg_id)
        if fresh is not None:
            fresh[0] -= 1
            if fresh[0] == 0:
                del self._fresh[msg_id]
                self.stored_bytes -= fresh[1]
            return
        gone = self.conn.execute("DELETE FROM messages WHERE msg_id = ? AND refs = 1 RETURNING size",
                                 (msg_id,)).fetchall()
        if gone:
            self.stored_bytes -= gone[0][0]
        else:
            self.conn.execute("UPDATE messages SET refs = refs - 1 WHERE msg_id = ?", (msg_id,))

    # One handler per op type: (seq, op, encoded op) -> applied?

    def _MessageStored(self, seq: int, op: o.MessageStored, body: bytes) -> bool:
        msg_id = op.msg_id
        if msg_id in self._fresh or msg_id <= self.max_msg_id and self.conn.execute(
                "SELECT 1 FROM messages WHERE msg_id = ?", (msg_id,)).fetchall():
            return False
        size = stored_size(body)
        self._fresh[msg_id] = [0, size, zlib.crc32(body), body]
        self.max_msg_id = max(self.max_msg_id, msg_id)
        self.stored_bytes += size
        return True

    def _MessageQueued(self, seq: int, op: o.MessageQueued, body: bytes) -> bool:
        if op.client_id not in self.sessions:
            return False
        ids = op.subscription_ids
        row = (seq, op.client_id, op.msg_id, op.qos, op.retain, encode_uints(ids) if ids else _NO_IDS)
        if self.conn.execute("INSERT OR IGNORE INTO queue (seq, client_id, msg_id, qos, retain, subscription_ids, "
                             "packet_id, pubrec) VALUES (?, ?, ?, ?, ?, ?, 0, 0)", row).rowcount == 0:
            return False
        if not self._take(op.msg_id):
            self.conn.execute("DELETE FROM queue WHERE seq = ?", (seq,))
            return False
        return True

    def _MessageInflight(self, seq: int, op: o.MessageInflight, body: bytes) -> bool:
        return self.conn.execute("UPDATE queue SET packet_id = ? WHERE client_id = ? AND msg_id = ? AND pubrec = 0",
                                 (op.packet_id, op.client_id, op.msg_id)).rowcount == 1

    def _MessagePubrecReceived(self, seq: int, op: o.MessagePubrecReceived, body: bytes) -> bool:
        if self.conn.execute("UPDATE queue SET pubrec = 1 WHERE client_id = ? AND msg_id = ? AND pubrec = 0",
                             (op.client_id, op.msg_id)).rowcount == 0:
            return False
        self._release(op.msg_id)
        return True

    def _remove_entry(self, client_id: str, msg_id: int) -> bool:
        gone = self.conn.execute("DELETE FROM queue WHERE client_id = ? AND msg_id = ? RETURNING pubrec",
                                 (client_id, msg_id)).fetchall()
        if not gone:
            return False
        if not gone[0][0]:
            self._release(msg_id)
        return True

    def _MessageAcked(self, seq: int, op: o.MessageAcked, body: bytes) -> bool:
        return self._remove_entry(op.client_id, op.msg_id)

    def _MessageDropped(self, seq: int, op: o.MessageDropped, body: bytes) -> bool:
        return self._remove_entry(op.client_id, op.msg_id)

    def _MessagesInflight(self, seq: int, op: o.MessagesInflight, body: bytes) -> bool:
        cur = self.conn.executemany(
            "UPDATE queue SET packet_id = ? WHERE client_id = ? AND msg_id = ? AND pubrec = 0",
            [(p, op.client_id, m) for m, p in zip(op.msg_ids, op.packet_ids)])
        return cur.rowcount == len(op.msg_ids)

    def _MessagesAcked(self, seq: int, op: o.MessagesAcked, body: bytes) -> bool:
        # A few statements per op, not two per message: the queue rows in one DELETE, the bodies in another.
        ids = op.msg_ids
        removed = 0
        for at in range(0, len(ids), _IN_CHUNK):
            chunk = ids[at:at + _IN_CHUNK]
            gone = self.conn.execute(f"DELETE FROM queue WHERE client_id = ? AND msg_id IN ({_marks(len(chunk))}) "
                                     "RETURNING msg_id, pubrec", (op.client_id, *chunk)).fetchall()
            removed += len(gone)
            self._release_many([msg_id for msg_id, pubrec in gone if not pubrec])
        return removed == len(ids)

    def _release_many(self, msg_ids: list[int]) -> None:
        """`_release` for each, with one DELETE (and one executemany UPDATE) for those not fresh."""
        stored = []
        for msg_id in msg_ids:
            if msg_id in self._fresh:
                self._release(msg_id)
            else:
                stored.append(msg_id)
        if not stored:
            return
        gone = self.conn.execute(f"DELETE FROM messages WHERE refs = 1 AND msg_id IN ({_marks(len(stored))}) "
                                 "RETURNING msg_id, size", stored).fetchall()
        self.stored_bytes -= sum(size for _, size in gone)
        left = set(stored).difference(msg_id for msg_id, _ in gone)
        if left:
            self.conn.executemany("UPDATE messages SET refs = refs - 1 WHERE msg_id = ?", [(m,) for m in left])

    def _SessionOpened(self, seq: int, op: o.SessionOpened, body: bytes) -> bool:
        self.conn.execute(
            "INSERT INTO sessions (client_id, protocol_version, expiry_s, connected_at_ms, disconnected_at_ms, "
            "connected) VALUES (?, ?, ?, ?, 0, 1) ON CONFLICT (client_id) DO UPDATE SET "
            "protocol_version = excluded.protocol_version, expiry_s = excluded.expiry_s, "
            "connected_at_ms = excluded.connected_at_ms, disconnected_at_ms = 0, connected = 1",
            (op.client_id, op.protocol_version, op.expiry_s, op.connected_at_ms))
        self.sessions.add(op.client_id)
        return True

    def _SessionOwned(self, seq: int, op: o.SessionOwned, body: bytes) -> bool:
        if op.client_id not in self.sessions:
            return False
        self.conn.execute("INSERT INTO session_owners (client_id, owner) VALUES (?, ?) ON CONFLICT (client_id) "
                          "DO UPDATE SET owner = excluded.owner", (op.client_id, op.owner))
        return True

    def _SessionDisconnected(self, seq: int, op: o.SessionDisconnected, body: bytes) -> bool:
        return self.conn.execute(
            "UPDATE sessions SET disconnected_at_ms = ?, expiry_s = ?, connected = 0 WHERE client_id = ?",
            (op.disconnected_at_ms, op.expiry_s, op.client_id)).rowcount == 1

    def _SessionDeleted(self, seq: int, op: o.SessionDeleted, body: bytes) -> bool:
        if op.client_id not in self.sessions:
            return False
        ex, key = self.conn.execute, (op.client_id,)
        for msg_id, pubrec in ex("DELETE FROM queue WHERE client_id = ? RETURNING msg_id, pubrec", key).fetchall():
            if not pubrec:
                self._release(msg_id)
        for msg_id, in ex("DELETE FROM wills WHERE client_id = ? RETURNING msg_id", key).fetchall():
            self._release(msg_id)
        ex("DELETE FROM subscriptions WHERE client_id = ?", key)
        ex("DELETE FROM inbound_qos2 WHERE client_id = ?", key)
        ex("DELETE FROM sessions WHERE client_id = ?", key)
        ex("DELETE FROM session_owners WHERE client_id = ?", key)
        self.sessions.discard(op.client_id)
        return True

    def _Subscribed(self, seq: int, op: o.Subscribed, body: bytes) -> bool:
        if op.client_id not in self.sessions:
            return False
        self.conn.execute("INSERT OR REPLACE INTO subscriptions (client_id, topic_filter, qos, no_local, "
                          "retain_as_published, retain_handling, subscription_id) VALUES (?, ?, ?, ?, ?, ?, ?)",
                          (op.client_id, op.topic_filter, op.qos, op.no_local, op.retain_as_published,
                           op.retain_handling, op.subscription_id))
        return True

    def _Unsubscribed(self, seq: int, op: o.Unsubscribed, body: bytes) -> bool:
        return self.conn.execute("DELETE FROM subscriptions WHERE client_id = ? AND topic_filter = ?",
                                 (op.client_id, op.topic_filter)).rowcount == 1

    def _RetainedSet(self, seq: int, op: o.RetainedSet, body: bytes) -> bool:
        if not self._take(op.msg_id):
            return False
        old = self.conn.execute("SELECT msg_id FROM retained WHERE topic = ?", (op.topic,)).fetchall()
        self.conn.execute("INSERT OR REPLACE INTO retained (topic, msg_id) VALUES (?, ?)", (op.topic, op.msg_id))
        if old:
            self._release(old[0][0])
        return True

    def _RetainedCleared(self, seq: int, op: o.RetainedCleared, body: bytes) -> bool:
        gone = self.conn.execute("DELETE FROM retained WHERE topic = ? RETURNING msg_id", (op.topic,)).fetchall()
        if gone:
            self._release(gone[0][0])
        return bool(gone)

    def _InboundQos2Received(self, seq: int, op: o.InboundQos2Received, body: bytes) -> bool:
        return op.client_id in self.sessions and self.conn.execute(
            "INSERT OR IGNORE INTO inbound_qos2 (client_id, packet_id) VALUES (?, ?)",
            (op.client_id, op.packet_id)).rowcount == 1

    def _InboundQos2Released(self, seq: int, op: o.InboundQos2Released, body: bytes) -> bool:
        return self.conn.execute("DELETE FROM inbound_qos2 WHERE client_id = ? AND packet_id = ?",
                                 (op.client_id, op.packet_id)).rowcount == 1

    def _WillSet(self, seq: int, op: o.WillSet, body: bytes) -> bool:
        if op.client_id not in self.sessions or not self._take(op.msg_id):
            return False
        old = self.conn.execute("SELECT msg_id FROM wills WHERE client_id = ?", (op.client_id,)).fetchall()
        self.conn.execute("INSERT OR REPLACE INTO wills (client_id, msg_id, delay_s) VALUES (?, ?, ?)",
                          (op.client_id, op.msg_id, op.delay_s))
        if old:
            self._release(old[0][0])
        return True

    def _WillCleared(self, seq: int, op: o.WillCleared, body: bytes) -> bool:
        gone = self.conn.execute("DELETE FROM wills WHERE client_id = ? RETURNING msg_id", (op.client_id,)).fetchall()
        if gone:
            self._release(gone[0][0])
        return bool(gone)

    def _MessageIdSeen(self, seq: int, op: o.MessageIdSeen, body: bytes) -> bool:
        if self.conn.execute("UPDATE message_ids SET seq = ?, seen_at_ms = ? WHERE client_id = ? AND message_id = ?",
                             (seq, op.seen_at_ms, op.client_id, op.message_id)).rowcount == 1:
            return True
        self.conn.execute("INSERT INTO message_ids (seq, client_id, message_id, seen_at_ms) VALUES (?, ?, ?, ?)",
                          (seq, op.client_id, op.message_id, op.seen_at_ms))
        self.message_id_count += 1
        if self.message_id_count > self.max_message_ids:
            self.conn.execute("DELETE FROM message_ids WHERE seq = (SELECT min(seq) FROM message_ids)")
            self.message_id_count -= 1
        return True

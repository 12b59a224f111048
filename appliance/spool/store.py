"""The durable spool on disk: one SQLite file, `spool.db`, in WAL mode (DESIGN §4).

Rules:
- The file holds the materialized state (state.py's rules, as SQL in sql.py)
  and the op log that produced it; each group commit changes both in one
  transaction, so they never disagree on disk.
- Opening refuses a spool it cannot trust, with `SpoolCorruption` naming the
  file and the fault: not a database or damaged pages (`PRAGMA quick_check`),
  a foreign file or another schema version, an op log whose chain breaks
  (a changed byte, a missing or extra op) or that disagrees with the recorded
  head; and `load_state` refuses state rows that fail load.py's checks.
- A new spool appears atomically (built as `spool.db.new`, fsynced, renamed),
  so an existing `spool.db` that is empty or has no schema is corruption, not
  "start afresh". A `spool.db-wal` without its `spool.db` is refused too.
- One process at a time: `spool.lock` is held (flock) while a `Spool` is open.
- Threads: the read connection is shared under `_read_lock`, and `close` runs under that lock too,
  so it never closes the connection under a read still running in a worker thread (SQLite would be
  handed freed memory: SIGSEGV), and two closes from two threads close once. The writer's connection
  is its thread's alone; `close` joins that thread (which closes it) before the read connection.
- The log keeps at least the last `keep_ops` ops for the mate link's
  incremental resync; older ops are dropped by the writer (`base` moves up).
- `vouch(path)`: a file this process just opened, verified and closed (a received spool image,
  spool/image.py) is not checked page by page a second time when it is opened again under its new
  name (same device, inode, size and modification time; once). The cheap checks still run. Otherwise a
  GB image would be `quick_check`ed and its log's chain walked twice in a row.
- `Spool.open(check_pages=False)` skips the deep checks, `quick_check` and the log's
  chain walk (seconds for a GB file), for a received spool image only: the active ran both on the very image
  it sent, while sending (spool/image.py), and the image's SHA-256 proves the standby holds those bytes. The
  cheap checks (schema, journal mode, meta) still run, and the receiver checks the head it was announced.
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
import threading
from pathlib import Path

from .chain import ChainPoint, LogEntry, verify_chain
from .errors import ChainError, OpCodecError, SpoolLocked
from .load import Corrupt, load_state
from .sql import APPLICATION_ID, SCHEMA_VERSION, TABLES, create, read_meta
from .state import SpoolState
from ..errors import SpoolCorruption
from ..private_files import private_database, private_dir

FILE_NAME = "spool.db"
WAL_SIZE_LIMIT = 64 << 20
LOCK_NAME = "spool.lock"
_VERIFY_PAGE_OPS = 10_000
# What reading a damaged file raises: SQLite's errors, and a UnicodeDecodeError when SQLite's own message quotes
# damaged schema text that Python cannot decode.
_UNREADABLE = (sqlite3.DatabaseError, UnicodeDecodeError)


def _why(exc: Exception) -> str:
    return "undecodable text" if isinstance(exc, UnicodeDecodeError) else str(exc)


def connect(path: Path) -> sqlite3.Connection:
    """A connection with the spool's settings: explicit transactions, durable commits in WAL mode."""
    private_database(path)  # its -wal (message payloads) takes this file's 0600
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, cached_statements=256)
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute(f"PRAGMA journal_size_limit={WAL_SIZE_LIMIT}")  # the WAL shrinks back after a checkpoint
    return conn


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Spool:
    """An open, verified spool file. Reading only: the one writer is `SpoolWriter`."""

    def __init__(self, path: Path, conn: sqlite3.Connection, lock_fd: int, head: ChainPoint, base: ChainPoint) -> None:
        self.path = path
        self._conn = conn
        self._lock_fd = lock_fd
        self.head = head  # as of opening; the writer's `durable` moves on from here
        self.base = base
        self.writer = None  # the one SpoolWriter, which registers itself
        self._read_lock = threading.Lock()  # one read connection, shared by the threads that read

    @classmethod
    def open(cls, directory: Path | str, *, check_pages: bool = True) -> Spool:
        """Open (or create) `directory/spool.db` and verify it; `SpoolCorruption` if it cannot be trusted.

        `check_pages=False` leaves out `quick_check` and the log's chain walk (see the rules: a received image the
        active checked, proven the same bytes by its SHA-256); the cheap checks run."""
        directory = private_dir(Path(directory))
        path = directory / FILE_NAME
        lock_fd = os.open(directory / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(lock_fd)
            raise SpoolLocked(f"spool {path}: another process has it open") from None
        try:
            if not path.exists():
                if Path(f"{path}-wal").exists():
                    raise SpoolCorruption(f"spool {path}: the file is missing but its write-ahead log {path}-wal "
                                          "exists (a new spool would lose that data); refusing to serve from a "
                                          "corrupt spool")
                _create(path)
            conn = _open_verified(path, check_pages)
            head, base, _ = read_meta(conn)
        except BaseException:
            os.close(lock_fd)
            raise
        return cls(path, conn, lock_fd, head, base)

    def close(self) -> None:
        """Close the writer (committing what it holds) and the file, then let another process have it."""
        with self._read_lock:  # a reader in a worker thread finishes first; a second close waits, then returns
            if self._lock_fd < 0:
                return
            if self.writer is not None:
                self.writer.close()  # joins the writer thread, which closes its own connection
            self._conn.close()
            os.close(self._lock_fd)
            self._lock_fd = -1

    def __enter__(self) -> Spool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def corrupt(self, what: str) -> SpoolCorruption:
        return SpoolCorruption(f"spool {self.path}: {what}; refusing to serve from a corrupt spool")

    def load_state(self, *, raw_bodies: bool = False) -> SpoolState:
        """Everything in the file, in memory, for the broker to rebuild from (`raw_bodies`: see load.py)."""
        try:
            with self._read_lock, _read_transaction(self._conn):
                return load_state(self._conn, raw_bodies=raw_bodies)
        except _UNREADABLE as exc:
            raise self.corrupt(f"unreadable ({_why(exc)})") from None
        except Corrupt as exc:
            raise self.corrupt(str(exc)) from None
        except (OpCodecError, TypeError, ValueError) as exc:
            raise self.corrupt(f"unexpected contents ({exc})") from None

    def log_point(self, seq: int) -> ChainPoint | None:
        """The log's point at op `seq` (the base's for seq == base), or None if the log no longer holds it.

        What the mate link's resync decision compares a joining standby's head with.
        """
        with self._read_lock, _read_transaction(self._conn):
            _, base, _ = read_meta(self._conn)
            if seq == base.seq:
                return base
            row = self._conn.execute("SELECT epoch, seq, checksum FROM oplog WHERE seq = ?", (seq,)).fetchone()
        return None if row is None else ChainPoint(*row)

    def log_base(self) -> ChainPoint:
        """The point the log starts after (it moves on as old ops are dropped)."""
        with self._read_lock, _read_transaction(self._conn):
            return read_meta(self._conn)[1]

    def log_bytes(self, after_seq: int) -> int:
        """The op bodies' bytes after `after_seq` (an incremental resync's size, for its progress)."""
        with self._read_lock, _read_transaction(self._conn):
            (n,), = self._conn.execute("SELECT total(length(body)) FROM oplog WHERE seq > ?", (after_seq,))
        return int(n)

    def read_entries(self, after_seq: int, max_ops: int) -> list[LogEntry]:
        """Up to `max_ops` committed ops with seq > after_seq, in order (for the mate link's resync).

        It reads the file: call it off the event loop (an executor) when `max_ops` is large.

        Raises `LookupError` if ops after `after_seq` were already dropped from the log (send a snapshot).
        """
        assert max_ops > 0
        with self._read_lock, _read_transaction(self._conn):
            _, base, _ = read_meta(self._conn)
            if after_seq < base.seq:
                raise LookupError(f"ops {after_seq + 1}..{base.seq} are no longer in the log (it starts at "
                                  f"{base.seq + 1})")
            rows = self._conn.execute("SELECT epoch, seq, checksum, body FROM oplog WHERE seq > ? ORDER BY seq "
                                      "LIMIT ?", (after_seq, max_ops)).fetchall()
        return [LogEntry(*row) for row in rows]


class _read_transaction:
    """One consistent snapshot for several SELECTs (the writer may commit meanwhile); inside a transaction the
    caller holds already, that one (spool/image.py checks the live spool within its own)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self._ours = False

    def __enter__(self) -> None:
        self._ours = not self.conn.in_transaction
        if self._ours:
            self.conn.execute("BEGIN")

    def __exit__(self, *exc: object) -> None:
        if self._ours:
            self.conn.execute("ROLLBACK")


def _create(path: Path) -> None:
    new = path.with_name(path.name + ".new")
    for stale in (new, Path(f"{new}-wal"), Path(f"{new}-shm")):
        stale.unlink(missing_ok=True)
    conn = connect(new)
    try:
        create(conn)
    finally:
        conn.close()  # the last connection checkpoints and removes the WAL
    fd = os.open(new, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(new, path)
    _fsync_dir(path.parent)


_vouched: set[tuple[int, int, int, int]] = set()


def _identity(path: Path) -> tuple[int, int, int, int]:
    st = path.stat()
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def vouch(path: Path) -> None:
    """`path` (closed, not written since) passed `Spool.open`'s checks in this process: see the rules."""
    _vouched.add(_identity(Path(path)))


def _open_verified(path: Path, check_pages: bool = True) -> sqlite3.Connection:
    def refuse(what: str) -> SpoolCorruption:
        return SpoolCorruption(f"spool {path}: {what}; refusing to serve from a corrupt spool")

    if path.stat().st_size == 0:
        raise refuse("the file is empty (a spool is never created empty: it was truncated)")
    try:
        conn = connect(path)
    except _UNREADABLE as exc:
        raise refuse(f"cannot be opened ({_why(exc)})") from None
    deep = _identity(path) not in _vouched and check_pages
    _vouched.discard(_identity(path))
    try:
        _verify(conn, refuse, deep)
    except _UNREADABLE as exc:
        conn.close()
        raise refuse(f"not a readable SQLite database ({_why(exc)})") from None
    except BaseException:
        conn.close()
        raise
    return conn


def page_problems(conn: sqlite3.Connection) -> list[str]:
    """What `PRAGMA quick_check` finds wrong with the file's pages (empty: none)."""
    problems = [row[0] for row in conn.execute("PRAGMA quick_check(5)")]
    return [] if problems == ["ok"] else problems


def _verify(conn: sqlite3.Connection, refuse, deep: bool = True) -> None:
    if deep and (problems := page_problems(conn)):
        raise refuse("damaged database pages (" + "; ".join(problems) + ")")
    (app_id,), = conn.execute("PRAGMA application_id")
    (version,), = conn.execute("PRAGMA user_version")
    if app_id != APPLICATION_ID:
        raise refuse(f"not a PairMQ spool (application id {app_id:#x})")
    if version != SCHEMA_VERSION:
        raise refuse(f"schema version {version}, but this build reads version {SCHEMA_VERSION}")
    tables = {name for name, in conn.execute("SELECT name FROM sqlite_schema WHERE type = 'table'")}
    if missing := [t for t in TABLES if t not in tables]:
        raise refuse(f"tables missing: {', '.join(missing)}")
    (journal,), = conn.execute("PRAGMA journal_mode")
    if journal != "wal":
        raise refuse(f"journal mode is {journal}, not wal")
    (meta_rows,), = conn.execute("SELECT count(*) FROM meta")
    if meta_rows != 1:
        raise refuse(f"{meta_rows} rows in its meta table (one expected)")
    if not deep:
        return
    if problem := log_problem(conn):
        raise refuse(problem)


def log_problem(conn: sqlite3.Connection) -> str | None:
    """What is wrong with the op log of the spool on `conn` (its chain from the base, op by op, to the recorded
    head), or None."""
    with _read_transaction(conn):
        head, base, _ = read_meta(conn)
        point = base
        try:
            while True:  # page through the log so memory stays bounded however long it is
                rows = conn.execute("SELECT epoch, seq, checksum, body FROM oplog WHERE seq > ? ORDER BY seq LIMIT ?",
                                    (point.seq, _VERIFY_PAGE_OPS)).fetchall()
                if not rows:
                    break
                point = verify_chain((LogEntry(*row) for row in rows), point)
        except ChainError as exc:
            return str(exc)
        except TypeError:  # a column of the wrong type (STRICT tables make this unlikely)
            return f"op {point.seq + 1} has a malformed row"
        (below,), = conn.execute("SELECT count(*) FROM oplog WHERE seq <= ?", (base.seq,))
        if below:
            return f"{below} ops at or before the log's base {base.seq}"
    if point != head:
        if point.seq < head.seq:
            return (f"the op log ends at op {point.seq} but the spool's head is op {head.seq} "
                    f"(op {point.seq + 1} is missing)")
        return f"the op log's last op {point.seq} does not match the recorded head (op {head.seq})"
    return None

"""The versioned configuration store: one SQLite file per routing node (`<data_dir>/config/config.db`).

Rules:
- The store holds the current document, its version and digest, and the history of the changes
  that made it: version n's change with chain(n) (configsync/changes.py). Versions go up by one per
  change, never skip, and are never reused within one history.
- Every write is one transaction (WAL, synchronous=FULL): a change, its history row and the new
  head together or not at all. A change is validated against the current document before it is
  written; a bad one leaves the store untouched.
- The history is bounded (`max_history` changes); a node further behind than that catches up by
  snapshot. A snapshot replaces document and head and starts a new history at its version.
- The schema is sqlite-utils' (`MIGRATIONS`, applied in order at open and recorded in the file):
  a store made before the migrations were recorded already holds the first one's tables, which it
  creates only if missing, so every store on disk opens. A later schema change is a new migration
  appended to the set, never an edit of an applied one.
- At open the store checks itself: the head's digest must be the document's, and the history must
  chain up to the head. A store that fails is `ConfigStoreCorrupt`, with the file named and what to
  do: the node refuses to start rather than serve a configuration it cannot trust.
"""

from __future__ import annotations

import json
import sqlite3
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from pairmq.appliance.errors import PairMQError
from pairmq.appliance.private_files import private_database, private_dir

from .changes import GENESIS, Entry, Head, apply_change, chain, parse_change
from .document import ConfigChangeError, ConfigDocument, canonical


def _import_sqlite_utils() -> ModuleType:
    """sqlite_utils without pandas and numpy when nothing has imported them yet: it imports them only to map their
    types, which the store never hands it, and on a host with the analytics extra they would cost every node
    start more than the rest of its imports."""
    hidden = [name for name in ("pandas", "numpy") if name not in sys.modules]
    sys.modules.update(dict.fromkeys(hidden, None))
    try:
        import sqlite_utils
    finally:
        for name in hidden:
            del sys.modules[name]
    return sqlite_utils


sqlite_utils = _import_sqlite_utils()

STORE_FILE = Path("config") / "config.db"
MAX_HISTORY = 10_000

# The schema, in order; applied at open and recorded in the file (`_sqlite_migrations`).
MIGRATIONS = sqlite_utils.Migrations("pairmq-config-store")


@MIGRATIONS(name="tables")
def _tables(db: sqlite_utils.Database) -> None:
    # if_not_exists: stores made before migrations were recorded hold these tables already, made by this code.
    db["changes"].create({"version": int, "change": str, "chain": str, "at_ms": int}, pk="version",
                         not_null={"change", "chain", "at_ms"}, if_not_exists=True)
    db["head"].create({"id": int, "version": int, "chain": str, "digest": str, "document": str}, pk="id",
                      not_null={"version", "chain", "digest", "document"}, if_not_exists=True)


class ConfigStoreCorrupt(PairMQError):
    """The configuration store failed its integrity check at open."""


def store_path(data_dir: Path) -> Path:
    return Path(data_dir) / STORE_FILE


class ConfigStore:
    def __init__(self, path: Path, *, max_history: int = MAX_HISTORY) -> None:
        self.path = Path(path)
        self.max_history = max_history
        in_memory = str(path) == ":memory:"  # a test's store: no file, and no directory to narrow
        if not in_memory:
            private_dir(self.path.parent)
        try:
            if not in_memory:
                private_database(self.path)  # users' password records; its -wal and -shm take this file's mode
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            self.db = sqlite_utils.Database(conn, execute_plugins=False)  # no plugins run inside a node
            MIGRATIONS.apply(self.db)
            if self.db["head"].count == 0:
                empty = ConfigDocument()
                with self.db.atomic():
                    self._write_head(Head(0, GENESIS, empty.digest()), empty)
            self.head, self.document = self._load()
        except sqlite3.DatabaseError as exc:
            raise ConfigStoreCorrupt(f"configuration store {self.path} cannot be read ({exc}); "
                                     f"move it aside and let the node take its mate's configuration") from None

    def close(self) -> None:
        self.db.close()

    # --- writing ---

    def apply(self, change: dict, at_ms: int) -> Entry:
        """Validate `change` against the current document, then commit it as the next version."""
        parse_change(change)
        document = apply_change(self.document, change)
        entry = Entry(self.head.version + 1, change, chain(self.head.chain, change), at_ms)
        self._commit([entry], document)
        return entry

    def apply_entries(self, entries: Sequence[Entry]) -> None:
        """A mate's changes, all or none: each must follow the head and chain to it."""
        head, document = self.head, self.document
        for entry in entries:
            where = f"change {entry.version}"
            if entry.version != head.version + 1:
                raise ConfigChangeError(f"{where}: expected version {head.version + 1}")
            parse_change(entry.change, where)
            if chain(head.chain, entry.change) != entry.chain:
                raise ConfigChangeError(f"{where}: its chain does not follow version {head.version}'s")
            document = apply_change(document, entry.change, where)
            head = Head(entry.version, entry.chain, "")
        if entries:
            self._commit(entries, document)

    def install(self, version: int, chain_value: str, document: ConfigDocument) -> None:
        """Replace document, head and history by a snapshot (the caller reports what it discards)."""
        head = Head(version, chain_value, document.digest())
        with self.db.atomic():
            self.db["changes"].delete_where()
            self._write_head(head, document)
        self.head, self.document = head, document

    # --- reading ---

    def chain_at(self, version: int) -> str | None:
        if version == self.head.version:
            return self.head.chain
        if version == 0 and (self._oldest_version() == 1 or self.head.version == 0):
            return GENESIS
        row = next(self.db["changes"].rows_where("version = ?", [version], select="chain"), None)
        return row["chain"] if row else None

    def changes_after(self, version: int, limit: int | None = None) -> list[Entry] | None:
        """Every change after `version` in order, or None when the history no longer reaches back there."""
        if version >= self.head.version:
            return []
        oldest = self._oldest_version()
        if oldest is None or oldest > version + 1:
            return None
        return self._entries("version > ?", [version], "version", limit)

    def recent_chains(self, count: int) -> list[tuple[int, str]]:
        """(version, chain) of our newest `count` versions, newest first, for a rejoin."""
        rows = self.db["changes"].rows_where(select="version, chain", order_by="version desc", limit=count)
        points = [(self.head.version, self.head.chain)] + [(r["version"], r["chain"]) for r in rows
                                                           if r["version"] != self.head.version]
        if len(points) < count and self.head.version != 0 and self.chain_at(0) == GENESIS:
            points.append((0, GENESIS))
        return points[:count]

    def history(self, limit: int = 50) -> list[Entry]:
        return self._entries(None, [], "version desc", limit)

    # --- internals ---

    def _load(self) -> tuple[Head, ConfigDocument]:
        head = self.db["head"].get(1)
        version, chain_value, digest, text = head["version"], head["chain"], head["digest"], head["document"]
        where = f"configuration store {self.path}"
        try:
            document = ConfigDocument.from_json(json.loads(text))
        except (ValueError, ConfigChangeError) as exc:
            raise ConfigStoreCorrupt(f"{where}: the document does not parse ({exc}); move the file aside and "
                                     f"let the node take its mate's configuration") from None
        if document.digest() != digest:
            raise ConfigStoreCorrupt(f"{where}: the document's digest does not match the one recorded "
                                     f"(the file was altered or damaged); move it aside and let the node take "
                                     f"its mate's configuration")
        self._check_history(version, chain_value, where)
        return Head(version, chain_value, digest), document

    def _check_history(self, version: int, head_chain: str, where: str) -> None:
        rows = self.db["changes"].rows_where(select="version, change, chain", order_by="version")
        previous = None
        for v, text, ch in ((row["version"], row["change"], row["chain"]) for row in rows):
            try:
                change = json.loads(text)
            except ValueError:
                raise ConfigStoreCorrupt(f"{where}: change {v} does not parse") from None
            if previous is not None and (v != previous[0] + 1 or chain(previous[1], change) != ch):
                raise ConfigStoreCorrupt(f"{where}: change {v} does not chain to change {previous[0]}")
            if previous is None and v == 1 and chain(GENESIS, change) != ch:
                raise ConfigStoreCorrupt(f"{where}: change 1 does not chain to the start")
            previous = (v, ch)
        if previous is not None and previous != (version, head_chain):
            raise ConfigStoreCorrupt(f"{where}: the history ends at version {previous[0]}, the head says {version}")

    def _commit(self, entries: list[Entry], document: ConfigDocument) -> None:
        last = entries[-1]
        head = Head(last.version, last.chain, document.digest())
        with self.db.atomic():
            self.db["changes"].insert_all([{"version": e.version, "change": canonical(e.change).decode(),
                                            "chain": e.chain, "at_ms": e.at_ms} for e in entries])
            self.db["changes"].delete_where("version <= ?", [last.version - self.max_history])
            self._write_head(head, document)
        self.head, self.document = head, document

    def _write_head(self, head: Head, document: ConfigDocument) -> None:
        self.db["head"].upsert({"id": 1, "version": head.version, "chain": head.chain, "digest": head.digest,
                                "document": document.canonical().decode()}, pk="id")

    def _oldest_version(self) -> int | None:
        oldest = next(self.db["changes"].rows_where(order_by="version", limit=1), None)
        return None if oldest is None else oldest["version"]

    def _entries(self, where: str | None, values: list, order_by: str, limit: int | None) -> list[Entry]:
        rows = self.db["changes"].rows_where(where, values, order_by=order_by, limit=limit or None)
        return [Entry(r["version"], json.loads(r["change"]), r["chain"], r["at_ms"]) for r in rows]


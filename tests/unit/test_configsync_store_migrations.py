"""The configuration store's schema is sqlite-utils migrations: a store written by the code before them
(config_store_before_migrations.sql: made by that code, dumped with sqlite3's iterdump) opens with its
head, document and history intact, records the migration once, and takes new changes chained to its history;
a new store gets the same tables."""

from __future__ import annotations

import contextlib
import importlib.util
import sqlite3
from pathlib import Path

import pytest

from pairmq.configsync.changes import chain
from pairmq.configsync.store import MIGRATIONS, ConfigStore

BEFORE = Path(__file__).with_name("config_store_before_migrations.sql")
# What that store's head held when it was written.
BEFORE_HEAD = (4, "e73207eabf4a11438642cc9cbb0523b6ec8872ae1d57ab69781dbf7adba62224",
               "1e25cc86c8f1e0be7db42386cc4a9462672953757243eab176eabae6b194b125")


def old_store(path: Path) -> Path:
    with contextlib.closing(sqlite3.connect(path)) as db:
        db.executescript(BEFORE.read_text())
    return path


def rows(path: Path, sql: str) -> list[tuple]:
    with contextlib.closing(sqlite3.connect(path)) as db:
        return db.execute(sql).fetchall()


def tables(path: Path) -> dict[str, list[tuple]]:
    """Each table's columns: name, type, not null, default, primary key."""
    return {name: [tuple(c[1:]) for c in rows(path, f"PRAGMA table_info([{name}])")] for name in ("changes", "head")}


def test_a_store_from_before_the_migrations_opens_whole_and_records_the_migration_once(tmp_path):
    path = old_store(tmp_path / "config.db")
    schema_before = tables(path)
    assert rows(path, "SELECT name FROM sqlite_master WHERE name = '_sqlite_migrations'") == []

    store = ConfigStore(path)
    assert (store.head.version, store.head.chain, store.head.digest) == BEFORE_HEAD
    assert set(store.document.access.users) == {"ann"} and store.document.access.allow_anonymous is False
    assert store.document.limits == {"session_queue_max_messages": 500}
    assert [e.version for e in store.history()] == [4, 3, 2, 1]
    assert [e.at_ms for e in store.changes_after(0)] == [1_700_000_000_001 + i for i in range(4)]
    store.close()
    assert tables(path) == schema_before and schema_before["head"]  # adopted, not rebuilt
    applied = rows(path, "SELECT migration_set, name FROM _sqlite_migrations")
    assert applied == [(MIGRATIONS.name, "tables")]

    again = ConfigStore(path)  # a second open applies nothing more
    change = {"kind": "anonymous.set", "allowed": True}
    entry = again.apply(change, 1_700_000_000_005)
    assert (entry.version, entry.chain) == (5, chain(BEFORE_HEAD[1], change))
    again.close()
    assert rows(path, "SELECT count(*) FROM _sqlite_migrations") == [(1,)]
    reopened = ConfigStore(path)
    assert reopened.head.version == 5 and reopened.document.access.allow_anonymous is True
    assert reopened.chain_at(4) == BEFORE_HEAD[1]
    reopened.close()


def test_a_new_store_has_the_tables_the_old_code_made(tmp_path):
    ConfigStore(tmp_path / "new.db").close()
    assert tables(tmp_path / "new.db") == tables(old_store(tmp_path / "old.db"))


def test_a_store_whose_migration_record_is_damaged_is_refused_with_one_sentence(tmp_path):
    path = old_store(tmp_path / "config.db")
    ConfigStore(path).close()
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        db.execute("DROP TABLE head")  # recorded as migrated, yet its table is gone
    from pairmq.configsync.store import ConfigStoreCorrupt

    with pytest.raises(ConfigStoreCorrupt, match="cannot be read"):
        ConfigStore(path)


def test_the_store_imports_sqlite_utils_without_pandas_or_numpy_and_leaves_them_importable():
    """sqlite-utils imports pandas and numpy when it can; a node never needs them, so the store hides them for that
    one import, and only then: a process that wants them afterwards (the analytics job) still gets them."""
    import subprocess
    import sys

    script = ("import sys, pairmq.configsync.store as store\n"
              "assert store.sqlite_utils.db.np is None and store.sqlite_utils.db.pd is None\n"
              "print(sorted(n for n in ('pandas', 'numpy') if n in sys.modules))\n"
              "import numpy, pandas\n"
              "print(pandas.DataFrame({'a': [1]}).shape)\n")
    if importlib.util.find_spec("pandas") is None:
        pytest.fail("pandas is not installed: the test extra holds it (run .ci/setup)")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["[]", "(1, 1)"]

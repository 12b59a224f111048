"""sql.insert_rows: the rows executemany would insert, in a handful of statements (not one step per row)."""

import sqlite3

import pytest

from pairmq.appliance.spool.sql import _ROWS_PER_INSERT, insert_rows


def _table() -> sqlite3.Connection:
    conn = sqlite3.connect(":memory:", isolation_level=None)
    conn.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, name TEXT NOT NULL, body BLOB) STRICT")
    return conn


@pytest.mark.parametrize("n", [0, 1, 2, 3, 255, 256, 257, 600, 2048, 2049, 5000])
def test_the_same_rows_as_executemany_in_few_statements(n):
    rows = [(i, f"c{i % 7}", bytes([i % 256]) * (i % 5) or None) for i in range(n)]
    expected = _table()
    expected.executemany("INSERT INTO t (k, name, body) VALUES (?, ?, ?)", rows)
    got = _table()
    statements = []
    got.set_trace_callback(statements.append)
    insert_rows(got, "INSERT INTO t (k, name, body)", rows, 3)
    got.set_trace_callback(None)
    assert got.execute("SELECT * FROM t ORDER BY k").fetchall() == expected.execute(
        "SELECT * FROM t ORDER BY k").fetchall()
    # Full chunks, then the rest split in powers of two: at most one statement per bit of the remainder.
    assert len(statements) <= n // _ROWS_PER_INSERT + (n % _ROWS_PER_INSERT).bit_count()


def test_a_constraint_failure_fails_the_statement_and_inserts_nothing_of_it():
    conn = _table()
    conn.execute("INSERT INTO t VALUES (5, 'x', NULL)")
    conn.execute("BEGIN")
    with pytest.raises(sqlite3.IntegrityError):
        insert_rows(conn, "INSERT INTO t (k, name, body)", [(i, "y", None) for i in range(10)], 3)
    conn.execute("COMMIT")
    assert conn.execute("SELECT k FROM t").fetchall() == [(5,)]

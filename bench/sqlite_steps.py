"""Why the spool inserts rows with multi-row INSERTs (spool/sql.py insert_rows), not executemany.

    python bench/sqlite_steps.py [--messages 200000] [--busy-messages 5000]

Inserts queued messages (a queue row and a 1 KiB body each, the spool's own schema, WAL, synchronous=FULL,
5,000 messages per transaction, like a catch-up's commits) two ways: `executemany` (one sqlite3_step per row,
the GIL given up and taken back around each) and `insert_rows`. Each way alone, then beside a thread that
runs Python all the time (as the standby's event loop does during a catch-up): there, taking the GIL back
after each step waits out that thread's switch interval. Prints msg/s and the ratio.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pairmq.appliance.spool.sql import create, insert_rows  # noqa: E402

PER_COMMIT = 5_000
QUEUE = "INSERT INTO queue (seq, client_id, msg_id, qos, retain, subscription_ids, packet_id, pubrec)"
MESSAGES = "INSERT INTO messages (msg_id, refs, size, crc, body)"


def _executemany(conn: sqlite3.Connection, head: str, rows: list, width: int) -> None:
    conn.executemany(f"{head} VALUES ({','.join('?' * width)})", rows)


def run(path: Path, messages: int, insert, busy: bool) -> float:
    """msg/s inserting `messages` queued messages into a fresh spool at `path`."""
    conn = sqlite3.connect(path, isolation_level=None)
    create(conn)
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("INSERT INTO sessions VALUES ('sub', 4, 4294967295, 0, 0, 0)")
    body = os.urandom(1084)
    stop = threading.Event()

    def spin() -> None:  # pure Python, never blocking: what holds the GIL between its switch intervals
        n = 0
        while not stop.is_set():
            n += 1

    spinner = threading.Thread(target=spin, daemon=True)
    if busy:
        spinner.start()
    started = time.monotonic()
    try:
        for first in range(0, messages, PER_COMMIT):
            ids = range(first + 1, min(messages, first + PER_COMMIT) + 1)
            conn.execute("BEGIN IMMEDIATE")
            insert(conn, QUEUE, [(2 * i + 10, "sub", i, 1, 0, b"\x00", 0, 0) for i in ids], 8)
            insert(conn, MESSAGES, [(i, 1, 1100, 0, body) for i in ids], 5)
            conn.execute("COMMIT")
    finally:
        stop.set()
        conn.close()
    return messages / (time.monotonic() - started)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--busy-messages", type=int, default=5_000,
                    help="fewer beside the busy thread: executemany takes ~1 s per 750 messages there")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="pairmq-sqlite-steps-") as tmp:
        for busy, n in ((False, args.messages), (True, args.busy_messages)):
            rates = {}
            for name, insert in (("executemany", _executemany), ("insert_rows", insert_rows)):
                path = Path(tmp) / f"{name}-{busy}.db"
                rates[name] = run(path, n, insert, busy)
            where = "beside a busy Python thread" if busy else "alone"
            print(f"{n:,} messages {where}: executemany {rates['executemany']:,.0f} msg/s, insert_rows "
                  f"{rates['insert_rows']:,.0f} msg/s ({rates['insert_rows'] / rates['executemany']:.1f}x)")


if __name__ == "__main__":
    main()

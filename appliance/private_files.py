"""Files only the node's own user can read: message payloads, events, configuration, secrets.

Rules:
- The node process runs with umask 077 (set first thing by cli/run_node.py), and every place that
  creates something under the data directory asks for 0600 / 0700 itself as well: the umask is a
  process-wide setting that a library, a test harness or an embedding process may change, the
  explicit mode is not.
- A directory or database that exists wider (made by an older version, by hand, or by a tool run
  under umask 022) is narrowed when the node opens it: the node owns its data directory, so a
  chmod it cannot do is an error, not something to serve around.
- SQLite creates a database's -wal and -shm files with the database file's own mode, so creating
  the database file 0600 before SQLite opens it is what keeps those (message payloads) private.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

PRIVATE_UMASK = 0o077
DIR_MODE = 0o700
FILE_MODE = 0o600


def narrow(path: Path) -> None:
    """Take group and other permissions away from an existing path (a no-op when there are none)."""
    mode = stat.S_IMODE(os.stat(path).st_mode)
    if mode & 0o077:
        os.chmod(path, mode & ~0o077)


def private_dir(path: Path) -> Path:
    """`path` as a directory only we can enter; its missing parents are made 0700 too (under our umask)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True, mode=DIR_MODE)
    narrow(path)
    return path


def private_database(path: Path) -> None:
    """Create `path` empty at 0600 if missing (SQLite takes an empty file as a new database), and narrow
    it and its -wal / -shm files if they exist wider."""
    path = Path(path)
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT, FILE_MODE))
    for p in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
        if p.exists():
            narrow(p)


def private_opener(path: str, flags: int) -> int:
    """For `open(..., opener=private_opener)`: a file created 0600 whatever the umask."""
    return os.open(path, flags, FILE_MODE)

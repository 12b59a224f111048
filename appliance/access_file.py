"""The access document on disk: `<data_dir>/config/access.json`, mode 0600.

Rules:
- Absent file: the node runs with the empty policy (no users, no ACL,
  anonymous refused) and says so in its refusals. `pairmq local up` and the
  test groups write one that allows anonymous clients.
- The file holds password hashes: it must not be readable by group or
  others (a ConfigError naming the `chmod` to run), like the group secret.
- A malformed file is a ConfigError naming the file and the field. At
  start-up that stops the node; on a reload the node keeps the policy it has
  and logs why (a half-edited file never opens the broker up).
- Writes are atomic (temporary file, fsync, rename, fsync of the directory),
  created 0600 from the first byte.
- The node re-reads the file when its (inode, size, mtime) changes, checked
  once a second, and at once on SIGHUP.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from .broker.access import AccessDocumentError, AccessPolicy
from .errors import ConfigError

ACCESS_FILE = Path("config") / "access.json"
MAX_ACCESS_FILE_BYTES = 64 * 1024 * 1024


def access_path(data_dir: Path) -> Path:
    return Path(data_dir) / ACCESS_FILE


def signature(path: Path) -> tuple | None:
    """What changes when the file is replaced or edited; None when it is absent."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def load_access(path: Path) -> AccessPolicy | None:
    """The policy in `path`, or None if there is no such file."""
    try:
        st = path.stat()
        if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise ConfigError(f"access file {path} is readable by others (mode {stat.S_IMODE(st.st_mode):o}); "
                              f"it holds password hashes: run chmod 600 {path}")
        if st.st_size > MAX_ACCESS_FILE_BYTES:
            raise ConfigError(f"access file {path} is larger than {MAX_ACCESS_FILE_BYTES >> 20} MiB")
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read access file {path}: {exc}") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"access file {path} is not valid JSON: {exc}") from None
    try:
        return AccessPolicy.from_document(doc)
    except AccessDocumentError as exc:
        raise ConfigError(f"access file {path}: {exc}") from None


def write_access(path: Path, policy: AccessPolicy) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(policy.to_document(), f, indent=1)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)

"""The management API's admin credential: one user name and the scrypt record of its password.

Rules:
- It is a group setting, like the group secret, not replicated configuration:
  the file `admin` beside the secret file (mode 0600), identical on all three
  hosts. Installed under systemd it is 0600 root:root and reaches the node,
  which runs as another user, as the systemd credential `pairmq-admin`
  (LoadCredential=, cli/install.py): the node reads that copy and can change
  neither; a new file written over an existing one keeps its owner and mode
  (never more than 0640). Every node checks it, the monitor too (it holds no replicated
  configuration), and it works while no node is active (config-sync changes
  need an active node, so a group without one would lock its operator out of
  the very API that diagnoses it).
- Only the scrypt record is stored (appliance/broker/access.py's helpers and
  record format), never the password.
- A node re-reads the file when its size, mtime or inode change, so
  `pairmq admin passwd` takes effect without a restart (under systemd, where
  the credential is copied at start, at the node's next start); a file that became
  unreadable or malformed keeps the last good record in force and says why.
- No file: HTTP Basic is refused (signed requests still work); a malformed
  file at start-up stops the node with one sentence.
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import stat
from pathlib import Path

from ..broker.access import (SALT_BYTES, AccessDocumentError, HashRecord, check_username, hash_password,
                            record_from_document)
from ..config import GroupConfig
from ..errors import ConfigError

ADMIN_FILE = "admin"
DEFAULT_USER = "admin"
MIN_PASSWORD_CHARS = 12
MAX_PASSWORD_BYTES = 1024
GENERATED_PASSWORD_BYTES = 18  # 24 URL-safe characters


@dataclasses.dataclass(frozen=True, slots=True)
class AdminCredential:
    username: str
    record: HashRecord

    def to_document(self) -> dict:
        return {"version": 1, "username": self.username, "password": self.record.to_document()}


def admin_path(config: GroupConfig) -> Path:
    return config.secret_file.parent / ADMIN_FILE


CREDENTIAL_NAME = "pairmq-admin"  # the units' LoadCredential= (systemd/)


def node_admin_path(config: GroupConfig) -> Path:
    """Where a node reads its admin credential: the systemd credential when the unit passes one (the file
    itself stays root's), else the file beside the secret."""
    cred_dir = os.environ.get("CREDENTIALS_DIRECTORY")
    if cred_dir and (Path(cred_dir) / CREDENTIAL_NAME).exists():
        return Path(cred_dir) / CREDENTIAL_NAME
    return admin_path(config)


def new_credential(username: str, password: str) -> AdminCredential:
    check_password(password)
    check_username(username, "the admin user name")
    return AdminCredential(username, hash_password(password.encode(), secrets.token_bytes(SALT_BYTES)))


def generate_password() -> str:
    return secrets.token_urlsafe(GENERATED_PASSWORD_BYTES)


def check_password(password: str) -> None:
    if len(password) < MIN_PASSWORD_CHARS:
        raise ConfigError(f"the admin password must have at least {MIN_PASSWORD_CHARS} characters")
    if len(password.encode()) > MAX_PASSWORD_BYTES:
        raise ConfigError(f"the admin password must have at most {MAX_PASSWORD_BYTES} bytes")


def write_admin(path: Path, credential: AdminCredential) -> None:
    """Atomically, mode 0600 from the first byte written; over an existing file, with its owner and mode."""
    try:
        before = path.stat()
    except FileNotFoundError:
        before = None
    tmp = path.with_name(f".{path.name}.new")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(credential.to_document(), f, indent=2)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
        if before is not None and (before.st_uid, before.st_gid) != (os.geteuid(), os.getegid()):
            try:
                os.fchown(f.fileno(), before.st_uid, before.st_gid)
            except PermissionError:
                pass  # not root: the file stays ours, 0600
            else:
                os.fchmod(f.fileno(), stat.S_IMODE(before.st_mode) & 0o640)
    os.replace(tmp, path)


def read_admin(path: Path) -> AdminCredential | None:
    """The credential in `path`, None if there is no file; ConfigError naming the file if it is bad."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read the admin credential {path}: {exc}") from None
    try:
        doc = json.loads(text)
    except ValueError:
        raise ConfigError(f"the admin credential {path} is not JSON (write a new one with "
                          f"`pairmq admin passwd`)") from None
    if not isinstance(doc, dict) or doc.get("version") != 1 or set(doc) != {"version", "username", "password"}:
        raise ConfigError(f"the admin credential {path} must be {{version: 1, username, password}}")
    try:
        check_username(doc["username"], "username")
        return AdminCredential(doc["username"], record_from_document(doc["password"], "password"))
    except AccessDocumentError as exc:
        raise ConfigError(f"the admin credential {path}: {exc}") from None


class AdminFile:
    """The node's view of the admin file: re-read when it changes on disk."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.problem: str | None = None  # why the file on disk is not the one in force
        self._stamp: tuple | None = None
        self.credential = read_admin(path)  # at start-up a bad file is fatal: never guess
        self._stamp = self._stat()

    def _stat(self) -> tuple | None:
        try:
            st = self.path.stat()
        except OSError:
            return None
        return st.st_ino, st.st_size, st.st_mtime_ns

    def current(self) -> AdminCredential | None:
        stamp = self._stat()
        if stamp != self._stamp:
            self._stamp = stamp
            try:
                self.credential = read_admin(self.path)
                self.problem = None
            except ConfigError as exc:
                self.problem = f"{exc}; the previous admin credential stays in force"
        return self.credential

"""The group secret's key set: one secret, or two during a rotation, each with a key id, and where it lives.

Rules:
- A node holds one key, or two during a rotation. It accepts every key it holds (heartbeats by the key
  id in their header, mate-link and config-sync handshakes by the key id in the standby's HELLO,
  management tokens derived from any held key) and sends with exactly one, `send_id`.
- Key ids are 0..255 (one byte on the wire). A rotation's new key takes the old id + 1; ids never wrap,
  so "newer" is always "higher" (255 rotations per group, then `pairmq init` a new group secret).
- The secret file (or the systemd credential `pairmq-secret`) is a keyring in text: each line is `HEX`
  (key id 0, today's single-line file, still valid) or `ID:HEX`; the first line is the key to send with.
- A rotation moves every node through three steps, each idempotent on one node:
    add     hold the new key too (accept both, still send with the old one)
    use     send with the new key (both still accepted)
    retire  drop the old key
  A node holds at most two keys; `use` needs the key held; `retire` refuses the key it sends with. The
  CLI starts a step on any node only once all three confirmed the previous one (cli/secret_cmd.py), so
  no node ever sends with a key a peer does not hold.
- A node persists its keyring to its state directory (`keyring.json`, mode 0600, replaced atomically)
  before it answers a step; under systemd /etc is read-only. At start the persisted keyring wins over
  the secret file/credential unless the file is newer: its newest key id is higher than the persisted
  ring's newest, or the same id with another secret (an operator replaced the secret by hand). So a
  restart mid-rotation resumes in the step it persisted, and a node whose state was wiped comes back
  with what its secret file says.
- Each key has a fingerprint: 6 bytes of HKDF(secret, "key-check"), like an HSM's key check value. It
  says whether two hosts hold the same secret for a key id without revealing it; the API and
  `pairmq show secret` show it, and the CLI refuses to go on when a node holds another secret under
  an id the secret file has (two operators rotating from two hosts, or a stale secret file).
- A new secret crosses the network only wrapped: AES-256-GCM under HKDF(a key the node already holds),
  the associated data binding the group, the receiving role and both key ids, so a wrapped secret cannot
  be replayed to another node, group or key id. A bad tag changes nothing.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from .errors import ConfigError, LocalProtocolError, RemoteProtocolError
from .private_files import private_dir

MAX_KEY_ID = 255
MAX_KEYS = 2
MIN_SECRET_BYTES = 16
STATE_FILE = "keyring.json"
STEPS = ("add", "use", "retire")


class KeyringRefused(LocalProtocolError):
    """A step this node's keyring cannot take (the sentence says why); nothing changed."""


class BadWrap(RemoteProtocolError):
    """A wrapped secret that does not authenticate; nothing changed."""


class Keyring:
    """Secrets by key id, and the one we send with. Immutable: each step returns a new Keyring."""

    def __init__(self, keys: dict[int, bytes], send_id: int) -> None:
        assert send_id in keys and 1 <= len(keys) <= MAX_KEYS
        self.keys = dict(keys)
        self.send_id = send_id

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Keyring) and (self.keys, self.send_id) == (other.keys, other.send_id)

    @property
    def newest_id(self) -> int:
        return max(self.keys)

    @property
    def send_secret(self) -> bytes:
        return self.keys[self.send_id]

    def view(self) -> dict:
        return {"key_ids": sorted(self.keys), "send_key_id": self.send_id}

    def fingerprints(self) -> dict[str, str]:
        return {str(k): fingerprint(v) for k, v in sorted(self.keys.items())}

    # --- the three steps (each returns self when already done) --------------------------

    def add(self, key_id: int, secret: bytes) -> "Keyring":
        held = self.keys.get(key_id)
        if held == secret:
            return self
        if held is not None:
            raise KeyringRefused(f"this node already holds key id {key_id} with another secret")
        if len(self.keys) >= MAX_KEYS:
            raise KeyringRefused(f"this node already holds key ids {_ids(self.keys)}; "
                                 "finish the rotation under way with `pairmq secret rotate --resume` first")
        if key_id <= self.newest_id:
            raise KeyringRefused(f"key id {key_id} is not newer than key id {self.newest_id}, which this node holds")
        return Keyring({**self.keys, key_id: secret}, self.send_id)

    def use(self, key_id: int) -> "Keyring":
        if key_id not in self.keys:
            raise KeyringRefused(f"this node does not hold key id {key_id} (it holds {_ids(self.keys)}); add it first")
        return self if key_id == self.send_id else Keyring(self.keys, key_id)

    def retire(self, key_id: int) -> "Keyring":
        if key_id not in self.keys:
            return self
        if key_id == self.send_id:
            raise KeyringRefused(f"this node still sends with key id {key_id}; it cannot retire it")
        return Keyring({k: v for k, v in self.keys.items() if k != key_id}, self.send_id)

    # --- text (the secret file) and JSON (the state directory) ---------------------------

    def to_text(self) -> str:
        order = [self.send_id] + sorted(k for k in self.keys if k != self.send_id)
        return "".join(f"{k}:{self.keys[k].hex()}\n" for k in order)

    @classmethod
    def from_text(cls, text: str, where: str) -> "Keyring":
        keys: dict[int, bytes] = {}
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        if not lines:
            raise ConfigError(f"group secret {where} is empty")
        if len(lines) > MAX_KEYS:
            raise ConfigError(f"group secret {where} has {len(lines)} keys; it holds one, or two during a rotation")
        for n, line in enumerate(lines, 1):
            kid_text, _, hex_text = line.rpartition(":")
            kid = _key_id(kid_text or "0", f"group secret {where} line {n}")
            try:
                secret = bytes.fromhex(hex_text)
            except ValueError:
                raise ConfigError(f"group secret {where} line {n} must be hex digits (optionally after `ID:`)") from None
            if len(secret) < MIN_SECRET_BYTES:
                raise ConfigError(f"group secret {where} is too short ({len(secret)} bytes; at least {MIN_SECRET_BYTES})")
            if kid in keys:
                raise ConfigError(f"group secret {where} has key id {kid} twice")
            keys[kid] = secret
        return cls(keys, _key_id(lines[0].rpartition(":")[0] or "0", where))

    def save(self, path: Path) -> None:
        """Durable when it returns: a 0600 temporary file, fsync, rename, fsync the directory."""
        private_dir(path.parent)
        tmp = path.with_suffix(".tmp")
        tmp.unlink(missing_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="ascii") as f:
            json.dump({"schema": 1, "send_key_id": self.send_id,
                       "keys": {str(k): v.hex() for k, v in sorted(self.keys.items())}}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    @classmethod
    def load(cls, path: Path) -> "Keyring | None":
        try:
            raw = json.loads(path.read_text(encoding="ascii"))
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise ConfigError(f"keyring {path} is unreadable ({exc}); delete it to start from the secret file") from None
        try:
            assert raw["schema"] == 1
            keys = {_key_id(k, str(path)): bytes.fromhex(v) for k, v in raw["keys"].items()}
            send_id = raw["send_key_id"]
            assert send_id in keys and 1 <= len(keys) <= MAX_KEYS
        except (AssertionError, KeyError, TypeError, ValueError, AttributeError, ConfigError):
            raise ConfigError(f"keyring {path} has unexpected contents; delete it to start from the secret file") from None
        return cls(keys, send_id)


def fingerprint(secret: bytes) -> str:
    """A key check value: shows whether two secrets are the same, reveals nothing about them."""
    return HKDF(algorithm=hashes.SHA256(), length=6, salt=b"pairmq-group-secret",
                info=b"pairmq/key-check/v1").derive(secret).hex()


def management_key(secret: bytes) -> bytes:
    """The HMAC key of signed management requests (appliance/api/signing.py), derived from the group secret."""
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=b"pairmq-group-secret",
                info=b"pairmq/management-key/v2").derive(secret)


def management_token(secret: bytes) -> str:
    """The management key in hex, as the CLI and the API hold it; never sent itself."""
    return management_key(secret).hex()


def _ids(keys) -> str:
    return ", ".join(str(k) for k in sorted(keys))


def _key_id(text: str, where: str) -> int:
    if not text.isdigit() or int(text) > MAX_KEY_ID:
        raise ConfigError(f"{where}: key id {text!r} must be a whole number from 0 to {MAX_KEY_ID}")
    return int(text)


def startup_keyring(from_file: Keyring, state_path: Path) -> Keyring:
    """What a node starts with: its persisted keyring, unless the secret file/credential is newer (rules)."""
    persisted = Keyring.load(state_path)
    if persisted is None:
        return from_file
    newest = from_file.newest_id
    if newest > persisted.newest_id or (newest == persisted.newest_id
                                        and from_file.keys[newest] != persisted.keys[newest]):
        return from_file
    return persisted


# --- wrapping a new secret for one node ---------------------------------------------------


def _wrap_key(wrapping_secret: bytes, group: str) -> AESGCM:
    key = HKDF(algorithm=hashes.SHA256(), length=32, salt=b"pairmq-group-secret",
               info=b"pairmq/secret-wrap/v1/" + group.encode()).derive(wrapping_secret)
    return AESGCM(key)


def _aad(group: str, role: str, wrap_key_id: int, key_id: int) -> bytes:
    return b"pairmq/secret-wrap/v1\x00%s\x00%s\x00%d\x00%d" % (group.encode(), role.encode(), wrap_key_id, key_id)


def wrap(secret: bytes, *, key_id: int, wrapping: Keyring, group: str, role: str, nonce: bytes) -> dict:
    """The JSON the management API takes for `add`: `secret` sealed under the key `wrapping` sends with."""
    sealed = _wrap_key(wrapping.send_secret, group).encrypt(nonce, secret, _aad(group, role, wrapping.send_id, key_id))
    return {"wrap_key_id": wrapping.send_id, "nonce": nonce.hex(), "ciphertext": sealed.hex()}


def unwrap(wrapped: dict, *, key_id: int, keyring: Keyring, group: str, role: str) -> bytes:
    """The secret inside `wrapped`, or BadWrap (one sentence) if anything about it is wrong."""
    try:
        wrap_id, nonce, sealed = wrapped["wrap_key_id"], bytes.fromhex(wrapped["nonce"]), bytes.fromhex(wrapped["ciphertext"])
    except (KeyError, TypeError, ValueError, AttributeError):
        raise BadWrap("wrapped must be {\"wrap_key_id\": ID, \"nonce\": HEX, \"ciphertext\": HEX}") from None
    if not isinstance(wrap_id, int) or wrap_id not in keyring.keys:
        raise BadWrap(f"the secret is wrapped under key id {wrap_id!r}, which this node does not hold")
    if len(nonce) != 12:
        raise BadWrap("the wrapping nonce must be 12 bytes")
    try:
        secret = _wrap_key(keyring.keys[wrap_id], group).decrypt(nonce, sealed, _aad(group, role, wrap_id, key_id))
    except InvalidTag:
        raise BadWrap("the wrapped secret does not authenticate (a bad tag, or wrapped for another node, "
                      "group or key id); nothing changed") from None
    if len(secret) < MIN_SECRET_BYTES:
        raise BadWrap(f"the new secret is too short ({len(secret)} bytes; at least {MIN_SECRET_BYTES})")
    return secret


class CurrentKeyring:
    """The node's keyring as it stands now: the link services hold this, so a step reaches their next handshake."""

    def __init__(self, keyring: Keyring) -> None:
        self.keyring = keyring

    @property
    def keys(self) -> dict[int, bytes]:
        return self.keyring.keys

    @property
    def send_id(self) -> int:
        return self.keyring.send_id

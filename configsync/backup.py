"""Configuration backup: the export file `pairmq config export` writes and `pairmq config import` reads.

Rules:
- An export holds the whole replicated document (configsync/document.py: users with their scrypt
  password records, anonymous access, the ACL in order, limit and overload overrides, auto-revert)
  with the group name, the configuration version and the document's digest. Nothing else: the group
  file, the group secret and its keyring, the management admin file, TLS keys, messages and sessions
  are never in it. Password records are salted scrypt hashes, never passwords, but they are still
  secrets an attacker could try offline: the file is written 0600.
- `format_version` says which layout the file has; a file from a newer format is refused, never
  guessed at. Unknown fields are refused too (a newer writer's, or a typo).
- The digest guards against damage: when present it must be the document's. An operator who edits
  the document on purpose removes the digest.
- An import file is checked whole before anything is compared (size first, then JSON, then every
  field); each refusal is one sentence naming the field at fault.
- The differences are computed here, from two documents, so a dry run and the applied import show
  the same list; an import with no differences changes nothing (no version bump).
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import re

from .document import ConfigChangeError, ConfigDocument

FORMAT = "pairmq-config-export"
FORMAT_VERSION = 1
# The management API takes request bodies up to 1 MiB; a file that cannot fit in one is refused before it is read.
MAX_IMPORT_BYTES = 1024 * 1024
_FIELDS = {"format", "format_version", "group", "exported_at", "exported_from", "config_version", "digest",
           "document"}
_REQUIRED = {"format", "format_version", "group", "config_version", "document"}
_HEX64 = re.compile(r"[0-9a-f]{64}")


class ImportRefused(ConfigChangeError):
    """An import file that cannot be imported; the message is one sentence naming why."""


@dataclasses.dataclass(frozen=True, slots=True)
class Export:
    group: str
    config_version: int
    document: ConfigDocument
    exported_at: str = ""
    exported_from: str = ""

    def to_json(self) -> dict:
        return {"format": FORMAT, "format_version": FORMAT_VERSION, "group": self.group,
                "exported_at": self.exported_at, "exported_from": self.exported_from,
                "config_version": self.config_version, "digest": self.document.digest(),
                "document": self.document.to_json()}


def parse_export(data: bytes, where: str = "the file") -> Export:
    """The export in `data`, checked whole; ImportRefused (one sentence) otherwise."""
    if len(data) > MAX_IMPORT_BYTES:
        raise ImportRefused(f"{where} has {len(data):,} bytes; an import takes at most {MAX_IMPORT_BYTES:,}")
    try:
        doc = json.loads(data)
    except RecursionError:
        raise ImportRefused(f"{where} nests too deeply to be a configuration export") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise ImportRefused(f"{where} is not JSON ({_first_line(exc)})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ImportRefused(f"{where} is not a PairMQ configuration export (its \"format\" must be {FORMAT!r})")
    version = doc.get("format_version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise ImportRefused(f"{where}: format_version must be a whole number from 1, not {_short(version)}")
    if version > FORMAT_VERSION:
        raise ImportRefused(f"{where} was written in export format {version} by a newer PairMQ; this one reads "
                            f"format {FORMAT_VERSION} and older")
    unknown = sorted(set(doc) - _FIELDS)
    if unknown:
        raise ImportRefused(f"{where}: unknown field {_short(unknown[0])} (known: {', '.join(sorted(_FIELDS))})")
    missing = sorted(_REQUIRED - set(doc))
    if missing:
        raise ImportRefused(f"{where}: the field {missing[0]!r} is missing")
    for name in ("group", "exported_at", "exported_from"):
        if not isinstance(doc.get(name, ""), str) or len(doc.get(name, "")) > 200:
            raise ImportRefused(f"{where}: {name} must be a string of at most 200 characters, "
                                f"not {_short(doc.get(name))}")
    config_version = doc["config_version"]
    if not isinstance(config_version, int) or isinstance(config_version, bool) or config_version < 0:
        raise ImportRefused(f"{where}: config_version must be a whole number from 0, not {_short(config_version)}")
    try:
        document = ConfigDocument.from_json(doc["document"])
    except ConfigChangeError as exc:
        raise ImportRefused(f"{where}: {exc}") from None
    digest = doc.get("digest")
    if digest is not None:
        if not isinstance(digest, str) or not _HEX64.fullmatch(digest):
            raise ImportRefused(f"{where}: digest must be 64 lower-case hex digits, not {_short(digest)}")
        if digest != document.digest():
            raise ImportRefused(f"{where}: the document does not match its digest (the file was damaged or "
                                f"edited; after an edit on purpose, remove the \"digest\" field)")
    return Export(doc["group"], config_version, document, doc.get("exported_at", ""), doc.get("exported_from", ""))


# --- what an import would change -------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Difference:
    section: str  # users, anonymous, acl, limits, overload, auto_revert
    item: str
    before: str
    after: str

    def sentence(self) -> str:
        return f"{self.section} {self.item}: {self.before} -> {self.after}" if self.item else \
            f"{self.section}: {self.before} -> {self.after}"

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def differences(current: ConfigDocument, imported: ConfigDocument) -> list[Difference]:
    """What replacing `current` by `imported` changes, section by section; empty when they are equal."""
    found: list[Difference] = []
    old_users, new_users = current.access.users, imported.access.users
    for name in sorted(set(old_users) | set(new_users)):
        if name not in new_users:
            found.append(Difference("users", name, "present", "removed"))
        elif name not in old_users:
            found.append(Difference("users", name, "absent", "added"))
        elif old_users[name] != new_users[name]:
            found.append(Difference("users", name, "password record", "replaced"))
    if current.access.allow_anonymous != imported.access.allow_anonymous:
        found.append(Difference("anonymous", "", _allowed(current.access.allow_anonymous),
                                _allowed(imported.access.allow_anonymous)))
    found += _rule_differences([_rule(r.to_document()) for r in current.access.rules],
                               [_rule(r.to_document()) for r in imported.access.rules])
    for section, old, new in (("limits", current.limits, imported.limits),
                              ("overload", current.overload, imported.overload)):
        for name in sorted(set(old) | set(new)):
            if old.get(name) != new.get(name):
                found.append(Difference(section, name, _setting(old.get(name)), _setting(new.get(name))))
    if current.auto_revert != imported.auto_revert:
        found.append(Difference("auto_revert", "", _revert(current.auto_revert), _revert(imported.auto_revert)))
    return found


def _rule_differences(old: list[str], new: list[str]) -> list[Difference]:
    # Rules are read in order, first match wins: a rule that moved is a difference, so compare as sequences.
    found = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(a=old, b=new, autojunk=False).get_opcodes():
        if tag in ("delete", "replace"):
            found += [Difference("acl", f"rule {i}", old[i], "removed") for i in range(i1, i2)]
        if tag in ("insert", "replace"):
            found += [Difference("acl", f"rule {j}", "absent", new[j]) for j in range(j1, j2)]
    return found


def _rule(doc: dict) -> str:
    return f"{doc['effect']} {doc['action']} {doc['filter']!r} for {doc['who']}"


def _allowed(value: bool) -> str:
    return "allowed" if value else "refused"


def _setting(value) -> str:
    return "default" if value is None else f"{value:,}"


def _revert(value: bool | None) -> str:
    return "as in the group file" if value is None else "on" if value else "off"


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _first_line(exc: BaseException) -> str:
    return str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__

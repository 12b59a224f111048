"""Configuration changes: the unit config-sync orders, stores, chains and ships.

Rules:
- A change is one typed edit of the document (configsync/document.py). `parse_change` checks every
  field of a change that came from the API or from the mate and names the one at fault;
  `apply_change` checks the result (e.g. deleting a user that does not exist is an error, not a
  no-op), so a change either applies whole or not at all.
- Changes are plain JSON objects with a `kind`; their canonical bytes are what the history chains:
  chain(n) = SHA-256(chain(n-1) || canonical(change n)), starting from `GENESIS` at version 0. Two
  nodes with the same (version, chain) have applied the same changes in the same order.
- `document.replace` carries a whole document: it is how an operator asserts one node's
  configuration over its mate, and how an access file from before config-sync is imported.

Kinds:
  user.set          {username, record}     add a user or change a password (a scrypt record, never a password)
  user.delete       {username}
  anonymous.set     {allowed}
  acl.add           {rule}                 appended: rules are read in order
  acl.delete        {index}
  limits.set        {name, value}          value null = back to the default
  overload.set      {name, value}          value null = back to the default
  auto_revert.set   {enabled}              null = the group file's value
  document.replace  {document}
"""

from __future__ import annotations

import dataclasses
import hashlib

from pairmq.appliance.broker.access import (AccessDocumentError, AccessPolicy, check_username, record_from_document,
                                     rule_from_document)

from .document import ConfigChangeError, ConfigDocument, canonical, parse_limit, parse_overload

GENESIS = "0" * 64
MAX_CHANGE_BYTES = 64 * 1024 * 1024

_FIELDS = {
    "user.set": {"username", "record"},
    "user.delete": {"username"},
    "anonymous.set": {"allowed"},
    "acl.add": {"rule"},
    "acl.delete": {"index"},
    "limits.set": {"name", "value"},
    "overload.set": {"name", "value"},
    "auto_revert.set": {"enabled"},
    "document.replace": {"document"},
}
KINDS = tuple(_FIELDS)


def chain(previous: str, change: dict) -> str:
    return hashlib.sha256(bytes.fromhex(previous) + canonical(change)).hexdigest()


# --- a history's records: its head, and each change with its version and chain ---


@dataclasses.dataclass(frozen=True, slots=True)
class Head:
    version: int
    chain: str
    digest: str


@dataclasses.dataclass(frozen=True, slots=True)
class Entry:
    version: int
    change: dict
    chain: str
    at_ms: int = 0

    def to_json(self) -> dict:
        return {"version": self.version, "change": self.change, "chain": self.chain, "at_ms": self.at_ms}


def parse_change(change: object, where: str = "change") -> dict:
    """`change` checked field by field; returns it unchanged (it is already plain JSON)."""
    if not isinstance(change, dict):
        raise ConfigChangeError(f"{where} must be a JSON object with a kind")
    kind = change.get("kind")
    if not isinstance(kind, str) or kind not in _FIELDS:  # a list or object as the kind cannot be looked up
        raise ConfigChangeError(f"{where}.kind must be one of {', '.join(KINDS)}, not {kind!r}")
    fields = set(change) - {"kind"}
    missing = sorted(_FIELDS[kind] - fields)
    if missing:
        raise ConfigChangeError(f"{where}: a {kind} change needs {missing[0]!r}")
    unknown = sorted(fields - _FIELDS[kind])
    if unknown:
        raise ConfigChangeError(f"{where}: a {kind} change has no field {unknown[0]!r}")
    if len(canonical(change)) > MAX_CHANGE_BYTES:
        raise ConfigChangeError(f"{where}: larger than {MAX_CHANGE_BYTES >> 20} MiB")
    apply_change(ConfigDocument(), change, where, check_only=True)
    return change


def apply_change(doc: ConfigDocument, change: dict, where: str = "change", *,
                 check_only: bool = False) -> ConfigDocument:
    """The document after `change`; ConfigChangeError (naming the field) if it cannot apply.

    With `check_only`, only the change's own fields are checked (not whether it fits `doc`)."""
    kind = change.get("kind")
    access = doc.access
    try:
        if kind == "user.set":
            record = record_from_document(change["record"], f"{where}.record")
            return _with_access(doc, access.with_user(_username(change, where), record))
        if kind == "user.delete":
            name = _username(change, where)
            if not check_only and name not in access.users:
                raise ConfigChangeError(f"{where}.username: there is no user {name!r}")
            return _with_access(doc, access.without_user(name))
        if kind == "anonymous.set":
            return _with_access(doc, access.with_anonymous(_bool(change, "allowed", where)))
        if kind == "acl.add":
            rule = rule_from_document(change["rule"], f"{where}.rule")
            return _with_access(doc, access.with_rule(rule))
        if kind == "acl.delete":
            index = change["index"]
            if not isinstance(index, int) or isinstance(index, bool) or index < 0:
                raise ConfigChangeError(f"{where}.index must be a rule number (0 or more), not {index!r}")
            return doc if check_only else _with_access(doc, access.without_rule(index))
        if kind == "limits.set":
            return doc.with_limit(*parse_limit(change["name"], change["value"], f"{where}.limits"))
        if kind == "overload.set":
            return doc.with_overload(*parse_overload(change["name"], change["value"], f"{where}.overload"))
        if kind == "auto_revert.set":
            enabled = change["enabled"]
            if enabled is not None and not isinstance(enabled, bool):
                raise ConfigChangeError(f"{where}.enabled must be true, false or null, not {enabled!r}")
            return ConfigDocument(doc.access, doc.limits, doc.overload, enabled)
        if kind == "document.replace":
            return ConfigDocument.from_json(change["document"], f"{where}.document")
    except AccessDocumentError as exc:
        raise ConfigChangeError(f"{where}: {exc}") from None
    raise ConfigChangeError(f"{where}.kind must be one of {', '.join(KINDS)}, not {kind!r}")


def describe(change: dict) -> str:
    """One line for the CLI and the event log: what the change does (never a password hash)."""
    kind = change["kind"]
    if kind == "user.set":
        return f"set the password of user {change['username']!r}"
    if kind == "user.delete":
        return f"deleted user {change['username']!r}"
    if kind == "anonymous.set":
        return f"anonymous clients {'allowed' if change['allowed'] else 'refused'}"
    if kind == "acl.add":
        r = change["rule"]
        return f"added ACL rule: {r['effect']} {r['action']} {r['filter']!r} for {r['who']}"
    if kind == "acl.delete":
        return f"deleted ACL rule {change['index']}"
    if kind in ("limits.set", "overload.set"):
        value = "the default" if change["value"] is None else f"{change['value']:,}"
        return f"{kind.split('.')[0]}.{change['name']} set to {value}"
    if kind == "auto_revert.set":
        enabled = change["enabled"]
        return "auto-revert " + ("as in the group file" if enabled is None else "on" if enabled else "off")
    return "replaced the whole configuration"


def _with_access(doc: ConfigDocument, access: AccessPolicy) -> ConfigDocument:
    return ConfigDocument(access, doc.limits, doc.overload, doc.auto_revert)


def _username(change: dict, where: str) -> str:
    name = change["username"]
    check_username(name, f"{where}.username")
    return name


def _bool(change: dict, key: str, where: str) -> bool:
    value = change[key]
    if not isinstance(value, bool):
        raise ConfigChangeError(f"{where}.{key} must be true or false, not {value!r}")
    return value

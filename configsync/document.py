"""The replicated configuration document: what config-sync keeps identical on both routing nodes.

Rules:
- The document holds the configuration DESIGN §2 replicates: the access policy (users with their
  scrypt records, ACL rules, anonymous access), limit overrides, overload settings and auto-revert.
  Local settings (addresses, ports, role, secret, paths) live in the group file and never here.
- Limits and overload settings are *overrides*: a name absent from the document takes its default
  (the group file's `[limits]`, `OverloadLimits`' defaults). Every override is validated by name,
  type and range, and the merged whole must be valid (e.g. min_window <= max_window).
- `auto_revert` is None until someone sets it: then the group file's value applies.
- The canonical form is JSON with sorted keys and no spaces; the digest is SHA-256 of it. Two nodes
  hold the same configuration exactly when their digests are equal.
- Every error is a `ConfigChangeError` naming the field at fault; nothing is half-built.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json

from pairmq.appliance.broker.access import AccessDocumentError, AccessPolicy
from pairmq.appliance.config import Limits
from pairmq.appliance.errors import ConfigError
from pairmq.appliance.mqtt.overload import OverloadLimits

DOCUMENT_VERSION = 1
MAX_DOCUMENT_BYTES = 64 * 1024 * 1024

LIMIT_NAMES = tuple(f.name for f in dataclasses.fields(Limits))
OVERLOAD_NAMES = tuple(f.name for f in dataclasses.fields(OverloadLimits))
_OVERLOAD_FLOATS = {name for name in OVERLOAD_NAMES if isinstance(getattr(OverloadLimits(), name), float)}
_OVERLOAD_MAX = 10**9


class ConfigChangeError(ConfigError):
    """A configuration change or document that is not valid; the message names the field at fault."""


def canonical(value) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode("utf-8")


@dataclasses.dataclass(frozen=True, slots=True)
class ConfigDocument:
    access: AccessPolicy = AccessPolicy()
    limits: dict[str, int] = dataclasses.field(default_factory=dict)
    overload: dict[str, float | int] = dataclasses.field(default_factory=dict)
    auto_revert: bool | None = None

    # --- what the node applies ---

    def effective_limits(self, defaults: Limits) -> Limits:
        return dataclasses.replace(defaults, **self.limits)

    def effective_overload(self, defaults: OverloadLimits = OverloadLimits()) -> OverloadLimits:
        return dataclasses.replace(defaults, **self.overload)

    def effective_auto_revert(self, group_default: bool) -> bool:
        return group_default if self.auto_revert is None else self.auto_revert

    # --- edits (each returns a new, validated document) ---

    def with_limit(self, name: str, value: int | None) -> "ConfigDocument":
        limits = {k: v for k, v in self.limits.items() if k != name}
        if value is not None:
            limits[name] = value
        return _checked(dataclasses.replace(self, limits=limits))

    def with_overload(self, name: str, value: float | int | None) -> "ConfigDocument":
        overload = {k: v for k, v in self.overload.items() if k != name}
        if value is not None:
            overload[name] = value
        return _checked(dataclasses.replace(self, overload=overload))

    # --- the canonical form ---

    def to_json(self) -> dict:
        return {"version": DOCUMENT_VERSION, "access": self.access.to_document(),
                "limits": dict(sorted(self.limits.items())), "overload": dict(sorted(self.overload.items())),
                "auto_revert": self.auto_revert}

    def canonical(self) -> bytes:
        return canonical(self.to_json())

    def digest(self) -> str:
        return hashlib.sha256(self.canonical()).hexdigest()

    @classmethod
    def from_json(cls, doc: object, where: str = "document") -> "ConfigDocument":
        if not isinstance(doc, dict):
            raise ConfigChangeError(f"{where} must be a JSON object")
        _only(doc, {"version", "access", "limits", "overload", "auto_revert"}, where)
        if doc.get("version") != DOCUMENT_VERSION:
            raise ConfigChangeError(f"{where}.version must be {DOCUMENT_VERSION}, not {doc.get('version')!r}")
        try:
            access = AccessPolicy.from_document(doc.get("access", AccessPolicy().to_document()))
        except AccessDocumentError as exc:
            raise ConfigChangeError(f"{where}.access: {exc}") from None
        limits = doc.get("limits", {})
        overload = doc.get("overload", {})
        for name, table in (("limits", limits), ("overload", overload)):
            if not isinstance(table, dict):
                raise ConfigChangeError(f"{where}.{name} must be an object {{name: value}}")
        auto_revert = doc.get("auto_revert")
        if auto_revert is not None and not isinstance(auto_revert, bool):
            raise ConfigChangeError(f"{where}.auto_revert must be true, false or null, not {auto_revert!r}")
        return _checked(cls(access, dict(limits), dict(overload), auto_revert), where)


def parse_limit(name: object, value: object, where: str = "limits") -> tuple[str, int | None]:
    if name not in LIMIT_NAMES:
        raise ConfigChangeError(f"{where}: unknown limit {name!r} (known: {', '.join(LIMIT_NAMES)})")
    if value is not None:
        low, high = Limits.RANGES[name]
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
            raise ConfigChangeError(f"{where}.{name} must be a whole number from {low:,} to {high:,}, not {value!r}")
    return name, value


def parse_overload(name: object, value: object, where: str = "overload") -> tuple[str, float | int | None]:
    if name not in OVERLOAD_NAMES:
        raise ConfigChangeError(f"{where}: unknown overload setting {name!r} (known: {', '.join(OVERLOAD_NAMES)})")
    if value is None:
        return name, None
    number_types = (int, float) if name in _OVERLOAD_FLOATS else (int,)
    if isinstance(value, bool) or not isinstance(value, number_types) or not 0 <= value <= _OVERLOAD_MAX \
            or value != value:
        kind = "a number" if name in _OVERLOAD_FLOATS else "a whole number"
        raise ConfigChangeError(f"{where}.{name} must be {kind} from 0 to {_OVERLOAD_MAX:,}, not {value!r}")
    return name, float(value) if name in _OVERLOAD_FLOATS else value


def _checked(doc: ConfigDocument, where: str = "document") -> ConfigDocument:
    for name, value in doc.limits.items():
        parse_limit(name, value, f"{where}.limits")
    for name, value in doc.overload.items():
        parse_overload(name, value, f"{where}.overload")
    try:
        doc.effective_limits(Limits()).validate()
    except ConfigError as exc:
        raise ConfigChangeError(f"{where}: {exc}") from None
    try:
        doc.effective_overload()
    except ValueError as exc:
        raise ConfigChangeError(f"{where}.overload: {exc}") from None
    return doc


def _only(doc: dict, known: set[str], where: str) -> None:
    unknown = sorted(set(doc) - known)
    if unknown:
        raise ConfigChangeError(f"{where}: unknown field {unknown[0]!r} (known: {', '.join(sorted(known))})")

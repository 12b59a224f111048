"""Activity hooks: the group file's optional [hooks] table (the runner is appliance/node/hooks.py).

Rules:
- Keys: `on_active`, `on_standby`, `on_fault`, `on_redundancy_down`, `on_redundancy_up` (each the path of an
  executable, relative to the group file) and `hook_timeout_ms` (100..600000, default 5000).
- Checked at load, on every host: each named file exists, is a regular file and is executable by us. The group
  file is identical on all three hosts, so the scripts must be installed on all three (the monitor runs the
  redundancy and fault hooks too, keepalived-style: every node notifies about itself).
- Standard library only: the installer and the CLI read the group file.
"""

from __future__ import annotations

import dataclasses
import enum
import os
from pathlib import Path

from .errors import ConfigError


class HookEvent(enum.StrEnum):
    """What a hook is run for; the value is the group-file key without `on_` and PAIRMQ_EVENT's value."""

    ACTIVE = "active"
    STANDBY = "standby"
    FAULT = "fault"
    REDUNDANCY_DOWN = "redundancy_down"
    REDUNDANCY_UP = "redundancy_up"


TIMEOUT_RANGE_MS = (100, 600_000)
DEFAULT_TIMEOUT_MS = 5_000  # keepalived's notify scripts get no bound at all; a hung script must not hold the queue
KEYS = {f"on_{e.value}" for e in HookEvent} | {"hook_timeout_ms"}


@dataclasses.dataclass(frozen=True, slots=True)
class HookSettings:
    scripts: dict[HookEvent, Path] = dataclasses.field(default_factory=dict)
    hook_timeout_ms: int = DEFAULT_TIMEOUT_MS

    def script(self, event: HookEvent) -> Path | None:
        return self.scripts.get(event)


def parse_hooks(table: dict, base: Path) -> HookSettings:
    unknown = sorted(set(table) - KEYS)
    if unknown:
        raise ConfigError(f"unknown key {unknown[0]!r} in [hooks] (known: {', '.join(sorted(KEYS))})")
    timeout = table.get("hook_timeout_ms", DEFAULT_TIMEOUT_MS)
    low, high = TIMEOUT_RANGE_MS
    if not isinstance(timeout, int) or isinstance(timeout, bool) or not low <= timeout <= high:
        raise ConfigError(f"hooks.hook_timeout_ms must be a whole number from {low:,} to {high:,}, not {timeout!r}")
    scripts = {}
    for event in HookEvent:
        key = f"on_{event.value}"
        if key not in table:
            continue
        value = table[key]
        if not isinstance(value, str) or not value:
            raise ConfigError(f"hooks.{key} must be the path of an executable file, not {value!r}")
        path = (base / value).resolve()
        _check_executable(key, path)
        scripts[event] = path
    return HookSettings(scripts, timeout)


def _check_executable(key: str, path: Path) -> None:
    if not path.exists():
        raise ConfigError(f"hooks.{key}: {path} does not exist (install the script on every host of the group)")
    if not path.is_file():
        raise ConfigError(f"hooks.{key}: {path} is not a regular file")
    if not os.access(path, os.X_OK):
        raise ConfigError(f"hooks.{key}: {path} is not executable (chmod +x it)")


def render_hooks(settings: HookSettings) -> list[str]:
    """The [hooks] lines of a group file; none when no hook is set and the timeout is the default."""
    if settings == HookSettings():
        return []
    lines = ["", "[hooks]"]
    lines += [f"on_{event.value} = {_q(str(path))}" for event, path in settings.scripts.items()]
    return lines + [f"hook_timeout_ms = {settings.hook_timeout_ms}"]


def _q(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'

"""The config-sync exchange between the active and its standby, sans-I/O (messages in, messages out).

Rules:
- The standby opens with HELLO: its head (version, digest) and the chains of its newest versions.
  The active finds the newest version both histories share:
    - the standby's head itself           → CHANGES after it (none when in step), then live changes;
    - an older version, or none in reach  → SNAPSHOT (document, version, chain), naming that common
      version so the standby reports its own changes after it as discarded: divergent changes are
      reported, never merged (a change the active never had cannot be trusted to fit its history).
  A standby ahead of the active is divergent too: the active's configuration wins, because only the
  active takes changes (DESIGN §2).
- Then every change the active commits is shipped at once, in order. The standby checks that each
  follows its head and chains to it, applies a batch whole or not at all, and ACKs its head
  (version, digest). A batch that does not fit is refused with its error and the link closes
  (`ConfigLinkFault`); the standby then rejoins and gets a snapshot.
- Status of the standby, as the active sees it: In-Sync when the link is up and the standby acked
  our head with our digest; Syncing while the link is up and it is behind; Out-Of-Sync otherwise.
- Epochs fence: every message carries the sender's epoch; the standby refuses a message from an
  epoch lower than the highest it has seen, the active refuses a standby that claims a higher one.
- Liveness: the active PINGs every `ping_interval_ms`; either side that hears nothing for
  `link_timeout_ms` drops the link (`expired`). Everything is bounded: a HELLO lists at most
  `MAX_RECENT` chains, a CHANGES message at most `MAX_BATCH` changes.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from typing import Protocol

from pairmq.appliance.errors import RemoteProtocolError

from .changes import parse_change
from .document import ConfigChangeError, ConfigDocument, canonical
from .store import Entry, Head

MAX_RECENT = 64
MAX_BATCH = 500
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
PING_INTERVAL_MS = 500
LINK_TIMEOUT_MS = 3_000


class ConfigLinkFault(RemoteProtocolError):
    """The peer broke the exchange's rules; the link closes (and the standby rejoins)."""


class SyncStatus(enum.Enum):
    IN_SYNC = "In-Sync"
    SYNCING = "Syncing"
    OUT_OF_SYNC = "Out-Of-Sync"


class History(Protocol):
    head: Head
    document: ConfigDocument

    def chain_at(self, version: int) -> str | None: ...

    def changes_after(self, version: int, limit: int | None = None) -> list[Entry] | None: ...


# --- the wire form -------------------------------------------------------------------------------


def encode(message: dict) -> bytes:
    return canonical(message)


def decode(data: bytes) -> dict:
    if len(data) > MAX_MESSAGE_BYTES:
        raise ConfigLinkFault(f"a {len(data)}-byte config-sync message (at most {MAX_MESSAGE_BYTES})")
    try:
        message = json.loads(data, parse_constant=_not_json)
    except (ValueError, UnicodeDecodeError):
        raise ConfigLinkFault("a config-sync message that is not JSON") from None
    except RecursionError:  # json's C scanner recurses once per nesting level
        raise ConfigLinkFault("a config-sync message nested too deeply") from None
    if not isinstance(message, dict) or not isinstance(message.get("type"), str) or message["type"] not in _FIELDS:
        raise ConfigLinkFault("a config-sync message without a known type")
    missing = _FIELDS[message["type"]] - set(message)
    if missing:
        raise ConfigLinkFault(f"a {message['type']} message without {sorted(missing)[0]!r}")
    if not _is_count(message["epoch"]):
        raise ConfigLinkFault("a config-sync message without a valid epoch")
    return message


def _not_json(constant: str):
    """NaN and Infinity: Python's json reads them, `canonical` refuses them when the change is chained."""
    raise ValueError(f"{constant} is not JSON")


_FIELDS = {
    "hello": {"epoch", "version", "digest", "recent"},
    "changes": {"epoch", "entries"},
    "snapshot": {"epoch", "version", "chain", "document", "common", "reason"},
    "ack": {"epoch", "version", "digest"},
    "ping": {"epoch"},
    "pong": {"epoch"},
}


def _is_count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63


def _entries_to_json(entries: list[Entry]) -> list[dict]:
    return [e.to_json() for e in entries]


def _entries_from_json(raw) -> list[Entry]:
    if not isinstance(raw, list) or len(raw) > MAX_BATCH:
        raise ConfigLinkFault(f"a changes message must list at most {MAX_BATCH} changes")
    entries = []
    for item in raw:
        if not isinstance(item, dict) or not _is_count(item.get("version")) or not _is_count(item.get("at_ms", 0)) \
                or not isinstance(item.get("chain"), str):
            raise ConfigLinkFault("a change entry without version, chain and at_ms")
        entries.append(Entry(item["version"], item.get("change"), item["chain"], item.get("at_ms", 0)))
    return entries


# --- the active's end ----------------------------------------------------------------------------


@dataclasses.dataclass(slots=True)
class ActiveEnd:
    """One standby's connection, seen from the active."""

    epoch: int
    history: History
    now_ms: int
    live: bool = False  # the standby reached our head once: every new change is shipped at once
    acked: Head | None = None
    heard_ms: int = 0
    pinged_ms: int = 0
    joins: int = 0
    plan: str = ""  # how the last join caught up, for the status view
    join_version: int | None = None  # our head when the standby joined

    def __post_init__(self) -> None:
        self.heard_ms = self.pinged_ms = self.now_ms

    def receive(self, message: dict, now_ms: int) -> list[dict]:
        self.heard_ms = now_ms
        kind = message["type"]
        if message["epoch"] > self.epoch:
            raise ConfigLinkFault(f"the standby has seen epoch {message['epoch']}, newer than ours ({self.epoch})")
        if kind == "hello":
            return self._on_hello(message)
        if kind == "ack":
            if not _is_count(message["version"]) or not isinstance(message["digest"], str):
                raise ConfigLinkFault("an ack without version and digest")
            self.acked = Head(message["version"], "", message["digest"])
            return []
        if kind == "ping":
            return [{"type": "pong", "epoch": self.epoch}]
        if kind == "pong":
            return []
        raise ConfigLinkFault(f"a standby does not send {kind} messages")

    def committed(self, entry: Entry) -> list[dict]:
        """A change we just committed: shipped at once to a live standby."""
        if not self.live:
            return []
        return [{"type": "changes", "epoch": self.epoch, "entries": _entries_to_json([entry])}]

    def handle_timer(self, now_ms: int) -> list[dict]:
        if now_ms - self.pinged_ms >= PING_INTERVAL_MS:
            self.pinged_ms = now_ms
            return [{"type": "ping", "epoch": self.epoch}]
        return []

    def expired(self, now_ms: int) -> bool:
        return now_ms - self.heard_ms > LINK_TIMEOUT_MS

    def joined(self) -> bool:
        """The standby caught up with what we had when it joined: from then on it may stand by (a change
        made since then that it has not acked yet does not undo that; a broken link does)."""
        return self.acked is not None and self.join_version is not None and self.acked.version >= self.join_version

    def status(self) -> SyncStatus:
        head = self.history.head
        if self.acked is not None and self.acked.version == head.version and self.acked.digest == head.digest:
            return SyncStatus.IN_SYNC
        return SyncStatus.SYNCING

    def _on_hello(self, hello: dict) -> list[dict]:
        recent = hello["recent"]
        if not isinstance(recent, list) or len(recent) > MAX_RECENT or not all(
                isinstance(p, list) and len(p) == 2 and _is_count(p[0]) and isinstance(p[1], str) for p in recent):
            raise ConfigLinkFault(f"a hello must list at most {MAX_RECENT} [version, chain] pairs")
        self.joins += 1
        self.acked = None  # what the standby had before counts for nothing: its ack after the catch-up does
        head = self.history.head
        self.join_version = head.version
        common = next((v for v, ch in recent if v <= head.version and self.history.chain_at(v) == ch), None)
        theirs = recent[0][0] if recent else None
        if common is not None and common == theirs:
            missing = self.history.changes_after(common)
            if missing is not None:
                self.plan = "in step" if not missing else f"{len(missing)} changes"
                self.live = True
                return [{"type": "changes", "epoch": self.epoch, "entries": _entries_to_json(batch)}
                        for batch in _batches(missing)]
            reason = f"our history no longer reaches back to version {common}"
        elif theirs is not None and theirs > head.version and common == head.version:
            reason = f"the standby is ahead of us (version {theirs} > {head.version})"
        elif common is None and theirs is not None and theirs < head.version and self.history.chain_at(theirs) is None:
            reason = f"our history no longer reaches back to version {theirs}"
        elif common is None:
            reason = "no version in common"
        else:
            reason = f"the histories part after version {common}"
        self.plan = f"snapshot ({reason})"
        self.live = True
        return [{"type": "snapshot", "epoch": self.epoch, "version": head.version, "chain": head.chain,
                 "document": self.history.document.to_json(), "common": -1 if common is None else common,
                 "reason": reason}]


def _batches(entries: list[Entry]) -> list[list[Entry]]:
    return [entries[i:i + MAX_BATCH] for i in range(0, len(entries), MAX_BATCH)] or [[]]


# --- the standby's end ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class ApplyEntries:
    entries: list[Entry]


@dataclasses.dataclass(frozen=True, slots=True)
class InstallSnapshot:
    version: int
    chain: str
    document: ConfigDocument
    discard_after: int  # our changes after this version are discarded: report them
    reason: str


@dataclasses.dataclass(slots=True)
class StandbyEnd:
    """Our end of the link to the active. The adapter runs the effects on the store, then `ack`s."""

    epoch_seen: int
    now_ms: int
    heard_ms: int = 0

    def __post_init__(self) -> None:
        self.heard_ms = self.now_ms

    def hello(self, head: Head, recent: list[tuple[int, str]]) -> dict:
        return {"type": "hello", "epoch": self.epoch_seen, "version": head.version, "digest": head.digest,
                "recent": [[v, ch] for v, ch in recent[:MAX_RECENT]]}

    def receive(self, message: dict, now_ms: int) -> list:
        """Effects (ApplyEntries / InstallSnapshot) and replies (dicts) for one message from the active."""
        self.heard_ms = now_ms
        if message["epoch"] < self.epoch_seen:
            raise ConfigLinkFault(f"a message from epoch {message['epoch']}; epoch {self.epoch_seen} was active since")
        self.epoch_seen = message["epoch"]
        kind = message["type"]
        if kind == "changes":
            entries = _entries_from_json(message["entries"])
            for entry in entries:
                try:
                    parse_change(entry.change, f"change {entry.version}")
                except ConfigChangeError as exc:
                    raise ConfigLinkFault(f"refused a malformed change from the active: {exc}") from None
            return [ApplyEntries(entries)]  # even none: the ack tells the active we are at its head
        if kind == "snapshot":
            if not _is_count(message["version"]) or not isinstance(message["chain"], str) \
                    or not isinstance(message["common"], int) or not isinstance(message["reason"], str):
                raise ConfigLinkFault("a snapshot without version, chain, common and reason")
            try:
                document = ConfigDocument.from_json(message["document"], "snapshot.document")
            except ConfigChangeError as exc:
                raise ConfigLinkFault(f"refused a malformed snapshot from the active: {exc}") from None
            return [InstallSnapshot(message["version"], message["chain"], document, message["common"],
                                    message["reason"][:500])]
        if kind == "ping":
            return [{"type": "pong", "epoch": self.epoch_seen}]
        if kind == "pong":
            return []
        raise ConfigLinkFault(f"an active does not send {kind} messages")

    def ack(self, head: Head) -> dict:
        return {"type": "ack", "epoch": self.epoch_seen, "version": head.version, "digest": head.digest}

    def expired(self, now_ms: int) -> bool:
        return now_ms - self.heard_ms > LINK_TIMEOUT_MS

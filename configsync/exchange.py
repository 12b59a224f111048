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

from .changes import Entry, Head, parse_change
from .document import ConfigChangeError, ConfigDocument, canonical

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


# --- the messages ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Hello:
    """Standby → active: its head and the chains of its newest versions, newest first."""

    epoch: int
    version: int
    digest: str
    recent: tuple[tuple[int, str], ...]


@dataclasses.dataclass(frozen=True, slots=True)
class Changes:
    """Active → standby: changes that follow the standby's head, in order (none: it is at our head)."""

    epoch: int
    entries: tuple[Entry, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class Snapshot:
    """Active → standby: our whole document; `common` is the newest version both share (-1: none)."""

    epoch: int
    version: int
    chain: str
    document: ConfigDocument
    common: int
    reason: str


@dataclasses.dataclass(frozen=True, slots=True)
class Ack:
    """Standby → active: the head it holds now."""

    epoch: int
    version: int
    digest: str


@dataclasses.dataclass(frozen=True, slots=True)
class Ping:
    epoch: int


@dataclasses.dataclass(frozen=True, slots=True)
class Pong:
    epoch: int


Message = Hello | Changes | Snapshot | Ack | Ping | Pong
MAX_REASON_CHARS = 500


# --- the wire form: canonical JSON objects with a "type" -------------------------------------------


def encode(message: Message) -> bytes:
    return canonical(_to_json(message))


def _to_json(m: Message) -> dict:
    if isinstance(m, Hello):
        return {"type": "hello", "epoch": m.epoch, "version": m.version, "digest": m.digest,
                "recent": [[v, ch] for v, ch in m.recent]}
    if isinstance(m, Changes):
        return {"type": "changes", "epoch": m.epoch, "entries": [e.to_json() for e in m.entries]}
    if isinstance(m, Snapshot):
        return {"type": "snapshot", "epoch": m.epoch, "version": m.version, "chain": m.chain,
                "document": m.document.to_json(), "common": m.common, "reason": m.reason}
    if isinstance(m, Ack):
        return {"type": "ack", "epoch": m.epoch, "version": m.version, "digest": m.digest}
    return {"type": "ping" if isinstance(m, Ping) else "pong", "epoch": m.epoch}


def decode(data: bytes) -> Message:
    """The message, every field checked; ConfigLinkFault names the first that is not."""
    if len(data) > MAX_MESSAGE_BYTES:
        raise ConfigLinkFault(f"a {len(data)}-byte config-sync message (at most {MAX_MESSAGE_BYTES})")
    try:
        raw = json.loads(data, parse_constant=_not_json)
    except (ValueError, UnicodeDecodeError):
        raise ConfigLinkFault("a config-sync message that is not JSON") from None
    except RecursionError:  # json's C scanner recurses once per nesting level
        raise ConfigLinkFault("a config-sync message nested too deeply") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("type"), str) or raw["type"] not in _FIELDS:
        raise ConfigLinkFault("a config-sync message without a known type")
    kind = raw["type"]
    missing = _FIELDS[kind] - set(raw)
    if missing:
        raise ConfigLinkFault(f"a {kind} message without {sorted(missing)[0]!r}")
    epoch = raw["epoch"]
    if not _is_count(epoch):
        raise ConfigLinkFault("a config-sync message without a valid epoch")
    if kind == "hello":
        return _hello(raw)
    if kind == "changes":
        return Changes(epoch, _entries(raw["entries"]))
    if kind == "snapshot":
        return _snapshot(raw)
    if kind == "ack":
        if not _is_count(raw["version"]) or not isinstance(raw["digest"], str):
            raise ConfigLinkFault("an ack without version and digest")
        return Ack(epoch, raw["version"], raw["digest"])
    return Ping(epoch) if kind == "ping" else Pong(epoch)


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


def _hello(raw: dict) -> Hello:
    recent = raw["recent"]
    if not isinstance(recent, list) or len(recent) > MAX_RECENT or not all(
            isinstance(p, list) and len(p) == 2 and _is_count(p[0]) and isinstance(p[1], str) for p in recent):
        raise ConfigLinkFault(f"a hello must list at most {MAX_RECENT} [version, chain] pairs")
    if not _is_count(raw["version"]) or not isinstance(raw["digest"], str):
        raise ConfigLinkFault("a hello without version and digest")
    return Hello(raw["epoch"], raw["version"], raw["digest"], tuple((v, ch) for v, ch in recent))


def _entries(raw) -> tuple[Entry, ...]:
    if not isinstance(raw, list) or len(raw) > MAX_BATCH:
        raise ConfigLinkFault(f"a changes message must list at most {MAX_BATCH} changes")
    entries = []
    for item in raw:
        if not isinstance(item, dict) or not _is_count(item.get("version")) or not _is_count(item.get("at_ms", 0)) \
                or not isinstance(item.get("chain"), str):
            raise ConfigLinkFault("a change entry without version, chain and at_ms")
        entry = Entry(item["version"], item.get("change"), item["chain"], item.get("at_ms", 0))
        try:
            parse_change(entry.change, f"change {entry.version}")
        except ConfigChangeError as exc:
            raise ConfigLinkFault(f"refused a malformed change from the active: {exc}") from None
        entries.append(entry)
    return tuple(entries)


def _snapshot(raw: dict) -> Snapshot:
    if not _is_count(raw["version"]) or not isinstance(raw["chain"], str) \
            or not isinstance(raw["common"], int) or isinstance(raw["common"], bool) \
            or not isinstance(raw["reason"], str):
        raise ConfigLinkFault("a snapshot without version, chain, common and reason")
    try:
        document = ConfigDocument.from_json(raw["document"], "snapshot.document")
    except ConfigChangeError as exc:
        raise ConfigLinkFault(f"refused a malformed snapshot from the active: {exc}") from None
    return Snapshot(raw["epoch"], raw["version"], raw["chain"], document, raw["common"],
                    raw["reason"][:MAX_REASON_CHARS])


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
    _outbox: list[Message] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        self.heard_ms = self.pinged_ms = self.now_ms

    def receive(self, message: Message, now_ms: int) -> None:
        self.heard_ms = now_ms
        if message.epoch > self.epoch:
            raise ConfigLinkFault(f"the standby has seen epoch {message.epoch}, newer than ours ({self.epoch})")
        if isinstance(message, Hello):
            self._outbox += self._on_hello(message)
        elif isinstance(message, Ack):
            self.acked = Head(message.version, "", message.digest)
        elif isinstance(message, Ping):
            self._outbox.append(Pong(self.epoch))
        elif not isinstance(message, Pong):
            raise ConfigLinkFault(f"a standby does not send {_to_json(message)['type']} messages")

    def committed(self, entry: Entry) -> None:
        """A change we just committed: shipped at once to a live standby."""
        if self.live:
            self._outbox.append(Changes(self.epoch, (entry,)))

    def handle_timer(self, now_ms: int) -> None:
        if now_ms >= self.pinged_ms + PING_INTERVAL_MS:
            self.pinged_ms = now_ms
            self._outbox.append(Ping(self.epoch))

    def get_timer(self) -> int:
        """When the next ping is due, or the link expires if that comes first."""
        return min(self.pinged_ms + PING_INTERVAL_MS, self.heard_ms + LINK_TIMEOUT_MS + 1)

    def messages_to_send(self) -> list[Message]:
        out, self._outbox = self._outbox, []
        return out

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

    def _on_hello(self, hello: Hello) -> list[Message]:
        recent = hello.recent
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
                return [Changes(self.epoch, tuple(batch)) for batch in _batches(missing)]
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
        return [Snapshot(self.epoch, head.version, head.chain, self.history.document,
                         -1 if common is None else common, reason)]


def _batches(entries: list[Entry]) -> list[list[Entry]]:
    return [entries[i:i + MAX_BATCH] for i in range(0, len(entries), MAX_BATCH)] or [[]]


# --- the standby's end ---------------------------------------------------------------------------


# What the standby's adapter applies to its store; a snapshot discards (and the adapter reports) our changes
# after its `common` version.
Effect = Changes | Snapshot


@dataclasses.dataclass(slots=True)
class StandbyEnd:
    """Our end of the link to the active. The adapter runs the effects `receive` returns on the store, then
    `ack`s its new head."""

    epoch_seen: int
    now_ms: int
    heard_ms: int = 0
    _outbox: list[Message] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        self.heard_ms = self.now_ms

    def hello(self, head: Head, recent: list[tuple[int, str]]) -> None:
        self._outbox.append(Hello(self.epoch_seen, head.version, head.digest,
                                  tuple((v, ch) for v, ch in recent[:MAX_RECENT])))

    def receive(self, message: Message, now_ms: int) -> list[Effect]:
        """The effects of one message from the active (replies go to `messages_to_send`)."""
        self.heard_ms = now_ms
        if message.epoch < self.epoch_seen:
            raise ConfigLinkFault(f"a message from epoch {message.epoch}; epoch {self.epoch_seen} was active since")
        self.epoch_seen = message.epoch
        if isinstance(message, (Changes, Snapshot)):
            return [message]  # changes even when none: the ack tells the active we are at its head
        if isinstance(message, Ping):
            self._outbox.append(Pong(self.epoch_seen))
        elif not isinstance(message, Pong):
            raise ConfigLinkFault(f"an active does not send {_to_json(message)['type']} messages")
        return []

    def ack(self, head: Head) -> None:
        self._outbox.append(Ack(self.epoch_seen, head.version, head.digest))

    def handle_timer(self, now_ms: int) -> None:
        """Nothing falls due on our side: the active pings and we answer; its silence is `expired`."""

    def get_timer(self) -> int:
        """When the link expires unless the active is heard."""
        return self.heard_ms + LINK_TIMEOUT_MS + 1

    def messages_to_send(self) -> list[Message]:
        out, self._outbox = self._outbox, []
        return out

    def expired(self, now_ms: int) -> bool:
        return now_ms - self.heard_ms > LINK_TIMEOUT_MS

"""Who may connect, publish and subscribe: the access policy, sans-I/O.

Rules
-----
Connecting (the listener asks before the broker sees the CONNECT):

1. No username: accepted only when `allow_anonymous` is true; otherwise
   "not authorized" (v5 CONNACK 0x87, 3.1.1 return code 5).
2. A username: the user must exist and the password must verify against its
   scrypt record; otherwise "bad user name or password" (v5 0x86, 3.1.1
   return code 4). An unknown user and a wrong password get the same answer
   and cost the same scrypt (a dummy record), so users cannot be enumerated.
   A username is never taken as a mere label, even when anonymous is allowed.
3. A will topic the client may not publish to refuses the CONNECT with "not
   authorized" (the client learns now, not when the will silently vanishes).

Publishing, subscribing and receiving (the broker core's `authorize` and
`may_receive` hooks):

4. The ACL is an ordered list of rules (effect allow|deny, action
   publish|subscribe|both, a topic filter, who: `user:NAME`, `anonymous`,
   `users` = any authenticated user, `all` = everyone). Rules are read in
   order; the first rule that applies to the client and the action and
   *decides* wins:
   - PUBLISH to a topic: a rule decides when its filter matches the topic.
   - SUBSCRIBE to a filter: an allow rule decides only when its filter
     subsumes the requested one (every topic the subscription can match, the
     rule matches: `a/#` grants `a/b/+` and `a`, never `#` or `+/b`); a deny
     rule decides only when it subsumes the requested filter too (deny
     `secret/#` refuses `secret/a` and `secret/#`, not `#`). A deny rule that
     merely overlaps is passed over: the subscription is granted and what it
     denies is withheld at delivery (as mosquitto does), so an operator can
     hide one topic without breaking every broad subscription.
     `$share/GROUP/` is stripped first: a shared subscription is judged by its
     filter.
   - RECEIVING a message on a topic (every delivery, queued messages and
     retained ones included): the subscribe rules, read as for PUBLISH (a
     rule decides when its filter matches the topic). So a granted
     subscription never delivers a topic the same client could not have
     subscribed to by name, under the ACL in force at delivery.
5. No rule decides: allowed when the ACL is empty, denied when it holds any
   rule at all (an ACL, once written, is a whitelist).
6. A client whose user no longer exists, or an anonymous client after
   anonymous access was turned off, is denied every publish, subscribe and
   delivery. A policy change applies from the next packet and the next
   delivery: a revoked rule withholds what subscriptions granted earlier.
   Decisions are cached per (user, action, topic or filter) on the policy
   object; a change makes a new policy, so the cache never outlives the
   version.

Passwords are stored as scrypt records (n, r, p, salt, hash). Verification is
the CPU-heavy part (~50 ms): the adapter runs it in a thread (hashlib.scrypt
releases the GIL) and remembers successes in a `VerifiedCache`, keyed by an
HMAC of (user, password, record) under a per-process random key, so that a
reconnect storm costs one scrypt per distinct credential, and a changed
password invalidates its entries by itself.

The document (what `<data_dir>/config/access.json` holds and config-sync will
replicate) is plain JSON; `AccessPolicy.from_document` checks every field and
names the one at fault in an `AccessDocumentError`.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import hashlib
import hmac

from ..errors import ConfigError
from . import topics

DOCUMENT_VERSION = 1
SCRYPT_N, SCRYPT_R, SCRYPT_P = 1 << 14, 8, 1  # ~50 ms, 16 MiB: OWASP's minimum for scrypt
SCRYPT_MAX_MEMORY_BYTES = 64 * 1024 * 1024
HASH_BYTES = 32
SALT_BYTES = 16
MAX_USERS = 100_000
MAX_RULES = 10_000
MAX_USERNAME_CHARS = 256
MAX_PASSWORD_BYTES = 65535  # the MQTT binary data limit
DEFAULT_CACHE_ENTRIES = 10_000
MAX_DECISIONS = 100_000  # cached (user, action, topic) decisions per policy; all dropped at the bound


class AccessDocumentError(ConfigError):
    """The access document is malformed; the message names the field."""


class Effect(enum.Enum):
    ALLOW = "allow"
    DENY = "deny"


class Action(enum.Enum):
    PUBLISH = "publish"
    SUBSCRIBE = "subscribe"
    BOTH = "both"


WHO_KINDS = ("all", "users", "anonymous")
WHO_USER_PREFIX = "user:"


# --- passwords ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class HashRecord:
    salt: bytes
    n: int
    r: int
    p: int
    hash: bytes

    def to_document(self) -> dict:
        return {"scheme": "scrypt", "n": self.n, "r": self.r, "p": self.p,
                "salt": self.salt.hex(), "hash": self.hash.hex()}


def hash_password(password: bytes, salt: bytes, *, n: int = SCRYPT_N, r: int = SCRYPT_R,
                  p: int = SCRYPT_P) -> HashRecord:
    """A new record; the caller supplies a random salt (this module draws no randomness)."""
    if len(salt) < SALT_BYTES:
        raise ValueError(f"a salt needs at least {SALT_BYTES} bytes")
    return HashRecord(salt, n, r, p, _scrypt(password, salt, n, r, p, HASH_BYTES))


def verify_password(record: HashRecord, password: bytes) -> bool:
    """CPU-heavy (one scrypt): never call it on the event loop."""
    computed = _scrypt(password, record.salt, record.n, record.r, record.p, len(record.hash))
    return hmac.compare_digest(computed, record.hash)


def _scrypt(password: bytes, salt: bytes, n: int, r: int, p: int, length: int) -> bytes:
    return hashlib.scrypt(password, salt=salt, n=n, r=r, p=p, maxmem=SCRYPT_MAX_MEMORY_BYTES, dklen=length)


# Verified against when the user does not exist, so that "no such user" costs what a wrong password costs.
DUMMY_RECORD = HashRecord(b"pairmq-no-such-user", SCRYPT_N, SCRYPT_R, SCRYPT_P, bytes(HASH_BYTES))


class VerifiedCache:
    """Credentials that verified recently, as keyed hashes; bounded, least recently used out first."""

    def __init__(self, key: bytes, capacity: int = DEFAULT_CACHE_ENTRIES) -> None:
        if len(key) < 16 or capacity < 1:
            raise ValueError("the cache needs a key of at least 16 bytes and a capacity of at least 1")
        self._key = key
        self.capacity = capacity
        self._entries: collections.OrderedDict[bytes, None] = collections.OrderedDict()

    def token(self, username: str, password: bytes, record: HashRecord) -> bytes:
        """The cache key: no password is kept, and a new record (passwd) yields new tokens."""
        mac = hmac.new(self._key, digestmod=hashlib.sha256)
        for part in (username.encode(), password, record.salt, record.hash):
            mac.update(len(part).to_bytes(4, "big"))
            mac.update(part)
        return mac.digest()

    def __contains__(self, token: bytes) -> bool:
        if token in self._entries:
            self._entries.move_to_end(token)
            return True
        return False

    def add(self, token: bytes) -> None:
        self._entries[token] = None
        self._entries.move_to_end(token)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)


# --- topic filters ------------------------------------------------------------------------


def _dollar_mismatch(i: int, level: str | None) -> bool:
    """MQTT §4.7.2: a wildcard in the first level never matches a topic starting with `$`."""
    return i == 0 and level is not None and level.startswith("$")


def subsumes(outer: tuple[str, ...], inner: tuple[str, ...]) -> bool:
    """Every topic that `inner` matches, `outer` matches (levels already split)."""
    for i, o in enumerate(outer):
        if o == "#":
            return not _dollar_mismatch(i, inner[i] if i < len(inner) else None)
        if i >= len(inner):
            return False
        if inner[i] == "#":
            # `+/#` matches what `#` matches at the first level (no topic has zero levels); deeper, `x/#` also
            # matches `x` itself, which `x/+/#` does not.
            return i == 0 and outer == ("+", "#")
        if o == "+":
            if _dollar_mismatch(i, inner[i]):
                return False
        elif inner[i] != o:
            return False
    return len(inner) == len(outer)


def overlaps(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    """Some topic is matched by both filters (for a plain topic name: the filter matches it)."""
    for i in range(max(len(a), len(b))):
        x = a[i] if i < len(a) else None
        y = b[i] if i < len(b) else None
        if x == "#" or y == "#":
            return not _dollar_mismatch(i, y if x == "#" else x)
        if x is None or y is None:
            return False
        if x == "+" or y == "+":
            if _dollar_mismatch(i, y if x == "+" else x):
                return False
        elif x != y:
            return False
    return True


# --- the policy ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Rule:
    effect: Effect
    action: Action
    filter: str
    who: str
    levels: tuple[str, ...] = dataclasses.field(init=False, compare=False, repr=False)  # split once

    def __post_init__(self) -> None:
        object.__setattr__(self, "levels", tuple(self.filter.split("/")))

    def applies(self, username: str | None, action: str) -> bool:
        if self.action is not Action.BOTH and self.action.value != action:
            return False
        if self.who == "all":
            return True
        if self.who == "anonymous":
            return username is None
        if self.who == "users":
            return username is not None
        return username is not None and self.who[len(WHO_USER_PREFIX):] == username

    def to_document(self) -> dict:
        return {"effect": self.effect.value, "action": self.action.value, "filter": self.filter, "who": self.who}


@dataclasses.dataclass(frozen=True, slots=True)
class AccessPolicy:
    allow_anonymous: bool = False
    users: dict[str, HashRecord] = dataclasses.field(default_factory=dict)
    rules: tuple[Rule, ...] = ()
    # (user, action, topic) -> allowed: filled per packet and delivery, dropped with this policy (see the rules)
    _decided: dict = dataclasses.field(default_factory=dict, init=False, compare=False, repr=False)

    # --- connecting ---

    def anonymous_refusal(self) -> str | None:
        return None if self.allow_anonymous else "anonymous connections are not allowed; connect with a username"

    def record_for(self, username: str) -> HashRecord:
        """The record to verify against: the user's, or the dummy one (which nothing matches)."""
        return self.users.get(username, DUMMY_RECORD)

    def may_connect_as(self, username: str | None) -> bool:
        return self.allow_anonymous if username is None else username in self.users

    # --- the broker core's hook ---

    def authorize(self, username: str | None, action: str, topic: str) -> bool:
        """`action` is "publish" (a topic name) or "subscribe" (a topic filter, maybe `$share/...`). Cached."""
        decided = self._decided.get((username, action, topic))  # per packet: the cache's hit inline
        return self._cache(username, action, topic, self._decide) if decided is None else decided

    def may_receive(self, username: str | None, topic: str) -> bool:
        """May this client be sent a message on `topic` (rule 4, receiving)? Cached per (user, topic)."""
        decided = self._decided.get((username, "receive", topic))  # per delivery: the cache's hit inline
        return self._cache(username, "receive", topic, self._decide_receive) if decided is None else decided

    def _cache(self, username: str | None, action: str, topic: str, decide) -> bool:
        decided = decide(username, action, topic)
        if len(self._decided) >= MAX_DECISIONS:
            self._decided.clear()
        self._decided[(username, action, topic)] = decided
        return decided

    def _decide(self, username: str | None, action: str, topic: str) -> bool:
        if not self.may_connect_as(username):
            return False
        if not self.rules:
            return True
        if action == "subscribe":
            _group, topic = topics.parse_shared(topic)
        levels = tuple(topic.split("/"))
        for rule in self.rules:
            if not rule.applies(username, action):
                continue
            if rule.effect is Effect.ALLOW and subsumes(rule.levels, levels):
                return True
            if rule.effect is Effect.DENY:
                if action == "publish" and overlaps(rule.levels, levels):
                    return False
                if action == "subscribe" and subsumes(rule.levels, levels):
                    return False
        return False

    def _decide_receive(self, username: str | None, _action: str, topic: str) -> bool:
        if not self.may_connect_as(username):
            return False
        if not self.rules:
            return True
        levels = tuple(topic.split("/"))
        for rule in self.rules:
            if rule.applies(username, "subscribe") and overlaps(rule.levels, levels):
                return rule.effect is Effect.ALLOW
        return False

    # --- edits (each returns a new policy; the CLI writes it) ---

    def with_anonymous(self, allowed: bool) -> "AccessPolicy":
        return dataclasses.replace(self, allow_anonymous=allowed)

    def with_user(self, username: str, record: HashRecord) -> "AccessPolicy":
        check_username(username, "username")
        if username not in self.users and len(self.users) >= MAX_USERS:
            raise AccessDocumentError(f"users: at most {MAX_USERS} users")
        return dataclasses.replace(self, users={**self.users, username: record})

    def without_user(self, username: str) -> "AccessPolicy":
        return dataclasses.replace(self, users={k: v for k, v in self.users.items() if k != username})

    def with_rule(self, rule: Rule) -> "AccessPolicy":
        checked = rule_from_document(rule.to_document(), f"acl[{len(self.rules)}]")
        if len(self.rules) >= MAX_RULES:
            raise AccessDocumentError(f"acl: at most {MAX_RULES} rules")
        return dataclasses.replace(self, rules=(*self.rules, checked))

    def without_rule(self, index: int) -> "AccessPolicy":
        if not 0 <= index < len(self.rules):
            raise AccessDocumentError(f"acl: there is no rule {index} (the rules are numbered 0..{len(self.rules) - 1})"
                                      if self.rules else "acl: there are no rules")
        return dataclasses.replace(self, rules=self.rules[:index] + self.rules[index + 1:])

    # --- the document ---

    def to_document(self) -> dict:
        return {"version": DOCUMENT_VERSION, "allow_anonymous": self.allow_anonymous,
                "users": {name: record.to_document() for name, record in sorted(self.users.items())},
                "acl": [rule.to_document() for rule in self.rules]}

    @classmethod
    def from_document(cls, doc: object) -> "AccessPolicy":
        if not isinstance(doc, dict):
            raise AccessDocumentError("the access document must be a JSON object")
        unknown = sorted(set(doc) - {"version", "allow_anonymous", "users", "acl"})
        if unknown:
            raise AccessDocumentError(f"unknown field {unknown[0]!r} (known: acl, allow_anonymous, users, version)")
        if doc.get("version") != DOCUMENT_VERSION:
            raise AccessDocumentError(f"version must be {DOCUMENT_VERSION}, not {doc.get('version')!r}")
        anonymous = doc.get("allow_anonymous", False)
        if not isinstance(anonymous, bool):
            raise AccessDocumentError(f"allow_anonymous must be true or false, not {anonymous!r}")
        users_doc = doc.get("users", {})
        if not isinstance(users_doc, dict):
            raise AccessDocumentError("users must be an object {name: scrypt record}")
        if len(users_doc) > MAX_USERS:
            raise AccessDocumentError(f"users: at most {MAX_USERS} users, not {len(users_doc)}")
        users = {}
        for name, record in users_doc.items():
            check_username(name, f"users[{name!r}]")
            users[name] = record_from_document(record, f"users[{name!r}]")
        acl_doc = doc.get("acl", [])
        if not isinstance(acl_doc, list):
            raise AccessDocumentError("acl must be a list of rules")
        if len(acl_doc) > MAX_RULES:
            raise AccessDocumentError(f"acl: at most {MAX_RULES} rules, not {len(acl_doc)}")
        rules = tuple(rule_from_document(rule, f"acl[{i}]") for i, rule in enumerate(acl_doc))
        return cls(anonymous, users, rules)


def check_username(name: object, where: str) -> None:
    if not isinstance(name, str) or not name or len(name) > MAX_USERNAME_CHARS:
        raise AccessDocumentError(f"{where}: a username must be 1..{MAX_USERNAME_CHARS} characters")
    if any(ord(ch) < 0x20 or ord(ch) == 0x7F or 0xD800 <= ord(ch) <= 0xDFFF for ch in name):
        raise AccessDocumentError(f"{where}: a username may not hold control characters or surrogates")


def record_from_document(record: object, where: str) -> HashRecord:
    if not isinstance(record, dict):
        raise AccessDocumentError(f"{where} must be a scrypt record {{scheme, n, r, p, salt, hash}}")
    unknown = sorted(set(record) - {"scheme", "n", "r", "p", "salt", "hash"})
    if unknown:
        raise AccessDocumentError(f"{where}: unknown field {unknown[0]!r}")
    if record.get("scheme") != "scrypt":
        raise AccessDocumentError(f"{where}.scheme must be \"scrypt\", not {record.get('scheme')!r}")
    values = {}
    for key, low, high in (("n", 2, 1 << 20), ("r", 1, 32), ("p", 1, 16)):
        value = record.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
            raise AccessDocumentError(f"{where}.{key} must be a whole number {low}..{high}, not {value!r}")
        values[key] = value
    if values["n"] & (values["n"] - 1):
        raise AccessDocumentError(f"{where}.n must be a power of two, not {values['n']}")
    if 128 * values["r"] * (values["n"] + values["p"] + 2) > SCRYPT_MAX_MEMORY_BYTES:
        raise AccessDocumentError(f"{where}: n x r needs more than {SCRYPT_MAX_MEMORY_BYTES >> 20} MiB")
    raw = {}
    for key, low in (("salt", SALT_BYTES), ("hash", 16)):
        text = record.get(key)
        try:
            raw[key] = bytes.fromhex(text) if isinstance(text, str) else None
        except ValueError:
            raw[key] = None
        if raw[key] is None or not low <= len(raw[key]) <= 64:
            raise AccessDocumentError(f"{where}.{key} must be {low}..64 bytes as hex digits")
    return HashRecord(raw["salt"], values["n"], values["r"], values["p"], raw["hash"])


def rule_from_document(rule: object, where: str) -> Rule:
    if not isinstance(rule, dict):
        raise AccessDocumentError(f"{where} must be a rule {{effect, action, filter, who}}")
    unknown = sorted(set(rule) - {"effect", "action", "filter", "who"})
    if unknown:
        raise AccessDocumentError(f"{where}: unknown field {unknown[0]!r}")
    try:
        effect = Effect(rule.get("effect"))
    except ValueError:
        raise AccessDocumentError(f"{where}.effect must be allow or deny, not {rule.get('effect')!r}") from None
    try:
        action = Action(rule.get("action"))
    except ValueError:
        raise AccessDocumentError(
            f"{where}.action must be publish, subscribe or both, not {rule.get('action')!r}") from None
    topic_filter = rule.get("filter")
    if not isinstance(topic_filter, str):
        raise AccessDocumentError(f"{where}.filter must be a topic filter string")
    try:
        topics.validate_topic_filter(topic_filter)
    except topics.TopicError as exc:
        raise AccessDocumentError(f"{where}.filter {topic_filter!r}: {exc.message}") from None
    if topic_filter.startswith(topics.SHARE_PREFIX):
        raise AccessDocumentError(f"{where}.filter: rules name topics; a $share/ filter is judged by the filter "
                                  f"after its group")
    who = rule.get("who")
    if not isinstance(who, str) or not (who in WHO_KINDS or who.startswith(WHO_USER_PREFIX)):
        raise AccessDocumentError(f"{where}.who must be all, users, anonymous or user:NAME, not {who!r}")
    if who.startswith(WHO_USER_PREFIX):
        check_username(who[len(WHO_USER_PREFIX):], f"{where}.who")
    return Rule(effect, action, topic_filter, who)

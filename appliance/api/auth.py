"""Who may use the management API: one aiohttp middleware in front of every route.

Rules:
- Every request needs a credential, reads included, and routes added later
  (metrics, the status page, event streams) are covered without naming them:
  the middleware runs before routing's own answers, so an unknown path
  without a credential is a 401 too and routes cannot be probed.
- Two credentials: a signed request (`Authorization: PairMQ-HMAC ...`,
  signing.py: what the CLI and the nodes' status fan-out send; the key is
  derived from the group secret and never travels), or HTTP Basic with the
  admin user's password (admin_credential.py; what a browser and a
  Prometheus scraper send). There is no bearer token:
  anything sent as-is on the wire could be replayed by whoever saw it.
- A missing or wrong credential is a 401 JSON error with WWW-Authenticate
  challenges for both schemes (Basic first, so a browser shows its prompt).
  Bytes that are not ASCII in the header are a wrong credential like any
  other (401, counted), never an error of ours.
- Wrong credentials are counted per credential (`FailureLimiter`, keyed by a
  keyed hash of the header's value), not per address: a neighbour behind the
  same NAT sending wrong passwords throttles its own wrong passwords, never
  the operator's right one. Past `max_failures` within `window_ms` the same
  credential gets 429 with Retry-After, unchecked. Guessing many different
  passwords is bounded by the one scrypt thread (`MAX_PENDING_CHECKS`, then
  429) and the admin password's minimum length; guessing a signature is
  guessing a 256-bit key. The table is bounded (oldest entry out first).
- The browser admin (Basic) is a lesser principal: a change it POSTs needs
  `Content-Type: application/json` and an `Origin` equal to the API's own
  (a page on another site cannot send that without a CORS preflight, which
  this API never grants), else 403 and nothing happens; it cannot read the
  MQTT users' password records nor drive secret rotation (`require_key`).
- scrypt (tens of milliseconds by design) never runs on the event loop: one thread verifies; a
  password that verified is remembered (keyed hash, bounded cache), so a
  browser's Basic header on every request costs one scrypt; at most
  `MAX_PENDING_CHECKS` checks wait at once, the rest get 429.
- A request's body is read here, within `body_timeout_s` (a slow body is a
  408, not a connection held for ever), because a signature covers it.
- The limiter is sans-I/O: time is passed in.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import collections
import dataclasses
import hashlib
import hmac
import secrets
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from aiohttp import web

from ..broker.access import VerifiedCache, verify_password
from .admin_credential import AdminFile
from .signing import SCHEME, SignatureRefused, Verifier

MAX_PENDING_CHECKS = 8
MAX_HEADER_CHARS = 4096
BODY_TIMEOUT_S = 30.0
KEY_PRINCIPAL = "key"
PRINCIPAL = web.RequestKey("principal", str)  # "key" or "admin:<user>", for handlers that care who asked
CHALLENGES = ('Basic realm="PairMQ management", charset="UTF-8"', f'{SCHEME} realm="PairMQ management"')
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


@dataclasses.dataclass(slots=True)
class _Failures:
    first_ms: int
    count: int


class FailureLimiter:
    """Failed attempts per credential (any string key) within a fixed window; bounded memory."""

    def __init__(self, max_failures: int = 10, window_ms: int = 60_000, max_keys: int = 10_000) -> None:
        assert max_failures >= 1 and window_ms >= 1 and max_keys >= 1
        self.max_failures = max_failures
        self.window_ms = window_ms
        self.max_keys = max_keys
        self._table: collections.OrderedDict[str, _Failures] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._table)

    def retry_after_ms(self, key: str, now_ms: int) -> int | None:
        """How long `key` must wait before it may be tried again, None if it may be tried now."""
        entry = self._table.get(key)
        if entry is None:
            return None
        if now_ms - entry.first_ms >= self.window_ms:
            del self._table[key]
            return None
        if entry.count >= self.max_failures:
            return entry.first_ms + self.window_ms - now_ms
        return None

    def failed(self, key: str, now_ms: int) -> None:
        entry = self._table.get(key)
        if entry is None or now_ms - entry.first_ms >= self.window_ms:
            self._table[key] = _Failures(now_ms, 1)
        else:
            entry.count += 1
        self._table.move_to_end(key)
        while len(self._table) > self.max_keys:
            self._table.popitem(last=False)

    def succeeded(self, key: str) -> None:
        self._table.pop(key, None)


class Refused(Exception):
    def __init__(self, status: int, message: str, retry_after_s: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after_s = retry_after_s


class ApiAuth:
    def __init__(self, keys: bytes | Callable[[], list[bytes]], admin: AdminFile,
                 limiter: FailureLimiter | None = None, hosts: set[str] | None = None,
                 verifier: Verifier | None = None, body_timeout_s: float = BODY_TIMEOUT_S) -> None:
        """`keys`: the management keys accepted now (a node holds two during a secret rotation);
        `hosts`: the `host:port` names this node answers to (None: whatever the request names, in-process tests)."""
        self.keys = keys if callable(keys) else (lambda: [keys])
        self.admin = admin
        self.limiter = limiter if limiter is not None else FailureLimiter()
        self.hosts = hosts
        self.verifier = verifier if verifier is not None else Verifier()
        self.body_timeout_s = body_timeout_s
        self.cache = VerifiedCache(secrets.token_bytes(32), 64)
        self.counters: collections.Counter[str] = collections.Counter()
        self._fingerprint_key = secrets.token_bytes(32)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pairmq-api-scrypt")
        self._pending = 0

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    def view(self) -> dict:
        return {"limited_credentials": len(self.limiter), "admin_file": str(self.admin.path),
                "admin_configured": self.admin.credential is not None, "admin_file_problem": self.admin.problem,
                **self.counters}

    def _fingerprint(self, header: str) -> str:
        # Keyed, so the table never holds a password, and a header's odd bytes cannot raise here.
        raw = header.encode("utf-8", "surrogateescape")
        return hmac.new(self._fingerprint_key, raw, hashlib.sha256).hexdigest()[:32]

    async def check(self, request: web.Request) -> str:
        """The principal ("key" or "admin:<user>"), or raises Refused."""
        header = request.headers.get("Authorization")
        if not header:
            self.counters["refused"] += 1
            raise Refused(401, "authentication required: send the admin user's password (HTTP Basic) "
                               f"or a request signed with the group's management key ({SCHEME}, what the CLI sends)")
        credential = self._fingerprint(header)
        wait_ms = self.limiter.retry_after_ms(credential, time.monotonic_ns() // 1_000_000)
        if wait_ms is not None:
            self.counters["rate_limited"] += 1
            seconds = max(1, -(-wait_ms // 1000))
            raise Refused(429, f"too many failed attempts with this credential; try again in {seconds} s", seconds)
        try:
            principal = await self._verify(header, request)
        except Refused as exc:
            if exc.status == 401:
                self.counters["refused"] += 1
                self.limiter.failed(credential, time.monotonic_ns() // 1_000_000)
            raise
        self.limiter.succeeded(credential)
        self.counters["accepted"] += 1
        if principal != KEY_PRINCIPAL:
            _check_browser_change(request)
            await read_body(request, self.body_timeout_s)  # the handler's own read is then immediate
        return principal

    async def _verify(self, header: str, request: web.Request) -> str:
        if len(header) > MAX_HEADER_CHARS:
            raise Refused(401, "the Authorization header is too long")
        if not header.isascii():
            raise Refused(401, "the Authorization header has bytes that are not ASCII")
        scheme, _, value = header.partition(" ")
        if scheme.lower() == SCHEME.lower():
            return await self._signed(value, request)
        if scheme.lower() == "basic":
            return await self._basic(value.strip())
        if scheme.lower() == "bearer":
            raise Refused(401, f"bearer tokens are not accepted: the CLI signs each request ({SCHEME}); "
                               f"a browser or scraper uses the admin password (HTTP Basic)")
        raise Refused(401, f"unsupported authentication scheme {scheme.lower()[:20]!r}; use Basic or {SCHEME}")

    async def _signed(self, value: str, request: web.Request) -> str:
        body = await read_body(request, self.body_timeout_s)
        hosts = self.hosts if self.hosts is not None else {request.host.lower()}
        try:
            self.verifier.verify(value, self.keys(), request.method, hosts, request.host, request.raw_path, body,
                                 time.time_ns() // 1_000_000)
        except SignatureRefused as exc:
            raise Refused(401, str(exc)) from None
        return KEY_PRINCIPAL

    async def _basic(self, value: str) -> str:
        try:
            username, sep, password = base64.b64decode(value, validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError, ValueError):
            raise Refused(401, "the Basic credential is not base64 of user:password") from None
        if not sep:
            raise Refused(401, "the Basic credential is not base64 of user:password")
        credential = self.admin.current()
        if credential is None:
            raise Refused(401, f"no admin password is set on this node ({self.admin.path} is missing); "
                               f"use the CLI, or set one with `pairmq admin passwd`")
        key = self.cache.token(username, password.encode(), credential.record)
        if hmac.compare_digest(username.encode(), credential.username.encode()) and key in self.cache:
            return f"admin:{username}"
        if self._pending >= MAX_PENDING_CHECKS:
            self.counters["busy"] += 1
            raise Refused(429, "too many password checks in progress; try again in a second", 1)
        self._pending += 1
        try:
            ok = await asyncio.get_running_loop().run_in_executor(
                self._executor, verify_password, credential.record, password.encode())
        finally:
            self._pending -= 1
        # The user name is compared after the scrypt, so a wrong name costs what a wrong password costs.
        if ok and hmac.compare_digest(username.encode(), credential.username.encode()):
            self.cache.add(key)
            return f"admin:{username}"
        raise Refused(401, "wrong admin user name or password")


async def read_body(request: web.Request, timeout_s: float) -> bytes:
    """The whole body (aiohttp keeps it for the handler's own read), or 408 when it trickles in too slowly."""
    if not request.body_exists:
        return b""
    try:
        return await asyncio.wait_for(request.read(), timeout_s)
    except asyncio.TimeoutError:
        raise Refused(408, f"the request body did not arrive within {timeout_s:g} s") from None


def _check_browser_change(request: web.Request) -> None:
    """403 for a change that a page on another site could have made a browser send with its cached login."""
    if request.method in SAFE_METHODS:
        return
    if request.content_type != "application/json":
        raise Refused(403, "a change sent with the admin password must be Content-Type: application/json")
    own = f"{request.scheme}://{request.host}".lower()
    origin = request.headers.get("Origin", "")
    if origin.lower() != own:
        raise Refused(403, f"a change sent with the admin password needs the header Origin: {own} "
                           f"(this one came {'from ' + origin[:100] if origin else 'without one'})")


def require_key(request: web.Request, what: str) -> None:
    """For routes only the group's key may use (password records, secret rotation): 403 for the browser admin."""
    if request.get(PRINCIPAL) != KEY_PRINCIPAL:
        raise web.HTTPForbidden(reason=f"{what} needs the group's management key (the CLI on a host that holds "
                                       f"the group secret); the admin password is not enough")


def auth_middleware(auth: ApiAuth):
    @web.middleware
    async def authenticate(request: web.Request, handler):
        try:
            request[PRINCIPAL] = await auth.check(request)
        except Refused as exc:
            headers = {"Retry-After": str(exc.retry_after_s)} if exc.retry_after_s else {}
            response = web.json_response({"error": str(exc)}, status=exc.status, headers=headers)
            if exc.status == 401:
                for challenge in CHALLENGES:
                    response.headers.add("WWW-Authenticate", challenge)
            return response
        return await handler(request)

    return authenticate

"""Who may use the management API: one aiohttp middleware in front of every route.

Rules:
- Every request needs a credential, reads included, and routes added later
  (metrics, the status page, event streams) are covered without naming them:
  the middleware runs before routing's own answers, so an unknown path
  without a credential is a 401 too and routes cannot be probed.
- Two credentials: `Authorization: Bearer <token>` with the token derived
  from the group secret (what the CLI sends: an operator on a host that can
  read the secret just works), or HTTP Basic with the admin user's password
  (appliance/admin_credential.py; what a browser sends to the status page).
- A missing or wrong credential is a 401 JSON error with WWW-Authenticate
  challenges for both schemes (Basic first, so a browser shows its prompt).
- Wrong credentials are counted per client address (`FailureLimiter`; a
  request without any is not a guess, it is how a browser starts): past
  `max_failures` within `window_ms`, that address gets 429 with Retry-After
  until the window ends, and no credential of its is checked at all. The
  table is bounded (`max_addresses`, oldest entry out first).
- scrypt (~50 ms) never runs on the event loop: one thread verifies; a
  password that verified is remembered (keyed hash, bounded cache), so a
  browser's Basic header on every request costs one scrypt; at most
  `MAX_PENDING_CHECKS` checks wait at once, the rest get 429.
- The limiter is sans-I/O: time is passed in.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import collections
import dataclasses
import hmac
import secrets
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from aiohttp import web

from .admin_credential import AdminFile
from .broker.access import VerifiedCache, verify_password

MAX_PENDING_CHECKS = 8
MAX_HEADER_CHARS = 4096
PRINCIPAL = web.RequestKey("principal", str)  # "token" or "admin:<user>", for handlers that care who asked
CHALLENGES = ('Basic realm="PairMQ management", charset="UTF-8"', 'Bearer realm="PairMQ management"')


@dataclasses.dataclass(slots=True)
class _Failures:
    first_ms: int
    count: int


class FailureLimiter:
    """Failed attempts per client address within a fixed window; bounded memory."""

    def __init__(self, max_failures: int = 10, window_ms: int = 60_000, max_addresses: int = 10_000) -> None:
        assert max_failures >= 1 and window_ms >= 1 and max_addresses >= 1
        self.max_failures = max_failures
        self.window_ms = window_ms
        self.max_addresses = max_addresses
        self._table: collections.OrderedDict[str, _Failures] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._table)

    def retry_after_ms(self, address: str, now_ms: int) -> int | None:
        """How long `address` must wait before it may try again, None if it may try now."""
        entry = self._table.get(address)
        if entry is None:
            return None
        if now_ms - entry.first_ms >= self.window_ms:
            del self._table[address]
            return None
        if entry.count >= self.max_failures:
            return entry.first_ms + self.window_ms - now_ms
        return None

    def failed(self, address: str, now_ms: int) -> None:
        entry = self._table.get(address)
        if entry is None or now_ms - entry.first_ms >= self.window_ms:
            self._table[address] = _Failures(now_ms, 1)
        else:
            entry.count += 1
        self._table.move_to_end(address)
        while len(self._table) > self.max_addresses:
            self._table.popitem(last=False)

    def succeeded(self, address: str) -> None:
        self._table.pop(address, None)


class Refused(Exception):
    def __init__(self, status: int, message: str, retry_after_s: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after_s = retry_after_s


class ApiAuth:
    def __init__(self, tokens: str | Callable[[], list[str]], admin: AdminFile,
                 limiter: FailureLimiter | None = None) -> None:
        """`tokens`: the bearer tokens accepted now (a node holds two keys during a secret rotation)."""
        self.tokens = tokens if callable(tokens) else (lambda: [tokens])
        self.admin = admin
        self.limiter = limiter if limiter is not None else FailureLimiter()
        self.cache = VerifiedCache(secrets.token_bytes(32), 64)
        self.counters: collections.Counter[str] = collections.Counter()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pairmq-api-scrypt")
        self._pending = 0

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    def view(self) -> dict:
        return {"limited_addresses": len(self.limiter), "admin_file": str(self.admin.path),
                "admin_configured": self.admin.credential is not None, "admin_file_problem": self.admin.problem,
                **self.counters}

    async def check(self, request: web.Request) -> str:
        """The principal ("token" or "admin:<user>"), or raises Refused."""
        address = request.remote or "?"
        now = time.monotonic_ns() // 1_000_000
        wait_ms = self.limiter.retry_after_ms(address, now)
        if wait_ms is not None:
            self.counters["rate_limited"] += 1
            seconds = max(1, -(-wait_ms // 1000))
            raise Refused(429, f"too many failed authentication attempts from {address}; "
                               f"try again in {seconds} s", seconds)
        try:
            principal = await self._verify(request.headers.get("Authorization"))
        except Refused as exc:
            if exc.status == 401:
                self.counters["refused"] += 1
                if request.headers.get("Authorization"):
                    self.limiter.failed(address, time.monotonic_ns() // 1_000_000)
            raise
        self.limiter.succeeded(address)
        self.counters["accepted"] += 1
        return principal

    async def _verify(self, header: str | None) -> str:
        if not header:
            raise Refused(401, "authentication required: send the admin user's password (HTTP Basic) "
                               "or the group's management token (Authorization: Bearer)")
        if len(header) > MAX_HEADER_CHARS:
            raise Refused(401, "the Authorization header is too long")
        scheme, _, value = header.partition(" ")
        scheme, value = scheme.lower(), value.strip()
        if scheme == "bearer":
            if any(hmac.compare_digest(value.encode(), token.encode()) for token in self.tokens()):
                return "token"
            raise Refused(401, "the bearer token is not this group's management token")
        if scheme == "basic":
            return await self._basic(value)
        raise Refused(401, f"unsupported authentication scheme {scheme[:20]!r}; use Basic or Bearer")

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
                               f"use the bearer token, or set one with `pairmq admin passwd`")
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

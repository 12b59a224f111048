"""The CONNECT credential check: the asyncio adapter around `access.AccessPolicy`.

Rules (the policy's own rules are in access.py):
- scrypt never runs on the event loop: it runs in a small thread pool
  (`SCRYPT_THREADS`; hashlib.scrypt releases the GIL, so the loop keeps
  serving while it runs). At most that many run at once; the rest wait.
- A credential that verified is remembered (`VerifiedCache`, bounded, keyed
  by an HMAC under a per-process random key): a reconnect storm of one
  client, or of many sharing an account, costs one scrypt per distinct
  (user, password). Concurrent checks of the same credential share one
  scrypt. Failures are not cached.
- The cache is the fast path: a cached credential is accepted without
  waiting for, or being counted by, anything below.
- An uncached check is budgeted (login_throttle.py: per source address and
  per user name, only failures spent); over budget it is refused at once
  with "server busy" (v5 0x89, 3.1.1 return code 3: the client retries
  later; it learns nothing about the password).
- The scrypt work waits in one queue per source address, served round-robin:
  a flooding address delays another address's check by at most one check per
  other waiting address, so a legitimate first login (after a failover
  nothing is cached) gets its turn at once.
- A CONNECT whose user name is a verified TLS client certificate's identity
  (`check_certified`, tls.use_identity_as_username) skips the password: the
  identity must be a user of the access file, and the checks below apply.
- Last, the session's owner (core.py): another user's client id is refused
  with "not authorized" (v5 0x87, 3.1.1 return code 5).
- The policy is replaced whole (`policy = ...`, on reload); a check uses the
  policy it started with.
- Every refusal is counted by reason in `counters`.
"""

from __future__ import annotations

import asyncio
import collections
import secrets
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from ..mqtt.codec import Connect
from ..mqtt.wire import ReasonCode
from .access import DEFAULT_CACHE_ENTRIES, AccessPolicy, VerifiedCache, verify_password
from .login_throttle import LoginThrottle

SCRYPT_THREADS = 2
BAD_CREDENTIALS = "bad user name or password"
OwnerRefusal = Callable[[str, "str | None"], "str | None"]  # (client id, user) -> why refused, or None


class Authenticator:
    def __init__(self, policy: AccessPolicy, *, note: str = "", cache_entries: int = DEFAULT_CACHE_ENTRIES,
                 threads: int = SCRYPT_THREADS, per_address_per_min: int = 30, per_user_per_min: int = 30,
                 owner_refusal: OwnerRefusal | None = None) -> None:
        self.policy = policy
        self.note = note  # appended to anonymous refusals, e.g. "no access file at ..."
        self.cache = VerifiedCache(secrets.token_bytes(32), cache_entries)
        self.counters: collections.Counter[str] = collections.Counter()
        self.throttle = LoginThrottle(per_address_per_min, per_user_per_min)
        self._owner_refusal = owner_refusal
        self._threads = threads
        self._executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="pairmq-scrypt")
        self._pending: dict[bytes, asyncio.Future] = {}
        self._waiting: collections.OrderedDict[str, collections.deque] = collections.OrderedDict()  # address -> jobs
        self._running = 0

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def check(self, c: Connect, peer: str = "?") -> tuple[ReasonCode, str] | None:
        """None to accept the CONNECT, else (reason code, reason string) to refuse it with."""
        policy = self.policy
        username = c.username
        if username is None and c.password is not None:  # v5 allows it; we have nobody to check it against
            self.counters["bad_credentials"] += 1
            return ReasonCode.BAD_USER_NAME_OR_PASSWORD, "a password without a user name"
        if username is None:
            why = policy.anonymous_refusal()
            if why is not None:
                self.counters["anonymous_refused"] += 1
                return ReasonCode.NOT_AUTHORIZED, why + (f" ({self.note})" if self.note else "")
        else:
            verdict = await self._verify(policy, username, c.password or b"", address_of(peer))
            if verdict is not None:
                return verdict
        return self._after_credentials(policy, c, username)

    async def check_certified(self, c: Connect, peer: str = "?") -> tuple[ReasonCode, str] | None:
        """`check` for a CONNECT whose user name is its client certificate's identity (None: it had none)."""
        policy = self.policy
        username = c.username
        if username is None:
            self.counters["bad_credentials"] += 1
            return ReasonCode.NOT_AUTHORIZED, "the client certificate names no identity"
        if username not in policy.users:
            self.counters["bad_credentials"] += 1
            return ReasonCode.NOT_AUTHORIZED, f"certificate identity {username[:100]!r} is not a user"
        return self._after_credentials(policy, c, username)

    def _after_credentials(self, policy: AccessPolicy, c: Connect, username: str | None) -> tuple[ReasonCode, str] | None:
        if c.will is not None and not policy.authorize(username, "publish", c.will.topic):
            self.counters["will_not_authorized"] += 1
            return ReasonCode.NOT_AUTHORIZED, f"not authorized to publish the will to {c.will.topic[:100]}"
        if self._owner_refusal is not None and c.client_id:
            why = self._owner_refusal(c.client_id, username)
            if why is not None:
                self.counters["session_owner_refused"] += 1
                return ReasonCode.NOT_AUTHORIZED, why
        self.counters["accepted"] += 1
        return None

    async def _verify(self, policy: AccessPolicy, username: str, password: bytes,
                      address: str) -> tuple[ReasonCode, str] | None:
        record = policy.record_for(username)
        token = self.cache.token(username, password, record)
        if username in policy.users and token in self.cache:
            self.counters["cache_hits"] += 1
            return None
        future = self._pending.get(token)
        if future is None:
            why = self.throttle.take(address, username, time.monotonic())
            if why is not None:
                self.counters["login_throttled"] += 1
                return ReasonCode.SERVER_BUSY, why
            self.counters["scrypt_runs"] += 1
            future = self._queue(address, record, password)
            self._pending[token] = future
            future.add_done_callback(lambda f: self._done(token, f, username in policy.users, address, username))
        else:
            self.counters["shared_scrypt"] += 1
        # Shielded: one waiter going away (its client hung up) must not cancel the others' scrypt.
        if await asyncio.shield(future):
            return None
        self.counters["bad_credentials"] += 1
        return ReasonCode.BAD_USER_NAME_OR_PASSWORD, BAD_CREDENTIALS

    def _queue(self, address: str, record, password: bytes) -> asyncio.Future:
        future = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(address, collections.deque()).append((record, password, future))
        self._dispatch()
        return future

    def _dispatch(self) -> None:
        """Start queued checks while a thread is free, one address at a time in turn (see the rules)."""
        loop = asyncio.get_running_loop()
        while self._running < self._threads and self._waiting:
            address, jobs = next(iter(self._waiting.items()))
            record, password, future = jobs.popleft()
            if jobs:
                self._waiting.move_to_end(address)
            else:
                del self._waiting[address]
            self._running += 1
            work = loop.run_in_executor(self._executor, verify_password, record, password)
            work.add_done_callback(lambda w, f=future: self._ran(w, f))

    def _ran(self, work: asyncio.Future, future: asyncio.Future) -> None:
        self._running -= 1
        if not future.done():
            if work.cancelled():
                future.cancel()
            elif work.exception() is not None:
                future.set_exception(work.exception())
            else:
                future.set_result(work.result())
        self._dispatch()

    def _done(self, token: bytes, future: asyncio.Future, user_exists: bool, address: str, username: str) -> None:
        self._pending.pop(token, None)
        if user_exists and not future.cancelled() and future.exception() is None and future.result():
            self.cache.add(token)
            self.throttle.refund(address, username, time.monotonic())

    def view(self) -> dict:
        policy = self.policy
        return {"allow_anonymous": policy.allow_anonymous, "users": len(policy.users), "acl_rules": len(policy.rules),
                "cached_credentials": len(self.cache), "login_throttle": self.throttle.view(),
                "checks_waiting": sum(len(jobs) for jobs in self._waiting.values()), **self.counters}


def address_of(peer: str) -> str:
    """The source address of a peer written `host:port` or `[v6]:port` (mqtt/connection.py)."""
    host = peer.rsplit(":", 1)[0] if ":" in peer else peer
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host

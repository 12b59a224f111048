"""The CONNECT credential check: the asyncio adapter around `access.AccessPolicy`.

Rules (the policy's own rules are in access.py):
- scrypt never runs on the event loop: it runs in a small thread pool
  (`SCRYPT_THREADS`; hashlib.scrypt releases the GIL, so the loop keeps
  serving while it runs). At most that many run at once; the rest wait.
- A credential that verified is remembered (`VerifiedCache`, bounded, keyed
  by an HMAC under a per-process random key): a reconnect storm of one
  client, or of many sharing an account, costs one scrypt per distinct
  (user, password). Concurrent checks of the same credential share one
  scrypt. Failures are not cached: a wrong guess always costs the guesser a
  wait behind the pool.
- The policy is replaced whole (`policy = ...`, on reload); a check uses the
  policy it started with.
- Every refusal is counted by reason in `counters`.
"""

from __future__ import annotations

import asyncio
import collections
import secrets
from concurrent.futures import ThreadPoolExecutor

from ..mqtt.codec import Connect
from ..mqtt.wire import ReasonCode
from .access import DEFAULT_CACHE_ENTRIES, AccessPolicy, VerifiedCache, verify_password

SCRYPT_THREADS = 2
BAD_CREDENTIALS = "bad user name or password"


class Authenticator:
    def __init__(self, policy: AccessPolicy, *, note: str = "", cache_entries: int = DEFAULT_CACHE_ENTRIES,
                 threads: int = SCRYPT_THREADS) -> None:
        self.policy = policy
        self.note = note  # appended to anonymous refusals, e.g. "no access file at ..."
        self.cache = VerifiedCache(secrets.token_bytes(32), cache_entries)
        self.counters: collections.Counter[str] = collections.Counter()
        self._executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="pairmq-scrypt")
        self._pending: dict[bytes, asyncio.Future] = {}

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def check(self, c: Connect) -> tuple[ReasonCode, str] | None:
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
        elif not await self._verify(policy, username, c.password or b""):
            self.counters["bad_credentials"] += 1
            return ReasonCode.BAD_USER_NAME_OR_PASSWORD, BAD_CREDENTIALS
        if c.will is not None and not policy.authorize(username, "publish", c.will.topic):
            self.counters["will_not_authorized"] += 1
            return ReasonCode.NOT_AUTHORIZED, f"not authorized to publish the will to {c.will.topic[:100]}"
        self.counters["accepted"] += 1
        return None

    async def _verify(self, policy: AccessPolicy, username: str, password: bytes) -> bool:
        record = policy.record_for(username)
        token = self.cache.token(username, password, record)
        if username in policy.users and token in self.cache:
            self.counters["cache_hits"] += 1
            return True
        future = self._pending.get(token)
        if future is None:
            self.counters["scrypt_runs"] += 1
            future = asyncio.get_running_loop().run_in_executor(self._executor, verify_password, record, password)
            self._pending[token] = future
            future.add_done_callback(lambda f: self._done(token, f, username in policy.users))
        else:
            self.counters["shared_scrypt"] += 1
        # Shielded: one waiter going away (its client hung up) must not cancel the others' scrypt.
        return await asyncio.shield(future)

    def _done(self, token: bytes, future: asyncio.Future, user_exists: bool) -> None:
        self._pending.pop(token, None)
        if user_exists and not future.cancelled() and future.exception() is None and future.result():
            self.cache.add(token)

    def view(self) -> dict:
        policy = self.policy
        return {"allow_anonymous": policy.allow_anonymous, "users": len(policy.users), "acl_rules": len(policy.rules),
                "cached_credentials": len(self.cache), **self.counters}

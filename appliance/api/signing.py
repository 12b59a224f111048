"""Signed management requests: what the CLI and a node's status fan-out send instead of a bearer token.

Rules:
- The key is the management key derived from the group secret (`keyring.management_key`); it never travels.
  Each request carries `Authorization: PairMQ-HMAC ts=<unix ms>, nonce=<32 hex>, sig=<64 hex>`, the
  signature an HMAC-SHA256 over the scheme's version, the method, the `host:port` the request is sent
  to, the path with its query, the SHA-256 of the body, the timestamp and the nonce. A captured request
  therefore authorizes that one request to that one node, nothing else.
- Checks run cheapest first (as the heartbeats' do): malformed -> stale (outside the timestamp window
  either side of this node's clock) -> bad MAC under every key held (constant time) -> replayed (the
  nonce was seen inside the window). The nonce is remembered only after the MAC verified, so forged
  requests cannot fill the table; nonces older than the window are forgotten, since the timestamp check
  refuses their requests anyway. The table is bounded: when full of live nonces a request is refused
  (only a key holder can fill it, and only at a rate the window bounds).
- Sans-I/O: the wall clock (`now_ms`) and the nonce's randomness are passed in.
"""

from __future__ import annotations

import collections
import hashlib
import hmac
import re

SCHEME = "PairMQ-HMAC"
VERSION = b"pairmq-management-request/v1"
WINDOW_MS = 60_000  # either side: the hosts' clocks are NTP-synced, far closer than this
MAX_NONCES = 100_000
_HEADER = re.compile(r"ts=(\d{1,15}), nonce=([0-9a-f]{32}), sig=([0-9a-f]{64})")


class SignatureRefused(Exception):
    """The request is not a valid, fresh, unreplayed signed request; the message says which check failed."""


def _mac(key: bytes, method: str, host: str, path: str, body: bytes, ts_ms: int, nonce: str) -> str:
    message = b"\n".join([VERSION, method.upper().encode(), host.lower().encode(), path.encode(),
                          hashlib.sha256(body).hexdigest().encode(), str(ts_ms).encode(), nonce.encode()])
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def sign(key: bytes, method: str, host: str, path: str, body: bytes, now_ms: int, nonce: bytes) -> str:
    """The Authorization header value for one request; `nonce` is 16 random bytes."""
    assert len(nonce) == 16
    ts, hex_nonce = now_ms, nonce.hex()
    return f"{SCHEME} ts={ts}, nonce={hex_nonce}, sig={_mac(key, method, host, path, body, ts, hex_nonce)}"


class Verifier:
    """One node's check of signed requests, with the nonces it has accepted inside the window."""

    def __init__(self, window_ms: int = WINDOW_MS, max_nonces: int = MAX_NONCES) -> None:
        self.window_ms = window_ms
        self.max_nonces = max_nonces
        self._seen: collections.OrderedDict[str, int] = collections.OrderedDict()  # nonce -> its ts, oldest first

    def __len__(self) -> int:
        return len(self._seen)

    def verify(self, credential: str, keys: list[bytes], method: str, hosts: set[str], host: str, path: str,
               body: bytes, now_ms: int) -> None:
        """`credential`: the header's value after the scheme; `hosts`: the names this node answers to.
        Raises SignatureRefused, else the request is authentic and its nonce is now spent."""
        match = _HEADER.fullmatch(credential.strip())
        if match is None:
            raise SignatureRefused("the signed request's Authorization is not ts=, nonce=, sig=")
        ts, nonce, sig = int(match[1]), match[2], match[3]
        if abs(now_ms - ts) > self.window_ms:
            raise SignatureRefused(f"the signed request's timestamp is {abs(now_ms - ts) // 1000} s away from this "
                                   f"node's clock (at most {self.window_ms // 1000} s): check the hosts' NTP")
        if host.lower() not in hosts:
            raise SignatureRefused("the signed request was made for another node")
        if not any(hmac.compare_digest(_mac(k, method, host, path, body, ts, nonce), sig) for k in keys):
            raise SignatureRefused("the request's signature does not verify under this group's management key")
        self._forget(now_ms)
        if nonce in self._seen:
            raise SignatureRefused("the signed request was already used (a replay)")
        if len(self._seen) >= self.max_nonces:
            raise SignatureRefused("too many signed requests inside the replay window; try again shortly")
        self._seen[nonce] = ts
        self._seen.move_to_end(nonce)

    def _forget(self, now_ms: int) -> None:
        # Oldest inserted first; a nonce's ts may be up to a window in the future, so only drop what is surely old.
        while self._seen:
            nonce, ts = next(iter(self._seen.items()))
            if now_ms - ts <= self.window_ms:
                break
            del self._seen[nonce]

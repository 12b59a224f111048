"""How many password checks a source address and a user name may start: token buckets, sans-I/O.

Rules:
- Each source address and each user name has a bucket holding a minute's
  worth of checks (`per_min`), refilled continuously. Starting an uncached
  check (one scrypt) takes a token from both; a check that succeeds gives
  them back, so only failures are spent.
- An empty address bucket refuses at once. An empty user bucket refuses only
  addresses that have spent tokens themselves (their bucket is not full):
  a flood aimed at alice's name from elsewhere cannot lock alice out of a
  fresh address, which is where her first login after a failover comes from.
- Credentials already verified (the cache in authn.py) never reach here.
- Bounded: at most `max_keys` buckets of each kind; the least recently used
  goes first (a forgotten bucket is a full one, which only favours it).
"""

from __future__ import annotations

import collections

MAX_KEYS = 10_000


class LoginThrottle:
    def __init__(self, per_address_per_min: int, per_user_per_min: int, max_keys: int = MAX_KEYS) -> None:
        self.per_address_per_min = per_address_per_min
        self.per_user_per_min = per_user_per_min
        self.max_keys = max_keys
        self._addresses: collections.OrderedDict[str, tuple[float, float]] = collections.OrderedDict()
        self._users: collections.OrderedDict[str, tuple[float, float]] = collections.OrderedDict()

    def take(self, address: str, username: str, now_s: float) -> str | None:
        """Spend one check for (address, user); the refusal's sentence when over budget (nothing spent)."""
        a_rate, u_rate = self.per_address_per_min, self.per_user_per_min
        a = _level(self._addresses, address, a_rate, now_s)
        if a < 1:
            return (f"too many failed logins from {address}; retry in {_wait_s(a, a_rate)} s")
        u = _level(self._users, username, u_rate, now_s)
        if u < 1 and a < a_rate:
            return f"too many failed logins for this user name; retry in {_wait_s(u, u_rate)} s"
        _put(self._addresses, address, a - 1, now_s, self.max_keys)
        _put(self._users, username, max(u - 1, 0.0), now_s, self.max_keys)
        return None

    def refund(self, address: str, username: str, now_s: float) -> None:
        """The check succeeded: its tokens come back."""
        for table, key, rate in ((self._addresses, address, self.per_address_per_min),
                                 (self._users, username, self.per_user_per_min)):
            if key in table:
                _put(table, key, min(rate, _level(table, key, rate, now_s) + 1), now_s, self.max_keys)

    def view(self) -> dict:
        return {"per_address_per_min": self.per_address_per_min, "per_user_per_min": self.per_user_per_min,
                "addresses_tracked": len(self._addresses), "users_tracked": len(self._users)}


def _level(table: collections.OrderedDict, key: str, rate: int, now_s: float) -> float:
    entry = table.get(key)
    if entry is None:
        return float(rate)
    tokens, at = entry
    return min(float(rate), tokens + max(0.0, now_s - at) * rate / 60.0)


def _put(table: collections.OrderedDict, key: str, tokens: float, now_s: float, max_keys: int) -> None:
    table[key] = (tokens, now_s)
    table.move_to_end(key)
    while len(table) > max_keys:
        table.popitem(last=False)


def _wait_s(tokens: float, rate: int) -> int:
    return max(1, int((1 - tokens) * 60 / rate + 0.999))

"""The front door's budget for unauthenticated bytes: what a peer may hold before its CONNECT is through.

Rules:

- A connection is *pre-auth* from the moment it is accepted until its CONNECT
  has arrived whole, or it closes: the state in which a stranger makes us
  buffer bytes. A whole CONNECT leaves it: its socket is not read while the
  CONNECT waits in the listener's queue or for its credential check, which
  have their own bounds (`connect_queue_size`, `max_connections`,
  `max_connect_checks`). Legitimate clients leave it within a round trip, so
  a reconnect storm from one address (a NAT, a load test) is not refused.
- At most `max_connections` pre-auth connections in total; once half of
  them are in use, at most `max_per_address` from one source address. One
  past a cap is closed at once (nothing was read from it, so there is no
  protocol version to answer in) and counted. The per-address cap waits for
  that pressure because a whole storm from one address (a NAT, a load test)
  is accepted before any CONNECT is read; under pressure it keeps one
  address from taking the other half.
- The bytes buffered by every pre-auth connection together stay within
  `max_bytes`; the connection whose read would pass it is closed. With the
  codec's own cap (one CONNECT is at most `max_connect_bytes`, refused from
  its fixed header) this bounds the memory strangers can make us hold.
- Each connection also has a deadline (the listener's connect timeout): no
  complete CONNECT in time, it is closed.

Theory of operation: the listener calls `open(address)` on accept, `hold(delta)`
as a pre-auth connection's buffered bytes change, and `close(address, held)`
when it is admitted or gone. No I/O, no clock.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True, slots=True)
class PreAuthLimits:
    max_connect_bytes: int = 128 * 1024  # a 64 KiB will payload plus client id, user name and password fits
    max_connect_properties: int = 128  # per property block of a CONNECT (User Properties counted each)
    max_connections: int = 40_000  # twice the clients that may be connected: a storm gets CONNACK 0x89, not a close
    max_per_address: int = 1_000
    max_bytes: int = 64 * 1024 * 1024

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{field.name} must be a positive integer, got {value!r}")


class PreAuthBudget:
    __slots__ = ("limits", "connections", "by_address", "bytes", "refused_total", "refused_address",
                 "refused_bytes")

    def __init__(self, limits: PreAuthLimits = PreAuthLimits()) -> None:
        self.limits = limits
        self.connections = 0
        self.by_address: dict[str, int] = {}
        self.bytes = 0
        self.refused_total = 0  # over max_connections
        self.refused_address = 0  # over max_per_address
        self.refused_bytes = 0  # over max_bytes

    def open(self, address: str) -> str | None:
        """Count a new connection from `address`; a refusal's reason instead when a cap is reached."""
        limits = self.limits
        if self.connections >= limits.max_connections:
            self.refused_total += 1
            return (f"{self.connections} connections have not finished CONNECT "
                    f"(limit {limits.max_connections})")
        here = self.by_address.get(address, 0)
        if here >= limits.max_per_address and self.connections >= limits.max_connections // 2:
            self.refused_address += 1
            return (f"{here} connections from {address} have not finished CONNECT "
                    f"(limit {limits.max_per_address} per address)")
        self.by_address[address] = here + 1
        self.connections += 1
        return None

    def hold(self, delta: int) -> bool:
        """A pre-auth connection now buffers `delta` bytes more (or fewer); False: the total is over the cap."""
        self.bytes += delta
        if delta > 0 and self.bytes > self.limits.max_bytes:
            self.refused_bytes += 1
            return False
        return True

    def close(self, address: str, held: int) -> None:
        """A connection `open` counted is admitted or gone; it held `held` bytes."""
        self.bytes -= held
        self.connections -= 1
        left = self.by_address[address] - 1
        if left:
            self.by_address[address] = left
        else:
            del self.by_address[address]  # bounded by the open connections, not by every address ever seen

    def view(self) -> dict[str, int]:
        return {"preauth_connections": self.connections, "preauth_bytes": self.bytes,
                "preauth_refused_total": self.refused_total, "preauth_refused_address": self.refused_address,
                "preauth_refused_bytes": self.refused_bytes}


def preauth_from_config(limits) -> PreAuthLimits:
    """The front door's pre-auth limits from the replicated limits (`appliance.config.Limits`)."""
    return PreAuthLimits(max_connect_bytes=limits.mqtt_connect_max_bytes,
                         max_connect_properties=limits.mqtt_connect_max_properties,
                         max_connections=limits.mqtt_preauth_max_connections,
                         max_per_address=limits.mqtt_preauth_max_per_address,
                         max_bytes=limits.mqtt_preauth_max_bytes)

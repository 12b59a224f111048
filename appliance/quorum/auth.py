"""Heartbeat authentication (keepalived's order, made explicit).

Rules, checked cheapest first; a rejected datagram changes nothing but its
reason's counter:
  1. malformed      layout, version, type, lengths, roles (no crypto yet)
  2. foreign_group  the group name is not ours
  3. stale          from an older boot (incarnation) of that sender than one we
                    already accepted
  4. bad_mac        HMAC-SHA256 tag does not verify (constant-time compare)
  5. replayed       (incarnation, seq) not newer than the last accepted one
  6. unconfirmed    since our own boot nothing from that sender has been
                    accepted yet, and this datagram does not echo our current
                    incarnation: it may be a recording from before our restart
Only after 4, 5 and 6 pass does the replay mark move.

Why rule 6: the replay marks live in memory, so a restarted receiver would take
a recording of a dead peer's heartbeats as live (its activity claims would stop
the standby from bidding and the monitor from voting). Our incarnation is a
boot nonce the peers learn from our heartbeats: a sender's first datagram that
counts after our boot must echo it, which no recording made before the boot
can. Until then its authentic datagrams are only noted (`unconfirmed`) so that
we can echo its incarnation in turn: two peers that restart together would
otherwise each wait for the other.

Keys: HKDF-SHA256 from the group secret, one per (group, protocol version,
sender role, message type), so a datagram cannot be re-labelled as coming from
another role or group. A key id lets a rotation accept old and new secrets.
"""

from __future__ import annotations

import collections
import dataclasses
import hmac

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from ..errors import RemoteProtocolError
from ..roles import Role
from . import wire

REASONS = ("malformed", "foreign_group", "stale", "bad_mac", "replayed", "unconfirmed")


class Rejected(RemoteProtocolError):
    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


def derive_key(secret: bytes, group: str, role: Role, message_type: int = wire.TYPE_HEARTBEAT) -> bytes:
    info = b"pairmq/heartbeat/v%d/%s/%s/%d" % (wire.VERSION, group.encode(), role.value.encode(), message_type)
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=b"pairmq-group-secret", info=info).derive(secret)


@dataclasses.dataclass(slots=True)
class _Mark:
    incarnation: int = 0
    seq: int = 0
    confirmed: bool = False  # something of this sender's echoing our current boot was accepted


class HeartbeatAuth:
    """Seals our heartbeats and opens our peers', keeping replay marks and counters."""

    def __init__(self, secret: bytes | dict[int, bytes], group: str, role: Role, *, send_key_id: int = 0) -> None:
        secrets = secret if isinstance(secret, dict) else {0: secret}
        self.group = group
        self.role = role
        self.send_key_id = send_key_id
        self._group_bytes = group.encode()
        self._keys = {(kid, r): derive_key(s, group, r) for kid, s in secrets.items() for r in Role}
        assert (send_key_id, role) in self._keys, "no key for the key id we send with"
        self._marks = {r: _Mark() for r in role.peers()}
        self.rejected: collections.Counter[str] = collections.Counter({r: 0 for r in REASONS})
        self.accepted = 0
        # our own boot incarnation, set by the core once known; None (bare auth in unit tests) skips rule 6
        self.incarnation: int | None = None
        # rule 6: the latest authentic (incarnation, seq) per sender not yet confirmed, for echoing only
        self.unconfirmed: dict[Role, tuple[int, int]] = {}

    def seal(self, hb: wire.Heartbeat) -> bytes:
        body = wire.encode(hb, self.send_key_id)
        key = self._keys[(self.send_key_id, self.role)]
        return body + hmac.digest(key, body, "sha256")

    def open(self, data: bytes) -> wire.Heartbeat:
        """Return the verified heartbeat, or raise Rejected (and count it)."""
        try:
            return self._open(data)
        except Rejected as exc:
            self.rejected[exc.reason] += 1
            raise

    def _open(self, data: bytes) -> wire.Heartbeat:
        try:
            header = wire.peek_header(data)
        except wire.Malformed as exc:
            raise Rejected("malformed", str(exc)) from None
        if header.sender is self.role:
            raise Rejected("malformed", "claims to come from our own role")
        if header.group != self._group_bytes:
            raise Rejected("foreign_group", repr(header.group[:64]))
        mark = self._marks[header.sender]
        if header.incarnation < mark.incarnation:
            raise Rejected("stale", f"incarnation {header.incarnation} < {mark.incarnation}")
        key = self._keys.get((header.key_id, header.sender))
        if key is None:
            raise Rejected("bad_mac", f"unknown key id {header.key_id}")
        tag = hmac.digest(key, data[:header.body_end], "sha256")
        if not hmac.compare_digest(tag, data[header.body_end:]):
            raise Rejected("bad_mac")
        try:
            hb = wire.decode(data, header)
        except wire.Malformed as exc:  # authentic but nonsensical: a peer bug, still refused
            raise Rejected("malformed", str(exc)) from None
        if (hb.incarnation, hb.seq) <= (mark.incarnation, mark.seq):
            raise Rejected("replayed", f"seq {hb.seq} of incarnation {hb.incarnation}")
        if not mark.confirmed and self.incarnation is not None:
            mine = hb.view_of(self.role)
            if mine is None or mine.incarnation != self.incarnation:
                if (hb.incarnation, hb.seq) > self.unconfirmed.get(hb.sender, (0, 0)):
                    self.unconfirmed[hb.sender] = (hb.incarnation, hb.seq)
                raise Rejected("unconfirmed", f"incarnation {hb.incarnation} of {hb.sender.value} does not echo "
                                              f"our incarnation {self.incarnation} yet")
            mark.confirmed = True
            self.unconfirmed.pop(hb.sender, None)
        mark.incarnation, mark.seq = hb.incarnation, hb.seq
        self.accepted += 1
        return hb

    def add_key(self, key_id: int, secret: bytes) -> None:
        for r in Role:
            self._keys[(key_id, r)] = derive_key(secret, self.group, r)

    def retire_key(self, key_id: int) -> None:
        assert key_id != self.send_key_id, "cannot retire the key we send with"
        for r in Role:
            self._keys.pop((key_id, r), None)

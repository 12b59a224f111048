"""Heartbeat datagram layout (UDP 8300), without authentication.

Rules:
- Big-endian, fixed layout: header, body, exactly two peer views, then a
  32-byte HMAC-SHA256 tag (added by `auth`). Anything else is malformed.
- The header carries what is needed before the MAC can be checked: protocol
  version, message type, sender role, key id, group name, and (first in the
  body) the sender's boot incarnation, so a datagram from an older boot can be
  refused as stale without computing a MAC.
- Times on the wire are durations ("heard 12 ms ago"), never clock readings:
  hosts' monotonic clocks share no origin.
- The records are made per datagram: explicit constructors (mypyc compiles them
  into a few stores), immutable by `Final` under the type checker rather than
  a runtime `frozen=True`; eq, repr and hash stay the dataclass's.
"""

from __future__ import annotations

import dataclasses
import enum
import struct
from typing import Final

from ..errors import RemoteProtocolError
from ..roles import Role

MAGIC = b"PQHB"
VERSION = 1
TYPE_HEARTBEAT = 1
TAG_BYTES = 32
NEVER_MS = 0xFFFFFFFF
MAX_GROUP_BYTES = 64

_HEADER = struct.Struct("!4sBBBBB")  # magic, version, type, sender, key id, group length
_BODY = struct.Struct("!QQQBBQQBQQQ")
_VIEW = struct.Struct("!BQQIIQQQ")
_BODY_AND_VIEWS = struct.Struct(_BODY.format + _VIEW.format[1:] * 2)  # decoded in one call ("!": no padding)

FLAG_MATE_IN_SYNC = 0x01  # active -> standby: you are in sync (echo-based lease)
FLAG_SELF_IN_SYNC = 0x02  # standby: I hold an in-sync lease from the active
FLAG_BID_FORCED = 0x04  # the bid skips the up-to-date proof (operator acknowledged data loss)
FLAG_REDUNDANCY_UP = 0x08
FLAG_YIELDED = 0x10  # a standby that handed its activity over at this epoch (appliance/quorum/handover.py)
_KNOWN_FLAGS = 0x1F


class Activity(enum.Enum):
    NONE = 0  # the monitor: never holds activity
    STANDBY = 1
    ACTIVE = 2


_ACTIVITIES = {a.value: a for a in Activity}  # by wire value: a dict look-up, not Enum's call machinery
_PEER_SETS = {r: frozenset(r.peers()) for r in Role}


@dataclasses.dataclass(slots=True, init=False, unsafe_hash=True)
class PeerView:
    """What the sender last heard from one of its peers."""

    role: Final[Role]
    incarnation: Final[int]
    seq: Final[int]  # the last sequence number heard from that peer (the echo)
    heard_ago_ms: Final[int]
    claim_ago_ms: Final[int]  # since that peer last claimed activity
    epoch: Final[int]
    spool_epoch: Final[int]
    spool_seq: Final[int]

    def __init__(self, role: Role, incarnation: int = 0, seq: int = 0, heard_ago_ms: int = NEVER_MS,
                 claim_ago_ms: int = NEVER_MS, epoch: int = 0, spool_epoch: int = 0, spool_seq: int = 0) -> None:
        self.role = role
        self.incarnation = incarnation
        self.seq = seq
        self.heard_ago_ms = heard_ago_ms
        self.claim_ago_ms = claim_ago_ms
        self.epoch = epoch
        self.spool_epoch = spool_epoch
        self.spool_seq = spool_seq


@dataclasses.dataclass(slots=True, init=False, unsafe_hash=True)
class Heartbeat:
    group: Final[str]
    sender: Final[Role]
    incarnation: Final[int]
    seq: Final[int]
    epoch: Final[int]
    activity: Final[Activity]
    views: Final[tuple[PeerView, PeerView]]
    flags: Final[int]
    bid_epoch: Final[int]
    vote_epoch: Final[int]
    vote_for: Final[Role | None]
    spool_epoch: Final[int]
    spool_seq: Final[int]
    config_version: Final[int]
    key_id: Final[int]

    def __init__(self, group: str, sender: Role, incarnation: int, seq: int, epoch: int, activity: Activity,
                 views: tuple[PeerView, PeerView], flags: int = 0, bid_epoch: int = 0, vote_epoch: int = 0,
                 vote_for: Role | None = None, spool_epoch: int = 0, spool_seq: int = 0, config_version: int = 0,
                 key_id: int = 0) -> None:
        self.group = group
        self.sender = sender
        self.incarnation = incarnation
        self.seq = seq
        self.epoch = epoch
        self.activity = activity
        self.views = views
        self.flags = flags
        self.bid_epoch = bid_epoch
        self.vote_epoch = vote_epoch
        self.vote_for = vote_for
        self.spool_epoch = spool_epoch
        self.spool_seq = spool_seq
        self.config_version = config_version
        self.key_id = key_id

    def view_of(self, role: Role) -> PeerView | None:
        for view in self.views:
            if view.role is role:
                return view
        return None

    def has(self, flag: int) -> bool:
        return bool(self.flags & flag)


class Malformed(RemoteProtocolError):
    pass


def encode(hb: Heartbeat, key_id: int | None = None) -> bytes:
    """`key_id`, when given, replaces the heartbeat's (the key the sender seals it with)."""
    group = hb.group.encode()
    assert len(group) <= MAX_GROUP_BYTES and len(hb.views) == 2
    parts = [
        _HEADER.pack(MAGIC, VERSION, TYPE_HEARTBEAT, hb.sender.wire_id, hb.key_id if key_id is None else key_id,
                     len(group)),
        group,
        _BODY.pack(
            hb.incarnation, hb.seq, hb.epoch, hb.activity.value, hb.flags, hb.bid_epoch, hb.vote_epoch,
            hb.vote_for.wire_id if hb.vote_for else 0, hb.spool_epoch, hb.spool_seq, hb.config_version,
        ),
    ]
    for v in hb.views:
        parts.append(_VIEW.pack(v.role.wire_id, v.incarnation, v.seq, v.heard_ago_ms, v.claim_ago_ms,
                                v.epoch, v.spool_epoch, v.spool_seq))
    return b"".join(parts)


@dataclasses.dataclass(slots=True, init=False, unsafe_hash=True)
class Header:
    sender: Final[Role]
    key_id: Final[int]
    group: Final[bytes]
    incarnation: Final[int]
    body_end: Final[int]  # offset where the MAC tag starts

    def __init__(self, sender: Role, key_id: int, group: bytes, incarnation: int, body_end: int) -> None:
        self.sender = sender
        self.key_id = key_id
        self.group = group
        self.incarnation = incarnation
        self.body_end = body_end


def encoded_size(group_len: int) -> int:
    return _HEADER.size + group_len + _BODY.size + 2 * _VIEW.size + TAG_BYTES


def peek_header(data: bytes) -> Header:
    """The cheap part of the checks: layout, version, type, roles. No MAC yet."""
    if len(data) < _HEADER.size:
        raise Malformed("shorter than a heartbeat header")
    magic, version, mtype, sender, key_id, group_len = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise Malformed("bad magic")
    if version != VERSION:
        raise Malformed(f"protocol version {version}, expected {VERSION}")
    if mtype != TYPE_HEARTBEAT:
        raise Malformed(f"unknown message type {mtype}")
    if group_len == 0 or group_len > MAX_GROUP_BYTES:
        raise Malformed("bad group name length")
    if len(data) != encoded_size(group_len):
        raise Malformed(f"length {len(data)}, expected {encoded_size(group_len)}")
    try:
        role = Role.from_wire(sender)
    except KeyError:
        raise Malformed(f"unknown sender role {sender}") from None
    group = data[_HEADER.size:_HEADER.size + group_len]
    incarnation = struct.unpack_from("!Q", data, _HEADER.size + group_len)[0]
    return Header(role, key_id, group, incarnation, len(data) - TAG_BYTES)


def decode(data: bytes, header: Header) -> Heartbeat:
    """Decode an authenticated datagram's body (layout already checked)."""
    f = _BODY_AND_VIEWS.unpack_from(data, _HEADER.size + len(header.group))
    (incarnation, seq, epoch, activity, flags, bid_epoch, vote_epoch, vote_for,
     spool_epoch, spool_seq, config_version) = f[:11]
    try:
        views = (PeerView(Role.from_wire(f[11]), *f[12:19]), PeerView(Role.from_wire(f[19]), *f[20:27]))
        hb = Heartbeat(
            group=header.group.decode(), sender=header.sender, incarnation=incarnation, seq=seq, epoch=epoch,
            activity=_ACTIVITIES[activity], views=views, flags=flags, bid_epoch=bid_epoch,
            vote_epoch=vote_epoch, vote_for=Role.from_wire(vote_for) if vote_for else None,
            spool_epoch=spool_epoch, spool_seq=spool_seq, config_version=config_version, key_id=header.key_id,
        )
    except (KeyError, ValueError) as exc:
        raise Malformed(f"bad field: {exc}") from None
    if flags & ~_KNOWN_FLAGS:
        raise Malformed(f"unknown flags {flags:#x}")
    if {views[0].role, views[1].role} != _PEER_SETS[hb.sender]:
        raise Malformed("peer views must name the sender's two peers")
    if hb.sender is Role.MONITOR and (hb.activity is not Activity.NONE or hb.bid_epoch):
        raise Malformed("the monitor cannot claim activity")
    if hb.sender is not Role.MONITOR and hb.activity is Activity.NONE:
        raise Malformed("a message-routing node must report its activity")
    if seq == 0 or incarnation == 0:
        raise Malformed("sequence numbers and incarnations start at 1")
    return hb

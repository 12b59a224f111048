"""What travels inside the mate link's sealed frames (mate_link/secure.py), sans-I/O.

Rules:
- Every message starts with its type (u8) and the sender's epoch (u64): the standby refuses
  anything from an epoch lower than one it has seen active (DESIGN §3 rule 3).
- Integers are big-endian and fixed-size. OPS carries commits exactly as the active's segment holds
  them (spool/records.py: op records, then the commit record with its epoch, seq and chained
  checksum), so the standby checks the chain itself and appends the same bytes.
- Decoding is strict: an unknown type, a short or over-long message, a count that does not match,
  a commit whose last record is not a sound commit record, or a body over its limit raises
  `MalformedMessage`; nothing is half-decoded. (The op records inside a commit are checked where
  they are applied: spool/writer.py `submit_commits`.)
- Compiled (docs/build.md): the standby decodes every frame of a catch-up here.

Messages:
  JOIN       standby → active  its spool head (epoch, seq, checksum) and boot incarnation
  PLAN       active → standby  how it catches up: IN_STEP, INCREMENTAL after `after_seq`, or SNAPSHOT;
                               `target` is the active's head when it decided; `bytes_to_go` the op
                               bodies' bytes of an INCREMENTAL catch-up (progress only, never trusted)
  OPS        active → standby  a batch of commits, in order, as written
  ACK        standby → active  every op up to `seq` is durable on the standby
  SNAPSHOT   active → standby  a batch of op bodies that rebuild the state from empty
                               (`last` marks the final batch, which carries the point to adopt);
                               `ops_total`/`bytes_total`: the whole snapshot's size (progress only)
  IMAGE      active → standby  a piece of the spool's file image (spool/image.py), at `offset`; a full
                               resync ships pages, not ops; `total`: the image's size (progress only)
  IMAGE_END  active → standby  the image is complete: its size, SHA-256 and the head it holds
  PING/PONG  either way        liveness, echoing the sender's time so the sender measures round trips
"""

from __future__ import annotations

import dataclasses
import enum
import struct
from collections.abc import Callable
from typing import Any

from pairmq.appliance.errors import RemoteProtocolError
from pairmq.appliance.spool.records import RecordError, commit_from_bytes
from pairmq.appliance.spool.chain import CHECKSUM_BYTES, ChainPoint, Commit

MAX_OP_BYTES = 2 * 1024 * 1024
MAX_COMMIT_BYTES = 16 * 1024 * 1024
MAX_BATCH_OPS = 65_535
MAX_IMAGE_CHUNK_BYTES = 4 * 1024 * 1024
DIGEST_BYTES = 32

_HEAD = struct.Struct(">BQ")
_POINT = struct.Struct(f">QQ{CHECKSUM_BYTES}s")
_U64 = struct.Struct(">Q")
_U32 = struct.Struct(">I")
_IMAGE_HEAD = struct.Struct(">QQI")


class MalformedMessage(RemoteProtocolError):
    """A mate link message that does not follow messages.py's layout."""


class Kind(enum.IntEnum):
    JOIN = 1
    PLAN = 2
    OPS = 3
    ACK = 4
    SNAPSHOT = 5
    PING = 6
    PONG = 7
    IMAGE = 8
    IMAGE_END = 9


class Catchup(enum.IntEnum):
    IN_STEP = 0
    INCREMENTAL = 1
    SNAPSHOT = 2


@dataclasses.dataclass(frozen=True, slots=True)
class Join:
    epoch: int
    head: ChainPoint
    incarnation: int


@dataclasses.dataclass(frozen=True, slots=True)
class Plan:
    epoch: int
    catchup: Catchup
    after_seq: int
    target: ChainPoint
    bytes_to_go: int = 0


@dataclasses.dataclass(frozen=True, slots=True)
class Ops:
    epoch: int
    commits: tuple[Commit, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class Ack:
    epoch: int
    seq: int


@dataclasses.dataclass(frozen=True, slots=True)
class Snapshot:
    epoch: int
    bodies: tuple[bytes, ...]
    last: ChainPoint | None = None  # set on the final batch: the point the standby's log continues from
    ops_total: int = 0  # the whole snapshot's ops and body bytes: the standby's progress, nothing else
    bytes_total: int = 0


@dataclasses.dataclass(frozen=True, slots=True)
class Image:
    epoch: int
    offset: int
    total: int
    data: bytes


@dataclasses.dataclass(frozen=True, slots=True)
class ImageEnd:
    epoch: int
    point: ChainPoint
    size: int
    digest: bytes


@dataclasses.dataclass(frozen=True, slots=True)
class Ping:
    epoch: int
    sent_ms: int


@dataclasses.dataclass(frozen=True, slots=True)
class Pong:
    epoch: int
    echoed_ms: int


Message = Join | Plan | Ops | Ack | Snapshot | Image | ImageEnd | Ping | Pong


def _point(p: ChainPoint) -> bytes:
    return _POINT.pack(p.epoch, p.seq, p.checksum)


def encode(m: Message) -> bytes:
    if isinstance(m, Join):
        return _HEAD.pack(Kind.JOIN, m.epoch) + _point(m.head) + _U64.pack(m.incarnation)
    if isinstance(m, Plan):
        return (_HEAD.pack(Kind.PLAN, m.epoch) + bytes([m.catchup]) + _U64.pack(m.after_seq) + _point(m.target)
                + _U64.pack(m.bytes_to_go))
    if isinstance(m, Ops):
        return _HEAD.pack(Kind.OPS, m.epoch) + _bodies(m.commits, lambda c: _U32.pack(len(c.data)) + c.data)
    if isinstance(m, Ack):
        return _HEAD.pack(Kind.ACK, m.epoch) + _U64.pack(m.seq)
    if isinstance(m, Snapshot):
        last = b"\x00" if m.last is None else b"\x01" + _point(m.last)
        return (_HEAD.pack(Kind.SNAPSHOT, m.epoch) + last + _U64.pack(m.ops_total) + _U64.pack(m.bytes_total)
                + _bodies(m.bodies, lambda b: _U32.pack(len(b)) + b))
    if isinstance(m, Image):
        if len(m.data) > MAX_IMAGE_CHUNK_BYTES:
            raise ValueError(f"a {len(m.data)}-byte image chunk (at most {MAX_IMAGE_CHUNK_BYTES})")
        return _HEAD.pack(Kind.IMAGE, m.epoch) + _IMAGE_HEAD.pack(m.offset, m.total, len(m.data)) + m.data
    if isinstance(m, ImageEnd):
        if len(m.digest) != DIGEST_BYTES:
            raise ValueError(f"a {len(m.digest)}-byte image digest ({DIGEST_BYTES} expected)")
        return _HEAD.pack(Kind.IMAGE_END, m.epoch) + _point(m.point) + _U64.pack(m.size) + m.digest
    if isinstance(m, Ping):
        return _HEAD.pack(Kind.PING, m.epoch) + _U64.pack(m.sent_ms)
    if isinstance(m, Pong):
        return _HEAD.pack(Kind.PONG, m.epoch) + _U64.pack(m.echoed_ms)
    raise TypeError(f"not a mate link message: {m!r}")


def _bodies(items: tuple[Any, ...], encode_one: Callable[[Any], bytes]) -> bytes:
    if len(items) > MAX_BATCH_OPS:
        raise ValueError(f"{len(items)} ops in one message (at most {MAX_BATCH_OPS})")
    return _U32.pack(len(items)) + b"".join(encode_one(i) for i in items)


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise MalformedMessage(f"message ends {self.pos + n - len(self.data)} bytes early")
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def unpack(self, s: struct.Struct) -> tuple[Any, ...]:
        return s.unpack(self.take(s.size))

    def point(self) -> ChainPoint:
        return ChainPoint(*self.unpack(_POINT))

    def count(self) -> int:
        n: int = self.unpack(_U32)[0]
        if n > MAX_BATCH_OPS:
            raise MalformedMessage(f"{n} ops in one message (at most {MAX_BATCH_OPS})")
        return n

    def body(self, length: int) -> bytes:
        if length > MAX_OP_BYTES:
            raise MalformedMessage(f"a {length}-byte op (at most {MAX_OP_BYTES})")
        return self.take(length)

    def done(self) -> None:
        if self.pos != len(self.data):
            raise MalformedMessage(f"{len(self.data) - self.pos} bytes after the message")


def _commits(r: _Reader) -> tuple[Commit, ...]:
    """An OPS message's commits, each its bytes as written and the fields of its commit record."""
    commits = []
    for _ in range(r.count()):
        (length,) = r.unpack(_U32)
        if length > MAX_COMMIT_BYTES:
            raise MalformedMessage(f"a {length}-byte commit (at most {MAX_COMMIT_BYTES})")
        try:
            commits.append(commit_from_bytes(r.take(length)))
        except RecordError as exc:
            raise MalformedMessage(f"a commit that does not end with a sound commit record ({exc.why})") from None
    return tuple(commits)


def decode(data: bytes) -> Message:
    r = _Reader(data)
    kind_code, epoch = r.unpack(_HEAD)
    try:
        kind = Kind(kind_code)
    except ValueError:
        raise MalformedMessage(f"unknown message type {kind_code}") from None
    if kind is Kind.JOIN:
        m: Message = Join(epoch, r.point(), r.unpack(_U64)[0])
    elif kind is Kind.PLAN:
        code = r.take(1)[0]
        try:
            catchup = Catchup(code)
        except ValueError:
            raise MalformedMessage(f"unknown catch-up kind {code}") from None
        m = Plan(epoch, catchup, r.unpack(_U64)[0], r.point(), r.unpack(_U64)[0])
    elif kind is Kind.OPS:
        m = Ops(epoch, _commits(r))
    elif kind is Kind.ACK:
        m = Ack(epoch, r.unpack(_U64)[0])
    elif kind is Kind.SNAPSHOT:
        flag = r.take(1)[0]
        if flag not in (0, 1):
            raise MalformedMessage(f"snapshot flag {flag}")
        last = r.point() if flag else None
        (ops_total,), (bytes_total,) = r.unpack(_U64), r.unpack(_U64)
        m = Snapshot(epoch, tuple(r.body(r.unpack(_U32)[0]) for _ in range(r.count())), last, ops_total, bytes_total)
    elif kind is Kind.IMAGE:
        offset, total, length = r.unpack(_IMAGE_HEAD)
        if length > MAX_IMAGE_CHUNK_BYTES:
            raise MalformedMessage(f"a {length}-byte image chunk (at most {MAX_IMAGE_CHUNK_BYTES})")
        m = Image(epoch, offset, total, r.take(length))
    elif kind is Kind.IMAGE_END:
        m = ImageEnd(epoch, r.point(), r.unpack(_U64)[0], r.take(DIGEST_BYTES))
    elif kind is Kind.PING:
        m = Ping(epoch, r.unpack(_U64)[0])
    else:
        m = Pong(epoch, r.unpack(_U64)[0])
    r.done()
    return m

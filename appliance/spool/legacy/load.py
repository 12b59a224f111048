"""Reading the whole state out of the spool file, checking it on the way.

Rules:
- Everything is read in one read transaction, so the state matches its head.
- Stored bodies carry a CRC and must decode to the `MessageStored` of their
  msg_id; the op log carries its chain (checked at open). The other rows carry
  no checksum of their own, so they are cross-checked instead: every row
  belongs to an existing session, small fields are inside their domains
  (state.py), each body's reference count equals the references found, no
  reference dangles, and `stored_bytes` is the sum of the bodies' sizes. A
  failed check is corruption (`Corrupt` names it), never a silent repair.
- `raw_bodies=True` (a snapshot for the mate link): `messages` maps each msg_id
  to its stored body, the encoded `MessageStored` op, CRC- and size-checked but
  not decoded: the snapshot ships it untouched and the standby decodes and
  checks every op it receives anyway. Decoding and re-encoding a million
  bodies was most of a snapshot's cost on the active.
"""

from __future__ import annotations

import collections
import sqlite3
import zlib

from .. import ops as o
from ..codec import decode_op, decode_uints
from .sql import read_meta
from ..state import PACKET_IDS, PROTOCOL_VERSIONS, QOS, RETAIN_HANDLING, QueueEntry, Session, SpoolState, stored_size

_FLAG = (0, 1)


class Corrupt(Exception):
    """What is wrong; the store turns it into `SpoolCorruption` naming the file."""


def _check(ok: bool, what: str) -> None:
    if not ok:
        raise Corrupt(what)


def load_state(conn: sqlite3.Connection, *, raw_bodies: bool = False) -> SpoolState:
    ex = conn.execute
    head, _, stored_bytes = read_meta(conn)
    messages: dict[int, o.MessageStored] = {}
    refs: dict[int, int] = {}
    total = 0
    for msg_id, count, size, crc, body in ex("SELECT msg_id, refs, size, crc, body FROM messages"):
        _check(zlib.crc32(body) == crc, f"stored message {msg_id}'s body does not match its CRC")
        if raw_bodies:
            op = body
        else:
            op = decode_op(body)
            _check(isinstance(op, o.MessageStored) and op.msg_id == msg_id,
                   f"stored message {msg_id} holds {type(op).__name__} {getattr(op, 'msg_id', '')}")
        _check(size == stored_size(body) and count >= 0, f"stored message {msg_id}'s size or count is impossible")
        messages[msg_id], refs[msg_id] = op, count
        total += size
    _check(total == stored_bytes, f"the stored bodies hold {total} bytes, the spool recorded {stored_bytes}")
    found: collections.Counter[int] = collections.Counter()

    subs: dict[str, list[o.Subscribed]] = collections.defaultdict(list)
    for cid, flt, qos, no_local, rap, rh, sid in ex(
            "SELECT client_id, topic_filter, qos, no_local, retain_as_published, retain_handling, subscription_id "
            "FROM subscriptions ORDER BY client_id, topic_filter"):
        _check(qos in QOS and no_local in _FLAG and rap in _FLAG and rh in RETAIN_HANDLING,
               f"subscription {cid!r} {flt!r} has a field out of its domain")
        subs[cid].append(o.Subscribed(cid, flt, qos, bool(no_local), bool(rap), rh, sid))
    queues: dict[str, list[QueueEntry]] = collections.defaultdict(list)
    for seq, cid, msg_id, qos, retain, sub_ids, packet_id, pubrec in ex(
            "SELECT seq, client_id, msg_id, qos, retain, subscription_ids, packet_id, pubrec FROM queue ORDER BY seq"):
        _check(qos in QOS and retain in _FLAG and pubrec in _FLAG and (packet_id == 0 or packet_id in PACKET_IDS),
               f"queue entry {seq} ({cid!r}, message {msg_id}) has a field out of its domain")
        if not pubrec:
            found[msg_id] += 1
        queues[cid].append(QueueEntry(msg_id, qos, bool(retain), decode_uints(sub_ids), seq, packet_id, bool(pubrec)))
    inbound: dict[str, list[int]] = collections.defaultdict(list)
    for cid, packet_id in ex("SELECT client_id, packet_id FROM inbound_qos2 ORDER BY client_id, packet_id"):
        _check(packet_id in PACKET_IDS, f"inbound QoS 2 packet id {packet_id} of {cid!r} is out of its domain")
        inbound[cid].append(packet_id)
    wills = {}
    for cid, msg_id, delay_s in ex("SELECT client_id, msg_id, delay_s FROM wills"):
        wills[cid] = o.WillSet(cid, msg_id, delay_s)
        found[msg_id] += 1
    retained = {}
    for topic, msg_id in ex("SELECT topic, msg_id FROM retained"):
        retained[topic] = msg_id
        found[msg_id] += 1

    owners: dict[str, str] = {}
    if ex("SELECT 1 FROM sqlite_schema WHERE type = 'table' AND name = 'session_owners'").fetchone():
        owners = dict(ex("SELECT client_id, owner FROM session_owners"))
    sessions = {}
    for cid, pv, expiry_s, connected_at, disconnected_at, connected in ex(
            "SELECT client_id, protocol_version, expiry_s, connected_at_ms, disconnected_at_ms, connected "
            "FROM sessions"):
        _check(pv in PROTOCOL_VERSIONS and connected in _FLAG, f"session {cid!r} has a field out of its domain")
        sessions[cid] = Session(cid, pv, expiry_s, connected_at, disconnected_at, bool(connected),
                                tuple(subs.pop(cid, ())), tuple(queues.pop(cid, ())), tuple(inbound.pop(cid, ())),
                                wills.pop(cid, None), owners.pop(cid, None))
    orphans = sorted(set(subs) | set(queues) | set(inbound) | set(wills) | set(owners))
    _check(not orphans, f"rows belong to sessions that do not exist: {orphans[:3]}")
    dangling = sorted(set(found) - set(messages))
    _check(not dangling, f"references to stored messages that do not exist: {dangling[:3]}")
    wrong = sorted(msg_id for msg_id, count in refs.items() if found[msg_id] != count)
    _check(not wrong, f"stored message {wrong[0] if wrong else 0}'s reference count does not match its references")
    message_ids = tuple(ex("SELECT client_id, message_id, seen_at_ms FROM message_ids ORDER BY seq"))
    return SpoolState(head, sessions, messages, retained, message_ids, stored_bytes)

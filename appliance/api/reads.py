"""The management API's read endpoints behind `pairmq show clients|sessions|subscriptions` and
`pairmq events`, the `GET /api/v1` index, and the spool's files in `GET /api/v1/message-spool`.

Rules:
- Every answer is a JSON object with `schema` (1), `role` and `serving`. Only
  the node that serves holds live clients and a current broker core, so a
  standby (and the monitor) answer 200 with empty lists and `"serving": false`
  plus `active` (the active's management address, or null): a script asking
  every node gets one non-empty answer and never an error for asking.
- Lists are bounded: `?limit=` (1..10000, default 1000), sorted by client id
  (then filter), with `total` (before the limit) and `truncated`.
- Events come from the node's own event log: the newest `limit` (1..1000,
  default 100) with `ts` >= `since` (wall-clock seconds), oldest first, read
  from the end of the segments in a thread, at most `EVENTS_SCAN_BYTES`.
- A bad query parameter is a 400 with one sentence naming it.
- `spool_disk(spool)`: the open spool's files as `GET /api/v1/message-spool` shows them under `disk`
  (docs/spool.md): segments, bytes, the checkpoint's point, the log's base and head. Read from what the
  open spool holds in memory (and one stat of the checkpoint), never by reading the files.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from pathlib import Path

from aiohttp import web

from ..broker.session import NEVER
from ..eventlog import segments
from .auth import PRINCIPAL
from .ports import AUTH, CAPS, PORTS, RoutingPorts

SCHEMA = 1
DEFAULT_LIMIT, MAX_LIMIT = 1000, 10_000
DEFAULT_EVENTS, MAX_EVENTS = 100, 1000
EVENTS_SCAN_BYTES = 4 << 20
MAX_CLIENT_ID_CHARS = 65535
PROTOCOLS = {3: "3.1", 4: "3.1.1", 5: "5.0"}

ENDPOINTS = [
    ("GET", "/api/v1", "this index"),
    ("GET", "/api/v1/redundancy", "activity, epoch, peers, decisions"),
    ("GET", "/api/v1/message-spool", "the broker's limits, refusals and spool writer (routing nodes)"),
    ("GET", "/api/v1/config-sync", "configuration version, digest and sync status (routing nodes)"),
    ("GET", "/api/v1/config", "the replicated configuration in force, without password records"),
    ("GET", "/api/v1/config/document", "the whole configuration document (for `pairmq config assert`)"),
    ("GET", "/api/v1/clients", "connected clients (?limit=)"),
    ("GET", "/api/v1/sessions", "sessions, offline ones included, with queued messages (?limit=)"),
    ("GET", "/api/v1/subscriptions", "subscriptions (?client=, ?limit=)"),
    ("GET", "/api/v1/events", "recent event-log lines (?since=, ?limit=)"),
    ("POST", "/api/v1/config/changes", "apply configuration changes (active only)"),
    ("POST", "/api/v1/redundancy/release-activity", "hand activity to the mate (active only)"),
    ("POST", "/api/v1/redundancy/revert-activity", "hand activity back to the primary (active backup only)"),
    ("POST", "/api/v1/redundancy/force-activity", "bid for activity without the in-sync check"),
]


def spool_disk(spool) -> dict:
    """The files of `spool` (an open `appliance.spool.store.Spool`): see the rules."""
    from ..spool.records import checkpoint_name

    segments = spool.log.segment_list()
    base, head, checkpoint = spool.log.base, spool.log.head, spool.checkpoint
    try:
        checkpoint_bytes = (spool.directory / checkpoint_name(checkpoint.seq)).stat().st_size if checkpoint.seq else 0
    except OSError:  # replaced by a newer one in this instant: counted next time
        checkpoint_bytes = 0
    segment_bytes = sum(s.size for s in segments)
    return {"segments": len(segments), "segment_bytes": segment_bytes, "checkpoint_bytes": checkpoint_bytes,
            "bytes_on_disk": segment_bytes + checkpoint_bytes,
            "checkpoint": {"epoch": checkpoint.epoch, "seq": checkpoint.seq},
            "log_base": {"epoch": base.epoch, "seq": base.seq}, "log_head": {"epoch": head.epoch, "seq": head.seq},
            "log_bytes_since_checkpoint": spool.log.bytes_after(checkpoint.seq) if head.seq > checkpoint.seq else 0,
            "keep_ops": spool.keep_ops}


class BadQuery(web.HTTPBadRequest):
    def __init__(self, message: str) -> None:
        super().__init__(text=json.dumps({"error": message}), content_type="application/json")


def add_routes(app: web.Application) -> None:
    app.router.add_get("/api/v1", _index)
    app.router.add_get("/api/v1/clients", _clients)
    app.router.add_get("/api/v1/sessions", _sessions)
    app.router.add_get("/api/v1/subscriptions", _subscriptions)
    app.router.add_get("/api/v1/events", _events)


def _int_param(request: web.Request, name: str, default: int, low: int, high: int) -> int:
    text = request.query.get(name)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise BadQuery(f"{name} must be a whole number from {low} to {high}, not {text[:40]!r}") from None
    if not low <= value <= high:
        raise BadQuery(f"{name} must be a whole number from {low} to {high}, not {value}")
    return value


def _check_known(request: web.Request, *known: str) -> None:
    unknown = sorted(set(request.query) - set(known))
    if unknown:
        allowed = ", ".join(known) if known else "none"
        raise BadQuery(f"unknown query parameter {unknown[0][:40]!r} (allowed: {allowed})")


def _head(request: web.Request) -> tuple[dict, RoutingPorts | None]:
    """The common fields, and the broker's reads if this node serves clients now."""
    ports = request.app[PORTS]
    serving = ports.routing is not None and ports.may_serve()
    head = {"schema": SCHEMA, "role": ports.role.value, "serving": serving}
    if not serving:
        head["active"] = ports.active_management_address()
    return head, (ports.routing if serving else None)


def _bounded(rows: list[dict], limit: int, key: str) -> dict:
    rows.sort(key=lambda r: (r["client_id"], r.get("filter", "")))
    return {key: rows[:limit], "total": len(rows), "truncated": len(rows) > limit}


async def _index(request: web.Request) -> web.Response:
    ports = request.app[PORTS]
    return web.json_response({"schema": SCHEMA, "role": ports.role.value, "group": ports.config.name,
                              "principal": request.get(PRINCIPAL), "auth": request.app[AUTH].view(),
                              "connections": request.app[CAPS].view() if CAPS in request.app else None,
                              "endpoints": [{"method": m, "path": p, "what": w} for m, p, w in ENDPOINTS]})


async def _clients(request: web.Request) -> web.Response:
    _check_known(request, "limit")
    limit = _int_param(request, "limit", DEFAULT_LIMIT, 1, MAX_LIMIT)
    head, routing = _head(request)
    rows = []
    if routing is not None:
        now = time.time()
        sessions = routing.sessions()
        for listener, tls in routing.listeners():
            for conn in listener.connections():
                if not conn.accepted or conn.closing or conn.client_id is None:
                    continue
                session = sessions.get(conn.client_id)
                rows.append({
                    "client_id": conn.client_id, "username": conn.username, "peer": conn.peer, "tls": tls,
                    "protocol": PROTOCOLS.get(conn.protocol_version, str(conn.protocol_version)),
                    "keep_alive_s": conn.keep_alive_s,
                    "connected_at": round(conn.accepted_at, 3),
                    "connected_s": round(max(0.0, now - conn.accepted_at), 3),
                    "inflight_out": 0 if session is None else session.inflight_count(),
                    "inflight_in": conn.inflight,
                    "queued": 0 if session is None else len(session.queue) - session.inflight_count(),
                })
    return web.json_response({**head, **_bounded(rows, limit, "clients")})


async def _sessions(request: web.Request) -> web.Response:
    _check_known(request, "limit")
    limit = _int_param(request, "limit", DEFAULT_LIMIT, 1, MAX_LIMIT)
    head, routing = _head(request)
    rows = []
    if routing is not None:
        for session in routing.sessions().values():
            online = session.conn is not None
            expires = session.expires_at_ms()
            rows.append({
                "client_id": session.client_id, "connected": online,
                "protocol": PROTOCOLS.get(session.protocol_version, str(session.protocol_version)),
                "expiry_s": None if session.expiry_s == NEVER else session.expiry_s,
                "disconnected_at": None if online else round(session.disconnected_at_ms / 1000, 3),
                "expires_at": None if expires is None else round(expires / 1000, 3),
                "subscriptions": len(session.subscriptions),
                "queued": len(session.queue) - session.inflight_count(),
                "inflight": session.inflight_count(),
                "queued_bytes": session.queued_bytes,
                "inbound_qos2": len(session.inbound_qos2),
            })
    return web.json_response({**head, **_bounded(rows, limit, "sessions")})


async def _subscriptions(request: web.Request) -> web.Response:
    _check_known(request, "client", "limit")
    limit = _int_param(request, "limit", DEFAULT_LIMIT, 1, MAX_LIMIT)
    client = request.query.get("client")
    if client is not None and not 1 <= len(client) <= MAX_CLIENT_ID_CHARS:
        raise BadQuery("client must be a client id of 1 to 65535 characters")
    head, routing = _head(request)
    rows = []
    if routing is not None:
        sessions = routing.sessions()
        chosen = [sessions[client]] if client is not None and client in sessions else (
            [] if client is not None else sessions.values())
        for session in chosen:
            for topic_filter, o in session.subscriptions.items():
                rows.append({"client_id": session.client_id, "filter": topic_filter, "qos": o.qos,
                             "no_local": o.no_local, "retain_as_published": o.retain_as_published,
                             "retain_handling": o.retain_handling,
                             "subscription_id": o.subscription_id or None})
    return web.json_response({**head, **_bounded(rows, limit, "subscriptions")})


async def _events(request: web.Request) -> web.Response:
    _check_known(request, "since", "limit")
    limit = _int_param(request, "limit", DEFAULT_EVENTS, 1, MAX_EVENTS)
    since_text = request.query.get("since")
    since = 0.0
    if since_text is not None:
        try:
            since = float(since_text)
        except ValueError:
            since = math.nan
        if not math.isfinite(since) or since < 0:
            raise BadQuery(f"since must be a time in seconds since the epoch (like the events' ts), "
                           f"not {since_text[:40]!r}")
    ports = request.app[PORTS]
    events, scanned_all = await asyncio.to_thread(tail_events, ports.events.directory, since, limit)
    return web.json_response({"schema": SCHEMA, "role": ports.role.value, "serving": ports.may_serve(),
                              "since": since, "events": events, "complete": scanned_all})


def tail_events(directory: Path, since: float, limit: int, budget: int = EVENTS_SCAN_BYTES) -> tuple[list, bool]:
    """The newest `limit` events with ts >= since, oldest first; and whether every segment was read."""
    found: list[dict] = []
    for path in reversed(segments(directory)):
        try:
            with open(path, "rb") as f:
                size = f.seek(0, 2)
                start = max(0, size - budget)
                f.seek(start)
                data = f.read(size - start)
        except OSError:
            continue
        budget -= len(data)
        lines = data.split(b"\n")
        if start > 0:
            lines = lines[1:]  # the first line is cut
        for line in reversed(lines):
            try:
                event = json.loads(line)
            except ValueError:
                continue  # a torn last line (the writer is mid-line) or the cut
            if not isinstance(event, dict) or not isinstance(event.get("ts"), (int, float)):
                continue
            if event["ts"] < since:
                return list(reversed(found)), True
            found.append(event)
            if len(found) >= limit:
                return list(reversed(found)), True
        if budget <= 0:
            return list(reversed(found)), False
    return list(reversed(found)), True

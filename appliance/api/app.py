"""The management API on port 8080 (aiohttp), the only thing the CLI talks to.

Rules:
- It binds the node's own address only (never 0.0.0.0).
- Every route, reads and routes added later included, needs a credential:
  a request signed with the group's management key or the admin password
  over HTTP Basic (auth.py, one middleware in front of everything). The
  password records and secret rotation need the key.
- The listener bounds what a connection may cost (listener.py: idle/head
  deadline, connection caps) and speaks HTTPS when [management] names a
  certificate.
- Errors are JSON: {"error": "one sentence"}.
- A change the node cannot take because it is not active (release-activity,
  revert-activity, config changes) is a 409 that names the active's
  management address in `active` (null when none is active). force-activity
  is the exception by design: it is how a non-active node is made active.
- The read endpoints behind the CLI's show commands are in reads.py. The API
  reads and asks its node only through `ApiPorts` (ports.py).
"""

from __future__ import annotations

import dataclasses
import json
import logging

from aiohttp import http_exceptions, web

from ..errors import LocalProtocolError
from .admin_credential import AdminFile, node_admin_path
from .auth import ApiAuth, auth_middleware, require_key
from .listener import ConnectionCaps, GuardedRunner, GuardedSite
from .ports import AUTH, CAPS, PORTS, ApiPorts
from .reads import add_routes
from ..management_settings import server_context
from ..keyring import management_key


class _BadRequestsAreOneLine(logging.Filter):
    """aiohttp logs a client's malformed request (a line too long, a broken header) as an ERROR with
    our traceback; it is the client's fault and already answered with a 400, so one warning line."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, http_exceptions.HttpProcessingError):
            peer = record.args[0] if isinstance(record.args, tuple) and record.args else "?"
            record.msg, record.args = "refused a malformed HTTP request from %s: %s", (peer, exc.message)
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            record.exc_info = record.exc_text = None
        return True


def new_auth(ports: ApiPorts) -> ApiAuth:
    """The node's API credentials; a malformed admin file stops the node here with one sentence.
    Requests are accepted signed with the management key of any secret the node holds (a rotation holds two)."""
    address, port = ports.address, ports.config.ports.management
    host = f"[{address}]" if ":" in address else address
    hosts = {f"{host}:{port}".lower()} | ({host.lower()} if port in (80, 443) else set())
    return ApiAuth(lambda: [management_key(s) for s in ports.keys.keys.values()],
                   AdminFile(node_admin_path(ports.config)),
                   hosts=hosts, body_timeout_s=ports.config.management.body_timeout_ms / 1000)


def build_app(ports: ApiPorts, auth: ApiAuth | None = None, caps: ConnectionCaps | None = None) -> web.Application:
    server_log = logging.getLogger("aiohttp.server")
    if not any(isinstance(f, _BadRequestsAreOneLine) for f in server_log.filters):
        server_log.addFilter(_BadRequestsAreOneLine())
    auth = auth or new_auth(ports)
    app = web.Application(middlewares=[_errors_as_json, auth_middleware(auth)])
    app[PORTS] = ports
    app[AUTH] = auth
    if caps is not None:
        app[CAPS] = caps
    add_routes(app)
    app.router.add_get("/api/v1/redundancy", _redundancy)
    app.router.add_get("/api/v1/message-spool", _message_spool)
    app.router.add_post("/api/v1/redundancy/force-activity", _force_activity)
    app.router.add_post("/api/v1/redundancy/release-activity", _release_activity)
    app.router.add_post("/api/v1/redundancy/revert-activity", _revert_activity)
    app.router.add_get("/api/v1/config-sync", _config_sync)
    app.router.add_get("/api/v1/config", _config)
    app.router.add_get("/api/v1/config/document", _config_document)
    app.router.add_post("/api/v1/config/changes", _config_changes)
    from .secret_rotation import add_routes as add_secret_routes
    from .status_page import add_routes as add_status_routes  # /, /metrics, status, group, decision stream

    add_secret_routes(app)
    add_status_routes(app)
    return app


@web.middleware
async def _errors_as_json(request: web.Request, handler):
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.content_type == "application/json":
            raise
        return _error(exc.status, exc.reason)


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


async def _redundancy(request: web.Request) -> web.Response:
    return web.json_response(request.app[PORTS].redundancy_view())


async def _message_spool(request: web.Request) -> web.Response:
    ports = request.app[PORTS]
    if ports.routing is None:
        return _error(404, f"the {ports.role.value} routes no messages: it has no message spool")
    return web.json_response(ports.routing.spool_view())


async def _change_body(request: web.Request, flag: str) -> dict | web.Response:
    """A change's JSON object whose optional `flag` is a boolean, or the error to answer."""
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return _error(400, "the request body must be JSON")
    if not isinstance(body, dict) or not isinstance(body.get(flag, False), bool):
        return _error(400, f"{flag} must be true or false")
    return body


async def _force_activity(request: web.Request) -> web.Response:
    ports = request.app[PORTS]
    body = await _change_body(request, "acknowledge_data_loss")
    if isinstance(body, web.Response):
        return body
    try:
        ports.force_activity(body.get("acknowledge_data_loss", False))
    except LocalProtocolError as exc:
        return _error(409, str(exc))
    return web.json_response({"result": "forced bid started", "role": ports.role.value})


async def _release_activity(request: web.Request) -> web.Response:
    """A planned handover to the mate; answers once it is over."""
    body = await _change_body(request, "force")
    if isinstance(body, web.Response):
        return body
    return await _handover(request, "operator released activity", force=body.get("force", False))


async def _revert_activity(request: web.Request) -> web.Response:
    body = await _change_body(request, "force")
    if isinstance(body, web.Response):
        return body
    return await _handover(request, "operator reverted activity to the primary", revert=True)


async def _handover(request: web.Request, why: str, **kw) -> web.Response:
    ports = request.app[PORTS]
    try:
        outcome = await ports.handover(why, **kw)
    except LocalProtocolError as exc:
        return _refusal(ports, str(exc))
    if outcome.result == "aborted":
        return _refusal(ports, outcome.sentence)
    return web.json_response(outcome.json(ports.role))


def _active_elsewhere(ports: ApiPorts) -> str | None:
    """The active node's management address; None if none is active, or it is this node."""
    active = ports.active_management_address()
    return None if active == ports.management_address(ports.role) else active


def _refusal(ports: ApiPorts, sentence: str) -> web.Response:
    """409 naming the active node's management address (null if none is active, or it is this node)."""
    return web.json_response({"error": sentence, "active": _active_elsewhere(ports)}, status=409)


# --- configuration (config-sync) ------------------------------------------------------------------


def _configuration(request: web.Request):
    ports = request.app[PORTS]
    if ports.routing is None:
        raise web.HTTPNotFound(reason=f"the {ports.role.value} holds no replicated configuration")
    return ports.routing.configuration


async def _config_sync(request: web.Request) -> web.Response:
    return web.json_response({"role": request.app[PORTS].role.value, **_configuration(request).sync.view()})


async def _config(request: web.Request) -> web.Response:
    """What is in force here, without password hashes; the latest changes, newest first."""
    from pairmq.configsync.changes import describe

    configuration = _configuration(request)
    doc, head = configuration.document, configuration.store.head
    return web.json_response({
        "version": head.version, "digest": head.digest,
        "users": sorted(doc.access.users), "allow_anonymous": doc.access.allow_anonymous,
        "acl": [dict(rule.to_document(), index=i) for i, rule in enumerate(doc.access.rules)],
        "limits": {"effective": dataclasses.asdict(configuration.limits()), "set": doc.limits},
        "overload": {"effective": dataclasses.asdict(doc.effective_overload()), "set": doc.overload},
        "auto_revert": {"effective": configuration.auto_revert(), "set": doc.auto_revert},
        "history": [{"version": e.version, "at_ms": e.at_ms, "what": describe(e.change)}
                    for e in configuration.store.history(20)]})


async def _config_document(request: web.Request) -> web.Response:
    """The whole document, password records included: for `pairmq config assert`."""
    require_key(request, "the configuration document (it holds the MQTT users' password records)")
    configuration = _configuration(request)
    return web.json_response({"version": configuration.store.head.version,
                              "digest": configuration.store.head.digest,
                              "document": configuration.document.to_json()})


async def _config_changes(request: web.Request) -> web.Response:
    """Apply changes in order on the active: all of them are checked first, so none or all apply. With
    `base_version`, only if the configuration is still at that version (an import's dry run saw that one)."""
    from pairmq.configsync.changes import apply_change, describe, parse_change
    from pairmq.configsync.document import ConfigChangeError
    from pairmq.configsync.service import NotActive

    ports = request.app[PORTS]
    configuration = _configuration(request)
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return _error(400, "the request body must be JSON")
    changes = body.get("changes") if isinstance(body, dict) else None
    if not isinstance(changes, list) or not 1 <= len(changes) <= 1000:
        return _error(400, "the body must be {\"changes\": [change, ...]} with 1 to 1000 changes")
    base = body.get("base_version")
    if base is not None and (not isinstance(base, int) or isinstance(base, bool) or base < 0):
        return _error(400, "base_version must be a whole number from 0")
    if not ports.may_serve():
        refusal = NotActive(_active_elsewhere(ports))
        return web.json_response({"error": str(refusal), "active": refusal.active}, status=409)
    if base is not None and base != configuration.store.head.version:
        # What the caller compared against is gone: applying now would undo a change it never saw.
        return web.json_response({"error": f"the configuration changed since it was read (version "
                                           f"{configuration.store.head.version} now, {base} then); nothing changed",
                                  "active": None, "version": configuration.store.head.version}, status=409)
    try:
        doc = configuration.document
        for i, change in enumerate(changes):
            where = f"changes[{i}]"
            doc = apply_change(doc, parse_change(change, where), where)
        applied = [configuration.sync.apply(change) for change in changes]
    except ConfigChangeError as exc:
        return _error(400, str(exc))
    except NotActive as exc:
        return web.json_response({"error": str(exc), "active": exc.active}, status=409)
    confirmed = await configuration.sync.confirm(applied[-1].version)
    head = configuration.store.head
    return web.json_response({
        "applied": [{"version": e.version, "what": describe(e.change)} for e in applied],
        "version": head.version, "digest": head.digest, "confirmed_by_standby": confirmed,
        "config_sync": configuration.sync.status().value})


class ManagementServer:
    def __init__(self, ports: ApiPorts) -> None:
        self.ports = ports
        self.auth = new_auth(ports)
        settings = ports.config.management
        self.caps = ConnectionCaps(settings.max_connections, settings.max_connections_per_address)
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        settings = self.ports.config.management
        idle_s = settings.idle_timeout_ms / 1000
        # keepalive_timeout is aiohttp's one timer for "no complete request head yet", from the first byte on.
        self._runner = GuardedRunner(build_app(self.ports, self.auth, self.caps), self.caps, access_log=None,
                                     keepalive_timeout=idle_s)
        await self._runner.setup()
        site = GuardedSite(self._runner, self.ports.address, self.ports.config.ports.management,
                           reuse_address=True, ssl_context=server_context(settings), handshake_s=idle_s)
        await site.start()

    async def stop(self) -> None:
        if self._runner:
            await self._runner.cleanup()
        self.auth.close()

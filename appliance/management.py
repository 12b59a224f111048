"""The management API on port 8080 (aiohttp), the only thing the CLI talks to.

Reads are open on the node's own address; changes need the bearer token
derived from the group secret. Errors are JSON: {"error": "one sentence"}.
This is the redundancy slice of the API; the operations work adds the rest.
"""

from __future__ import annotations

import dataclasses
import hmac
import json

from aiohttp import web

from .errors import LocalProtocolError


def build_app(node) -> web.Application:
    app = web.Application(middlewares=[_errors_as_json])
    app["node"] = node
    app.router.add_get("/api/v1/redundancy", _redundancy)
    app.router.add_get("/api/v1/message-spool", _message_spool)
    app.router.add_post("/api/v1/redundancy/force-activity", _force_activity)
    app.router.add_post("/api/v1/redundancy/release-activity", _release_activity)
    app.router.add_post("/api/v1/redundancy/revert-activity", _revert_activity)
    app.router.add_get("/api/v1/config-sync", _config_sync)
    app.router.add_get("/api/v1/config", _config)
    app.router.add_get("/api/v1/config/document", _config_document)
    app.router.add_post("/api/v1/config/changes", _config_changes)
    from .status_page import add_routes  # /, /metrics, /api/v1/status, /api/v1/group, the decision stream

    add_routes(app)
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
    return web.json_response(request.app["node"].redundancy_view())


async def _message_spool(request: web.Request) -> web.Response:
    view = request.app["node"].message_spool_view()
    if view is None:
        return _error(404, f"the {request.app['node'].role.value} routes no messages: it has no message spool")
    return web.json_response(view)


async def _change_body(request: web.Request, flag: str) -> dict | web.Response:
    """An authorized change's JSON object whose optional `flag` is a boolean, or the error to answer."""
    if not _authorized(request, request.app["node"].management_token):
        return _error(401, "a valid management token is required for changes")
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return _error(400, "the request body must be JSON")
    if not isinstance(body, dict) or not isinstance(body.get(flag, False), bool):
        return _error(400, f"{flag} must be true or false")
    return body


async def _force_activity(request: web.Request) -> web.Response:
    node = request.app["node"]
    body = await _change_body(request, "acknowledge_data_loss")
    if isinstance(body, web.Response):
        return body
    try:
        node.force_activity(body.get("acknowledge_data_loss", False))
    except LocalProtocolError as exc:
        return _error(409, str(exc))
    return web.json_response({"result": "forced bid started", "role": node.role.value})


async def _release_activity(request: web.Request) -> web.Response:
    """A planned handover to the mate (appliance/planned_handover.py); answers once it is over."""
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
    node = request.app["node"]
    try:
        outcome = await node.handover(why, **kw)
    except LocalProtocolError as exc:
        return _error(409, str(exc))
    if outcome.result == "aborted":
        return _error(409, outcome.sentence)
    return web.json_response(outcome.json(node.role))
# --- configuration (config-sync) ------------------------------------------------------------------


def _configuration(request: web.Request):
    configuration = request.app["node"].configuration
    if configuration is None:
        raise web.HTTPNotFound(reason=f"the {request.app['node'].role.value} holds no replicated configuration")
    return configuration


async def _config_sync(request: web.Request) -> web.Response:
    node = request.app["node"]
    return web.json_response({"role": node.role.value, **_configuration(request).sync.view()})


async def _config(request: web.Request) -> web.Response:
    """What is in force here, without password hashes; the latest changes, newest first."""
    from configsync.changes import describe

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
    """The whole document, password records included: for `pairmq config assert` (token only)."""
    node = request.app["node"]
    if not _authorized(request, node.management_token):
        return _error(401, "a valid management token is required to read the configuration document")
    configuration = _configuration(request)
    return web.json_response({"version": configuration.store.head.version,
                              "digest": configuration.store.head.digest,
                              "document": configuration.document.to_json()})


async def _config_changes(request: web.Request) -> web.Response:
    """Apply changes in order on the active: all of them are checked first, so none or all apply."""
    from configsync.changes import apply_change, describe, parse_change
    from configsync.document import ConfigChangeError
    from configsync.service import NotActive

    node = request.app["node"]
    if not _authorized(request, node.management_token):
        return _error(401, "a valid management token is required for changes")
    configuration = _configuration(request)
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return _error(400, "the request body must be JSON")
    changes = body.get("changes") if isinstance(body, dict) else None
    if not isinstance(changes, list) or not 1 <= len(changes) <= 1000:
        return _error(400, "the body must be {\"changes\": [change, ...]} with 1 to 1000 changes")
    if not node.may_serve():
        refusal = NotActive(configuration.sync._active_name())
        return web.json_response({"error": str(refusal), "active": refusal.active}, status=409)
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


def _authorized(request: web.Request, token: str) -> bool:
    header = request.headers.get("Authorization", "")
    return header.startswith("Bearer ") and hmac.compare_digest(header[7:].encode(), token.encode())


class ManagementServer:
    def __init__(self, node) -> None:
        self.node = node
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        self._runner = web.AppRunner(build_app(self.node), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.node.spec.address, self.node.config.ports.management,
                           reuse_address=True)
        await site.start()

    async def stop(self) -> None:
        if self._runner:
            await self._runner.cleanup()

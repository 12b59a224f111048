"""The management API on port 8080 (aiohttp), the only thing the CLI talks to.

Reads are open on the node's own address; changes need the bearer token
derived from the group secret. Errors are JSON: {"error": "one sentence"}.
This is the redundancy slice of the API; the operations work adds the rest.
"""

from __future__ import annotations

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


async def _force_activity(request: web.Request) -> web.Response:
    node = request.app["node"]
    if not _authorized(request, node.management_token):
        return _error(401, "a valid management token is required for changes")
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return _error(400, "the request body must be JSON")
    if not isinstance(body, dict) or not isinstance(body.get("acknowledge_data_loss", False), bool):
        return _error(400, "acknowledge_data_loss must be true or false")
    try:
        node.force_activity(body.get("acknowledge_data_loss", False))
    except LocalProtocolError as exc:
        return _error(409, str(exc))
    return web.json_response({"result": "forced bid started", "role": node.role.value})


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

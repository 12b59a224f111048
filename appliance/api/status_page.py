"""The status page and what it reads: `/`, `/static/*`, `/metrics`, `/api/v1/status`, `/api/v1/group`,
`/api/v1/decisions/stream` (docs/operations.md).

Rules:
- The page (static/ beside this file: HTML, CSS, vanilla JS, no external assets) is served by every node. It reads
  only the node that served it: `/api/v1/group` is that node asking all three nodes' `/api/v1/status` (its
  own without HTTP), so the browser needs no CORS and only one reachable address, and a later API
  credential is checked once, here. Each peer request is signed with the group's management key
  (signing.py), never a token a sniffer could reuse; over HTTPS the peer's certificate
  is verified as the CLI verifies it. A peer that does not answer within PEER_TIMEOUT_S is an entry
  `{"reachable": false, "error"}`.
- Bounded: one fan-out at a time; its answer serves every request for GROUP_CACHE_S, so ten open pages
  cost the peers what one does.
"""

from __future__ import annotations

import asyncio
import os
import time
from importlib import resources

import aiohttp
from aiohttp import web

from ..roles import Role
from . import metrics
from .ports import PORTS, ApiPorts
from ..management_settings import client_context
from ..keyring import management_key
from .signing import sign

PEER_TIMEOUT_S = 0.8
GROUP_CACHE_S = 0.5
STATIC = resources.files(__package__) / "static"
GROUP_VIEW = web.AppKey("group_view", "GroupView")
STATIC_TYPES = {".html": "text/html", ".css": "text/css", ".js": "text/javascript", ".svg": "image/svg+xml"}


def add_routes(app: web.Application) -> None:
    app.router.add_get("/", _index)
    app.router.add_get("/static/{name}", _static)
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/api/v1/status", _status)
    app.router.add_get("/api/v1/group", _group)
    app.router.add_get("/api/v1/decisions/stream", _stream)
    app[GROUP_VIEW] = GroupView(app[PORTS])
    app.on_startup.append(_attach_feed)
    app.on_shutdown.append(_close)


async def _attach_feed(app: web.Application) -> None:
    app[PORTS].decisions.attach(asyncio.get_running_loop())


async def _close(app: web.Application) -> None:
    app[PORTS].decisions.close()  # open streams end now: the runner's cleanup does not wait for them
    await app[GROUP_VIEW].close()


async def _index(request: web.Request) -> web.Response:
    return web.Response(body=(STATIC / "index.html").read_bytes(), content_type="text/html",
                        headers={"Cache-Control": "no-cache"})


async def _static(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    suffix = name[name.rfind("."):] if "." in name else ""
    # Only the files we ship: the name is looked up, never joined into a path the client chose.
    shipped = {entry.name for entry in STATIC.iterdir() if entry.is_file()}
    if name not in shipped or suffix not in STATIC_TYPES:
        raise web.HTTPNotFound(reason=f"no static file {name!r}")
    return web.Response(body=(STATIC / name).read_bytes(), content_type=STATIC_TYPES[suffix],
                        headers={"Cache-Control": "no-cache"})


async def _metrics(request: web.Request) -> web.Response:
    return web.Response(body=metrics.exposition(request.app[PORTS]), headers={"Content-Type": metrics.CONTENT_TYPE})


async def _status(request: web.Request) -> web.Response:
    return web.json_response(metrics.status_document(request.app[PORTS]))


async def _group(request: web.Request) -> web.Response:
    return web.json_response(await request.app[GROUP_VIEW].get())


async def _stream(request: web.Request) -> web.StreamResponse:
    return await request.app[PORTS].decisions.stream(request)


class GroupView:
    """All three nodes' status documents as the serving node sees them, fetched at most every GROUP_CACHE_S."""

    def __init__(self, ports: ApiPorts) -> None:
        self.ports = ports
        self._session: aiohttp.ClientSession | None = None
        self._pending: asyncio.Future | None = None
        self._document: dict | None = None
        self._at = 0.0

    async def get(self) -> dict:
        loop = asyncio.get_running_loop()
        if self._document is not None and loop.time() - self._at < GROUP_CACHE_S:
            return self._document
        if self._pending is None:
            self._pending = loop.create_task(self._fetch())
        pending = self._pending
        try:
            return await asyncio.shield(pending)
        finally:
            if self._pending is pending and pending.done():
                self._pending = None

    async def _fetch(self) -> dict:
        ports = self.ports
        if self._session is None:
            context = client_context(ports.config.management)
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=PEER_TIMEOUT_S),
                                                  trust_env=False,
                                                  connector=aiohttp.TCPConnector(ssl=context if context is not None else True))
        entries = await asyncio.gather(*(self._one(role) for role in Role))
        self._document = {"schema": 1, "group": ports.config.name, "served_by": ports.role.value, "nodes": entries}
        self._at = asyncio.get_running_loop().time()
        return self._document

    async def _one(self, role: Role) -> dict:
        ports = self.ports
        address = ports.config.node(role).address
        if role is ports.role:
            return {**metrics.status_document(ports), "reachable": True}
        host = f"[{address}]" if ":" in address else address
        try:
            document = await _peer_get(self._session, ports.config.management.scheme,
                                       f"{host}:{ports.config.ports.management}", "/api/v1/status",
                                       management_key(ports.keys.keyring.send_secret))
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
            return {"role": role.value, "address": address, "reachable": False, "error": _describe(exc)}
        return {**document, "reachable": True}

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


async def _peer_get(session: aiohttp.ClientSession, scheme: str, netloc: str, path: str, key: bytes) -> dict:
    """The one place this node calls a peer's API, signed with the group's key (it holds the same secret)."""
    signature = sign(key, "GET", netloc, path, b"", time.time_ns() // 1_000_000, os.urandom(16))
    async with session.get(f"{scheme}://{netloc}{path}",
                           headers={"Accept": "application/json", "Authorization": signature}) as response:
        if response.status != 200:
            raise ValueError(f"answered HTTP {response.status}")
        document = await response.json()
    if not isinstance(document, dict):
        raise ValueError("answered with JSON that is not an object")
    return document


def _describe(exc: BaseException) -> str:
    if isinstance(exc, asyncio.TimeoutError):
        return f"no answer within {PEER_TIMEOUT_S:g} s"
    if isinstance(exc, aiohttp.ClientConnectorError):
        return "connection refused (is the node running?)" if isinstance(exc.os_error, ConnectionRefusedError) \
            else f"cannot connect: {exc.os_error.strerror or exc.os_error}"
    return str(exc) or type(exc).__name__

"""The management API's secret-rotation endpoints (the steps are appliance/keyring.py's rules), and
`KeyringInstaller`, which makes a step take effect on the node.

    GET  /api/v1/secret          this node's key ids, their fingerprints and the one it sends with
                                 (open: neither ids nor fingerprints reveal a secret)
    POST /api/v1/secret/steps    {"step": "add", "key_id": N, "wrapped": {...}}   hold key N too
                                 {"step": "use", "key_id": N}                    send with key N
                                 {"step": "retire", "key_id": N}                 drop key N
Each step needs a request signed with the management key of a key the node holds (never the admin
password: whoever drives rotation must hold the secret anyway), is idempotent (a step already taken
answers "changed": false), and is persisted before the answer. A bad request is 400, a step this
node's keyring refuses is 409; either way one sentence and nothing changed. A step is persisted first
(a restart resumes in it), then the heartbeats and the next link handshakes use it, and a link keyed with
a retired key is cut.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from ..eventlog import EventLog
from ..keyring import MAX_KEY_ID, STEPS, BadWrap, CurrentKeyring, Keyring, KeyringRefused, unwrap
from ..roles import Role
from .auth import require_key
from .ports import PORTS, ApiPorts

log = logging.getLogger("pairmq.node")


def add_routes(app: web.Application) -> None:
    app.router.add_get("/api/v1/secret", _show)
    app.router.add_post("/api/v1/secret/steps", _step)


def _view(ports: ApiPorts) -> dict:
    ring = ports.keys.keyring
    return {"role": ports.role.value, **ring.view(), "fingerprints": ring.fingerprints()}


async def _show(request: web.Request) -> web.Response:
    return web.json_response(_view(request.app[PORTS]))


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


async def _step(request: web.Request) -> web.Response:
    ports = request.app[PORTS]  # authenticated by the API's middleware (auth.py)
    require_key(request, "a secret rotation step")
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return _error(400, "the request body must be JSON")
    if not isinstance(body, dict) or body.get("step") not in STEPS:
        return _error(400, f"step must be one of {', '.join(STEPS)}")
    step, key_id = body["step"], body.get("key_id")
    if not isinstance(key_id, int) or isinstance(key_id, bool) or not 0 <= key_id <= MAX_KEY_ID:
        return _error(400, f"key_id must be a whole number from 0 to {MAX_KEY_ID}")
    current = ports.keys.keyring
    try:
        if step == "add":
            if not isinstance(body.get("wrapped"), dict):
                return _error(400, "add needs the new secret in wrapped (the CLI wraps it; it never travels in clear)")
            secret = unwrap(body["wrapped"], key_id=key_id, keyring=current, group=ports.config.name,
                            role=ports.role.value)
            new = current.add(key_id, secret)
        elif step == "use":
            new = current.use(key_id)
        else:
            new = current.retire(key_id)
    except BadWrap as exc:
        return _error(400, str(exc))
    except KeyringRefused as exc:
        return _error(409, str(exc))
    ports.install_keyring(new, step, key_id)
    return web.json_response({**_view(ports), "changed": new != current})


@dataclasses.dataclass(frozen=True, slots=True)
class KeyringInstaller:
    """Makes a rotation step take effect: `quorum(fn)` runs fn on the quorum core under its lock; `links()` are
    the mate-link and config-sync connections open now, each named (None where there is none)."""

    role: Role
    keys: CurrentKeyring
    path: Path
    quorum: Callable[[Callable[[Any], Any]], Any]
    events: EventLog
    links: Callable[[], list[tuple[str, Any]]]

    def install(self, new: Keyring, step: str, key_id: int) -> None:
        """Persist first (a restart resumes in this step), then heartbeats and the next link handshakes use it."""
        old = self.keys.keyring
        if new == old:
            return
        new.save(self.path)

        def rekey(core) -> None:
            auth = core.auth
            for kid, secret in new.keys.items():
                if old.keys.get(kid) != secret:
                    auth.add_key(kid, secret)
            auth.send_key_id = new.send_id
            for kid in old.keys.keys() - new.keys.keys():
                auth.retire_key(kid)
            self.keys.keyring = new

        self.quorum(rekey)
        log.warning("%s: group secret: %s key id %d; holds key ids %s, sends with %d", self.role.value, step, key_id,
                    sorted(new.keys), new.send_id)
        self.events.write("secret_rotation_step", step=step, key_id=key_id, **new.view())
        self._close_links_keyed_with(old.keys.keys() - new.keys.keys())

    def _close_links_keyed_with(self, retired: set[int]) -> None:
        """A link's session keys come from the key its handshake used: once that key is retired, the link is cut
        and redialled under the current key, so a leaked old secret cannot read or forge it any longer."""
        for name, conn in self.links():
            if conn is not None and not conn.closed and conn.handshake.key_id in retired:
                log.warning("%s: closing the %s keyed with retired key id %d; it reconnects with key id %d",
                            self.role.value, name, conn.handshake.key_id, self.keys.send_id)
                conn.close(f"its key id {conn.handshake.key_id} was retired")

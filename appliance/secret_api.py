"""The management API's secret-rotation endpoints (the steps are appliance/keyring.py's rules).

    GET  /api/v1/secret          this node's key ids, their fingerprints and the one it sends with
                                 (open: neither ids nor fingerprints reveal a secret)
    POST /api/v1/secret/steps    {"step": "add", "key_id": N, "wrapped": {...}}   hold key N too
                                 {"step": "use", "key_id": N}                    send with key N
                                 {"step": "retire", "key_id": N}                 drop key N
Each step needs a request signed with the management key of a key the node holds (never the admin
password: whoever drives rotation must hold the secret anyway), is idempotent (a step already taken
answers "changed": false), and is persisted before the answer. A bad request is 400, a step this
node's keyring refuses is 409; either way one sentence and nothing changed.
"""

from __future__ import annotations

import json
import logging

from aiohttp import web

from .api_auth import require_key
from .keyring import MAX_KEY_ID, STEPS, BadWrap, Keyring, KeyringRefused, unwrap

log = logging.getLogger("pairmq.node")


def add_routes(app: web.Application) -> None:
    app.router.add_get("/api/v1/secret", _show)
    app.router.add_post("/api/v1/secret/steps", _step)


def _view(node) -> dict:
    ring = node.keys.keyring
    return {"role": node.role.value, **ring.view(), "fingerprints": ring.fingerprints()}


async def _show(request: web.Request) -> web.Response:
    return web.json_response(_view(request.app["node"]))


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


async def _step(request: web.Request) -> web.Response:
    node = request.app["node"]  # authenticated by the API's middleware (appliance/api_auth.py)
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
    current = node.keys.keyring
    try:
        if step == "add":
            if not isinstance(body.get("wrapped"), dict):
                return _error(400, "add needs the new secret in wrapped (the CLI wraps it; it never travels in clear)")
            secret = unwrap(body["wrapped"], key_id=key_id, keyring=current, group=node.config.name,
                            role=node.role.value)
            new = current.add(key_id, secret)
        elif step == "use":
            new = current.use(key_id)
        else:
            new = current.retire(key_id)
    except BadWrap as exc:
        return _error(400, str(exc))
    except KeyringRefused as exc:
        return _error(409, str(exc))
    install_keyring(node, new, step, key_id)
    return web.json_response({**_view(node), "changed": new != current})


def install_keyring(node, new: Keyring, step: str, key_id: int) -> None:
    """Persist first (a restart resumes in this step), then heartbeats and the next link handshakes use it."""
    old = node.keys.keyring
    if new == old:
        return
    new.save(node.keyring_path)
    def rekey(core, _now) -> None:
        auth = core.auth
        for kid, secret in new.keys.items():
            if old.keys.get(kid) != secret:
                auth.add_key(kid, secret)
        auth.send_key_id = new.send_id
        for kid in old.keys.keys() - new.keys.keys():
            auth.retire_key(kid)
        node.keys.keyring = new

    node.quorum.call(rekey)
    log.warning("%s: group secret: %s key id %d; holds key ids %s, sends with %d", node.role.value, step, key_id,
                sorted(new.keys), new.send_id)
    node.events.write("secret_rotation_step", step=step, key_id=key_id, **new.view())
    _close_links_keyed_with(node, old.keys.keys() - new.keys.keys())


def _close_links_keyed_with(node, retired: set[int]) -> None:
    """A link's session keys come from the key its handshake used: once that key is retired, the link is cut
    and redialled under the current key, so a leaked old secret cannot read or forge it any longer."""
    links = []
    if node.replication is not None:
        links += [("mate link", node.replication.active.conn),
                  ("mate link", node.replication.standby.conn if node.replication.standby is not None else None)]
    if node.configuration is not None:
        links += [("config-sync", node.configuration.sync.conn), ("config-sync", node.configuration.sync._follow_conn)]
    for name, conn in links:
        if conn is not None and not conn.closed and conn.handshake.key_id in retired:
            log.warning("%s: closing the %s keyed with retired key id %d; it reconnects with key id %d",
                        node.role.value, name, conn.handshake.key_id, node.keys.send_id)
            conn.close(f"its key id {conn.handshake.key_id} was retired")

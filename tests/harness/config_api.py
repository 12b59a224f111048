"""Talking to a node's configuration API from tests: changes, views and waiting for the standby."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

from pairmq.appliance.broker.access import AccessPolicy
from pairmq.appliance.config import load_secret
from pairmq.appliance.keyring import management_token
from pairmq.appliance.roles import Role
from pairmq.cli.api import signed_headers
from pairmq.configsync.document import ConfigDocument


def call(g, role: Role, path: str, body: dict | None = None, *, token: bool | str = True) -> tuple[int, dict]:
    """`token`: True for the secret file's management key, a string (hex) for that one, False for none;
    the request is signed with it as the CLI signs."""
    url = f"http://{g.config.node(role).address}:{g.config.ports.management}{path}"
    data = None if body is None else json.dumps(body).encode()
    method = "POST" if body is not None else "GET"
    request = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        request.add_header("Content-Type", "application/json")
    if token:
        key = token if isinstance(token, str) else management_token(load_secret(g.config))
        request.add_header("Authorization", signed_headers(key, method, url, data or b"")["Authorization"])
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as exc:
        return exc.code, json.load(exc)


def change(g, role: Role, *changes: dict) -> dict:
    status, reply = call(g, role, "/api/v1/config/changes", {"changes": list(changes)})
    assert status == 200, f"{role.value} refused {changes}: {status} {reply}"
    return reply


def config(g, role: Role) -> dict:
    status, reply = call(g, role, "/api/v1/config")
    assert status == 200, reply
    return reply


def set_policy(g, policy: AccessPolicy, role: Role = Role.PRIMARY) -> dict:
    """Replace the access policy (keeping limits and the rest) on the active `role`, confirmed by its standby
    when it has one in sync."""
    _, current = call(g, role, "/api/v1/config/document")
    doc = ConfigDocument.from_json(current["document"])
    replaced = ConfigDocument(policy, doc.limits, doc.overload, doc.auto_revert)
    return change(g, role, {"kind": "document.replace", "document": replaced.to_json()})


def wait_for_version(g, role: Role, version: int, timeout_s: float = 5.0) -> float:
    """Seconds until `role` reports `version` (AssertionError after `timeout_s`)."""
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        try:
            if config(g, role)["version"] >= version:
                return time.monotonic() - start
        except (OSError, AssertionError):
            pass
        time.sleep(0.02)
    raise AssertionError(f"{role.value} did not reach configuration version {version} within {timeout_s} s")

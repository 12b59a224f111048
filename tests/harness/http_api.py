"""The one door the observability tests use to a node's management API (it signs each request with the
group's management key, as the CLI does: every route needs a credential). Plain GETs with urllib; event
streams through the CLI's own client."""

from __future__ import annotations

import dataclasses
import json
import time
import urllib.error
import urllib.request

from pairmq.cli import api

_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclasses.dataclass
class Answer:
    status: int
    content_type: str
    body: bytes

    def json(self):
        return json.loads(self.body)

    @property
    def text(self) -> str:
        return self.body.decode()


def token(config) -> str:
    """The group's management key (hex): every route of the API needs a credential."""
    from pairmq.appliance.config import load_secret
    from pairmq.appliance.keyring import management_token

    return management_token(load_secret(config))


def signed(config, method: str, url: str, body: bytes = b"") -> dict:
    """The Authorization header of one request, signed with `config`'s management key."""
    return api.signed_headers(token(config), method, url, body)


ADMIN_PASSWORD = "the status page's admin password"


def admin_basic(config) -> dict:
    """A browser's credential: the admin user's password over HTTP Basic, the admin file written first."""
    import base64

    from pairmq.appliance.api.admin_credential import admin_path, new_credential, write_admin

    write_admin(admin_path(config), new_credential("admin", ADMIN_PASSWORD))
    return {"Authorization": "Basic " + base64.b64encode(f"admin:{ADMIN_PASSWORD}".encode()).decode()}


def get(config, url: str, timeout_s: float = 5.0) -> Answer:
    """Any answer, error statuses included (tests check refusals too), signed with `config`'s group key."""
    request = urllib.request.Request(url, headers=signed(config, "GET", url))
    try:
        with _opener.open(request, timeout=timeout_s) as r:
            return Answer(r.status, r.headers.get("Content-Type", ""), r.read())
    except urllib.error.HTTPError as exc:
        with exc:
            return Answer(exc.code, exc.headers.get("Content-Type", ""), exc.read())


def stream(config, url: str, last_event_id: str | None = None):
    """An open decision stream (cli.api.EventStream): iterate `.events()`; close it."""
    return api.open_stream(url, token=token(config), last_event_id=last_event_id, timeout_s=5.0)


def post(config, role, action: str, body: dict, timeout_s: float = 10.0) -> dict:
    """A redundancy action (release-activity, ...) with the group's management token."""
    return api.redundancy_action(config, role, action, body, token(config),
                                 timeout_s=timeout_s)


def hand_over(config, role, action: str = "release-activity", wait_s: float = 15.0) -> dict:
    """release-/revert-activity on `role`, asked again while it is refused because the mate is not in sync
    at this instant (on a loaded machine a lag past the in-sync lease flips it out and back), or aborted
    because it fell out of sync during the drain (the node then serves again): the refusal is right, but a
    test about what follows a handover wants the handover."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return post(config, role, action, {})
        except api.ApiError as exc:
            transient = "not in sync" in str(exc) or "handover aborted" in str(exc)
            if not transient or time.monotonic() > deadline:
                raise
            time.sleep(0.1)

"""The one door the observability tests use to a node's management API (it adds the group token every
route needs). Plain GETs with urllib; event streams through the CLI's own client."""

from __future__ import annotations

import dataclasses
import json
import time
import urllib.error
import urllib.request

from cli import api

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
    """The group's management token: every route of the API needs a credential."""
    from appliance.config import load_secret
    from appliance.node import management_token

    return management_token(load_secret(config))


def get(config, url: str, timeout_s: float = 5.0) -> Answer:
    """Any answer, error statuses included (tests check refusals too), asked with `config`'s group token."""
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token(config)}"})
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
    at this instant (on a loaded machine a lag past the in-sync lease flips it out and back): the refusal
    is right, but a test about what follows a handover wants the handover."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return post(config, role, action, {})
        except api.ApiError as exc:
            if "not in sync" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.1)

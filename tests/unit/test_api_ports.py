"""The management app built from `ApiPorts` alone (appliance/api/ports.py), in process: what a monitor's API
answers with no routing ports, a refused handover naming the active, and a secret step handed to the port
that installs it. The ports are plain callables here, which is all the API ever holds of its node."""

from __future__ import annotations

import asyncio
import json
import types

import aiohttp
from aiohttp.test_utils import TestServer

from pairmq.appliance.api.admin_credential import AdminFile
from pairmq.appliance.api.app import build_app
from pairmq.appliance.api.auth import ApiAuth
from pairmq.appliance.api.decisions import DecisionFeed
from pairmq.appliance.api.ports import ApiPorts
from pairmq.appliance.keyring import management_token
from pairmq.appliance.config import GroupConfig, NodeSpec, Timers
from pairmq.appliance.errors import LocalProtocolError
from pairmq.appliance.keyring import CurrentKeyring, Keyring
from pairmq.appliance.roles import Role
from pairmq.cli.api import signed_headers
from tests.harness.group import LOOPBACK

SECRETS = {0: b"s" * 32, 1: b"t" * 32}


def monitor_ports(tmp_path, installed: list) -> ApiPorts:
    config = GroupConfig("test", {r: NodeSpec(r, LOOPBACK[r], tmp_path / r.value) for r in Role}, tmp_path / "secret",
                         Timers())
    core = types.SimpleNamespace(active_role=lambda now_ms: Role.BACKUP)

    async def handover(why: str, **kw):
        raise LocalProtocolError("the monitor holds no activity to hand over")

    return ApiPorts(role=Role.MONITOR, config=config, keys=CurrentKeyring(Keyring(SECRETS, 0)),
                    decisions=DecisionFeed("monitor", 1), events=types.SimpleNamespace(directory=tmp_path / "events"),
                    now_ms=lambda: 0, quorum=lambda fn: fn(core), may_serve=lambda: False,
                    redundancy_view=lambda: {"schema": 1, "role": "monitor"}, force_activity=lambda ack: None,
                    handover=handover, install_keyring=lambda new, step, key_id: installed.append((new, step, key_id)),
                    routing=None)


def test_a_monitor_api_answers_from_its_ports(tmp_path):
    installed: list = []
    ports = monitor_ports(tmp_path, installed)
    backup = f"{LOOPBACK[Role.BACKUP]}:{ports.config.ports.management}"
    auth = ApiAuth(lambda: [bytes.fromhex(management_token(s)) for s in SECRETS.values()], AdminFile(tmp_path / "admin"))

    async def main() -> list:
        server = TestServer(build_app(ports, auth), host=LOOPBACK[Role.PRIMARY], port=0)
        await server.start_server()
        answers = []
        try:
            async with aiohttp.ClientSession() as session:
                for method, path, body in [("GET", "/api/v1/message-spool", None), ("GET", "/api/v1/clients", None),
                                           ("POST", "/api/v1/redundancy/release-activity", {}),
                                           ("POST", "/api/v1/secret/steps", {"step": "use", "key_id": 1})]:
                    url = str(server.make_url(path))
                    data = b"" if body is None else json.dumps(body).encode()
                    headers = signed_headers(management_token(SECRETS[0]), method, url, data)
                    async with session.request(method, url, data=data or None, headers=headers) as response:
                        answers.append((response.status, await response.json()))
        finally:
            await server.close()
            auth.close()
        return answers

    spool, clients, release, step = asyncio.run(main())
    assert spool == (404, {"error": "the monitor routes no messages: it has no message spool"})
    assert clients == (200, {"schema": 1, "role": "monitor", "serving": False, "active": backup,
                             "clients": [], "total": 0, "truncated": False})
    assert release == (409, {"error": "the monitor holds no activity to hand over", "active": backup})
    assert step[0] == 200 and step[1]["changed"] is True
    [(new, name, key_id)] = installed
    assert (new.send_id, name, key_id) == (1, "use", 1)

"""The management API on a real group of node processes: credentials on every route, the
bound address, the read endpoints behind `pairmq show clients|sessions|subscriptions` and
`pairmq events tail` with real paho-mqtt clients, 400s for bad queries, 409s with the active's address
for changes sent to a standby, and the per-address limit on failed attempts.

Requests are plain urllib/http.client; the admin password is set with the real `pairmq admin passwd`.
"""

import base64
import http.client
import json
import os
import subprocess
import sys
import time

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

from pairmq.appliance.api.reads import ENDPOINTS
from pairmq.appliance.roles import Role
from tests.harness import paho_clients
from tests.harness.config_api import call
from tests.harness.http_api import signed
from tests.harness.group import LOOPBACK, REPO, active_group

P, B, M = Role.PRIMARY, Role.BACKUP, Role.MONITOR
ADMIN_PASSWORD = "a long admin password"


@pytest.fixture(scope="module")
def group(tmp_path_factory):
    with active_group(tmp_path_factory.mktemp("api") / "group") as g:
        done = subprocess.run([sys.executable, "-m", "pairmq.cli.main", "admin", "passwd", "--password-stdin",
                               "--group", str(g.dir / "group.toml")], input=ADMIN_PASSWORD + "\n",
                              capture_output=True, text=True, cwd=REPO, timeout=30)
        assert done.returncode == 0, done.stderr
        yield g


def request(g, role: Role, path: str, headers: dict | None = None, *, method: str = "GET", body: bytes | None = None,
            source: str | None = None) -> tuple[int, dict, http.client.HTTPMessage]:
    conn = http.client.HTTPConnection(g.address(role), g.config.ports.management, timeout=10,
                                      source_address=(source, 0) if source else None)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        return response.status, json.loads(response.read()), response.headers
    finally:
        conn.close()


def basic(user: str, password: str) -> dict:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def test_every_route_on_every_node_needs_a_credential(group):
    paths = [(m, p) for m, p, _ in ENDPOINTS] + [("GET", "/"), ("GET", "/metrics"), ("GET", "/nope")]
    for role in Role:
        for method, path in paths:
            status, doc, headers = request(group, role, path, method=method, body=b"{}" if method == "POST" else None)
            assert status == 401, (role, path, doc)
            assert doc["error"].startswith("authentication required"), doc
            assert headers.get_all("WWW-Authenticate")[0].startswith("Basic realm=")
        status, doc, _ = request(group, role, "/api/v1", basic("admin", ADMIN_PASSWORD))
        assert status == 200 and doc["principal"] == "admin:admin" and doc["role"] == role.value
        assert doc["auth"]["admin_configured"] is True and doc["auth"]["admin_file_problem"] is None
        assert {(e["method"], e["path"]) for e in doc["endpoints"]} == {(m, p) for m, p, _ in ENDPOINTS}
        for method, path, _ in ENDPOINTS:  # the index lists routes that exist (GETs; POSTs would act)
            if method == "GET":
                status = call(group, role, path)[0]
                assert status == 200 or (role is M and status == 404), (role, path, status)
        status, doc, _ = request(group, role, "/api/v1/redundancy", basic("admin", ADMIN_PASSWORD + "!"))
        assert (status, doc["error"]) == (401, "wrong admin user name or password")


def test_the_api_listens_on_the_nodes_own_address_only(group):
    listing = subprocess.run(["ss", "-Hltnp", "sport = :8080"], capture_output=True, text=True, timeout=10)
    assert listing.returncode == 0, listing.stderr
    for role in Role:
        mine = [line.split()[3] for line in listing.stdout.splitlines() if f"pid={group.pid(role)}," in line]
        assert mine == [f"{group.address(role)}:8080"], (role, listing.stdout)


def test_clients_sessions_and_subscriptions_on_the_active_and_a_standby(group):
    host = group.address(P)
    v5, _ = paho_clients.client("api-v5", host, persistent=True)
    props = Properties(PacketTypes.SUBSCRIBE)
    props.SubscriptionIdentifier = 7
    assert v5.subscribe("plant/+/temp", options=SubscribeOptions(qos=1, noLocal=True, retainHandling=1),
                        properties=props)[0] == mqtt.MQTT_ERR_SUCCESS
    v311 = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="api-311", protocol=mqtt.MQTTv311)
    v311.connect(host, 1883, keepalive=45)
    v311.loop_start()
    offline, _ = paho_clients.client("api-offline", host, persistent=True)
    assert offline.subscribe("alerts/#", qos=1)[0] == mqtt.MQTT_ERR_SUCCESS
    time.sleep(0.5)
    offline.disconnect()
    offline.loop_stop()
    for i in range(3):
        v311.publish(f"alerts/{i}", b"x" * 10, qos=1).wait_for_publish(5)
    try:
        clients = group.wait_for("both clients listed", lambda: (
            lambda d: d if {c["client_id"] for c in d["clients"]} == {"api-v5", "api-311"} else None)(
                call(group, P, "/api/v1/clients")[1]))
        assert clients["serving"] is True and clients["total"] == 2 and clients["truncated"] is False
        by_id = {c["client_id"]: c for c in clients["clients"]}
        assert by_id["api-311"]["protocol"] == "3.1.1" and by_id["api-311"]["keep_alive_s"] == 45
        assert by_id["api-v5"]["protocol"] == "5.0" and by_id["api-v5"]["keep_alive_s"] == 30
        peer_host, peer_port = by_id["api-v5"]["peer"].rsplit(":", 1)
        assert peer_host.startswith("127.") and int(peer_port) > 0
        assert by_id["api-v5"]["username"] is None and by_id["api-v5"]["tls"] is False
        assert 0 <= by_id["api-v5"]["connected_s"] < 60 and by_id["api-v5"]["inflight_out"] == 0

        sessions = {s["client_id"]: s for s in call(group, P, "/api/v1/sessions")[1]["sessions"]}
        assert sessions["api-offline"]["connected"] is False and sessions["api-offline"]["queued"] == 3
        assert sessions["api-offline"]["expiry_s"] == 3600 and sessions["api-offline"]["disconnected_at"] > 0
        assert sessions["api-offline"]["queued_bytes"] > 0 and sessions["api-offline"]["subscriptions"] == 1
        assert sessions["api-v5"]["connected"] is True and sessions["api-v5"]["disconnected_at"] is None

        status, subs = call(group, P, "/api/v1/subscriptions?client=api-v5")
        assert status == 200 and subs["subscriptions"] == [{
            "client_id": "api-v5", "filter": "plant/+/temp", "qos": 1, "no_local": True,
            "retain_as_published": False, "retain_handling": 1, "subscription_id": 7}]
        shown = pairmq(group, "show", "subscriptions", "--client", "api-v5", "--json")
        assert shown.returncode == 0 and shown.stderr == "", shown.stderr
        assert json.loads(shown.stdout) == {"schema": 1, "group": "test", "node": "primary",
                                            "address": group.address(P), "total": 1, "truncated": False,
                                            "subscriptions": subs["subscriptions"]}
        table = pairmq(group, "show", "sessions")
        assert table.returncode == 0 and "Group test: 3 sessions on the primary" in table.stdout, table
        assert [line.split()[:2] for line in table.stdout.splitlines()[3:]] == [
            ["api-311", "online"], ["api-offline", "offline"], ["api-v5", "online"]]
        spool = pairmq(group, "show", "message-spool", "--json")
        assert spool.returncode == 0 and spool.stderr == "", spool.stderr
        nodes = {n["role"]: n for n in json.loads(spool.stdout)["nodes"]}
        assert nodes["primary"]["reachable"] and nodes["primary"]["queued_messages"] == 3
        assert nodes["primary"]["writer"]["commits"] > 0 and nodes["backup"]["reachable"]
        table = pairmq(group, "show", "message-spool")
        assert table.returncode == 0 and "Group test: message spool" in table.stdout, table
        assert any(line.split()[:3] == ["Queued", "messages", "3"] for line in table.stdout.splitlines()), table.stdout
        assert call(group, P, "/api/v1/subscriptions?client=nobody")[1]["subscriptions"] == []
        assert call(group, P, "/api/v1/subscriptions?limit=1")[1]["truncated"] is True

        for role in (B, M):
            for what in ("clients", "sessions", "subscriptions"):
                status, doc = call(group, role, f"/api/v1/{what}")
                assert (status, doc) == (200, {"schema": 1, "role": role.value, "serving": False,
                                               "active": f"{group.address(P)}:8080", what: [], "total": 0,
                                               "truncated": False})
    finally:
        for c in (v5, v311):
            c.disconnect()
            c.loop_stop()


@pytest.mark.parametrize("path, fragment", [
    ("/api/v1/clients?limit=0", "limit must be a whole number from 1 to 10000, not 0"),
    ("/api/v1/clients?limit=ten", "limit must be a whole number from 1 to 10000, not 'ten'"),
    ("/api/v1/sessions?client=x", "unknown query parameter 'client' (allowed: limit)"),
    ("/api/v1/subscriptions?limit=10001", "not 10001"),
    ("/api/v1/events?since=-1", "since must be a time in seconds since the epoch"),
    ("/api/v1/events?since=nan", "since must be a time in seconds since the epoch"),
    ("/api/v1/events?limit=1001", "limit must be a whole number from 1 to 1000"),
])
def test_bad_query_parameters_are_400_with_one_sentence(group, path, fragment):
    for role in (P, B):
        status, doc = call(group, role, path)
        assert status == 400 and fragment in doc["error"] and "\n" not in doc["error"], (role, doc)


def test_events_are_the_nodes_own_latest_lines(group):
    status, doc = call(group, P, "/api/v1/events?limit=5")
    assert status == 200 and len(doc["events"]) == 5 and doc["complete"] is True
    assert all(e["node"] == "primary" for e in doc["events"])
    stamps = [e["ts"] for e in doc["events"]]
    assert stamps == sorted(stamps)
    assert call(group, M, f"/api/v1/events?since={time.time() + 3600}")[1]["events"] == []
    tail = pairmq(group, "events", "tail", "--role", "monitor", "--limit", "3", "--json")
    assert tail.returncode == 0, tail.stderr
    doc = json.loads(tail.stdout)
    assert doc["node"] == "monitor" and len(doc["events"]) == 3 and doc["events"][0]["node"] == "monitor"
    lines = pairmq(group, "events", "tail", "--role", "monitor", "--limit", "2").stdout.splitlines()
    assert len(lines) == 2 and all(" monitor " in line for line in lines), lines
    refused = pairmq(group, "events", "tail", "--limit", "0")
    assert refused.returncode == 1 and refused.stderr.strip().splitlines() == [
        "error: the primary node refused: limit must be a whole number from 1 to 1000, not 0"], refused.stderr
    first = group.events(M)[0]
    status, doc = call(group, M, f"/api/v1/events?since={first['ts']}&limit=1000")
    assert doc["events"][0] == first  # the whole log since the first event, oldest first


def test_changes_on_a_standby_are_refused_with_the_actives_address(group):
    active = f"{group.address(P)}:8080"
    for path, body in (("/api/v1/redundancy/release-activity", {}), ("/api/v1/redundancy/revert-activity", {}),
                       ("/api/v1/config/changes", {"changes": [{"kind": "anonymous.set", "allowed": True}]})):
        status, doc = call(group, B, path, body)
        assert status == 409 and doc["active"] == active, (path, doc)
    status, doc = call(group, P, "/api/v1/redundancy/revert-activity", {})
    assert (status, doc) == (409, {"error": "the primary already holds activity; there is nothing to revert",
                                   "active": None})


def test_failed_attempts_are_limited_per_credential_not_per_address(group):
    """From the monitor's loopback address as source: the rest of this module's requests come from elsewhere.
    Ten wrong passwords throttle that password; the operator's signed request from the same address still
    works (a neighbour behind the same NAT cannot lock the operator out)."""
    source = LOOPBACK[M]
    wrong = basic("admin", "not the admin password")
    for _ in range(10):
        assert request(group, P, "/api/v1/redundancy", wrong, source=source)[0] == 401
    status, doc, headers = request(group, P, "/api/v1/redundancy", wrong, source=source)
    assert status == 429 and doc["error"].startswith("too many failed attempts with this credential")
    assert 1 <= int(headers["Retry-After"]) <= 60
    url = f"http://{group.address(P)}:{group.config.ports.management}/api/v1/redundancy"
    assert request(group, P, "/api/v1/redundancy", signed(group.config, "GET", url), source=source)[0] == 200
    assert request(group, P, "/api/v1/redundancy", basic("admin", ADMIN_PASSWORD), source=source)[0] == 200


def pairmq(g, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pairmq.cli.main", *args, "--group", str(g.dir / "group.toml")],
                          capture_output=True, text=True, timeout=30, cwd=REPO,
                          env={**os.environ, "COLUMNS": "160"})  # tables as wide as a pipe gets them

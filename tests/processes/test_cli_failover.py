"""A failover driven only through the CLI: every step and every check is a `pairmq` subprocess
(`show redundancy --json`, `redundancy release-activity|revert-activity`, `show clients --json`), against a
real loopback group of `pairmq node` processes; the one thing not done with `pairmq` is the crash itself
(kill -9 of the active). Also the CLI's one-sentence errors met on the way: nothing running, a bad group
file, a wrong management key (401), and a change sent to the standby (409).
"""

import json
import os
import subprocess
import sys
import time

import paho.mqtt.client as mqtt
import pytest

from pairmq.appliance.roles import Role
from tests.harness import paho_clients
from tests.harness.group import REPO, Group

P, B, M = Role.PRIMARY, Role.BACKUP, Role.MONITOR


def pairmq(group: Group, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k not in ("PAIRMQ_GROUP", "PAIRMQ_TOKEN")}
    return subprocess.run([sys.executable, "-m", "pairmq.cli.main", *args, "--group", str(group.dir / "group.toml")],
                          capture_output=True, text=True, timeout=60, cwd=REPO, env={**environ, **(env or {})})


def one_sentence(result: subprocess.CompletedProcess, *fragments: str) -> str:
    assert result.returncode == 1, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in result.stderr, result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def redundancy(group: Group) -> dict[str, dict]:
    """Every node's view; {} while no node answers (starting up)."""
    result = pairmq(group, "show", "redundancy", "--json")
    if result.returncode == 1 and "no node of group 'test' answered" in result.stderr:
        return {}
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["schema"] == 1 and doc["group"] == "test" and [n["role"] for n in doc["nodes"]] == [
        "primary", "backup", "monitor"]
    return {n["role"]: n for n in doc["nodes"]}


def wait_view(group: Group, what: str, predicate, timeout_s: float = 20.0) -> dict[str, dict]:
    """Poll `pairmq show redundancy --json` until `predicate(nodes)` holds; the last view on timeout."""
    deadline, nodes = time.monotonic() + timeout_s, {}
    while time.monotonic() < deadline:
        nodes = redundancy(group)
        if nodes and predicate(nodes):
            return nodes
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}; last view: {json.dumps(nodes)[:3000]}\n{group.logs_tail()}")


def serving(nodes: dict, role: Role) -> bool:
    """`role` serves, its mate does not, and the monitor sees it as active."""
    mate = role.mate().value
    return (nodes[role.value].get("serving") is True and not nodes[mate].get("serving")
            and nodes["monitor"].get("active_role") == role.value)


def steady(role: Role):
    """`role` serves and its mate is up, in sync, and knows who is active."""
    def check(nodes: dict) -> bool:
        mate = nodes[role.mate().value]
        return serving(nodes, role) and mate.get("reachable") and mate.get("in_sync") is True and \
            mate.get("active_role") == role.value
    return check


@pytest.fixture
def group(tmp_path):
    with Group(tmp_path / "group") as g:
        yield g


def test_a_failover_driven_only_through_the_cli(group):
    # Nothing runs yet: every read is one sentence that says so.
    one_sentence(pairmq(group, "show", "redundancy"), "no node of group 'test' answered", "connection refused")
    one_sentence(pairmq(group, "show", "clients", "--json"), "no routing node of group 'test' serves clients",
                 "connection refused")

    group.start()
    nodes = wait_view(group, "the primary active with the backup in sync", steady(P))
    epoch = nodes["primary"]["epoch"]
    assert nodes["primary"]["activity"] == "Local Active" and nodes["backup"]["activity"] == "Mate Active"
    assert nodes["monitor"]["reachable"] is True and nodes["monitor"]["in_sync"] is None

    client, _ = paho_clients.client("cli-failover", group.address(P), persistent=True)
    try:
        shown = json.loads(pairmq(group, "show", "clients", "--json").stdout)
        assert shown["node"] == "primary" and [c["client_id"] for c in shown["clients"]] == ["cli-failover"]

        # A change sent to the standby: refused, naming the active (409).
        one_sentence(pairmq(group, "redundancy", "release-activity", "--role", "backup"),
                     "the backup node refused:")
        # A wrong management key: every node refuses its signature (401).
        one_sentence(pairmq(group, "show", "clients", env={"PAIRMQ_TOKEN": "0" * 64}),
                     "the management token was refused by the primary and backup (401)")

        released = pairmq(group, "redundancy", "release-activity")
        assert released.returncode == 0 and "primary: handed activity over in" in released.stderr, released.stderr
        nodes = wait_view(group, "the backup active after release-activity", steady(B))
        assert nodes["backup"]["epoch"] > epoch and nodes["backup"]["activity"] == "Local Active"
        epoch = nodes["backup"]["epoch"]
        # The MQTT 5 client was sent to the backup (server reference); paho does not follow it by itself.
        shown = json.loads(pairmq(group, "show", "sessions", "--json").stdout)
        assert shown["node"] == "backup" and "cli-failover" in [s["client_id"] for s in shown["sessions"]]
    finally:
        client.disconnect()
        client.loop_stop()

    reverted = pairmq(group, "redundancy", "revert-activity")
    assert reverted.returncode == 0 and "backup: handed activity over in" in reverted.stderr, reverted.stderr
    nodes = wait_view(group, "the primary active after revert-activity", steady(P))
    assert nodes["primary"]["epoch"] > epoch
    epoch = nodes["primary"]["epoch"]
    one_sentence(pairmq(group, "redundancy", "revert-activity"), "the primary already holds activity")

    group.kill(P)  # kill -9 of the active
    nodes = wait_view(group, "the backup to take over from the killed primary",
                      lambda n: not n["primary"]["reachable"] and n["backup"].get("serving") is True)
    assert nodes["backup"]["epoch"] > epoch and nodes["backup"]["active_role"] == "backup"
    assert nodes["primary"]["error"] == "connection refused (is the node running?)"
    assert "taking activity" in nodes["backup"]["last_decision"]["reason"]
    epoch = nodes["backup"]["epoch"]

    group.start(P)  # the primary comes back as the standby (no auto-revert) and resynchronizes
    nodes = wait_view(group, "the restarted primary in sync under the active backup", steady(B), timeout_s=30)
    assert nodes["primary"]["activity"] == "Mate Active" and nodes["backup"]["epoch"] == epoch

    reverted = pairmq(group, "redundancy", "revert-activity")
    assert reverted.returncode == 0, reverted.stderr
    nodes = wait_view(group, "the primary active again", steady(P))
    assert nodes["primary"]["epoch"] > epoch


def test_a_bad_group_file_is_one_sentence(tmp_path):
    bad = tmp_path / "group.toml"
    bad.write_text("[group]\nname = 'x'\nbogus = 1\n")
    for args in (["show", "clients"], ["show", "sessions", "--json"], ["events", "tail"], ["admin", "passwd",
                                                                                         "--generate"]):
        result = subprocess.run([sys.executable, "-m", "pairmq.cli.main", *args, "--group", str(bad)], capture_output=True,
                                text=True, timeout=30, cwd=REPO)
        assert result.returncode == 1 and len(result.stderr.strip().splitlines()) == 1, (args, result.stderr)
        assert result.stderr.startswith("error: ") and "bogus" in result.stderr, result.stderr


def test_a_node_with_a_malformed_admin_file_does_not_start(tmp_path):
    """Never guess who may manage the group: one sentence, exit 1, before any socket is bound."""
    group = Group(tmp_path / "group")  # written, not entered: no ports are taken
    (group.dir / "admin").write_text('{"version": 1, "username": "admin"}')
    result = subprocess.run([sys.executable, "-m", "pairmq.cli.main", "node", "--role", "monitor", "--group",
                             str(group.dir / "group.toml")], capture_output=True, text=True, timeout=30, cwd=REPO)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert f"the admin credential {group.dir / 'admin'} must be {{version: 1, username, password}}" in \
        result.stderr.strip().splitlines()[-1], result.stderr

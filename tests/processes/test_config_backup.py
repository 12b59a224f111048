"""`pairmq config export` and `pairmq config import` (the real console script) against a live group: an export
taken, the configuration changed, the export imported back as ONE version that the standby holds; a dry run
changes nothing; an import raced by another change, a file from another group, and hostile files are refused
with one sentence and change nothing; a user restored by an import logs in with the old password (paho-mqtt)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import paho.mqtt.client as mqtt
import pytest

from pairmq.appliance.roles import Role
from pairmq.configsync.backup import MAX_IMPORT_BYTES
from tests.harness.config_api import call, change, config, wait_for_version
from tests.harness.group import active_group
from tests.unit.test_cli_commands import REPO, assert_one_sentence

P, B = Role.PRIMARY, Role.BACKUP


@pytest.fixture(scope="module")
def group(tmp_path_factory):
    with active_group(tmp_path_factory.mktemp("config-backup") / "group") as g:
        yield g


def run(g, *args, stdin=None) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k != "PAIRMQ_GROUP"}
    return subprocess.run([sys.executable, "-m", "pairmq.cli.main", "config", *args, "--group",
                           str(g.dir / "group.toml")], input=stdin, capture_output=True, text=True, timeout=60,
                          cwd=REPO, env=environ)


def both(g) -> tuple[dict, dict]:
    """The active's and the standby's views once the standby caught up."""
    primary = config(g, P)
    wait_for_version(g, B, primary["version"])
    return primary, config(g, B)


def document(g, role: Role) -> dict:
    status, reply = call(g, role, "/api/v1/config/document")
    assert status == 200, reply
    return reply


def connects(g, username: str, password: str) -> int:
    """The CONNACK reason code paho-mqtt gets from the active (MQTT 5)."""
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"backup-{username}", protocol=mqtt.MQTTv5)
    client.username_pw_set(username, password)
    codes = []
    client.on_connect = lambda c, u, flags, reason, props: codes.append(reason.value)
    try:
        client.connect(g.address(P), g.config.ports.mqtt)
        client.loop_start()
        g.wait_for("a CONNACK", lambda: codes, timeout_s=10)
        return codes[0]
    finally:
        client.loop_stop()
        client.disconnect()


def test_export_change_import_restores_the_configuration_as_one_version_on_both_nodes(group, tmp_path):
    g = group
    assert run(g, "users", "add", "ann", "--password-stdin", stdin="ann-passw0rd\n").returncode == 0
    assert run(g, "acl", "allow", "both", "cars/#", "--user", "ann").returncode == 0
    assert run(g, "acl", "allow", "subscribe", "#", "--users").returncode == 0
    assert run(g, "limits", "set", "session_queue_max_messages", "4000").returncode == 0
    saved, _ = both(g)

    out = tmp_path / "backup.json"
    exported = run(g, "export", "--out", str(out), "--json")
    assert exported.returncode == 0, exported.stderr
    summary = json.loads(exported.stdout)
    assert summary == {"file": str(out), "group": g.config.name, "config_version": saved["version"],
                       "digest": saved["digest"], "users": 1, "acl_rules": 2}
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    assert "keep it as private as the group secret" in exported.stderr
    text = out.read_text()
    file = json.loads(text)
    assert file["document"]["access"]["users"]["ann"]["scheme"] == "scrypt" and "ann-passw0rd" not in text
    assert file["exported_from"] == "primary" and file["config_version"] == saved["version"]
    secret = (g.dir / "secret").read_text().strip()
    assert secret not in text  # the group secret is never exported
    on_stdout = run(g, "export")
    assert on_stdout.returncode == 0 and json.loads(on_stdout.stdout)["document"] == file["document"]

    # Changed since: ann gone, a new user, anonymous refused, the limit back to its default, a rule more.
    assert saved["allow_anonymous"] is True
    assert run(g, "users", "del", "ann").returncode == 0
    assert run(g, "users", "add", "bob", "--password-stdin", stdin="bob-passw0rd\n").returncode == 0
    assert run(g, "anonymous", "refuse").returncode == 0
    assert run(g, "limits", "unset", "session_queue_max_messages").returncode == 0
    assert run(g, "acl", "deny", "publish", "secret/#", "--all").returncode == 0
    changed, _ = both(g)
    assert connects(g, "ann", "ann-passw0rd") != 0

    dry = run(g, "import", str(out))
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.splitlines() == [
        "users ann: absent -> added",
        "users bob: present -> removed",
        "anonymous: refused -> allowed",
        "acl rule 2: deny publish 'secret/#' for all -> removed",
        "limits session_queue_max_messages: default -> 4,000",
    ], dry.stdout
    assert f"dry run: 5 differences against version {changed['version']}; nothing changed" in dry.stderr
    after_dry, standby = both(g)
    assert after_dry["version"] == changed["version"] and after_dry["digest"] == changed["digest"]
    assert standby["digest"] == changed["digest"]

    applied = run(g, "import", str(out), "--apply", "--json")
    assert applied.returncode == 0, applied.stderr
    reply = json.loads(applied.stdout)
    assert reply["applied"] is True and reply["version"] == changed["version"] + 1  # ONE version bump
    assert reply["confirmed_by_standby"] is True and len(reply["differences"]) == 5
    assert f"imported {out} as version {changed['version'] + 1}" in applied.stderr
    primary, backup = both(g)
    assert primary["version"] == backup["version"] == changed["version"] + 1
    assert primary["digest"] == backup["digest"] == saved["digest"]  # exactly the exported configuration
    assert document(g, B)["document"] == file["document"]
    assert primary["history"][0]["what"] == "replaced the whole configuration"
    assert connects(g, "ann", "ann-passw0rd") == 0  # the restored password record works
    assert connects(g, "bob", "bob-passw0rd") != 0

    again = run(g, "import", str(out), "--apply")
    assert again.returncode == 0 and again.stdout == ""
    assert f"nothing to change: the group's configuration (version {primary['version']})" in again.stderr
    assert config(g, P)["version"] == primary["version"]  # no version for an import without differences


def test_an_import_raced_by_another_change_is_refused_whole(group, tmp_path):
    g = group
    before = config(g, P)
    current = document(g, P)["document"]
    racing = change(g, P, {"kind": "overload.set", "name": "max_window", "value": 60})
    status, reply = call(g, P, "/api/v1/config/changes", {
        "changes": [{"kind": "document.replace", "document": current}], "base_version": before["version"]})
    assert status == 409, reply
    assert reply["error"] == (f"the configuration changed since it was read (version {racing['version']} now, "
                              f"{before['version']} then); nothing changed")
    assert config(g, P)["version"] == racing["version"]
    status, reply = call(g, P, "/api/v1/config/changes", {
        "changes": [{"kind": "overload.set", "name": "max_window", "value": None}], "base_version": "7"})
    assert status == 400 and reply["error"] == "base_version must be a whole number from 0"
    status, reply = call(g, B, "/api/v1/config/changes", {
        "changes": [{"kind": "overload.set", "name": "max_window", "value": None}], "base_version": racing["version"]})
    assert status == 409 and reply["active"]  # a standby still names the active
    assert config(g, P)["version"] == racing["version"]


def exported_file(g, tmp_path) -> dict:
    out = tmp_path / "good.json"
    assert run(g, "export", "--out", str(out)).returncode == 0
    return json.loads(out.read_text())


def test_a_file_from_another_group_needs_its_flag(group, tmp_path):
    g = group
    doc = exported_file(g, tmp_path)
    doc["group"] = "elsewhere"
    doc["document"]["overload"] = {"max_window": 70}
    del doc["digest"]  # edited on purpose
    path = tmp_path / "elsewhere.json"
    path.write_text(json.dumps(doc))
    version = config(g, P)["version"]
    refused = run(g, "import", str(path), "--apply")
    assert_one_sentence(refused, "was exported from group 'elsewhere', not 'test'", "--from-other-group",
                        "nothing changed", code=1)
    assert config(g, P)["version"] == version
    taken = run(g, "import", str(path), "--apply", "--from-other-group")
    assert taken.returncode == 0, taken.stderr
    assert "overload max_window" in taken.stdout and config(g, P)["overload"]["set"] == {"max_window": 70}
    both(g)


def hostile_files(doc: dict) -> list[tuple[str, bytes, str]]:
    users = doc["document"]["access"]["users"]
    some_user = next(iter(users.values())) if users else {}
    return [
        ("huge", b" " * (MAX_IMPORT_BYTES * 3), "an import takes at most"),
        ("malformed", json.dumps(doc).encode()[:-20], "is not JSON"),
        ("binary", os.urandom(4096), "is not JSON"),
        ("deeply nested", b"[" * 200_000 + b"]" * 200_000, "nests too deeply"),
        ("newer format", json.dumps({**doc, "format_version": 9}).encode(), "export format 9 by a newer PairMQ"),
        ("wrong version type", json.dumps({**doc, "config_version": "12"}).encode(), "config_version must be"),
        ("wrong limits type", json.dumps({**doc, "document": {**doc["document"], "limits": [1, 2]}}).encode(),
         "document.limits must be an object"),
        ("wrong limit value", json.dumps({**doc, "document": {**doc["document"], "limits": {
            "session_queue_max_messages": 1e300}}}).encode(), "session_queue_max_messages must be a whole number"),
        ("bad record", json.dumps({**doc, "document": {**doc["document"], "access": {
            **doc["document"]["access"], "users": {"eve": {**some_user, "n": "big"}}}}}).encode(), "eve"),
        ("damaged", json.dumps({**doc, "document": {**doc["document"], "auto_revert": True}}).encode(),
         "does not match its digest"),
        ("not an export", b'{"hello": "world"}', "is not a PairMQ configuration export"),
    ]


def test_hostile_import_files_are_refused_with_one_sentence_and_change_nothing(group, tmp_path):
    g = group
    doc = exported_file(g, tmp_path)
    before = config(g, P)
    for name, data, fragment in hostile_files(doc):
        path = tmp_path / f"{name.replace(' ', '-')}.json"
        path.write_bytes(data)
        for args in ((str(path),), (str(path), "--apply")):
            result = run(g, "import", *args)
            assert_one_sentence(result, fragment, "nothing changed", code=1)
            assert len(result.stderr) < 500, (name, result.stderr)
    missing = run(g, "import", str(tmp_path / "absent.json"), "--apply")
    assert_one_sentence(missing, "cannot read", "absent.json", code=1)
    after = config(g, P)
    assert (after["version"], after["digest"]) == (before["version"], before["digest"])

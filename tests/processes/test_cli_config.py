"""`pairmq config ...` and `pairmq show config-sync` as a person meets them (the real console script) against a
live group: every change lands on the active, reaches the standby, and prints what changed; bad input is one
sentence and changes nothing; a node refuses a bad access file to import or a corrupt configuration store."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from pairmq.appliance.broker.access import HashRecord, verify_password
from pairmq.appliance.roles import Role
from pairmq.configsync.store import store_path
from tests.harness.config_api import call, config, wait_for_version
from tests.harness.group import active_group
from tests.unit.test_cli_commands import REPO, assert_one_sentence, pairmq, write_group

P, B = Role.PRIMARY, Role.BACKUP


@pytest.fixture(scope="module")
def group(tmp_path_factory):
    with active_group(tmp_path_factory.mktemp("cli-config") / "group") as g:
        yield g


def run(g, *args, stdin=None):
    return subprocess.run([sys.executable, "-m", "pairmq.cli.main", "config", *args, "--group", str(g.dir / "group.toml")],
                          input=stdin, capture_output=True, text=True, timeout=30, cwd=REPO)


def record(g, name: str) -> HashRecord:
    from pairmq.appliance.broker.access import record_from_document

    document = call(g, P, "/api/v1/config/document")[1]["document"]
    return record_from_document(document["access"]["users"][name], name)


def same_on_both(g) -> dict:
    primary = config(g, P)
    wait_for_version(g, B, primary["version"])
    assert config(g, B)["digest"] == primary["digest"]
    return primary


def test_users_add_passwd_del_list(group):
    added = run(group, "users", "add", "alice", "--password-stdin", stdin="s3cret-alice\n")
    assert added.returncode == 0, added.stderr
    assert "added user 'alice'" in added.stderr and "replaced" not in added.stderr
    assert "applied on the primary (active); the standby confirmed it" in added.stderr
    assert verify_password(record(group, "alice"), b"s3cret-alice")
    assert "s3cret-alice" not in json.dumps(call(group, P, "/api/v1/config/document")[1])
    assert run(group, "users", "passwd", "alice", "--password-stdin", stdin="n3w-passw0rd\n").returncode == 0
    assert verify_password(record(group, "alice"), b"n3w-passw0rd") and not verify_password(record(group, "alice"), b"s3cret-alice")
    assert run(group, "users", "add", "bob", "--password-stdin", stdin="bob-passw0rd\n").returncode == 0
    listed = json.loads(run(group, "users", "list", "--json").stdout)
    assert listed["users"] == ["alice", "bob"] and listed["allow_anonymous"] is True
    assert run(group, "users", "del", "alice").returncode == 0
    assert json.loads(run(group, "users", "list", "--json").stdout)["users"] == ["bob"]
    table = run(group, "users", "list")
    assert "bob" in table.stdout and "1 user; anonymous clients are allowed" in table.stderr
    same_on_both(group)


@pytest.mark.parametrize("args, stdin, fragments", [
    (["users", "add", "carol", "--password-stdin"], "\n", ["an empty password is not allowed"]),
    (["users", "add", "carol"], "", ["no terminal to ask for the password on", "--password-stdin"]),
    (["users", "passwd", "nobody", "--password-stdin"], "x\n", ["there is no user 'nobody'"]),
    (["users", "add", "carol", "--password-stdin"], "short\n",
     ["the password has 5 bytes", "at least 8", "password_min_length"]),
    (["users", "del", "nobody"], None, ["nothing changed", "there is no user 'nobody'"]),
    (["users", "add", "a\tb", "--password-stdin"], "long-enough\n", ["control characters"]),
    (["acl", "allow", "publish", "a/#/b", "--all"], None, ["rule.filter 'a/#/b'"]),
    (["acl", "allow", "publish", "$share/g/a", "--all"], None, ["rules name topics"]),
    (["acl", "remove", "30"], None, ["acl: there are no rules"]),
    (["limits", "set", "session_queue_max_messages", "0"], None, ["session_queue_max_messages must be a whole"]),
    (["limits", "set", "session_queue_max_messages", "lots"], None, ["'lots' is not a number"]),
    (["overload", "set", "min_window", "1000"], None, ["min_window <= max_window"]),
    (["assert", "--from", "backup"], "", ["confirm with --yes"]),
])
def test_bad_input_is_one_sentence_and_changes_nothing(group, args, stdin, fragments):
    before = config(group, P)["version"]
    assert_one_sentence(run(group, *args, stdin=stdin), *fragments, code=1)
    assert config(group, P)["version"] == before


def test_usage_mistakes(group):
    assert_one_sentence(run(group, "acl", "allow", "publish", "a/#"), "one of the arguments", code=2)
    assert_one_sentence(run(group, "acl", "allow", "read", "a/#", "--all"), "invalid choice: 'read'", code=2)
    assert_one_sentence(run(group, "limits", "set", "colour", "3"), "invalid choice: 'colour'", code=2)


def test_users_add_twice_is_refused(group):
    assert run(group, "users", "add", "dave", "--password-stdin", stdin="dave-passw0rd\n").returncode == 0
    assert_one_sentence(run(group, "users", "add", "dave", "--password-stdin", stdin="dave-other-pw\n"),
                        "user 'dave' already exists", "users passwd", code=1)


def test_acl_allow_deny_list_remove(group):
    for args in (["deny", "publish", "secret/#", "--all"], ["allow", "both", "alice/#", "--user", "alice"],
                 ["allow", "subscribe", "public/#", "--anonymous"], ["allow", "both", "#", "--all"]):
        result = run(group, "acl", *args)
        assert result.returncode == 0, result.stderr
    assert "added ACL rule: allow both '#' for all" in result.stderr
    rules = json.loads(run(group, "acl", "list", "--json").stdout)["rules"]
    assert [r["who"] for r in rules] == ["all", "user:alice", "anonymous", "all"]
    assert rules[0] == {"effect": "deny", "action": "publish", "filter": "secret/#", "who": "all"}
    table = run(group, "acl", "list")
    assert "secret/#" in table.stdout and "first match wins; no match: denied" in table.stderr
    for _ in rules:
        assert run(group, "acl", "remove", "0").returncode == 0
    assert json.loads(run(group, "acl", "list", "--json").stdout)["rules"] == []
    same_on_both(group)


def test_anonymous_limits_overload_auto_revert(group):
    assert "anonymous clients refused" in run(group, "anonymous", "refuse").stderr
    assert config(group, B)["allow_anonymous"] is False or wait_for_version(group, B, config(group, P)["version"]) >= 0
    assert run(group, "anonymous", "allow").returncode == 0
    result = run(group, "limits", "set", "session_queue_max_messages", "50_000")
    assert "limits.session_queue_max_messages set to 50,000" in result.stderr, result.stderr
    limits = json.loads(run(group, "limits", "list", "--json").stdout)
    assert limits["effective"]["session_queue_max_messages"] == 50_000
    assert limits["set"] == {"session_queue_max_messages": 50_000}
    assert "config-sync" in run(group, "limits", "list").stdout
    assert run(group, "limits", "unset", "session_queue_max_messages").returncode == 0
    assert json.loads(run(group, "limits", "list", "--json").stdout)["set"] == {}
    assert "overload.max_window set to 60" in run(group, "overload", "set", "max_window", "60").stderr
    assert run(group, "overload", "unset", "max_window").returncode == 0
    assert "auto-revert on" in run(group, "auto-revert", "on").stderr
    assert config(group, P)["auto_revert"] == {"effective": True, "set": True}
    assert run(group, "auto-revert", "default").returncode == 0
    same_on_both(group)


def test_show_config_sync(group):
    primary = same_on_both(group)
    result = pairmq("show", "config-sync", "--json", "--group", str(group.dir / "group.toml"))
    document = json.loads(result.stdout)
    nodes = {n["role"]: n for n in document["nodes"]}
    assert nodes["primary"]["status"] == "In-Sync" and nodes["backup"]["status"] == "In-Sync", nodes
    assert nodes["primary"]["mate"]["version"] == primary["version"] == nodes["backup"]["version"]
    table = pairmq("show", "config-sync", "--group", str(group.dir / "group.toml"))
    assert table.returncode == 0 and "In-Sync" in table.stdout and primary["digest"][:12] in table.stdout


def test_assert_from_the_backup_replaces_the_whole_configuration(group):
    before = same_on_both(group)
    result = run(group, "assert", "--from", "backup", "--yes")
    assert result.returncode == 0 and "replaced the whole configuration" in result.stderr, result.stderr
    after = same_on_both(group)
    assert after["version"] == before["version"] + 1 and after["digest"] == before["digest"]  # the same content


def test_help_has_examples():
    for command in (["config"], ["config", "users"], ["config", "users", "add"], ["config", "acl"],
                    ["config", "acl", "allow"], ["config", "anonymous", "refuse"], ["config", "limits", "set"],
                    ["config", "overload"], ["config", "auto-revert"], ["config", "assert"],
                    ["show", "config-sync"]):
        result = pairmq(*command, "--help")
        assert result.returncode == 0 and "examples:\n  pairmq " in result.stdout, (command, result.stderr)


def test_no_node_running_is_one_sentence(tmp_path):
    assert_one_sentence(pairmq("config", "users", "list", "--group", str(write_group(tmp_path, base="127.0.9."))),
                        "no routing node answered", code=1)


# --- the node, its access file to import and its configuration store -----------------------------------


@pytest.fixture
def offline_group(tmp_path):
    path = write_group(tmp_path)
    for role in Role:
        (tmp_path / "data" / role.value).mkdir(parents=True)
    return path, tmp_path / "data" / "primary"


def test_node_refuses_a_malformed_access_file_to_import(offline_group):
    group, data = offline_group
    path = data / "config" / "access.json"
    path.parent.mkdir(parents=True)
    path.write_text('{"version": 1, "acl": [{"effect": "allow"}]}')
    path.chmod(0o600)
    assert_one_sentence(pairmq("node", "--role", "primary", "--group", str(group)),
                        f"access file {path}", "acl[0].action must be publish, subscribe or both", code=1)


def test_node_refuses_an_access_file_readable_by_others(offline_group):
    group, data = offline_group
    path = data / "config" / "access.json"
    path.parent.mkdir(parents=True)
    path.write_text('{"version": 1}')
    path.chmod(0o644)
    assert_one_sentence(pairmq("node", "--role", "primary", "--group", str(group)),
                        "readable by others", f"chmod 600 {path}", code=1)


def test_node_refuses_a_corrupt_configuration_store(offline_group):
    group, data = offline_group
    path = store_path(data)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"not a database" * 500)
    assert_one_sentence(pairmq("node", "--role", "primary", "--group", str(group)),
                        f"configuration store {path} cannot be read", "move it aside", code=1)

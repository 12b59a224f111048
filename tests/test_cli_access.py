"""`pairmq config users|acl|anonymous` as a person meets them (the real console script), and a node
refusing a bad access file at start-up with one sentence."""

import json
import stat

import pytest

from appliance.access_file import access_path, load_access
from appliance.broker.access import verify_password
from appliance.config import load_group
from appliance.roles import Role
from tests.test_cli_commands import assert_one_sentence, pairmq, write_group


@pytest.fixture
def group(tmp_path):
    path = write_group(tmp_path)
    for role in Role:
        (tmp_path / "data" / role.value).mkdir(parents=True)
    return path


def files(group):
    config = load_group(group)
    return [access_path(config.node(r).data_dir) for r in (Role.PRIMARY, Role.BACKUP)]


def run(group, *args, stdin=None):
    import subprocess
    import sys

    from tests.test_cli_commands import REPO

    return subprocess.run([sys.executable, "-m", "cli.main", "config", *args, "--group", str(group)],
                          input=stdin, capture_output=True, text=True, timeout=30, cwd=REPO)


def test_users_add_passwd_del_list(group):
    added = run(group, "users", "add", "alice", "--password-stdin", stdin="s3cret\n")
    assert added.returncode == 0, added.stderr
    assert "added user 'alice'" in added.stderr
    primary, backup = files(group)
    for path in (primary, backup):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert primary.read_text() == backup.read_text()  # the same salts: one document
    policy = load_access(primary)
    assert verify_password(policy.users["alice"], b"s3cret")
    assert "s3cret" not in primary.read_text()

    assert run(group, "users", "passwd", "alice", "--password-stdin", stdin="n3w\n").returncode == 0
    policy = load_access(primary)
    assert verify_password(policy.users["alice"], b"n3w") and not verify_password(policy.users["alice"], b"s3cret")

    assert run(group, "users", "add", "bob", "--password-stdin", stdin="b\n").returncode == 0
    listed = run(group, "users", "list", "--json")
    assert json.loads(listed.stdout) == {"allow_anonymous": False, "users": ["alice", "bob"]}
    assert run(group, "users", "del", "alice").returncode == 0
    assert json.loads(run(group, "users", "list", "--json").stdout)["users"] == ["bob"]
    table = run(group, "users", "list")
    assert "bob" in table.stdout and "1 users; anonymous clients are refused" in table.stderr


@pytest.mark.parametrize("args, stdin, fragments", [
    (["users", "add", "alice", "--password-stdin"], "\n", ["an empty password is not allowed"]),
    (["users", "add", "alice"], "", ["no terminal to ask for the password on", "--password-stdin"]),
    (["users", "passwd", "nobody", "--password-stdin"], "x\n", ["there is no user 'nobody'"]),
    (["users", "del", "nobody"], None, ["there is no user 'nobody'"]),
    (["users", "add", "a\tb", "--password-stdin"], "x\n", ["control characters"]),
    (["acl", "allow", "publish", "a/#/b", "--all"], None, ["acl[0].filter 'a/#/b'"]),
    (["acl", "allow", "publish", "$share/g/a", "--all"], None, ["rules name topics"]),
    (["acl", "remove", "3"], None, ["there are no rules"]),
])
def test_bad_input_is_one_sentence_and_writes_nothing(group, args, stdin, fragments):
    assert_one_sentence(run(group, *args, stdin=stdin), *fragments, code=1)
    assert not any(p.exists() for p in files(group))


def test_usage_mistakes(group):
    assert_one_sentence(run(group, "acl", "allow", "publish", "a/#"), "one of the arguments", code=2)
    assert_one_sentence(run(group, "acl", "allow", "read", "a/#", "--all"), "invalid choice: 'read'", code=2)


def test_users_add_twice_is_refused(group):
    assert run(group, "users", "add", "alice", "--password-stdin", stdin="x\n").returncode == 0
    assert_one_sentence(run(group, "users", "add", "alice", "--password-stdin", stdin="y\n"),
                        "user 'alice' already exists", "users passwd", code=1)


def test_acl_allow_deny_list_remove(group):
    for args in (["deny", "publish", "secret/#", "--all"], ["allow", "both", "alice/#", "--user", "alice"],
                 ["allow", "subscribe", "public/#", "--anonymous"], ["allow", "publish", "public/#", "--users"]):
        result = run(group, "acl", *args)
        assert result.returncode == 0, result.stderr
    assert "added rule 3: allow publish public/# for users" in result.stderr
    rules = json.loads(run(group, "acl", "list", "--json").stdout)["rules"]
    assert [r["who"] for r in rules] == ["all", "user:alice", "anonymous", "users"]
    assert rules[0] == {"effect": "deny", "action": "publish", "filter": "secret/#", "who": "all"}
    table = run(group, "acl", "list")
    assert "secret/#" in table.stdout and "first match wins; no match: denied" in table.stderr
    assert run(group, "acl", "remove", "0").returncode == 0
    assert [r["filter"] for r in json.loads(run(group, "acl", "list", "--json").stdout)["rules"]] == \
        ["alice/#", "public/#", "public/#"]


def test_anonymous_allow_refuse_and_one_role(group):
    assert run(group, "anonymous", "allow", "--role", "backup").returncode == 0
    primary, backup = files(group)
    assert not primary.exists() and load_access(backup).allow_anonymous
    assert run(group, "anonymous", "refuse").returncode == 0
    assert not load_access(primary).allow_anonymous and not load_access(backup).allow_anonymous


def test_no_data_directory_here(tmp_path):
    group = write_group(tmp_path)
    assert_one_sentence(run(group, "users", "list"), "no routing node's data directory exists on this machine",
                        "--role", code=1)


def test_explicit_file(tmp_path):
    path = tmp_path / "elsewhere" / "access.json"
    assert pairmq("config", "anonymous", "allow", "--file", str(path)).returncode == 0
    assert load_access(path).allow_anonymous


def test_help_has_examples():
    for command in (["config"], ["config", "users"], ["config", "users", "add"], ["config", "acl"],
                    ["config", "acl", "allow"], ["config", "anonymous"], ["config", "anonymous", "refuse"]):
        result = pairmq(*command, "--help")
        assert result.returncode == 0 and "examples:\n  pairmq " in result.stdout, (command, result.stderr)


# --- the node and its access file ------------------------------------------------------------


def test_node_refuses_a_malformed_access_file(group):
    path = files(group)[0]
    path.parent.mkdir(parents=True)
    path.write_text('{"version": 1, "acl": [{"effect": "allow"}]}')
    path.chmod(0o600)
    assert_one_sentence(pairmq("node", "--role", "primary", "--group", str(group)),
                        f"access file {path}", "acl[0].action must be publish, subscribe or both", code=1)


def test_node_refuses_an_access_file_readable_by_others(group):
    path = files(group)[0]
    path.parent.mkdir(parents=True)
    path.write_text('{"version": 1}')
    path.chmod(0o644)
    assert_one_sentence(pairmq("node", "--role", "primary", "--group", str(group)),
                        "readable by others", f"chmod 600 {path}", code=1)

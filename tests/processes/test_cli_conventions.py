"""The CLI's conventions against a live group (the real console script in a subprocess):

- `pub`/`sub` fail at once on a refusal no node would answer differently, naming it in words and the
  most relevant cause across the host list; a denied subscription is exit 1; mosquitto's flags (-h/-p,
  -V, -f, -n, -F, -R, TLS with --cafile on 8883) work against a real node.
- A refused management token is named as such, not as "no node answered".
- `config` changes say what they did ("added user", sizes with units) and take `--json`.
(`pairmq check` and handovers: tests/processes/test_cli_check.py.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from pairmq.appliance.broker.access import AccessPolicy, Action, Effect, Rule, hash_password
from pairmq.appliance.config import TlsConfig
from pairmq.appliance.roles import Role
from tests.harness.certs import make_pki
from tests.harness.group import LOOPBACK, Group
from tests.unit.test_cli_commands import REPO, assert_one_sentence

P, B, M = Role.PRIMARY, Role.BACKUP, Role.MONITOR
PASSWORD = "alice-password"
RULES = (("allow", "both", "cli/#", "user:alice"),)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("cli-pki"), tuple(LOOPBACK.values()))


@pytest.fixture(scope="module")
def group(tmp_path_factory, pki):
    import secrets

    users = {"alice": hash_password(PASSWORD.encode(), secrets.token_bytes(16))}
    policy = AccessPolicy(False, users, tuple(Rule(Effect(e), Action(a), f, w) for e, a, f, w in RULES))
    with Group(tmp_path_factory.mktemp("cli-conventions") / "group", access=policy,
               tls=TlsConfig(pki.cert_file, pki.key_file)) as g:
        g.start()  # not active_group: its readiness probe connects anonymously, which this group refuses
        g.wait_for("the primary to serve", lambda: g.serving(P), timeout_s=30)
        g.wait_for("the backup to be in sync", g.backup_in_sync, timeout_s=30)
        yield g


def run(g, *args, stdin=None, env=None, timeout=60) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k not in ("PAIRMQ_GROUP", "PAIRMQ_TOKEN")}
    return subprocess.run([sys.executable, "-m", "pairmq.cli.main", *args, "--group", str(g.dir / "group.toml")],
                          input=stdin, capture_output=True, text=True, timeout=timeout, cwd=REPO,
                          env={**environ, **(env or {})})


def alice(*args) -> list[str]:
    return ["-u", "alice", "-P", PASSWORD, *args]


def both(g) -> list[str]:
    """mosquitto's -h, once per node, the standby first: the client must follow its redirect."""
    return ["-h", g.address(B), "-h", g.address(P)]


# --- pub / sub -----------------------------------------------------------------------------------


def test_an_anonymous_publish_is_refused_at_once_in_words(group):
    # A --timeout far beyond the subprocess's own: a client that retried until it would not return at all.
    result = run(group, "pub", *both(group), "-t", "cli/x", "-m", "x", "--timeout", "600")
    line = assert_one_sentence(result, "refused", code=1)
    assert "not authorized (0x87)" in line or "bad user name or password (0x86)" in line, line
    assert "within" not in line


def test_a_wrong_password_names_the_credentials_not_the_standbys_redirect(group):
    result = run(group, "pub", *both(group), "-u", "alice", "-P", "wrong", "-t", "cli/x", "-m", "x",
                 "--timeout", "600")
    line = assert_one_sentence(result, "bad user name or password (0x86)", code=1)
    assert "0x9C" not in line


def test_a_denied_subscription_is_exit_1_with_the_filter_and_the_reason(group):
    result = run(group, "sub", *both(group), *alice("-t", "secret/plans", "-W", "30"))
    assert_one_sentence(result, "denied the subscription to 'secret/plans'", "(0x87)", code=1)
    # One allowed and one denied filter: still a failure, naming only the denied one.
    mixed = run(group, "sub", *both(group), *alice("-t", "cli/ok", "-t", "secret/plans", "-W", "30"))
    line = assert_one_sentence(mixed, "'secret/plans'", code=1)
    assert "cli/ok" not in line


def test_mosquitto_flags_against_a_real_node(group, tmp_path):
    host, port = group.address(P), str(group.config.ports.mqtt)
    retained = run(group, "pub", "-h", host, "-p", port, *alice("-t", "cli/r", "-r", "-m", "old"))
    assert retained.returncode == 0, retained.stderr
    # -F with the common subset, on MQTT 3.1.1: the retained message arrives flagged.
    first = run(group, "sub", "-h", host, "-p", port, "-V", "mqttv311",
                *alice("-t", "cli/r", "-C", "1", "-W", "30", "-F", "%t|%q|%r|%l|%p"))
    assert first.returncode == 0, first.stderr
    assert first.stdout == "cli/r|1|1|3|old\n"  # a newline after each message, as mosquitto_sub (-N: none)

    body = tmp_path / "body.bin"
    body.write_bytes(b"from a file\n")
    sub = subprocess.Popen([sys.executable, "-m", "pairmq.cli.main", "sub", "-h", host, "-p", port, "-i", "cli-flags",
                            *alice("-t", "cli/r", "-t", "cli/f", "-R", "-C", "2", "-W", "60", "-F", "%t|%l|%p"),
                            "--group", str(group.dir / "group.toml")],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    try:
        group.wait_for("the subscriber's two filters", lambda: len(group.api(
            P, "/api/v1/subscriptions?client=cli-flags")["subscriptions"]) == 2, timeout_s=30)
        for args in (["-f", str(body)], ["-n"]):
            sent = run(group, "pub", "-h", host, "-p", port, "-V", "311", *alice("-t", "cli/f", *args))
            assert sent.returncode == 0, sent.stderr
        out, err = sub.communicate(timeout=60)
    finally:
        sub.kill()
    assert sub.returncode == 0, err
    # -R: the retained cli/r is not printed; -f sends the file as it is; -n an empty message.
    assert out == "cli/f|12|from a file\n\ncli/f|0|\n"


def test_a_persistent_sub_prints_every_message_queued_while_it_was_away(group):
    # The queued messages arrive right after CONNACK, before any SUBSCRIBE could: a subscriber that registered
    # its filters only after connecting acknowledged them and printed none or some.
    host = group.address(P)
    made = run(group, "sub", "-h", host, "-c", "-i", "cli-away", *alice("-t", "cli/away", "-q", "1", "-W", "1"))
    assert made.returncode == 0, made.stderr
    lines = [f"m{n}" for n in range(200)]
    sent = run(group, "pub", "-h", host, *alice("-t", "cli/away", "-q", "1", "-l"), stdin="\n".join(lines) + "\n")
    assert sent.returncode == 0, sent.stderr
    back = run(group, "sub", "-h", host, "-c", "-i", "cli-away", *alice("-t", "cli/away", "-q", "1", "-C", "200",
                                                                      "-W", "30"))
    assert back.returncode == 0, back.stderr
    assert back.stdout.splitlines() == lines


def test_tls_with_the_test_ca_on_8883(group, pki, tmp_path):
    ok = run(group, "pub", "-h", group.address(P), "--cafile", str(pki.ca_file),
             *alice("-t", "cli/tls", "-m", "over TLS"))
    assert ok.returncode == 0, ok.stderr
    other = make_pki(tmp_path / "other", tuple(LOOPBACK.values()))
    bad = run(group, "pub", "-h", group.address(P), "--cafile", str(other.ca_file), "--timeout", "3",
              *alice("-t", "cli/tls", "-m", "x"))
    assert_one_sentence(bad, "certificate verify failed", code=1)
    half = run(group, "pub", "-h", group.address(P), "--cafile", str(other.ca_file), "--cert", str(other.cert_file),
               *alice("-t", "cli/tls", "-m", "x"))
    assert_one_sentence(half, "--cert and --key go together", code=1)


def test_pub_and_sub_json(group):
    host = group.address(P)
    published = run(group, "pub", "-h", host, *alice("-t", "cli/j", "-r", "-m", "{\"a\": 1}", "--json"))
    assert published.returncode == 0, published.stderr
    document = json.loads(published.stdout)
    assert document["ok"] is True and document["sent"] == 1 and document["topic"] == "cli/j"
    got = run(group, "sub", "-h", host, *alice("-t", "cli/j", "-C", "1", "-W", "30", "--json"))
    assert got.returncode == 0, got.stderr
    assert [json.loads(line) for line in got.stdout.splitlines()] == [
        {"topic": "cli/j", "payload": "{\"a\": 1}", "qos": 1, "retain": True}]
    refused = run(group, "pub", "-h", host, "-t", "cli/j", "-m", "x", "--json")
    assert refused.returncode == 1
    error = json.loads(refused.stdout)
    assert error["ok"] is False and error["exit_code"] == 1 and "refused" in error["error"]


@pytest.mark.parametrize("flags, fragment", [
    (["-V", "mqttv4"], "-V takes mqttv5, mqttv311 or mqttv31"),
    (["-W", "0"], "'0' is not a positive number of seconds"),
    (["-p", "x"], "invalid int value"),
])
def test_bad_mosquitto_flags_are_usage_errors(group, flags, fragment):
    assert_one_sentence(run(group, "sub", "-t", "cli/#", *flags), fragment, code=2)


# --- management token, config wording, sizes ----------------------------------------------------------


def test_a_refused_management_token_is_named(group):
    wrong = {"PAIRMQ_TOKEN": "00" * 32}
    result = run(group, "show", "redundancy", env=wrong)
    assert_one_sentence(result, "the management token was refused by the primary, backup and monitor (401)", code=1)
    document = json.loads(run(group, "show", "redundancy", "--json", env=wrong).stdout)
    assert document["exit_code"] == 1 and "management token was refused" in document["error"]
    change = run(group, "config", "anonymous", "allow", env=wrong)
    assert_one_sentence(change, "the management token was refused by", "(401", code=1)
    check = run(group, "check", env=wrong)
    assert check.returncode == 3 and check.stdout.startswith("PAIRMQ UNKNOWN - the management token was refused")


def test_the_first_user_is_added_not_replaced(group):
    added = run(group, "config", "users", "add", "bob", "--password-stdin", stdin="bob-password\n")
    assert added.returncode == 0, added.stderr
    assert "added user 'bob'" in added.stderr and "replaced" not in added.stderr
    changed = run(group, "config", "users", "passwd", "bob", "--password-stdin", "--json", stdin="bob-password-2\n")
    assert changed.returncode == 0, changed.stderr
    document = json.loads(changed.stdout)
    assert document["ok"] and document["active"] == "primary" and document["confirmed_by_standby"] is True
    assert document["applied"][0]["version"] >= 2
    assert any("changed the password of user 'bob'" in m for m in document["messages"])
    listed = run(group, "config", "users", "list")
    assert "2 users;" in listed.stderr
    assert run(group, "config", "users", "del", "bob").returncode == 0
    assert "1 user;" in run(group, "config", "users", "list").stderr


def test_sizes_take_units(group):
    result = run(group, "config", "limits", "set", "spool_max_bytes", "8GiB")
    assert result.returncode == 0, result.stderr
    assert "limits.spool_max_bytes set to 8 GiB" in result.stderr
    limits = json.loads(run(group, "config", "limits", "list", "--json").stdout)
    assert limits["effective"]["spool_max_bytes"] == 8 * 1024**3
    assert "8 GiB" in run(group, "config", "limits", "list").stdout
    assert run(group, "config", "limits", "set", "session_queue_max_bytes", "512MiB").returncode == 0
    assert run(group, "config", "limits", "set", "session_queue_max_messages", "1e4").returncode == 0
    limits = json.loads(run(group, "config", "limits", "list", "--json").stdout)["effective"]
    assert limits["session_queue_max_bytes"] == 512 * 1024**2 and limits["session_queue_max_messages"] == 10_000
    for bad in ("8XB", "lots", "1.5"):
        assert_one_sentence(run(group, "config", "limits", "set", "spool_max_bytes", bad), repr(bad), code=1)
    assert run(group, "config", "limits", "unset", "spool_max_bytes").returncode == 0


def test_the_library_names_the_most_relevant_cause_when_it_does_not_fail_fast(group):
    from pairmq.cli.hostlist import ClientError, HostListClient

    # The standby first: its 0x9C redirect is the latest answer of every round, the active's 0x86 the cause.
    client = HostListClient([f"{group.address(B)}:1883", f"{group.address(P)}:1883"], "cli-ranking",
                            username="alice", password="wrong", connect_timeout_s=1)
    with pytest.raises(ClientError) as raised:
        client.start(timeout_s=3)
    client.stop()
    message = str(raised.value)
    assert "within 3 s" in message and f"{group.address(P)}:1883 refused 'cli-ranking': bad user name or password " \
                                      f"(0x86)" in message and "0x9C" not in message

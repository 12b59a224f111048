"""The CLI's conventions that need no group: `--version`, shell completion, `--json` on every command
(errors included), sizes with units, `pairmq check`'s verdicts, mosquitto_sub's -F, and the wording."""

from __future__ import annotations

import datetime
import json
import subprocess
from importlib.metadata import version
from types import SimpleNamespace

import pytest

from pairmq.appliance.errors import PairMQError
from pairmq.cli.check import State, evaluate
from pairmq.cli.main import _leaves, build_parser
from pairmq.cli.pubsub import format_message
from pairmq.cli.units import format_size, parse_number, parse_size
from tests.unit.test_cli_commands import assert_one_sentence, pairmq


def test_version_is_the_installed_distributions():
    result = pairmq("--version")
    assert result.returncode == 0 and result.stdout == f"pairmq {version('pairmq')}\n"


def test_bash_completion_is_generated_from_the_tree_and_is_valid_bash(tmp_path):
    result = pairmq("completion", "bash")
    assert result.returncode == 0, result.stderr
    script = tmp_path / "pairmq.bash"
    script.write_text(result.stdout)
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    # Every command and a deep option are offered (the script is generated, not written by hand).
    for word in ("check", "completion", "release-activity", "spool_max_bytes", "--password-stdin", "--cafile"):
        assert word in result.stdout, word
    # In bash itself: completing `pairmq ch` offers `check`.
    probe = subprocess.run(["bash", "-c", f"source {script}; COMP_WORDS=(pairmq ch); COMP_CWORD=1; "
                                          f"_shtab_pairmq; printf '%s\\n' \"${{COMPREPLY[@]}}\""],
                           capture_output=True, text=True)
    assert probe.stdout.split() == ["check"], probe


def test_zsh_completion_is_valid_zsh(tmp_path):
    script = tmp_path / "_pairmq"
    script.write_text(pairmq("completion", "zsh").stdout)
    assert subprocess.run(["zsh", "-n", str(script)], capture_output=True).returncode == 0


def test_an_unknown_shell_is_a_usage_error():
    assert_one_sentence(pairmq("completion", "powershell"), "invalid choice: 'powershell'", code=2)


def test_every_command_takes_json():
    parser = build_parser()
    leaves = [leaf for leaf in _leaves(parser) if leaf is not parser]
    assert len(leaves) > 40
    lacking = [leaf.prog for leaf in leaves if "--json" not in leaf._option_string_actions]
    assert lacking == ["pairmq node"]  # runs until stopped: one document has no meaning


def test_errors_are_json_too_with_the_same_exit_codes(tmp_path):
    usage = pairmq("config", "limits", "set", "no_such_limit", "1", "--json")
    assert usage.returncode == 2
    document = json.loads(usage.stdout)
    assert document["ok"] is False and document["exit_code"] == 2 and "invalid choice" in document["error"]
    missing = pairmq("show", "redundancy", "--json", "--group", str(tmp_path / "none.toml"))
    assert missing.returncode == 1
    document = json.loads(missing.stdout)
    assert document["exit_code"] == 1 and "none.toml" in document["error"]
    assert missing.stderr.startswith("error: ")  # a person still reads the sentence


def test_init_json_names_its_files_and_the_password(tmp_path):
    result = pairmq("init", "--dir", str(tmp_path), "--primary", "10.0.0.1", "--backup", "10.0.0.2",
                    "--monitor", "10.0.0.3", "--json")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)  # the whole of stdout is one document
    assert sorted(document["files"]) == sorted(str(p.resolve()) for p in tmp_path.iterdir())
    assert len(document["files"]) == 3 and document["admin_user"] == "admin" and len(document["admin_password"]) >= 12
    assert [n["role"] for n in document["nodes"]] == ["primary", "backup", "monitor"]
    assert "copy these 3 files to the same paths on each host (group.toml, secret, admin)" in " ".join(
        document["messages"])
    assert result.stderr == ""


def test_init_names_the_files_to_copy(tmp_path):
    result = pairmq("init", "--dir", str(tmp_path), "--primary", "10.0.0.1", "--backup", "10.0.0.2",
                    "--monitor", "10.0.0.3", "--management-tls")
    assert result.returncode == 0, result.stderr
    assert "copy these 5 files to the same paths on each host (group.toml, secret, admin, management.pem, " \
           "management.key)" in result.stderr
    assert "both files" not in result.stderr
    assert sum("admin password" in line for line in result.stdout.splitlines()) == 1


def test_events_follow_takes_role_like_tail_and_keeps_node_hidden():
    parser = build_parser()
    assert parser.parse_args(["events", "follow", "--role", "backup"]).role == "backup"
    assert parser.parse_args(["events", "follow", "--node", "monitor"]).role == "monitor"
    assert parser.parse_args(["events", "tail", "--role", "monitor"]).role == "monitor"
    help_text = pairmq("events", "follow", "--help").stdout
    assert "--role" in help_text and "--node" not in help_text


def test_wording():
    acl_help = pairmq("config", "acl", "--help").stdout
    assert "append a rule that denies" in acl_help and "denys" not in acl_help
    config_help = pairmq("config", "--help").stdout
    assert "limits settings" not in config_help and "the group's limits" in config_help


@pytest.mark.parametrize("text, expected", [
    ("8GiB", 8 * 1024**3), ("8 GiB", 8 * 1024**3), ("512MiB", 512 * 1024**2), ("64kB", 64_000), ("4G", 4 * 1024**3),
    ("1e9", 10**9), ("4096", 4096), ("1_000", 1000), ("1.5KiB", 1536), ("2gb", 2 * 10**9), ("10b", 10),
])
def test_sizes_with_units(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text, fragment", [
    ("8XB", "is not a size such as 8GiB"), ("lots", "is not a size"), ("", "is not a size"),
    ("1.5", "is not a whole number of bytes"), ("-1GiB", "is not a size"), ("1e999", "whole number of bytes"),
])
def test_bad_sizes_are_one_sentence(text, fragment):
    with pytest.raises(PairMQError, match=fragment):
        parse_size(text)


def test_numbers_and_shown_sizes():
    assert parse_number("50_000") == 50_000 and parse_number("1e4") == 10_000 and parse_number("0.5") == 0.5
    with pytest.raises(PairMQError, match="'lots' is not a number"):
        parse_number("lots")
    assert format_size(8 * 1024**3) == "8 GiB" and format_size(300) == "300 B"
    assert format_size(1536 * 1024) == "1.5 MiB (1,572,864 B)"


def view(role, **fields):
    return {"role": role, "reachable": True, "serving": False, "redundancy_status": "Up", "epoch": 4, **fields}


def down(role):
    return {"role": role, "reachable": False, "error": "connection refused"}


def test_check_verdicts():
    healthy = [view("primary", serving=True), view("backup"), view("monitor")]
    ok = evaluate("g", healthy, {"primary": "In-Sync", "backup": "In-Sync"})
    assert ok.state is State.OK
    assert ok.line() == ("PAIRMQ OK - group 'g': primary active (epoch 4), redundancy Up, configuration in sync | "
                         "nodes_answering=3;;;0;3 nodes_active=1;;1;0;1 epoch=4")
    out_of_sync = evaluate("g", healthy, {"primary": "In-Sync", "backup": "Out-Of-Sync"})
    assert out_of_sync.state is State.WARNING and "configuration out of sync on the backup" in out_of_sync.sentence
    lonely = evaluate("g", [view("primary", serving=True, redundancy_status="Down"), down("backup"), view("monitor")],
                      {"primary": "In-Sync"})
    assert lonely.state is State.WARNING
    assert lonely.sentence == "group 'g': primary active (epoch 4), redundancy Down; backup not answering"
    nobody = evaluate("g", [view("primary"), view("backup"), view("monitor")], {})
    assert nobody.state is State.CRITICAL and "no node holds activity" in nobody.sentence
    silent = evaluate("g", [down("primary"), down("backup"), down("monitor")], {})
    assert silent.state is State.UNKNOWN and int(silent.state) == 3


def test_sub_format_the_common_mosquitto_subset():
    message = SimpleNamespace(topic="a/b", payload=b"hello", qos=1, retain=True, mid=7)
    now = datetime.datetime(2026, 11, 29, 1, 2, 3, tzinfo=datetime.timezone.utc)
    assert format_message("%t %p %q %r %l %m %%\\n", message, now) == "a/b hello 1 1 5 7 %\n"
    assert format_message("%I|%U|\\t|\\\\|%x", message, now) == \
        "2026-11-29T01:02:03+00:00|1795914123.000000000|\t|\\|%x"


def test_one_client_is_one_client():
    from pairmq.cli.show_broker import clients_table
    from tests.unit.test_cli_show_broker import CLIENTS, rendered

    one = {**CLIENTS, "total": 1, "clients": CLIENTS["clients"][:1]}
    assert rendered(clients_table(one))[0] == "Group orders: 1 client on the backup (10.0.0.2)"


def test_local_up_waits_for_a_redundant_group():
    from pairmq.cli.local import _redundant

    active = view("primary", serving=True)
    assert _redundant([active, view("backup", in_sync=True), view("monitor")])
    # The state `local up` used to end on: the standby not joined yet.
    assert not _redundant([{**active, "redundancy_status": "Down"}, view("backup", in_sync=False), view("monitor")])
    assert not _redundant([active, view("backup", in_sync=False), view("monitor")])
    assert not _redundant([view("primary"), view("backup", in_sync=True), view("monitor")])


def test_check_without_a_usable_group_file_is_unknown(tmp_path):
    result = pairmq("check", "--group", str(tmp_path / "none.toml"))
    assert result.returncode == 3 and result.stderr == ""
    assert result.stdout.startswith("PAIRMQ UNKNOWN - ") and "none.toml" in result.stdout
    assert result.stdout.count("\n") == 1

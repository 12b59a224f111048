"""`pairmq` commands as a person meets them: the real console script in a subprocess
(`python -m pairmq.cli.main`), or `main()` in-process with string consoles for exact output.

Every mistake must end as one sentence on stderr with a non-zero exit code,
never a usage dump or a traceback. The management API is played by a small
real HTTP server on its own loopback address and a free port, so these tests
never touch the fixed ports a local group uses.
"""

import http.server
import json
import os
import stat
import subprocess
import sys
import threading
import time
import tomllib
from io import StringIO
from pathlib import Path

import pytest
from rich.console import Console

from pairmq.appliance.config import GroupConfig, NodeSpec, load_group, load_secret, render_group, write_secret
from pairmq.appliance.keyring import management_token
from pairmq.appliance.roles import Role
from pairmq.cli.main import main
from pairmq.cli.terminal import Terminal

REPO = Path(__file__).resolve().parents[2]


def pairmq(*args: str, env: dict | None = None, cwd: Path = REPO) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k != "PAIRMQ_GROUP"}
    return subprocess.run([sys.executable, "-m", "pairmq.cli.main", *args], capture_output=True, text=True, timeout=30,
                          cwd=cwd, env={**environ, **(env or {})})


def assert_one_sentence(result: subprocess.CompletedProcess, *fragments: str, code: int | None = None) -> str:
    assert result.returncode != 0, result
    if code is not None:
        assert result.returncode == code, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert lines[0].startswith("error: ")
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


# --- init ----------------------------------------------------------------------------------


def test_init_writes_a_loadable_group_file_and_a_private_secret(tmp_path):
    result = pairmq("init", "--dir", str(tmp_path / "g"), "--name", "orders",
                    "--primary", "10.0.0.1", "--backup", "10.0.0.2", "--monitor", "10.0.0.3")
    assert result.returncode == 0, result.stderr
    group_file, secret_file = tmp_path / "g" / "group.toml", tmp_path / "g" / "secret"
    config = load_group(group_file)
    assert config.name == "orders"
    assert [config.node(r).address for r in Role] == ["10.0.0.1", "10.0.0.2", "10.0.0.3"]
    assert config.node(Role.BACKUP).data_dir == Path("/var/lib/pairmq/backup")
    assert config.secret_file == secret_file.resolve()
    assert stat.S_IMODE(secret_file.stat().st_mode) == 0o600
    assert len(load_secret(config)) == 32
    assert tomllib.loads(group_file.read_text())["group"]["secret_file"] == "secret"  # portable between hosts
    assert f"wrote {group_file}" in result.stderr and f"wrote {secret_file}" in result.stderr
    for role, address in (("primary", "10.0.0.1"), ("backup", "10.0.0.2"), ("monitor", "10.0.0.3")):
        assert f"on {address}" in result.stdout
        assert f"pairmq node --role {role} --group {group_file}\n" in result.stdout


def test_init_without_addresses_lays_the_group_out_on_this_machine(tmp_path):
    result = pairmq("init", "--dir", str(tmp_path), "--data-dir", "data")
    assert result.returncode == 0, result.stderr
    config = load_group(tmp_path / "group.toml")
    assert config.host_list() == "127.0.0.1:1883,127.0.0.2:1883"
    assert config.node(Role.MONITOR).data_dir == tmp_path.resolve() / "data" / "monitor"  # relative to the file


def test_init_refuses_to_overwrite_without_force(tmp_path):
    assert pairmq("init", "--dir", str(tmp_path)).returncode == 0
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert_one_sentence(pairmq("init", "--dir", str(tmp_path), "--name", "other"), "already exists", "--force")
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before

    result = pairmq("init", "--dir", str(tmp_path), "--name", "other", "--force")
    assert result.returncode == 0, result.stderr
    assert "replaced" in result.stderr
    assert load_group(tmp_path / "group.toml").name == "other"
    assert (tmp_path / "secret").read_bytes() != before["secret"]
    assert (tmp_path / "admin").read_bytes() != before["admin"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["admin", "group.toml", "secret"]  # no temporary files left


def test_init_prints_a_generated_admin_password_once_or_takes_the_operators(tmp_path):
    from pairmq.appliance.api.admin_credential import read_admin
    from pairmq.appliance.broker.access import verify_password

    result = pairmq("init", "--dir", str(tmp_path / "a"))
    assert result.returncode == 0, result.stderr
    line = [l for l in result.stdout.splitlines() if l.startswith("admin password (user admin")]
    assert len(line) == 1 and f"wrote {(tmp_path / 'a' / 'admin').resolve()}" in result.stderr
    password = line[0].rsplit(": ", 1)[1]
    credential = read_admin(tmp_path / "a" / "admin")
    assert credential.username == "admin" and verify_password(credential.record, password.encode())
    assert stat.S_IMODE((tmp_path / "a" / "admin").stat().st_mode) == 0o600
    assert password not in (tmp_path / "a" / "admin").read_text()

    chosen = subprocess.run([sys.executable, "-m", "pairmq.cli.main", "init", "--dir", str(tmp_path / "b"),
                             "--admin-password-stdin"], input="my own admin password\n", capture_output=True,
                            text=True, timeout=30, cwd=REPO)
    assert chosen.returncode == 0 and "admin password" not in chosen.stdout, chosen
    assert verify_password(read_admin(tmp_path / "b" / "admin").record, b"my own admin password")

    short = subprocess.run([sys.executable, "-m", "pairmq.cli.main", "init", "--dir", str(tmp_path / "c"),
                            "--admin-password-stdin"], input="short\n", capture_output=True, text=True, timeout=30,
                           cwd=REPO)
    assert_one_sentence(short, "the admin password must have at least 12 characters", code=1)
    assert not (tmp_path / "c").exists()


@pytest.mark.parametrize("args,fragments", [
    (["--primary", "10.0.0.1"], ["give all three", "missing --backup, --monitor"]),
    (["--primary", "10.0.0.1", "--backup", "10.0.0.2", "--monitor", "host-c"],
     ["nodes.monitor.address must be an IP address"]),
    (["--primary", "10.0.0.1", "--backup", "10.0.0.1", "--monitor", "10.0.0.3"], ["distinct addresses"]),
    (["--name", ""], ["group.name must be a non-empty string"]),
])
def test_init_bad_input_writes_nothing(tmp_path, args, fragments):
    assert_one_sentence(pairmq("init", "--dir", str(tmp_path / "g"), *args), *fragments, code=1)
    assert not (tmp_path / "g").exists()


# --- bad input anywhere: one sentence -------------------------------------------------------


def write_group(directory: Path, edit=None, *, base="127.0.0.", management=8080, secret=True) -> Path:
    nodes = {r: NodeSpec(r, f"{base}{i + 1}", directory / "data" / r.value) for i, r in enumerate(Role)}
    text = render_group(GroupConfig("test", nodes, directory / "secret"))
    text = text.replace("management = 8080", f"management = {management}")
    if edit:
        text = edit(text)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "group.toml").write_text(text)
    if secret and not (directory / "secret").exists():
        write_secret(directory / "secret")
    return directory / "group.toml"


def test_unknown_role_is_a_usage_error():
    line = assert_one_sentence(pairmq("node", "--role", "leader", "--group", "/nonexistent.toml"),
                               "--role", "invalid choice: 'leader'", "pairmq node --help", code=2)
    assert "usage:" not in line


def test_unknown_command_and_missing_option_are_usage_errors():
    assert_one_sentence(pairmq("shwo"), "invalid choice", code=2)
    assert_one_sentence(pairmq("node"), "--role", code=2)


@pytest.mark.parametrize("command", [["show", "redundancy"], ["node", "--role", "primary"],
                                     ["redundancy", "force-activity", "--role", "backup", "--i-understand-data-loss"]])
def test_missing_group_file(tmp_path, command):
    missing = tmp_path / "nope.toml"
    assert_one_sentence(pairmq(*command, "--group", str(missing)), f"group file {missing} does not exist",
                        "pairmq init", code=1)


def test_group_file_from_the_environment(tmp_path):
    missing = tmp_path / "from-env.toml"
    assert_one_sentence(pairmq("show", "redundancy", env={"PAIRMQ_GROUP": str(missing)}), str(missing))


@pytest.mark.parametrize("command", [["show", "redundancy"], ["node", "--role", "backup"]])
@pytest.mark.parametrize("edit,fragments", [
    (lambda t: t.replace("lease_ms =", "lease_msec ="), ["unknown key 'lease_msec' in [timers]"]),
    (lambda t: t.replace("[ports]", "[port]"), ["unknown key 'port' in the group file"]),
    (lambda t: t.replace("lease_ms = 500", "lease_ms = 150"), ["unsafe timers", "lease_ms (150)"]),
    (lambda t: t.replace("takeover_margin_ms = 100", "takeover_margin_ms = 20"), ["unsafe timers"]),
    (lambda t: t.replace('name = "test"', "name = test"), ["is not valid TOML"]),
])
def test_bad_group_files(tmp_path, command, edit, fragments):
    group = write_group(tmp_path, edit)
    assert_one_sentence(pairmq(*command, "--group", str(group)), *fragments, code=1)


def test_node_refuses_a_secret_readable_by_others(tmp_path):
    group = write_group(tmp_path)
    (tmp_path / "secret").chmod(0o644)
    assert_one_sentence(pairmq("node", "--role", "monitor", "--group", str(group)), "readable by others",
                        "chmod 600", code=1)


def test_force_activity_refuses_without_the_acknowledgement(tmp_path):
    line = assert_one_sentence(pairmq("redundancy", "force-activity", "--role", "backup",
                                      "--group", str(tmp_path / "nope.toml")), "--i-understand-data-loss", code=1)
    assert "lost" in line


def test_show_redundancy_when_no_node_answers(tmp_path):
    group = write_group(tmp_path, base="127.0.0.7", management=free_port("127.0.0.71"))
    assert_one_sentence(pairmq("show", "redundancy", "--group", str(group)),
                        "no node of group 'test' answered", "connection refused", code=1)
    assert_one_sentence(pairmq("show", "redundancy", "--json", "--group", str(group)), "no node", code=1)


def test_help_has_examples_everywhere():
    for command in ([], ["init"], ["node"], ["local"], ["local", "up"], ["local", "down"], ["local", "status"],
                    ["show"], ["show", "redundancy"], ["redundancy"], ["redundancy", "force-activity"]):
        result = pairmq(*command, "--help")
        assert result.returncode == 0, (command, result.stderr)
        assert "examples:\n  pairmq " in result.stdout, command


# --- against a stand-in node: one real HTTP server on its own address ---------------------------


def free_port(address: str) -> int:
    import socket
    with socket.socket() as s:
        s.bind((address, 0))
        return s.getsockname()[1]


BACKUP_VIEW = {
    "schema": 1, "group": "test", "role": "backup", "address": "127.0.0.82", "activity": "Local Active",
    "serving": True, "epoch": 4, "active_role": "backup", "redundancy_status": "Down", "in_sync": True,
    "incarnation": 2, "uptime_ms": 5000, "lease_remaining_ms": 450,
    "peers": [{"role": "primary", "seen": False, "heard_ms_ago": 9000, "activity": "active", "epoch": 3},
              {"role": "monitor", "seen": False, "heard_ms_ago": None, "activity": None, "epoch": None}],
    "last_decision": {"kind": "activate", "epoch": 4, "ms_ago": 2500,
                      "reason": "backup: primary unseen 1.6 s, monitor concurs, in sync → taking activity, epoch 4"},
    "decisions": [], "accepted_heartbeats": 10, "rejected_heartbeats": {}, "mqtt": None,
}


class StandIn(http.server.BaseHTTPRequestHandler):
    """The backup's management API: serves BACKUP_VIEW, records POSTs, answers `reply`."""

    requests: list = []
    reply = (200, {"result": "forced bid started", "role": "backup"})

    def do_GET(self):
        self._send(200, BACKUP_VIEW) if self.path == "/api/v1/redundancy" else self._send(404, {"error": "not found"})

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).requests.append((self.path, self.headers["Host"], self.headers["Authorization"], body))
        self._send(*type(self).reply)

    def _send(self, status, document):
        data = json.dumps(document).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def stand_in(tmp_path):
    """A group on 127.0.0.81-83 where only the backup (127.0.0.82) answers, on a free port."""
    port = free_port("127.0.0.82")
    server = http.server.ThreadingHTTPServer(("127.0.0.82", port), StandIn)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    StandIn.requests = []
    StandIn.reply = (200, {"result": "forced bid started", "role": "backup"})
    try:
        yield write_group(tmp_path, base="127.0.0.8", management=port)
    finally:
        server.shutdown()
        server.server_close()


def run_main(*argv: str, width: int = 120) -> tuple[int, str, str]:
    out = Console(file=StringIO(), width=width, color_system=None)
    err = Console(file=StringIO(), width=width, color_system=None)
    code = main(list(argv), Terminal(out=out, err=err))
    return code, out.file.getvalue(), err.file.getvalue()


def test_show_redundancy_table_with_two_nodes_down(stand_in):
    code, out, err = run_main("show", "redundancy", "--group", str(stand_in))
    assert (code, err) == (0, "")
    assert [line.rstrip() for line in out.splitlines()] == [
        "Group test: redundancy",
        "Role     Address     Activity      Epoch  Peers seen  Redundancy  In sync  Last decision",
        "─" * 120,
        "primary  127.0.0.81  unreachable       -  -           -           -        connection refused (is the node running?)",
        "backup   127.0.0.82  Local Active      4  none        Down        yes      primary unseen 1.6 s, monitor concurs, in",
        "                                                                           sync → taking activity, epoch 4 (2.5 s ago)",
        "monitor  127.0.0.83  unreachable       -  -           -           -        connection refused (is the node running?)",
    ]


def test_show_redundancy_json_with_two_nodes_down(stand_in):
    result = pairmq("show", "redundancy", "--json", "--group", str(stand_in))
    assert result.returncode == 0 and result.stderr == "", result.stderr
    doc = json.loads(result.stdout)
    assert doc["group"] == "test" and doc["schema"] == 1
    primary, backup, monitor = doc["nodes"]
    assert backup == {**BACKUP_VIEW, "reachable": True}
    assert primary == {"role": "primary", "address": "127.0.0.81", "reachable": False,
                       "error": "connection refused (is the node running?)"}
    assert monitor["reachable"] is False and monitor["role"] == "monitor"


def test_watch_and_json_do_not_mix(stand_in):
    assert_one_sentence(pairmq("show", "redundancy", "--json", "--watch", "--group", str(stand_in)),
                        "--watch and --json cannot be combined")


def test_force_activity_is_signed_and_sends_the_acknowledgement(stand_in):
    """The request is signed with the group's management key over its method, host, path and body; the key
    itself is nowhere in what went over the wire."""
    from pairmq.appliance.keyring import management_key
    from pairmq.appliance.api.signing import Verifier

    code, out, err = run_main("redundancy", "force-activity", "--role", "backup", "--i-understand-data-loss",
                              "--group", str(stand_in))
    assert code == 0, err
    assert out == ""
    assert err == "backup: forced bid started; follow it with `pairmq show redundancy --watch`\n"
    secret = load_secret(load_group(stand_in))
    [(path, host, authorization, body)] = StandIn.requests
    assert (path, json.loads(body)) == ("/api/v1/redundancy/force-activity", {"acknowledge_data_loss": True})
    assert management_token(secret) not in authorization and authorization.startswith("PairMQ-HMAC ")
    Verifier().verify(authorization.partition(" ")[2], [management_key(secret)], "POST", {host}, host, path, body,
                      time.time_ns() // 1_000_000)


def test_force_activity_surfaces_the_nodes_error_sentence(stand_in):
    StandIn.reply = (409, {"error": "this node already holds activity"})
    result = pairmq("redundancy", "force-activity", "--role", "backup", "--i-understand-data-loss",
                    "--group", str(stand_in))
    assert_one_sentence(result, "the backup node refused: this node already holds activity", code=1)


def test_force_activity_on_a_node_that_is_down(stand_in):
    result = pairmq("redundancy", "force-activity", "--role", "primary", "--i-understand-data-loss",
                    "--group", str(stand_in))
    assert_one_sentence(result, "cannot reach the primary node at http://127.0.0.81:", "connection refused", code=1)

"""`pairmq local up|status|down`: a whole group of real node processes on this machine.

The local group uses the fixed ports (8300, 1883, 8080) on 127.0.0.1-3, which
every test running a loopback group shares: each test here waits until they are
free, runs one group at a time, and always brings it down in its teardown.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pairmq.cli.render import redundancy_table
from tests.harness.group import fixed_ports as shared_fixed_ports

REPO = Path(__file__).resolve().parents[2]
ADDRESSES = {"primary": "127.0.0.1", "backup": "127.0.0.2", "monitor": "127.0.0.3"}


def pairmq(*args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k != "PAIRMQ_GROUP"}
    return subprocess.run([sys.executable, "-m", "pairmq.cli.main", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, env=environ)


@pytest.fixture
def fixed_ports():
    with shared_fixed_ports():
        yield


@pytest.fixture
def local_dir(tmp_path, fixed_ports):
    directory = tmp_path / "local"
    try:
        yield directory
    finally:
        pairmq("local", "down", "--dir", str(directory))


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"


def wait_gone(pid: int, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while pid_alive(pid):
        assert time.monotonic() < deadline, f"pid {pid} still alive"
        time.sleep(0.05)


def node_processes(directory: Path) -> list[int]:
    """Live processes running a node of the group in `directory` (other tenants' groups do not count)."""
    group = str(directory / "group.toml").encode()
    pids = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if group in (proc / "cmdline").read_bytes().split(b"\0") and pid_alive(int(proc.name)):
                pids.append(int(proc.name))
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return pids


def one_sentence(result: subprocess.CompletedProcess) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


def test_up_status_down(local_dir):
    up = pairmq("local", "up", "--dir", str(local_dir))
    assert up.returncode == 0, up.stderr
    assert "Host list: 127.0.0.1:1883,127.0.0.2:1883\n" in up.stdout
    assert "Group local: redundancy" in up.stdout and "Local Active" in up.stdout
    # `up` returns once the standby has joined: its last table shows the group redundant, not half-started.
    [active_row] = [line for line in up.stdout.splitlines() if "Local Active" in line]
    assert " Up " in active_row and "the standby has not joined" not in up.stderr, up.stdout
    assert "created" in up.stderr and "is up in" in up.stderr
    # The embedded default lets anonymous clients in, explicitly: an access file on each routing node.
    assert "anonymous MQTT clients are allowed" in up.stderr
    # And an admin password for the management API, printed once, whose scrypt record is the admin file.
    from pairmq.appliance.api.admin_credential import read_admin
    from pairmq.appliance.broker.access import verify_password

    # On stdout, as `init` prints it: it is data.
    assert "admin password" not in up.stderr
    [password] = [line.rsplit(": ", 1)[1] for line in up.stdout.splitlines() if "admin password" in line]
    assert verify_password(read_admin(local_dir / "admin").record, password.encode())
    pub = subprocess.run(["mosquitto_pub", "-h", "127.0.0.1", "-t", "local/anonymous", "-m", "hi"],
                         capture_output=True, text=True, timeout=10)
    assert pub.returncode == 0, pub.stderr
    refused = subprocess.run(["mosquitto_pub", "-h", "127.0.0.1", "-t", "t", "-m", "x", "-u", "nobody", "-P", "x"],
                             capture_output=True, text=True, timeout=10)
    assert refused.returncode != 0 and "bad user name or password" in refused.stderr.lower(), refused.stderr

    show = pairmq("show", "redundancy", "--json", "--group", str(local_dir / "group.toml"))
    assert show.returncode == 0, show.stderr
    doc = json.loads(show.stdout)
    assert doc["group"] == "local"
    nodes = {n["role"]: n for n in doc["nodes"]}
    assert [n for n in nodes.values() if n["serving"]] == [nodes["primary"]]
    assert nodes["primary"]["activity"] == "Local Active"
    assert nodes["backup"]["activity"] in ("Mate Active", "Standby")
    assert nodes["monitor"]["activity"] == "Monitor"
    assert all(n["reachable"] and n["address"] == ADDRESSES[n["role"]] for n in nodes.values())
    mqtt = nodes["primary"]["mqtt"]  # the listener's overload state, for the management API
    assert 1 <= mqtt["window"] <= 100 and mqtt["max_connections"] == 20_000
    assert mqtt["busy_refusals"] == mqtt["limit_refusals"] == mqtt["throttled_clients"] == 0
    redundancy_table(doc["nodes"])  # the renderer takes the real view model as it is

    status = pairmq("local", "status", "--dir", str(local_dir), "--json")
    assert status.returncode == 0, status.stderr
    processes = {p["role"]: p for p in json.loads(status.stdout)["processes"]}
    assert all(p["running"] for p in processes.values())
    pids = {role: p["pid"] for role, p in processes.items()}
    assert all(pid_alive(pid) for pid in pids.values())
    assert sorted(node_processes(local_dir)) == sorted(pids.values())
    table = pairmq("local", "status", "--dir", str(local_dir))
    assert table.returncode == 0 and "Processes" in table.stdout and "running" in table.stdout

    again = pairmq("local", "up", "--dir", str(local_dir))
    assert again.returncode == 1
    assert "is already running" in one_sentence(again)
    assert {role: json.loads(pairmq("local", "status", "--dir", str(local_dir), "--json").stdout)
            ["processes"][i]["pid"] for i, role in enumerate(pids)} == pids

    # A node dies: `up` starts what is missing (as an operator restarts one host); the others keep running.
    os.kill(pids["backup"], signal.SIGKILL)
    wait_gone(pids["backup"])
    back = pairmq("local", "up", "--dir", str(local_dir))
    assert back.returncode == 0, back.stderr
    assert "already running: starting backup" in back.stderr and "Local Active" in back.stdout
    now = {p["role"]: p for p in json.loads(pairmq("local", "status", "--dir", str(local_dir), "--json").stdout)
           ["processes"]}
    assert all(p["running"] for p in now.values())
    assert now["primary"]["pid"] == pids["primary"] and now["monitor"]["pid"] == pids["monitor"]
    assert now["backup"]["pid"] != pids["backup"]
    pids["backup"] = now["backup"]["pid"]

    # The real token reaches the real API, which refuses: a healthy active cannot be forced out.
    force = pairmq("redundancy", "force-activity", "--role", "backup", "--i-understand-data-loss",
                   "--group", str(local_dir / "group.toml"))
    assert force.returncode == 1
    assert "the backup node refused: the primary holds activity and is healthy" in one_sentence(force)
    refused = pairmq("redundancy", "force-activity", "--role", "primary", "--i-understand-data-loss",
                     "--group", str(local_dir / "group.toml"))
    assert "the primary node refused: this node already holds activity" in one_sentence(refused)

    # A node that ignores SIGTERM (stopped) is killed after the grace period.
    os.kill(pids["monitor"], signal.SIGSTOP)
    down = pairmq("local", "down", "--dir", str(local_dir))
    assert down.returncode == 0, down.stderr
    assert one_sentence_ok(down).startswith(f"stopped the local group in {local_dir}: ")
    assert f"primary (pid {pids['primary']})" in down.stderr
    assert f"monitor (pid {pids['monitor']}, killed after 5 s)" in down.stderr
    assert not any(pid_alive(pid) for pid in pids.values())
    assert list((local_dir / "run").iterdir()) == []

    second = pairmq("local", "down", "--dir", str(local_dir))
    assert second.returncode == 0
    assert one_sentence_ok(second) == f"nothing to stop: no local group is running in {local_dir}"
    stopped = pairmq("local", "status", "--dir", str(local_dir), "--json")
    assert not any(p["running"] for p in json.loads(stopped.stdout)["processes"])
    assert node_processes(local_dir) == []


def one_sentence_ok(result: subprocess.CompletedProcess) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_a_node_dying_during_start_up_is_named_and_the_rest_are_stopped(local_dir):
    assert pairmq("init", "--dir", str(local_dir), "--name", "local", "--data-dir", "data").returncode == 0
    (local_dir / "data").mkdir()
    (local_dir / "data" / "monitor").write_text("a file where the monitor's data directory should be\n")
    up = pairmq("local", "up", "--dir", str(local_dir))
    assert up.returncode == 1
    lines = up.stderr.strip().splitlines()
    assert "Traceback" not in up.stderr
    assert lines[-2:] == [
        "stopped the nodes that had started (primary, backup)",
        f"error: the monitor node exited during start-up (exit code 1); its log is {local_dir / 'logs' / 'monitor.log'}",
    ]
    # Above them, the tail of the monitor's log says why.
    assert f"  error: the monitor node cannot use {(local_dir / 'data' / 'monitor').resolve()}: File exists" in lines
    assert list((local_dir / "run").iterdir()) == []
    assert node_processes(local_dir) == []


def test_node_logs_one_line_per_record_and_exits_0_on_sigterm(local_dir):
    assert pairmq("init", "--dir", str(local_dir), "--name", "local", "--data-dir", "data").returncode == 0
    log_path = local_dir / "monitor.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "pairmq.cli.main", "node", "--role", "monitor",
                                 "--group", str(local_dir / "group.toml")], cwd=REPO, stdout=subprocess.PIPE,
                                stderr=log, text=True)
    try:
        deadline = time.monotonic() + 10
        while "monitor: listening on 127.0.0.3" not in log_path.read_text():
            if proc.poll() is not None:
                pytest.fail(f"the monitor exited during start-up:\n{log_path.read_text()}")
            assert time.monotonic() < deadline, "the monitor did not start within 10 s"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = log_path.read_text()
    assert proc.returncode == 0, err
    assert out == ""
    lines = err.splitlines()
    assert lines[-1].endswith("INFO pairmq.cli: monitor: stopped")
    for line in lines:  # 2025-01-31T12:00:00.123 LEVEL logger: message
        stamp, level, _ = line.split(" ", 2)
        assert len(stamp) == 23 and stamp[10] == "T" and level in ("INFO", "WARNING", "ERROR"), line

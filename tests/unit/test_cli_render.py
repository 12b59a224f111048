"""The CLI's renderers and its JSON: exact output from a fixed view model.

The view models here have the shape `Node.redundancy_view()` serves (plus the
CLI's `reachable` key); tests/processes/test_local_group.py renders real ones.
"""

import json
from io import StringIO

import pytest
from rich.console import Console

from pairmq.appliance.config import GroupConfig, NodeSpec
from pairmq.appliance.roles import Role
from pairmq.cli import api
from pairmq.cli.render import age, process_table, redundancy_table, resync_table, size
from pairmq.cli.terminal import Terminal

WIDTH = 120


def view(role, address, activity, *, serving=False, epoch=8, seen=(), status="Down", in_sync=False,
         decision=None):
    others = [r.value for r in Role if r.value != role]
    return {
        "schema": 1, "group": "orders", "role": role, "address": address, "activity": activity,
        "serving": serving, "epoch": epoch, "active_role": "backup", "redundancy_status": status,
        "in_sync": in_sync, "incarnation": 3, "uptime_ms": 912_000, "lease_remaining_ms": 410 if serving else 0,
        "peers": [{"role": r, "seen": r in seen, "heard_ms_ago": 20, "activity": None, "epoch": epoch}
                  for r in others],
        "last_decision": decision, "decisions": [decision] if decision else [],
        "accepted_heartbeats": 1200, "rejected_heartbeats": {"bad_mac": 0}, "mqtt": None, "reachable": True,
    }


NODES = [
    {"role": "primary", "address": "10.0.0.1", "reachable": False,
     "error": "connection refused (is the node running?)"},
    view("backup", "10.0.0.2", "Local Active", serving=True, seen=("monitor",), in_sync=True, decision={
        "kind": "activate", "epoch": 8, "ms_ago": 95_000,
        "reason": "backup: primary unseen 1.6 s, monitor concurs, in sync → taking activity, epoch 8"}),
    view("monitor", "10.0.0.3", "Monitor", seen=("backup",), decision={
        "kind": "vote", "epoch": 8, "ms_ago": 95_200,
        "reason": "monitor: primary unseen 1.5 s → granting epoch 8 to backup"}),
]


def render(renderable, width=WIDTH) -> str:
    console = Console(file=StringIO(), width=width, color_system=None)
    console.print(renderable)
    return console.file.getvalue()


def padded(*lines: str, width=WIDTH) -> str:
    """Rich pads every table line to the table's width; spelled out here so editors cannot strip it."""
    return "".join(line.ljust(width) + "\n" for line in lines)


def test_redundancy_table_exact_with_an_unreachable_node():
    assert render(redundancy_table(NODES, title="Group orders: redundancy")) == padded(
        "Group orders: redundancy",
        "Role     Address   Activity      Epoch  Peers seen  Redundancy  In sync  Last decision",
        "─" * WIDTH,
        "primary  10.0.0.1  unreachable       -  -           -           -        connection refused (is the node running?)",
        "backup   10.0.0.2  Local Active      8  monitor     Down        yes      primary unseen 1.6 s, monitor concurs, in sync",
        "                                                                         → taking activity, epoch 8 (95 s ago)",
        "monitor  10.0.0.3  Monitor           8  backup      Down        -        primary unseen 1.5 s → granting epoch 8 to",
        "                                                                         backup (95 s ago)",
    )


def test_redundancy_table_healthy_group_and_no_decision_yet():
    nodes = [
        view("primary", "127.0.0.1", "Local Active", serving=True, epoch=1, seen=("backup", "monitor"), status="Up",
             in_sync=True, decision={"kind": "activate", "epoch": 1, "ms_ago": 400, "reason": "primary: taking activity, epoch 1"}),
        view("backup", "127.0.0.2", "Mate Active", epoch=1, seen=("primary", "monitor"), status="Up", in_sync=True,
             decision=None),
        view("monitor", "127.0.0.3", "Monitor", epoch=1, seen=(), status="Down", decision=None),
    ]
    assert render(redundancy_table(nodes)) == padded(
        "Role     Address    Activity      Epoch  Peers seen        Redundancy  In sync  Last decision",
        "─" * 116,
        "primary  127.0.0.1  Local Active      1  backup, monitor   Up          yes      taking activity, epoch 1 (0.4 s ago)",
        "backup   127.0.0.2  Mate Active       1  primary, monitor  Up          yes      -",
        "monitor  127.0.0.3  Monitor           1  none              Down        -        -",
        width=116,
    )


def test_process_table_exact():
    processes = [
        {"role": "primary", "pid": 4242, "running": True, "log": "local/logs/primary.log"},
        {"role": "backup", "pid": None, "running": False, "log": "local/logs/backup.log"},
    ]
    assert render(process_table(processes)) == padded(
        "Processes",
        "Role      PID  Process      Log",
        "─" * 50,
        "primary  4242  running      local/logs/primary.log",
        "backup      -  not running  local/logs/backup.log",
        width=50,
    )


@pytest.mark.parametrize("ms,text", [
    (None, "-"), (0, "0.0 s"), (1_650, "1.6 s"), (9_949, "9.9 s"), (10_000, "10 s"), (119_999, "119 s"),
    (120_000, "2 min"), (7_199_999, "119 min"), (7_200_000, "2 h"), (172_800_000, "2 d"),
])
def test_age(ms, text):
    assert age(ms) == text


def config() -> GroupConfig:
    nodes = {r: NodeSpec(r, f"10.0.0.{i + 1}", None) for i, r in enumerate(Role)}
    return GroupConfig("orders", nodes, None)


def test_json_document_parses_with_the_documented_keys():
    out = Console(file=StringIO(), width=80, color_system=None)
    Terminal(out=out, err=Console(file=StringIO())).print_json(api.redundancy_document(config(), NODES))
    doc = json.loads(out.file.getvalue())
    assert doc["group"] == "orders"
    assert [n["role"] for n in doc["nodes"]] == ["primary", "backup", "monitor"]
    unreachable, backup, _ = doc["nodes"]
    assert unreachable == {"role": "primary", "address": "10.0.0.1", "reachable": False,
                           "error": "connection refused (is the node running?)"}
    for key in ("role", "address", "activity", "serving", "epoch", "redundancy_status", "in_sync", "peers",
                "last_decision", "reachable"):
        assert key in backup
    assert backup["serving"] is True and backup["reachable"] is True


def test_json_on_a_terminal_is_still_valid_json():
    out = Console(file=StringIO(), width=40, force_terminal=True, color_system=None)
    Terminal(out=out, err=Console(file=StringIO())).print_json(api.redundancy_document(config(), NODES))
    assert json.loads(out.file.getvalue())["nodes"][1]["last_decision"]["ms_ago"] == 95_000


def test_messages_go_to_stderr_as_one_unwrapped_line_without_markup():
    out, err = Console(file=StringIO(), width=40), Console(file=StringIO(), width=40, color_system=None)
    term = Terminal(out=out, err=err)
    sentence = "unknown key 'lease' in [timers] (known: heartbeat_interval_ms, lease_ms, takeover_margin_ms)"
    term.error(sentence)
    term.note("[bold]not markup[/bold]")
    assert out.file.getvalue() == ""
    assert err.file.getvalue() == f"error: {sentence}\n[bold]not markup[/bold]\n"


def test_resync_table_exact_running_and_absent():
    backup = view("backup", "10.0.0.2", "Standby", seen=("primary", "monitor"))
    backup["resync"] = {"kind": "snapshot", "state": "running", "ops_done": 250_000, "ops_to_go": 750_000,
                        "bytes_done": 262_144_000, "bytes_to_go": 786_432_000, "elapsed_ms": 2_500,
                        "ops_per_s": 100_000.0, "bytes_per_s": 104_857_600.0, "eta_ms": 7_500}
    assert render(resync_table([NODES[0], backup])) == padded(
        "Resync",
        "Role    Kind      State    Ops done  Ops to go  Bytes done  Bytes to go                        Rate  Elapsed    ETA",
        "─" * 115,
        "backup  snapshot  running   250,000    750,000   250.0 MiB    750.0 MiB  100,000 ops/s, 100.0 MiB/s    2.5 s  7.5 s",
        width=115,
    )
    assert resync_table(NODES) is None  # no node reports a catch-up: no table
    backup["resync"] = {**backup["resync"], "ops_done": 0, "ops_to_go": None, "bytes_done": 0, "bytes_to_go": None,
                        "ops_per_s": 0.0, "bytes_per_s": 0.0, "eta_ms": None}
    assert render(resync_table([backup])).splitlines()[3].split() == [
        "backup", "snapshot", "running", "0", "?", "0", "B", "?", "0", "ops/s,", "0", "B/s", "2.5", "s", "?"]


@pytest.mark.parametrize("n,text", [(0, "0 B"), (1023, "1023 B"), (1536, "1.5 KiB"), (12 << 20, "12.0 MiB"),
                                    (5 << 40, "5120.0 GiB")])
def test_size(n, text):
    assert size(n) == text

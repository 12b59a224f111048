"""`pairmq show clients|sessions|subscriptions` renderers (exact output from fixed `--json` documents), and
`--help` with an example on every command and subcommand (walked from the parser, so new ones are checked)."""

import argparse
from io import StringIO

from rich.console import Console

from pairmq.cli.main import build_parser, main
from pairmq.cli.show_broker import clients_table, event_line, sessions_table, subscriptions_table
from pairmq.cli.show_spool import spool_table
from pairmq.cli.terminal import Terminal

HEAD = {"schema": 1, "group": "orders", "node": "backup", "address": "10.0.0.2", "truncated": False}
CLIENTS = {**HEAD, "total": 2, "clients": [
    {"client_id": "line-3", "username": "plant", "peer": "10.1.0.7:50122", "tls": True, "protocol": "5.0",
     "keep_alive_s": 30, "connected_at": 1795000000.0, "connected_s": 75.2, "inflight_out": 3, "inflight_in": 1,
     "queued": 1200},
    {"client_id": "sensor-7", "username": None, "peer": "10.1.0.9:41000", "tls": False, "protocol": "3.1.1",
     "keep_alive_s": 60, "connected_at": 1795000000.0, "connected_s": 4.25, "inflight_out": 0, "inflight_in": 0,
     "queued": 0}]}
SESSIONS = {**HEAD, "total": 2, "sessions": [
    {"client_id": "fleet", "connected": False, "protocol": "5.0", "expiry_s": 3600, "disconnected_at": 1795000000.0,
     "expires_at": 1795003600.0, "subscriptions": 2, "queued": 4521, "inflight": 0, "queued_bytes": 1536000,
     "inbound_qos2": 0},
    {"client_id": "line-3", "connected": True, "protocol": "5.0", "expiry_s": None, "disconnected_at": None,
     "expires_at": None, "subscriptions": 1, "queued": 0, "inflight": 3, "queued_bytes": 512, "inbound_qos2": 1}]}
SUBSCRIPTIONS = {**HEAD, "total": 3, "truncated": True, "subscriptions": [
    {"client_id": "fleet", "filter": "cars/+/door", "qos": 1, "no_local": False, "retain_as_published": False,
     "retain_handling": 0, "subscription_id": None},
    {"client_id": "line-3", "filter": "plant/#", "qos": 2, "no_local": True, "retain_as_published": True,
     "retain_handling": 2, "subscription_id": 7}]}


def rendered(renderable, width: int = 100) -> list[str]:
    console = Console(file=StringIO(), width=width, color_system=None, record=True)
    console.print(renderable)
    return [line.rstrip() for line in console.export_text().splitlines()]


def test_clients_table():
    assert rendered(clients_table(CLIENTS)) == [
        "Group orders: 2 clients on the backup (10.0.0.2)",
        "Client ID   User   Peer                  MQTT   Keep-alive  Online    In flight  Queued",
        "───────────────────────────────────────────────────────────────────────────────────────",
        "line-3      plant  10.1.0.7:50122 (TLS)  5.0          30 s    75 s  3 out, 1 in   1,200",
        "sensor-7    -      10.1.0.9:41000        3.1.1        60 s   4.2 s  0 out, 0 in       0",
    ]


SPOOL = {"schema": 1, "group": "orders", "nodes": [
    {"role": "primary", "address": "10.0.0.1", "reachable": True, "sessions": 3, "queued_messages": 4521,
     "stored_bytes": 1536000, "limits": {"session_queue_max_messages": 100000, "session_queue_max_bytes": 67108864,
                                         "spool_max_bytes": 1073741824},
     "writer": {"commits": 1200, "mean_batch_ops": 3.5, "last_commit_ms": 0.812, "max_commit_ms": 12.5,
                "pending_ops": 0},
     "counters": {"publish_refused_queue_full": 0, "publish_refused_spool_full": 2, "commit_failures": 0}},
    {"role": "backup", "address": "10.0.0.2", "reachable": False, "error": "connection refused"}]}


def test_message_spool_table():
    assert rendered(spool_table(SPOOL)) == [
        'Group orders: message spool',
        '                                  Primary (10.0.0.1)    Backup (10.0.0.2)',
        '─────────────────────────────────────────────────────────────────────────',
        'Sessions                                           3                    -',
        'Queued messages                                4,521                    -',
        'Stored                            1.5 MiB of 1.0 GiB                    -',
        'Queue limit per session   100,000 messages, 64.0 MiB                    -',
        'Commits                         1,200 (3.5 ops each)                    -',
        'Last / slowest commit                0.81 / 12.50 ms                    -',
        'Waiting to commit                              0 ops                    -',
        'Refused: queue full                                0                    -',
        'Refused: spool full                                2                    -',
        'Commit failures                                    0                    -',
        'Unreachable                                            connection refused',
    ]


def test_sessions_table():
    assert rendered(sessions_table(SESSIONS)) == [
        "Group orders: 2 sessions on the backup (10.0.0.2)",
        "Client ID   State    MQTT  Expiry  Subscriptions  Queued  In flight  Queued bytes",
        "─────────────────────────────────────────────────────────────────────────────────",
        "fleet       offline  5.0   3600 s              2   4,521          0       1.5 MiB",
        "line-3      online   5.0    never              1       0          3         512 B",
    ]


def test_subscriptions_table():
    assert rendered(subscriptions_table(SUBSCRIPTIONS)) == [
        "Group orders: 3 subscriptions on the backup (10.0.0.2)",
        "Client ID   Filter       QoS  Options",
        "────────────────────────────────────────────────────────────────────────────────────",
        "fleet       cars/+/door    1  -",
        "line-3      plant/#        2  no-local, retain-as-published, retain-handling 2, id 7",
    ]


def test_a_narrow_terminal_wraps_client_ids_not_the_numbers():
    lines = rendered(clients_table({**CLIENTS, "clients": [{**CLIENTS["clients"][0], "client_id": "x" * 40}]}),
                     width=80)
    assert lines[:4] == [
        "Group orders: 2 clients on the backup (10.0.0.2)",
        "Client ID     User   Peer          MQTT  Keep-alive  Online    In flight  Queued",
        "─" * 80,
        "xxxxxxxxxxxx  plant  10.1.0.7:501  5.0         30 s    75 s  3 out, 1 in   1,200"]
    assert "".join(line[:12] for line in lines[3:]) == "x" * 40  # folded, never cut


def test_event_line():
    event = {"v": 2, "ts": 1795000000.25, "mono_ms": 5, "node": "backup", "event": "redundancy_decision",
             "kind": "activate", "epoch": 4}
    assert event_line(event) == "2026-11-18 11:06:40.250 backup redundancy_decision kind=activate epoch=4"


def commands(parser: argparse.ArgumentParser, prefix=()):
    yield prefix
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from commands(sub, (*prefix, name))


def test_every_command_and_subcommand_has_help_with_an_example(capsys):
    walked = list(commands(build_parser()))
    assert {("show", "clients"), ("show", "sessions"), ("show", "subscriptions"), ("events", "tail"),
            ("admin", "passwd"), ("redundancy", "release-activity")} <= set(walked)
    for command in walked:
        out, err = StringIO(), StringIO()
        code = main([*command, "--help"], Terminal(out=Console(file=out), err=Console(file=err)))
        printed = capsys.readouterr().out + out.getvalue()
        assert code == 0, (command, err.getvalue())
        assert "examples:\n  pairmq " in printed, command
        if command:
            assert f"  pairmq {command[0]}" in printed.split("examples:")[1], command

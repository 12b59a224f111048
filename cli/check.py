"""`pairmq check`: the group's health as a monitoring plugin reports it (Nagios, Icinga, Sensu, Zabbix).

Rules, worst first (the exit code is the state's):
- 3 UNKNOWN: no node answers (or the group file, the secret or the token is not usable): nothing is known.
- 2 CRITICAL: nodes answer, but none holds activity: clients cannot publish.
- 1 WARNING: a node holds activity but the group cannot survive one more failure: redundancy is down, a
  node does not answer, or the routing nodes' configurations are out of sync.
- 0 OK: one node active, redundancy up, every node answers, configuration in sync.
One status line on stdout, `PAIRMQ STATE - sentence | perfdata`, as the plugin guidelines ask.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum

from pairmq.appliance.config import load_group
from pairmq.appliance.errors import PairMQError
from pairmq.appliance.roles import Role

from . import api
from .options import add_group, examples, group_path
from .terminal import Terminal


class State(enum.IntEnum):
    OK = 0
    WARNING = 1
    CRITICAL = 2
    UNKNOWN = 3


@dataclasses.dataclass(frozen=True, slots=True)
class Verdict:
    state: State
    sentence: str
    perfdata: str = ""

    def line(self) -> str:
        return f"PAIRMQ {self.state.name} - {self.sentence}" + (f" | {self.perfdata}" if self.perfdata else "")


def evaluate(group: str, nodes: list[dict], config_sync: dict[str, str]) -> Verdict:
    """The verdict from the redundancy views (`api.fetch_redundancy`) and each routing node's config-sync
    status (role -> In-Sync / Syncing / Out-Of-Sync); a pure function, so each state is tested directly."""
    answering = [n for n in nodes if n.get("reachable")]
    if not answering:
        return Verdict(State.UNKNOWN, f"group {group!r}: no node answered")
    active = [n for n in answering if n.get("serving")]
    silent = [n["role"] for n in nodes if not n.get("reachable")]
    perf = f"nodes_answering={len(answering)};;;0;{len(nodes)} nodes_active={len(active)};;1;0;1"
    if not active:
        return Verdict(State.CRITICAL, f"group {group!r}: no node holds activity; clients cannot connect"
                       + (f" ({', '.join(silent)} not answering)" if silent else ""), perf)
    node = active[0]
    perf += f" epoch={node.get('epoch', 0)}"
    head = f"group {group!r}: {node['role']} active (epoch {node.get('epoch', '?')})"
    problems = []
    if node.get("redundancy_status") != "Up":
        problems.append(f"redundancy {node.get('redundancy_status', 'unknown')}")
    if silent:
        problems.append(f"{' and '.join(silent)} not answering")
    out_of_sync = [role for role, status in config_sync.items() if status == "Out-Of-Sync"]
    if out_of_sync:
        problems.append(f"configuration out of sync on the {' and '.join(out_of_sync)}")
    if problems:
        return Verdict(State.WARNING, f"{head}, {'; '.join(problems)}", perf)
    syncing = [role for role, status in config_sync.items() if status == "Syncing"]
    return Verdict(State.OK, f"{head}, redundancy Up, configuration "
                   + (f"syncing on the {' and '.join(syncing)}" if syncing else "in sync"), perf)


def _config_sync(config, key: str) -> dict[str, str]:
    statuses = {}
    for role in (Role.PRIMARY, Role.BACKUP):
        try:
            answer = api.get_json(f"{api.base_url(config, role)}/api/v1/config-sync", token=key)
        except api.ApiError:
            continue  # its silence is already counted from the redundancy view
        statuses[role.value] = str(answer.get("status"))
    return statuses


def check(term: Terminal, args: argparse.Namespace) -> int:
    nodes: list[dict] = []
    try:
        config = load_group(group_path(args))
        nodes = api.fetch_redundancy(config)
        api.require_one_reachable(config, nodes)
        verdict = evaluate(config.name, nodes, _config_sync(config, api.token(config)))
    except PairMQError as exc:
        verdict = Verdict(State.UNKNOWN, str(exc))
    if args.json:
        term.print_json({"schema": 1, "state": verdict.state.name, "exit_code": int(verdict.state),
                         "summary": verdict.sentence, "nodes": nodes})
    else:
        term.out.file.write(verdict.line() + "\n")
        term.out.file.flush()
    return int(verdict.state)


def add_parser(commands) -> None:
    p = commands.add_parser(
        "check", help="the group's health for a monitoring system (exit 0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN)",
        description="Ask every node and print one status line as monitoring plugins do. Exit 0 OK; 1 WARNING "
                    "(redundancy down, a node not answering, configuration out of sync); 2 CRITICAL (no node "
                    "holds activity); 3 UNKNOWN (no node answers, or the group file or token cannot be used).",
        epilog=examples("pairmq check", "pairmq check --group /etc/pairmq/group.toml --json",
                        "command_line  /usr/bin/pairmq check --group /etc/pairmq/group.toml   # Nagios/Icinga"))
    add_group(p)
    p.set_defaults(handler=lambda args, term: check(term, args))

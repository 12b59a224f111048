"""`pairmq events follow`: the nodes' redundancy decisions as they happen.

Rules:
- Without `--role`, all three nodes' decision streams are followed at once (one reader thread each); each
  line names its node. A node that does not answer at the start is noted on stderr and left out; if none
  answers, one sentence and exit 1.
- First the backlog: the latest `--lines` decisions (of all followed nodes together, oldest first, by the
  time the node made them), then each new decision as it arrives.
- It ends cleanly (exit 0) on Ctrl-C, or when every followed stream has ended (a note per ended stream).
- `--json`: one JSON object per line, exactly the stream's `data` (id, seq, node, kind, epoch, reason, at).
"""

from __future__ import annotations

import argparse
import http.client
import json
import queue
import signal
import threading

from pairmq.appliance.config import GroupConfig
from pairmq.appliance.quorum.decisions import DecisionKind
from pairmq.appliance.roles import Role

from . import api
from .options import add_group, examples, group_path
from .terminal import Terminal

DEFAULT_LINES = 10
KIND_STYLES = {DecisionKind.ACTIVATE: "bold green", DecisionKind.STEP_DOWN: "bold red", DecisionKind.BID: "cyan",
               DecisionKind.SYNC: "yellow"}


def add_follow_parser(actions) -> None:
    """`pairmq events follow`, beside `events tail` (a node's event log, cli/show_broker.py)."""
    follow = actions.add_parser(
        "follow", help="print redundancy decisions as they happen (Ctrl-C to stop)",
        description="Print the latest decisions of every node (or one with --role), then each new one as it "
                    "happens, one line each, until Ctrl-C or until every followed node's stream ends.",
        epilog=examples("pairmq events follow", "pairmq events follow --role primary --lines 0",
                        "pairmq events follow --json | jq -r .reason"))
    follow.add_argument("--json", action="store_true", help="one JSON object per line (the stream's data)")
    follow.add_argument("--role", choices=[r.value for r in Role], help="follow this node only (as `events tail`)")
    # The flag's earlier name, kept so that scripts written for it go on working.
    follow.add_argument("--node", dest="role", choices=[r.value for r in Role], help=argparse.SUPPRESS)
    follow.add_argument("--lines", type=_count, default=DEFAULT_LINES, metavar="N",
                        help=f"how many earlier decisions to print first (default {DEFAULT_LINES})")
    add_group(follow)
    follow.set_defaults(handler=_cmd_follow)


def _count(text: str) -> int:
    if not text.isdigit() or int(text) > 64:
        raise argparse.ArgumentTypeError(f"--lines takes a whole number from 0 to 64, not {text!r}")
    return int(text)


def _cmd_follow(args: argparse.Namespace, term: Terminal) -> int:
    from pairmq.appliance.config import load_group
    roles = [Role(args.role)] if args.role else list(Role)
    return follow(term, load_group(group_path(args)), roles, as_json=args.json, lines=args.lines)


def line(decision: dict) -> str:
    """One decision as a line: when (UTC), node, kind, epoch, and the reason without its node prefix."""
    return "".join(_parts(decision))


def _parts(decision: dict) -> tuple[str, str, str]:
    node, reason = decision["node"], decision["reason"]
    if reason.startswith(f"{node}: "):
        reason = reason[len(node) + 2:]
    at = decision["at"].replace("T", " ").rstrip("Z")
    return f"{at}  {node:<7}  ", f"{decision['kind']:<12}", f" epoch {decision['epoch']:<3} {reason}"


def follow(term: Terminal, config: GroupConfig, roles: list[Role], *, as_json: bool, lines: int) -> int:
    streams, failures, key = {}, [], api.token(config)
    for role in roles:
        try:
            streams[role] = api.open_stream(f"{api.base_url(config, role)}/api/v1/decisions/stream", token=key)
        except api.ApiError as exc:
            failures.append(f"{role.value} at {api.base_url(config, role)}: {exc}")
    if not streams:
        who = f"the {roles[0].value} node" if len(roles) == 1 else f"no node of group {config.name!r}"
        verb = "did not answer" if len(roles) == 1 else "answered"
        raise api.NodeUnreachable(f"{who} {verb} ({'; '.join(failures)})")
    for failure in failures:
        term.note(f"not following {failure}")
    # `systemctl stop`, `timeout` and friends send SIGTERM: stop as cleanly as on Ctrl-C.
    previous = signal.signal(signal.SIGTERM, _interrupt) if threading.current_thread() is threading.main_thread() \
        else None
    inbox: queue.Queue = queue.Queue(maxsize=1024)
    for role, response in streams.items():
        threading.Thread(target=_read, args=(role, response, inbox), daemon=True, name=f"tail-{role.value}").start()
    try:
        return _print_until_done(term, inbox, set(streams), as_json, lines)
    except KeyboardInterrupt:
        return 0
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        for response in streams.values():
            response.close()


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def _read(role: Role, response, inbox: queue.Queue) -> None:
    """A reader thread: ("decision", data) per decision, ("live", role) after the backlog, ("end", why)."""
    why = "the stream ended"
    try:
        for event, _, data in response.events():
            if event == "decision":
                inbox.put(("decision", json.loads(data)))
            elif event == "live":
                inbox.put(("live", role))
    except (OSError, ValueError, http.client.HTTPException) as exc:  # cut mid-chunk, or closed by Ctrl-C
        why = f"the stream broke ({exc.__class__.__name__})"
    inbox.put(("end", (role, why)))


def _print_until_done(term: Terminal, inbox: queue.Queue, roles: set[Role], as_json: bool, lines: int) -> int:
    backlog: list[dict] = []
    open_streams, waiting = set(roles), set(roles)  # waiting: streams whose backlog is not all in yet
    while open_streams:
        try:
            kind, value = inbox.get(timeout=0.5)  # a timeout, so Ctrl-C is seen at once on every platform
        except queue.Empty:
            continue
        if kind == "decision":
            if waiting:
                backlog.append(value)
            else:
                _emit(term, value, as_json)
            continue
        role = value if kind == "live" else value[0]
        if kind == "end":
            open_streams.discard(role)
            term.note(f"the {role.value} node's decision stream ended: {value[1]}")
        if role in waiting:
            waiting.discard(role)
            if not waiting:
                backlog.sort(key=lambda d: d["at"])
                for decision in backlog[-lines:] if lines else []:
                    _emit(term, decision, as_json)
                backlog = []
    return 0


def _emit(term: Terminal, decision: dict, as_json: bool) -> None:
    out = term.out
    if as_json:
        term.print_json_line(decision)
    elif out.is_terminal:
        from rich.text import Text  # only on a terminal: the module is imported by every command's parsers

        head, kind, rest = _parts(decision)
        out.print(Text.assemble(head, (kind, KIND_STYLES.get(decision["kind"], "")), rest), soft_wrap=True,
                  highlight=False)
    else:
        out.file.write(line(decision) + "\n")
        out.file.flush()

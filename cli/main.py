"""`pairmq`: the command line (DESIGN §6).

Every failure a person can cause or meet (a bad group file, a node that does
not answer, a refused request, a mistyped option) ends as one sentence on
stderr and a non-zero exit code: 2 for a usage mistake, 1 for everything else,
130 for Ctrl-C (`pairmq check` uses the monitoring-plugin codes instead). A
traceback means a bug in PairMQ. Every command takes `--json`: one JSON
document on stdout, an error included (cli/terminal.py).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pairmq.appliance.config import DEFAULT_GROUP_PATH, load_group
from pairmq.appliance.errors import PairMQError
from pairmq.appliance.roles import Role

from .extras import MissingExtra
from .options import add_group, examples, group_path
from .terminal import Terminal

EXIT_ERROR, EXIT_USAGE, EXIT_INTERRUPTED = 1, 2, 130


class UsageError(Exception):
    def __init__(self, message: str, prog: str) -> None:
        super().__init__(message)
        self.prog = prog


class _Exit(Exception):
    def __init__(self, code: int) -> None:
        self.code = code


class Parser(argparse.ArgumentParser):
    """argparse, but a mistake is one sentence (no usage dump) and nothing calls sys.exit."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        raise UsageError(message, self.prog)

    def exit(self, status: int = 0, message: str | None = None):
        if message:
            sys.stderr.write(message)
        raise _Exit(status)


def build_parser() -> Parser:
    parser = Parser(prog="pairmq", description="PairMQ: an MQTT broker run by a primary, a backup and a monitor.",
                    epilog=examples("pairmq local up                        # a whole group on this machine",
                                    "pairmq show redundancy --group ./local/group.toml",
                                    "pairmq init --dir /etc/pairmq --primary 10.0.0.1 --backup 10.0.0.2 "
                                    "--monitor 10.0.0.3",
                                    "pairmq node --role primary            # on the primary host"))
    parser.add_argument("--version", action="version", version=f"pairmq {_version()}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    _init_parser(commands)
    _node_parser(commands)
    _local_parser(commands)
    _show_parser(commands)
    _redundancy_parser(commands)
    _events_parser(commands)
    from .admin_cmd import add_parsers as _admin_parsers

    _admin_parsers(commands)
    from .config_cmd import add_parsers as _config_parsers

    _config_parsers(commands)
    from .config_backup import add_parsers as _config_backup_parsers

    _config_backup_parsers(commands.choices["config"])
    from .pubsub import add_parsers as _pubsub_parsers

    _pubsub_parsers(commands)
    from .analytics_cmd import add_parsers as _analytics_parsers

    _analytics_parsers(commands)
    from .secret_cmd import add_parsers as _secret_parsers

    _secret_parsers(commands)
    from .spool_cmd import add_parsers as _spool_parsers

    _spool_parsers(commands)
    _install_parser(commands)
    from .check import add_parser as _check_parser

    _check_parser(commands)
    _completion_parser(commands)
    parser.set_defaults(handler=lambda args, term: _help(parser, term))
    _add_json_everywhere(parser)
    return parser


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("pairmq")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


# Commands that run until stopped, where one JSON document has no meaning.
_NO_JSON = {"node"}


def _leaves(parser: argparse.ArgumentParser):
    """Every parser of the tree that runs a command (has no sub-commands of its own)."""
    subactions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subactions:
        yield parser
    for action in subactions:
        for child in dict.fromkeys(action.choices.values()):
            yield from _leaves(child)


def _add_json_everywhere(parser: argparse.ArgumentParser) -> None:
    for leaf in _leaves(parser):
        if leaf is parser or leaf.prog.split()[-1] in _NO_JSON:
            continue
        if "--json" not in leaf._option_string_actions:
            leaf.add_argument("--json", action="store_true",
                              help="print one JSON document on stdout (errors too), with the same exit code")


def _completion_parser(commands) -> None:
    p = commands.add_parser(
        "completion", help="print a shell completion script (bash, zsh or tcsh)",
        description="Print a completion script for SHELL, generated from this command's own option tree.",
        epilog=examples("pairmq completion bash > /etc/bash_completion.d/pairmq",
                        "pairmq completion zsh > \"${fpath[1]}/_pairmq\"",
                        "source <(pairmq completion bash)"))
    p.add_argument("shell", choices=("bash", "zsh", "tcsh"), help="the shell")
    p.set_defaults(handler=_cmd_completion)


def _cmd_completion(args: argparse.Namespace, term: Terminal) -> int:
    import shtab

    script = shtab.complete(build_parser(), shell=args.shell)
    if args.json:
        term.record(shell=args.shell, script=script)
    else:
        term.out.file.write(script if script.endswith("\n") else script + "\n")
    return 0


def _help(parser: argparse.ArgumentParser, term: Terminal) -> int:
    term.out.file.write(parser.format_help())
    return 0


def _init_parser(commands) -> None:
    p = commands.add_parser(
        "init", help="write the group file, the secret and the per-host commands",
        description="Write DIR/group.toml and a fresh group secret DIR/secret (mode 0600). Each node's data "
                    "directory is DATA_DIR/<role>; a relative DATA_DIR is relative to DIR. Without addresses "
                    "the group is laid out on one machine (127.0.0.1, 127.0.0.2, 127.0.0.3).",
        epilog=examples("pairmq init --dir /etc/pairmq --name orders --primary 10.0.0.1 --backup 10.0.0.2 "
                        "--monitor 10.0.0.3",
                        "pairmq init --dir ./mygroup --data-dir data     # all three nodes on this machine",
                        "pairmq init --dir /etc/pairmq --force           # replace the group file and secret",
                        "pairmq init --dir ./g --admin-password-stdin < pw.txt  # choose the admin password",
                        "pairmq init --dir /etc/pairmq --management-tls  # HTTPS on 8080, self-signed, pinned"))
    p.add_argument("--dir", type=Path, default=DEFAULT_GROUP_PATH.parent,
                   help=f"where to write group.toml and secret (default: {DEFAULT_GROUP_PATH.parent})")
    p.add_argument("--name", default="pairmq", help="the group name (default: pairmq)")
    for role in Role:
        p.add_argument(f"--{role.value}", metavar="ADDR", help=f"the {role.value} host's IP address")
    p.add_argument("--data-dir", default="/var/lib/pairmq", metavar="PATH",
                   help="base of each node's data directory (default: /var/lib/pairmq)")
    p.add_argument("--force", action="store_true", help="replace an existing group file and secret")
    p.add_argument("--admin-password-stdin", action="store_true", dest="password_stdin",
                   help="read the management API's admin password from stdin's first line (default: generate "
                        "one and print it once)")
    p.add_argument("--management-tls", action="store_true", dest="management_tls",
                   help="also make a self-signed certificate for the three addresses (management.pem, "
                        "management.key) and serve the management API over HTTPS; the CLI pins it")
    p.set_defaults(handler=_cmd_init)


def _node_parser(commands) -> None:
    p = commands.add_parser(
        "node", help="run one node in the foreground (what systemd runs)",
        description="Run one node of the group in the foreground, logging to stderr, until SIGTERM (exit 0).",
        epilog=examples("pairmq node --role primary",
                        "pairmq node --role monitor --group /etc/pairmq/group.toml"))
    p.add_argument("--role", required=True, choices=[r.value for r in Role], help="this host's role")
    add_group(p)
    p.set_defaults(handler=_cmd_node)


def _local_parser(commands) -> None:
    local = commands.add_parser(
        "local", help="a whole group on this machine: up, down, status",
        description="Run a whole group on this machine: nodes on 127.0.0.1 (primary), 127.0.0.2 (backup) and "
                    "127.0.0.3 (monitor), with the group file, secret, data, pid files and logs under DIR.",
        epilog=examples("pairmq local up", "pairmq local status --json", "pairmq local down --dir /tmp/pmq"))
    actions = local.add_subparsers(dest="action", metavar="ACTION", parser_class=Parser)
    local.set_defaults(handler=lambda args, term: _help(local, term))
    for name, help_text, example in (
            ("up", "start the three nodes (or those not running) and wait until one is active",
             "pairmq local up --dir /tmp/pmq"),
            ("down", "stop the three nodes (harmless when nothing runs)", "pairmq local down --dir /tmp/pmq"),
            ("status", "the processes and the redundancy view", "pairmq local status --json")):
        p = actions.add_parser(name, help=help_text, description=help_text[0].upper() + help_text[1:] + ".",
                               epilog=examples(example))
        p.add_argument("--dir", type=Path, default=Path("local"), help="the local group's directory (default: ./local)")
        if name == "status":
            p.add_argument("--json", action="store_true", help="print a JSON document instead of tables")
        p.set_defaults(handler=_cmd_local)


def _show_parser(commands) -> None:
    show = commands.add_parser("show", help="read the group's state", description="Read the group's state.",
                               epilog=examples("pairmq show redundancy", "pairmq show redundancy --json"))
    things = show.add_subparsers(dest="thing", metavar="WHAT", parser_class=Parser)
    show.set_defaults(handler=lambda args, term: _help(show, term))
    p = things.add_parser(
        "redundancy", help="each node's activity, epoch, peers and last decision",
        description="Ask all three nodes' management APIs at once. A node that does not answer is shown as "
                    "unreachable; it is an error only when none answers.",
        epilog=examples("pairmq show redundancy", "pairmq show redundancy --watch",
                        "pairmq show redundancy --json --group ./local/group.toml"))
    p.add_argument("--json", action="store_true", help="print a JSON document: {group, nodes: [...]}")
    p.add_argument("--watch", action="store_true", help="refresh every second until Ctrl-C")
    add_group(p)
    c = things.add_parser(
        "config-sync", help="each routing node's configuration version, digest and sync status",
        description="In-Sync / Syncing / Out-Of-Sync per routing node, with versions and digests.",
        epilog=examples("pairmq show config-sync", "pairmq show config-sync --json"))
    c.add_argument("--json", action="store_true", help="print a JSON document: {group, nodes: [...]}")
    add_group(c)
    c.set_defaults(handler=_cmd_show_config_sync)
    p.set_defaults(handler=_cmd_show_redundancy)
    from .secret_cmd import add_show_parser as _secret_show_parser

    _secret_show_parser(things)
    _show_broker_parsers(things)


def _show_broker_parsers(things) -> None:
    for what, help_text, description in (
            ("clients", "the connected clients on the active node",
             "Client id, user, peer address, MQTT version, keep-alive, connected since, in-flight and queued "
             "messages of every client connected to the active node."),
            ("sessions", "the sessions on the active node, offline ones included",
             "Every session the active node holds: online or offline, expiry, subscriptions, queued and "
             "in-flight messages."),
            ("subscriptions", "the subscriptions on the active node",
             "Every subscription on the active node: client, filter, QoS and MQTT 5 options.")):
        p = things.add_parser(what, help=help_text, description=description,
                              epilog=examples(f"pairmq show {what}", f"pairmq show {what} --json",
                                              *(["pairmq show subscriptions --client sensor-7"]
                                                if what == "subscriptions" else [])))
        p.add_argument("--json", action="store_true",
                       help=f"print a JSON document: {{group, node, address, {what}: [...], total, truncated}}")
        p.add_argument("--limit", type=int, metavar="N", help="show at most N rows (1-10000, default 1000)")
        if what == "subscriptions":
            p.add_argument("--client", metavar="ID", help="only this client's subscriptions")
        add_group(p)
        p.set_defaults(handler=_cmd_show_broker, what=what)
    p = things.add_parser("message-spool", help="each routing node's message spool: queued messages, size, commits",
                          description="Sessions, queued messages, stored bytes against the spool limit, the "
                                      "group-committing writer and the publishes refused for space, per routing node.",
                          epilog=examples("pairmq show message-spool", "pairmq show message-spool --json"))
    p.add_argument("--json", action="store_true", help="print a JSON document: {group, nodes: [...]}")
    add_group(p)
    p.set_defaults(handler=_cmd_show_spool)


def _events_parser(commands) -> None:
    events = commands.add_parser("events", help="event logs and the live decision stream",
                                 description="Read a node's event log (tail) or follow the nodes' redundancy "
                                             "decisions as they happen (follow), through the management API.",
                                 epilog=examples("pairmq events tail", "pairmq events tail --role backup --json",
                                                 "pairmq events follow"))
    actions = events.add_subparsers(dest="action", metavar="ACTION", parser_class=Parser)
    events.set_defaults(handler=lambda args, term: _help(events, term))
    p = actions.add_parser(
        "tail", help="the latest events of one node",
        description="The latest events of one node's event log, oldest first, one per line (or --json).",
        epilog=examples("pairmq events tail", "pairmq events tail --role monitor --limit 20",
                        "pairmq events tail --since 1795000000 --json"))
    p.add_argument("--role", choices=[r.value for r in Role], default="primary",
                   help="whose event log (default: primary)")
    p.add_argument("--limit", type=int, default=50, metavar="N", help="at most N events (1-1000, default 50)")
    p.add_argument("--since", type=float, metavar="TS", help="only events at or after TS (seconds since the epoch)")
    p.add_argument("--json", action="store_true", help="print a JSON document: {group, node, events: [...]}")
    add_group(p)
    p.set_defaults(handler=_cmd_events_tail)
    from .events_cmd import add_follow_parser

    add_follow_parser(actions)


def _redundancy_parser(commands) -> None:
    red = commands.add_parser("redundancy", help="operator actions on activity",
                              description="Operator actions on the group's activity.",
                              epilog=examples("pairmq redundancy force-activity --role backup "
                                              "--i-understand-data-loss"))
    actions = red.add_subparsers(dest="action", metavar="ACTION", parser_class=Parser)
    red.set_defaults(handler=lambda args, term: _help(red, term))
    p = actions.add_parser(
        "force-activity", help="make a node bid for activity without proof that it is up to date",
        description="Make a node bid for activity although it cannot show that it holds every acknowledged "
                    "message (e.g. its mate is gone for good). It still needs a vote and a lease; it may lose "
                    "messages that only the other node had.",
        epilog=examples("pairmq redundancy force-activity --role backup --i-understand-data-loss"))
    p.add_argument("--role", required=True, choices=[r.value for r in Role if r.routes_messages],
                   help="the node that should take activity")
    p.add_argument("--i-understand-data-loss", action="store_true", dest="understood",
                   help="acknowledge that acknowledged messages may be lost")
    add_group(p)
    p.set_defaults(handler=_cmd_force_activity)
    p = actions.add_parser(
        "release-activity", help="hand activity over to the in-sync mate (a planned handover)",
        description="The active node stops taking client packets, waits until its mate holds every op, and "
                    "hands activity over with the next epoch; MQTT 5 clients are sent to the new active. "
                    "Refused when the mate is not in sync, unless --force (then a plain step-down).",
        epilog=examples("pairmq redundancy release-activity", "pairmq redundancy release-activity --role backup",
                        "pairmq redundancy release-activity --force"))
    p.add_argument("--role", choices=[r.value for r in Role if r.routes_messages],
                   help="the node to release (default: whichever is active)")
    p.add_argument("--force", action="store_true", help="step down even without an in-sync mate")
    add_group(p)
    p.set_defaults(handler=_cmd_release_activity)
    p = actions.add_parser(
        "revert-activity", help="move activity back to the primary (a planned handover from the backup)",
        description="Hand activity from the active backup back to the primary. Refused when the primary already "
                    "holds activity or is not in sync.",
        epilog=examples("pairmq redundancy revert-activity"))
    add_group(p)
    p.set_defaults(handler=_cmd_revert_activity)


def _install_parser(commands) -> None:
    from . import install

    p = commands.add_parser(
        "install", help="set up this host to run its node under systemd (user, files, venv, units)",
        description="Create the pairmq user, /etc/pairmq (group file, secret), /var/lib/pairmq, /var/log/pairmq, "
                    "the venv in /opt/pairmq/venv and the systemd unit, then enable and start it. Running it "
                    "again changes nothing that is already right (docs/operations.md).",
        epilog=examples(*install.EXAMPLES))
    install.add_arguments(p)
    p.set_defaults(handler=_cmd_install)


# --- handlers: each returns an exit code ---------------------------------------------


def _cmd_init(args: argparse.Namespace, term: Terminal) -> int:
    from .init_group import group_addresses, write_group

    from pairmq.appliance.api.admin_credential import DEFAULT_USER, check_password, generate_password

    from .admin_cmd import set_admin, show_admin_password

    addresses = group_addresses(args.primary, args.backup, args.monitor)
    if args.password_stdin:
        from .config_cmd import _read_password

        password = _read_password(args).decode()
        check_password(password)  # before anything is written
    else:
        password = generate_password()
    written = write_group(args.dir, name=args.name, addresses=addresses, data_dir=args.data_dir, force=args.force,
                          management_tls=args.management_tls)
    admin_file = set_admin(written.config, DEFAULT_USER, password)
    verb = "replaced" if written.replaced else "wrote"
    term.note(f"{verb} {written.group_file} (group {written.config.name!r})")
    term.note(f"{verb} {written.secret_file} (mode 0600; keep it private)")
    term.note(f"wrote {admin_file} (the management API's admin credential, mode 0600)")
    files = [written.group_file, written.secret_file, admin_file]
    if written.config.management.https:
        term.note(f"wrote {written.config.management.cert_file} and its key (mode 0600): the management API "
                  f"speaks HTTPS")
        files += [written.config.management.cert_file, written.config.management.key_file]
    local = all(address.startswith("127.") for _, address, _ in written.node_commands())
    if local:
        term.note("all three nodes are on this machine; run each of these (or use `pairmq local`):")
    else:
        term.note(f"copy these {len(files)} files to the same paths on each host "
                  f"({', '.join(Path(f).name for f in files)}), then run there:")
    commands = written.node_commands()
    for role, address, command in commands:
        term.print_text(f"  {role.value:<8} on {address:<15}  {command}")
    term.record(group=written.config.name, replaced=written.replaced, files=[str(f) for f in files],
                nodes=[{"role": role.value, "address": address, "command": command}
                       for role, address, command in commands])
    if not args.password_stdin:
        show_admin_password(term, DEFAULT_USER, password, "pairmq admin passwd")
    return 0


def _cmd_install(args: argparse.Namespace, term: Terminal) -> int:
    from .install import run

    run(args, say=term.print_text, say_json=term.print_json)
    return 0


def _cmd_node(args: argparse.Namespace, term: Terminal) -> int:
    from .run_node import run

    return run(group_path(args), Role(args.role))


def _cmd_local(args: argparse.Namespace, term: Terminal) -> int:
    from . import local

    if args.action == "up":
        return local.up(term, args.dir)
    if args.action == "down":
        return local.down(term, args.dir)
    return local.status(term, args.dir, as_json=args.json)


def _cmd_show_redundancy(args: argparse.Namespace, term: Terminal) -> int:
    from .show import show_redundancy

    return show_redundancy(term, load_group(group_path(args)), as_json=args.json, watch=args.watch)


def _cmd_show_config_sync(args: argparse.Namespace, term: Terminal) -> int:
    from .config_cmd import show_config_sync

    return show_config_sync(term, load_group(group_path(args)), as_json=args.json)


def _cmd_show_broker(args: argparse.Namespace, term: Terminal) -> int:
    from .show_broker import show

    return show(term, load_group(group_path(args)), args.what, as_json=args.json,
                client=getattr(args, "client", None), limit=args.limit)


def _cmd_show_spool(args: argparse.Namespace, term: Terminal) -> int:
    from .show_spool import show

    return show(term, load_group(group_path(args)), as_json=args.json)


def _cmd_events_tail(args: argparse.Namespace, term: Terminal) -> int:
    from .show_broker import events_tail

    return events_tail(term, load_group(group_path(args)), Role(args.role), as_json=args.json, since=args.since,
                       limit=args.limit)


def _cmd_force_activity(args: argparse.Namespace, term: Terminal) -> int:
    from .redundancy import DATA_LOSS_REFUSAL, force_activity

    if not args.understood:  # refuse before touching any file
        raise PairMQError(DATA_LOSS_REFUSAL)
    return force_activity(term, load_group(group_path(args)), Role(args.role), understood=True)


def _cmd_release_activity(args: argparse.Namespace, term: Terminal) -> int:
    from .redundancy import release_activity

    return release_activity(term, load_group(group_path(args)), Role(args.role) if args.role else None,
                            force=args.force)


def _cmd_revert_activity(args: argparse.Namespace, term: Terminal) -> int:
    from .redundancy import revert_activity

    return revert_activity(term, load_group(group_path(args)))


def main(argv: list[str] | None = None, term: Terminal | None = None) -> int:
    term = term or Terminal()
    argv = sys.argv[1:] if argv is None else argv
    # Known before parsing, so that a usage mistake is a JSON document too.
    term.json_mode = "--json" in argv
    parser = build_parser()
    code = _run(parser, argv, term)
    term.finish(code)
    return code


def _run(parser: Parser, argv: list[str], term: Terminal) -> int:
    try:
        args = parser.parse_args(argv)
        term.json_mode = bool(getattr(args, "json", False))
        return args.handler(args, term)
    except _Exit as exc:
        return exc.code
    except UsageError as exc:
        term.fail(f"{exc} (see `{exc.prog} --help`)")
        return EXIT_USAGE
    except MissingExtra as exc:  # an optional part not installed: setup, not failure (cli/extras.py)
        term.error(str(exc))
        return exc.exit_code
    except PairMQError as exc:
        term.fail(str(exc))
        return EXIT_ERROR
    except OSError as exc:
        where = f" ({exc.filename})" if exc.filename else ""
        term.fail(f"{exc.strerror or exc}{where}")
        return EXIT_ERROR
    except KeyboardInterrupt:
        term.fail("interrupted")
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())

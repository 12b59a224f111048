"""`pairmq config ...` and `pairmq show config-sync`: the replicated configuration, through the API.

Rules:
- Every change goes to the active node's management API (POST /api/v1/config/changes); the CLI
  finds the active by asking the routing nodes in turn (a standby refuses and names the active).
  Each command prints what changed, the new version, and whether the standby confirmed it.
- Reads (`users list`, `acl list`, `limits list`, ...) ask the active, or any routing node that
  answers when none is active; `--json` prints the node's document.
- A password is read from the terminal without echo (twice), or from the first line of stdin with
  `--password-stdin`; never from the command line. Only its scrypt record leaves this machine.
- `config assert --from ROLE` replaces the active's whole configuration by ROLE's (for a node whose
  divergent changes must win); it asks for confirmation, or takes `--yes`.
"""

from __future__ import annotations

import getpass
import secrets
import sys
from typing import TYPE_CHECKING

from pairmq.appliance.broker.access import SALT_BYTES, Action, hash_password
from pairmq.appliance.config import GroupConfig, load_group
from pairmq.appliance.errors import PairMQError
from pairmq.appliance.roles import Role
from pairmq.configsync.document import LIMIT_NAMES, OVERLOAD_NAMES

from . import api
from .options import add_group, examples, group_path
from .render import count
from .terminal import Terminal
from .units import format_size, is_size, parse_number, parse_size

if TYPE_CHECKING:
    from rich.table import Table  # imported where a table is made: every command builds this module's parsers

ROUTING = (Role.PRIMARY, Role.BACKUP)
CHANGE_TIMEOUT_S = 10.0


# --- talking to the group ------------------------------------------------------------------------


def _config(args) -> GroupConfig:
    return load_group(group_path(args))


def _token(config: GroupConfig) -> str:
    return api.token(config)


def submit(term: Terminal, config: GroupConfig, *changes: dict, what: str | None = None) -> dict:
    """Send `changes` to the active; print what changed (`what` in the person's words, when the node's
    own description would be less exact). Raises a one-sentence PairMQError on refusal."""
    token, refusals = _token(config), []
    for role in ROUTING:
        url = f"{api.base_url(config, role)}/api/v1/config/changes"
        try:
            reply = api.post_json(url, {"changes": list(changes)}, token=token, timeout_s=CHANGE_TIMEOUT_S)
        except api.NodeUnreachable as exc:
            refusals.append(f"the {role.value} at {api.base_url(config, role)}: {exc}")
            continue
        except api.ApiError as exc:
            if "taken only on the active node" in str(exc):
                refusals.append(f"the {role.value}: {exc}")
                continue
            raise PairMQError(f"nothing changed: {exc}") from None
        for applied in reply["applied"]:
            term.note(f"version {applied['version']}: {what or applied['what']}")
        where = ("the standby confirmed it" if reply["confirmed_by_standby"]
                 else f"config-sync is {reply['config_sync']}: the standby gets it when it rejoins")
        term.note(f"applied on the {role.value} (active); {where}")
        term.record(applied=reply["applied"], active=role.value, confirmed_by_standby=reply["confirmed_by_standby"],
                    config_sync=reply["config_sync"])
        return reply
    raise PairMQError("no active node took the change; nothing changed (" + "; ".join(refusals) + ")")


def read_config(config: GroupConfig, path: str = "/api/v1/config", *, token: str | None = None,
                role: Role | None = None) -> dict:
    """The configuration view of `role`, or of the active (else any routing node that answers)."""
    errors, refused, found = [], [], None
    for r in ([role] if role else ROUTING):
        try:
            url = f"{api.base_url(config, r)}{path}"
            document = api.get_json(url, token=token or _token(config))
        except api.ApiError as exc:
            errors.append(f"the {r.value}: {exc}")
            if exc.status == api.UNAUTHORIZED:
                refused.append(r.value)
            continue
        found = found or document
        status = api.get_json(f"{api.base_url(config, r)}/api/v1/redundancy", token=_token(config))
        if role is not None or status.get("serving"):
            return document
    if found is not None:
        return found
    if refused and len(refused) == len(errors):
        raise api.token_refused(config, refused)
    raise PairMQError("no routing node answered (" + "; ".join(errors) + ")")


# --- commands ---------------------------------------------------------------------------------------


def users(args, term: Terminal) -> int:
    config = _config(args)
    if args.action == "list":
        view = read_config(config)
        if args.json:
            term.print_json({"allow_anonymous": view["allow_anonymous"], "users": view["users"],
                             "version": view["version"]})
            return 0
        table = _table("user")
        for name in view["users"]:
            table.add_row(name)
        term.print_table(table)
        term.note(f"{count(len(view['users']), 'user')}; anonymous clients are "
                  f"{'allowed' if view['allow_anonymous'] else 'refused'} (configuration version {view['version']})")
        return 0
    name = args.name
    if args.action == "del":
        submit(term, config, {"kind": "user.delete", "username": name})
        return 0
    view = read_config(config)
    existing = view["users"]
    if args.action == "add" and name in existing:
        raise PairMQError(f"user {name!r} already exists; change the password with `pairmq config users passwd`")
    if args.action == "passwd" and name not in existing:
        raise PairMQError(f"there is no user {name!r}")
    password = _read_password(args)
    # Only the scrypt record leaves this machine, so the length can be checked only here.
    min_length = view.get("limits", {}).get("effective", {}).get("password_min_length", 8)
    if len(password) < min_length:
        raise PairMQError(f"the password has {len(password)} bytes; the group asks for at least {min_length} "
                          f"(limits.password_min_length); nothing changed")
    record = hash_password(password, secrets.token_bytes(SALT_BYTES))
    what = f"added user {name!r}" if args.action == "add" else f"changed the password of user {name!r}"
    submit(term, config, {"kind": "user.set", "username": name, "record": record.to_document()}, what=what)
    return 0


def acl(args, term: Terminal) -> int:
    config = _config(args)
    if args.action == "list":
        view = read_config(config)
        rules = [{k: r[k] for k in ("effect", "action", "filter", "who")} for r in view["acl"]]
        if args.json:
            term.print_json({"rules": rules, "version": view["version"]})
            return 0
        table = _table("#", "effect", "action", "filter", "who")
        for i, rule in enumerate(rules):
            table.add_row(str(i), rule["effect"], rule["action"], rule["filter"], rule["who"])
        term.print_table(table)
        term.note("rules apply in order, first match wins; no match: denied" if rules else
                  "no rules: everything is allowed to every client that may connect")
        return 0
    if args.action == "remove":
        submit(term, config, {"kind": "acl.delete", "index": args.index})
        return 0
    who = (f"user:{args.user}" if args.user is not None else "anonymous" if args.anonymous
           else "users" if args.users else "all")
    submit(term, config, {"kind": "acl.add", "rule": {"effect": args.action, "action": args.what,
                                                      "filter": args.filter, "who": who}})
    return 0


def anonymous(args, term: Terminal) -> int:
    submit(term, _config(args), {"kind": "anonymous.set", "allowed": args.action == "allow"})
    return 0


def settings(args, term: Terminal) -> int:
    """`config limits|overload list|set|unset`."""
    config, table_name = _config(args), args.thing
    if args.action == "list":
        view = read_config(config)[table_name]
        if args.json:
            term.print_json(view)
            return 0
        table = _table("name", "value", "source")
        for name, value in view["effective"].items():
            table.add_row(name, format_size(value) if is_size(name) else f"{value:,}",
                          "config-sync" if name in view["set"] else "default")
        term.print_table(table)
        return 0
    if args.action == "unset":
        value, shown = None, "the default"
    elif is_size(args.name):
        value = parse_size(args.value)
        shown = format_size(value)
    else:
        value = parse_number(args.value)
        shown = f"{value:,}"
    submit(term, config, {"kind": f"{table_name}.set", "name": args.name, "value": value},
           what=f"{table_name}.{args.name} set to {shown}")
    return 0


def auto_revert(args, term: Terminal) -> int:
    enabled = {"on": True, "off": False, "default": None}[args.action]
    submit(term, _config(args), {"kind": "auto_revert.set", "enabled": enabled})
    return 0


def assert_config(args, term: Terminal) -> int:
    config, source = _config(args), Role(args.source)
    document = read_config(config, "/api/v1/config/document", token=_token(config), role=source)
    if not args.yes:
        if not sys.stdin.isatty():
            raise PairMQError("asserting replaces the active's whole configuration; confirm with --yes")
        answer = input(f"Replace the whole configuration by the {source.value}'s (version {document['version']})? "
                       f"Type yes: ")
        if answer.strip() != "yes":
            raise PairMQError("not confirmed; nothing changed")
    submit(term, config, {"kind": "document.replace", "document": document["document"]})
    return 0


def show_config_sync(term: Terminal, config: GroupConfig, *, as_json: bool) -> int:
    nodes = []
    for role in ROUTING:
        try:
            nodes.append({"role": role.value, "reachable": True,
                          **api.get_json(f"{api.base_url(config, role)}/api/v1/config-sync",
                                         token=_token(config))})
        except api.ApiError as exc:
            nodes.append({"role": role.value, "reachable": False, "error": str(exc)})
    if not any(n["reachable"] for n in nodes):
        raise PairMQError("no routing node answered (" + "; ".join(f"the {n['role']}: {n['error']}" for n in nodes) + ")")
    if as_json:
        term.print_json({"schema": 1, "group": config.name, "nodes": nodes})
        return 0
    table = _table("node", "config-sync", "version", "digest", "mate has", "refused frames")
    for n in nodes:
        if not n["reachable"]:
            table.add_row(n["role"], "unreachable", "", "", "", n["error"])
            continue
        mate = n.get("mate")
        table.add_row(n["role"], n["status"], str(n["version"]), n["digest"][:12],
                      "" if mate is None else f"{mate['version']} ({mate['digest'][:12]})",
                      str(sum(n["refusals"].values())))
    term.print_table(table)
    return 0


# --- helpers ----------------------------------------------------------------------------------------


def _table(*columns: str) -> Table:
    from rich import box
    from rich.table import Table

    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for column in columns:
        table.add_column(column)
    return table


def _read_password(args) -> bytes:
    if args.password_stdin:
        line = sys.stdin.readline()
        password = line[:-1] if line.endswith("\n") else line
    else:
        if not sys.stdin.isatty():
            raise PairMQError("no terminal to ask for the password on; pass it on stdin with --password-stdin")
        password = getpass.getpass("password: ")
        if getpass.getpass("again: ") != password:
            raise PairMQError("the two passwords differ; nothing changed")
    if not password:
        raise PairMQError("an empty password is not allowed; nothing changed")
    return password.encode()


# --- the parsers ------------------------------------------------------------------------------------


def add_parsers(commands) -> None:
    config = commands.add_parser(
        "config", help="users, ACLs, limits, overload, auto-revert (on the active, config-synced)",
        description="Change the group's replicated configuration. Changes go to the active node and are "
                    "config-synced to the standby; each prints its new version.",
        epilog=examples("pairmq config users add alice", "pairmq config acl allow publish 'sensors/#' --user alice",
                        "pairmq config limits set session_queue_max_messages 50000",
                        "pairmq config anonymous refuse", "pairmq config assert --from backup --yes"))
    things = config.add_subparsers(dest="thing", metavar="WHAT", parser_class=type(config))
    config.set_defaults(handler=lambda args, term: _help(config, term))

    def leaf(parent, name: str, help_text: str, handler, example: str, *, json_flag: bool = False):
        p = parent.add_parser(name, help=help_text, description=help_text[0].upper() + help_text[1:] + ".",
                              epilog=examples(example))
        if json_flag:
            p.add_argument("--json", action="store_true", help="print a JSON document")
        add_group(p)
        p.set_defaults(handler=handler)
        return p

    def branch(name: str, help_text: str, description: str, *example_lines: str):
        b = things.add_parser(name, help=help_text, description=description, epilog=examples(*example_lines))
        b.set_defaults(handler=lambda args, term: _help(b, term))
        return b.add_subparsers(dest="action", metavar="ACTION", parser_class=type(config))

    u = branch("users", "add, change, delete and list users", "Users log in with a user name and a scrypt-hashed "
               "password.", "pairmq config users add alice", "echo s3cret | pairmq config users passwd alice "
               "--password-stdin", "pairmq config users list --json")
    for name, help_text in (("add", "add a user"), ("passwd", "change a user's password"), ("del", "delete a user")):
        p = leaf(u, name, help_text, users, f"pairmq config users {name} alice")
        p.add_argument("name", help="the user name")
        if name != "del":
            p.add_argument("--password-stdin", action="store_true", help="read the password from stdin's first line")
    leaf(u, "list", "list the users", users, "pairmq config users list --json", json_flag=True)

    a = branch("acl", "allow or deny publish/subscribe on topic filters", "ACL rules apply in order; the first that "
               "matches decides. Once any rule exists, what no rule allows is denied.",
               "pairmq config acl allow both 'sensors/#' --user alice", "pairmq config acl deny subscribe 'secret/#' "
               "--all", "pairmq config acl list", "pairmq config acl remove 0")
    for name in ("allow", "deny"):
        p = leaf(a, name, f"append a rule that {'allows' if name == 'allow' else 'denies'}", acl, f"pairmq config acl {name} publish 'a/#' --user alice")
        p.add_argument("what", choices=[x.value for x in Action], help="publish, subscribe or both")
        p.add_argument("filter", help="a topic filter (+ and # allowed)")
        who = p.add_mutually_exclusive_group(required=True)
        who.add_argument("--user", metavar="NAME", help="for this user")
        who.add_argument("--anonymous", action="store_true", help="for clients without a user name")
        who.add_argument("--users", action="store_true", help="for every authenticated user")
        who.add_argument("--all", action="store_true", help="for everyone")
    leaf(a, "remove", "remove rule N (see `acl list`)", acl, "pairmq config acl remove 0").add_argument(
        "index", type=int, help="the rule's number")
    leaf(a, "list", "list the rules in order", acl, "pairmq config acl list --json", json_flag=True)

    n = branch("anonymous", "allow or refuse clients without a user name", "Allow or refuse clients that connect "
               "without a user name (refusing disconnects those connected).", "pairmq config anonymous refuse")
    for name in ("allow", "refuse"):
        leaf(n, name, f"{name} anonymous clients", anonymous, f"pairmq config anonymous {name}")

    for table, one, names, example in (
            ("limits", "limit", LIMIT_NAMES, "spool_max_bytes 8GiB"),
            ("overload", "overload setting", OVERLOAD_NAMES, "max_window 50")):
        s = branch(table, f"the group's {table}" if table == "limits" else "overload protection",
                   f"Set a {one}; one left unset keeps its default. Sizes (names ending in _bytes) take units: "
                   f"8GiB, 512MiB, 64kB, 1e9.",
                   f"pairmq config {table} set {example}", f"pairmq config {table} list --json")
        p = leaf(s, "set", f"set one {one}", settings, f"pairmq config {table} set {example}")
        p.add_argument("name", choices=names, help=f"the {one}")
        p.add_argument("value", help="its new value (a size with a unit for names ending in _bytes)")
        p = leaf(s, "unset", "go back to the default", settings, f"pairmq config {table} unset {example.split()[0]}")
        p.add_argument("name", choices=names, help=f"the {one}")
        leaf(s, "list", f"list the {table} in force" if table == "limits" else f"list the {one}s in force",
             settings, f"pairmq config {table} list", json_flag=True)

    r = branch("auto-revert", "move activity back to the primary once it is in sync (on/off)",
               "Auto-revert: once the primary is back and in sync, activity moves back to it.",
               "pairmq config auto-revert on")
    for name, help_text in (("on", "turn auto-revert on"), ("off", "turn it off"),
                            ("default", "use the group file's setting")):
        leaf(r, name, help_text, auto_revert, f"pairmq config auto-revert {name}")

    p = things.add_parser("assert", help="make one node's configuration the group's (asks first)",
                          description="Replace the active's whole configuration by ROLE's; the standby follows.",
                          epilog=examples("pairmq config assert --from backup --yes"))
    p.add_argument("--from", dest="source", required=True, choices=[r.value for r in ROUTING],
                   help="the node whose configuration wins")
    p.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    add_group(p)
    p.set_defaults(handler=assert_config)


def _help(parser, term: Terminal) -> int:
    term.out.file.write(parser.format_help())
    return 0

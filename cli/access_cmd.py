"""`pairmq config users|acl|anonymous`: edit the access file of the nodes on this machine.

Until config-sync exists (it will route these through the management API on
the active node), each routing node reads `<data_dir>/config/access.json`
and picks up changes within a second. These commands edit that file:

- `--file PATH` edits one file; otherwise `--role primary|backup` edits that
  node's; otherwise every routing node whose data directory exists on this
  machine (both for a local group, the one of this host in a real group).
  Every edited file gets the same document (the same salts and hashes).
- A password is read from the terminal without echo (twice), or from the
  first line of stdin with `--password-stdin`; never from the command line,
  where `ps` would show it. An empty password is refused.
- A change is validated as a whole before anything is written; the write is
  atomic and mode 0600.
"""

from __future__ import annotations

import getpass
import secrets
import sys
from pathlib import Path

from appliance.access_file import access_path, load_access, write_access
from appliance.broker.access import SALT_BYTES, AccessPolicy, Action, Effect, Rule, hash_password
from appliance.config import load_group
from appliance.errors import PairMQError
from appliance.roles import Role
from rich import box
from rich.table import Table

from .terminal import Terminal


def target_files(args) -> list[Path]:
    if args.file is not None:
        return [args.file]
    from .main import group_path

    config = load_group(group_path(args))
    roles = [Role(args.role)] if args.role else [r for r in Role if r.routes_messages]
    if args.role:
        return [access_path(config.node(roles[0]).data_dir)]
    found = [access_path(config.node(r).data_dir) for r in roles if config.node(r).data_dir.is_dir()]
    if not found:
        dirs = ", ".join(str(config.node(r).data_dir) for r in roles)
        raise PairMQError(f"no routing node's data directory exists on this machine ({dirs}); "
                          f"name one with --role primary|backup or --file PATH")
    return found


def _load(paths: list[Path]) -> AccessPolicy:
    """The document to edit: the first file that exists (they are kept identical)."""
    for path in paths:
        policy = load_access(path)
        if policy is not None:
            return policy
    return AccessPolicy()


def _save(term: Terminal, paths: list[Path], policy: AccessPolicy, what: str) -> int:
    for path in paths:
        write_access(path, policy)
    term.note(f"{what}; wrote {', '.join(str(p) for p in paths)} (nodes apply it within a second)")
    return 0


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


def users(args, term: Terminal) -> int:
    paths = target_files(args)
    policy = _load(paths)
    if args.action == "list":
        names = sorted(policy.users)
        if args.json:
            term.print_json({"allow_anonymous": policy.allow_anonymous, "users": names})
            return 0
        table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
        table.add_column("user")
        for name in names:
            table.add_row(name)
        term.print_table(table)
        term.note(f"{len(names)} users; anonymous clients are {'allowed' if policy.allow_anonymous else 'refused'}")
        return 0
    name = args.name
    if args.action == "add" and name in policy.users:
        raise PairMQError(f"user {name!r} already exists; change the password with `pairmq config users passwd`")
    if args.action in ("passwd", "del") and name not in policy.users:
        raise PairMQError(f"there is no user {name!r}")
    if args.action == "del":
        return _save(term, paths, policy.without_user(name), f"deleted user {name!r}")
    record = hash_password(_read_password(args), secrets.token_bytes(SALT_BYTES))
    verb = "added user" if args.action == "add" else "changed the password of"
    return _save(term, paths, policy.with_user(name, record), f"{verb} {name!r}")


def acl(args, term: Terminal) -> int:
    paths = target_files(args)
    policy = _load(paths)
    if args.action == "list":
        if args.json:
            term.print_json({"rules": [r.to_document() for r in policy.rules]})
            return 0
        table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
        for column in ("#", "effect", "action", "filter", "who"):
            table.add_column(column)
        for i, rule in enumerate(policy.rules):
            table.add_row(str(i), rule.effect.value, rule.action.value, rule.filter, rule.who)
        term.print_table(table)
        term.note("rules apply in order, first match wins; no rules: everything allowed" if not policy.rules else
                  "rules apply in order, first match wins; no match: denied")
        return 0
    if args.action == "remove":
        return _save(term, paths, policy.without_rule(args.index), f"removed rule {args.index}")
    who = (f"user:{args.user}" if args.user is not None else "anonymous" if args.anonymous
           else "users" if args.users else "all")
    rule = Rule(Effect(args.action), Action(args.what), args.filter, who)
    return _save(term, paths, policy.with_rule(rule),
                 f"added rule {len(policy.rules)}: {args.action} {args.what} {args.filter} for {who}")


def anonymous(args, term: Terminal) -> int:
    paths = target_files(args)
    allowed = args.action == "allow"
    return _save(term, paths, _load(paths).with_anonymous(allowed),
                 f"anonymous clients are now {'allowed' if allowed else 'refused'}")


def add_parsers(commands, add_group, examples) -> None:
    config = commands.add_parser(
        "config", help="users, passwords, ACLs and anonymous access",
        description="Edit the access file (<data_dir>/config/access.json) of the routing nodes on this machine.",
        epilog=examples("pairmq config users add alice", "pairmq config acl allow publish 'sensors/#' --user alice",
                        "pairmq config anonymous refuse"))
    things = config.add_subparsers(dest="thing", metavar="WHAT", parser_class=type(config))
    config.set_defaults(handler=lambda args, term: _help(config, term))

    def common(p) -> None:
        add_group(p)
        p.add_argument("--role", choices=[r.value for r in Role if r.routes_messages],
                       help="edit this node's file only (default: every routing node with a data directory here)")
        p.add_argument("--file", type=Path, help="edit this access file instead")

    u = things.add_parser("users", help="add, change, delete and list users",
                          description="Users log in with a user name and a scrypt-hashed password.",
                          epilog=examples("pairmq config users add alice", "echo s3cret | pairmq config users passwd "
                                          "alice --password-stdin", "pairmq config users list --json"))
    u_actions = u.add_subparsers(dest="action", metavar="ACTION", parser_class=type(config))
    u.set_defaults(handler=lambda args, term: _help(u, term))
    for name, help_text in (("add", "add a user"), ("passwd", "change a user's password"), ("del", "delete a user")):
        p = u_actions.add_parser(name, help=help_text, description=help_text[0].upper() + help_text[1:] + ".",
                                 epilog=examples(f"pairmq config users {name} alice"))
        p.add_argument("name", help="the user name")
        if name != "del":
            p.add_argument("--password-stdin", action="store_true", help="read the password from stdin's first line")
        common(p)
        p.set_defaults(handler=users)
    p = u_actions.add_parser("list", help="list the users", description="List the users.",
                             epilog=examples("pairmq config users list --json"))
    p.add_argument("--json", action="store_true", help="print a JSON document")
    common(p)
    p.set_defaults(handler=users)

    a = things.add_parser("acl", help="allow or deny publish/subscribe on topic filters",
                          description="ACL rules apply in order; the first that matches decides. Once any rule "
                                      "exists, what no rule allows is denied.",
                          epilog=examples("pairmq config acl allow both 'sensors/#' --user alice",
                                          "pairmq config acl deny subscribe 'secret/#' --all",
                                          "pairmq config acl list", "pairmq config acl remove 0"))
    a_actions = a.add_subparsers(dest="action", metavar="ACTION", parser_class=type(config))
    a.set_defaults(handler=lambda args, term: _help(a, term))
    for name in ("allow", "deny"):
        p = a_actions.add_parser(name, help=f"append a rule that {name}s", description=f"Append a rule that {name}s.",
                                 epilog=examples(f"pairmq config acl {name} publish 'a/#' --user alice"))
        p.add_argument("what", choices=[x.value for x in Action], help="publish, subscribe or both")
        p.add_argument("filter", help="a topic filter (+ and # allowed)")
        who = p.add_mutually_exclusive_group(required=True)
        who.add_argument("--user", metavar="NAME", help="for this user")
        who.add_argument("--anonymous", action="store_true", help="for clients without a user name")
        who.add_argument("--users", action="store_true", help="for every authenticated user")
        who.add_argument("--all", action="store_true", help="for everyone")
        common(p)
        p.set_defaults(handler=acl)
    p = a_actions.add_parser("remove", help="remove rule N (see `acl list`)", description="Remove rule N.",
                             epilog=examples("pairmq config acl remove 0"))
    p.add_argument("index", type=int, help="the rule's number")
    common(p)
    p.set_defaults(handler=acl)
    p = a_actions.add_parser("list", help="list the rules in order", description="List the rules in order.",
                             epilog=examples("pairmq config acl list --json"))
    p.add_argument("--json", action="store_true", help="print a JSON document")
    common(p)
    p.set_defaults(handler=acl)

    n = things.add_parser("anonymous", help="allow or refuse clients without a user name",
                          description="Allow or refuse clients that connect without a user name.",
                          epilog=examples("pairmq config anonymous refuse"))
    n_actions = n.add_subparsers(dest="action", metavar="ACTION", parser_class=type(config))
    n.set_defaults(handler=lambda args, term: _help(n, term))
    for name in ("allow", "refuse"):
        p = n_actions.add_parser(name, help=f"{name} anonymous clients", description=f"{name.title()} anonymous clients.",
                                 epilog=examples(f"pairmq config anonymous {name}"))
        common(p)
        p.set_defaults(handler=anonymous)


def _help(parser, term: Terminal) -> int:
    term.out.file.write(parser.format_help())
    return 0

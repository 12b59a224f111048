"""`pairmq admin passwd`: the management API's admin credential (appliance/api/admin_credential.py).

Rules:
- The credential is a group setting beside the secret (`admin`, mode 0600),
  like the secret identical on all three hosts: this command writes it on the
  host it runs on; copy it to the other hosts as you copied the secret. Nodes
  pick a changed file up by themselves (no restart).
- The password is read from the terminal (twice) or from stdin's first line
  (`--password-stdin`), never from the command line; `--generate` draws one
  and prints it once on stdout. Only its scrypt record is written.
- `pairmq init` writes the first credential: a generated password printed
  once, or the operator's with `--admin-password-stdin`.
"""

from __future__ import annotations

from pairmq.appliance.api.admin_credential import (DEFAULT_USER, admin_path, generate_password, new_credential,
                                        write_admin)
from pairmq.appliance.config import GroupConfig

from .options import add_group, examples, group_path
from .terminal import Terminal


def add_parsers(commands) -> None:
    admin = commands.add_parser(
        "admin", help="the management API's admin credential (HTTP Basic, the status page)",
        description="The admin user and password that a browser uses on the management API (HTTP Basic). "
                    "Scripts and this CLI use the token derived from the group secret instead.",
        epilog=examples("pairmq admin passwd", "pairmq admin passwd --generate",
                        "printf '%s\\n' \"$PW\" | pairmq admin passwd --password-stdin"))
    actions = admin.add_subparsers(dest="action", metavar="ACTION", parser_class=type(admin))
    admin.set_defaults(handler=lambda args, term: _help(admin, term))
    p = actions.add_parser(
        "passwd", help="set the admin password (and optionally the user name)",
        description="Write a new admin credential beside the group secret (mode 0600). Copy the file to the "
                    "other two hosts, as the secret; each node picks it up without a restart.",
        epilog=examples("pairmq admin passwd", "pairmq admin passwd --user ops --generate",
                        "pairmq admin passwd --password-stdin < pw.txt --group /etc/pairmq/group.toml"))
    p.add_argument("--user", default=DEFAULT_USER, help=f"the admin user name (default: {DEFAULT_USER})")
    how = p.add_mutually_exclusive_group()
    how.add_argument("--password-stdin", action="store_true", help="read the password from stdin's first line")
    how.add_argument("--generate", action="store_true", help="generate a password and print it once")
    add_group(p)
    p.set_defaults(handler=_cmd_passwd)


def _help(parser, term: Terminal) -> int:
    term.out.file.write(parser.format_help())
    return 0


def _cmd_passwd(args, term: Terminal) -> int:
    from pairmq.appliance.config import load_group
    config = load_group(group_path(args))
    if args.generate:
        password = generate_password()
    else:
        from .config_cmd import _read_password

        password = _read_password(args).decode()
    path = set_admin(config, args.user, password)
    term.record(admin_user=args.user, file=str(path))
    if args.generate:
        if term.json_mode:
            term.record(admin_password=password)
        else:
            term.print_text(password)
    term.note(f"wrote {path} (user {args.user!r}); copy it to the same path on the other hosts")
    return 0


def set_admin(config: GroupConfig, username: str, password: str):
    path = admin_path(config)
    write_admin(path, new_credential(username, password))
    return path


def show_admin_password(term: Terminal, user: str, password: str, change: str) -> None:
    """A generated admin password, once, on stdout: it is data (`init` and `local up` alike)."""
    if term.json_mode:
        term.record(admin_user=user, admin_password=password)
    else:
        term.print_text(f"admin password (user {user}, shown once; change it with `{change}`): {password}")

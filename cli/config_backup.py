"""`pairmq config export` and `pairmq config import`: the replicated configuration to a file and back.

Rules:
- Export reads the whole document from the active (or, with none active, any routing node that
  answers) with the group's management key, and writes it as configsync/backup.py's file: to
  `--out FILE` (created 0600, replaced atomically) or to stdout.
- Import is a dry run unless `--apply`: it reads and checks the file whole, reads the active's
  document, and prints every difference. `--apply` sends the imported document as ONE
  `document.replace` change with the version the differences were computed against
  (`base_version`): the active applies it as one version bump and config-syncs it, or refuses it
  whole when the configuration changed in between.
- Refused, with one sentence and nothing changed: a file too large, not JSON, of the wrong shape or
  types, from a newer export format; a file exported from another group unless `--from-other-group`;
  a configuration that changed between the dry run's read and the apply.
- An import with no differences changes nothing, `--apply` or not.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import tempfile
from pathlib import Path

from pairmq.appliance.errors import PairMQError
from pairmq.configsync.backup import MAX_IMPORT_BYTES, Export, ImportRefused, differences, parse_export
from pairmq.configsync.document import ConfigDocument

from . import api
from .config_cmd import ROUTING, read_config
from .options import add_group, examples, group_path
from .terminal import Terminal

APPLY_TIMEOUT_S = 10.0


def export(args, term: Terminal) -> int:
    from pairmq.appliance.config import load_group

    config = load_group(group_path(args))
    view = read_config(config, "/api/v1/config/document")
    made = Export(config.name, view["version"], ConfigDocument.from_json(view["document"]),
                  exported_at=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                  exported_from=_served_by(config))
    document = made.to_json()
    summary = {"file": str(args.out) if args.out else None, "group": made.group,
               "config_version": made.config_version, "digest": document["digest"],
               "users": len(made.document.access.users), "acl_rules": len(made.document.access.rules)}
    if args.out is None:
        term.out.file.write(json.dumps(document, indent=2) + "\n")
        term.out.file.flush()
        return 0
    _write_private(args.out, (json.dumps(document, indent=2) + "\n").encode())
    if args.json:
        term.print_json(summary)
    term.note(f"wrote {args.out}: configuration version {made.config_version} of group {made.group!r} "
              f"({summary['users']} users with their password records, {summary['acl_rules']} ACL rules); "
              f"keep it as private as the group secret")
    return 0


def import_(args, term: Terminal) -> int:
    from pairmq.appliance.config import load_group

    config = load_group(group_path(args))
    imported = _read_export(args.file)
    if imported.group != config.name and not args.from_other_group:
        raise PairMQError(f"{args.file} was exported from group {imported.group!r}, not {config.name!r}; "
                          f"import it into this group with --from-other-group; nothing changed")
    view = read_config(config, "/api/v1/config/document")
    current, base = ConfigDocument.from_json(view["document"]), view["version"]
    found = differences(current, imported.document)
    applied = None
    if args.apply and found:
        applied = _replace(config, imported.document, base)
    if args.json:
        term.print_json({"file": str(args.file), "group": imported.group, "exported_version": imported.config_version,
                         "current_version": base, "differences": [d.to_json() for d in found],
                         "applied": applied is not None,
                         "version": applied["version"] if applied else base,
                         "confirmed_by_standby": applied["confirmed_by_standby"] if applied else None})
    else:
        for difference in found:
            term.print_text(difference.sentence())
    if not found:
        term.note(f"nothing to change: the group's configuration (version {base}) is what {args.file} holds")
    elif applied is None:
        term.note(f"dry run: {_count(len(found))} against version {base}; nothing changed "
                  f"(apply them as one change with --apply)")
    else:
        where = ("the standby confirmed it" if applied["confirmed_by_standby"]
                 else f"config-sync is {applied['config_sync']}: the standby gets it when it rejoins")
        term.note(f"imported {args.file} as version {applied['version']} ({_count(len(found))}); {where}")
    return 0


# --- helpers ----------------------------------------------------------------------------------------


def _read_export(path: Path) -> Export:
    try:
        with open(path, "rb") as file:
            data = file.read(MAX_IMPORT_BYTES + 1)  # never more: a huge file is refused without reading it all
    except OSError as exc:
        raise PairMQError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        return parse_export(data, str(path))
    except ImportRefused as exc:
        raise PairMQError(f"{exc}; nothing changed") from None


def _replace(config, document: ConfigDocument, base: int) -> dict:
    """One document.replace on the active, only if it is still at `base`; its reply."""
    token, refusals = api.token(config), []
    body = {"changes": [{"kind": "document.replace", "document": document.to_json()}], "base_version": base}
    for role in ROUTING:
        url = f"{api.base_url(config, role)}/api/v1/config/changes"
        try:
            return api.post_json(url, body, token=token, timeout_s=APPLY_TIMEOUT_S)
        except api.NodeUnreachable as exc:
            refusals.append(f"the {role.value}: {exc}")
        except api.ApiError as exc:
            if "taken only on the active node" in str(exc):
                refusals.append(f"the {role.value}: {exc}")
                continue
            raise PairMQError(f"nothing changed: {exc}") from None
    raise PairMQError("no active node took the import; nothing changed (" + "; ".join(refusals) + ")")


def _served_by(config) -> str:
    for role in ROUTING:
        try:
            if api.get_json(f"{api.base_url(config, role)}/api/v1/redundancy", token=api.token(config)).get("serving"):
                return role.value
        except api.ApiError:
            continue
    return ""


def _write_private(path: Path, data: bytes) -> None:
    """`data` at `path`, 0600 from its first byte, whole or not at all."""
    path = Path(path)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent or Path("."))
    try:
        os.fchmod(handle, 0o600)
        with os.fdopen(handle, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _count(n: int) -> str:
    return f"{n} difference" if n == 1 else f"{n} differences"


# --- the parsers ------------------------------------------------------------------------------------


def add_parsers(config_parser: argparse.ArgumentParser) -> None:
    """`export` and `import` under the `config` command that cli/config_cmd.py builds."""
    # argparse has no public way to reach a parser's subcommands once made; this is the one it keeps.
    things = next(a for a in config_parser._actions if isinstance(a, argparse._SubParsersAction))
    p = things.add_parser(
        "export", help="write the whole replicated configuration to a file (password records included)",
        description="Write users (with their scrypt password records), the ACL, anonymous access, limits, overload "
                    "and auto-revert, with the configuration version, as JSON. Never written: the group file, the "
                    "group secret, the admin file, TLS keys. The file is created 0600.",
        epilog=examples("pairmq config export --out config-backup.json", "pairmq config export > backup.json",
                        "pairmq config export --out backup.json --json"))
    p.add_argument("--out", type=Path, metavar="FILE", help="write here (0600) instead of stdout")
    p.add_argument("--json", action="store_true", help="with --out: print a JSON summary of what was written")
    add_group(p)
    p.set_defaults(handler=export)
    p = things.add_parser(
        "import", help="show what a configuration export would change; --apply makes it the group's",
        description="Compare FILE (from `pairmq config export`) with the active's configuration and print every "
                    "difference. With --apply, replace the configuration by FILE's as one version, config-synced "
                    "to the standby; refused whole if the configuration changed in between.",
        epilog=examples("pairmq config import backup.json", "pairmq config import backup.json --apply",
                        "pairmq config import other.json --from-other-group --apply --json"))
    p.add_argument("file", type=Path, metavar="FILE", help="a file written by `pairmq config export`")
    p.add_argument("--apply", action="store_true", help="apply the differences (default: a dry run)")
    p.add_argument("--from-other-group", action="store_true",
                   help="accept a file exported from a group of another name")
    p.add_argument("--json", action="store_true", help="print the differences and the outcome as JSON")
    add_group(p)
    p.set_defaults(handler=import_)

"""`pairmq spool verify|migrate DIR`: a spool directory inspected or converted on this host, offline (docs/spool.md).

Rules:
- Both work on a directory, not through the management API: they are what an operator runs on a
  node's data directory (`<data_dir>/spool`) when the node refuses it or before starting it.
- `verify` only reads (appliance/spool/verify.py) and may run beside a node serving from the spool.
  Exit 0: sound; 1: damaged or not readable by this version, with one sentence naming the file and
  the byte offset; 2: DIR is not a spool directory (a usage mistake).
- `migrate` converts the old SQLite layout (appliance/spool/legacy/migrate.py): it takes the spool's
  lock, so it refuses while a node holds the spool; it refuses a damaged old file and a directory
  with nothing to migrate, each in one sentence, changing nothing.
- `--json` prints a stable document (schema 1); the renderers are pure functions of it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from typing import TYPE_CHECKING

from pairmq.appliance.errors import PairMQError

from .options import examples
from .terminal import Terminal

if TYPE_CHECKING:  # Rich is imported when something is printed (terminal.py says why)
    from rich.console import Group

EXIT_DAMAGED, EXIT_USAGE = 1, 2


def add_parsers(commands) -> None:
    spool = commands.add_parser(
        "spool", help="inspect or convert a spool directory on this host (offline)",
        description="Read a node's spool directory (<data_dir>/spool) directly: verify every record and the "
                    "checksum chain, or convert a spool of the old SQLite layout.",
        epilog=examples("pairmq spool verify /var/lib/pairmq/primary/spool",
                        "pairmq spool migrate /var/lib/pairmq/backup/spool"))
    actions = spool.add_subparsers(dest="action", metavar="ACTION", parser_class=type(spool))
    spool.set_defaults(handler=lambda args, term: _help(spool, term))
    p = actions.add_parser(
        "verify", help="check every record, the chain and the checkpoint; list segments and totals",
        description="Check a spool directory as a node would at start, without changing it (it may run beside "
                    "a node serving from it): every record's CRC, the chain across segments, the checkpoint's "
                    "counts and that it is on the log. Exit 0 sound, 1 damaged (one sentence naming the file "
                    "and the byte offset), 2 not a spool directory.",
        epilog=examples("pairmq spool verify /var/lib/pairmq/primary/spool",
                        "pairmq spool verify ./local/data/backup/spool --json"))
    p.add_argument("dir", type=Path, metavar="DIR", help="the spool directory (<data_dir>/spool)")
    p.add_argument("--json", action="store_true", help="print a JSON document: {directory, sound, damage, ...}")
    p.set_defaults(handler=_cmd_verify)
    p = actions.add_parser(
        "migrate", help="convert a spool of the old SQLite layout (spool.db), with the node stopped",
        description="Convert the old layout's spool.db into a checkpoint of the new layout at the same chain "
                    "point; the old files are moved to DIR.old-layout/, never deleted. Refused while a node "
                    "holds the spool, when spool.db is damaged, or when there is nothing to migrate.",
        epilog=examples("pairmq spool migrate /var/lib/pairmq/primary/spool",
                        "pairmq spool migrate ./local/data/backup/spool --json"))
    p.add_argument("dir", type=Path, metavar="DIR", help="the spool directory (<data_dir>/spool)")
    p.add_argument("--json", action="store_true", help="print a JSON document: {directory, head, sessions, ...}")
    p.set_defaults(handler=_cmd_migrate)


def _help(parser: argparse.ArgumentParser, term: Terminal) -> int:
    term.out.file.write(parser.format_help())
    return 0


# --- verify ------------------------------------------------------------------------


def _cmd_verify(args: argparse.Namespace, term: Terminal) -> int:
    from pairmq.appliance.spool.verify import NotASpool, verify

    try:
        report = verify(args.dir)
    except NotASpool as exc:
        term.error(str(exc))
        return EXIT_USAGE
    document = verify_document(report)
    if args.json:
        term.print_json(document)
    elif report.sound or report.segments or report.checkpoints:  # an old layout has no files of ours to list
        term.print_table(verify_tables(document))
    if report.in_use:
        term.note(f"a process holds {args.dir} (a node serving from it): what it wrote during the check may "
                  "read as an unfinished write")
    if report.damage is not None:
        term.error(report.damage)
        return EXIT_DAMAGED
    return 0


def _point(p) -> dict | None:
    return None if p is None else {"epoch": p.epoch, "seq": p.seq, "checksum": p.checksum.hex()}


def verify_document(report) -> dict:
    return {
        "schema": 1, "directory": str(report.directory), "sound": report.sound, "damage": report.damage,
        "in_use": report.in_use, "base": _point(report.base), "head": _point(report.head),
        "checkpoints": [{"name": c.name, "point": _point(c.point), "ops": c.ops, "bytes": c.bytes,
                         "verified": c.verified} for c in report.checkpoints],
        "segments": [{"name": s.name, "first_seq": s.base.seq + 1, "last_seq": s.last.seq,
                      "first_epoch": s.first_epoch, "last_epoch": s.last.epoch, "bytes": s.bytes,
                      "commits": s.commits, "ops": s.ops, "unfinished_bytes": s.unfinished_bytes}
                     for s in report.segments],
        "leftovers": list(report.leftovers),
        "totals": None if report.totals is None else {
            "sessions": report.totals.sessions, "queued_messages": report.totals.queued_messages,
            "retained": report.totals.retained, "stored_messages": report.totals.stored_messages,
            "stored_bytes": report.totals.stored_bytes},
    }


def _epochs(first: int, last: int) -> str:
    return str(first) if first == last else f"{first}-{last}"


def verify_tables(document: dict) -> Group:
    """The files (checkpoints, then segments, oldest first) and, for a sound spool, its log and totals."""
    from rich import box
    from rich.console import Group
    from rich.table import Table

    from .render import size

    files = Table(title=f"Spool {document['directory']}: " + ("sound" if document["sound"] else "DAMAGED"),
                  title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for name, justify in (("File", "left"), ("Ops", "right"), ("Epochs", "right"), ("Commits", "right"),
                          ("Bytes", "right"), ("Note", "left")):
        files.add_column(name, justify=justify)
    for c in document["checkpoints"]:
        at, epoch = (f"at {c['point']['seq']:,}", str(c["point"]["epoch"])) if c["point"] else ("?", "?")
        files.add_row(c["name"], at, epoch, "-",
                      size(c["bytes"]), f"checkpoint, {c['ops']:,} ops, records ok" if c["verified"]
                      else "older checkpoint (removed by the next one)")
    for s in document["segments"]:
        ops = f"{s['first_seq']:,}-{s['last_seq']:,}" if s["ops"] else "none"
        note = f"{s['unfinished_bytes']:,} bytes of an unfinished write at its end" if s["unfinished_bytes"] else ""
        files.add_row(s["name"], ops, _epochs(s["first_epoch"], s["last_epoch"]), f"{s['commits']:,}",
                      size(s["bytes"]), note)
    for name in document["leftovers"]:
        files.add_row(name, "", "", "", "", "left by a crash (removed at the next open)")
    parts: list = [files]
    if document["totals"] is not None:
        t, base, head = document["totals"], document["base"], document["head"]
        summary = Table(box=None, show_header=False, pad_edge=False)
        summary.add_column("")
        summary.add_column("", justify="right")
        for label, value in (
                ("Log", f"ops {base['seq'] + 1:,}-{head['seq']:,}, head epoch {head['epoch']}"
                        if head["seq"] > base["seq"] else f"empty after op {base['seq']:,}"),
                ("Commits", f"{sum(s['commits'] for s in document['segments']):,}"),
                ("On disk", size(sum(f["bytes"] for f in document["segments"] + document["checkpoints"]))),
                ("Sessions", f"{t['sessions']:,}"), ("Queued messages", f"{t['queued_messages']:,}"),
                ("Retained", f"{t['retained']:,}"),
                ("Stored", f"{t['stored_messages']:,} messages, {size(t['stored_bytes'])}")):
            summary.add_row(label, value)
        parts.append(summary)
    return Group(*parts)


# --- migrate -----------------------------------------------------------------------


def _cmd_migrate(args: argparse.Namespace, term: Terminal) -> int:
    from pairmq.appliance.spool.legacy.migrate import migrate

    try:
        done = migrate(args.dir)
    except FileNotFoundError as exc:
        raise PairMQError(f"nothing to migrate: {exc}") from None
    document = migrate_document(args.dir, done)
    if args.json:
        term.print_json(document)
    else:
        term.print_text(migrate_sentence(document))
    return 0


def migrate_document(directory: Path, done) -> dict:
    return {"schema": 1, "directory": str(directory), "head": _point(done.head), "sessions": done.sessions,
            "messages": done.messages, "checkpoint": str(done.checkpoint), "old_files": str(done.old_files)}


def migrate_sentence(document: dict) -> str:
    head = document["head"]
    return (f"migrated {document['directory']}: head op {head['seq']:,} (epoch {head['epoch']}), "
            f"{_count(document['sessions'], 'session')}, {_count(document['messages'], 'stored message')}; "
            f"wrote the checkpoint "
            f"{document['checkpoint']}; the old files are in {document['old_files']}")


def _count(n: int, what: str) -> str:
    return f"{n:,} {what}{'' if n == 1 else 's'}"

"""`pairmq show message-spool`: each routing node's message spool (DESIGN §6).

Rules:
- Both routing nodes are asked at once (GET /api/v1/message-spool); a node that does not answer is
  shown as unreachable, and it is an error sentence only when neither answers.
- `--json` prints a stable document (docs/operations.md):
  {"schema": 1, "group", "nodes": [{"role", "address", "reachable", "error"?, ...the node's view}]}.
- The renderer is a pure function of that document. The spool's files (a node's view's `disk`:
  segments, checkpoint, log base and head; docs/spool.md) get rows of their own, shown when a node
  reports them.
"""

from __future__ import annotations

import concurrent.futures

from rich import box
from rich.table import Table

from pairmq.appliance.config import GroupConfig
from pairmq.appliance.errors import PairMQError
from pairmq.appliance.roles import Role

from . import api
from .render import size
from .terminal import Terminal

ROUTING = (Role.PRIMARY, Role.BACKUP)


def fetch(config: GroupConfig) -> dict:
    key = api.token(config)

    def one(role: Role) -> dict:
        head = {"role": role.value, "address": config.node(role).address}
        try:
            return {**head, "reachable": True,
                    **api.get_json(f"{api.base_url(config, role)}/api/v1/message-spool", token=key)}
        except api.ApiError as exc:
            return {**head, "reachable": False, "error": str(exc)}

    with concurrent.futures.ThreadPoolExecutor(max_workers=len(ROUTING)) as pool:
        nodes = list(pool.map(one, ROUTING))
    if not any(node["reachable"] for node in nodes):
        said = "; ".join(f"the {n['role']}: {n['error']}" for n in nodes)
        raise PairMQError(f"no routing node of group {config.name!r} answered ({said})")
    return {"schema": 1, "group": config.name, "nodes": nodes}


def show(term: Terminal, config: GroupConfig, *, as_json: bool) -> int:
    document = fetch(config)
    if as_json:
        term.print_json(document)
    else:
        term.print_table(spool_table(document))
    return 0


ROWS = (  # (label, how to read it from a node's view)
    ("Sessions", lambda v: f"{v['sessions']:,}"),
    ("Queued messages", lambda v: f"{v['queued_messages']:,}"),
    ("Stored", lambda v: f"{size(v['stored_bytes'])} of {size(v['limits']['spool_max_bytes'])}"),
    ("Queue limit per session", lambda v: f"{v['limits']['session_queue_max_messages']:,} messages, "
                                          f"{size(v['limits']['session_queue_max_bytes'])}"),
    ("Commits", lambda v: f"{v['writer']['commits']:,} ({v['writer']['mean_batch_ops']} ops each)"),
    ("Last / slowest commit", lambda v: f"{v['writer']['last_commit_ms']:.2f} / {v['writer']['max_commit_ms']:.2f} ms"),
    ("Waiting to commit", lambda v: f"{v['writer']['pending_ops']:,} ops"),
    ("Refused: queue full", lambda v: f"{v['counters'].get('publish_refused_queue_full', 0):,}"),
    ("Refused: spool full", lambda v: f"{v['counters'].get('publish_refused_spool_full', 0):,}"),
    ("Commit failures", lambda v: f"{v['counters'].get('commit_failures', 0):,}"),
)


def _log(d: dict) -> str:
    base, head = d["log_base"], d["log_head"]
    if head["seq"] == base["seq"]:
        return f"empty after op {base['seq']:,}"
    return f"ops {base['seq'] + 1:,}-{head['seq']:,} (epoch {head['epoch']})"


DISK_ROWS = (  # (label, how to read it from a node's view's `disk`)
    ("Log", _log),
    ("Checkpoint", lambda d: f"at op {d['checkpoint']['seq']:,}, {size(d['checkpoint_bytes'])}"
                             if d["checkpoint"]["seq"] else "none yet"),
    ("Log since checkpoint", lambda d: size(d["log_bytes_since_checkpoint"])),
    ("Segments", lambda d: f"{d['segments']:,}, {size(d['segment_bytes'])}"),
    ("On disk", lambda d: size(d["bytes_on_disk"])),
)


def spool_table(document: dict) -> Table:
    table = Table(title=f"Group {document['group']}: message spool", title_justify="left", box=box.SIMPLE_HEAD,
                  pad_edge=False, show_edge=False)
    table.add_column("")
    for node in document["nodes"]:
        table.add_column(f"{node['role'].capitalize()} ({node['address']})", justify="right")
    for label, read in ROWS:
        table.add_row(label, *(read(n) if n["reachable"] else "-" for n in document["nodes"]))
    if any("disk" in n for n in document["nodes"]):
        for label, read in DISK_ROWS:
            table.add_row(label, *(read(n["disk"]) if "disk" in n else "-" for n in document["nodes"]))
    if any(not n["reachable"] for n in document["nodes"]):
        table.add_row("Unreachable", *("" if n["reachable"] else n["error"] for n in document["nodes"]))
    return table

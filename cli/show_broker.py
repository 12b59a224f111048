"""`pairmq show clients|sessions|subscriptions` and `pairmq events tail`: the active node's broker state.

Rules:
- Both routing nodes are asked at once; the answer of the one that serves is
  shown (a standby answers empty lists with `"serving": false`). When none
  serves, it is an error sentence naming what each node said.
- `--json` prints a stable document (docs/operations.md):
  {"schema": 1, "group", "node", "address", "<what>": [...], "total", "truncated"}.
- Renderers are pure functions of those documents (ages come in them).
"""

from __future__ import annotations

import concurrent.futures
import urllib.parse

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from pairmq.appliance.config import GroupConfig
from pairmq.appliance.errors import PairMQError
from pairmq.appliance.roles import Role

from . import api
from .render import NOT_APPLICABLE, age, count, size
from .terminal import Terminal

ROUTING = (Role.PRIMARY, Role.BACKUP)
WHAT = ("clients", "sessions", "subscriptions")
CLIENT_ID_MIN_WIDTH = 10  # a narrow terminal folds long ids rather than dropping the column


def fetch_active(config: GroupConfig, path: str, query: dict | None = None) -> tuple[Role, dict]:
    """(role, answer) of the routing node that serves; PairMQError when none does."""
    key = api.token(config)
    suffix = f"?{urllib.parse.urlencode(query)}" if query else ""

    def one(role: Role):
        try:
            return api.get_json(f"{api.base_url(config, role)}{path}{suffix}", token=key)
        except api.ApiError as exc:
            return exc

    with concurrent.futures.ThreadPoolExecutor(max_workers=len(ROUTING)) as pool:
        answers = dict(zip(ROUTING, pool.map(one, ROUTING)))
    for role, answer in answers.items():
        if isinstance(answer, dict) and answer.get("serving"):
            return role, answer
    refused = [a for a in answers.values() if isinstance(a, api.ApiError) and not isinstance(a, api.NodeUnreachable)]
    if refused and len(refused) == len(answers):
        if all(a.status == api.UNAUTHORIZED for a in refused):
            raise api.token_refused(config, [role.value for role in answers])
        raise PairMQError(f"the routing nodes refused: {refused[0]}")
    said = "; ".join(f"the {role.value}: " + (str(a) if isinstance(a, Exception) else "standby, not serving")
                     for role, a in answers.items())
    raise PairMQError(f"no routing node of group {config.name!r} serves clients right now ({said})")


def show(term: Terminal, config: GroupConfig, what: str, *, as_json: bool, client: str | None = None,
         limit: int | None = None) -> int:
    assert what in WHAT
    query = {k: v for k, v in (("client", client), ("limit", limit)) if v is not None}
    role, answer = fetch_active(config, f"/api/v1/{what}", query)
    document = {"schema": 1, "group": config.name, "node": role.value, "address": config.node(role).address,
                what: answer[what], "total": answer["total"], "truncated": answer["truncated"]}
    if as_json:
        term.print_json(document)
        return 0
    term.print_table(RENDERERS[what](document))
    if document["truncated"]:
        term.note(f"showing {len(document[what]):,} of {count(document['total'], what[:-1])}; raise --limit to see more")
    return 0


def _table() -> Table:
    return Table(box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True, show_edge=False)


def _titled(doc: dict, what: str, table: Table) -> Group:
    """The title on a line of its own: a narrow table would wrap it."""
    return Group(Text(f"Group {doc['group']}: {count(doc['total'], what[:-1])} on the {doc['node']} ({doc['address']})",
                      style="italic"), table)


def clients_table(doc: dict) -> Group:
    table = _table()
    table.add_column("Client ID", min_width=CLIENT_ID_MIN_WIDTH, overflow="fold")
    table.add_column("User", overflow="fold")
    table.add_column("Peer", overflow="fold")
    table.add_column("MQTT", no_wrap=True)
    for name in ("Keep-alive", "Online", "In flight", "Queued"):
        table.add_column(name, justify="right", no_wrap=True)
    for c in doc["clients"]:
        table.add_row(c["client_id"], c["username"] or Text(NOT_APPLICABLE, "dim"),
                      c["peer"] + (" (TLS)" if c["tls"] else ""), c["protocol"], f"{c['keep_alive_s']} s",
                      age(int(c["connected_s"] * 1000)), f"{c['inflight_out']} out, {c['inflight_in']} in",
                      f"{c['queued']:,}")
    return _titled(doc, "clients", table)


def sessions_table(doc: dict) -> Group:
    table = _table()
    table.add_column("Client ID", min_width=CLIENT_ID_MIN_WIDTH, overflow="fold")
    for name in ("State", "MQTT"):
        table.add_column(name, no_wrap=True)
    for name in ("Expiry", "Subscriptions", "Queued", "In flight", "Queued bytes"):
        table.add_column(name, justify="right", no_wrap=True)
    for s in doc["sessions"]:
        state = Text("online", "green") if s["connected"] else Text("offline", "yellow")
        expiry = "never" if s["expiry_s"] is None else f"{s['expiry_s']} s"
        table.add_row(s["client_id"], state, s["protocol"], expiry, str(s["subscriptions"]), f"{s['queued']:,}",
                      str(s["inflight"]), size(s["queued_bytes"]))
    return _titled(doc, "sessions", table)


def subscriptions_table(doc: dict) -> Group:
    table = _table()
    table.add_column("Client ID", min_width=CLIENT_ID_MIN_WIDTH, overflow="fold")
    table.add_column("Filter", min_width=CLIENT_ID_MIN_WIDTH, overflow="fold")
    table.add_column("QoS", justify="right", no_wrap=True)
    table.add_column("Options", no_wrap=True)
    for s in doc["subscriptions"]:
        options = [name for flag, name in ((s["no_local"], "no-local"), (s["retain_as_published"], "retain-as-published"))
                   if flag]
        if s["retain_handling"]:
            options.append(f"retain-handling {s['retain_handling']}")
        if s["subscription_id"]:
            options.append(f"id {s['subscription_id']}")
        table.add_row(s["client_id"], s["filter"], str(s["qos"]), ", ".join(options) or NOT_APPLICABLE)
    return _titled(doc, "subscriptions", table)


RENDERERS = {"clients": clients_table, "sessions": sessions_table, "subscriptions": subscriptions_table}


# --- events ---------------------------------------------------------------------------------------


def events_tail(term: Terminal, config: GroupConfig, role: Role, *, as_json: bool, since: float | None,
                limit: int) -> int:
    query = {"limit": limit} | ({"since": since} if since is not None else {})
    url = f"{api.base_url(config, role)}/api/v1/events?{urllib.parse.urlencode(query)}"
    try:
        answer = api.get_json(url, token=api.token(config))
    except api.NodeUnreachable as exc:
        raise PairMQError(f"cannot reach the {role.value} node at {api.base_url(config, role)}: {exc}") from None
    except api.ApiError as exc:
        raise PairMQError(f"the {role.value} node refused: {exc}") from None
    if as_json:
        term.print_json({"schema": 1, "group": config.name, "node": role.value, "events": answer["events"],
                         "complete": answer["complete"]})
        return 0
    for event in answer["events"]:
        term.print_text(event_line(event))
    return 0


def event_line(event: dict) -> str:
    """One event as `ts node event key=value ...` (the fields every record has first)."""
    import time

    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(event["ts"])) + f".{int(event['ts'] * 1000) % 1000:03d}"
    rest = " ".join(f"{k}={v}" for k, v in event.items() if k not in ("v", "ts", "mono_ms", "node", "event"))
    return f"{stamp} {event.get('node', '?')} {event.get('event', '?')} {rest}".rstrip()

"""The summary as Rich tables: pure functions of the view model (summary.py), tested on exact output.

A report with no rows prints no table: the overview says what it would have held (no failover, nothing
refused), and tables that only list problems are left out.
"""

from __future__ import annotations

import datetime

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

OUTCOME_WORDS = {"delivered": "delivered at once", "queued": "queued", "no_subscriber": "no subscriber",
                 "refused": "refused"}


def _table(title: str, columns: list[str], rows: list[list]) -> Table:
    table = Table(title=title, box=box.SIMPLE, title_justify="left")
    for c in columns:
        table.add_column(c, justify="left" if c in ("topic", "client", "node", "from", "to", "what", "cause",
                                                    "reason", "stage", "event", "value", "outcome") else "right")
    for r in rows:
        table.add_row(*["" if v is None else str(v) for v in r])
    return table


def _when(ts: float | None) -> str:
    if ts is None:
        return "-"
    return datetime.datetime.fromtimestamp(ts, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _plural(n: int, one: str, many: str | None = None) -> str:
    return f"{n:,} {one if n == 1 else many or one + 's'}"


def _published(m: dict) -> list[list]:
    rows = [["messages published", f"{m['published']:,} ({m['bytes']:,} bytes stored)"]]
    by = m.get("by_outcome") or {}
    if m.get("outcomes_logged"):
        rows.append(["outcomes", ", ".join(f"{by.get(o, 0):,} {w}" for o, w in OUTCOME_WORDS.items())])
    rows.append(["per node", ", ".join(f"{n} {c:,}" for n, c in sorted(m["published_per_node"].items()))])
    return rows


def _late_sentence(late: dict) -> str:
    """Why the `replicated_late` latency rows are long, in one sentence."""
    words = (f"Late replication: {_plural(late['messages'], 'message was', 'messages were')} stored while the "
             f"standby was out of sync and replicated only when it caught up")
    if late["max_ms"] is not None:
        words += f" (up to {late['max_ms']:,} ms later)"
    words += "; the replicated_late rows, apart from live replication"
    if late["periods"]:
        still = f", {late['still_down']} not over" if late["still_down"] else ""
        words += f". Out of sync {_plural(late['periods'], 'time')} ({late['down_ms']:,} ms in all{still})"
    return words + "."


def render(view: dict, top_n: int = 10) -> Group:
    p, m = view["period"], view["messages"]
    incidents, handovers = view["incidents"], view.get("handovers", [])
    planned_ms = sum(h["unavailable_ms"] for h in handovers)
    down = f"{p['unavailable_ms']} ms unavailable"
    if handovers:
        down += f", {planned_ms} ms of it in planned handovers"
    overview = _table("Overview", ["what", "value"], [
        ["period", f"{_when(p['start'])} → {_when(p['end'])} ({p['period_s'] or 0:,.0f} s)"],
        ["availability", f"{p['availability'] * 100:.3f} % ({down})"],
        ["failovers", f"{_plural(len(incidents), 'failover')}, {_plural(len(handovers), 'planned handover')}"],
        *_published(m),
        ["malformed lines", f"{view['malformed_lines']:,}"],
        ["segments", f"{view['inputs']['segments_ingested_now']} ingested now, "
                     f"{view['inputs']['segments_from_table']} from the table, "
                     f"{view['inputs']['active_segments']} active"],
    ])
    parts: list = [overview]
    if incidents:
        parts.append(_table("Failover incidents", ["epoch", "from", "to", "cause", "detection ms", "takeover ms",
                                                   "unavailable ms", "in flight"],
                            [[i["epoch"], i["from_node"], i["to_node"], i["cause"], i["detection_ms"],
                              i["takeover_ms"], i["unavailable_ms"], i["in_flight"]] for i in incidents]))
    if handovers:
        parts.append(_table("Planned handovers", ["epoch", "from", "to", "handover ms", "takeover ms",
                                                  "unavailable ms", "in flight"],
                            [[h["epoch"], h["from_node"], h["to_node"], h["detection_ms"], h["takeover_ms"],
                              h["unavailable_ms"], h["in_flight"]] for h in handovers]))
    if view["latency"]:
        parts.append(_table("Latency (ms)", ["topic", "stage", "messages", "p50", "p90", "p99", "max"],
                            [[r["topic"], r["stage"], r["messages"], r["p50_ms"], r["p90_ms"], r["p99_ms"],
                              r["max_ms"]] for r in view["latency"][:top_n * 2]]))
    late = view.get("late_replication")
    if late:
        parts.append(Text(_late_sentence(late) + "\n"))
    if any(r["outcome"] == "refused" for r in view.get("publish_outcomes", [])):
        refused = [r for r in view["publish_outcomes"] if r["outcome"] == "refused"]
        parts.append(_table("Refused publishes", ["node", "topic", "qos", "messages"],
                            [[r["node"], r["topic"], r["qos"], r["messages"]] for r in refused[:top_n]]))
    if view["top_topics"]:
        parts.append(_table("Top topics (stored)", ["topic", "messages", "bytes"],
                            [[r["topic"], r["messages"], r["bytes"]] for r in view["top_topics"]]))
    if view["top_clients"]:
        parts.append(_table("Top clients (stored)", ["client", "messages", "bytes"],
                            [[r["client"], r["messages"], r["bytes"]] for r in view["top_clients"]]))
    problems = [r for r in view["delivery_problems"] if r["messages"]]
    if problems:
        parts.append(_table("Redeliveries, expiries, drops", ["what", "reason", "messages"],
                            [[r["what"], r["reason"], r["messages"]] for r in problems]))
    if view["overload_episodes"]:
        parts.append(_table("Overload episodes", ["node", "start", "end", "busy refusals", "loop lags",
                                                  "max lag ms"],
                            [[r["node"], _when(r["start"]), _when(r["end"]), r["busy_refusals"], r["loop_lags"],
                              r["max_lag_ms"]] for r in view["overload_episodes"]]))
    if view["unlogged"]:
        parts.append(_table("Not logged (sampling, lost)", ["node", "what", "events"],
                            [[r["node"], r["what"], r["events"]] for r in view["unlogged"]]))
    return Group(*parts)

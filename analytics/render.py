"""The summary as Rich tables: pure functions of the view model (summary.py), tested on exact output."""

from __future__ import annotations

import datetime

from rich import box
from rich.console import Group
from rich.table import Table


def _table(title: str, columns: list[str], rows: list[list]) -> Table:
    table = Table(title=title, box=box.SIMPLE, title_justify="left")
    for c in columns:
        table.add_column(c, justify="left" if c in ("topic", "client", "node", "from", "to", "what", "cause",
                                                    "reason", "stage", "event", "value") else "right")
    for r in rows:
        table.add_row(*["" if v is None else str(v) for v in r])
    return table


def _when(ts: float | None) -> str:
    if ts is None:
        return "-"
    return datetime.datetime.fromtimestamp(ts, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def render(view: dict, top_n: int = 10) -> Group:
    p, m = view["period"], view["messages"]
    overview = _table("Overview", ["what", "value"], [
        ["period", f"{_when(p['start'])} → {_when(p['end'])} ({p['period_s'] or 0:,.0f} s)"],
        ["availability", f"{p['availability'] * 100:.3f} % ({p['unavailable_ms']} ms unavailable)"],
        ["messages published", f"{m['published']:,} ({m['bytes']:,} bytes)"],
        ["per node", ", ".join(f"{n} {c:,}" for n, c in sorted(m["published_per_node"].items()))],
        ["malformed lines", f"{view['malformed_lines']:,}"],
        ["segments", f"{view['inputs']['segments_ingested_now']} ingested now, "
                     f"{view['inputs']['segments_from_table']} from the table, "
                     f"{view['inputs']['active_segments']} active"],
    ])
    parts = [overview]
    parts.append(_table("Failover incidents", ["epoch", "from", "to", "cause", "detection ms", "takeover ms",
                                               "unavailable ms", "in flight"],
                        [[i["epoch"], i["from_node"], i["to_node"], i["cause"], i["detection_ms"], i["takeover_ms"],
                          i["unavailable_ms"], i["in_flight"]] for i in view["incidents"]]))
    parts.append(_table("Latency (ms)", ["topic", "stage", "messages", "p50", "p90", "p99", "max"],
                        [[r["topic"], r["stage"], r["messages"], r["p50_ms"], r["p90_ms"], r["p99_ms"], r["max_ms"]]
                         for r in view["latency"][:top_n * 2]]))
    parts.append(_table("Top topics", ["topic", "messages", "bytes"],
                        [[r["topic"], r["messages"], r["bytes"]] for r in view["top_topics"]]))
    parts.append(_table("Top clients", ["client", "messages", "bytes"],
                        [[r["client"], r["messages"], r["bytes"]] for r in view["top_clients"]]))
    parts.append(_table("Redeliveries, expiries, drops", ["what", "reason", "messages"],
                        [[r["what"], r["reason"], r["messages"]] for r in view["delivery_problems"]]))
    parts.append(_table("Overload episodes", ["node", "start", "end", "busy refusals", "loop lags", "max lag ms"],
                        [[r["node"], _when(r["start"]), _when(r["end"]), r["busy_refusals"], r["loop_lags"], r["max_lag_ms"]]
                         for r in view["overload_episodes"]]))
    if view["unlogged"]:
        parts.append(_table("Not logged (sampling, lost)", ["node", "what", "events"],
                            [[r["node"], r["what"], r["events"]] for r in view["unlogged"]]))
    return Group(*parts)

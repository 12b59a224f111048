"""Renderers: pure functions from view models (plain dicts, as the API and
`--json` carry them) to Rich renderables. No I/O, no clock: ages come in the
view model (`ms_ago`), so a renderer's output depends on its argument alone.
"""

from __future__ import annotations

from rich import box
from rich.table import Table
from rich.text import Text

ACTIVITY_STYLES = {
    "Local Active": "bold green",
    "Mate Active": "cyan",
    "Standby": "yellow",
    "Monitor": "blue",
}
NOT_APPLICABLE = "-"
UNKNOWN = "?"  # a resync size not known yet (a snapshot still being built)


def count(n: int, singular: str, plural: str | None = None) -> str:
    """`1 client`, `2 clients`, `1,000 entries` (give `plural` when it is not singular + s)."""
    return f"{n:,} {singular if n == 1 else plural or singular + 's'}"


def age(ms: int | None) -> str:
    """A short human age: 0.4 s, 12 s, 3 min, 5 h, 2 d."""
    if ms is None or ms < 0:
        return NOT_APPLICABLE
    if ms < 10_000:
        return f"{ms / 1000:.1f} s"
    if ms < 120_000:
        return f"{ms // 1000} s"
    if ms < 2 * 3_600_000:
        return f"{ms // 60_000} min"
    if ms < 2 * 86_400_000:
        return f"{ms // 3_600_000} h"
    return f"{ms // 86_400_000} d"


def redundancy_table(nodes: list[dict], *, title: str | None = None) -> Table:
    """One row per node: a node's redundancy view, or an unreachable entry
    (`{"role", "address", "reachable": false, "error"}`)."""
    table = Table(title=title, box=box.SIMPLE_HEAD, title_justify="left", pad_edge=False, collapse_padding=True,
                  show_edge=False)
    table.add_column("Role", no_wrap=True)
    table.add_column("Address", no_wrap=True)
    table.add_column("Activity", no_wrap=True)
    table.add_column("Epoch", justify="right", no_wrap=True)
    table.add_column("Peers seen")
    table.add_column("Redundancy", no_wrap=True)
    table.add_column("In sync", no_wrap=True)
    table.add_column("Last decision")
    for node in nodes:
        if not node.get("reachable", True):
            table.add_row(node["role"], node.get("address") or NOT_APPLICABLE, Text("unreachable", "bold red"),
                          NOT_APPLICABLE, NOT_APPLICABLE, NOT_APPLICABLE, NOT_APPLICABLE,
                          Text(node.get("error") or "", "red"))
            continue
        table.add_row(node["role"], node["address"], _activity(node), str(node["epoch"]), _peers_seen(node),
                      _redundancy(node), _in_sync(node), _last_decision(node["role"], node.get("last_decision")))
    return table


def resync_table(nodes: list[dict]) -> Table | None:
    """A standby's catch-up on the mate link (the view's `resync`), or None if no node reports one."""
    rows = [n for n in nodes if n.get("reachable", True) and n.get("resync")]
    if not rows:
        return None
    table = Table(box=box.SIMPLE_HEAD, title="Resync", title_justify="left", pad_edge=False, collapse_padding=True,
                  show_edge=False)
    for name in ("Role", "Kind", "State"):
        table.add_column(name, no_wrap=True)
    for name in ("Ops done", "Ops to go", "Bytes done", "Bytes to go", "Rate", "Elapsed", "ETA"):
        table.add_column(name, justify="right", no_wrap=True)
    for node in rows:
        r = node["resync"]
        running = r["state"] == "running"
        table.add_row(node["role"], r["kind"], Text(r["state"], "yellow" if running else "green"),
                      f"{r['ops_done']:,}", UNKNOWN if r["ops_to_go"] is None else f"{r['ops_to_go']:,}",
                      size(r["bytes_done"]), UNKNOWN if r["bytes_to_go"] is None else size(r["bytes_to_go"]),
                      f"{r['ops_per_s']:,.0f} ops/s, {size(r['bytes_per_s'])}/s", age(r["elapsed_ms"]),
                      (UNKNOWN if r["eta_ms"] is None else age(r["eta_ms"])) if running else NOT_APPLICABLE)
    return table


def size(n: float) -> str:
    """Bytes, short: 512 B, 1.5 KiB, 12.0 MiB, 1.1 GiB."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def process_table(processes: list[dict]) -> Table:
    """The local group's processes: `{"role", "pid", "running", "log"}` each."""
    table = Table(box=box.SIMPLE_HEAD, title="Processes", title_justify="left", pad_edge=False,
                  collapse_padding=True, show_edge=False)
    table.add_column("Role", no_wrap=True)
    table.add_column("PID", justify="right", no_wrap=True)
    table.add_column("Process", no_wrap=True)
    table.add_column("Log")
    for proc in processes:
        state = Text("running", "green") if proc["running"] else Text("not running", "red")
        pid = NOT_APPLICABLE if proc["pid"] is None else str(proc["pid"])
        table.add_row(proc["role"], pid, state, proc["log"])
    return table


def _activity(node: dict) -> Text:
    label = node["activity"]
    return Text(label, ACTIVITY_STYLES.get(label, ""))


def _peers_seen(node: dict) -> Text:
    seen = [peer["role"] for peer in node.get("peers", []) if peer.get("seen")]
    return Text(", ".join(seen)) if seen else Text("none", "red")


def _redundancy(node: dict) -> Text:
    status = node["redundancy_status"]
    return Text(status, "green" if status == "Up" else "red")


def _in_sync(node: dict) -> Text:
    if node.get("role") == "monitor":
        return Text(NOT_APPLICABLE)
    return Text("yes", "green") if node.get("in_sync") else Text("no", "red")


def _last_decision(role: str, decision: dict | None) -> Text:
    if not decision:
        return Text(NOT_APPLICABLE)
    reason = decision["reason"]
    # Reasons start with the deciding node's role, which the row already shows.
    reason = reason.removeprefix(f"{role}: ")
    return Text.assemble(reason, (f" ({age(decision.get('ms_ago'))} ago)", "dim"))


def vip_table(nodes: list[dict]) -> Table | None:
    """Who holds the virtual IP (the view's `vip`, docs/operations.md), or None without a [vip] table."""
    rows = [n for n in nodes if n.get("reachable", True) and n.get("vip")]
    if not rows:
        return None
    table = Table(box=box.SIMPLE_HEAD, title=f"Virtual IP {rows[0]['vip']['address']}", title_justify="left",
                  pad_edge=False, collapse_padding=True, show_edge=False)
    for name in ("Role", "Interface", "Held"):
        table.add_column(name, no_wrap=True)
    table.add_column("Gratuitous ARPs", justify="right", no_wrap=True)
    table.add_column("Error")
    for node in rows:
        vip = node["vip"]
        table.add_row(node["role"], vip["interface"], Text("yes", "bold green") if vip["held"] else Text("no"),
                      f"{vip['announcements']:,}", Text(vip["error"], "red") if vip["error"] else NOT_APPLICABLE)
    return table

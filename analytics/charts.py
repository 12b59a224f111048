"""PNG charts of a summary (matplotlib, no display): message rate with failover markers, latency
percentiles, availability timeline. Pure functions of the view model plus an output directory."""

from __future__ import annotations

import datetime
from pathlib import Path


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _time(iso: str | float) -> datetime.datetime:
    if isinstance(iso, (int, float)):
        return datetime.datetime.fromtimestamp(iso, datetime.timezone.utc)
    return datetime.datetime.fromisoformat(iso)


def write_charts(view: dict, directory: Path) -> list[Path]:
    plt = _plt()
    directory.mkdir(parents=True, exist_ok=True)
    paths = []

    fig, ax = plt.subplots(figsize=(10, 4))
    per_node: dict[str, dict] = {}
    for r in view["rates_per_minute"]:
        per_node.setdefault(r["node"], {}).setdefault(r["minute"], 0)
        per_node[r["node"]][r["minute"]] += r["messages"]
    for node, series in sorted(per_node.items()):
        xs = sorted(series)
        ax.plot([_time(x) for x in xs], [series[x] / 60 for x in xs], marker="o", label=node)
    for i in view["incidents"]:
        ax.axvline(_time(i["takeover"]), color="red", linestyle="--")
        ax.annotate(f"failover → {i['to_node']}", (_time(i["takeover"]), 0), rotation=90, fontsize=8, color="red")
    for h in view.get("handovers", []):
        ax.axvline(_time(h["takeover"]), color="tab:blue", linestyle=":")
        ax.annotate(f"handover → {h['to_node']}", (_time(h["takeover"]), 0), rotation=90, fontsize=8,
                    color="tab:blue")
    ax.set(title="Messages stored per second (minute means); failovers dashed, planned handovers dotted",
           ylabel="msg/s")
    if per_node:
        ax.legend()
    paths.append(_save(plt, fig, directory / "message_rate.png"))

    fig, ax = plt.subplots(figsize=(10, 4))
    rows = view["latency"][:20]
    labels = [f"{r['topic']} ({r['stage']})" for r in rows]
    for key, colour in (("p50_ms", "tab:green"), ("p90_ms", "tab:orange"), ("p99_ms", "tab:red"), ("max_ms", "k")):
        # A log scale has no zero: a latency under a millisecond is drawn at 0.5 ms.
        ys = [float("nan") if r[key] is None else max(r[key], 0.5) for r in rows]
        ax.scatter(range(len(rows)), ys, label=key[:-3], color=colour)
    ax.set_xticks(range(len(rows)), labels, rotation=30, ha="right", fontsize=7)
    ax.set_yscale("log")
    title = "Latency percentiles per topic (log scale)"
    late = view.get("late_replication")
    if late:
        title += "\nreplicated_late: stored while the standby was out of sync, replicated when it caught up"
    ax.set(title=title, ylabel="ms")
    if rows:
        ax.legend()
    paths.append(_save(plt, fig, directory / "latency.png"))

    fig, ax = plt.subplots(figsize=(10, 2.5))
    p = view["period"]
    if p["start"] is not None:
        ax.axvspan(_time(p["start"]), _time(p["end"]), color="tab:green", alpha=0.4, label="available")
        for i in view["incidents"]:
            ax.axvspan(_time(i["last_seen_old"]), _time(i["takeover"]), color="tab:red", alpha=0.9)
        for h in view.get("handovers", []):
            ax.axvspan(_time(h["last_seen_old"]), _time(h["takeover"]), color="tab:blue", alpha=0.9)
    ax.set_yticks([])
    ax.set(title=f"Availability {p['availability'] * 100:.3f} % (red: failover, blue: planned handover)")
    paths.append(_save(plt, fig, directory / "availability.png"))
    return paths


def _save(plt, fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path

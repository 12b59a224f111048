"""`pairmq analytics summarize`: load the logs, run the transforms, write the tables, return the view model.

The view model is plain JSON-able data (what `--json` prints and what the
Rich table and the charts render). With `--out DIR`, DIR gets:
  tables/events/      the ingested closed segments (Parquet, by day and node)
  tables/state/<n>/   the partial aggregates of every ingested row (analytics/partials.py)
  tables/_batches/    which segments those are, and their batch n
  reports/<name>/     each report as Parquet
  summary.json        the view model
  charts/*.png        message rate with failover markers, latency percentiles, availability
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import datetime
import json
import time

from pyspark.sql import DataFrame

from . import driver, driver_merge, ingest, partials
from .spark import settings
from . import transforms as t

OUTCOMES = ("delivered", "queued", "no_subscriber", "refused")  # appliance/broker/outcomes.py

REPORT_VERSION = 1


def summarize(spark, roots: list[str], out: str | None = None, top_n: int = 10,
              max_rows: int = driver.MAX_ROWS, window=None, progress=ingest._quiet) -> dict:
    """The view model. The state is merged and the reports are computed on the driver when the partials they read
    have at most `max_rows` rows in all (0: never), by Spark's jobs otherwise: the same rows either way. `window`
    and `progress` as ingest.load."""
    started = time.monotonic()
    loaded = ingest.load(spark, roots, out, max_rows, window, progress)
    progress("computing the reports")
    # Without --out nothing is stored: the reports read every row parsed, for which generated code pays.
    with _interpreted(spark) if out is not None else contextlib.nullcontext():
        view = _report(spark, loaded, roots, out, top_n, max_rows, started)
    if window is not None:
        view["inputs"]["window"] = window.describe()
    return view


def _interpreted(spark):
    """Evaluate expressions without generating code. The reports' inputs are the state's small tables, so a summary
    runs small jobs whose time would go into compiling the code Spark generates for each, more than into running
    them. Ingest, the big scan, runs before with the session's setting (and so do the reports of a run without
    --out, which read every row)."""
    return settings(spark, {"spark.sql.codegen.wholeStage": "false",
                                   "spark.sql.codegen.factoryMode": "NO_CODEGEN"})


def _report(spark, loaded: ingest.Loaded, roots: list[str], out: str | None, top_n: int, max_rows: int,
            started: float) -> dict:
    p = loaded.partials
    if loaded.state is not None:  # merged on the driver: its tables are what driver.collect would read
        collected = driver_merge.collected(loaded.state, driver.SMALL_EVENTS)
    else:
        collected = driver.collect(p, max_rows) if max_rows > 0 else None
    if collected is not None:  # small: the final merge on the driver (driver.py says why)
        raw = driver.reports(collected, driver.topic_names(collected), top_n)
        avail = _plain(driver.availability(collected["counts"], raw["incidents"]))
    else:
        raw, avail = _spark_reports(spark, p, top_n)
    rows = {name: [_plain(r) for r in got] for name, got in raw.items()}
    total_bytes = sum(r["bytes"] or 0 for r in rows["rates_per_minute"])  # every published message is in one minute
    per_node = {}
    for r in rows["event_counts"]:
        per_node.setdefault(r["node"], {})[r["event"]] = r["events"]
    stored_per_node = {n: c.get("message_published", 0) for n, c in per_node.items()}
    outcomes = _outcomes(rows["publish_outcomes"])
    # Logs from before the outcome counts name only the stored messages: those are then what was published.
    accepted = outcomes["accepted_per_node"]
    published_per_node = ({n: accepted.get(n, 0) for n in {*per_node, *accepted}} if outcomes["counted"]
                          else stored_per_node)
    view = {
        "report": REPORT_VERSION,
        "inputs": {"roots": roots, "segments_ingested_now": loaded.ingested_now,
                   "segments_from_table": loaded.ingested_before, "active_segments": loaded.active},
        "period": avail,
        "events_per_node": per_node,
        "malformed_lines": sum(c.get("malformed", 0) for c in per_node.values()),
        "messages": {"published": sum(published_per_node.values()), "published_per_node": published_per_node,
                     "stored": sum(stored_per_node.values()), "by_outcome": outcomes["by_outcome"],
                     "by_qos": outcomes["by_qos"], "outcomes_logged": outcomes["counted"], "bytes": total_bytes},
        # Failures and planned handovers apart: a handover is not an incident (transforms.incidents).
        "incidents": [r for r in rows["incidents"] if r["cause"] != t.PLANNED],
        "handovers": [r for r in rows["incidents"] if r["cause"] == t.PLANNED],
        "late_replication": late_replication(rows["latency"], rows["redundancy_down"]),
        **{name: rows[name] for name in ("stages", "latency", "top_topics", "top_clients", "delivery_problems",
                                         "overload_episodes", "unlogged", "rates_per_minute", "publish_outcomes",
                                         "redundancy_down")},
    }
    view["elapsed_s"] = round(time.monotonic() - started, 3)
    if out is not None:
        for name, got in raw.items():
            driver.write_report(name, got, ingest.qualified(spark, f"{out}/reports/{name}"))
    return view


def _spark_reports(spark, p: partials.Partials, top_n: int) -> tuple[dict[str, list[dict]], dict]:
    """Every report by the Spark transforms, and the availability: for a state too large to collect
    (driver.MAX_ROWS)."""
    # Every report reads partials; those several reports read are cached.
    cached = {k: getattr(p, k).cache() for k in ("traffic", "messages", "small")}
    p = dataclasses.replace(p, **cached)
    reports = _spark_report_frames(spark, p, top_n)
    collected = collect_all(reports)
    incident_rows = spark.createDataFrame(collected["incidents"], reports["incidents"].schema)
    avail = _plain(t.availability(partials.span(p.counts), incident_rows).collect()[0].asDict())
    for df in cached.values():
        df.unpersist()
    return {name: [r.asDict() for r in got] for name, got in collected.items()}, avail


def _spark_report_frames(spark, p: partials.Partials, top_n: int) -> dict[str, DataFrame]:
    stage_rows = p.stage_totals.unionByName(p.messages.select("node", *partials.STAGE_NAMES))
    hist = p.latency.unionByName(partials.latency_histogram(p.messages))
    return {
        "event_counts": t.event_counts(p.counts),
        "rates_per_minute": t.rates_per_minute(p.traffic),
        "stages": t.stage_counts(stage_rows),
        "latency": t.latency_percentiles(t.latencies(hist, _topic_names(spark, p.traffic))),
        "incidents": t.incidents(p.small, p.pulses, p.messages),
        "top_topics": t.top_topics(p.traffic, top_n),
        "top_clients": t.top_clients(p.traffic, top_n),
        "delivery_problems": t.delivery_problems(p.small, p.redelivered),
        "overload_episodes": p.small.transform(t.overload_episodes),
        "unlogged": p.small.transform(t.unlogged),
        "publish_outcomes": p.small.transform(t.publish_outcomes),
        "redundancy_down": p.small.transform(t.redundancy_down),
    }


def collect_all(frames: dict[str, DataFrame], threads: int = 4) -> dict[str, list]:
    """Every frame's rows, several Spark jobs at once: each small job spends much of its time in the driver
    (planning, code generation), which a second job's tasks can use the cores during."""
    with concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="report") as pool:
        futures = {name: pool.submit(df.collect) for name, df in frames.items()}
        return {name: f.result() for name, f in futures.items()}


def _topic_names(spark, traffic: DataFrame) -> DataFrame:
    """The published topics and their hashes (partials.per_message), checked: two topics with one hash would merge
    their latencies (odds about n² / 2⁶⁵ for n topics), so the job refuses rather than report that."""
    names = partials.topic_names(traffic)
    got = names.collect()
    if len({r["topic_hash"] for r in got}) != len(got):
        raise ingest.AnalyticsError(driver.SAME_HASH)
    return spark.createDataFrame(got, names.schema)


def late_replication(latency: list[dict], down: list[dict]) -> dict | None:
    """Why some messages were replicated long after they were stored: the standby was out of sync (the
    `replicated_late` latency rows, and the `redundancy_down` periods). None when it never was."""
    late = [r for r in latency if r["stage"] == "replicated_late"]
    if not late and not down:
        return None
    return {"messages": sum(r["messages"] or 0 for r in late),
            "max_ms": max((r["max_ms"] for r in late if r["max_ms"] is not None), default=None),
            "periods": len(down), "down_ms": sum(r["down_ms"] or 0 for r in down),
            "still_down": sum(r["end"] is None for r in down)}


def _outcomes(rows: list[dict]) -> dict:
    """The publish_outcomes report summed: accepted (every outcome but refused) per node, and totals by outcome and
    by QoS. `counted`: whether the logs hold outcome counts at all."""
    per_node: dict[str, int] = {}
    by_outcome = {o: 0 for o in OUTCOMES}
    by_qos: dict[str, dict[str, int]] = {}
    for r in rows:
        n = r["messages"] or 0
        by_outcome[r["outcome"]] = by_outcome.get(r["outcome"], 0) + n
        qos = by_qos.setdefault(str(r["qos"]), {})
        qos[r["outcome"]] = qos.get(r["outcome"], 0) + n
        if r["outcome"] != "refused":
            per_node[r["node"]] = per_node.get(r["node"], 0) + n
    return {"counted": bool(rows), "accepted_per_node": per_node, "by_outcome": by_outcome, "by_qos": by_qos}


def write_json(view: dict, path) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(view, f, indent=2, sort_keys=True)


def _plain(row: dict) -> dict:
    out = {}
    for k, v in row.items():
        if isinstance(v, datetime.datetime):
            v = v.replace(tzinfo=datetime.timezone.utc).isoformat() if v.tzinfo is None else v.isoformat()
        elif isinstance(v, float):
            v = round(v, 6)
        out[k] = v
    return out


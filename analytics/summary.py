"""`pairmq analytics summarize`: load the logs, run the transforms, write the tables, return the view model.

The view model is plain JSON-able data (what `--json` prints and what the
Rich table and the charts render). With `--out DIR`, DIR gets:
  tables/events/      the ingested closed segments (Parquet, by day and node)
  tables/_ingested/   which segments those are
  reports/<name>/     each report as Parquet
  summary.json        the view model
  charts/*.png        message rate with failover markers, latency percentiles, availability
"""

from __future__ import annotations

import datetime
import json
import time

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from . import ingest
from . import transforms as t

REPORT_VERSION = 1


def summarize(spark, roots: list[str], out: str | None = None, top_n: int = 10) -> dict:
    started = time.monotonic()
    loaded = ingest.load(spark, roots, out)
    all_rows = loaded.events
    counts_df = all_rows.transform(t.event_counts).cache()
    # Parquet is read by column, so the events are not cached whole; the two narrow tables most reports use are.
    events = all_rows.transform(t.valid)
    pub = events.transform(t.published).cache()
    stage_rows = events.transform(t.stages).cache()
    reports: dict[str, DataFrame] = {
        "event_counts": counts_df,
        "rates_per_minute": pub.transform(t.rates_per_minute),
        "stages": stage_rows.transform(t.stage_counts),
        "latency": t.latency_percentiles(t.latencies(pub, stage_rows)),
        "incidents": events.transform(t.incidents),
        "top_topics": t.top_topics(pub, top_n),
        "top_clients": t.top_clients(pub, top_n),
        "delivery_problems": t.delivery_problems(events, stage_rows),
        "overload_episodes": events.transform(t.overload_episodes),
        "unlogged": events.transform(t.unlogged),
    }
    collected = {name: df.collect() for name, df in reports.items()}
    rows = {name: [_plain(r.asDict()) for r in got] for name, got in collected.items()}
    incident_rows = spark.createDataFrame(collected["incidents"], reports["incidents"].schema)
    avail = _plain(t.availability(events, incident_rows).collect()[0].asDict())
    total_bytes = pub.agg(F.coalesce(F.sum("bytes"), F.lit(0)).alias("b")).collect()[0]["b"]
    per_node = {}
    for r in rows["event_counts"]:
        per_node.setdefault(r["node"], {})[r["event"]] = r["events"]
    published_per_node = {n: c.get("message_published", 0) for n, c in per_node.items()}
    view = {
        "report": REPORT_VERSION,
        "inputs": {"roots": roots, "segments_ingested_now": loaded.ingested_now,
                   "segments_from_table": loaded.ingested_before, "active_segments": loaded.active},
        "period": avail,
        "events_per_node": per_node,
        "malformed_lines": sum(c.get("malformed", 0) for c in per_node.values()),
        "messages": {"published": sum(published_per_node.values()), "published_per_node": published_per_node,
                     "bytes": total_bytes},
        **{name: rows[name] for name in ("stages", "incidents", "latency", "top_topics", "top_clients", "delivery_problems",
                                         "overload_episodes", "unlogged", "rates_per_minute")},
    }
    view["elapsed_s"] = round(time.monotonic() - started, 3)
    if out is not None:
        for name, df in reports.items():  # from the collected rows: the reports are small, their inputs are not
            spark.createDataFrame(collected[name], df.schema).coalesce(1).write.mode("overwrite") \
                .parquet(f"{out}/reports/{name}")
    for df in (counts_df, pub, stage_rows):
        df.unpersist()
    return view


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


"""The reports from the collected state, on the driver: the final merge of small partials in plain Python.

Rules:
- transforms.py defines every report; each function here computes the same
  rows (same values, types and order) from the partials' rows as dicts. A
  test runs both on the same inline frames and compares them.
- Used only when the partials the reports read are small: `collect` reads
  them in one Spark job, cut at `max_rows` + 1 rows in all, and returns None
  if there are more (open messages pile up when acknowledgements go missing;
  the traffic and pulses grow with the period covered): the summary then
  runs the Spark transforms. The heavy part, reducing events to partials,
  is Spark's either way (ingest.py).
- A report that starts reading another event of `small` adds it to
  SMALL_EVENTS (the comparison test fails until then if its fixture has it).
- Why: the state of a re-run is a few thousand rows, and a cold JVM spends
  seconds warming up for each kind of Spark job it has not run yet; a dozen
  report jobs cost far more than the data (docs/benchmarks.md).
- Spark's semantics, kept by hand: ascending sorts put nulls first, the
  descending one last; a sum or max of nothing is null; `round` is half-up
  on the double's shortest decimal form (Scala's BigDecimal(Double)); a
  double cast to long truncates.
"""

from __future__ import annotations

import datetime
import decimal
import functools
import math
import re

import pyarrow as pa
from pyspark.sql import functions as F
from pyspark.sql import types as T

from . import driver_merge, partials
from .ingest import AnalyticsError, arrow_schema
from .partials import LATENCY_STAGES, STAGE_NAMES, Partials
from .spark import settings
from .transforms import CAUGHT_UP, DOWN, OVERLOAD_GAP_S, PLANNED, SERVER_BUSY, SILENCE

MAX_ROWS = 100_000  # of all the partials the reports read: above it, the reports stay in Spark
# What the reports read of a Partials (not the per-delivery keys: their total is `redelivered`), and of its `small`
# rows (not the node_alive pulses, most of them: `pulses` has what the incidents need of those).
READ = ("counts", "traffic", "messages", "stage_totals", "latency", "redelivered", "pulses", "small")
SMALL_EVENTS = ("redundancy_decision", "client_refused", "broker_loop_lag", "message_expired", "message_dropped",
                "message_events_unsampled", "events_lost", "publish_outcomes")

# Each report's columns, what transforms.py makes (a test checks the names and types): the Parquet files'.
SCHEMAS = {
    "event_counts": "node string, event string, events long",
    "rates_per_minute": "minute timestamp, node string, topic string, messages long, bytes long",
    "stages": "node string, stage string, messages long",
    "latency": "topic string, stage string, messages long, p50_ms long, p90_ms long, p99_ms long, max_ms long",
    "incidents": ("epoch long, from_node string, to_node string, cause string, last_seen_old double, "
                  "detected double, takeover double, detection_ms long, takeover_ms long, unavailable_ms long, "
                  "in_flight long"),
    "top_topics": "topic string, messages long, bytes long",
    "top_clients": "client string, messages long, bytes long",
    "delivery_problems": "what string, reason string, messages long",
    "overload_episodes": ("node string, start double, end double, busy_refusals long, loop_lags long, "
                          "max_lag_ms long"),
    "unlogged": "node string, what string, events long",
    "publish_outcomes": "node string, topic string, qos int, outcome string, messages long",
    "redundancy_down": "node string, start double, end double, down_ms long",
}


def collect(p: Partials, max_rows: int = MAX_ROWS) -> dict[str, list[dict]] | None:
    """Every partial the reports read, as dicts, from one Spark job: a union of each one's rows as a struct column
    of its own (the published topics with their xxhash64, partials.topic_names, beside the traffic). None if they
    have more than `max_rows` rows in all."""
    frames = {k: getattr(p, k) for k in READ}
    frames["traffic"] = frames["traffic"].withColumn("topic_hash", partials.topic_hash("topic"))
    frames["small"] = frames["small"].filter(F.col("event").isin(*SMALL_EVENTS))
    parts = [df.select(F.struct("*").alias(k)) for k, df in frames.items()]
    union = functools.reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), parts)
    # A limit is taken from one partition first, then from more, a job each: here every partition at once.
    with settings(p.counts.sparkSession, {"spark.sql.limit.initialNumPartitions": "1000000"}):
        got_rows = union.limit(max_rows + 1).collect()
    if len(got_rows) > max_rows:
        return None
    got: dict[str, list[dict]] = {k: [] for k in READ}
    for row in got_rows:
        for k in READ:
            if row[k] is not None:
                got[k].append(row[k].asDict(recursive=k == "small"))  # publish_outcomes' list of structs
                break
    return got


def topic_names(rows: dict[str, list[dict]]) -> dict[int, str]:
    """Each published topic by its xxhash64 (what the latency histograms key by); AnalyticsError if two topics
    have one hash (odds about n² / 2⁶⁵ for n topics): the latency report could not tell them apart."""
    published = [r for r in rows["traffic"] if r["topic"] is not None]
    names = {r["topic_hash"]: r["topic"] for r in published}
    if len(names) != len({r["topic"] for r in published}):
        raise AnalyticsError(SAME_HASH)
    return names


SAME_HASH = "two topics have the same xxhash64: the latency report cannot tell them apart"


def reports(rows: dict[str, list[dict]], names: dict[int, str], top_n: int) -> dict[str, list[dict]]:
    """Every report of transforms.py from `collect`'s rows; `names` maps each topic's xxhash64 to it."""
    messages, small, traffic = rows["messages"], rows["small"], rows["traffic"]
    stage_rows = rows["stage_totals"] + [{k: m[k] for k in ("node", *STAGE_NAMES)} for m in messages]
    hist = rows["latency"] + latency_histogram(messages)
    incident_rows = incidents(small, rows["pulses"], messages)
    return {
        "event_counts": event_counts(rows["counts"]),
        "rates_per_minute": rates_per_minute(traffic),
        "stages": stage_counts(stage_rows),
        "latency": latency_percentiles(latencies(hist, names)),
        "incidents": incident_rows,
        "top_topics": top(traffic, "topic", top_n),
        "top_clients": top(traffic, "client", top_n),
        "delivery_problems": delivery_problems(small, rows["redelivered"]),
        "overload_episodes": overload_episodes(small),
        "unlogged": unlogged(small),
        "publish_outcomes": publish_outcomes(small),
        "redundancy_down": redundancy_down(small),
    }


def _asc(*values):
    """A sort key: ascending, nulls first (Spark's default)."""
    return tuple((v is not None, v) for v in values)


def _sum(values):
    got = [v for v in values if v is not None]
    return sum(got) if got else None


def _max(values):
    got = [v for v in values if v is not None]
    return max(got) if got else None


def _min(values):
    got = [v for v in values if v is not None]
    return min(got) if got else None


def _round(x: float) -> float:
    """Spark's round(x) of a double: half-up on its shortest decimal form."""
    if math.isnan(x) or math.isinf(x):
        return x
    return float(decimal.Decimal(repr(x)).quantize(decimal.Decimal(1), rounding=decimal.ROUND_HALF_UP))


def _group(rows, key) -> dict:
    groups: dict = {}
    for r in rows:
        groups.setdefault(key(r), []).append(r)
    return groups


def event_counts(counts: list[dict]) -> list[dict]:
    return sorted(({"node": r["node"], "event": r["event"], "events": r["events"]} for r in counts),
                  key=lambda r: _asc(r["node"], r["event"]))


def rates_per_minute(traffic: list[dict]) -> list[dict]:
    out = [{"minute": m, "node": n, "topic": t, "messages": _sum(r["messages"] for r in g),
            "bytes": _sum(r["bytes"] for r in g)}
           for (m, n, t), g in _group(traffic, lambda r: (r["minute"], r["node"], r["topic"])).items()]
    return sorted(out, key=lambda r: _asc(r["minute"], r["node"], r["topic"]))


def stage_counts(rows: list[dict]) -> list[dict]:
    out = []
    for node, g in _group(rows, lambda r: r["node"]).items():
        for s in STAGE_NAMES:
            n = _sum(r[s] for r in g)
            if n is not None and n > 0:
                out.append({"node": node, "stage": s, "messages": n})
    return sorted(out, key=lambda r: _asc(r["node"], r["stage"]))


def latency_histogram(messages: list[dict]) -> list[dict]:
    """partials.latency_histogram of per_message rows."""
    counted: dict = {}
    for m in messages:
        if not (m["published"] > 0 and m["node"] is not None and m["epoch"] is not None
                and m["msg_id"] is not None):
            continue
        for s in LATENCY_STAGES:
            at = m[f"first_{s}"]
            if at is None:
                continue
            ms = None if m["created_ms"] is None else int(_round(at * 1000) - m["created_ms"])
            key = (m["topic_hash"], s, ms)
            counted[key] = counted.get(key, 0) + m["published"]
    return [{"topic_hash": h, "stage": s, "latency_ms": ms, "messages": n} for (h, s, ms), n in counted.items()]


def latencies(hist: list[dict], names: dict[int, str]) -> list[dict]:
    summed = _group(hist, lambda r: (r["topic_hash"], r["stage"], r["latency_ms"]))
    return [{"topic": names.get(h) if h is not None else None, "stage": s, "latency_ms": ms,
             "messages": _sum(r["messages"] for r in g)} for (h, s, ms), g in summed.items()]


def latency_percentiles(hist: list[dict]) -> list[dict]:
    """transforms.latency_percentiles: pN is the smallest latency whose running count reaches ceil(N% x count)."""
    out = []
    for (topic, stage), g in _group(hist, lambda r: (r["topic"], r["stage"])).items():
        g = sorted(g, key=lambda r: (r["latency_ms"] is None, r["latency_ms"] or 0))
        n = _sum(r["messages"] for r in g if r["latency_ms"] is not None)
        running, cum = [], 0
        for r in g:
            cum += r["messages"]
            running.append((r["latency_ms"], cum))

        def pick(q):
            if n is None:
                return None
            need = math.ceil(q * n)
            return _min(ms for ms, c in running if ms is not None and c >= need)

        out.append({"topic": topic, "stage": stage, "messages": _sum(r["messages"] for r in g),
                    "p50_ms": pick(0.5), "p90_ms": pick(0.9), "p99_ms": pick(0.99),
                    "max_ms": _max(r["latency_ms"] for r in g)})
    return sorted(out, key=lambda r: _asc(r["topic"], r["stage"]))


def incidents(small: list[dict], pulses: list[dict], messages: list[dict]) -> list[dict]:
    """transforms.incidents: one row per change of the active node."""
    decisions = [r for r in small if r["event"] == "redundancy_decision"]
    acts, before = [], None
    for a in sorted((r for r in decisions if r["kind"] == "activate"), key=lambda r: _asc(r["ts"], r["node"])):
        if before is not None:
            acts.append({"to_node": a["node"], "epoch": a["epoch"], "takeover": a["ts"], "from_node": before["node"],
                         "from_epoch": before["epoch"], "since": before["ts"] if before["ts"] is not None else 0.0})
        before = a
    acts = [a for a in acts if a["from_node"] is not None]
    # What the old active left open in its epoch (transforms._in_flight, summed per node and epoch first).
    open_per_epoch: dict = {}
    for m in messages:
        if m["published"] > 0 and m["acknowledged"] == 0 and m["node"] is not None and m["epoch"] is not None:
            key = (m["node"], m["epoch"])
            open_per_epoch[key] = open_per_epoch.get(key, 0) + m["published"]
    by_epoch = _group(acts, lambda a: a["epoch"])

    def per_epoch(epoch, value):
        """An aggregate over the incidents of one epoch, as the Spark joins group them (none for a null epoch)."""
        return None if epoch is None else value(by_epoch[epoch])

    def kind_between(a, kind, node):
        return [d["ts"] for d in decisions if d["kind"] == kind and d["node"] == node
                and d["ts"] <= a["takeover"] and d["ts"] > a["since"]]

    def last_of(kind):
        return lambda g: _max(t for i in g for t in kind_between(i, kind, i["from_node"]))

    out = []
    for a in acts:
        e = a["epoch"]
        bids = per_epoch(e, lambda g: [d for i in g for d in decisions if d["kind"] == "bid"
                                        and d["node"] == i["to_node"] and i["since"] < d["ts"] <= i["takeover"]])
        detected = _max(d["ts"] for d in bids or [])
        # Spark's max_by: the reason of the latest bid
        bid_reason = next((d["reason"] for d in bids or [] if d["ts"] == detected), None)
        pulse_old = per_epoch(e, lambda g: _max(p["ts"] for i in g for p in pulses
                                                if p["node"] == i["from_node"] and p["ts"] <= i["takeover"]))
        stepped, handover_at, aborted_at = (per_epoch(e, last_of(k)) for k in ("step_down", "handover",
                                                                                "handover_aborted"))
        flight = per_epoch(e, lambda g: _sum(open_per_epoch.get((i["from_node"], i["from_epoch"])) for i in g))
        detected = a["takeover"] if detected is None else detected
        planned = (handover_at is not None and stepped is not None and stepped >= handover_at
                   and (aborted_at is None or aborted_at < handover_at))
        if planned:
            seen = handover_at
        else:
            silence = re.match(SILENCE, bid_reason) if bid_reason is not None else None
            heard = (detected - float(silence.group(2)) if silence is not None and silence.group(1) == a["from_node"]
                     else None)
            latest = _max([pulse_old, heard])
            seen = min(detected if latest is None else latest, detected)
        detection, takeover = _ms(seen, detected), _ms(detected, a["takeover"])
        out.append({"epoch": e, "from_node": a["from_node"], "to_node": a["to_node"],
                    "cause": PLANNED if planned else "step_down" if stepped is not None else "lost",
                    "last_seen_old": seen, "detected": detected, "takeover": a["takeover"],
                    "detection_ms": detection, "takeover_ms": takeover, "unavailable_ms": detection + takeover,
                    "in_flight": flight or 0})
    return sorted(out, key=lambda r: _asc(r["takeover"]))


def _ms(a: float, b: float) -> int:
    return int(max(0.0, _round((b - a) * 1000)))


def availability(counts: list[dict], incident_rows: list[dict]) -> dict:
    """transforms.availability of partials.span: start, end, period_s, unavailable_ms, availability."""
    start, end = _min(r["first_ts"] for r in counts), _max(r["last_ts"] for r in counts)
    down = _sum(r["unavailable_ms"] for r in incident_rows) or 0
    period = None if start is None or end is None else end - start
    share = max(0.0, 1 - down / 1000 / period) if period is not None and period > 0 else 1.0
    return {"start": start, "end": end, "period_s": period, "unavailable_ms": down, "availability": share}


def top(traffic: list[dict], key: str, n: int) -> list[dict]:
    """transforms.top_topics / top_clients: the n busiest `key`s by messages."""
    out = [{key: k, "messages": _sum(r["messages"] for r in g), "bytes": _sum(r["bytes"] for r in g)}
           for k, g in _group(traffic, lambda r: r[key]).items()]
    out.sort(key=lambda r: _asc(r[key]))
    out.sort(key=lambda r: (r["messages"] is None, -(r["messages"] or 0)))  # stable: ties stay by key
    return out[:n]


def delivery_problems(small: list[dict], redelivered: list[dict]) -> list[dict]:
    out = [{"what": "redelivered", "reason": "", "messages": _sum(r["extra"] for r in redelivered) or 0}]
    gone = _group((r for r in small if r["event"] in ("message_expired", "message_dropped")),
                  lambda r: (r["event"].removeprefix("message_"), r["reason"] if r["reason"] is not None else ""))
    out += [{"what": w, "reason": why, "messages": len(g)} for (w, why), g in gone.items()]
    return sorted(out, key=lambda r: _asc(r["what"], r["reason"]))


def overload_episodes(small: list[dict], gap_s: float = OVERLOAD_GAP_S) -> list[dict]:
    signals = [r for r in small if (r["event"] == "client_refused" and r["reason_code"] == SERVER_BUSY)
               or r["event"] == "broker_loop_lag"]
    out = []
    for node, g in _group(signals, lambda r: r["node"]).items():
        episodes: list[list[dict]] = []
        last = None
        for r in sorted(g, key=lambda r: _asc(r["ts"])):
            if last is None or r["ts"] - last > gap_s:
                episodes.append([])
            episodes[-1].append(r)
            last = r["ts"]
        for e in episodes:
            out.append({"node": node, "start": _min(r["ts"] for r in e), "end": _max(r["ts"] for r in e),
                        "busy_refusals": sum(r["event"] == "client_refused" for r in e),
                        "loop_lags": sum(r["event"] == "broker_loop_lag" for r in e),
                        "max_lag_ms": _max(r["max_ms"] for r in e)})
    return sorted(out, key=lambda r: _asc(r["node"], r["start"]))


def unlogged(small: list[dict]) -> list[dict]:
    pairs = [(r["node"], what, n) for r in small if r["event"] == "message_events_unsampled"
             for what, n in (r["counts"] or {}).items()]
    pairs += [(r["node"], "events_lost", r["count"]) for r in small if r["event"] == "events_lost"]
    out = [{"node": node, "what": what, "events": _sum(p[2] for p in g)}
           for (node, what), g in _group(pairs, lambda p: (p[0], p[1])).items()]
    return sorted(out, key=lambda r: _asc(r["node"], r["what"]))


def redundancy_down(small: list[dict]) -> list[dict]:
    sync = [r for r in small if r["event"] == "redundancy_decision" and r["kind"] == "sync" and r["reason"]]
    ups = [r for r in sync if CAUGHT_UP in r["reason"]]
    ends: dict = {}
    for d in (r for r in sync if DOWN in r["reason"]):
        end = _min(u["ts"] for u in ups if u["node"] == d["node"] and u["ts"] > d["ts"])
        key = (d["node"], end)
        ends[key] = d["ts"] if key not in ends else min(ends[key], d["ts"])
    out = [{"node": node, "start": start, "end": end,
            "down_ms": None if end is None else int(_round((end - start) * 1000))}
           for (node, end), start in ends.items()]
    return sorted(out, key=lambda r: _asc(r["node"], r["start"]))


def publish_outcomes(small: list[dict]) -> list[dict]:
    each = [(r["node"], o) for r in small if r["event"] == "publish_outcomes" for o in r["outcomes"] or []]
    out = [{"node": node, "topic": topic, "qos": qos, "outcome": outcome, "messages": _sum(o["messages"] for _, o in g)}
           for (node, topic, qos, outcome), g in _group(each, lambda p: (p[0], p[1]["topic"], p[1]["qos"],
                                                                         p[1]["outcome"])).items()]
    return sorted(out, key=lambda r: _asc(r["node"], r["topic"], r["qos"], r["outcome"]))


def write_report(name: str, rows: list[dict], where: str) -> None:
    """A report's rows as one Parquet file with its schema in `where` (a directory Hadoop qualified), replacing what
    was there: pyarrow on the driver, not a Spark job per report, which costs far more than its few rows."""
    schema = arrow_schema(T.DataType.fromDDL(SCHEMAS[name]))
    # As PySpark's Rows carry them: a naive timestamp is local time.
    local = [{k: v.astimezone(datetime.timezone.utc) if isinstance(v, datetime.datetime) else v
              for k, v in r.items()} for r in rows]
    driver_merge.write_dir(pa.Table.from_pylist(local, schema), where)

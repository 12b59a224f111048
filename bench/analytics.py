"""Analytics benchmark: the Spark job against an equivalent DuckDB query on the same synthetic event logs.

    python bench/analytics.py [--events 5000000] [--dir /tmp/pairmq-analytics-bench] [--rounds 3] [--write-docs]

Theory of operation
-------------------
1. Writes `--events` synthetic events in the real log format (docs/events.md,
   the lines appliance/eventlog.py writes) as closed segments of 64 MiB for a
   primary, a backup and a monitor: QoS 1 traffic on 50 topics from 20
   publishers to 5 subscribers at 5,000 msg/s, the batched stage events the
   broker writes (spooled, replicated, delivered, acknowledged: one line per
   eight messages each), a node_alive pulse per node per second, a kill of the
   primary half way (detected 1.2 s later, the backup takes over 50 ms after),
   a few busy refusals and ten malformed lines.
2. Spark floor: a process that starts Spark, parses every line with the
   explicit schema and drops the rows (what a summary cannot go below with
   Spark's own JSON reader; the job parses with pyarrow in its tasks,
   segment_task.py, and may). Then Spark, first summary: `pairmq analytics
   summarize DIR --out OUT --json` as a process, timed whole (JVM start,
   parsing, ingest into Parquet, reports).
3. DuckDB, same files: one process reading the JSON Lines with the explicit
   columns and computing the same heavy reports (messages and bytes per
   minute per node and topic, stage counts, publish→deliver/replicated
   percentiles per topic, top topics and clients, redeliveries). Incidents and
   overload episodes are a few rows either way and are left out of it.
4. Spark re-run over the ingested segments: the same command again; its
   `elapsed_s` (the job after the SparkSession exists, i.e. without JVM start)
   is compared with DuckDB's query time over the same Parquet table.
Steps 2-4 and DuckDB's are repeated `--rounds` times (3), the two sides
alternated, and the report shows each measure's median and every round's
ratios: a single run's ratio moved by 30% with the shared machine's load.
Goals: first summary ≤ 4× DuckDB; re-run ≤ 2× DuckDB's query time.

Small logs (`--small`): the time an operator waits for a first summary of a
few MB (goal ≤ 15 s, whole process, on Spark) and for a re-run, at two sizes
(~0.4 MB and ~9 MB), `--rounds` times each, medians, with the load average
before and after; and once with no class-data archive yet (an empty cache:
the first run on a host, analytics/spark.py). With `--peer-python`, the same
command by another install (e.g. the main branch's venv) alternated with
this one, for a ratio measured under the same load.
    python bench/analytics.py --small [--rounds 3] [--peer-python OTHER/.venv/bin/python] [--write-docs]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.harness.synthetic_logs import BATCH, generate  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
DOC_BEGIN, DOC_END = "<!-- analytics:begin -->", "<!-- analytics:end -->"
SMALL_BEGIN, SMALL_END = "<!-- analytics-small:begin -->", "<!-- analytics-small:end -->"
SMALL_SIZES = (4_000, 50_000)  # events: ~0.4 MB and ~9 MB of JSON Lines
GOAL_SMALL_S = 15.0
GOAL_FIRST, GOAL_RERUN = 4.0, 2.0


DUCK_REPORTS = """
CREATE TEMP VIEW ev AS SELECT * FROM {source};
CREATE TEMP TABLE pub AS SELECT node, epoch, msg_id, topic, bytes, client, ts, created_ms
  FROM ev WHERE event = 'message_published';
CREATE TEMP TABLE st AS SELECT node, epoch, unnest(msg_ids) AS msg_id, replace(event, 'message_', '') AS stage,
  client, ts FROM ev WHERE event IN ('message_spooled','message_replicated','message_delivered','message_acknowledged');
SELECT floor(ts / 60) * 60 AS minute, node, topic, count(*), sum(bytes) FROM pub GROUP BY ALL ORDER BY ALL;
SELECT node, stage, count(*) FROM st GROUP BY ALL ORDER BY ALL;
SELECT topic, f.stage, count(*), quantile_cont(round(f.at * 1000) - created_ms, [0.5, 0.9, 0.99]),
  max(round(f.at * 1000) - created_ms)
  FROM pub JOIN (SELECT node, epoch, msg_id, stage, min(ts) AS at FROM st WHERE stage IN ('delivered','replicated')
                 GROUP BY ALL) f USING (node, epoch, msg_id) GROUP BY ALL ORDER BY ALL;
SELECT topic, count(*) AS n, sum(bytes) FROM pub GROUP BY topic ORDER BY n DESC, topic LIMIT 10;
SELECT client, count(*) AS n, sum(bytes) FROM pub GROUP BY client ORDER BY n DESC, client LIMIT 10;
SELECT sum(c - 1) FROM (SELECT client, msg_id, count(*) AS c FROM st WHERE stage = 'delivered' GROUP BY ALL);
SELECT node, event, count(*) FROM ev GROUP BY ALL ORDER BY ALL;
"""
JSON_COLUMNS = ("{v: 'INTEGER', ts: 'DOUBLE', node: 'VARCHAR', event: 'VARCHAR', epoch: 'BIGINT', "
                "msg_id: 'BIGINT', msg_ids: 'BIGINT[]', topic: 'VARCHAR', bytes: 'BIGINT', client: 'VARCHAR', "
                "created_ms: 'BIGINT'}")


def duckdb_run(source: str) -> tuple[float, float, dict]:
    """(whole process seconds, query seconds, published per node) in a fresh process: like the Spark CLI."""
    code = f"""
import duckdb, json, time
t0 = time.monotonic()
con = duckdb.connect()
con.execute("SET enable_progress_bar = false")
results = [con.execute(q).fetchall() for q in {DUCK_REPORTS!r}.format(source={source!r}).split(';') if q.strip()]
per_node = dict(con.execute("SELECT node, count(*) FROM pub GROUP BY node").fetchall())
print(json.dumps({{"query_s": time.monotonic() - t0, "published": per_node}}))
"""
    started = time.monotonic()
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    whole = time.monotonic() - started
    if run.returncode:
        raise SystemExit(f"duckdb failed: {run.stderr[-2000:]}")
    out = json.loads(run.stdout.strip().splitlines()[-1])
    return whole, out["query_s"], out["published"]


FLOOR = """
import sys
from pairmq.analytics import schema, spark
s = spark.session()
s.read.schema(schema.RAW).option("mode", "PERMISSIVE").option("columnNameOfCorruptRecord", schema.CORRUPT) \\
    .json(sys.argv[1]).write.format("noop").mode("overwrite").save()
s.stop()
"""


def spark_floor(logs: Path) -> float:
    """The whole process of the least a Spark job from JSON Lines does: start, parse every line into every column
    of the explicit schema (the job's session and options) and drop the rows (the `noop` sink: a count() would skip
    parsing). What the first summary cannot go below with Spark's reader."""
    started = time.monotonic()
    run = subprocess.run([sys.executable, "-c", FLOOR, str(logs / "*" / "events" / "*.jsonl")], cwd=REPO,
                         capture_output=True, text=True)
    if run.returncode:
        raise SystemExit(f"spark floor failed: {run.stderr[-3000:]}")
    return time.monotonic() - started


def spark_run(logs: Path, out: Path, python: str = sys.executable, env: dict | None = None) -> tuple[float, dict]:
    started = time.monotonic()
    run = subprocess.run([python, "-m", "pairmq.cli.main", "analytics", "summarize", str(logs), "--out", str(out),
                          "--json"], cwd=REPO, capture_output=True, text=True, env=env)
    whole = time.monotonic() - started
    if run.returncode:
        raise SystemExit(f"spark job failed: {run.stderr[-3000:]}")
    return whole, json.loads(run.stdout)


class _Entry:
    def __init__(self, seq: int) -> None:
        self.seq = seq


def logging_cost(messages: int = 200_000) -> dict:
    """CPU per message of per-message event logging, every thread of this process (time.process_time): the ops
    the broker hands its writer for a QoS 1 message to one subscriber, in batches of BATCH, through
    MessageEvents into a real EventLog (writer thread included). Steadier than throughput on a shared machine."""
    import concurrent.futures
    import tempfile

    from pairmq.appliance.broker.message_events import MessageEvents
    from pairmq.appliance.eventlog import EventLog, EventSettings
    from pairmq.appliance.spool import ops

    with tempfile.TemporaryDirectory() as tmp:
        log = EventLog(Path(tmp), "primary", EventSettings(queue_max_events=10_000_000))
        events = MessageEvents(log, 1.0, acked_seq=lambda: 1 << 62)
        payload = b"x" * 100
        cpu0, wall0 = time.process_time(), time.monotonic()
        for first in range(1, messages + 1, BATCH):
            ids = tuple(range(first, first + BATCH))
            commit = concurrent.futures.Future()
            events.submitted([op for i in ids for op in (
                ops.MessageStored(i, "bench/q1", payload, 1, False, b"", 0, "pub", 0),
                ops.MessageQueued("sub", i, 1, False))], 1, commit)
            commit.set_result([_Entry(first)])
            events.submitted([ops.MessagesInflight("sub", ids, ids)], 1, concurrent.futures.Future())
            events.submitted([ops.MessagesAcked("sub", ids)], 1, concurrent.futures.Future())
        log.close()
        cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
    return {"messages": messages, "events": log.written, "lost": log.lost,
            "cpu_us_per_message": round(cpu / messages * 1e6, 2), "wall_s": round(wall, 2)}


def _generated(directory: Path, events: int) -> dict:
    """What generate() wrote into an earlier run's --dir, refused if that run asked for another --events."""
    try:
        got = json.loads((directory / "generated.json").read_text())
    except (OSError, ValueError) as e:
        raise SystemExit(f"--reuse-logs {directory}: no generated.json from an earlier run ({e})")
    if got.pop("requested") != events:
        raise SystemExit(f"--reuse-logs {directory}: generated for another --events, not {events}")
    return got


def small(directory: Path, rounds: int, peer: str | None) -> dict:
    """First summary and re-run of small logs, whole processes (see the module's docstring)."""
    import tempfile

    r = {"load_before": os.getloadavg()[0], "sizes": []}
    pythons = {"this": sys.executable, **({"peer": peer} if peer else {})}
    for events in SMALL_SIZES:
        logs = directory / f"logs-{events}"
        generate(logs, events)
        size = sum(p.stat().st_size for p in logs.rglob("*.jsonl"))
        got = {name: {"first": [], "rerun": []} for name in pythons}
        for k in range(rounds):
            for name, python in pythons.items():  # alternated: a slow minute hits both
                out = directory / f"out-{events}-{name}-{k}"
                got[name]["first"].append(spark_run(logs, out, python)[0])
                got[name]["rerun"].append(spark_run(logs, out, python)[0])
        with tempfile.TemporaryDirectory() as cache:  # no class-data archive: a host's first run
            cold = spark_run(logs, directory / f"out-{events}-cold", env={**os.environ, "XDG_CACHE_HOME": cache})[0]
        r["sizes"].append({"events": events, "bytes": size, "cold_first_s": cold, **{
            f"{name}_{what}_s": statistics.median(v) for name, runs in got.items() for what, v in runs.items()},
            "rounds": got})
    r["load_after"] = os.getloadavg()[0]
    return r


def small_report(r: dict, peer: bool) -> str:
    rows = []
    for x in r["sizes"]:
        ok = "**met**" if x["this_first_s"] <= GOAL_SMALL_S else "**not met**"
        peer_cells = (f" | {x['peer_first_s']:.1f} s | {x['peer_rerun_s']:.1f} s" if peer else "")
        rows.append(f"| {x['events']:,} events, {x['bytes'] / 1e6:.2f} MB | {x['this_first_s']:.1f} s "
                    f"| {x['this_rerun_s']:.1f} s | {x['cold_first_s']:.1f} s{peer_cells} | ≤ 15 s: {ok} |")
    head = "| logs | first summary | re-run | first, no class archive yet |"
    head += " before: first | before: re-run |" if peer else ""
    return "\n".join([
        "## Analytics: a small log set (whole process)",
        "",
        f"`python bench/analytics.py --small --rounds {len(r['sizes'][0]['rounds']['this']['first'])}"
        f"{' --peer-python …' if peer else ''} --write-docs` ({os.cpu_count()} CPUs shared with other work; load "
        f"{r['load_before']:.1f} before, {r['load_after']:.1f} after). `pairmq analytics summarize LOGS --out DIR "
        "--json` as a process; medians of the rounds." + (" \"before\": the same command by the peer install, "
                                                         "alternated with this one." if peer else ""),
        "",
        head + " goal |",
        "|---" * (head.count("|") - 1) + "|---|",
        *rows,
    ])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=5_000_000)
    ap.add_argument("--dir", type=Path, default=Path("/tmp/pairmq-analytics-bench"))
    ap.add_argument("--write-docs", action="store_true")
    ap.add_argument("--rounds", type=int, default=3,
                    help="measure every row this many times, the two sides alternated; the table shows medians")
    ap.add_argument("--reuse-logs", type=Path, metavar="DIR",
                    help="read the synthetic logs of an earlier run's --dir (same --events) instead of generating "
                         "them again: they are the same files every time (fixed seed); --dir gets only the output")
    ap.add_argument("--small", action="store_true", help="time a first summary and a re-run of small logs")
    ap.add_argument("--peer-python", metavar="PYTHON", help="with --small: also time this interpreter's pairmq")
    args = ap.parse_args(argv)
    if not 1 <= args.rounds <= 20:
        ap.error(f"--rounds must be from 1 to 20, not {args.rounds}")
    if args.small:
        subprocess.run(["rm", "-rf", str(args.dir)], check=True)
        r = small(args.dir, args.rounds, args.peer_python)
        print(json.dumps(r, indent=2))
        text = small_report(r, bool(args.peer_python))
        print(text)
        if args.write_docs:
            write_section(SMALL_BEGIN, SMALL_END, text)
        return 0
    if args.reuse_logs is not None and args.reuse_logs.resolve() == args.dir.resolve():
        ap.error("--reuse-logs must be another directory than --dir (--dir is emptied first)")
    logs, out = args.dir / "logs", args.dir / "out"
    subprocess.run(["rm", "-rf", str(args.dir)], check=True)
    load_before = os.getloadavg()[0]
    t = time.monotonic()
    if args.reuse_logs is not None:
        logs, expected = args.reuse_logs / "logs", _generated(args.reuse_logs, args.events)
    else:
        expected = generate(logs, args.events)
        (args.dir / "generated.json").write_text(json.dumps({"requested": args.events, **expected}))
    size = sum(p.stat().st_size for p in logs.rglob("*.jsonl"))
    print(f"generated {expected['events']:,} events ({size / 1e6:,.0f} MB) in {time.monotonic() - t:.1f} s",
          file=sys.stderr)
    json_glob = str(logs / "*" / "events" / "*.jsonl")
    rounds = []
    for k in range(args.rounds):  # alternated, so that a slow minute of the shared machine hits both sides
        out = args.dir / f"out{k}"
        duck_json_whole, duck_json_query, duck_pub = duckdb_run(
            f"read_json('{json_glob}', format='newline_delimited', columns={JSON_COLUMNS}, ignore_errors=true)")
        spark_floor_s = spark_floor(logs)
        spark_first, view = spark_run(logs, out)
        spark_rerun, view2 = spark_run(logs, out)
        parquet_glob = str(out / "tables" / "events" / "**" / "*.parquet")
        duck_pq_whole, duck_pq_query, _ = duckdb_run(f"read_parquet('{parquet_glob}', hive_partitioning=true)")
        checks = {
            "spark published per node": view["messages"]["published_per_node"],
            "duckdb published per node": duck_pub, "generated": expected["published"],
            "malformed lines": view["malformed_lines"], "incidents": len(view["incidents"]),
            "re-run ingested now": view2["inputs"]["segments_ingested_now"],
        }
        rounds.append({"spark_floor_s": spark_floor_s, "spark_first_s": spark_first, "duck_json_s": duck_json_whole,
                       "duck_json_query_s": duck_json_query, "spark_rerun_s": spark_rerun,
                       "spark_rerun_job_s": view2["elapsed_s"], "duck_parquet_s": duck_pq_whole,
                       "duck_parquet_query_s": duck_pq_query, "checks": checks,
                       "first_ratio": spark_first / duck_json_whole,
                       "rerun_ratio": view2["elapsed_s"] / duck_pq_query})
        print(f"round {k + 1}: first {spark_first:.1f} s vs {duck_json_whole:.1f} s = "
              f"{rounds[-1]['first_ratio']:.2f}x, re-run job {view2['elapsed_s']:.1f} s vs {duck_pq_query:.1f} s",
              file=sys.stderr)
    if any(x["checks"] != rounds[0]["checks"] for x in rounds):
        raise SystemExit(f"the rounds disagree: {[x['checks'] for x in rounds]}")
    median = lambda key: statistics.median(x[key] for x in rounds)  # noqa: E731
    r = {"events": expected["events"], "json_mb": round(size / 1e6), "load_before": load_before,
         "rounds": rounds, "checks": rounds[0]["checks"],
         **{key: median(key) for key in ("spark_floor_s", "spark_first_s", "duck_json_s", "duck_json_query_s",
                                         "spark_rerun_s", "spark_rerun_job_s", "duck_parquet_s",
                                         "duck_parquet_query_s")}}
    r["first_ratio"] = r["spark_first_s"] / r["duck_json_s"]
    r["floor_ratio"] = r["spark_floor_s"] / r["duck_json_s"]
    r["load_after"] = os.getloadavg()[0]
    r["rerun_ratio"] = r["spark_rerun_job_s"] / r["duck_parquet_query_s"]
    print(json.dumps(r, indent=2))
    text = report(r, args.events)
    print(text)
    if args.write_docs:
        write_section(DOC_BEGIN, DOC_END, text)
    return 0


def write_section(begin: str, end: str, text: str) -> None:
    doc = REPO / "docs" / "benchmarks.md"
    body = doc.read_text()
    section = f"{begin}\n{text}\n{end}"
    if begin in body:
        body = re.sub(re.escape(begin) + ".*?" + re.escape(end), lambda _: section, body, flags=re.S)
    else:
        body = body.rstrip() + "\n\n" + section + "\n"
    doc.write_text(body)


def report(r: dict, events: int) -> str:
    met = lambda ok: "**met**" if ok else "**not met**"  # noqa: E731
    return "\n".join([
        "## Analytics: Spark job vs DuckDB",
        "",
        f"`python bench/analytics.py --events {events} --rounds {len(r['rounds'])} --write-docs` ({os.cpu_count()} "
        f"CPUs shared with other work; load {r['load_before']:.1f} before, {r['load_after']:.1f} after). "
        f"{r['events']:,} synthetic events, {r['json_mb']:,} MB of JSON Lines in 64 MiB segments. Each row was "
        f"measured {len(r['rounds'])} times, Spark and DuckDB alternated; the table shows the medians.",
        "",
        "| what | Spark (`pairmq analytics summarize`) | DuckDB | ratio | goal |",
        "|---|---|---|---|---|",
        f"| first summary from JSON Lines, whole process | {r['spark_first_s']:.1f} s | {r['duck_json_s']:.1f} s "
        f"| {r['first_ratio']:.1f}× | ≤ 4×: {met(r['first_ratio'] <= GOAL_FIRST)} |",
        f"| floor of Spark's own JSON reader: start Spark, parse with the schema, no output; whole process "
        f"| {r['spark_floor_s']:.1f} s "
        f"| {r['duck_json_s']:.1f} s | {r['floor_ratio']:.1f}× | |",
        f"| re-run over the ingested segments, whole process | {r['spark_rerun_s']:.1f} s | {r['duck_parquet_s']:.1f} s "
        f"| {r['spark_rerun_s'] / r['duck_parquet_s']:.1f}× | |",
        f"| re-run, job only (no JVM start) vs DuckDB's query on the same Parquet | {r['spark_rerun_job_s']:.1f} s "
        f"| {r['duck_parquet_query_s']:.1f} s | {r['rerun_ratio']:.1f}× | ≤ 2×: {met(r['rerun_ratio'] <= GOAL_RERUN)} |",
        "",
        "Each round: " + "; ".join(
            f"{k}. first summary {x['spark_first_s']:.1f} s / {x['duck_json_s']:.1f} s = {x['first_ratio']:.2f}×, "
            f"re-run job {x['spark_rerun_job_s']:.1f} s / {x['duck_parquet_query_s']:.1f} s = {x['rerun_ratio']:.2f}×"
            for k, x in enumerate(r["rounds"], 1)) + ".",
        "",
        f"Checks: {json.dumps(r['checks'])}",
    ])


if __name__ == "__main__":
    sys.exit(main())

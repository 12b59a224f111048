"""`pairmq analytics summarize LOGS... [--master URL] [--out DIR] [--json]`: the Spark job over event logs.

LOGS are directories or files, local or any Hadoop path (hdfs://, s3a://):
every events*.jsonl segment under them is read, from as many nodes as given.
The job runs in local mode (`local[2]`) unless --master names a cluster.
Without --out nothing is written and every segment is parsed; with it, closed
segments are ingested once into DIR/tables and the reports, summary.json and
PNG charts land in DIR. The table goes to stdout (or JSON with --json);
progress notes go to stderr.
"""

from __future__ import annotations

import concurrent.futures
from pathlib import Path

from .options import examples
from .terminal import Terminal


def add_parsers(commands) -> None:
    analytics = commands.add_parser(
        "analytics", help="Spark reports over the nodes' event logs",
        description="Traffic, latencies, failover incidents and availability from the nodes' event logs.",
        epilog=examples("pairmq analytics summarize local/data --out /tmp/report",
                        "pairmq analytics summarize hdfs:///pairmq/logs --master spark://head:7077 --json"))
    verbs = analytics.add_subparsers(dest="verb", metavar="VERB", parser_class=type(analytics))
    analytics.set_defaults(handler=lambda args, term: _help(analytics, term))
    p = verbs.add_parser("summarize", help="summarize event logs",
                         description=__doc__.split("\n\n", 1)[1],
                         epilog=examples("pairmq analytics summarize local/data",
                                         "pairmq analytics summarize /var/lib/pairmq --out /tmp/report --json"))
    p.add_argument("logs", nargs="+", metavar="LOGS", help="directories or files of event log segments")
    p.add_argument("--master", metavar="URL", help="Spark master URL (default: local[2], in this process)")
    p.add_argument("--out", metavar="DIR", help="ingest into and write the reports to DIR (local or Hadoop path)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--top", type=int, default=10, metavar="N", help="top N topics and clients (default 10)")
    p.set_defaults(handler=_cmd_summarize)


def _help(parser, term: Terminal) -> int:
    term.print_text(parser.format_help().rstrip())
    return 0


def _cmd_summarize(args, term: Terminal) -> int:
    from .extras import require

    require("analytics")
    from pairmq.analytics.ingest import AnalyticsError

    if not 1 <= args.top <= 1000:
        raise AnalyticsError(f"--top must be from 1 to 1000, not {args.top}")
    local = [Path(log) for log in args.logs if "://" not in log]
    for path in local:
        if not path.exists():
            raise AnalyticsError(f"no event logs at {path}: the path does not exist")
    if local and len(local) == len(args.logs) and not any(
            p.name.startswith("events") and p.suffix == ".jsonl" for path in local
            for p in ([path] if path.is_file() else path.rglob("events*.jsonl"))):
        raise AnalyticsError(f"no event log segments (events*.jsonl) under {', '.join(map(str, local))}")
    out = args.out
    if out is not None and "://" not in out:
        out = str(Path(out).resolve())
    from pairmq.analytics import render, spark, summary

    # Spark stops (its JVM, mostly waiting) while the charts are drawn (Python): the two overlap.
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="spark-stop") as stopping:
        with term.status("starting Spark") as status:
            session = spark.session(args.master)
            try:
                status.update(f"summarizing {len(args.logs)} event log location(s) with Spark "
                              f"({session.sparkContext.master})")
                view = summary.summarize(session, [_uri(log) for log in args.logs], out, top_n=args.top)
            finally:
                stopping.submit(session.stop)
        if out is not None and "://" not in out:
            summary.write_json(view, Path(out) / "summary.json")
            from pairmq.analytics.charts import write_charts

            charts = write_charts(view, Path(out) / "charts")
            term.note(f"wrote {out}/summary.json, {out}/reports/ and {len(charts)} charts in {out}/charts/")
    if args.json:
        term.print_json(view)
    else:
        term.print(render.render(view, args.top))
    return 0


def _uri(log: str) -> str:
    return log if "://" in log else Path(log).resolve().as_uri()

"""`pairmq analytics summarize LOGS... [--master URL] [--out DIR] [--since T] [--until T] [--json]`: the Spark job.

LOGS are directories or files, local or any Hadoop path (hdfs://, s3a://):
every events*.jsonl segment under them is read, from as many nodes as given.
The job runs on the master given by --master, else on the one Spark is
configured with (spark-submit, spark-defaults.conf, MASTER), else in local
mode (`local[2]`). Without --out nothing is written and every segment is
parsed; with it, closed segments are ingested once into DIR/tables and the
reports, summary.json and PNG charts land in DIR (local or Hadoop path).
--since/--until keep the events of a period (ISO 8601, or a time ago: 2h).
The table goes to stdout (or JSON with --json); the stages go to stderr
(nothing with --json); Spark's own output goes to a log file.
"""

from __future__ import annotations

import concurrent.futures
import importlib.util
import re
import tempfile
import time
from pathlib import Path

from .options import examples
from .terminal import Terminal

EXIT_SETUP = 2  # pyspark or Java missing: the host's setup, not the job, failed


def add_parsers(commands) -> None:
    analytics = commands.add_parser(
        "analytics", help="Spark reports over the nodes' event logs",
        description="Traffic, latencies, failover incidents and availability from the nodes' event logs.",
        epilog=examples("pairmq analytics summarize local/data --out /tmp/report",
                        "pairmq analytics summarize hdfs:///pairmq/logs --master spark://head:7077 --json",
                        "spark-submit --master spark://head:7077 $(pairmq analytics submit-file) summarize "
                        "hdfs:///pairmq/logs --out hdfs:///pairmq/report"))
    verbs = analytics.add_subparsers(dest="verb", metavar="VERB", parser_class=type(analytics))
    analytics.set_defaults(handler=lambda args, term: _help(analytics, term))
    p = verbs.add_parser("summarize", help="summarize event logs",
                         description=__doc__.split("\n\n", 1)[1],
                         epilog=examples("pairmq analytics summarize local/data",
                                         "pairmq analytics summarize /var/lib/pairmq --since 2h",
                                         "pairmq analytics summarize /var/lib/pairmq --out /tmp/report --json"))
    p.add_argument("logs", nargs="+", metavar="LOGS", help="directories or files of event log segments")
    p.add_argument("--master", metavar="URL",
                   help="Spark master URL (default: Spark's own configuration, else local[2] in this process)")
    p.add_argument("--out", metavar="DIR", help="ingest into and write the reports to DIR (local or Hadoop path)")
    p.add_argument("--since", metavar="TIME", help="only events at or after TIME (ISO 8601, or ago: 90s, 30m, 2h, 7d)")
    p.add_argument("--until", metavar="TIME", help="only events before TIME (ISO 8601, or ago: 90s, 30m, 2h, 7d)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--top", type=int, default=10, metavar="N", help="top N topics and clients (default 10)")
    p.set_defaults(handler=_cmd_summarize)
    s = verbs.add_parser("submit-file", help="print the application file for spark-submit",
                         description="The path of the job's application file, for spark-submit: every argument "
                                     "after it is `pairmq analytics`'s.",
                         epilog=examples("pairmq analytics submit-file",
                                         "spark-submit --master spark://head:7077 $(pairmq analytics submit-file) "
                                         "summarize hdfs:///pairmq/logs --out hdfs:///pairmq/report"))
    s.set_defaults(handler=_cmd_submit_file)


def _help(parser, term: Terminal) -> int:
    term.print_text(parser.format_help().rstrip())
    return 0


def _cmd_submit_file(args, term: Terminal) -> int:
    spec = importlib.util.find_spec("pairmq.cli.analytics_submit")
    term.print_text(str(Path(spec.origin).resolve()))
    return 0


def _cmd_summarize(args, term: Terminal) -> int:
    from .extras import require

    require("analytics")
    from pairmq.analytics import spark
    from pairmq.analytics.ingest import AnalyticsError
    from pairmq.analytics.window import WindowError, parse

    if not 1 <= args.top <= 1000:
        raise AnalyticsError(f"--top must be from 1 to 1000, not {args.top}")
    try:
        window = parse(args.since, args.until, time.time())
    except WindowError as exc:
        raise AnalyticsError(str(exc)) from None
    local = [Path(log) for log in args.logs if "://" not in log]
    for path in local:
        if not path.exists():
            raise AnalyticsError(f"no event logs at {path}: the path does not exist")
    found = [p for path in local for p in ([path] if path.is_file() else path.rglob("events*.jsonl"))
             if p.name.startswith("events") and p.suffix == ".jsonl"]
    if local and len(local) == len(args.logs) and not found:
        raise AnalyticsError(f"no event log segments (events*.jsonl) under {', '.join(map(str, local))}")
    try:
        spark.under_spark_submit() or spark.java()
    except spark.SparkSetupError as exc:
        term.error(str(exc))
        return EXIT_SETUP
    small = len(local) == len(args.logs) and sum(p.stat().st_size for p in found) <= spark.SMALL_BYTES
    out = args.out
    if out is not None and "://" not in out:
        out = str(Path(out).resolve())
    try:
        view = _run(args, term, out, window, small)
    except spark.SparkSetupError as exc:
        term.error(str(exc))
        return EXIT_SETUP
    except Exception as exc:  # Spark's (a JVM or task error): one sentence, the details in the kept log
        if not _from_spark(exc):
            raise
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        first = next((spark.exception_message(line) for line in lines if re.search(r"(Exception|Error): ", line)),
                     lines[0] if lines else type(exc).__name__)
        kept = f"; Spark's output is in {spark.log_path()}" if spark.log_path().exists() else ""
        term.error(f"the Spark job failed: {first[:300]}{kept}")
        return 1
    spark.log_path().unlink(missing_ok=True)
    if args.json:
        term.print_json(view)
    else:
        from pairmq.analytics import render

        term.print(render.render(view, args.top))
    return 0


def _run(args, term: Terminal, out: str | None, window, small: bool) -> dict:
    from pairmq.analytics import spark, summary

    started = time.monotonic()
    quiet = args.json

    def progress(stage: str) -> None:
        if not quiet:
            term.detail(f"{time.monotonic() - started:5.1f} s  {stage}")

    # Spark stops (its JVM, mostly waiting) while the charts are drawn (Python): the two overlap.
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="spark-stop") as stopping:
        if out is not None:  # matplotlib imported while the JVM starts, not after the job
            from pairmq.analytics.charts import _plt

            stopping.submit(_plt)
        progress("starting Spark")
        session = spark.session(args.master, small=small)
        try:
            progress(f"Spark on {session.sparkContext.master}")
            view = summary.summarize(session, [_uri(log) for log in args.logs], out, top_n=args.top, window=window,
                                     progress=progress)
            if out is not None and "://" in out:  # written here, then copied through Hadoop's FileSystem API
                progress("drawing the charts")
                with tempfile.TemporaryDirectory(prefix="pairmq-report-") as local:
                    charts = _write_files(view, Path(local))
                    _copy_out(session, Path(local), out)
        finally:
            stopping.submit(session.stop)
        if out is not None and "://" not in out:
            progress("drawing the charts")
            charts = _write_files(view, Path(out))
    if out is not None:
        progress(f"wrote {out}/summary.json, {out}/reports/ and {len(charts)} charts in {out}/charts/")
    return view


def _from_spark(exc: BaseException) -> bool:
    from py4j.protocol import Py4JError
    from pyspark.errors import PySparkException

    return isinstance(exc, (Py4JError, PySparkException))


def _write_files(view: dict, where: Path) -> list:
    from pairmq.analytics import summary
    from pairmq.analytics.charts import write_charts

    where.mkdir(parents=True, exist_ok=True)
    summary.write_json(view, where / "summary.json")
    return write_charts(view, where / "charts")


def _copy_out(session, local: Path, out: str) -> None:
    jvm = session._jvm
    dest = jvm.org.apache.hadoop.fs.Path(out)
    fs = dest.getFileSystem(session._jsc.hadoopConfiguration())
    for item in sorted(local.iterdir()):
        target = jvm.org.apache.hadoop.fs.Path(f"{out}/{item.name}")
        fs.delete(target, True)  # a previous run's charts: replaced, not nested inside
        fs.copyFromLocalFile(False, True, jvm.org.apache.hadoop.fs.Path(item.resolve().as_uri()), target)


def _uri(log: str) -> str:
    return log if "://" in log else Path(log).resolve().as_uri()

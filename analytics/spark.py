"""The SparkSession the job and the tests use.

Rules:
- The master: the one given (--master); else the one Spark is configured
  with (spark-submit's --master or conf, spark.master in spark-defaults.conf
  under $SPARK_CONF_DIR or $SPARK_HOME/conf, the MASTER environment
  variable); local[2] (this machine's two cores) only when none is set.
- Spark's own output (the JVM's stdout and stderr: log4j, py4j, the JVM's
  warnings, the Python workers' stderr) goes to a log file, never to the
  terminal, whose stdout may be the job's JSON. A failure names the file; a
  run that succeeded removes it.
  Under spark-submit the JVM is spark-submit's, and so is its output.
- Java is looked up before anything starts ($JAVA_HOME/bin/java, else on
  PATH): without it the job is one sentence, not a gateway traceback.
- A small input (`small`: the CLI's local logs, SMALL_BYTES of JSON at most)
  gets a JVM tuned to start, not to run long: client JIT only, the serial
  collector, no code generation. Most of a small summary is the JVM warming
  up; the same settings made 1 GB of logs much slower (docs/benchmarks.md).
- The JVM maps the classes it loads from a class-data archive (AppCDS) that
  its first run on the host writes at exit, under the user's cache directory
  (~/.cache/pairmq), one per Java and pyspark: loading and verifying Spark's
  classes is most of a JVM's start. The archive is written under a temporary
  name and taken by a later run once its header is there (the JVM writes the
  header last); the JVM ignores an archive that does not fit it.
- The Python workers fork from a daemon that has imported what every task
  imports (worker_daemon.py): paid once, not in each worker.
- The UI is off, shuffles use few partitions, the driver has 2 GiB (the job
  shares its host with a broker node; 8 GiB and the parallel collector were
  no faster), the time zone is UTC.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

from pairmq.appliance.errors import PairMQError

DEFAULT_MASTER = "local[2]"
SMALL_BYTES = 64 * 1024 * 1024
_LOG4J = Path(__file__).with_name("log4j2.properties")
# Client JIT, serial GC.
_SMALL_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
_DYNAMIC_ARCHIVE_MAGIC = 0xF00BABA8
_NO_CODEGEN = {"spark.sql.codegen.wholeStage": "false", "spark.sql.codegen.factoryMode": "NO_CODEGEN"}


class SparkSetupError(PairMQError):
    """Spark cannot start on this host (no Java, or the JVM exited): one sentence, exit 2."""


def log_path() -> Path:
    """Where the JVM's own output goes: one file per run (concurrent runs do not share one), which the CLI removes
    after a run that succeeded and names after one that failed."""
    return Path(tempfile.gettempdir()) / f"pairmq-analytics-{os.getuid()}-{os.getpid()}.log"


def java() -> str:
    """The java the JVM will be, or SparkSetupError."""
    home = os.environ.get("JAVA_HOME")
    found = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if not found or not os.access(found, os.X_OK):
        where = f"$JAVA_HOME/bin/java ({home})" if home else "java on PATH"
        raise SparkSetupError(f"pairmq analytics needs a Java runtime (17 or later) and found no {where}: "
                              "install one (e.g. apt install default-jre-headless)")
    return found


def under_spark_submit() -> bool:
    """True when spark-submit started this process (its JVM is already up, with its own master)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def configured_master(env: dict[str, str] | None = None) -> str | None:
    """The master Spark would take from its own configuration outside spark-submit: MASTER, then spark.master in
    spark-defaults.conf ($SPARK_CONF_DIR, else $SPARK_HOME/conf); None if neither sets one."""
    env = os.environ if env is None else env
    if env.get("MASTER"):
        return env["MASTER"]
    conf_dir = env.get("SPARK_CONF_DIR") or (env.get("SPARK_HOME") and str(Path(env["SPARK_HOME"]) / "conf"))
    if not conf_dir:
        return None
    try:
        lines = (Path(conf_dir) / "spark-defaults.conf").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.strip().split(None, 1)
        if len(parts) == 2 and parts[0] == "spark.master":
            return parts[1].strip()
    return None


def master_for(given: str | None) -> str | None:
    """The master to set on the builder: `given`; None to leave Spark's own; DEFAULT_MASTER when nothing sets one."""
    if given:
        return given
    if under_spark_submit() or configured_master() or "--master" in os.environ.get("PYSPARK_SUBMIT_ARGS", ""):
        return None
    return DEFAULT_MASTER


def session(master: str | None = None, app: str = "pairmq-analytics", shuffle_partitions: int = 4,
            small: bool = False):
    from pyspark import SparkConf, SparkContext
    from pyspark.sql import SparkSession

    # The tasks that parse segments (segment_task.py) run Python: this interpreter, with its packages, unless the
    # operator names another (a cluster's executors may have theirs elsewhere).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    java_options = f"-Dlog4j.configurationFile=file:{_LOG4J} -Dlog4j2.configurationFile=file:{_LOG4J}"
    settings_ = {
        "spark.app.name": app,
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": str(shuffle_partitions),
        "spark.sql.session.timeZone": "UTC",
        "spark.driver.memory": "2g",
        "spark.driver.extraJavaOptions": " ".join([java_options, *([_SMALL_JVM] if small else [])]),
        "spark.sql.adaptive.enabled": "true",
        # Ingest writes one file per (day, node) per task: a writer each instead of sorting the rows first.
        "spark.sql.maxConcurrentOutputFileWriters": "32",
        "spark.python.daemon.module": "pairmq.analytics.worker_daemon",
        **(_NO_CODEGEN if small else {}),
    }
    chosen = master_for(master)
    if chosen:
        settings_["spark.master"] = chosen
    if under_spark_submit() or SparkContext._active_spark_context is not None:
        builder = SparkSession.builder
        for k, v in settings_.items():
            builder = builder.config(k, v)
        spark = builder.getOrCreate()
    else:
        settings_["spark.driver.extraJavaOptions"] += " " + class_archive(java())
        conf = SparkConf(loadDefaults=False).setAll(list(settings_.items()))
        SparkContext(conf=conf, gateway=_quiet_gateway(conf))
        spark = SparkSession.builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def class_archive(java_path: str, cache: Path | None = None) -> str:
    """The JVM option that maps this host's class-data archive, or that writes it at exit when there is none yet."""
    import hashlib

    import pyspark

    cache = cache or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "pairmq"
    key = hashlib.sha256(f"{os.path.realpath(java_path)}|{pyspark.__version__}|{pyspark.__file__}".encode())
    final = cache / f"spark-classes-{key.hexdigest()[:16]}.jsa"
    # Unified logging off: the archive's own warnings (classes it skips) would fill the log.
    try:
        cache.mkdir(parents=True, exist_ok=True)
        for written in sorted(cache.glob(final.name + ".*.tmp")):
            if final.exists():  # a concurrent first run's, not needed: gone once it is old enough to be whole
                if time.time() - written.stat().st_mtime > 600:
                    written.unlink()
            elif _complete_archive(written):
                written.replace(final)
        if final.exists():
            return f"-XX:SharedArchiveFile={final} -Xlog:disable"
    except OSError:
        return "-Xlog:disable"  # no cache directory: no archive, nothing else changes
    return f"-XX:ArchiveClassesAtExit={final}.{os.getpid()}.tmp -Xlog:disable"


def _complete_archive(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError:
        return False
    return len(head) == 4 and int.from_bytes(head, "little") == _DYNAMIC_ARCHIVE_MAGIC


def _quiet_gateway(conf):
    """pyspark's gateway (the JVM) with its stdout and stderr in log_path()."""
    from pyspark.errors import PySparkRuntimeError
    from pyspark.java_gateway import launch_gateway

    log = log_path()
    with open(log, "wb") as out:
        try:
            return launch_gateway(conf, popen_kwargs={"stdout": out, "stderr": out})
        except PySparkRuntimeError as exc:
            raise SparkSetupError(f"Spark's JVM exited before it started ({last_error(log) or exc}); "
                                  f"its output is in {log}") from None


def last_error(log: Path) -> str:
    """The last line of the JVM's output that reads like an error, for a one-sentence failure."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    marks = ("Error", "ERROR", "Exception", "error:")
    return next((exception_message(line) for line in reversed(lines) if any(m in line for m in marks)), "")


def exception_message(line: str) -> str:
    """`...SparkException: what went wrong` -> `what went wrong`: the sentence, not the class."""
    got = re.search(r"(?:Exception|Error): (.*)$", line)
    return (got.group(1) if got else line).strip()


@contextlib.contextmanager
def settings(spark, keys: dict[str, str]):
    """The session's SQL settings `keys` for the block, the previous values restored after."""
    before = {k: spark.conf.get(k, None) for k in keys}
    for k, v in keys.items():
        spark.conf.set(k, v)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                spark.conf.unset(k)
            else:
                spark.conf.set(k, v)

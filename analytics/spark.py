"""The SparkSession the job and the tests use.

Local mode by default (`local[2]`: this machine has two cores), any master
URL for a cluster. The UI is off, shuffles use few partitions (the inputs are
a few million rows, not billions) and the JVM logs errors only. The driver
(the whole job in local mode) has 2 GiB: 8 GiB and the parallel collector
were no faster (docs/benchmarks.md, "Analytics"), and the job
shares its host with a broker node. The segments are parsed by Python tasks
(segment_task.py), in this interpreter unless PYSPARK_PYTHON names another.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

DEFAULT_MASTER = "local[2]"
_LOG4J = Path(__file__).with_name("log4j2.properties")


def session(master: str | None = None, app: str = "pairmq-analytics", shuffle_partitions: int = 4):
    from pyspark.sql import SparkSession

    # The tasks that parse segments (segment_task.py) run Python: this interpreter, with its packages, unless the
    # operator names another (a cluster's executors may have theirs elsewhere).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    # The JVM's default JIT: its client JIT alone (-XX:TieredStopAtLevel=1) made small states a little faster and
    # large ones much slower (docs/benchmarks.md, "Analytics").
    java_options = f"-Dlog4j.configurationFile=file:{_LOG4J} -Dlog4j2.configurationFile=file:{_LOG4J}"
    builder = (SparkSession.builder.master(master or DEFAULT_MASTER).appName(app)
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.driver.memory", "2g")
               .config("spark.driver.extraJavaOptions", java_options)
               .config("spark.sql.adaptive.enabled", "true")
               # Ingest writes one file per (day, node) per task: a writer each instead of sorting the rows first.
               .config("spark.sql.maxConcurrentOutputFileWriters", "32"))
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


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

"""pyspark's worker daemon, with what every task of the job imports imported once, before it forks the workers.

Spark starts it as `python -m` (spark.python.daemon.module, set by spark.py). A worker forked from it starts with
pyarrow, pandas and the job's task modules loaded, instead of importing them itself (about half a second of CPU each
on this machine's cores). One BLAS thread: nothing here uses it, and the daemon must not fork with threads running.
"""

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import pyarrow  # noqa: E402,F401
import pyarrow.compute  # noqa: E402,F401
import pyarrow.json  # noqa: E402,F401
import pyarrow.parquet  # noqa: E402,F401
from pyspark import daemon  # noqa: E402
import pyspark.worker  # noqa: E402,F401
import pyspark.sql.pandas.serializers  # noqa: E402,F401

import pairmq.analytics.keys_task  # noqa: E402,F401
import pairmq.analytics.segment_task  # noqa: E402,F401

if __name__ == "__main__":
    daemon.manager()

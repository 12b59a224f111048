"""Spark summaries of the nodes' spooled event logs (docs/events.md).

schema.py     the event log's schema as Spark types (explicit: never inferred)
spark.py      the SparkSession: the master given or configured (else local[2]), Java checked, the JVM's output in a log
worker_daemon.py  pyspark's worker daemon with the tasks' imports done once, before it forks
window.py     --since/--until: the bounds, and which segments can hold events of the period
ingest.py     closed segments -> a Parquet table partitioned by day and node, once each
segment_task.py  one segment -> its table rows and partials (pyarrow in a Spark task)
keys_task.py  the per-delivery keys merged a bucket per Spark task (pyarrow)
partials.py   rows -> partial aggregates, complete messages settled (the state stored at ingest): the reports' input
transforms.py pure DataFrame -> DataFrame functions (the reports' logic)
summary.py    runs the transforms, writes Parquet tables and JSON; the view model
driver.py     the reports from a small state, on the driver (the same rows as transforms.py)
driver_merge.py  a small state merged, stored and read on the driver (pyarrow; the same rows as partials.py)
xxhash64.py   Spark's xxhash64 of a topic, for the driver's merge
render.py     the Rich table of a summary;  charts.py  its PNG charts
"""

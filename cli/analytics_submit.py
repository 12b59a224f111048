"""spark-submit's application file for the analytics job: `pairmq analytics ARGS`, with spark-submit's master.

    spark-submit --master spark://head:7077 $(pairmq analytics submit-file) summarize hdfs:///pairmq/logs --out hdfs:///pairmq/report

spark-submit runs this file as a script, outside the package: its imports are absolute. The master, and every
other setting, is then spark-submit's (analytics/spark.py). `python -m pairmq.cli.analytics_submit ARGS` is the same.
"""

import sys

from pairmq.cli.main import main

if __name__ == "__main__":
    sys.exit(main(["analytics", *sys.argv[1:]]))

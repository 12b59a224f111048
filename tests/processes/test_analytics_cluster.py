"""The job on a real Spark standalone cluster gives exactly the reports of local mode.

A master and two workers (pyspark's own spark-class, tests/harness/spark_cluster.py) on this worker's loopback
address; `pairmq analytics summarize --master spark://…` as a process, its driver bound to the same address, over
synthetic logs in small closed segments plus an active one (tests/harness/synthetic_logs.py), against the same
command in local mode: the same JSON (all but the elapsed time), the same report tables, and executors on both
workers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pyarrow.parquet as pq
import pytest

from pairmq.appliance.roles import Role
from tests.harness.group import LOOPBACK, REPO
from tests.harness.spark_cluster import standalone_cluster
from tests.harness.synthetic_logs import generate

pytestmark = pytest.mark.timeout(900)  # CI's budget for it: two JVMs, two executors and two jobs on two cores
ADDRESS = LOOPBACK[Role.PRIMARY]


def summarize(logs, out, master: str) -> dict:
    env = {**os.environ, "SPARK_LOCAL_IP": ADDRESS, "SPARK_LOCAL_HOSTNAME": ADDRESS}
    run = subprocess.run([sys.executable, "-m", "pairmq.cli.main", "analytics", "summarize", str(logs),
                          "--out", str(out), "--master", master, "--json"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, f"analytics on {master} failed ({run.returncode}): {run.stderr[-3000:]}"
    assert run.stderr == "", f"--json prints nothing on stderr, not {run.stderr[-2000:]!r}"
    view = json.loads(run.stdout)
    view.pop("elapsed_s")
    return view


def reports(out) -> dict[str, list[dict]]:
    got = {}
    for where in sorted((out / "reports").iterdir()):
        rows = pq.read_table(where).to_pylist()
        got[where.name] = sorted(rows, key=lambda r: json.dumps(r, sort_keys=True, default=str))
    return got


def test_a_standalone_cluster_gives_exactly_the_reports_of_local_mode(tmp_path):
    logs = tmp_path / "logs"
    expected = generate(logs, 20_000, segment_bytes=256 * 1024)
    backup = sorted((logs / "backup" / "events").glob("events-backup-*.jsonl"))
    backup[-1].rename(backup[-1].with_name("events.jsonl"))  # the backup's log still growing: an active segment
    work = tmp_path / "cluster"
    # The local run's JVM works while the cluster's JVMs start, and the remote run starts as soon as the cluster
    # is up, beside it: neither reads the other's output.
    with ThreadPoolExecutor(1) as pool:
        local_run = pool.submit(summarize, logs, tmp_path / "local", "local[2]")
        with standalone_cluster(ADDRESS, work, workers=2) as url:
            remote = summarize(logs, tmp_path / "remote", url)
            local = local_run.result()
    assert local["messages"]["published_per_node"] == {**expected["published"], "monitor": 0}
    assert local["inputs"]["active_segments"] == 1 and local["inputs"]["segments_ingested_now"] > 3
    assert remote == local
    assert reports(tmp_path / "remote") == reports(tmp_path / "local")
    executors = [list((work / f"worker-{k}").glob("app-*/*/stderr")) for k in range(2)]
    assert all(executors), f"an executor on each worker, not {executors}"

"""`pairmq analytics` as an operator runs it: no Java is one sentence; Spark's own output stays off the terminal;
the master comes from spark-defaults.conf when --master is not given; the charts and summary.json reach a Hadoop
path (file://); spark-submit runs the job from `pairmq analytics submit-file`."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from tests.harness.group import LOOPBACK, REPO
from tests.harness.synthetic_logs import generate

ADDRESS = next(iter(LOOPBACK.values()))
# Every line the command writes on stderr: a stage with its time, or what it wrote.
STAGE = re.compile(r"^\s*\d+\.\d s  (?=\S)")


def pairmq(*argv: str, env: dict[str, str] | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pairmq.cli.main", *argv], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout,
                          env={**os.environ, "SPARK_LOCAL_IP": ADDRESS, "SPARK_LOCAL_HOSTNAME": ADDRESS,
                               **(env or {})})


def test_without_java_the_job_is_one_sentence_and_exit_2(tmp_path):
    generate(tmp_path / "logs", 200)
    no_java = {"JAVA_HOME": str(tmp_path / "no-jre"), "PATH": "/nonexistent"}
    run = pairmq("analytics", "summarize", str(tmp_path / "logs"), env=no_java)
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr == (f"error: pairmq analytics needs a Java runtime (17 or later) and found no "
                          f"$JAVA_HOME/bin/java ({tmp_path / 'no-jre'}): install one (e.g. apt install "
                          "default-jre-headless)\n")


def test_the_master_from_spark_defaults_quiet_stages_and_charts_on_a_hadoop_path(tmp_path):
    logs, out = tmp_path / "logs", tmp_path / "out"
    generate(logs, 4000)
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "spark-defaults.conf").write_text("# the operator's\nspark.master   local[1]\n")
    run = pairmq("analytics", "summarize", str(logs), "--out", out.as_uri(), "--since",
                 "2026-05-28T20:26:40Z", env={"SPARK_CONF_DIR": str(conf), "COLUMNS": "200"})
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stderr.splitlines()
    assert all(STAGE.match(line) for line in lines), f"only the job's stages on stderr, not {run.stderr!r}"
    stages = [STAGE.sub("", line) for line in lines]
    assert "Spark on local[1]" in stages
    assert "ingesting 3 new closed segment(s), 0.4 MB" in stages and "drawing the charts" in stages
    assert {p.name for p in (out / "charts").iterdir()} >= {"message_rate.png", "latency.png", "availability.png"}
    view = json.loads((out / "summary.json").read_text())
    assert view["inputs"]["window"] == {"since": "2026-05-28T20:26:40+00:00", "until": None}
    assert "Messages" in run.stdout or "messages" in run.stdout.lower()


def test_a_spark_failure_is_one_sentence_naming_the_kept_log(tmp_path):
    generate(tmp_path / "logs", 200)
    run = pairmq("analytics", "summarize", str(tmp_path / "logs"), "--master", "bogus://nowhere")
    assert run.returncode == 2 and run.stdout == ""  # refused by spark-submit: the JVM never started
    got = re.search(r"^error: Spark's JVM exited before it started \(Master must either be yarn or start with spark, "
                    r"k8s, or local\); its output is in (\S+\.log)\n\Z", run.stderr, re.M)
    assert got, run.stderr
    Path(got.group(1)).unlink()
    run = pairmq("analytics", "summarize", str(tmp_path / "logs"), "--master", "local[0]")
    assert run.returncode == 1 and run.stdout == ""  # the JVM started, the context refused
    got = re.search(r"^error: the Spark job failed: Asked to run locally with 0 threads; Spark's output is in "
                    r"(\S+\.log)\n\Z", run.stderr, re.M)
    assert got, run.stderr
    Path(got.group(1)).unlink()


def test_spark_submit_runs_the_job_from_the_submit_file(tmp_path):
    logs = tmp_path / "logs"
    expected = generate(logs, 4000)
    submit_file = pairmq("analytics", "submit-file")
    assert submit_file.returncode == 0
    app = Path(submit_file.stdout.strip())
    assert app.is_file() and app.name == "analytics_submit.py"
    from pyspark.find_spark_home import _find_spark_home

    run = subprocess.run([str(Path(_find_spark_home()) / "bin" / "spark-submit"), "--master", "local[1]",
                          "--conf", "spark.ui.enabled=false", str(app), "summarize", str(logs), "--json"],
                         cwd=REPO, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": ADDRESS,
                              "SPARK_LOCAL_HOSTNAME": ADDRESS})
    assert run.returncode == 0, run.stderr[-3000:]
    view = json.loads(run.stdout)
    assert view["messages"]["published_per_node"] == {**expected["published"], "monitor": 0}

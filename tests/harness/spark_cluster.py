"""A Spark standalone cluster on this machine: a master and workers from pyspark's own `spark-class`, bound to one
loopback address, each its own process, stopped (their process groups) when the block ends.

Every port is picked free on that address (Spark's defaults, 7077 and 8080, are the master's and the broker's
management port); the web UIs are off where Spark allows it and on free ports where it does not. Each worker offers
one core and 1 GiB; the logs of every process are kept in the given directory for a failing test to show.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

START_TIMEOUT_S = 120  # two JVMs start on two loaded cores


def free_port(address: str) -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return s.getsockname()[1]


def spark_class() -> str:
    from pyspark.find_spark_home import _find_spark_home

    return str(Path(_find_spark_home()) / "bin" / "spark-class")


def _env(address: str, work: Path) -> dict[str, str]:
    return {**os.environ, "SPARK_LOCAL_IP": address, "SPARK_PUBLIC_DNS": address, "SPARK_WORKER_DIR": str(work),
            "SPARK_LOG_DIR": str(work), "SPARK_NO_DAEMONIZE": "1"}


def _start(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    with open(log, "wb") as out:
        return subprocess.Popen([spark_class(), *args], env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)


def _wait(proc: subprocess.Popen, log: Path, needle: str, what: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if needle in log.read_text(errors="replace"):
            return
        if proc.poll() is not None:
            raise AssertionError(f"{what} exited ({proc.returncode}): {log.read_text(errors='replace')[-3000:]}")
        time.sleep(0.1)
    raise AssertionError(f"{what} did not start in {START_TIMEOUT_S} s: {log.read_text(errors='replace')[-3000:]}")


@contextlib.contextmanager
def standalone_cluster(address: str, work: Path, workers: int = 2):
    """The master's URL (spark://address:port), with `workers` workers registered."""
    work.mkdir(parents=True, exist_ok=True)
    env = _env(address, work)
    port = free_port(address)
    url = f"spark://{address}:{port}"
    procs: list[subprocess.Popen] = []
    try:
        master_log = work / "master.log"
        procs.append(_start(["org.apache.spark.deploy.master.Master", "--host", address, "--port", str(port),
                             "--webui-port", str(free_port(address))], env, master_log))
        _wait(procs[0], master_log, "I have been elected leader", "the Spark master")
        for k in range(workers):  # all started before waiting for any: their JVMs start side by side
            procs.append(_start(["org.apache.spark.deploy.worker.Worker", "--host", address, "--cores", "1",
                                 "--memory", "1g", "--webui-port", str(free_port(address)),
                                 "--work-dir", str(work / f"worker-{k}"), url], env, work / f"worker-{k}.log"))
        for k, proc in enumerate(procs[1:]):
            _wait(proc, work / f"worker-{k}.log", "Successfully registered with master", f"Spark worker {k}")
        yield url
    finally:
        for proc in reversed(procs):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)

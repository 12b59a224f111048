"""The suite's own rules (tests/conftest.py) on a real pytest-xdist run: a small suite laid out like this one
(timed modules in processes/, JVM modules named like the analytics ones, a simulator, unit tests) runs on three
workers under a copy of tests/conftest.py; each test records when it ran and where. No JVM module's test runs
while a timed or another JVM module's test runs on another worker, and every worker takes part. And what the
uncompiled build (PAIRMQ_PURE_PYTHON=1) runs: PURE_SUBSET, or with --whole-suite every test but those marked compiled.
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import sys

from tests.conftest import choose, conflicts, kind_of, scope_of
from tests.harness.group import REPO

TEST = """\
import os, time
import pytest

@pytest.mark.parametrize("i", range({n}))
def test_step(i):
    start = time.monotonic()
    time.sleep({seconds})
    with open(os.environ["SUITE_RULES_LOG"], "a") as log:
        log.write(f"{{os.environ['PYTEST_XDIST_WORKER']}} {kind} {{start}} {{time.monotonic()}}\\n")
"""
# path under tests/, kind, tests, seconds each
LAYOUT = [("processes/test_timed_a.py", "timed", 4, 0.3), ("processes/test_timed_b.py", "timed", 4, 0.3),
          ("processes/test_timed_c.py", "timed", 3, 0.3), ("processes/test_analytics_one.py", "jvm", 3, 0.4),
          ("processes/test_analytics_two.py", "jvm", 3, 0.4), ("unit/test_analytics_shared.py", "jvm", 3, 0.4),
          ("sim/test_schedules.py", "cpu", 4, 0.2), ("unit/test_a.py", "cpu", 5, 0.1), ("unit/test_b.py", "cpu", 5, 0.1)]


def test_kinds_and_choices():
    assert [kind_of(scope_of(f"tests/{path}::test_step[0]")) for path, *_ in LAYOUT] == [k for _, k, *_ in LAYOUT]
    assert conflicts("jvm", ["timed"]) and conflicts("jvm", ["jvm"]) and not conflicts("jvm", ["cpu", "cpu"])
    assert conflicts("cpu", ["timed", "cpu"]) and not conflicts("cpu", ["timed"]) and not conflicts("timed", ["jvm"])
    queue = ["tests/processes/test_analytics_one.py", "tests/sim/test_schedules.py::test_step[0]"]
    assert choose(queue, ["timed"]) == queue[1]  # the JVM waits for the timers; the simulator may run
    assert choose(queue, ["timed", "cpu"]) == queue[0]  # nothing fits: the first, which waits for the lock
    assert choose(queue, ["timed", "jvm"]) == queue[1]  # not a second JVM queued behind another's whole module
    assert choose(queue, ["cpu"]) == queue[0]


def test_no_jvm_module_runs_beside_a_timed_or_another_jvm_module(tmp_path):
    suite = tmp_path / "suite"
    for folder in ("processes", "unit", "sim"):
        (suite / "tests" / folder).mkdir(parents=True)
    shutil.copy(REPO / "tests" / "conftest.py", suite / "tests" / "conftest.py")
    for path, kind, n, seconds in LAYOUT:
        (suite / "tests" / path).write_text(TEST.format(n=n, seconds=seconds, kind=kind))
    (suite / "pytest.ini").write_text("[pytest]\ntestpaths = tests\n")
    log = tmp_path / "log"
    env = {**os.environ, "SUITE_RULES_LOG": str(log)}
    env.pop("PYTEST_XDIST_WORKER", None)  # this worker's own: the inner run starts workers of its own
    env.pop("PYTEST_ADDOPTS", None)
    env.pop("PAIRMQ_PURE_PYTHON", None)  # scheduling is the same on both builds; a pure run would keep no file here
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "3", "-p", "no:cacheprovider"], cwd=suite,
                         env=env, capture_output=True, text=True, timeout=240)
    total = sum(n for _, _, n, _ in LAYOUT)
    assert run.returncode == 0 and f"{total} passed" in run.stdout, run.stdout[-3000:] + run.stderr[-3000:]
    runs = [(worker, kind, float(start), float(end))
            for worker, kind, start, end in (line.split() for line in log.read_text().splitlines())]
    assert len(runs) == total
    assert {worker for worker, *_ in runs} == {"gw0", "gw1", "gw2"}
    beside = [(a, b) for a, b in itertools.combinations(runs, 2)
              if a[0] != b[0] and a[2] < b[3] and b[2] < a[3] and "jvm" in (a[1], b[1]) and "cpu" not in (a[1], b[1])]
    assert beside == [], f"JVM tests beside timed or JVM ones: {beside}"



PURE_LAYOUT = {"unit/test_broker_kept.py": "def test_in_subset():\n    pass\n",
               "unit/test_elsewhere.py": "def test_outside_subset():\n    pass\n",
               "processes/test_group.py": "def test_a_process_test():\n    pass\n",
               "unit/test_mqtt_built.py": "import pytest\n\n@pytest.mark.compiled\ndef test_of_the_compiled_build():\n"
                                          "    pass\n\ndef test_beside_it():\n    pass\n"}


def test_the_pure_build_runs_its_subset_or_with_whole_suite_all_but_the_compiled_tests(tmp_path):
    for path, text in PURE_LAYOUT.items():
        (tmp_path / "tests" / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "tests" / path).write_text(text)
    shutil.copy(REPO / "tests" / "conftest.py", tmp_path / "tests" / "conftest.py")
    (tmp_path / "pytest.ini").write_text("[pytest]\ntestpaths = tests\nmarkers =\n    compiled: the compiled build\n")
    env = {key: value for key, value in os.environ.items()
           if key not in ("PYTEST_XDIST_WORKER", "PYTEST_ADDOPTS", "PAIRMQ_PURE_PYTHON")}

    def run(*args: str, pure: bool) -> str:
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", "-rA", *args],
                              cwd=tmp_path, env={**env, "PAIRMQ_PURE_PYTHON": "1"} if pure else env,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        return done.stdout

    subset = run(pure=True)  # the files outside PURE_SUBSET are not even collected
    assert "2 passed, 1 deselected" in subset and "test_in_subset" in subset and "test_beside_it" in subset, subset
    whole = run("--whole-suite", pure=True)
    assert "4 passed, 1 deselected" in whole and "test_of_the_compiled_build" not in whole, whole
    assert "5 passed" in run(pure=False) and "5 passed" in run("--whole-suite", pure=False)

"""The wheel of this tree, built once per test run and shared by every test that installs it.

Rules:
- Built uncompiled (PAIRMQ_PURE_PYTHON=1: no C compiler in the loop) from a copy of the tree: a build in the tree
  itself would write build/ and *.egg-info beside the editable install's.
- Kept in the run's own directory (beside the run's lock, tests/conftest.py), so it is never older than the tree the
  run started from and goes away with the run.
- The first test to ask builds it under a file lock; a test on another worker asking meanwhile waits for that build
  instead of starting its own (each build is a pip build environment and a setuptools run: tens of seconds).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.harness.group import REPO

COPY_IGNORE = shutil.ignore_patterns(".venv*", ".git", "build", "*.egg-info", "__pycache__", ".pytest_cache",
                                     ".hypothesis", "local", "node_modules", "*.so", "_native_build.py")


def run_dir() -> Path:
    return Path(os.environ["PAIRMQ_SUITE_LOCK"]).parent  # made by tests/conftest.py for each run, removed after it


def pure_wheel() -> Path:
    """The path of the run's wheel of this tree, building it on first use."""
    out = run_dir() / "wheel"
    with open(run_dir() / "wheel.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        built = sorted(out.glob("pairmq-*.whl"))
        if not built:
            work = Path(tempfile.mkdtemp(prefix="wheel-", dir=run_dir()))
            shutil.copytree(REPO, work / "src", ignore=COPY_IGNORE)
            done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir",
                                   str(work / "out"), str(work / "src")], capture_output=True, text=True, timeout=600,
                                  env={**os.environ, "PAIRMQ_PURE_PYTHON": "1"})
            assert done.returncode == 0, done.stderr[-3000:]
            (work / "out").rename(out)  # whole or not at all: a failed build leaves no wheel for the next test
            shutil.rmtree(work)
            built = sorted(out.glob("pairmq-*.whl"))
    [wheel] = built
    return wheel

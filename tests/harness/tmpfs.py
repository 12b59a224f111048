"""Small tmpfs file systems for the full-disk tests: a disk that really fills (needs root).

`small_disks(paths, size)` mounts one tmpfs of `size` (mount's syntax: "1m", "16m", or bytes) on each
path, creating it, and unmounts them all on the way out even when a mount fails half way. A failure
to mount is a test failure naming mount's own error, never a skip.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def small_disks(paths: list[Path], size: str | int, name: str = "tmpfs") -> Iterator[list[Path]]:
    if os.geteuid() != 0:
        pytest.fail("the full-disk tests mount small tmpfs file systems, which needs root: run the suite as root")
    mounted: list[Path] = []
    try:
        for path in paths:
            path.mkdir(parents=True, exist_ok=True)
            done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", name, str(path)],
                                  capture_output=True, text=True)
            if done.returncode != 0:
                pytest.fail(f"cannot mount a {size} tmpfs on {path}: {done.stderr.strip()}")
            mounted.append(path)
        yield mounted
    finally:
        for path in reversed(mounted):
            subprocess.run(["umount", "-l", str(path)], capture_output=True)

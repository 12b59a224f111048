"""The guard against a stale compiled module: refuse one built from another version of its source.

Rules:
- setup.py records, at each build, the SHA-256 of every compiled module's source (`_native_build.SOURCES`).
- At the package's first import, a compiled module whose source next to it differs from the recorded one (an
  editable install whose source was edited, or a checkout of another commit, without a rebuild) is refused with
  one sentence that says how to rebuild. Refused, not skipped: the import system prefers the compiled module,
  and running code other than the source tests and benchmarks believe they run is worse than stopping.
- No record (a pure build, or none yet) or no compiled file next to the source: nothing to check.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import pathlib


class StaleCompiledModule(ImportError):
    """A compiled module was built from another version of its source."""


def check(top: pathlib.Path, sources: dict[str, tuple[str, str]]) -> None:
    """`top` holds the package folders (appliance, mate_link, ...); `sources`: module -> (path under top, SHA-256)."""
    for module, (relative, digest) in sources.items():
        source = top / relative
        if not any(source.with_suffix(suffix).exists() for suffix in importlib.machinery.EXTENSION_SUFFIXES):
            continue
        if not source.exists() or hashlib.sha256(source.read_bytes()).hexdigest() != digest:
            raise StaleCompiledModule(
                f"{module} is compiled from another version of {relative}: rebuild it with `bash .ci/setup` "
                f"(or `pip install -e .`), or install with PAIRMQ_PURE_PYTHON=1 to run the sources uncompiled")


def check_installed() -> None:
    try:
        from pairmq.appliance._native_build import SOURCES
    except ImportError:
        return  # installed before builds wrote a record, or not installed at all
    check(pathlib.Path(__file__).resolve().parent.parent, SOURCES)

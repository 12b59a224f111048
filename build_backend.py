"""The build backend: setuptools', with mypy as a build requirement unless PAIRMQ_PURE_PYTHON=1 (docs/build.md).

A requirement listed in `[build-system] requires` must be found even by a build that does not compile, so it is
asked for here, per build, instead.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from setuptools import build_meta
from setuptools.build_meta import *  # noqa: F403 - the rest of the backend is setuptools' own

REQUIREMENTS_ONLY = "PAIRMQ_BUILD_REQUIREMENTS_ONLY"  # read by setup.py
MYPYC = ["mypy==2.4.1"]  # also pinned in the test extra (the type gate): keep them the same


def _compiler() -> list[str]:
    return [] if os.environ.get("PAIRMQ_PURE_PYTHON") == "1" else MYPYC


def _setuptools_requires(hook: Callable[[dict[str, str] | None], list[str]],
                         config_settings: dict[str, str] | None) -> list[str]:
    """setuptools runs setup.py to find its requirements, before mypy is there: setup.py compiles nothing then."""
    os.environ[REQUIREMENTS_ONLY] = "1"
    try:
        return hook(config_settings)
    finally:
        del os.environ[REQUIREMENTS_ONLY]


def get_requires_for_build_wheel(config_settings: dict[str, str] | None = None) -> list[str]:
    return _setuptools_requires(build_meta.get_requires_for_build_wheel, config_settings) + _compiler()


def get_requires_for_build_editable(config_settings: dict[str, str] | None = None) -> list[str]:
    return _setuptools_requires(build_meta.get_requires_for_build_editable, config_settings) + _compiler()

"""Command-line options of the fault-injection suite (tests/test_nemesis.py, docs/reliability.md).

    pytest tests/test_nemesis.py                  the bounded CI run (fixed seeds)
    pytest tests/test_nemesis.py --soak 30        random seeds for 30 minutes; prints any failing seed
    pytest tests/test_nemesis.py --seed 1234      rerun one seed's schedule
    ... --report DIR                              also write the report (JSON and table) there

and of the coverage-guided fuzz run (tests/test_hostile_fuzz.py, docs/security.md):

    pytest tests/test_hostile_fuzz.py                     the bounded CI run (a fixed number of inputs per target)
    pytest tests/test_hostile_fuzz.py --fuzz-minutes 10   each target for 10 minutes
"""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("nemesis", "fault-injection suite (tests/test_nemesis.py)")
    group.addoption("--soak", type=float, metavar="MINUTES", default=None,
                    help="run the nemesis with random seeds for this many minutes instead of the CI seeds")
    group.addoption("--seed", type=int, metavar="N", default=None, help="run the nemesis with this one seed")
    group.addoption("--report", metavar="PATH", default=None, help="directory for the nemesis report")
    parser.getgroup("fuzz", "coverage-guided fuzzing (tests/test_hostile_fuzz.py)").addoption(
        "--fuzz-minutes", type=float, metavar="MINUTES", default=None,
        help="fuzz each decoder for this many minutes instead of the CI's fixed number of inputs")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    minutes = config.getoption("--soak")
    if minutes is not None and minutes <= 0:
        raise pytest.UsageError(f"--soak takes a positive number of minutes, not {minutes}")
    if minutes:  # the last seed started before the end runs to completion: allow it, plus set-up
        for item in items:
            if item.get_closest_marker("soak"):
                item.add_marker(pytest.mark.timeout(int(minutes * 60) + 900), append=False)  # before the test's own
    fuzz_minutes = config.getoption("--fuzz-minutes")
    if fuzz_minutes is not None and fuzz_minutes <= 0:
        raise pytest.UsageError(f"--fuzz-minutes takes a positive number of minutes, not {fuzz_minutes}")
    if fuzz_minutes:  # each fuzz target runs that long, plus atheris's start and a last slow input
        for item in items:
            if item.get_closest_marker("soak") and "test_hostile_fuzz" in item.nodeid:
                item.add_marker(pytest.mark.timeout(int(fuzz_minutes * 60) + 300), append=False)

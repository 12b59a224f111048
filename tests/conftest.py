"""Command-line options of the fault-injection suite (tests/test_nemesis.py, docs/reliability.md).

    pytest tests/test_nemesis.py                  the bounded CI run (fixed seeds)
    pytest tests/test_nemesis.py --soak 30        random seeds for 30 minutes; prints any failing seed
    pytest tests/test_nemesis.py --seed 1234      rerun one seed's schedule
    ... --report DIR                              also write the report (JSON and table) there
"""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("nemesis", "fault-injection suite (tests/test_nemesis.py)")
    group.addoption("--soak", type=float, metavar="MINUTES", default=None,
                    help="run the nemesis with random seeds for this many minutes instead of the CI seeds")
    group.addoption("--seed", type=int, metavar="N", default=None, help="run the nemesis with this one seed")
    group.addoption("--report", metavar="PATH", default=None, help="directory for the nemesis report")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    minutes = config.getoption("--soak")
    if minutes is not None and minutes <= 0:
        raise pytest.UsageError(f"--soak takes a positive number of minutes, not {minutes}")
    if minutes:  # the last seed started before the end runs to completion: allow it, plus set-up
        for item in items:
            if item.get_closest_marker("soak"):
                item.add_marker(pytest.mark.timeout(int(minutes * 60) + 900), append=False)  # before the test's own

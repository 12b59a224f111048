"""The fault-injection suite, end to end (docs/reliability.md): the nemesis against a real group.

By default this is the bounded CI run: fixed seeds, each a "cover" schedule that injects every fault
kind once in a seeded order. `--soak MINUTES` instead runs random seeds (fresh group each) until the
time is up and prints the seed of any failure; `--seed N` reruns that seed's soak schedule. Either way
the report (every count, unavailability per fault kind) is printed and written to a directory printed at the end
(`--report PATH` as well), and any violation fails the test.
"""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest

from tests.harness import nemesis, nemesis_report
from tests.harness.nemesis_schedule import KINDS, schedule

pytestmark = [pytest.mark.processes, pytest.mark.soak]

CI_SEEDS = (1,)  # one "cover" schedule (every fault kind once, ~1 minute); more seeds are for --soak
SOAK_STEPS_PER_SEED = 12


def _emit(report: dict, directories: list[Path]) -> None:
    text = nemesis_report.table(report)
    print("\n" + text)
    for directory in directories:
        json_path, text_path = nemesis_report.write(report, directory)
        print(f"nemesis report: {json_path} and {text_path}")


@pytest.mark.timeout(1200)
def test_nemesis(request, tmp_path):
    config = request.config
    minutes, seed = config.getoption("--soak"), config.getoption("--seed")
    directories = [tmp_path / "report"] + ([Path(config.getoption("--report"))] if config.getoption("--report") else [])
    runs = []
    if minutes:
        deadline = time.monotonic() + minutes * 60
        rng = random.SystemRandom()
        while time.monotonic() < deadline:
            seed = rng.randrange(1, 2**31)
            print(f"soak: seed {seed}", flush=True)
            run = nemesis.Run(seed, schedule(seed, SOAK_STEPS_PER_SEED, "random"), tmp_path / f"seed-{seed}").execute()
            runs.append(run)
            report = nemesis_report.build(runs)
            if seed in report["failed_seeds"]:
                print(f"soak: SEED {seed} FAILED (rerun with --seed {seed})", flush=True)
            for directory in directories:  # a report so far, in case the run is cut short
                nemesis_report.write(report, directory)
    elif seed is not None:  # the soak's schedule for that seed, which is what a soak failure prints
        runs = nemesis.run_seeds([seed], SOAK_STEPS_PER_SEED, "random", tmp_path)
    else:
        runs = nemesis.run_seeds(list(CI_SEEDS), len(KINDS), "cover", tmp_path)
    report = nemesis_report.build(runs)
    _emit(report, directories)
    kinds = set(report["per_kind"])
    if not minutes and seed is None:
        assert kinds == set(KINDS), f"fault kinds never injected: {set(KINDS) - kinds}"
    assert report["totals"]["acknowledged"] > 0 and report["totals"]["probe_rounds"] > 0, "the run measured nothing"
    assert report["ok"], f"violations (seeds {report['failed_seeds']}):\n{nemesis_report.table(report)}"

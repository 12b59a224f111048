"""Compiled against pure Python in one run: a benchmark script re-run under two interpreters, alternately.

    python bench/floors.py --against .venv-pure/bin/python [--rounds 3]
    python bench/qos1_probe.py --against .venv-pure/bin/python [--rounds 3]

Each round runs the script once under this interpreter and once under `--against` (a PAIRMQ_PURE_PYTHON=1
install: .ci/setup makes one at .venv-pure), in alternating order, so a machine shared with other work loads
both builds alike. The figures each run prints are picked out by the caller's patterns; printed are every
round's and the medians, with this build's figure as a fraction of the other's (below 1: this one is faster).
"""

from __future__ import annotations

import re
import statistics
import subprocess
import sys

_PROBE = ("import importlib, sys; m = importlib.import_module('pairmq.appliance.broker.core'); "
          "print('compiled' if m.__file__.endswith('.so') else 'pure')")


def build_of(python: str) -> str:
    """'compiled' or 'pure': what `python` imports the broker core from."""
    return subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, check=True).stdout.strip()


def compare(script: str, argv: list[str], against: str, rounds: int, patterns: dict[str, str]) -> None:
    """Run `script argv` under sys.executable and `against`, `rounds` times each, alternating; report `patterns`
    (name -> regex with one number group) from each run's output."""
    pythons = {f"{build_of(sys.executable)} ({sys.executable})": sys.executable,
               f"{build_of(against)} ({against})": against}
    figures: dict[str, dict[str, list[float]]] = {label: {name: [] for name in patterns} for label in pythons}
    for r in range(rounds):
        order = list(pythons) if r % 2 == 0 else list(reversed(pythons))
        for label in order:
            out = subprocess.run([pythons[label], script, *argv], capture_output=True, text=True, check=True).stdout
            got = {name: float(re.search(p, out).group(1).replace(",", "")) for name, p in patterns.items()}
            for name, value in got.items():
                figures[label][name].append(value)
            print(f"round {r + 1}, {label}: " + ", ".join(f"{n} {v:,.2f}" for n, v in got.items()), flush=True)
    mine, other = list(pythons)
    print(f"medians of {rounds} rounds:")
    for name in patterns:
        a, b = statistics.median(figures[mine][name]), statistics.median(figures[other][name])
        print(f"  {name}: {a:,.2f} {mine.split()[0]}, {b:,.2f} {other.split()[0]}: {a / b:.2f}x")

"""Coverage-guided fuzzing of every decoder that reads network bytes (atheris; targets in tests/harness/fuzz_targets.py).

    pytest tests/sim/test_hostile_fuzz.py                     each target for a fixed number of inputs, seed 1
    pytest tests/sim/test_hostile_fuzz.py --fuzz-minutes 10   each target for 10 minutes, random seed

A target runs in its own process (libFuzzer owns it and exits when done), started from one valid
input of each kind. A finding fails the test with the input in hex; every finding so far is a named
regression test below (super-linear ones in test_hostile_fuzz_linear.py), run without atheris.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness import fuzz_targets
from tests.harness.fuzz_targets import SEEDS, TARGETS

REPO = Path(__file__).resolve().parents[2]
# Inputs per target in CI: a few thousand mutations each past the seeds, ~30 s for all.
CI_RUNS = {"mqtt_stream": 1500, "mate_frames": 1500}
CI_RUNS_DEFAULT = 4000
MAX_INPUT_BYTES = 4096
INPUT_TIMEOUT_S = 20  # libFuzzer's per-input bound: a super-linear input shows up as a timeout


@pytest.mark.soak
@pytest.mark.parametrize("target", sorted(TARGETS))
def test_fuzz_target(target, tmp_path, request):
    pytest.importorskip("atheris")
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i, seed in enumerate(SEEDS[target]()):
        (corpus / f"seed-{i}").write_bytes(seed)
    minutes = request.config.getoption("--fuzz-minutes")
    budget = [f"-max_total_time={int(minutes * 60)}", "-seed=0"] if minutes \
        else [f"-runs={CI_RUNS.get(target, CI_RUNS_DEFAULT)}", "-seed=1"]
    cmd = [sys.executable, "-m", "tests.harness.fuzz_targets", target, *budget, f"-max_len={MAX_INPUT_BYTES}",
           f"-timeout={INPUT_TIMEOUT_S}", f"-artifact_prefix={tmp_path}/", "-print_final_stats=1", str(corpus)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    limit_s = (minutes * 60 if minutes else 120) + 240
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=limit_s)
    findings = sorted(p for p in tmp_path.iterdir() if p.name.startswith(("crash-", "timeout-", "oom-")))
    found = "\n".join(f"{p.name}: {p.read_bytes().hex()}" for p in findings)
    assert proc.returncode == 0 and not findings, (
        f"{target}: exit {proc.returncode}\n{found}\n--- last output ---\n{proc.stderr[-4000:]}")
    assert "Done" in proc.stderr, proc.stderr[-2000:]


# --- findings, kept as regression tests ----------------------------------------------------------------

def test_configsync_message_nested_deeper_than_the_recursion_limit_is_a_link_fault():
    """json's scanner recursed into a RecursionError: not a protocol error, so the adapter logged an
    internal error with its traceback instead of counting a refusal."""
    fuzz_targets.configsync_message(b"[" * 5000)
    hello = {"type": "hello", "epoch": 1, "version": 1, "digest": "d", "recent": "@"}
    fuzz_targets.configsync_message(json.dumps(hello).replace('"@"', "[" * 3000 + "]" * 3000).encode())


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_configsync_message_with_nan_or_infinity_is_a_link_fault(constant):
    """Python's json reads NaN and Infinity, which are not JSON: such a message decoded into values
    that canonical JSON (the chain, the digest) cannot encode again, a ValueError wherever that happens."""
    change = {"type": "changes", "epoch": 5, "entries": [
        {"version": 4, "chain": "c", "change": {"kind": "limits.set", "name": "max_connections", "value": "@"}}]}
    fuzz_targets.configsync_message(json.dumps(change).replace('"@"', constant).encode())
    fuzz_targets.configsync_message(b'{"type":"ping","epoch":1,"x":%s}' % constant.encode())


@pytest.mark.parametrize("kind", ["{}", "[]", '{"a": 1}'])
def test_configsync_change_whose_kind_is_an_object_is_a_link_fault(kind):
    """atheris: a change whose kind is a JSON object or array raised TypeError (unhashable) in
    parse_change; on the standby that was an internal error, not a counted refusal."""
    change = {"type": "changes", "epoch": 5, "entries": [{"version": 4, "chain": "c", "change": {"kind": "@"}}]}
    fuzz_targets.configsync_message(json.dumps(change).replace('"@"', kind).encode())


@pytest.mark.parametrize("kind", ["{}", "[1]"])
def test_configsync_message_whose_type_is_an_object_is_a_link_fault(kind):
    """atheris: a message whose type is a JSON object or array raised TypeError (unhashable) in decode."""
    fuzz_targets.configsync_message(b'{"type":%s,"epoch":1}' % kind.encode())


def test_every_seed_decodes_and_round_trips():
    """The seeds are valid inputs, so the targets' round-trip checks run on every kind of message."""
    for name, target in TARGETS.items():
        for seed in SEEDS[name]():
            target(seed)

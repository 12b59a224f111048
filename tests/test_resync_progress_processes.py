"""Resync progress with real node processes, read the way an operator reads it: `pairmq show redundancy --json`.

The primary's spool holds 150,000 queued messages (built with the spool writer before any node
starts: bench/spoolfill.py); the backup's is empty. The group starts; the primary, further ahead,
takes activity and sends the backup a full snapshot. While the backup
catches up, the CLI shows its progress (ops done only growing, ops to go only shrinking, a rate
and an ETA) and redundancy Down on both routing nodes; then the resync is done and redundancy Up.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from appliance.config import Limits, Timers
from appliance.roles import Role
from bench.spoolfill import fill
from tests.group import REPO, Group

pytestmark = pytest.mark.processes
P, B, M = Role.PRIMARY, Role.BACKUP, Role.MONITOR
MESSAGES = 150_000
PAYLOAD_BYTES = 512


def show_redundancy(g: Group, *, some_node_up: bool = True) -> dict[str, dict]:
    """{role: node view}; {} when no node answers yet (allowed only with `some_node_up=False`)."""
    out = subprocess.run([sys.executable, "-m", "cli.main", "show", "redundancy", "--json",
                          "--group", str(g.dir / "group.toml")], capture_output=True, text=True, cwd=REPO, timeout=30)
    if out.returncode != 0 and not some_node_up and "no node of group" in out.stderr:
        return {}
    assert out.returncode == 0, out.stderr
    return {n["role"]: n for n in json.loads(out.stdout)["nodes"]}


def test_a_snapshot_resync_shows_its_progress_then_redundancy_up(tmp_path):
    # Taking activity, the primary rebuilds its broker core from 150,000 messages on its event loop (~4 s on a
    # busy machine): not this test's subject, so the loop-stall watchdog gets room (docs/redundancy.md).
    g = Group(tmp_path / "group", limits=Limits(session_queue_max_messages=MESSAGES),
              timers=Timers(broker_stall_ms=30_000))
    head = fill(g.config.node(P).data_dir / "spool", MESSAGES, PAYLOAD_BYTES)
    with g:
        g.start()
        g.wait_for("the primary to serve",
                   lambda: show_redundancy(g, some_node_up=False).get("primary", {}).get("serving"), timeout_s=90,
                   every_s=0.2)
        running: list[dict] = []
        statuses: set[tuple[str, str]] = set()
        deadline = time.monotonic() + 180
        while True:
            assert time.monotonic() < deadline, f"no resync done in 180 s; samples: {running}\n{g.logs_tail()}"
            nodes = show_redundancy(g)
            r = nodes["backup"].get("resync") if nodes["backup"].get("reachable") else None
            if r and r["state"] == "running":
                running.append(r)
                statuses.add((nodes["primary"]["redundancy_status"], nodes["backup"]["redundancy_status"]))
            elif r and r["state"] == "done" and nodes["primary"]["redundancy_status"] == "Up":
                final = r
                break
            time.sleep(0.05)
    print(f"{len(running)} progress samples while running: " + ", ".join(
        f"{s['ops_done']:,} done/{s['ops_to_go']} to go" for s in running))
    print(f"done: {final}")
    assert len(running) >= 2, f"the CLI showed the resync running only {len(running)} time(s): {running}"
    assert all(s["kind"] == "snapshot" for s in running) and final["kind"] == "snapshot"
    # A snapshot's size is unknown (None) until the active built it and its first batch arrived; then known.
    known = [s["ops_to_go"] is not None for s in running]
    assert known == sorted(known) and known[-1], f"ops to go known then unknown again: {running}"
    running = [s for s in running if s["ops_to_go"] is not None]
    done = [s["ops_done"] for s in running]
    to_go = [s["ops_to_go"] for s in running]
    assert done == sorted(done) and done[-1] > done[0], f"ops done did not grow: {done}"
    assert to_go == sorted(to_go, reverse=True) and to_go[-1] < to_go[0], f"ops to go did not shrink: {to_go}"
    assert len(running) >= 2, f"the CLI showed a known size only {len(running)} time(s)"
    assert all(s["ops_per_s"] > 0 and s["eta_ms"] is not None for s in running if s["ops_done"])
    assert all(s["bytes_done"] + s["bytes_to_go"] > MESSAGES * PAYLOAD_BYTES for s in running if s["bytes_done"])
    assert statuses == {("Down", "Down")}, f"redundancy while resyncing (primary, backup): {statuses}"
    # Every op of the snapshot: one body and one queue entry per message, the session's three ops.
    assert final["ops_done"] == 2 * MESSAGES + 3 and final["ops_to_go"] == 0 and final["bytes_to_go"] == 0
    assert head.seq == 2 * MESSAGES + 3

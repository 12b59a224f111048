"""Resync progress with real node processes, read the way an operator reads it: `pairmq show redundancy --json`.

The primary's spool holds 100,000 queued 4 KiB messages (built with the spool writer before any node
starts: bench/spoolfill.py); the backup's is empty. The group starts; the primary, further ahead,
takes activity and sends the backup a full snapshot (the spool's file image). While the backup
catches up, the CLI shows its progress (bytes done only growing, bytes to go only shrinking, a rate
and an ETA) and redundancy Down on both routing nodes; then the resync is done and redundancy Up.
"""

from __future__ import annotations

import json
import time
from io import StringIO

from rich.console import Console

from pairmq.appliance.config import Limits, Timers
from pairmq.appliance.roles import Role
from pairmq.cli.main import main
from pairmq.cli.terminal import Terminal
from bench.spoolfill import fill
from tests.harness.group import Group

P, B, M = Role.PRIMARY, Role.BACKUP, Role.MONITOR
MESSAGES = 100_000
PAYLOAD_BYTES = 4096  # an image big enough (~440 MB) that the CLI, half a second a call, sees it move


def show_redundancy(g: Group, *, some_node_up: bool = True) -> dict[str, dict]:
    """{role: node view}; {} when no node answers yet (allowed only with `some_node_up=False`).

    The command's own main() in this process: a program's start per sample would leave a loaded machine
    too few samples of a resync that lasts about a second."""
    out, err = Console(file=StringIO(), width=200, color_system=None), Console(file=StringIO(), width=200,
                                                                              color_system=None)
    code = main(["show", "redundancy", "--json", "--group", str(g.dir / "group.toml")], Terminal(out=out, err=err))
    stdout, stderr = out.file.getvalue(), err.file.getvalue()
    if code != 0 and not some_node_up and "no node of group" in stderr:
        return {}
    assert code == 0, stderr
    return {n["role"]: n for n in json.loads(stdout)["nodes"]}


def test_a_snapshot_resync_shows_its_progress_then_redundancy_up(tmp_path):
    # Taking activity, the primary rebuilds its broker core from 100,000 messages on its event loop (seconds on a
    # busy machine): not this test's subject, so the loop-stall watchdog gets room (docs/redundancy.md).
    g = Group(tmp_path / "group", limits=Limits(session_queue_max_messages=MESSAGES),
              timers=Timers(broker_stall_ms=30_000))
    # A log that no longer reaches back to the empty backup's op 0: a full resync (kept ops: docs/spool.md).
    head = fill(g.config.node(P).data_dir / "spool", MESSAGES, PAYLOAD_BYTES, keep_ops=1_000)
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
        f"{s['bytes_done']:,} B done/{s['bytes_to_go']} to go" for s in running))
    print(f"done: {final}")
    assert len(running) >= 2, f"the CLI showed the resync running only {len(running)} time(s): {running}"
    assert all(s["kind"] == "snapshot" for s in running) and final["kind"] == "snapshot"
    # A full resync ships the spool's file image (docs/mate_link.md): its progress counts bytes, and its size is
    # unknown (None) until the active made the image and its first piece arrived; then known.
    known = [s["bytes_to_go"] is not None for s in running]
    assert known == sorted(known) and known[-1], f"bytes to go known then unknown again: {running}"
    running = [s for s in running if s["bytes_to_go"] is not None]
    done = [s["bytes_done"] for s in running]
    to_go = [s["bytes_to_go"] for s in running]
    # Never backwards. (The image moves in about a second here, and one CLI call takes half of one: the samples
    # may all come from after its last byte, while the standby checks and swaps it in; so not "must grow".)
    assert done == sorted(done), f"bytes done went backwards: {done}"
    assert to_go == sorted(to_go, reverse=True), f"bytes to go grew: {to_go}"
    assert len({d + t for d, t in zip(done, to_go)}) == 1, f"the image's size changed: {done} / {to_go}"
    assert len(running) >= 2, f"the CLI showed a known size only {len(running)} time(s)"
    assert all(s["bytes_per_s"] > 0 and s["eta_ms"] is not None for s in running if s["bytes_done"])
    # The image holds every message's body (and the op log the primary keeps): more than the payloads.
    assert all(s["bytes_done"] + s["bytes_to_go"] > MESSAGES * PAYLOAD_BYTES for s in running)
    assert statuses == {("Down", "Down")}, f"redundancy while resyncing (primary, backup): {statuses}"
    assert final["bytes_to_go"] == 0 and final["ops_to_go"] == 0
    assert final["bytes_done"] == running[-1]["bytes_done"] + running[-1]["bytes_to_go"], "the whole image, once"
    assert head.seq == MESSAGES + 3  # the session's three ops, then one MessageRouted a message

"""Resync rate with real node processes: a backup joins a primary holding many queued messages.

Theory of operation
-------------------
The primary's spool is built before any node starts (bench/spoolfill.py: the spool writer API,
the same ops the broker writes for a publish to an offline persistent subscriber). Then, under
the fixed ports' lock, the whole group starts (a primary does not take activity alone at start-up:
it must show it is the most up to date, DESIGN §3 rule 4); the primary, further ahead, takes it,
and the backup joins its mate link. No MQTT client connects, so the primary writes no op and its
log stays as built. The bench polls the backup's redundancy view (GET /api/v1/redundancy, what
`pairmq show redundancy --json` shows) every POLL_S until its catch-up is done and the primary
reports redundancy Up.

  snapshot     the backup's spool is empty; the primary's log holds only the last 100,000 ops
               (what its writer keeps), so the active sends a full snapshot.
  incremental  the backup's spool holds the same session as the primary's (the same first ops,
               so the same chain); the primary's log keeps every op after it, so the active
               sends the messages op by op ("the backup was down while N messages arrived").

The rate is the backup's own account (mate_link/standby.py ResyncProgress: from the PLAN to the
last op durable, messages = ops, since a queued message is one MessageRouted);
the wall time from starting the group's processes to redundancy Up is reported beside it (it
includes the primary loading its spool before it serves).
"""

from __future__ import annotations

import time
from pathlib import Path

from pairmq.appliance.config import Limits, Timers
from pairmq.appliance.roles import Role
from bench.brokers import log
from bench.spoolfill import fill
from pairmq.cli.api import base_url, get_json, token
from tests.harness.group import Group

POLL_S = 0.1
KINDS = ("snapshot", "incremental")
START_TIMEOUT_S = 300.0
OPS_PER_MESSAGE = 1
TIMERS = Timers(lease_ms=5_000, takeover_margin_ms=500, broker_stall_ms=60_000)  # see measure()


def view(g: Group, role: Role) -> dict | None:
    try:
        return get_json(f"{base_url(g.config, role)}/api/v1/redundancy", timeout_s=2.0, token=token(g.config))
    except Exception:  # noqa: BLE001 - not up yet, or busy: poll again
        return None


def _wait(g: Group, what: str, predicate, timeout_s: float):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(POLL_S)
    raise RuntimeError(f"timed out after {timeout_s:.0f} s waiting for {what}\n{g.logs_tail()}")


def steps(node_log: Path, last: int = 12) -> list[str]:
    """The mate link's log lines of one node (its resync's steps, with their times), the last `last` of them."""
    try:
        lines = node_log.read_text(errors="replace").splitlines()
    except OSError:
        return []
    return [line for line in lines if "pairmq.mate_link" in line][-last:]


def measure(workdir: Path, kind: str, messages: int, payload_bytes: int) -> dict:
    """One resync of `messages` queued messages of `payload_bytes`; the numbers, or RuntimeError saying why not."""
    assert kind in KINDS
    directory = workdir / f"resync-{kind}"
    limits = Limits(session_queue_max_messages=max(messages, 100_000), session_queue_max_bytes=1 << 40,
                    spool_max_bytes=1 << 42)
    # The primary rebuilds its broker core from the whole spool when it takes activity, on its event loop
    # (seconds per 100,000 messages): past broker_stall_ms (5 s by default) it would give activity up, and with
    # a million messages on a busy machine the default lease can expire during the rebuild. What is measured
    # here is the resync after that, so both get room.
    g = Group(directory, limits=limits, timers=TIMERS)
    t = time.monotonic()
    if kind == "incremental":
        fill(g.config.node(Role.BACKUP).data_dir / "spool", 0, payload_bytes)
        head = fill(g.config.node(Role.PRIMARY).data_dir / "spool", messages, payload_bytes,
                    keep_ops=messages * OPS_PER_MESSAGE + 100)
    else:
        head = fill(g.config.node(Role.PRIMARY).data_dir / "spool", messages, payload_bytes)
    log(f"  resync {kind}: built the primary's spool ({messages:,} messages, head op {head.seq:,}) in "
        f"{time.monotonic() - t:.1f} s")
    with g:
        started = time.monotonic()
        g.start()
        samples: list[dict] = []

        def done() -> dict | None:
            backup, primary = view(g, Role.BACKUP), view(g, Role.PRIMARY)
            r = (backup or {}).get("resync")
            if r:
                samples.append(r)
            if r and r["state"] == "done" and (primary or {}).get("redundancy_status") == "Up":
                return r
            return None

        final = _wait(g, f"the backup's {kind} resync", done, START_TIMEOUT_S)
        wall_s = time.monotonic() - started
        for role in (Role.PRIMARY, Role.BACKUP):  # where the seconds went: the nodes' own account, timestamped
            for line in steps(g.dir / f"{role.value}.log"):
                log(f"    {role.value}: {line}")
    if final["kind"] != kind:
        raise RuntimeError(f"expected a {kind} resync, the backup did a {final['kind']} one")
    seconds = final["elapsed_ms"] / 1000
    running = [s for s in samples if s["state"] == "running"]
    # A link that broke mid-resync starts the catch-up over: its elapsed time starts again from 0.
    restarts = sum(1 for a, b in zip(samples, samples[1:]) if b["elapsed_ms"] < a["elapsed_ms"])
    out = {"kind": kind, "messages": messages, "payload_bytes": payload_bytes, "ops": final["ops_done"],
           "bytes": final["bytes_done"], "seconds": seconds, "msg_per_s": messages / seconds,
           "mb_per_s": final["bytes_done"] / seconds / 1e6, "wall_s": wall_s, "progress_samples": len(running),
           "restarts": restarts}
    log(f"  resync {kind}: {messages:,} messages ({final['ops_done']:,} ops, {final['bytes_done'] / 1e6:,.0f} MB) "
        f"in {seconds:.2f} s = {out['msg_per_s']:,.0f} msg/s, {out['mb_per_s']:,.1f} MB/s; group start → "
        f"redundancy Up {wall_s:.2f} s; {len(running)} progress samples while running; {restarts} restart(s) "
        "(a link that broke mid-resync: the rate counts the last attempt only)")
    return out

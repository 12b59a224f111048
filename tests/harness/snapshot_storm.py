"""A standby's snapshot storm, run as its own process: `python -m tests.harness.snapshot_storm DIR INSTALLS SEED`.

The load (docs/reliability.md, "Findings"): with the active's disk full, its failed commits keep
restarting the mate link and the standby installs full snapshots back to back, which must not end in
a crash (once a SIGSEGV in libsqlite3). This replays that load in one process, on real spools and loopback
sockets: an active (a spool and its writer) and a standby that is a real `BrokerService` (its
`replace_spool`, writer taps and all). The link is cut at random moments -- inside a snapshot batch,
between batches, during the install -- and the standby is made to diverge again after each install
(a stale op of its own, as the rolled-back tail of a full-disk active leaves it), so every new link
is another full snapshot. It runs until the standby installed INSTALLS snapshots and as many cuts
landed while it was catching up (inside a snapshot), whatever the machine's speed (capped at
MAX_STORM_S: then it fails, saying so).

A native crash kills the process (faulthandler prints every thread's stack to stderr); a clean run
ends with the standby in step with the active and prints one JSON line: the counts, the ERROR records
logged (the standby's disk is fine, so applying must never fail: before the fix, threads orphaned by a
cut raced the next link's builder -- FileNotFoundError, "disk I/O error"), and whether the two spools'
states are equal. The pytest side is tests/processes/test_snapshot_storm.py.
"""

from __future__ import annotations

import asyncio
import faulthandler
import json
import logging
import os
import random
import sys
from pathlib import Path

from pairmq.appliance.broker.service import BrokerService
from pairmq.appliance.errors import LocalProtocolError
from pairmq.appliance.roles import Role
from pairmq.appliance.spool import ops as o
from pairmq.appliance.spool.errors import SpoolBusy, SpoolFull
from pairmq.appliance.spool.local import LocalSpool
from pairmq.appliance.spool.store import Spool
from pairmq.mate_link.service import ActiveReplication, StandbyReplication
from tests.harness.group import LOOPBACK

SECRET, GROUP, EPOCH = os.urandom(32), "storm-1", 4
MAX_STORM_S = 240
MESSAGES = 1_500  # ~3 MB of bodies: a snapshot of three or four 1 MB batches, each one add() in a thread


def _body(msg_id: int) -> o.MessageStored:
    return o.MessageStored(msg_id, f"plant/{msg_id % 17}", os.urandom(2_000), 1, False, b"", 0, "pub", msg_id)


async def _moment(check, timeout_s: float = 2.0) -> bool:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not check():
        if asyncio.get_running_loop().time() > deadline:
            return False
        await asyncio.sleep(0.005)
    return True


async def _until(what: str, check, timeout_s: float) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


class _ErrorCount(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.seen: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.seen.append(record.getMessage()[:300])


def _diverge(broker: BrokerService, n: int) -> bool:
    """A stale op of the standby's own (as a rolled-back tail leaves it): the next link must snapshot."""
    try:
        broker.writer.submit([o.SessionOpened(f"stale-{n}", 5, 60, n)], EPOCH)
        return True
    except (LocalProtocolError, SpoolBusy, SpoolFull):  # the writer is being replaced: the next cut diverges
        return False


async def storm(directory: Path, installs: int, seed: int) -> dict:
    rng = random.Random(seed)
    active_spool = LocalSpool(directory / "active")
    spool, writer = active_spool.spool, active_spool.writer

    ops = [o.SessionOpened("fleet", 5, 3600, 1)]
    for i in range(1, MESSAGES + 1):
        ops += [_body(i), o.MessageQueued("fleet", i, 1, False)]
        if len(ops) >= 2_000:
            await writer.submit_async(ops, EPOCH).future
            ops = []
    await writer.submit_async(ops, EPOCH).future

    standby_port = BrokerService.open(directory / "standby", epoch=lambda: EPOCH, serving=lambda: False)
    host = LOOPBACK[Role.PRIMARY]
    active = ActiveReplication(secret=SECRET, group=GROUP, me=Role.PRIMARY, spool=active_spool, epoch=lambda: EPOCH,
                               may_serve=lambda: True)
    await active.start(host, 0)
    standby = StandbyReplication(secret=SECRET, group=GROUP, me=Role.BACKUP, spool=standby_port.local,
                                 active_address=lambda: (host, active.bound_port), incarnation=1,
                                 highest_epoch=lambda: EPOCH - 1, incoming_dir=directory / "standby.incoming",
                                 redial_s=0.01)
    errors = _ErrorCount()
    logging.getLogger().addHandler(errors)  # the standby's disk is fine: it must never fail to apply
    _diverge(standby_port, 0)
    await standby.start()
    loop = asyncio.get_running_loop()
    started, cuts, mid_snapshot, stalls, live, n = loop.time(), 0, 0, 0, MESSAGES, 0

    while standby.snapshots_installed < installs or mid_snapshot < installs:
        if loop.time() - started > MAX_STORM_S:
            raise AssertionError(f"the storm ran {MAX_STORM_S} s: {standby.snapshots_installed} installs, "
                                 f"{mid_snapshot} cuts inside a snapshot of {cuts} (wanted {installs} of each)")
        # Each round waits for its moment rather than for a time, so a slow machine slows the storm, not its
        # mix: a third of the rounds cut inside a snapshot being built, a third right after an install, a third
        # at a random moment.
        links, installed, mode = standby.links_made, standby.snapshots_installed, rng.randrange(3)
        # A moment may never come: a stale op can land in the old writer just before a snapshot replaces it,
        # and then the next link is not a snapshot. The round then just cuts and diverges again.
        if mode == 0:
            stalls += not await _moment(lambda: standby.links_made > links and standby.link.resyncing)
        elif mode == 1:
            stalls += not await _moment(lambda: standby.snapshots_installed > installed)
        await asyncio.sleep(rng.uniform(0.0, 0.05 if mode < 2 else 0.15))  # mode 2: any moment (the first SIGSEGVs)
        if rng.random() < 0.3:  # the active moves on meanwhile
            live += 1
            writer.submit([_body(live), o.MessageQueued("fleet", live, 1, False)], EPOCH)
        if active.conn is not None and not active.conn.closed:
            mid_snapshot += standby.link is not None and standby.link.resyncing
            active.conn.close("storm: cut")
            cuts += 1
        n += 1
        _diverge(standby_port, n)
    installs_in_storm, storm_s = standby.snapshots_installed, loop.time() - started

    # Quiet: one more link must install a last snapshot and follow the active to its head.
    await writer.submit_async([_body(live + 1), o.MessageQueued("fleet", live + 1, 1, False)], EPOCH).future
    await _until("the standby in step after the storm",
                 lambda: active.caught_up_now() and active.acked_seq == writer.durable.seq, 60)
    mine, theirs = spool.load_state(), standby_port.spool.load_state()
    await standby.stop()
    await active.stop()
    standby_port.spool.close()
    spool.close()
    reopened = Spool.open(directory / "standby")  # its checkpoint and every record after it, verified again
    reopened_state = reopened.load_state()
    reopened.close()
    return {"storm_s": round(storm_s, 1), "seed": seed, "cuts": cuts, "cuts_mid_snapshot": mid_snapshot, "stalls": stalls,
            "links": standby.links_made,
            "installs": standby.snapshots_installed, "installs_in_storm": installs_in_storm,
            "bad_ops": standby.counters["bad_ops"], "errors": errors.seen, "head": mine.head.seq,
            "equal": _summary(mine) == _summary(theirs), "equal_after_reopen": _summary(mine) == _summary(reopened_state),
            "stale_sessions": sorted(c for c in theirs.sessions if c.startswith("stale"))}


def _summary(state) -> tuple:
    """What must agree (a snapshot renumbers queue entries' `order`, so whole states are not compared)."""
    return (state.head, sorted(state.sessions), {c: [e.msg_id for e in s.queue] for c, s in state.sessions.items()},
            {i: (m.topic, m.payload) for i, m in state.messages.items()})


def main() -> None:
    faulthandler.enable()  # a native crash prints every thread's stack: which thread held the file
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    directory, installs, seed = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    print(json.dumps(asyncio.run(storm(directory, installs, seed))), flush=True)


if __name__ == "__main__":
    main()

"""The mate link on real spools and loopback sockets (mate_link/service.py), in one process.

An active and a standby, each with its own spool (segment files) and writer; the test writes ops on the
active and reads the standby's spool back. No broker, no quorum: `may_serve` and the active's
address are given.
"""

from __future__ import annotations

import asyncio
import functools
import os
import types
from pathlib import Path

from pairmq.appliance.roles import Role
from pairmq.appliance.spool import ops as o
from pairmq.appliance.spool.chain import GENESIS
from pairmq.appliance.spool.local import LocalSpool
from pairmq.appliance.spool.records import make_commit
from pairmq.mate_link.messages import Ack, Catchup, Ops, Plan
from pairmq.mate_link.secure import ActiveHandshake
from pairmq.mate_link.service import ActiveReplication, StandbyReplication
from tests.unit.test_mate_link_transport import End, port_of
from tests.unit.test_spool_store import EVERY_OP, body

SECRET, GROUP = os.urandom(32), "plant-7"


def in_a_loop(test):
    @functools.wraps(test)
    def run(tmp_path):
        asyncio.run(asyncio.wait_for(test(tmp_path), 60))
    return run


class Port(LocalSpool):
    """A node's spool and writer, as the mate link sees them; counts the full resyncs swapped in."""

    def __init__(self, directory: Path) -> None:
        super().__init__(directory)
        self.replaced = 0

    def replace_spool(self, builder) -> None:
        super().replace_spool(builder)
        self.replaced += 1


async def until(what: str, check, timeout_s: float = 15.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


async def group(tmp_path: Path, *, standby_secret: bytes = SECRET):
    active_port, standby_port = Port(tmp_path / "active"), Port(tmp_path / "standby")
    acked: list[int] = []
    active = ActiveReplication(secret=SECRET, group=GROUP, me=Role.PRIMARY, spool=active_port, epoch=lambda: 4,
                               may_serve=lambda: True, on_acked=acked.append)
    await active.start("127.0.0.1", 0)
    standby = StandbyReplication(secret=standby_secret, group=GROUP, me=Role.BACKUP, spool=standby_port,
                                 active_address=lambda: ("127.0.0.1", active.bound_port), incarnation=1,
                                 highest_epoch=lambda: 3, incoming_dir=tmp_path / "standby.incoming")
    return active, standby, active_port, standby_port, acked


async def write(port: Port, batches, epoch: int = 4) -> None:
    for ops in batches:
        await port.writer.submit_async(ops, epoch).future


async def stop(*things) -> None:
    for t in things:
        await t.stop() if hasattr(t, "stop") else t.close()


def state_of(port: Port):
    return port.spool.load_state()


@in_a_loop
async def test_a_standby_catches_up_then_follows_every_op_and_acks_it(tmp_path):
    active, standby, ap, sp, acked = await group(tmp_path)
    await write(ap, EVERY_OP)  # before the standby joins: an incremental catch-up
    await standby.start()
    await until("the catch-up", lambda: active.caught_up_now())
    await write(ap, [[body(50), o.MessageQueued("a", 50, 1, False)]])  # live
    head = ap.writer.durable
    await until("the live op's ack", lambda: active.acked_seq == head.seq)
    assert state_of(sp) == state_of(ap) and acked[-1] == head.seq
    assert active.links_made == standby.links_made == 1
    await stop(standby, active, ap, sp)


@in_a_loop
async def test_a_diverged_standby_is_rebuilt_from_a_snapshot(tmp_path):
    active, standby, ap, sp, _ = await group(tmp_path)
    await write(ap, EVERY_OP)
    await write(sp, [[o.SessionOpened("stale", 5, 60, 1)]], epoch=3)  # a tail the active never had
    await standby.start()
    await until("the snapshot", lambda: sp.replaced == 1 and active.caught_up_now())
    await write(ap, [[body(60), o.MessageQueued("a", 60, 2, False)]])
    await until("the live op's ack", lambda: active.acked_seq == ap.writer.durable.seq)
    mine, theirs = state_of(ap), state_of(sp)
    assert "stale" not in theirs.sessions and theirs.head == mine.head
    assert [e.msg_id for e in theirs.sessions["a"].queue] == [e.msg_id for e in mine.sessions["a"].queue]
    await stop(standby, active, ap, sp)


@in_a_loop
async def test_a_cut_link_is_redialled_and_resumes_from_the_standbys_head(tmp_path):
    active, standby, ap, sp, _ = await group(tmp_path)
    await standby.start()
    await write(ap, EVERY_OP[:5])
    await until("the first link", lambda: active.caught_up_now() and active.acked_seq == ap.writer.durable.seq)
    active.conn.close("test: cut")
    await write(ap, EVERY_OP[5:])  # while the link is down
    await until("the second link", lambda: standby.links_made == 2 and active.caught_up_now()
                and active.acked_seq == ap.writer.durable.seq)
    assert state_of(sp) == state_of(ap) and sp.replaced == 0, "incremental, not a snapshot"
    await stop(standby, active, ap, sp)


@in_a_loop
async def test_a_standby_without_the_secret_gets_nothing(tmp_path):
    active, standby, ap, sp, _ = await group(tmp_path, standby_secret=os.urandom(32))
    await write(ap, EVERY_OP)
    await standby.start()
    await until("a refusal", lambda: standby.counters["bad_proof"] >= 1)
    assert active.link is None and state_of(sp).sessions == {}
    await stop(standby, active, ap, sp)


class Recorder:
    """A client connection as the broker service sees one: it records what it is sent."""

    def __init__(self) -> None:
        self.sent: list = []
        self.closed = None

    def send_nowait(self, packet) -> None:
        self.sent.append(packet)

    def close_with(self, reason: int, why: str) -> None:
        self.closed = (reason, why)


def broker_port(directory: Path, **kw):
    from pairmq.appliance.broker.service import BrokerService

    return BrokerService.open(directory, epoch=lambda: 4, **kw)


@in_a_loop
async def test_a_puback_waits_for_the_standbys_ack_and_the_standby_can_take_over_the_session(tmp_path):
    """The release rule on a real broker service: nothing a client is told runs ahead of the standby's ack;
    the standby's spool then rebuilds the same session (what a takeover does)."""
    from pairmq.appliance.mqtt import codec
    from pairmq.appliance.mqtt.properties import PropertyId as P

    release = types.SimpleNamespace(allows=lambda seq: seq <= active.acked_seq)  # the rule with an in-sync mate
    ap, sp = broker_port(tmp_path / "active", release=release), broker_port(tmp_path / "standby")
    active = ActiveReplication(secret=SECRET, group=GROUP, me=Role.PRIMARY, spool=ap.local, epoch=lambda: 4,
                               may_serve=lambda: True, on_acked=lambda seq: ap.release_held())
    await active.start("127.0.0.1", 0)
    standby = StandbyReplication(secret=SECRET, group=GROUP, me=Role.BACKUP, spool=sp.local,
                                 active_address=lambda: ("127.0.0.1", active.bound_port), incarnation=1,
                                 highest_epoch=lambda: 3, incoming_dir=tmp_path / "standby.incoming")
    sub, pub = Recorder(), Recorder()
    persistent = {P.SESSION_EXPIRY_INTERVAL: 3600}
    s = ap.connect(sub, codec.Connect(5, "fleet", False, 60, None, None, None, persistent))
    ap.packet(s, codec.Subscribe(1, (codec.Subscription("cars/+/door", 1),), {}))
    p = ap.connect(pub, codec.Connect(5, "car-7", True, 60, None, None, None, {}))
    ap.lost(s)  # the subscriber goes offline: its message waits in its queue
    ap.packet(p, codec.Publish("cars/7/door", b"open", qos=1, packet_id=9))
    await until("the commits", lambda: ap.held_commits > 0 and ap.writer.pending_ops == 0)
    await asyncio.sleep(0.2)
    assert not any(isinstance(x, codec.Puback) for x in pub.sent), "no PUBACK before the standby has the message"
    assert [type(x) for x in pub.sent] == [codec.Connack], "only a clean session's CONNACK (nothing to replicate)"
    assert sub.sent == [], "a persistent session's CONNACK waits for the standby too"

    await standby.start()
    await until("the PUBACK", lambda: codec.Puback(9) in pub.sent)
    assert ap.held_commits == 0 and active.acked_seq >= 1

    await standby.stop()
    sp.rebuild_core()  # the standby takes activity
    fleet = sp.core.sessions["fleet"]
    assert [sp.core.router.messages[e.msg_id].payload for e in fleet.queue] == [b"open"]
    assert "cars/+/door" in fleet.subscriptions
    await stop(active, ap, sp)


@in_a_loop
async def test_a_standbys_broker_core_is_inert_until_it_serves(tmp_path):
    """Session expiry, delayed wills and message expiry run only on the serving node: a standby's stale core
    must not write its own ops into the spool the mate link keeps."""
    before = Port(tmp_path / "spool")
    await write(before, [[o.SessionOpened("gone", 5, 1, 1000), o.SessionDisconnected("gone", 1000, 1)]])
    before.close()
    serving = False
    broker = broker_port(tmp_path / "spool", serving=lambda: serving)
    await broker.start()
    await asyncio.sleep(1.3)  # past one tick
    assert "gone" in broker.core.sessions and broker.writer.metrics().ops == 0, "a standby expired a session"
    serving = True
    await until("the expiry on the serving node", lambda: "gone" not in broker.core.sessions)
    await until("its op", lambda: broker.writer.metrics().ops > 0)
    await broker.stop()


class _SwallowsOneCancel(StandbyReplication):
    """Python 3.11's `asyncio.wait_for` returns the connect's outcome, not CancelledError, when the cancel
    lands as the connect completes (gh-86296): the dialler's loop sees an OSError and carries on."""

    swallowed = 0

    async def _one_link(self, loop, address) -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            if self.swallowed:
                raise
            self.swallowed += 1
            raise OSError("connection refused, reported instead of the cancellation") from None


@in_a_loop
async def test_stopping_the_standby_ends_its_dialler_even_when_a_cancellation_is_swallowed(tmp_path):
    """Found by tests/netns/test_replication_faults.py: the backup took activity but never served (its take-over
    awaited the standby dialler's stop, whose one cancel the 3.11 wait_for had swallowed)."""
    port = Port(tmp_path / "standby")
    standby = _SwallowsOneCancel(secret=SECRET, group=GROUP, me=Role.BACKUP, spool=port,
                                 active_address=lambda: ("127.0.0.1", 9), incarnation=1, highest_epoch=lambda: 3,
                                 incoming_dir=tmp_path / "standby.incoming")
    await standby.start()
    await asyncio.sleep(0.05)
    await asyncio.wait_for(standby.stop(), 5)
    assert standby.swallowed == 1 and standby._task.done()
    port.close()


@in_a_loop
async def test_a_catch_up_runs_with_a_short_gil_switch_interval_then_the_usual_one_is_back(tmp_path):
    """mate_link/service.py _catching_up: the process's interval is CATCHUP_SWITCH_S only while the standby is
    behind, and whatever it was before once it caught up (here the test's own, set to tell them apart)."""
    import sys

    from pairmq.mate_link.service import CATCHUP_SWITCH_S

    usual = sys.getswitchinterval()
    sys.setswitchinterval(0.004)
    try:
        active, standby, ap, sp, acked = await group(tmp_path)
        await write(ap, [[body(i), o.MessageQueued("a", i, 1, False)] for i in range(1, 3_001)])
        seen = set()
        await standby.start()
        while not active.caught_up_now():
            seen.add(sys.getswitchinterval())
            await asyncio.sleep(0.001)
        await until("the usual interval back", lambda: sys.getswitchinterval() == 0.004)
        assert CATCHUP_SWITCH_S in seen
        await write(ap, [[body(5_000), o.MessageQueued("a", 5_000, 1, False)]])  # live: no change
        await until("the live op's ack", lambda: active.acked_seq == ap.writer.durable.seq)
        assert sys.getswitchinterval() == 0.004
        await stop(standby, active, ap, sp)
    finally:
        sys.setswitchinterval(usual)


@in_a_loop
async def test_a_standby_stopped_in_the_middle_of_a_catch_up_leaves_the_usual_switch_interval(tmp_path):
    """A node that takes over stops its standby end, maybe mid catch-up: it must not serve at the short interval."""
    import sys

    from pairmq.mate_link.service import CATCHUP_SWITCH_S

    usual = sys.getswitchinterval()
    sys.setswitchinterval(0.004)
    try:
        active, standby, ap, sp, acked = await group(tmp_path)
        await write(ap, [[body(i), o.MessageQueued("a", i, 1, False)] for i in range(1, 5_001)])
        await standby.start()
        await until("the catch-up under way", lambda: sys.getswitchinterval() == CATCHUP_SWITCH_S, timeout_s=10)
        assert not active.caught_up_now()
        await standby.stop()
        assert sys.getswitchinterval() == 0.004
        await stop(active, ap, sp)
    finally:
        sys.setswitchinterval(usual)


@in_a_loop
async def test_an_op_that_chains_but_does_not_decode_is_refused_unwritten_and_unacknowledged(tmp_path):
    """An active (it holds the secret) ships a commit whose chain is sound but whose op is not an op: the standby
    refuses it before its writer sees it (counted `bad_ops`), closes the link, and never acknowledges it."""
    forged = End(ActiveHandshake(SECRET, GROUP, Role.PRIMARY, os.urandom(32)))
    server = await asyncio.get_running_loop().create_server(lambda: forged.conn, "127.0.0.1", 0)
    sp = Port(tmp_path / "standby")
    standby = StandbyReplication(secret=SECRET, group=GROUP, me=Role.BACKUP, spool=sp,
                                 active_address=lambda: ("127.0.0.1", port_of(server)), incarnation=1,
                                 highest_epoch=lambda: 3, incoming_dir=tmp_path / "standby.incoming")
    await standby.start()
    await asyncio.wait_for(forged.established.wait(), 10)
    join = await asyncio.wait_for(forged.received.get(), 10)
    assert join.head == GENESIS
    bad = make_commit(GENESIS, 4, [b"\xff" * 12])  # framed, CRC'd and chained: only the op itself is wrong
    forged.conn.send([Plan(4, Catchup.IN_STEP, 0, GENESIS), Ops(4, (bad,))])
    why = await asyncio.wait_for(forged.ended, 10)
    assert "connection" in why  # the standby cut it
    assert standby.counters["bad_ops"] == 1 and sp.writer.head == GENESIS and sp.writer.pending_ops == 0
    heard = [forged.received.get_nowait() for _ in range(forged.received.qsize())]
    assert not any(isinstance(m, Ack) for m in heard), heard
    server.close()
    await stop(standby, sp)

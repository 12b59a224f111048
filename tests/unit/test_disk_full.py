"""A full disk under the broker (docs/reliability.md, "Findings"), on real tmpfs file systems.

- Order: a QoS 2 PUBLISH the broker reads after the spool writer rolled a full-disk batch back, but before
  the broker loop has heard of the rollback, must not be stored ahead of the rolled-back earlier message
  its publisher resends. The listener and broker service run in this process on a real spool in a small
  tmpfs, with a raw MQTT publisher and a paho subscriber over loopback; the one thing the test does by
  hand is the timing the nemesis needed luck for: it holds the event loop from the instant the writer
  starts its failing commit until it has rolled back, frees the space, and hands the broker the next
  PUBLISH of that publisher then (what the connection does on a read), so the read falls in the window.
- The spool on a full disk: a group commit, a new segment or a checkpoint that does not fit fails with
  nothing of it left in the files (`SpoolFull` for a commit), and everything works again once space returns.
- Quorum state: a node whose data file system is full keeps running (tests/processes/test_disk_full_node.py).
"""

from __future__ import annotations

import errno
import queue
import struct
import subprocess
import sys
import textwrap
import threading
import time

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from pairmq.appliance.mqtt.publish import Publish
from pairmq.appliance.roles import Role
from pairmq.appliance.spool import ops as o
from pairmq.appliance.spool.errors import SpoolFull
from pairmq.appliance.spool.store import Spool
from pairmq.appliance.spool.writer import SpoolWriter
from tests.harness.commit_gate import CommitGate
from tests.harness.group import REPO
from tests.harness.mqttraw import PUBCOMP, PUBREC, PUBREL, V5, Raw, encode_props, utf8
from tests.unit.test_mqtt_listener import HOST
from tests.unit.test_mqtt_listener_overload import Node
from tests.harness.tmpfs import small_disks

P, B, M = Role.PRIMARY, Role.BACKUP, Role.MONITOR
TOPIC = "order/x"
BIG = 400_000  # the first message: its commit needs more space than the full disk has left


@pytest.fixture
def tiny_fs(tmp_path):
    with small_disks([tmp_path / "tiny"], "4m") as (mount_point,):
        yield mount_point


def fill(path) -> int:
    written = 0
    with open(path, "wb", buffering=0) as f:  # unbuffered: ENOSPC shows in write, never in close
        try:
            while True:
                written += f.write(b"\0" * 65536)
        except OSError:
            pass
    return written


def paho_subscriber(port: int) -> tuple[mqtt.Client, queue.Queue]:
    got: queue.Queue = queue.Queue()
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="sub", protocol=mqtt.MQTTv5)
    c.on_message = lambda cl, ud, msg: got.put(msg.payload[:1])
    connected = threading.Event()
    c.on_connect = lambda cl, ud, flags, rc, props: connected.set() if rc == 0 else None
    props = Properties(PacketTypes.CONNECT)
    props.SessionExpiryInterval = 3600
    c.connect(HOST, port, keepalive=30, clean_start=False, properties=props)
    c.loop_start()
    assert connected.wait(5), "the subscriber got no CONNACK"
    return c, got


def resend_qos2(pub: Raw, packet_id: int, payload: bytes) -> None:
    """What a client does for an unacknowledged QoS 2 PUBLISH after reconnecting: DUP, then PUBREL/PUBCOMP."""
    pub.send(0x30 | 0x08 | (2 << 1), utf8(TOPIC) + struct.pack("!H", packet_id) + encode_props([]) + payload)
    rec = pub.expect(PUBREC)
    assert rec.reason_and_props()[0] == 0, f"PUBREC {packet_id}: reason {rec.reason_and_props()[0]:#x}"
    pub.ack(PUBREL, packet_id)
    pub.expect(PUBCOMP)


@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
def test_a_publish_read_after_a_rolled_back_commit_does_not_overtake_the_resent_earlier_one(tiny_fs, loop_kind):
    node = Node(tiny_fs, with_broker=True, loop_kind=loop_kind)
    broker, ballast = node.broker, tiny_fs / "ballast"
    gate = None
    try:
        sub, got = paho_subscriber(node.port)
        assert sub.subscribe(TOPIC, qos=2)[0] == mqtt.MQTT_ERR_SUCCESS
        time.sleep(0.3)  # the SUBACK: the session's subscription is durable
        sub.disconnect()
        sub.loop_stop()

        pub = Raw(V5, host=HOST, port=node.port)
        assert pub.connect("pub", clean=False, properties=[(0x11, 3600)]).reason_and_props()[0] == 0
        gate = CommitGate(broker.spool)  # the writer's next commit waits at the gate until the disk is full
        gate.close()
        pub.publish(TOPIC, b"1" * BIG, qos=2, packet_id=1)
        deadline = time.monotonic() + 5
        while node.loop.call(lambda: broker.writer.pending_ops) == 0:
            assert time.monotonic() < deadline, "message 1 never reached the spool writer"
            time.sleep(0.01)
        fill(ballast)  # the disk is full: message 1's commit will fail when the lock goes

        held, outcome = threading.Event(), {}

        def read_in_the_window():  # on the event loop, which it holds until the rollback is over
            held.set()
            stop = time.monotonic() + 10
            while broker.writer.metrics().failed_batches == 0 and time.monotonic() < stop:
                time.sleep(0.005)
            outcome["rolled_back"] = broker.writer.metrics().failed_batches
            ballast.unlink()  # space is back before message 2 reaches the writer
            conn_id = max(broker.conns)  # the publisher's: the latest connection
            broker.packet(conn_id, Publish(TOPIC, b"2", qos=2, packet_id=2))
            outcome["read"] = conn_id

        node.loop.loop.call_soon_threadsafe(read_in_the_window)
        assert held.wait(5)
        gate.open()
        assert pub.closed(), "the publisher was not dropped after the failed commit"
        seen = node.loop.call(lambda: dict(outcome))
        assert seen.get("rolled_back") == 1 and "read" in seen, f"the window was not hit as planned: {seen}"

        pub = Raw(V5, host=HOST, port=node.port)
        assert pub.connect("pub", clean=False, properties=[(0x11, 3600)]).reason_and_props()[0] == 0
        resend_qos2(pub, 1, b"1" * BIG)
        resend_qos2(pub, 2, b"2")
        pub.disconnect()
        view = node.loop.call(broker.view)
        assert view["counters"]["commit_failures"] >= 1 and view["writer"]["failed_batches"] == 1, view

        # What a restart (or the standby, which holds the same ops) rebuilds from is the spool: the broker
        # restarts on it and the subscriber resumes its session there.
        node.close()
        node = Node(tiny_fs, with_broker=True, loop_kind=loop_kind)
        sub, got = paho_subscriber(node.port)
        received = []
        deadline = time.monotonic() + 10
        while len(set(received)) < 2 and time.monotonic() < deadline:
            try:
                received.append(got.get(timeout=0.2))
            except queue.Empty:
                pass
        sub.disconnect()
        sub.loop_stop()
        firsts = [m for i, m in enumerate(received) if m not in received[:i]]
        assert firsts == [b"1", b"2"] and len(received) == 2, (
            f"after the restart the subscriber got {received}: message 2, read after message 1's commit was "
            "rolled back, was stored ahead of message 1's resend (or twice)")
    finally:
        if gate is not None:
            gate.open()
        ballast.unlink(missing_ok=True)
        node.close()


# --- the spool itself on a full disk: the writer refuses, the files are cut back, space returns -------------

def stored(msg_id: int, size: int) -> o.MessageStored:
    return o.MessageStored(msg_id, TOPIC, b"m" * size, 1, False, b"", 0, "pub", 1)


def queued(msg_id: int) -> o.MessageQueued:
    return o.MessageQueued("sub", msg_id, 1, False)


def spool_files(directory) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in sorted(directory.iterdir()) if p.name != "spool.lock"}


def test_a_full_disk_fails_the_commit_with_spool_full_cuts_the_segment_back_and_recovers(tiny_fs):
    directory, ballast = tiny_fs / "spool", tiny_fs / "ballast"
    with Spool.open(directory) as spool, SpoolWriter(spool) as writer:
        writer.submit([o.SessionOpened("sub", 5, 3600, 1)], 1).future.result(5)
        before = spool_files(directory)
        fill(ballast)
        failed = writer.submit([stored(1, BIG), queued(1)], 1)
        behind = writer.submit([o.MessageIdSeen("pub", "m", 1)], 1)  # chained on the failing ops
        with pytest.raises(SpoolFull, match="the disk is full"):
            failed.future.result(5)
        with pytest.raises(SpoolFull):
            behind.future.result(5)
        assert spool_files(directory) == before, "the failed write was not cut back off the segment"
        assert writer.head == writer.durable and writer.durable.seq == 1
        assert writer.metrics().failed_batches == 1 and writer.metrics().stored_bytes == 0
        with pytest.raises(SpoolFull, match="the disk is full"):  # still full: refused again, no crash
            writer.submit([stored(2, BIG), queued(2)], 1).future.result(5)
        ballast.unlink()
        done = writer.submit([stored(3, BIG), queued(3)], 1).future.result(5)
        assert [(c.first_seq, c.last_seq) for c in done] == [(2, 3)], "the rolled-back seqs are given again"
        assert [c.last_seq for c in spool.read_commits(0, 100)] == [1, 3]
    (ckpt,) = directory.glob("*.ckpt")
    ckpt.unlink()  # replayed from the log alone, as after a crash before any checkpoint
    with Spool.open(directory) as again:
        state = again.load_state()
    assert set(state.messages) == {3} and [q.msg_id for q in state.sessions["sub"].queue] == [3]


def test_a_new_segment_that_cannot_be_made_on_a_full_disk_refuses_the_commit_and_leaves_nothing(tiny_fs):
    directory, ballast = tiny_fs / "spool", tiny_fs / "ballast"
    with Spool.open(directory, segment_bytes=4096) as spool, SpoolWriter(spool) as writer:
        writer.submit([o.SessionOpened("sub", 5, 3600, 1), stored(1, 5000), queued(1)], 1).future.result(5)
        before = spool_files(directory)
        assert len([n for n in before if n.endswith(".seg")]) == 1  # full: the next commit needs a new one
        fill(ballast)
        with pytest.raises(SpoolFull, match="the disk is full"):
            writer.submit([o.MessageAcked("sub", 1)], 1).future.result(5)
        assert spool_files(directory) == before, "a half-made segment (or its .new) was left behind"
        ballast.unlink()
        writer.submit([o.MessageAcked("sub", 1)], 1).future.result(5)
        assert len(spool.log.segment_list()) == 2
    with Spool.open(directory) as again:
        state = again.load_state()
    assert state.head.seq == 4 and state.messages == {} and state.sessions["sub"].queue == ()


def test_a_checkpoint_that_cannot_be_written_on_a_full_disk_changes_nothing(tiny_fs):
    directory, ballast = tiny_fs / "spool", tiny_fs / "ballast"
    spool = Spool.open(directory)
    with SpoolWriter(spool) as writer:
        writer.submit([o.SessionOpened("sub", 5, 3600, 1), stored(1, BIG), queued(1)], 1).future.result(5)
    first = spool.write_checkpoint()
    with SpoolWriter(spool) as writer:
        writer.submit([stored(2, BIG), queued(2)], 1).future.result(5)
        before = spool_files(directory)
        fill(ballast)
        with pytest.raises(OSError) as failed:
            spool.write_checkpoint()
        assert failed.value.errno == errno.ENOSPC
        assert spool_files(directory) == before and spool.checkpoint == first, "a failed checkpoint left a trace"
    spool.close()  # its checkpoint fails too: warned, and the next open replays the log after the old one
    assert spool_files(directory) == before
    ballast.unlink()
    with Spool.open(directory) as again:
        assert again.checkpoint == first
        state = again.load_state()
    assert set(state.messages) == {1, 2} and state.head.seq == 5
    assert len(list(directory.glob("*.ckpt"))) == 1 and not list(directory.glob("*.new"))  # close wrote one now


# --- rule R8 on the deterministic simulator: a quorum state that cannot be saved is not acted on ------------

def _started_sim():
    from tests.harness.simulator import Simulation
    sim = Simulation(11)
    sim.run_until(2_000)
    assert sim.serving() == [P]
    return sim


@pytest.mark.parametrize("failing", [B, M], ids=["backup cannot save its bid", "monitor cannot save its vote"])
def test_a_node_that_cannot_save_its_quorum_state_neither_bids_nor_votes_nor_crashes(failing):
    sim = _started_sim()
    voted_before = sim.core(failing).state.voted_epoch  # epoch 1's vote, if this node's was the one the primary got
    assert voted_before <= 1
    sim.nodes[failing].store.failure = OSError(5, "Input/output error")
    sim.crash(P)
    sim.run_for(3_000)
    assert sim.serving() == [], "a new epoch was taken without the bid or the vote on disk"
    assert sim.core(failing) is not None, "the node stopped"
    said = sim.reasons(failing, "storage")
    assert said == [f"{failing.value}: cannot save the quorum state ([Errno 5] Input/output error) → "
                    "no bid, vote or new epoch until it can"], said
    assert sim.core(failing).state.voted_epoch == voted_before, "an unsaved vote or bid was kept in memory"

    # The disk is back and the primary restarts (the backup's in-sync lease is over by now, so without the
    # primary nobody can show it is up to date: DESIGN §3). The node carries on by itself.
    sim.nodes[failing].store.failure = None
    sim.restart(P)
    t = sim.first_serving_after(sim.t, sim.t + 5_000)
    assert t is not None and len(sim.serving()) == 1, sim.reasons(failing)
    assert sim.reasons(failing, "storage")[-1] == f"{failing.value}: the quorum state is saved again"
    assert sim.nodes[failing].store.load().voted_epoch >= 2


# --- a resync storm (a full disk on the active) must not crash the standby's snapshot builder -----------

ABANDON_MID_BATCH = textwrap.dedent("""
    import sys, threading, time
    from pathlib import Path
    from pairmq.appliance.spool import ops as o
    from pairmq.appliance.spool.codec import encode_op
    from pairmq.appliance.spool.install import SnapshotBuilder

    directory = Path(sys.argv[1])
    bodies = [encode_op(o.MessageIdSeen("c", f"id-{i}", i)) for i in range(20_000)]
    timing = SnapshotBuilder(directory / "timing")
    started = time.monotonic()
    timing.add(bodies)
    batch_s = time.monotonic() - started  # this machine's batch now: the abandons below spread over it
    timing.abandon()
    outcomes = set()
    for attempt in range(30):
        builder = SnapshotBuilder(directory / f"incoming-{attempt}")

        def add():  # what the mate link's worker thread runs while the link breaks
            try:
                builder.add(bodies)
                outcomes.add("added")
            except Exception as exc:
                outcomes.add(type(exc).__name__)

        worker = threading.Thread(target=add)
        worker.start()
        time.sleep(batch_s * attempt / 20)  # from early in the batch to well after it
        builder.abandon()
        worker.join()
    print(sorted(outcomes))
""")


def test_abandoning_a_snapshot_build_while_a_thread_adds_a_batch_does_not_crash(tmp_path):
    """The standby's mate link adds snapshot batches in a worker thread and abandons the build when the link
    breaks; a full disk on the active breaks it over and over. Closing the file under a running batch must
    give the batch a clear error, never a crash of the process (it once was a segfault in SQLite)."""
    child = subprocess.run([sys.executable, "-c", ABANDON_MID_BATCH, str(tmp_path)], capture_output=True, text=True,
                           cwd=REPO, timeout=300)
    assert child.returncode == 0, f"the builder crashed (rc {child.returncode}):\n{child.stderr[-2000:]}"
    assert "added" in child.stdout, child.stdout  # some batches finished before the abandon


# --- the mate link after a rollback (a full disk on the active) -------------------------------------

def test_a_catch_up_after_a_rollback_does_not_ship_the_rolled_back_ops():
    """The standby is ahead (its tail diverged), so the active plans a snapshot; while the snapshot is read a
    submission gets seq 4 and its commit fails on the full disk (rolled back to op 3). The catch-up after
    the snapshot must not bridge with the rolled-back op 4, and the next submission, which reuses seq 4,
    must ship; shipping the stale op 4 would fail `local_submitted`'s assertion (4, 4)."""
    from pairmq.appliance.spool.chain import GENESIS
    from pairmq.appliance.spool.records import make_commit, op_bodies
    from tests.harness.oplog import chained
    from pairmq.mate_link.active import ActiveLink, MakeSnapshot, Phase, PlanNeeded
    from pairmq.mate_link.messages import Ops, decode, encode
    from pairmq.mate_link.resync import plan_resync
    from pairmq.mate_link.standby import StandbyLink

    epoch = 5
    log = chained([[b"op1"], [b"op2"], [b"op3"]], epoch=epoch)
    ahead = make_commit(GENESIS, epoch - 1, [b"old%d" % i for i in range(1, 6)]).point
    active = ActiveLink(epoch, log[-1].point, 0)
    standby = StandbyLink(ahead, incarnation=3, highest_epoch=epoch - 1, now_ms=0)
    for m in standby.messages_to_send():
        active.receive(decode(encode(m)), 0)
    (need,) = [r for r in active.requests() if isinstance(r, PlanNeeded)]
    active.planned(plan_resync(GENESIS, active.head, need.standby_head, lambda seq: None))
    assert active.phase is Phase.SNAPSHOT and any(isinstance(r, MakeSnapshot) for r in active.requests())

    active.local_submitted(make_commit(log[-1].point, epoch, [b"op4-rolled-back"]))
    active.local_rolled_back(log[-1].point)
    active.snapshot_ready([b"state"], log[-1].point)
    assert active.phase is Phase.LIVE and active.shipped_seq == 3
    again = make_commit(log[-1].point, epoch, [b"op4-again"])
    active.local_submitted(again)
    shipped = [b for m in active.messages_to_send() if isinstance(m, Ops) for c in m.commits for b in op_bodies(c)]
    assert shipped == [b"op4-again"], shipped

"""The heartbeat thread with real UDP sockets: heartbeats keep time while the main thread is stuck.

The thread under test runs a real QuorumCore on an ephemeral port of
127.0.0.1; two plain UDP sockets play the peers and read the kernel's receive
timestamps, so the gaps measured are the gaps on the wire, not when this
(GIL-sharing) test got around to reading them.
"""

import socket
import struct
import time

import pytest

from pairmq.appliance.config import Timers
from pairmq.appliance.node.heartbeats import HeartbeatThread
from pairmq.appliance.quorum.auth import HeartbeatAuth
from pairmq.appliance.quorum.core import QuorumCore, Timing
from pairmq.appliance.roles import Role
from pairmq.appliance.stable_file import FileStore

SECRET = bytes(range(32))
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)  # Linux's value; Python 3.11 does not name it
SCM_TIMESTAMPNS = SO_TIMESTAMPNS
TIMERS = Timers()
BUSY_S = 1.5


def peer_socket() -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    s.setblocking(False)
    return s


def arrivals(s: socket.socket) -> list[tuple[float, bytes]]:
    out = []
    while True:
        try:
            data, ancillary, _flags, _addr = s.recvmsg(4096, 64)
        except BlockingIOError:
            return out
        stamps = [struct.unpack("qq", d[:16]) for level, kind, d in ancillary
                  if level == socket.SOL_SOCKET and kind == SCM_TIMESTAMPNS]
        if not stamps:
            pytest.fail("the kernel gave no SCM_TIMESTAMPNS receive timestamp")
        out.append((stamps[0][0] + stamps[0][1] / 1e9, data))


def heartbeat_thread(tmp_path, peers, decisions, port: int = 0) -> HeartbeatThread:
    now = time.monotonic_ns() // 1_000_000
    core = QuorumCore(Role.PRIMARY, HeartbeatAuth(SECRET, "t", Role.PRIMARY), Timing.from_timers(TIMERS),
                      FileStore(tmp_path / "quorum.json"), now)
    return HeartbeatThread(core, ("127.0.0.1", port), peers, on_decision=decisions.append, on_ready=lambda: None,
                           on_lag=lambda *a: None, on_crash=lambda exc: decisions.append(exc))


def test_heartbeats_keep_their_interval_while_the_main_thread_hogs_the_gil(tmp_path):
    backup, monitor = peer_socket(), peer_socket()
    decisions = []
    thread = heartbeat_thread(tmp_path, [backup.getsockname(), monitor.getsockname()], decisions)
    thread.start()
    try:
        began, end = time.time(), time.monotonic() + BUSY_S
        x = 0
        while time.monotonic() < end:  # a broker loop stuck in pure Python: it never yields the GIL by itself
            x += sum(i * i for i in range(1000))
        ended = time.time()
    finally:
        thread.stop()
    thirds = [began + (ended - began) * i / 3 for i in range(4)]
    for role, peer in ((Role.BACKUP, backup), (Role.MONITOR, monitor)):
        reader = HeartbeatAuth(SECRET, "t", role)  # each peer checks MACs and replays on its own
        got = arrivals(peer)
        seqs = [reader.open(data).seq for _, data in got]
        assert seqs == sorted(seqs), seqs
        # Heartbeats arrived throughout the busy spell, not only around it; how late they ran is bench/failover.py's.
        per_third = [sum(lo <= at < hi for at, _ in got) for lo, hi in zip(thirds, thirds[1:])]
        print(f"{role.value}: {len(got)} heartbeats, {per_third} in each third of the busy spell")
        assert all(per_third), f"no heartbeat in a third of the busy spell: {per_third}"
        peer.close()
    assert [d.kind for d in decisions] == ["boot"], decisions


def test_heartbeat_port_in_use_is_refused_at_start_up(tmp_path):
    taken = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    taken.bind(("127.0.0.1", 0))
    try:
        thread = heartbeat_thread(tmp_path, [], [], port=taken.getsockname()[1])
        with pytest.raises(OSError):
            thread.start()
        thread.stop()  # nothing started: stopping is a no-op, not an error
    finally:
        taken.close()


def test_the_gate_is_what_the_core_said_at_the_lock_s_last_release():
    """The MQTT gate reads `lock.gate` without the lock (heartbeats.py): published on every release, it answers
    as `may_serve` would have at that release, for any later instant; a change not yet released is not seen."""
    from pairmq.appliance.node.heartbeats import GateLock
    from pairmq.appliance.quorum.wire import Activity
    from tests.harness.simulator import Simulation

    sim = Simulation(3)
    sim.run_until(2_000)
    [active] = sim.serving()
    core, node = sim.core(active), sim.nodes[active]
    lock = GateLock(core)
    assert lock.gate == (0, 0), "nothing published yet: not serving"
    with lock:
        pass
    until, epoch = lock.gate
    assert epoch == core.active_epoch > 0
    now = node.local(sim.t)
    for t in (now, until - 1, until, until + 1):
        assert (t < until) == core.may_serve(t), t
    with lock:  # held: a reader does not wait, and sees the last published value
        assert lock.gate == (until, epoch)
    sim.isolate(active)
    sim.run_for(2 * TIMERS.lease_ms)
    assert core.activity is not Activity.ACTIVE, "the lease ran out: stepped down"
    assert lock.gate == (until, epoch), "the step-down happened outside this lock: not published by it"
    with lock:
        pass
    assert lock.gate[0] == 0, "stepped down: serving at no instant"

"""Floors of CPU per message in one process, without I/O: what the broker's and the mate link's speed goals leave
room for.

    python bench/floors.py [--messages 50000] [--catchup-messages 100000]
    python bench/floors.py --against .venv-pure/bin/python [--rounds 3]   (compiled vs pure: bench/builds.py)

core       the broker core alone (appliance/broker/core.py, sans-I/O, driven as the tests drive it) for a
           durable QoS 1 message from a 3.1.1 publisher to one persistent 3.1.1 subscriber, windows of 100:
           the PUBLISH routed, its ops (MessageRouted, the in-flight marks, the acks) made,
           encoded (spool/codec.py) and chained (spool/chain.py), the subscriber's PUBACKs taken. No MQTT
           bytes (packets are handed over decoded), no sockets, no event loop, no spool files, no mate link, no
           event log: every durable message costs at least this on the active, on the event loop.
standby    the standby's work on a catch-up, per op: OPS frames decoded (mate_link/messages.py), the
           chain verified (mate_link/standby.py), each op's record read, the op decoded and domain-checked
           (spool/received.py: what the event loop does), then applied to the spool's state in memory
           (spool/state.py: what the spool writer's thread does after its write), for the ops of queued 1 KiB
           messages (one MessageRouted each, as bench/resync.py's incremental). No sealing, no sockets, no spool
           files: a catch-up costs at least this on the standby, whose event loop and spool writer share one GIL.

CPU is time.process_time() of this process. The goals these are set against are printed beside them.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pairmq.appliance.broker.core import BrokerCore, Close, Connacked, Durable, Persist, Send  # noqa: E402
from pairmq.appliance.mqtt import codec  # noqa: E402
from pairmq.appliance.spool import ops as o  # noqa: E402
from pairmq.appliance.spool.chain import GENESIS  # noqa: E402
from pairmq.appliance.spool.records import make_commit  # noqa: E402
from pairmq.appliance.spool.codec import encode_op  # noqa: E402
from pairmq.appliance.spool.received import read_commits  # noqa: E402
from pairmq.appliance.spool.state import StateModel  # noqa: E402
from pairmq.mate_link.messages import Ops, decode, encode  # noqa: E402
from pairmq.mate_link.standby import continue_chain  # noqa: E402

WINDOW = 100
NOW = 1_700_000_000_000


class _Driver:
    """The core's effects run as the broker adapter runs them, every Persist committed at once."""

    def __init__(self) -> None:
        self.core = BrokerCore()
        self.sent: dict[int, list] = {}
        self.ops: list = []

    def run(self, effects) -> None:
        for e in effects:
            if isinstance(e, Send):
                self.sent.setdefault(e.conn, []).append(e.packet)
            elif isinstance(e, Persist):
                self.ops.extend(e.ops)
                self.run(e.then)
            elif isinstance(e, Durable):
                self.run(self.core.durable(e, NOW))
            elif isinstance(e, Connacked):
                self.run(self.core.connacked(e, NOW))
            elif isinstance(e, Close):
                raise AssertionError(f"the core closed connection {e.conn}: {e.reason}")

    def flush(self) -> None:
        self.run(self.core.flush(NOW))

    def take(self, conn: int) -> list:
        return self.sent.pop(conn, [])


def core_us(messages: int) -> tuple[float, float]:
    """(CPU µs per durable QoS 1 message through the core, ops per message)."""
    d = _Driver()
    d.run(d.core.connect(1, codec.Connect(4, "sub", False, 60, None, None, None, {}), NOW))
    d.run(d.core.packet(1, codec.Subscribe(1, (codec.Subscription("t", 1),), {}), NOW))
    d.run(d.core.connect(2, codec.Connect(4, "pub", True, 60, None, None, None, {}), NOW))
    d.flush()
    d.take(1), d.take(2)
    d.ops.clear()
    payload, head, ops_made, delivered = b"x" * 100, GENESIS, 0, 0
    started = time.process_time()
    for i in range(messages):
        d.run(d.core.packet(2, codec.Publish("t", payload, qos=1, packet_id=i % 65535 + 1), NOW))
        if i % WINDOW == WINDOW - 1:
            d.flush()
            d.take(2)
            while deliveries := [p for p in d.take(1) if isinstance(p, codec.Publish)]:  # acked as they come
                for p in deliveries:
                    d.run(d.core.packet(1, codec.Puback(p.packet_id), NOW))
                    delivered += 1
                d.flush()
            commit = make_commit(head, 1, [encode_op(op) for op in d.ops])
            head, ops_made = commit.point, ops_made + len(d.ops)
            d.ops.clear()
    elapsed = time.process_time() - started
    assert delivered == messages, f"{delivered} of {messages} delivered"
    return elapsed / messages * 1e6, ops_made / messages


def standby_us(messages: int) -> dict[str, float]:
    """CPU µs per op of each step of the standby's work on a catch-up."""
    payload, ops = os.urandom(1024), []
    for i in range(1, messages + 1):
        ops.append(o.MessageRouted(i, "bench/resync", payload, 1, False, b"", 0, "pub", NOW + i, "bench-resync-sub",
                                   1, False, ()))
    commits, head = [], GENESIS
    for i in range(0, len(ops), 100):  # a commit per window of 100 messages, as the active makes them
        commits.append(make_commit(head, 1, [encode_op(op) for op in ops[i:i + 100]]))
        head = commits[-1].point
    frames = [encode(Ops(1, tuple(commits[i:i + 10]))) for i in range(0, len(commits), 10)]
    t0 = time.process_time()
    received = [decode(f) for f in frames]
    t1 = time.process_time()
    head = GENESIS
    for m in received:
        head = continue_chain(m.commits, head, 1)
    t2 = time.process_time()
    batches = [read_commits(m.commits) for m in received]
    t3 = time.process_time()
    model = StateModel()
    model.apply(0, o.SessionOpened("bench-resync-sub", 4, 0, NOW))
    seq = 1
    for batch_ops, sizes, _ in batches:
        model.apply_all(seq, batch_ops, sizes)
        seq += len(batch_ops)
    t4 = time.process_time()
    assert model.ignored == 0 and len(model.messages) == len(ops)
    n = len(ops)
    return {"frames decoded": (t1 - t0) / n * 1e6, "chain verified": (t2 - t1) / n * 1e6,
            "records read, ops decoded and checked": (t3 - t2) / n * 1e6, "applied": (t4 - t3) / n * 1e6}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=50_000)
    ap.add_argument("--catchup-messages", type=int, default=100_000)
    ap.add_argument("--against", metavar="PYTHON", help="alternate runs under this interpreter (bench/builds.py)")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    if args.against:
        from bench.builds import compare
        compare(__file__, ["--messages", str(args.messages), "--catchup-messages", str(args.catchup_messages)],
                args.against, args.rounds,
                {"core µs/msg": r"core: ([\d.]+) µs", "standby µs/op": r"([\d.]+) µs in all"})
        return
    us, per = core_us(args.messages)
    print(f"core: {us:.1f} µs of CPU per durable QoS 1 message ({per:.2f} ops each), without MQTT bytes, sockets, "
          f"spool files, the mate link or the event loop")
    print(f"  issue 3: durable QoS 1 at 0.5x mosquitto's 60,000-80,000 msg/s, or 10x amqtt's 3,900-5,100, is "
          f"30,000-50,000 msg/s: {1e6 / 50_000:.0f}-{1e6 / 30_000:.0f} µs of CPU per message for everything, "
          "on one GIL")
    parts = standby_us(args.catchup_messages)
    total = sum(parts.values())
    print("standby: " + ", ".join(f"{k} {v:.2f}" for k, v in parts.items()) + f" µs per op; {total:.2f} µs in all")
    print(f"  1,000,000 queued messages (1,000,000 ops) at 100,000 msg/s is 10 s; this work alone "
          f"takes {1_000_000 * total / 1e6:.1f} s of the standby's CPU, before sealing, the spool files and the acks")


if __name__ == "__main__":
    main()

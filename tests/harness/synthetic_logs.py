"""Synthetic event logs in the real format (docs/events.md, the lines appliance/eventlog.py writes), the same files
for a seed: QoS 1 traffic on 50 topics from 20 publishers to 5 subscribers at RATE msg/s, the batched stage events
the broker writes (spooled, replicated, delivered, acknowledged: one line per BATCH messages each), a node_alive pulse
per node per second, a kill of the primary half way (detected 1.2 s later, the backup takes over 50 ms after), a few
busy refusals and ten malformed lines on the backup. bench/analytics.py and the analytics tests write them.
"""

from __future__ import annotations

import random
from pathlib import Path

SEGMENT_BYTES = 64 * 1024 * 1024
T0 = 1_780_000_000.0  # 2026-05-28, a fixed start: the same files every run
RATE = 5000  # messages per second
BATCH = 8  # messages per batched stage event


class Segments:
    """Closed segments of one node, rotated at SEGMENT_BYTES like the node's own log."""

    def __init__(self, directory: Path, node: str, segment_bytes: int = SEGMENT_BYTES) -> None:
        self.dir, self.node, self.seq, self.size, self.f = directory / node / "events", node, 0, 0, None
        self.segment_bytes = segment_bytes
        self.dir.mkdir(parents=True, exist_ok=True)
        self._next()

    def _next(self) -> None:
        if self.f:
            self.f.close()
        self.seq += 1
        self.f, self.size = open(self.dir / f"events-{self.node}-{self.seq:08d}.jsonl", "w"), 0

    def write(self, text: str) -> None:
        self.f.write(text)
        self.size += len(text)
        if self.size >= self.segment_bytes:
            self._next()

    def close(self) -> None:
        self.f.close()


def line(node: str, ts: float, event: str, body: str) -> str:
    return f'{{"v":2,"ts":{ts:.6f},"mono_ms":{int(ts * 1000) - 1_779_000_000_000},"node":"{node}","event":"{event}"{body}}}\n'


def generate(directory: Path, total_events: int, segment_bytes: int = SEGMENT_BYTES) -> dict:
    """About `total_events` lines under directory/<node>/events/, in closed segments of `segment_bytes`; what was
    written: events, messages and published per node."""
    rnd = random.Random(7)
    nodes = {n: Segments(directory, n, segment_bytes) for n in ("primary", "backup", "monitor")}
    per_batch = BATCH + 4  # published lines + 4 stage lines
    messages = total_events // per_batch * BATCH
    fail_at = messages // 2
    written = 0
    expected = {"published": {"primary": 0, "backup": 0}}

    def decision(node, ts, kind, epoch, reason):
        nonlocal written
        nodes[node].write(line(node, ts, "redundancy_decision",
                               f',"kind":"{kind}","epoch":{epoch},"reason":"{reason}","core_ms":{int(ts * 1000)}'))
        written += 1

    decision("primary", T0 - 1, "bid", 1, "primary: bidding")
    decision("monitor", T0 - 0.99, "vote", 1, "monitor: votes primary")
    decision("primary", T0 - 0.98, "activate", 1, "primary: activating")
    node, epoch, msg_id, second = "primary", 1, 0, -1
    i = 0
    while i < messages:
        if i >= fail_at and node == "primary":
            dead = T0 + i / RATE
            decision("backup", dead + 1.2, "bid", 2, "backup: primary silent")
            decision("monitor", dead + 1.22, "vote", 2, "monitor: votes backup")
            decision("backup", dead + 1.25, "activate", 2, "backup: activating")
            node, epoch, msg_id = "backup", 2, 0
            i += int(1.25 * RATE)  # nothing is served during the outage
            continue
        ts = T0 + i / RATE
        if int(ts) != second:
            second = int(ts)
            for n in nodes:
                serving = "true" if n == node else "false"
                nodes[n].write(line(n, ts, "node_alive", f',"serving":{serving},"epoch":{epoch}'))
                written += 1
            if rnd.random() < 0.01:
                nodes[node].write(line(node, ts, "client_refused",
                                       ',"client_id":"c","reason_code":137,"reason":"busy","protocol_version":5'))
                written += 1
        out, ids = nodes[node], []
        for k in range(BATCH):
            msg_id += 1
            ids.append(msg_id)
            t = ts + k / RATE
            out.write(line(node, t, "message_published",
                           f',"msg_id":{msg_id},"topic":"site/{msg_id % 50}/sensor","qos":1,"bytes":{100 + msg_id % 200},'
                           f'"client":"pub-{msg_id % 20}","epoch":{epoch},"retain":false,"created_ms":{int(t * 1000) - 1}'))
        id_list = ",".join(map(str, ids))
        sub = f"sub-{i // BATCH % 5}"
        for stage, lag in (("spooled", 0.002), ("replicated", 0.004 + rnd.random() * 0.003),
                           ("delivered", 0.005 + rnd.random() * 0.02), ("acknowledged", 0.03)):
            client = f',"client":"{sub}"' if stage in ("delivered", "acknowledged") else ""
            out.write(line(node, ts + lag, f"message_{stage}", f'{client},"msg_ids":[{id_list}],"epoch":{epoch}'))
        expected["published"][node] += BATCH
        written += per_batch
        i += BATCH
    for n in nodes:
        for k in range(10 if n == "backup" else 0):
            nodes[n].write('{"v":2,"ts":broken\n')
            written += 1
    for s in nodes.values():
        s.close()
    return {"events": written, "messages": sum(expected["published"].values()), **expected}

"""Planned handover benchmark: how long a host-list client is without service during a handover.

    python bench/handover.py [--handovers 20] [--write-docs]

Theory of operation
-------------------
One local group (tests/harness/group.py: real node processes on 127.0.0.1/.2/.3, default timers, holding
the shared lock on the fixed ports) runs with the primary active and the backup in sync. A QoS 1
publisher (tests/harness/hostlist.py: paho-mqtt, MQTT 5, host list primary,backup, following the Server
Reference of a DISCONNECT 0x9C) sends a sequence-numbered stream, one message at a time. N planned
handovers alternate release-activity (primary → backup) and revert-activity (backup → primary)
through the management API, each once the mate stands by in sync again. Unavailability, as the
client sees it: the last PUBACK from the old active → the first CONNACK 0 from the new one
(CLOCK_MONOTONIC, one process). Goal: ≤ 200 ms. Nearest-rank percentiles.
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pairmq.appliance.keyring import management_token  # noqa: E402
from pairmq.appliance.config import load_secret  # noqa: E402
from pairmq.appliance.errors import PairMQError  # noqa: E402
from pairmq.appliance.roles import Role  # noqa: E402
from bench.report import write_docs  # noqa: E402
from pairmq.cli import api  # noqa: E402
from tests.harness.group import active_group  # noqa: E402
from tests.harness.hostlist import HostListPublisher  # noqa: E402

DOC_BEGIN, DOC_END = "<!-- handover:begin -->", "<!-- handover:end -->"
GOAL_MS = 200
P, B = Role.PRIMARY, Role.BACKUP


def nearest_rank(values: list[float], pct: float) -> float:
    ordered = sorted(values)
    return ordered[max(1, math.ceil(pct / 100 * len(ordered))) - 1]


def hand_over(group, token: str, to: Role, deadline_s: float = 30.0) -> dict:
    """release-activity (to the backup) or revert-activity (to the primary), retried while the mate is
    still catching up after the previous handover."""
    action, on = ("release-activity", P) if to is B else ("revert-activity", B)
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            return api.redundancy_action(group.config, on, action, {}, token, timeout_s=10)
        except PairMQError as exc:
            if time.monotonic() > deadline:
                raise
            if "not in sync" not in str(exc) and "does not hold activity" not in str(exc):
                raise
            time.sleep(0.1)


def run(handovers: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="pairmq-handover-") as tmp, active_group(Path(tmp) / "group") as group:
        token = management_token(load_secret(group.config))
        pub = HostListPublisher([group.address(P), group.address(B)], "bench-handover", "bench/handover")
        pub.connect()
        stop, errors = threading.Event(), []

        def publish() -> None:
            seq = 0
            try:
                while not stop.is_set():
                    pub.publish(seq)
                    seq += 1
            except BaseException as exc:
                errors.append(exc)

        thread = threading.Thread(target=publish, daemon=True)
        thread.start()
        time.sleep(1.0)
        load_before = os.getloadavg()
        drains = []
        for i in range(handovers):
            result = hand_over(group, token, B if i % 2 == 0 else P)
            drains.append(result.get("drain_ms", 0))
            time.sleep(0.7)  # traffic on the new active before the next handover
        stop.set()
        thread.join(15)
        pub.close()
        if errors:
            raise errors[0]
        gaps = pub.gaps_ms()
        return {"gaps": gaps, "drains": drains, "acked": len(pub.acked), "load": (load_before, os.getloadavg()),
                "refusals": len(pub.refusals), "handovers": handovers}


def section(r: dict) -> str:
    gaps, drains = r["gaps"], r["drains"]
    rows = [("last PUBACK (old active) → first CONNACK 0 (new active)", gaps),
            ("release/revert: gate closed → yield (drain, node's own clock)", drains)]
    lines = [DOC_BEGIN, "## Planned handover (bench/handover.py)", "", "```",
             f".venv/bin/python bench/handover.py --handovers {r['handovers']} --write-docs",
             "```", "",
             f"- Date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
             f"- Load average (1/5/15 min) before: {' / '.join(f'{x:.2f}' for x in r['load'][0])}, after: "
             f"{' / '.join(f'{x:.2f}' for x in r['load'][1])} (2 CPUs, shared with other engineers' tests)",
             f"- Method: one local group, {r['handovers']} planned handovers alternating release-activity and "
             "revert-activity (management API), 0.7 s of traffic between them; one paho-mqtt MQTT 5 QoS 1 publisher "
             "(window 1, host list primary,backup, follows the DISCONNECT 0x9C Server Reference). "
             f"{r['acked']} messages acknowledged; {r['refusals']} CONNECTs refused while the new active was not "
             "yet serving. Nearest-rank percentiles.", "",
             "| measure | n | p50 | p99 | max |", "|---|---|---|---|---|"]
    for label, values in rows:
        if values:
            lines.append(f"| {label} | {len(values)} | {nearest_rank(values, 50):.0f} ms | "
                         f"{nearest_rank(values, 99):.0f} ms | {max(values):.0f} ms |")
    met = gaps and max(gaps) <= GOAL_MS
    p99 = nearest_rank(gaps, 99) if gaps else float("nan")
    lines += ["", f"goal ≤ {GOAL_MS} ms unavailability: {'met' if met else 'NOT met'} (p99 {p99:.0f} ms).", "", DOC_END]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--handovers", type=int, default=20)
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    if args.handovers < 1:
        parser.error("--handovers must be at least 1")
    result = run(args.handovers)
    text = section(result)
    print(text)
    if args.write_docs:
        print(f"wrote {write_docs(text, DOC_BEGIN, DOC_END)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

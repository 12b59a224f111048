"""A host-list client (cli/hostlist.py) riding a failover of the active, over any of the group's doors.

`ride_a_failover` publishes QoS 1 and QoS 2 streams through one client while a second, persistent one
subscribes; mid-stream the active is killed (-9) or hands activity over. It asserts what an application
would see: every publish acknowledged, nothing lost, QoS 2 exactly once, per-publisher order, one
failover to the backup's same door.
"""

from __future__ import annotations

import collections
import threading
import time

from pairmq.appliance.roles import Role
from pairmq.cli.hostlist import HostListClient
from tests.harness.http_api import hand_over

P, B = Role.PRIMARY, Role.BACKUP
QOS1, QOS2 = 300, 150
ACK_WAIT_S = 30


def ride_a_failover(group, fault: str, port: int = 1883, **client_kwargs) -> None:
    """`fault`: "kill -9" or "release-activity"; `client_kwargs` go to both HostListClients (transport, tls)."""
    hosts = [f"{group.address(P)}:{port}", f"{group.address(B)}:{port}"]
    got: dict[str, list[int]] = {"cars/7/door": [], "pay/7": []}
    lock = threading.Lock()

    def record(topic: str, payload: bytes) -> None:
        with lock:
            got[topic].append(int(payload))

    sub = HostListClient(hosts, "fleet", **client_kwargs)
    pub = HostListClient(hosts, "car-7", **client_kwargs)
    # Stopped however the ride ends: a client left running would reconnect to the next test's group on the
    # same addresses, take its client ids over and mix its stream into that test's.
    group.on_exit(pub.stop)
    group.on_exit(sub.stop)
    sub.subscribe("cars/+/door", 1, record)
    sub.subscribe("pay/+", 2, record)
    sub.start()
    time.sleep(0.3)  # the SUBACKs
    pub.start()
    handles = []
    for i in range(max(QOS1, QOS2)):
        if i < QOS1:
            handles.append(("cars/7/door", i, pub.publish("cars/7/door", str(i).encode(), qos=1)))
        if i < QOS2:
            handles.append(("pay/7", i, pub.publish("pay/7", str(i).encode(), qos=2)))
        if i == QOS1 // 3:  # mid-stream, with messages in flight
            if fault == "kill -9":
                group.kill(P)
            else:
                assert hand_over(group.config, P)["result"] == "handed over"
        time.sleep(0.004)
    deadline = time.monotonic() + ACK_WAIT_S  # one deadline for all: a stuck client fails in seconds, not hours
    unacknowledged = [(t, i) for t, i, h in handles if not h.wait(timeout_s=max(0.0, deadline - time.monotonic()))]
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with lock:
            if set(got["cars/7/door"]) >= set(range(QOS1)) and len(got["pay/7"]) >= QOS2:
                break
        time.sleep(0.1)
    time.sleep(0.5)  # any late duplicate
    with lock:
        q1, q2 = list(got["cars/7/door"]), list(got["pay/7"])
    sub.stop(), pub.stop()
    lost1, lost2 = sorted(set(range(QOS1)) - set(q1)), sorted(set(range(QOS2)) - set(q2))
    dup1, dup2 = len(q1) - len(set(q1)), len(q2) - len(set(q2))
    firsts = [x for n, x in enumerate(q1) if x not in q1[:n]]
    print(f"host-list client on port {port} across {fault}: published {QOS1} QoS 1 + {QOS2} QoS 2, "
          f"unacknowledged {len(unacknowledged)}; received QoS 1 {len(set(q1))} (+{dup1} duplicates), QoS 2 "
          f"{len(set(q2))} (+{dup2} duplicates); lost {len(lost1) + len(lost2)}; publisher failovers "
          f"{pub.failovers}, subscriber failovers {sub.failovers}\n  publisher: {pub.history}")
    print("QoS 1 out of order:", [(a, b) for a, b in zip(firsts, firsts[1:]) if b < a][:5],
          "QoS 2 duplicates:", [k for k, v in collections.Counter(q2).items() if v > 1], "sub:", sub.history)
    assert not unacknowledged, f"the application saw messages never acknowledged: {unacknowledged[:10]}"
    assert not lost1 and not lost2, f"lost: QoS 1 {lost1[:10]}, QoS 2 {lost2[:10]}"
    assert dup2 == 0, f"QoS 2 delivered twice: {dup2}"
    assert firsts == sorted(firsts) and q2 == sorted(q2), "per-publisher order"
    assert pub.failovers == 1 and pub.current == (group.address(B), port)
    if fault == "release-activity":  # the handover's DISCONNECT points to the same door on the backup
        moved = f"{group.address(P)}:{port}: disconnected 0x9C → {group.address(B)}:{port}"
        assert moved in pub.history and moved in sub.history, (pub.history, sub.history)

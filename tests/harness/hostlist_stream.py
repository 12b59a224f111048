"""A sequence-numbered publisher on the application host-list client (cli/hostlist.py), for the checker.

The nemesis's other publishers drive paho directly (tests/harness/streams.py); this one is what an application
runs: `cli.hostlist.HostListClient`, which follows server references, keeps order across failovers and
stamps every QoS 1/2 message with a message id so the group drops the copy a resend after a failover
would make. It has the attributes `tests.harness.streams.check` reads (client_id, qos, published, acked_now),
and "acknowledged" is what the application is told: `PublishHandle.wait()` returned True.

Rules:
- Seq n is queued n-th; the client keeps the order, so the checker's order rule applies unchanged.
- Acknowledgement times are taken in the client's on_publish, for the unavailability measure.
- A handle whose exchange ended with a failure reason code is also listed as `refused`; whether it
  counts as acknowledged is still what the client told the application.
"""

from __future__ import annotations

import threading
import time

from pairmq.cli.hostlist import HostListClient, PublishHandle
from tests.harness.streams import TOPIC_ROOT, run_in_netns


class _Tapped(HostListClient):
    """Records when each handle's exchange ended, and with which reason code."""

    def _on_publish(self, client, userdata, mid, reason, props) -> None:
        with self._lock:
            handle = self._handed.get(mid)
        if handle is not None:
            handle.ended_at, handle.reason_code = time.monotonic(), getattr(reason, "value", 0)
        super()._on_publish(client, userdata, mid, reason, props)


class HostListStream:
    def __init__(self, client_id: str, hosts: list[str], qos: int, *, interval_s: float, netns: str | None) -> None:
        self.client_id, self.qos, self.interval_s, self.netns = client_id, qos, interval_s, netns
        self.topic = f"{TOPIC_ROOT}/{client_id}"
        self.client = _Tapped(hosts, client_id, keepalive_s=2)
        self.published: list[int] = []
        self._handles: list[PublishHandle] = []
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"hl-{client_id}", daemon=True)

    def start(self) -> None:
        run_in_netns(self.netns, self.client.start)  # its connection thread stays in the namespace
        self._thread.start()

    def _run(self) -> None:
        seq = 0
        while not self._halt.is_set():
            handle = self.client.publish(self.topic, f"{self.client_id}:{seq}".encode(), qos=self.qos)
            self._handles.append(handle)
            self.published.append(seq)
            seq += 1
            time.sleep(self.interval_s)

    def halt(self) -> None:
        self._halt.set()
        self._thread.join(5)

    def stop(self) -> None:
        self.halt()
        self.client.stop()

    def _ended(self) -> list[tuple[int, PublishHandle]]:
        """(seq, handle) of every exchange that ended: acknowledged, or answered with a failure code."""
        return [(seq, h) for seq, h in enumerate(list(self._handles)) if h.acknowledged.is_set()]

    def acked_now(self) -> set[int]:
        """What the application was told is acknowledged (`wait()` returned True, not PublishRefused)."""
        return {seq for seq, h in self._ended() if h.refusal is None}

    @property
    def refused(self) -> dict[int, int]:
        """seq -> the failure reason code `wait()` raised PublishRefused for."""
        return {seq: h.reason_code for seq, h in self._ended() if h.refusal is not None}

    def ack_times_now(self) -> list[float]:
        return sorted(h.ended_at for _, h in self._ended() if hasattr(h, "ended_at"))

    def all_acked(self) -> bool:
        return self._halt.is_set() and len(self._ended()) == len(self._handles)

"""The listener's CONNECT pipeline: a bounded queue between the sessions' reads and the broker.

Rules (DESIGN §5, overload):

- A complete CONNECT joins a bounded queue (`queue_size`), processed at most
  `batch` and at most `budget_s` of work per loop turn (at least one), so a
  storm cannot hold the loop for long; the socket is not read while its
  CONNECT waits.
- Queue full, or `max_connections` clients connected or waiting: refused at
  once with "server busy" (v5 CONNACK 0x89 with a reason string, 3.1.1
  return code 3) and counted.
- The optional async credential check runs between the session's CONNECT
  checks and the broker, at most `max_checks` at once and within
  `check_timeout_s` (a timeout refuses with 0x88 / return code 3); it answers
  None, or a CONNACK error code with or without a reason string, and the
  checks run again after it (the gate may have closed meanwhile).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from pairmq.appliance.mqtt.codec import CONNACK_REASON_CODES, Connect
from pairmq.appliance.mqtt.wire import ReasonCode

if TYPE_CHECKING:
    from pairmq.appliance.mqtt.connection import MqttConnection

log = logging.getLogger("pairmq.appliance.mqtt.listener")

# (CONNECT, peer) -> None to go on, or a CONNACK reason code (e.g. 0x86, 0x87), alone or with a reason string.
CredentialCheck = Callable[[Connect, str], Awaitable["int | tuple[int, str] | None"]]


@dataclasses.dataclass(frozen=True, slots=True)
class ConnectLimits:
    queue_size: int
    batch: int  # CONNECTs handled per loop turn at most
    budget_s: float  # work per loop turn at most (at least one CONNECT)
    max_checks: int  # credential checks running at once
    max_connections: int  # clients connected or waiting
    check_timeout_s: float


class ConnectPipeline:
    def __init__(self, limits: ConnectLimits, check: CredentialCheck | None, *, accepted: Callable[[], int]) -> None:
        self.limits = limits
        self._check = check
        self._accepted = accepted  # clients with CONNACK success still connected
        self.busy_refusals = 0  # queue full
        self.limit_refusals = 0  # max_connections reached
        self._queue: collections.deque[tuple[MqttConnection, Connect]] = collections.deque()
        self._scheduled = False
        self._checks_running = 0

    def __len__(self) -> int:
        return len(self._queue)

    def clear(self) -> None:
        """Forget the waiting CONNECTs (their connections are being dropped)."""
        self._queue.clear()

    def arrived(self, conn: MqttConnection, packet: Connect) -> None:
        """Queue a decoded CONNECT, or refuse it with "server busy" at once."""
        limits = self.limits
        waiting = len(self._queue) + self._checks_running
        if len(self._queue) >= limits.queue_size:
            self.busy_refusals += 1
            conn.refuse_busy(packet, f"server busy: {len(self._queue)} CONNECTs waiting (limit "
                                     f"{limits.queue_size}); retry later")
            return
        if self._accepted() + waiting >= limits.max_connections:
            self.limit_refusals += 1
            conn.refuse_busy(packet, f"server busy: connection limit {limits.max_connections} reached")
            return
        self._queue.append((conn, packet))
        self._schedule()

    def _schedule(self) -> None:
        if not self._scheduled and self._queue:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._process)

    def _process(self) -> None:
        self._scheduled = False
        queue, limits = self._queue, self.limits
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limits.budget_s
        for _ in range(limits.batch):
            if not queue or self._checks_running >= limits.max_checks or loop.time() > deadline:
                break
            conn, packet = queue.popleft()
            if conn.closing:
                continue
            try:
                if conn.precheck(packet):
                    if self._check is None:
                        conn.admit(packet)
                    else:
                        self._checks_running += 1
                        loop.create_task(self._checked(conn, packet))
            except Exception:
                log.exception("CONNECT from %s failed", conn.peer)
                conn.abort("internal error")
        self._schedule()

    async def _checked(self, conn: MqttConnection, packet: Connect) -> None:
        why = "credentials refused"
        timeout_s = self.limits.check_timeout_s
        try:
            verdict = await asyncio.wait_for(self._check(packet, conn.peer), timeout_s)
        except TimeoutError:
            verdict, why = ReasonCode.SERVER_UNAVAILABLE, f"no credential check answer within {timeout_s} s"
        except Exception:
            log.exception("the credential check failed for %s", conn.peer)
            verdict, why = ReasonCode.SERVER_UNAVAILABLE, "the credential check failed"
        finally:
            self._checks_running -= 1
            self._schedule()
        if isinstance(verdict, tuple):
            verdict, why = verdict
        if verdict is not None and (verdict not in CONNACK_REASON_CODES or verdict < 0x80):
            log.error("the credential check answered %r, not None or a CONNACK error code", verdict)
            verdict, why = ReasonCode.UNSPECIFIED_ERROR, "the credential check failed"
        if conn.closing:
            return
        try:
            if verdict is None:
                if conn.precheck(packet):  # the gate may have closed while the check ran
                    conn.admit(packet)
            else:
                conn.refuse(packet, ReasonCode(verdict), why)
        except Exception:
            log.exception("CONNECT from %s failed", conn.peer)
            conn.abort("internal error")

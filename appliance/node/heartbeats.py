"""The quorum core's I/O on a thread of its own, so a busy broker cannot cost the active its lease.

Rules:
- One thread owns the UDP heartbeat socket and the core's one timer: a small
  `select` loop over the socket and a wake-up socketpair, no asyncio. The
  broker's event loop can stall for seconds under a connection storm; this
  loop only waits for the GIL (handed over every `sys.getswitchinterval()`).
- Every call into the QuorumCore, from any thread, holds `lock`: the core is
  not thread-safe. Releasing it publishes the core's `serving_bound()` as
  `lock.gate`, so the MQTT gate (asked per read) takes no lock and never waits
  for this thread: a reader sees what it would have seen holding the lock just
  before or after whoever holds it now. Callers read the clock inside the lock, so a caller that
  waited for it never asks with a stale `now`; other threads go through
  `QuorumHandle.call` (quorum_handle.py), which does both.
- Only this thread sends: heartbeats leave in the order the core made them.
  Another thread that changed the core (an operator's forced bid) calls
  `wake()` and this thread flushes.
- Before every core call this thread passes on the broker loop's latest
  liveness stamp (`broker_alive_at`, written by the broker loop ~10 times a
  second); the core's rule R6 decides what a stale stamp means.
- A step-down goes to `before_send` before the step-down's heartbeat leaves
  (that heartbeat may carry the yield that lets the mate take over at once):
  what only the active may hold outside the core, the virtual IP, is given
  up first (appliance/node/vip.py).
- Decisions go to `on_decision` on this thread, outside the lock. Whatever
  must touch the broker is posted to its loop by the callback; safety never
  waits for that hand-off, because the MQTT gate asks the core on every packet.
- When a peer's echo raises how far the active may acknowledge alone (the core's `position_echoes`,
  rule R9), `on_position_echoed` is called on this thread, outside the lock, so the broker releases
  at once rather than at its next sync.
- A bug on this thread goes to `on_crash` (the node stops and is restarted):
  without heartbeats the lease ends anyway, and a half-alive node helps nobody.
"""

from __future__ import annotations

import contextlib
import logging
import select
import socket
import threading
from typing import Callable

from ..clock import now_ms
from ..quorum.core import Decision, QuorumCore
from ..quorum.decisions import DecisionKind

log = logging.getLogger("pairmq.heartbeats")

RECV_BATCH = 256  # datagrams read per wake-up before the timer gets its turn (a flood cannot starve it)
MAX_DATAGRAM = 4096  # larger than any heartbeat; longer ones arrive truncated and are refused as malformed
LAG_REPORT_MS = 250  # broker loop stamps older than this are reported once per episode (stamps come every 100 ms)
STOP_WAIT_S = 2.0


class GateLock:
    """The core's lock; each release publishes `gate` (the core's `serving_bound()`) before unlocking."""

    def __init__(self, core: QuorumCore) -> None:
        self._core = core
        self._lock = threading.Lock()
        self.gate: tuple[int, int] = (0, 0)  # (serving while now_ms < this, active epoch): not serving yet

    def __enter__(self) -> "GateLock":
        self._lock.acquire()
        return self

    def __exit__(self, *exc_info: object) -> None:
        try:
            self.gate = self._core.serving_bound()  # one attribute store: a reader sees all of it or none
        finally:
            self._lock.release()


class HeartbeatThread:
    def __init__(self, core: QuorumCore, bind: tuple[str, int], peers: list[tuple[str, int]], *,
                 on_decision: Callable[[Decision], None], on_ready: Callable[[], None],
                 on_lag: Callable[[int, int], None], on_crash: Callable[[BaseException], None],
                 before_send: Callable[[list[Decision]], None] | None = None,
                 on_position_echoed: Callable[[], None] = lambda: None) -> None:
        self.core = core
        self._before_send = before_send
        self._on_position_echoed = on_position_echoed
        self.lock = GateLock(core)
        self.broker_alive_at = now_ms()  # written by the broker loop; an int store is atomic under the GIL
        self.send_errors = 0
        self.max_timer_late_ms = 0  # since start: how late the heartbeat timer ran at worst
        self._bind = bind
        self._peers = peers
        self._on_decision, self._on_ready, self._on_lag, self._on_crash = on_decision, on_ready, on_lag, on_crash
        self._sock: socket.socket | None = None
        self._wake_r: socket.socket | None = None
        self._wake_w: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._ready = False
        self._lag_max_ms = 0  # the current lag episode: oldest stamp seen, and the timer's worst lateness
        self._lag_late_ms = 0

    # --- start-up and shutdown (called from the node's main thread) --------------------

    def start(self) -> None:
        """Bind the socket here, so an address in use fails the node's start-up sequence."""
        address = self._bind[0]
        sock = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET, socket.SOCK_DGRAM)
        try:
            # No SO_REUSEADDR: on UDP it would let a second node on this address steal our heartbeats.
            sock.bind(self._bind)
        except OSError:
            sock.close()
            raise
        sock.setblocking(False)
        self._sock = sock
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._thread = threading.Thread(target=self._main, name="pairmq-heartbeats", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping = True
        if self._thread is not None:
            self.wake()
            self._thread.join(STOP_WAIT_S)
            if self._thread.is_alive():
                log.error("the heartbeat thread did not stop within %.0f s", STOP_WAIT_S)
        for s in (self._sock, self._wake_r, self._wake_w):
            if s is not None:
                s.close()

    def wake(self) -> None:
        try:
            self._wake_w.send(b"\0")
        except (BlockingIOError, OSError, AttributeError):
            pass  # a full socketpair already wakes the thread; none yet means not started

    # --- the thread -----------------------------------------------------------------

    def _main(self) -> None:
        try:
            with self.lock:
                self.core.broker_alive(self.broker_alive_at)
                self.core.handle_timer(now_ms())
            self._flush()
            while not self._stopping:
                self._turn()
        except BaseException as exc:  # our own bug: say so loudly and let the node stop
            if not self._stopping:
                log.exception("the heartbeat thread failed")
                self._on_crash(exc)

    def _turn(self) -> None:
        with self.lock:
            deadline = self.core.get_timer()
        timeout_s = max(0.0, (deadline - now_ms()) / 1000)
        readable, _, _ = select.select([self._sock, self._wake_r], [], [], timeout_s)
        if self._wake_r in readable:
            with contextlib.suppress(OSError):
                self._wake_r.recv(4096)
        datagrams = self._read_batch() if self._sock in readable else []
        late = 0
        with self.lock:
            self.core.broker_alive(self.broker_alive_at)
            echoes = self.core.position_echoes
            for data in datagrams:
                self.core.receive(data, now_ms())
            echoed = self.core.position_echoes != echoes
            now = now_ms()
            due = self.core.get_timer()
            if now >= due:
                late = now - due
                self.core.handle_timer(now)
        self.max_timer_late_ms = max(self.max_timer_late_ms, late)
        self._flush()
        if echoed:
            self._on_position_echoed()
        self._track_lag(late)

    def _read_batch(self) -> list[bytes]:
        out = []
        for _ in range(RECV_BATCH):
            try:
                data, _addr = self._sock.recvfrom(MAX_DATAGRAM)
            except BlockingIOError:
                break
            except OSError:
                self.send_errors += 1  # an ICMP error queued on the socket by an earlier send
                break
            out.append(data)
        return out

    def _flush(self) -> None:
        """Send what the core produced and hand over its decisions, outside the lock."""
        with self.lock:
            datagrams = self.core.datagrams_to_send()
            decisions = self.core.decisions()
            now = now_ms()
            ready = not self._ready and (now >= self.core.boot_at + self.core.timing.quiet_ms
                                         or any(self.core.sees(r, now) for r in self.core.peers))
        if self._before_send is not None and any(d.kind == DecisionKind.STEP_DOWN for d in decisions):
            self._before_send(decisions)
        for data in datagrams:
            for addr in self._peers:
                try:
                    self._sock.sendto(data, addr)
                except OSError:
                    self.send_errors += 1
        for decision in decisions:
            self._on_decision(decision)
        if ready:
            self._ready = True
            self._on_ready()

    def _track_lag(self, late_ms: int) -> None:
        age = now_ms() - self.broker_alive_at
        if age > LAG_REPORT_MS:
            self._lag_max_ms = max(self._lag_max_ms, age)
            self._lag_late_ms = max(self._lag_late_ms, late_ms)
        elif self._lag_max_ms:
            self._on_lag(self._lag_max_ms, self._lag_late_ms)
            self._lag_max_ms = self._lag_late_ms = 0


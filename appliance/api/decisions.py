"""The decision stream: `GET /api/v1/decisions/stream`, server-sent events of the quorum core's decisions.

Rules:
- Every decision the heartbeat thread hands the node (`Node._act_on`) is published here with the next
  sequence number of this node process. An event's id is `<incarnation>-<seq>`: the boot incarnation
  (persisted, bumped at every start) then the sequence, so ids only grow, across restarts too.
- On connect a client gets the recent decisions (at most HISTORY, as in the redundancy view), or with
  `Last-Event-ID` only those after it (all recent ones if the id is from an earlier incarnation), then
  an `event: live` (the backlog is out), then each new one as it happens, and a `: keep-alive` comment
  after KEEPALIVE_S of silence.
- Bounded: one shared ring of HISTORY events, no queue per client (a stream reads the ring from its own
  position), at most MAX_STREAMS open streams (more get 503), and a client that does not take a write
  within WRITE_TIMEOUT_S, or falls more than HISTORY events behind, is dropped.
- `publish` runs on the heartbeat thread: it only appends under a lock and posts a wake-up to the loop,
  so the quorum core never waits for a web client.
"""

from __future__ import annotations

import asyncio
import collections
import json
import threading
import time

from aiohttp import web

HISTORY = 64  # the quorum core keeps as many (appliance/quorum/core.py DECISION_HISTORY)
MAX_STREAMS = 32
KEEPALIVE_S = 15.0
WRITE_TIMEOUT_S = 5.0
GONE_CHECK_S = 1.0  # how often an idle stream looks whether its client is still there


class DecisionFeed:
    def __init__(self, role: str, incarnation: int) -> None:
        self.role = role
        self.incarnation = incarnation
        self._lock = threading.Lock()
        self._ring: collections.deque[tuple[int, str]] = collections.deque(maxlen=HISTORY)  # (seq, event text)
        self.seq = 0  # the last sequence number given
        self.streams = 0
        self.dropped = 0  # streams dropped as too slow
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._closing = False

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop, self._wake = loop, asyncio.Event()

    def publish(self, decision, mono_now_ms: int) -> None:
        """Any thread. `mono_now_ms` is the monotonic clock the decision's `at_ms` is on."""
        at = time.time() - (mono_now_ms - decision.at_ms) / 1000
        with self._lock:
            self.seq += 1
            data = {"id": self.event_id(self.seq), "seq": self.seq, "node": self.role, "kind": decision.kind,
                    "epoch": decision.epoch, "reason": decision.reason,
                    "at": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(at)) + f".{int(at * 1000) % 1000:03d}Z"}
            self._ring.append((self.seq, _event("decision", data["id"], json.dumps(data))))
        if self._loop is not None:
            try:
                self._loop.call_soon_threadsafe(self._notify)
            except RuntimeError:  # the loop is closed: shutting down
                pass

    def event_id(self, seq: int) -> str:
        return f"{self.incarnation}-{seq}"

    def _notify(self) -> None:
        wake, self._wake = self._wake, asyncio.Event()
        wake.set()

    def close(self) -> None:
        """On the loop, at shutdown: every open stream ends now, so the server need not wait for them."""
        self._closing = True
        if self._wake is not None:
            self._notify()

    def after(self, seq: int) -> tuple[list[tuple[int, str]], bool]:
        """The events after `seq`, and whether some were already gone from the ring (the reader fell behind)."""
        with self._lock:
            events = [e for e in self._ring if e[0] > seq]
            oldest = self._ring[0][0] if self._ring else self.seq + 1
        return events, seq + 1 < oldest and seq < self.seq

    def start_position(self, last_event_id: str | None) -> int:
        """Where a new stream starts reading: after the client's Last-Event-ID if it is ours, else at the start."""
        if last_event_id:
            incarnation, _, seq = last_event_id.strip().partition("-")
            if incarnation == str(self.incarnation) and seq.isdigit():
                return min(int(seq), self.seq)
        return 0

    async def stream(self, request: web.Request) -> web.StreamResponse:
        if self._wake is None:
            raise web.HTTPServiceUnavailable(reason="the decision stream is not running yet")
        if self.streams >= MAX_STREAMS:
            raise web.HTTPServiceUnavailable(
                reason=f"{MAX_STREAMS} decision streams are open already; close one and try again")
        position = self.start_position(request.headers.get("Last-Event-ID"))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                               "X-Accel-Buffering": "no"})
        self.streams += 1
        try:
            await response.prepare(request)
            await _write(response, b"retry: 1000\n\n")
            quiet_s = 0.0
            resumed = True  # the first read may start before the ring (an old Last-Event-ID): send what is left
            while not self._closing:
                wake = self._wake
                events, fell_behind = self.after(position)
                if fell_behind and not resumed:
                    self.dropped += 1
                    break  # it missed events: reconnecting with its Last-Event-ID says so, silence would not
                for position, text in events:
                    await _write(response, text)
                if resumed:  # the backlog is out: a client can tell history from what happens next
                    await _write(response, f"event: live\ndata: {json.dumps({'node': self.role})}\n\n")
                    resumed = False
                if events:
                    quiet_s = 0.0
                    continue
                try:
                    await asyncio.wait_for(wake.wait(), GONE_CHECK_S)
                except asyncio.TimeoutError:
                    # aiohttp does not cancel a handler whose client left: look, so its slot frees within a second
                    if request.transport is None or request.transport.is_closing():
                        break
                    quiet_s += GONE_CHECK_S
                    if quiet_s >= KEEPALIVE_S:
                        await _write(response, b": keep-alive\n\n")
                        quiet_s = 0.0
        except ConnectionResetError:
            pass  # the client went away
        except asyncio.TimeoutError:
            self.dropped += 1
        finally:
            self.streams -= 1
        return response


async def _write(response: web.StreamResponse, data: bytes | str) -> None:
    """A reader that does not take it within WRITE_TIMEOUT_S is too slow: TimeoutError ends its stream."""
    await asyncio.wait_for(response.write(data.encode() if isinstance(data, str) else data), WRITE_TIMEOUT_S)


def _event(name: str, event_id: str, data: str) -> str:
    return f"event: {name}\nid: {event_id}\ndata: {data}\n\n"

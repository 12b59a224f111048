"""Runs the group file's activity hooks ([hooks], appliance/hooks_settings.py) as the node's activity changes.

Rules:
- Which hook (`decision_event`): a routing node's boot and `step_down` → standby, `activate` → active, a
  quorum state that cannot be saved → fault (and the node's `_fail`, on every node). Redundancy Up/Down is
  derived, not decided: the node samples it (`RedundancyWatch`, every WATCH_S), a change after the first
  sample is a hook.
- A hook never delays a decision: the node applies the decision first, then calls `notify`, which only
  queues; one task on the event loop runs the queue. Nobody on a decision path awaits a hook.
- Hooks run one at a time, in the order `notify` was called, so the sequence a script sees is the sequence
  of transitions on this node. A slow hook makes the next wait; the queue holds MAX_QUEUED calls, and when
  it is full the oldest waiting call is dropped (its `hook_dropped` event says so): the latest state is what
  a script must not miss.
- Each run is `script ROLE EPOCH REASON` with PAIRMQ_ROLE, PAIRMQ_EPOCH, PAIRMQ_REASON, PAIRMQ_EVENT and
  PAIRMQ_GROUP in its environment, in a session of its own, stdin and stdout on /dev/null. After
  `hook_timeout_ms` its whole process group is killed (SIGKILL), so a script that hangs, or forked a child
  that does, frees the queue.
- Every outcome is one `hook_finished` event (exit code, timed out, the tail of stderr, duration), or
  `hook_failed` when the script could not be started.
- At shutdown, what is queued gets up to SHUTDOWN_WAIT_S (and no more than one hook timeout) to finish
  (a fault hook about the failure that stops the node), then the running hook's group is killed: a hung
  hook must not hold `systemctl stop` for long.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import logging
import os
import signal
from typing import Callable

from ..clock import now_ms
from ..hooks_settings import HookEvent, HookSettings
from ..quorum.core import QuorumCore, RedundancyStatus
from ..quorum.decisions import DecisionKind
from ..quorum.wire import Activity
from ..roles import Role

log = logging.getLogger("pairmq.hooks")

MAX_QUEUED = 32  # calls waiting behind a running hook
STDERR_TAIL_BYTES = 1024  # what of a hook's stderr reaches the event log
STDERR_DRAIN_S = 0.5  # after the hook exits: a child it left behind may hold its stderr open
REASON_MAX_CHARS = 1000  # a decision sentence is far shorter; bounds an argument and an environment entry
SHUTDOWN_WAIT_S = 3.0  # what a stopping node gives its queued hooks, in all
WATCH_S = 0.2  # how often the node samples its redundancy status for the redundancy hooks


@dataclasses.dataclass(frozen=True, slots=True)
class HookCall:
    event: HookEvent
    epoch: int
    reason: str


class HookRunner:
    """`events(kind, **fields)` writes the node's event log. `notify` and `close` run on the event loop."""

    def __init__(self, settings: HookSettings, *, group: str, role: str,
                 events: Callable[..., None], max_queued: int = MAX_QUEUED) -> None:
        self._settings = settings
        self._group, self._role = group, role
        self._events = events
        self._queue: collections.deque[HookCall] = collections.deque()
        self._max_queued = max_queued
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._busy = False  # a call is taken off the queue and not yet reported

    @property
    def enabled(self) -> bool:
        return bool(self._settings.scripts)

    def notify(self, event: HookEvent, epoch: int, reason: str) -> None:
        """Queue the hook for `event`, if one is set; returns at once."""
        if self._settings.script(event) is None:
            return
        if self._task is None:  # the first call starts the worker (we are on the loop)
            self._wake = asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._work())
        if len(self._queue) >= self._max_queued:
            dropped = self._queue.popleft()
            log.warning("%s: the hook queue is full: the %s hook of epoch %d is dropped", self._role,
                        dropped.event, dropped.epoch)
            self._events("hook_dropped", hook=dropped.event.value, epoch=dropped.epoch, reason=dropped.reason)
        self._queue.append(HookCall(event, epoch, reason[:REASON_MAX_CHARS]))
        self._wake.set()

    async def close(self) -> None:
        """Give what is queued a bounded time (see the rules), then kill the running hook and stop."""
        if self._task is None:
            return
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._drained(), min(SHUTDOWN_WAIT_S, self._settings.hook_timeout_ms / 1000))
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._task
        self._task = None

    async def _drained(self) -> None:
        while self._queue or self._busy:
            await asyncio.sleep(0.05)

    async def _work(self) -> None:
        while True:
            while not self._queue:
                self._wake.clear()
                await self._wake.wait()
            call = self._queue.popleft()
            self._busy = True
            try:
                await self._run(call)
            except asyncio.CancelledError:
                raise
            except Exception:  # our own bug: say so, keep running the queue
                log.exception("%s: running the %s hook failed", self._role, call.event)
            finally:
                self._busy = False

    async def _run(self, call: HookCall) -> None:
        script = self._settings.script(call.event)
        assert script is not None
        env = {**os.environ, "PAIRMQ_ROLE": self._role, "PAIRMQ_EPOCH": str(call.epoch),
               "PAIRMQ_REASON": call.reason, "PAIRMQ_EVENT": call.event.value, "PAIRMQ_GROUP": self._group}
        started = now_ms()
        try:
            proc = await asyncio.create_subprocess_exec(
                str(script), self._role, str(call.epoch), call.reason, stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE, env=env, start_new_session=True)
        except (OSError, ValueError) as exc:  # ValueError: a NUL byte in an argument
            log.warning("%s: the %s hook %s could not be started: %s", self._role, call.event, script, exc)
            self._events("hook_failed", hook=call.event.value, script=str(script), epoch=call.epoch,
                         error=str(exc))
            return
        tail = bytearray()
        reader = asyncio.ensure_future(_read_tail(proc.stderr, tail))
        timed_out = False
        try:
            try:
                await asyncio.wait_for(proc.wait(), self._settings.hook_timeout_ms / 1000)
            except asyncio.TimeoutError:
                timed_out = True
                _kill_group(proc.pid)
                await proc.wait()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(reader), STDERR_DRAIN_S)
        except asyncio.CancelledError:  # shutdown: the hook goes with the node
            _kill_group(proc.pid)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(proc.wait(), STDERR_DRAIN_S)  # reaped before the loop closes
            raise
        finally:
            reader.cancel()
        self._report(call, str(script), proc.returncode, timed_out, bytes(tail), now_ms() - started)

    def _report(self, call: HookCall, script: str, exit_code: int | None, timed_out: bool, stderr: bytes,
                duration_ms: int) -> None:
        text = stderr.decode("utf-8", "replace").strip()
        if timed_out:
            log.warning("%s: the %s hook %s ran past %d ms and was killed", self._role, call.event, script,
                        self._settings.hook_timeout_ms)
        elif exit_code:
            log.warning("%s: the %s hook %s exited with %s: %s", self._role, call.event, script, exit_code,
                        text[-200:])
        self._events("hook_finished", hook=call.event.value, script=script, epoch=call.epoch,
                     exit_code=exit_code, timed_out=timed_out, stderr_tail=text, duration_ms=duration_ms)


async def _read_tail(stream: asyncio.StreamReader | None, tail: bytearray) -> None:
    """Read `stream` to its end, keeping only its last STDERR_TAIL_BYTES (a chatty hook costs no memory)."""
    if stream is None:
        return
    while chunk := await stream.read(65536):
        tail += chunk
        del tail[:-STDERR_TAIL_BYTES]


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def decision_event(kind: DecisionKind, *, routes_messages: bool, storage_failed: bool) -> HookEvent | None:
    """The hook a decision of `kind` calls for: a routing node starts as the standby (its boot) and changes on
    `activate` and `step_down`; a quorum state that cannot be saved is a fault (no bid or vote until it can)."""
    if kind is DecisionKind.ACTIVATE:
        return HookEvent.ACTIVE
    if kind is DecisionKind.STEP_DOWN or (kind is DecisionKind.BOOT and routes_messages):
        return HookEvent.STANDBY
    if kind is DecisionKind.STORAGE and storage_failed:
        return HookEvent.FAULT
    return None


class RedundancyWatch:
    """Edges of the node's redundancy status (Up/Down): the first status seen is the baseline, every change
    after it is a hook. The status is derived, not decided, so the node samples it (every WATCH_S)."""

    def __init__(self) -> None:
        self._up: bool | None = None

    def change(self, up: bool) -> HookEvent | None:
        before, self._up = self._up, up
        if before is None or before == up:
            return None
        return HookEvent.REDUNDANCY_UP if up else HookEvent.REDUNDANCY_DOWN


def redundancy_sentence(core: QuorumCore, role: Role, now: int) -> tuple[bool, int, str]:
    """(Up?, the epoch in force, the redundancy hooks' reason): a pure function of the core, under its lock."""
    up = core.redundancy_status(now) is RedundancyStatus.UP
    if role is Role.MONITOR:
        unseen = [r.value for r in core.peers if not core.sees(r, now)]
        why = "it sees the primary and the backup" if not unseen else f"it does not see the {' and the '.join(unseen)}"
    elif core.activity is Activity.ACTIVE:
        mate = role.mate()
        why = (f"active, the {mate.value} is in sync" if up else
               f"active, the {mate.value} is {'not in sync' if core.sees(mate, now) else 'not seen'}")
    else:
        why = "standby, in sync with the active" if up else "standby, not in sync with an active"
    return up, core.active_epoch or core.state.epoch, f"{role.value}: redundancy {'Up' if up else 'Down'} ({why})"

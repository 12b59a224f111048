"""A planned handover on a node: the adapter around the quorum core's rules (appliance/quorum/handover.py).

Sequence, on the broker loop (every core call goes through the QuorumHandle):
1. Begin: the core closes the MQTT gate or refuses with one sentence; in the same loop turn the
   listeners stop reading every client, so no packet is taken and no acknowledgement is produced
   after this instant (what the clients already sent waits in their sockets).
2. Drain, polled every DRAIN_POLL_S: release what the mate acknowledged; done once the spool writer
   has nothing pending, the mate acknowledged every op through the writer's head (the final op), and
   no commit's effects are held any more (the last PUBACKs are written).
3. Yield: the core steps down with the final op; the clients are dropped at once: MQTT 5 DISCONNECT
   0x9C with the mate's MQTT address as Server Reference, MQTT 3.1.1 a plain close.
4. Wait, at most TAKEOVER_WAIT_S, until the mate claims activity (the API's answer names it; SIGTERM
   exits only then, so its vote is not missed).
SIGTERM only: while the mate is reachable but not in sync (catching up after a stall or a broken link),
the node serves on and asks again every SYNC_RETRY_S, for at most SIGTERM_SYNC_WAIT_S, so that a
`systemctl stop` during a short catch-up still hands over rather than leaving the mate a takeover by
lease expiry. An unreachable mate is not waited for.
Abort (the core's 2 s drain bound, the mate out of sync, a lease that ran out): the clients are read
again and the node serves on if its lease still runs. A forced release without an in-sync mate is a
plain step-down (the core decides; the step-down path drops the clients).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from typing import Callable

from ..broker.service import BrokerService
from ..clock import now_ms
from ..errors import LocalProtocolError
from ..quorum.decisions import DecisionKind
from ..roles import Role
from .quorum_handle import QuorumHandle

log = logging.getLogger("pairmq.handover")
DRAIN_POLL_S = 0.002
TAKEOVER_WAIT_S = 1.0
SIGTERM_SYNC_WAIT_S = 5.0  # with the 2 s drain bound and the takeover wait, well inside TimeoutStopSec=15s
SYNC_RETRY_S = 0.05
MQTT_REASON_USE_ANOTHER_SERVER = 0x9C


@dataclasses.dataclass(frozen=True, slots=True)
class Outcome:
    result: str  # "handed over", "stepped down", "aborted"
    sentence: str
    final_seq: int = 0
    drain_ms: int = 0
    new_active: str | None = None

    def json(self, role: Role) -> dict:
        return {"result": self.result, "role": role.value, "reason": self.sentence, "final_op": self.final_seq,
                "drain_ms": self.drain_ms, "active": self.new_active}


@dataclasses.dataclass(slots=True)
class HandoverRunner:
    """`mate_reference`: the mate's MQTT address (the clients' Server Reference); `acked_seq()`: the highest op
    the mate acknowledged; `listeners()`: the MQTT listeners now open."""

    quorum: QuorumHandle
    role: Role
    broker: BrokerService
    mate_reference: str = dataclasses.field(kw_only=True)
    acked_seq: Callable[[], int] = dataclasses.field(kw_only=True)
    listeners: Callable[[], list] = dataclasses.field(kw_only=True)
    events: Callable[..., None] = dataclasses.field(kw_only=True)
    _running: bool = dataclasses.field(default=False, init=False)

    async def run(self, why: str, *, force: bool = False) -> Outcome:
        """One handover (release, revert, auto-revert, SIGTERM). Raises LocalProtocolError when refused."""
        if self._running:
            raise LocalProtocolError("a handover is already under way")
        role, quorum = self.role, self.quorum
        mate = role.mate()
        started = now_ms()

        def begin(core, now) -> bool:
            core.begin_handover(now, why, force=force)
            return core.handover.draining is not None

        draining = quorum.call(begin)
        quorum.wake()
        if not draining:
            return Outcome("stepped down", f"{role.value}: {why} (forced): stepped down without an in-sync "
                                           f"{mate.value}")
        self._running = True
        try:
            self._listeners("hold_clients")
            final_seq = await self._drain()
        except BaseException:  # our bug or a cancellation: never leave the clients held and the gate shut
            quorum.call(lambda core, now: core.abort_handover(now, "the handover failed on this node"))
            self._listeners("unhold_clients")
            raise
        finally:
            self._running = False
        drain_ms = now_ms() - started
        if final_seq is None:
            self._listeners("unhold_clients")
            last = quorum.call(lambda core, now: [d.reason for d in core.history
                                                  if d.kind == DecisionKind.HANDOVER_ABORTED])
            return Outcome("aborted", last[-1] if last else "handover aborted", drain_ms=drain_ms)
        reference = self.mate_reference
        dropped = sum(listener.drop_clients(MQTT_REASON_USE_ANOTHER_SERVER, reference)
                      for listener in self.listeners())
        log.info("%s: handed over at op %d after %d ms; %d clients sent to %s", role.value, final_seq,
                 drain_ms, dropped, reference)
        self.events("handover", why=why, final_op=final_seq, drain_ms=drain_ms, clients_dropped=dropped)
        active = await self._await_mate(mate)
        return Outcome("handed over", f"{role.value}: {why}: the {mate.value} holds every op through "
                                      f"{final_seq}; activity handed over", final_seq, drain_ms,
                       active.value if active else None)

    async def run_on_sigterm(self) -> Outcome:
        """A handover for SIGTERM, waiting for a reachable mate to come back in sync. Raises
        LocalProtocolError when refused at the end of the wait."""
        role, mate = self.role, self.role.mate()
        deadline = time.monotonic() + SIGTERM_SYNC_WAIT_S
        waited_since = None
        while True:
            try:
                outcome = await self.run("SIGTERM")
            except LocalProtocolError as refusal:
                catching_up = self.quorum.call(lambda core, now: core.may_serve(now) and core.sees(mate, now))
                if not catching_up or time.monotonic() >= deadline:
                    raise
                if waited_since is None:
                    waited_since = time.monotonic()
                    log.warning("%s: SIGTERM: %s; serving on until it is in sync (at most %.0f s)",
                                role.value, refusal, SIGTERM_SYNC_WAIT_S)
                await asyncio.sleep(SYNC_RETRY_S)
                continue
            if waited_since is not None:
                log.warning("%s: SIGTERM: the %s was in sync after %.0f ms", role.value, mate.value,
                            (time.monotonic() - waited_since) * 1000)
            return outcome

    async def _drain(self) -> int | None:
        """The final op once the mate holds everything and the last acknowledgements are out; None if aborted."""
        broker = self.broker
        while True:
            broker.submit_deferred()  # ops the broker held back (a subscriber's acks) go to the mate too
            broker.release_held()
            writer = broker.writer
            head = writer.head.seq
            done = writer.pending_ops == 0 and self.acked_seq() >= head and broker.held_commits == 0

            def step(core, now) -> bool | None:
                if core.handover.draining is None:
                    return None
                if done and core.finish_handover(now, head):
                    return True
                core.handle_timer(now)  # the drain bound is the core's rule
                return False

            yielded = self.quorum.call(step)
            if yielded is None:
                return None
            self.quorum.wake()
            if yielded:
                return head
            await asyncio.sleep(DRAIN_POLL_S)

    async def _await_mate(self, mate: Role) -> Role | None:
        deadline = time.monotonic() + TAKEOVER_WAIT_S
        while time.monotonic() < deadline:
            if self.quorum.call(lambda core, now: core.active_role(now)) is mate:
                return mate
            await asyncio.sleep(0.01)
        return None

    def _listeners(self, method: str) -> None:
        for listener in self.listeners():
            getattr(listener, method)()

"""The node's mate link: serve it while active, follow the active while standby, and tell the quorum
core and the broker what the link knows (docs/mate_link.md).

Rules:
- The release rule (`MateRelease`, given to the broker at construction): the effects behind a commit
  (a PUBACK, a PUBREC) run once the mate acknowledged its last op, or once its last op is within the
  quorum core's `release_bound`: the mate is out of sync, its lease has surely ended, and a peer has
  echoed back a heartbeat advertising that position, so a survivor can never count as more up to date
  than what we acknowledged alone (core.py R9). Each acknowledgement releases at once (the mate link's
  `on_acked`, on the broker loop); so does each echo (`echoed`, posted by the heartbeat thread); an op
  held alone asks for its position to be advertised at once (`advertise_soon`); the end of a lease is
  learnt by the sync below.
- Every 50 ms, on the broker loop (the sync): the quorum core hears whether the mate is caught up (the
  link is live and the mate acknowledged every op whose effects were released) and our released and
  durable positions, and says how far effects may be released without the mate.
- Standby: dial the active and apply what it ships; a catch-up voids our in-sync lease at once.
- Taking activity: the standby link is closed first, then the broker core is rebuilt from the spool
  the link kept, and only then does the node serve (`ready`). A node serves the epoch it rebuilt for.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
from pathlib import Path
from typing import Callable

from pairmq.mate_link.active import LinkLimits
from pairmq.mate_link.service import ActiveReplication, StandbyReplication

from ..broker.service import BrokerService
from ..config import GroupConfig
from ..spool.local import LocalSpool
from ..roles import Role
from ..clock import now_ms
from .quorum_handle import QuorumHandle

log = logging.getLogger("pairmq.replication")
SYNC_S = 0.05


def active_end(config: GroupConfig, role: Role, spool: LocalSpool, secret: bytes, *, epoch: Callable[[], int],
               may_serve: Callable[[], bool], on_acked: Callable[[int], None],
               on_round_trip: Callable[[float], None] = lambda seconds: None) -> ActiveReplication:
    """The mate link's server, as the active runs it: `on_acked(seq)` releases what the mate now holds;
    `on_round_trip(seconds)` gets each ping's round trip (a metrics histogram)."""
    limits = config.limits
    return ActiveReplication(secret=secret, group=config.name, me=role, spool=spool, epoch=epoch,
                             may_serve=may_serve, on_acked=on_acked, on_round_trip=on_round_trip,
                             limits=LinkLimits(max_lag_ops=limits.mate_max_lag_ops,
                                               max_lag_bytes=limits.mate_max_lag_bytes))


class MateRelease:
    """The broker's release rule with a mate (see the rules)."""

    def __init__(self, active: ActiveReplication, ask: Callable[[], None] = lambda: None) -> None:
        self._active = active
        self._ask = ask  # have the quorum core advertise our position now (R9), on the broker loop
        self.alone_bound = -1  # the quorum core's release_bound; until it speaks: none (the safe side)
        self._asked = 0  # the highest op we asked an advertisement for: one ask per new op, not per look

    @property
    def need_mate(self) -> bool:
        return self.alone_bound < 0

    def allows(self, seq: int) -> bool:
        if seq <= self._active.acked_seq or seq <= self.alone_bound:
            return True
        if self.alone_bound >= 0 and seq > self._asked:
            self._asked = seq
            self._ask()
        return False


class AdvertLag:
    """Test knob (PAIRMQ_TEST_ADVERTISE_DELAY_MS, read at start): the quorum core hears our positions that
    many ms late, holding open the window between a release and the heartbeat that advertises it."""

    def __init__(self, delay_ms: int) -> None:
        self.delay_ms = delay_ms
        self._seen: collections.deque[tuple[int, int, int]] = collections.deque(maxlen=1000)
        self._told = (0, 0)

    def positions(self, now: int, released: int, durable: int) -> tuple[int, int]:
        if self.delay_ms <= 0:
            return released, durable
        self._seen.append((now, released, durable))
        while self._seen and self._seen[0][0] <= now - self.delay_ms:
            _, released_then, durable_then = self._seen.popleft()
            self._told = (released_then, durable_then)
        return self._told


class Replication:
    """`config_mate_joined()`: whether the mate has joined our configuration (config-sync)."""

    def __init__(self, quorum: QuorumHandle, config: GroupConfig, role: Role, *, spool: LocalSpool,
                 broker: BrokerService, active: ActiveReplication, release: MateRelease, secret: bytes,
                 data_dir: Path, epoch: Callable[[], int], may_serve: Callable[[], bool],
                 config_mate_joined: Callable[[], bool]) -> None:
        self._quorum, self._config, self._role = quorum, config, role
        self._spool, self._broker, self.active, self._release = spool, broker, active, release
        self._secret = secret
        self._data_dir = data_dir
        self._epoch, self._may_serve, self._config_mate_joined = epoch, may_serve, config_mate_joined
        self.standby: StandbyReplication | None = None
        self.ready_epoch = 0  # the epoch the broker core was rebuilt for
        self._task: asyncio.Task | None = None
        self._syncing = asyncio.Lock()  # one sync at a time: a take-over awaits the standby link's stop
        self._advert = AdvertLag(int(os.environ.get("PAIRMQ_TEST_ADVERTISE_DELAY_MS", "0")))
        self._advertising = False  # an advertisement is scheduled on the loop

    def refusals(self) -> dict[str, int]:
        """Mate-link connections refused or dropped, by reason: as the listener and as the dialler."""
        counts = collections.Counter(self.active.counters)
        if self.standby is not None:
            counts.update(self.standby.counters)
        return dict(counts)

    def ready(self, epoch: int) -> bool:
        return epoch != 0 and epoch == self.ready_epoch

    def standby_linked(self) -> bool:
        """Whether our standby link has made a session with the active (readiness: joined as standby)."""
        return self.standby is not None and self.standby.links_made > 0

    async def start(self, address: str) -> None:
        await self.active.start(address, self._config.ports.mate_link)
        self._task = asyncio.get_running_loop().create_task(self._sync_forever())

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self.standby is not None:
            await self.standby.stop()
        await self.active.stop()

    def poke(self) -> None:
        """Sync now (on the broker loop): e.g. right after an activation, so serving starts at once."""
        asyncio.get_running_loop().create_task(self._sync_once())

    def advertise_soon(self) -> None:
        """Alone, an op waits for a peer's echo of its position (R9): advertise it now, not at the next sync."""
        if not self._advertising:
            self._advertising = True
            asyncio.get_running_loop().call_soon(self._advertise)

    def _advertise(self) -> None:
        self._advertising = False
        broker = self._broker
        released, durable = self._advert.positions(now_ms(), broker.released_seq, broker.writer.durable.seq)

        def tell(core, now):
            return core.released_position(now, released, durable), core.release_bound(now)

        sent, self._release.alone_bound = self._quorum.call(tell)
        if sent:
            self._quorum.wake()  # the heartbeat that advertises it leaves now
        broker.release_held()

    def echoed(self) -> None:
        """A peer echoed a position we advertised alone: release what it now allows and advertise what
        became durable meanwhile (the core keeps one advertisement in flight)."""
        self._advertise()

    async def _sync_once(self) -> None:
        async with self._syncing:
            try:
                await self._sync()
            except Exception:
                log.exception("%s: mate link sync failed", self._role.value)

    async def _sync_forever(self) -> None:
        while True:
            await asyncio.sleep(SYNC_S)
            await self._sync_once()  # a bug in one sync is logged; the next one still runs

    async def _sync(self) -> None:
        broker, now = self._broker, now_ms()
        behind = self.active.behind(now)
        if not behind and self.active.acked_seq < broker.released_seq:
            behind = "has not acknowledged every op whose effects were released"
        if not behind and not self._config_mate_joined():  # a standby stands by with our configuration too
            behind = "has not joined our configuration"
        resyncing = self.standby is not None and self.standby.link is not None and self.standby.link.resyncing
        mate = self._role.mate()
        released, durable = self._advert.positions(now, broker.released_seq, broker.writer.durable.seq)

        def tell(core, _now):
            core.mate_link(now, not behind, behind)
            sent = core.released_position(now, released, durable)
            bound = core.release_bound(now)
            if resyncing:
                core.void_insync_lease(now, "catching up on the mate link")
            return sent, bound, core.may_serve(now), core.active_epoch, core.active_role(now) is mate

        sent, self._release.alone_bound, serving, epoch, mate_active = self._quorum.call(tell)
        if sent:
            self._quorum.wake()
        broker.release_held()  # the mate's lease may have ended since the last sync
        if serving and not self.ready(epoch):
            await self._take_over(epoch)
        elif not serving and mate_active and self.standby is None:
            self._follow()

    def _follow(self) -> None:
        config, may_serve = self._config, self._may_serve
        mate = config.node(self._role.mate())
        self.standby = StandbyReplication(
            secret=self._secret, group=config.name, me=self._role, spool=self._spool,
            active_address=lambda: (mate.address, config.ports.mate_link) if not may_serve() else None,
            incarnation=self._quorum.call(lambda core, now: core.state.incarnation), highest_epoch=self._epoch,
            incoming_dir=self._data_dir / "spool.incoming")
        asyncio.get_running_loop().create_task(self.standby.start())

    async def _take_over(self, epoch: int) -> None:
        if self.standby is not None:
            standby, self.standby = self.standby, None
            with contextlib.suppress(Exception):
                await standby.stop()
        await self._broker.rebuild_core_off_loop()
        self.ready_epoch = epoch
        log.info("%s: broker core rebuilt from the spool for epoch %d", self._role.value, epoch)

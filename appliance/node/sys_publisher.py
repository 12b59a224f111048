"""The `$SYS` driver on the broker loop: every `interval_s`, while this node serves, one `SysStats` snapshot
into `SysTree` (appliance/broker/sys_topics.py) and what it returns into the broker core's memory.

A broker core rebuilt (activity taken, a commit failure) starts without the tree: the first publication
into a core it has not seen carries every topic again.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Sequence
from importlib import metadata

from ..broker.sys_topics import Redundancy, SysStats, SysTree, publish_in_memory
from ..clock import now_ms, wall_ms

log = logging.getLogger("pairmq.node")


def _version() -> str:
    try:
        return metadata.version("pairmq")
    except metadata.PackageNotFoundError:
        return "unknown"


@dataclasses.dataclass(frozen=True, slots=True)
class SysSources:
    """What the driver reads, each a narrow callable of the node's."""

    serving: Callable[[], bool]
    broker: Callable[[], object]  # the BrokerService: its current `core`, and `execute` for the sends
    listeners: Callable[[], Sequence[object]]  # the MQTT listeners (appliance/mqtt/listener.py counters)
    redundancy: Callable[[], Redundancy]
    started_ms: int  # monotonic, when the node started


class SysPublisher:
    def __init__(self, interval_s: int, sources: SysSources) -> None:
        self.interval_s = interval_s
        self._sources = sources
        self._tree = SysTree()
        self._core: object | None = None  # the core the tree last published into
        self._task: asyncio.Task | None = None
        self._version = _version()

    def start(self) -> None:
        if self.interval_s > 0:
            self._task = asyncio.get_running_loop().create_task(self._run())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                self.publish_once()
            except Exception:  # statistics must never stop the broker
                log.exception("$SYS publication failed")

    def publish_once(self) -> int:
        """Publish what changed if this node serves; the number of topics published."""
        src = self._sources
        if not src.serving():
            self._core = None  # the core is rebuilt before this node serves again
            return 0
        broker = src.broker()
        core = broker.core
        if core is not self._core:
            self._tree.forget_sent()
            self._core = core
        pairs = self._tree.update(self._stats(core), now_ms() / 1000)
        if pairs:
            broker.execute(publish_in_memory(core, pairs, wall_ms()))
        return len(pairs)

    def _stats(self, core) -> SysStats:
        src = self._sources
        listeners = list(src.listeners())
        router = core.router

        def total(name: str) -> int:
            return sum(getattr(x, name, 0) for x in listeners)

        return SysStats(
            version=self._version, uptime_s=(now_ms() - src.started_ms) // 1000,
            clients_connected=total("accepted_count"), clients_total=len(core.sessions),
            packets_received=total("packets_in"), packets_sent=total("packets_out"),
            publish_received=total("messages_in"), publish_sent=total("messages_out"),
            publish_dropped=sum(v for k, v in core.counters.items() if k.startswith("publish_")),
            bytes_received=total("bytes_in"), bytes_sent=total("bytes_out"),
            subscriptions=len(router.subscriptions), retained=len(router.retained),
            stored_messages=sum(1 for m in router.messages.values() if m.stored_size),
            stored_bytes=router.stored_bytes, connections_opened=total("connections_opened"),
            redundancy=src.redundancy())

"""What the connections of one MQTT listener share on every packet: the traffic counters, the in-flight window,
the encoder of plain deliveries, and the connections with output this loop turn.

Rules:
- Everything produced for the connections in one loop turn is flushed once, by one callback queued behind the
  callbacks already queued when the turn's first output was made: a connection's packets go out in one write.
- The counters only grow; the listener's stats, $SYS and /metrics read them.
- The window is the listener's (overload.py's policy sets it); the connections only read it.

Compiled with the connections (pyproject.toml): each packet's count and each turn's flush are then native
attribute updates and calls, where the listener's would be looked up by name.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from pairmq.appliance.mqtt.plain_publish import PlainPublishEncoder

if TYPE_CHECKING:
    from pairmq.appliance.mqtt.connection import MqttConnection


class ListenerTraffic:
    __slots__ = ("messages_in", "messages_out", "packets_in", "packets_out", "bytes_in", "bytes_out", "window",
                 "plain_publish", "_loop", "_dirty")

    def __init__(self, window: int) -> None:
        self.messages_in = 0  # PUBLISH packets taken from clients (Prometheus computes the rates)
        self.messages_out = 0  # PUBLISH packets written to clients
        # For $SYS (sys_topics.py): every packet and byte in and out.
        self.packets_in = 0
        self.packets_out = 0
        self.bytes_in = 0
        self.bytes_out = 0
        self.window = window  # read by every connection on every windowed packet
        self.plain_publish = PlainPublishEncoder()  # topics' encoded fields, shared by the listener's connections
        self._loop: asyncio.AbstractEventLoop | None = None
        self._dirty: list[MqttConnection] = []

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """The loop the listener serves on: the flush is queued there."""
        self._loop = loop

    def mark_dirty(self, conn: MqttConnection) -> None:
        """`conn` has output this turn: one flush for everyone, after the callbacks already queued."""
        if not self._dirty:
            loop = self._loop
            assert loop is not None, "output before the listener started"
            loop.call_soon(self._flush)
        self._dirty.append(conn)

    def _flush(self) -> None:
        dirty, self._dirty = self._dirty, []
        for conn in dirty:
            conn.flush()

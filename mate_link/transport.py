"""The mate link's asyncio adapter for one TCP connection: handshake, then sealed messages.

Rules:
- The handshake (secure.py) must finish within `handshake_timeout_s`, else the socket is aborted.
- After it, the socket reads straight into the secure channel's buffer (a BufferedProtocol: no bytes
  object per read, no copy before a frame is opened), and every frame is opened (secure.py) and
  decoded (messages.py) as it arrives and handed to `on_message` in order; whatever `on_message`
  raises as a `RemoteProtocolError` (a `LinkFault` from the replication ends) closes the link the
  same way a bad frame does.
- Every refusal is counted by reason in `LinkCounters` and logged once; nothing a peer sends can
  raise out of here. A bug of ours is logged with its traceback and closes the link.
- Bounded: reading pauses while more than `max_write_buffer_bytes` wait to be written to the
  peer (its acks and pongs cannot pile up), and the secure channel bounds what it buffers.
- Messages are sealed as the socket takes them, not when sent: `send` queues them (in order) and
  at most `PUMP_BYTES` are sealed per loop turn, more only once the socket drains. What one turn
  sealed goes to the socket as one buffer: one send per turn, however many frames. A full
  snapshot (a GiB of bodies) then neither stalls the event loop (the broker's, on the active)
  for seconds nor sits sealed in memory, and the peer's pongs and acks are still read meanwhile.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable

from pairmq.appliance.errors import RemoteProtocolError

from .messages import Message, decode, encode
from .secure import HandshakeFailed, Stage, Handshake

log = logging.getLogger("pairmq.mate_link")

HANDSHAKE_TIMEOUT_S = 5.0
MAX_WRITE_BUFFER_BYTES = 8 << 20
PUMP_BYTES = 1 << 20  # sealed per loop turn at most; also the transport's high-water mark
HANDSHAKE_READ_BYTES = 4096  # a read before the handshake ends (its messages are at most 516 bytes)


class LinkCounters(collections.Counter):
    """Refusals by reason ("bad_proof", "tampered", "malformed", ...), for the management API."""


class MateConnection(asyncio.BufferedProtocol):
    """The socket reads into the secure channel's buffer once the handshake is done (`get_buffer`)."""

    def __init__(self, handshake: Handshake, *, counters: LinkCounters,
                 on_established: Callable[["MateConnection"], None],
                 on_message: Callable[["MateConnection", Message], None],
                 on_closed: Callable[["MateConnection", str], None],
                 handshake_timeout_s: float = HANDSHAKE_TIMEOUT_S,
                 max_write_buffer_bytes: int = MAX_WRITE_BUFFER_BYTES,
                 codec: tuple[Callable, Callable] = (encode, decode)) -> None:
        self.handshake = handshake
        self.counters = counters
        self._on_established = on_established
        self._on_message = on_message
        self._on_closed = on_closed
        self._handshake_timeout_s = handshake_timeout_s
        self._max_write_buffer = max_write_buffer_bytes
        self._encode, self._decode = codec  # config-sync's messages ride the same sealed frames
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.closed = False
        self.close_reason = ""
        self._timer: asyncio.TimerHandle | None = None
        self._outbox: collections.deque[Message] = collections.deque()
        self._writable = True
        self._pump_scheduled = False
        self._handshake_in = bytearray(HANDSHAKE_READ_BYTES)

    # --- asyncio callbacks ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        transport.set_write_buffer_limits(high=PUMP_BYTES)  # type: ignore[attr-defined]
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        self._timer = asyncio.get_running_loop().call_later(self._handshake_timeout_s, self._handshake_timed_out)
        self._flush_handshake()

    def get_buffer(self, sizehint: int) -> memoryview:
        if self.handshake.stage is Stage.ESTABLISHED:
            return self.handshake.channel.get_buffer(sizehint)
        return memoryview(self._handshake_in)  # copied out in buffer_updated: the handshake is small

    def buffer_updated(self, nbytes: int) -> None:
        if self.handshake.stage is Stage.ESTABLISHED:
            self.handshake.channel.buffer_updated(nbytes)
            self._guarded(self._open_frames)
        else:
            self.data_received(bytes(self._handshake_in[:nbytes]))

    def data_received(self, data: bytes) -> None:
        """Bytes from the peer, as a plain Protocol gets them (the handshake's, and tests')."""
        self._guarded(self._receive, data)

    def _receive(self, data: bytes) -> None:
        if self.handshake.stage is Stage.WAITING:
            self.handshake.receive_data(data)
            self._flush_handshake()
            if self.handshake.stage is Stage.ESTABLISHED:
                self._timer.cancel()
                self._on_established(self)
        else:
            self.handshake.channel.receive_data(data)
        if self.handshake.stage is Stage.ESTABLISHED:
            self._open_frames()

    def _open_frames(self) -> None:
        channel = self.handshake.channel
        while not self.closed and (frame := channel.next_frame()) is not None:
            self._on_message(self, self._decode(frame))

    def _guarded(self, step: Callable[..., None], *args: bytes) -> None:
        """Run `step`: whatever the peer's bytes make it raise is refused; nothing raises out of here."""
        if self.closed:
            return
        try:
            step(*args)
        except HandshakeFailed as exc:
            self._refuse(exc.reason, str(exc))
        except RemoteProtocolError as exc:
            reason = "tampered" if type(exc).__name__ == "TamperedFrame" else type(exc).__name__.lower()
            self._refuse(reason, str(exc))
        except Exception:
            log.exception("mate link with %s: internal error", self.peer)
            self.close("internal error")

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if not self.closed:
            if self.handshake.stage is Stage.WAITING:  # a truncated handshake: counted like any refusal
                self.counters["handshake_incomplete"] += 1
                log.warning("mate link with %s refused (handshake_incomplete): the connection ended "
                            "before the handshake finished", self.peer)
            self.closed = True
            self.close_reason = f"connection lost ({exc})" if exc else "the peer closed the connection"
            self._on_closed(self, self.close_reason)

    def pause_writing(self) -> None:
        self._writable = False  # the pump waits; our reading bound is checked in _pump()

    def resume_writing(self) -> None:
        self._writable = True
        if self.transport is not None and not self.closed:
            self.transport.resume_reading()
            self._pump()

    # --- used by the replication ends ------------------------------------------------------------

    def send(self, messages: list[Message]) -> None:
        if self.closed or not messages:
            return
        assert self.handshake.stage is Stage.ESTABLISHED, "send() before on_established"
        self._outbox.extend(messages)
        self._pump()

    @property
    def unsent(self) -> int:
        """Messages queued and not yet sealed."""
        return len(self._outbox)

    def close(self, why: str) -> None:
        if self.closed:
            return
        self.closed = True
        self.close_reason = why
        if self.transport is not None:
            self.transport.abort()  # a link in doubt is cut, not drained: resync starts from a clean state
        self._on_closed(self, why)

    # --- internals ------------------------------------------------------------------------------

    def _pump(self) -> None:
        """Seal and write up to PUMP_BYTES of queued messages; the rest on the next turn, or once drained."""
        self._pump_scheduled = False
        if self.closed or not self._writable:
            return
        channel, parts, size = self.handshake.channel, [], 0
        while self._outbox and size < PUMP_BYTES:
            header, sealed = channel.seal_parts(self._encode(self._outbox.popleft()))
            parts += header, sealed
            size += len(header) + len(sealed)
        if parts:
            self.transport.write(b"".join(parts))  # one buffer, one send (may call pause_writing)
        if self.transport.get_write_buffer_size() > self._max_write_buffer:
            self.transport.pause_reading()  # the peer reads nothing: stop taking its input meanwhile
        if self._outbox and self._writable and not self._pump_scheduled:
            self._pump_scheduled = True
            asyncio.get_running_loop().call_soon(self._pump)

    def _flush_handshake(self) -> None:
        out = self.handshake.data_to_send()
        if out and self.transport is not None:
            self.transport.write(out)

    def _handshake_timed_out(self) -> None:
        if self.handshake.stage is not Stage.ESTABLISHED:
            self._refuse("handshake_timeout", f"no handshake within {self._handshake_timeout_s} s")

    def _refuse(self, reason: str, detail: str) -> None:
        self.counters[reason] += 1
        log.warning("mate link with %s refused (%s): %s", self.peer, reason, detail)
        self.close(f"{reason}: {detail}")

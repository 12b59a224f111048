"""The mate link's connection adapter (mate_link/transport.py) over real loopback sockets."""

from __future__ import annotations

import asyncio
import functools
import os

from pairmq.appliance.roles import Role
from pairmq.mate_link.messages import Ack, Ping
from pairmq.mate_link.secure import ActiveHandshake, StandbyHandshake
from pairmq.mate_link.transport import LinkCounters, MateConnection

SECRET, GROUP = b"k" * 32, "plant-7"


def in_a_loop(test):
    """Run the coroutine test in a fresh event loop, bounded in time."""
    @functools.wraps(test)
    def run():
        asyncio.run(asyncio.wait_for(test(), 20))
    return run


class End:
    """One side: its connection, what it received, how it ended."""

    def __init__(self, handshake, **kw) -> None:
        self.counters = LinkCounters()
        self.received: asyncio.Queue = asyncio.Queue()
        self.established = asyncio.Event()
        self.ended: asyncio.Future = asyncio.get_running_loop().create_future()
        self.conn = MateConnection(handshake, counters=self.counters,
                                   on_established=lambda c: self.established.set(),
                                   on_message=lambda c, m: self.received.put_nowait(m),
                                   on_closed=lambda c, why: self.ended.done() or self.ended.set_result(why), **kw)


async def serve(active: End) -> asyncio.Server:
    return await asyncio.get_running_loop().create_server(lambda: active.conn, "127.0.0.1", 0)


def port_of(server: asyncio.Server) -> int:
    return server.sockets[0].getsockname()[1]


async def dial(port: int, standby: End) -> None:
    await asyncio.get_running_loop().create_connection(lambda: standby.conn, "127.0.0.1", port)


def active_end(secret=SECRET, **kw) -> End:
    return End(ActiveHandshake(secret, GROUP, Role.PRIMARY, os.urandom(32)), **kw)


def standby_end(secret=SECRET, **kw) -> End:
    return End(StandbyHandshake(secret, GROUP, Role.BACKUP, os.urandom(32)), **kw)


@in_a_loop
async def test_a_link_carries_messages_both_ways():
    active, standby = active_end(), standby_end()
    server = await serve(active)
    await dial(port_of(server), standby)
    await asyncio.wait_for(asyncio.gather(active.established.wait(), standby.established.wait()), 5)
    active.conn.send([Ping(3, 111), Ping(3, 112)])
    standby.conn.send([Ack(3, 42)])
    assert [await asyncio.wait_for(standby.received.get(), 5) for _ in range(2)] == [Ping(3, 111), Ping(3, 112)]
    assert await asyncio.wait_for(active.received.get(), 5) == Ack(3, 42)
    standby.conn.close("test over")
    assert await asyncio.wait_for(active.ended, 5)
    server.close()


class CountedSends:
    """The socket's transport, counting the sends asked of it and the buffers of each."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self.buffers: list[int] = []  # per send

    def write(self, data: bytes) -> None:
        self.buffers.append(1)
        self._transport.write(data)

    def writelines(self, parts) -> None:
        parts = list(parts)
        self.buffers.append(len(parts))
        self._transport.writelines(parts)

    def __getattr__(self, name: str):
        return getattr(self._transport, name)


@in_a_loop
async def test_the_frames_of_one_turn_leave_in_one_send_and_open_in_order():
    active, standby = active_end(), standby_end()
    server = await serve(active)
    await dial(port_of(server), standby)
    await asyncio.wait_for(asyncio.gather(active.established.wait(), standby.established.wait()), 5)
    counted = active.conn.transport = CountedSends(active.conn.transport)
    sent = [Ping(3, 100 + i) for i in range(20)]
    active.conn.send(sent[:12])
    active.conn.send(sent[12:])  # a second call in the same turn: its own send
    assert [await asyncio.wait_for(standby.received.get(), 5) for _ in sent] == sent
    assert counted.buffers == [1, 1] and active.conn.handshake.channel.frames_sent == 20  # one buffer a send
    standby.conn.close("test over")
    assert await asyncio.wait_for(active.ended, 5)
    server.close()


@in_a_loop
async def test_a_standby_with_another_secret_is_refused_and_counted():
    active, standby = active_end(), standby_end(secret=b"x" * 32)
    server = await serve(active)
    await dial(port_of(server), standby)
    assert "bad_proof" in await asyncio.wait_for(standby.ended, 5)
    assert standby.counters["bad_proof"] == 1 and not active.established.is_set()
    await asyncio.wait_for(active.ended, 5)
    server.close()


@in_a_loop
async def test_garbage_and_silence_are_refused_and_counted():
    active = active_end()
    server = await serve(active)
    _, writer = await asyncio.open_connection("127.0.0.1", port_of(server))
    writer.write(b"GET / HTTP/1.1\r\n\r\n")
    assert "malformed" in await asyncio.wait_for(active.ended, 5)
    silent = active_end(handshake_timeout_s=0.2)
    server2 = await asyncio.get_running_loop().create_server(lambda: silent.conn, "127.0.0.1", 0)
    _, quiet = await asyncio.open_connection("127.0.0.1", port_of(server2))
    assert "handshake_timeout" in await asyncio.wait_for(silent.ended, 5)
    assert active.counters["malformed"] == silent.counters["handshake_timeout"] == 1
    writer.close(), quiet.close(), server.close(), server2.close()


@in_a_loop
async def test_a_byte_flipped_in_transit_closes_the_link():
    """A man in the middle without the secret: the handshake passes through, then one bit of a frame changes."""
    active, standby = active_end(), standby_end()
    server = await serve(active)
    flip = asyncio.Event()

    async def relay(reader, writer, tamper):
        while data := await reader.read(65536):
            if tamper and flip.is_set():
                data = data[:-1] + bytes([data[-1] ^ 1])
            writer.write(data)
        writer.close()

    async def on_client(c_reader, c_writer):
        s_reader, s_writer = await asyncio.open_connection("127.0.0.1", port_of(server))
        await asyncio.gather(relay(c_reader, s_writer, False), relay(s_reader, c_writer, True))

    proxy = await asyncio.start_server(on_client, "127.0.0.1", 0)
    await dial(port_of(proxy), standby)
    await asyncio.wait_for(asyncio.gather(active.established.wait(), standby.established.wait()), 5)
    active.conn.send([Ping(3, 1)])
    assert await asyncio.wait_for(standby.received.get(), 5) == Ping(3, 1)
    flip.set()
    active.conn.send([Ping(3, 2)])
    assert "tampered" in await asyncio.wait_for(standby.ended, 5)
    assert standby.received.empty() and standby.counters["tampered"] == 1
    proxy.close(), server.close()
    for task in asyncio.all_tasks() - {asyncio.current_task()}:
        task.cancel()  # the relays


@in_a_loop
async def test_a_fault_raised_by_the_receiver_closes_the_link_with_its_reason():
    from pairmq.mate_link.active import LinkFault

    active, standby = active_end(), standby_end()

    def refuse(conn, m):
        raise LinkFault("an ACK for op 9, but we shipped only up to 3")

    active.conn._on_message = refuse
    server = await serve(active)
    await dial(port_of(server), standby)
    await asyncio.wait_for(standby.established.wait(), 5)
    standby.conn.send([Ack(3, 9)])
    assert "shipped only up to 3" in await asyncio.wait_for(active.ended, 5)
    assert active.counters["linkfault"] == 1
    server.close()


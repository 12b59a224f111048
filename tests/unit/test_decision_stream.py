"""The decision feed behind `/api/v1/decisions/stream` on a real aiohttp server (a free port on the
group's loopback address): decisions published from another thread reach every stream in order, and a
client that stops reading is dropped instead of holding memory or the loop."""

from __future__ import annotations

import asyncio
import socket
import threading

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from pairmq.appliance.api import decisions
from pairmq.appliance.api.decisions import HISTORY, DecisionFeed
from pairmq.appliance.quorum.state import Decision
from pairmq.appliance.roles import Role
from tests.harness.group import LOOPBACK

HOST = LOOPBACK[Role.MONITOR]


def decision(n: int, reason: str = "") -> Decision:
    return Decision(1_000 + n, Role.BACKUP, "sync", 2, reason or f"backup: decision {n}")


async def serve(feed: DecisionFeed) -> TestClient:
    app = web.Application()
    app.router.add_get("/stream", feed.stream)
    client = TestClient(TestServer(app, host=HOST, port=0))
    await client.start_server()
    feed.attach(asyncio.get_running_loop())
    return client


async def read_events(response, count: int) -> list[tuple[str, str]]:
    """(event, id) of the next `count` events, keep-alives skipped."""
    out, event, event_id = [], None, None
    while len(out) < count:
        line = (await asyncio.wait_for(response.content.readline(), 10)).decode().rstrip("\n")
        if line.startswith("event: "):
            event = line[7:]
        elif line.startswith("id: "):
            event_id = line[4:]
        elif line == "" and event is not None:
            out.append((event, event_id))
            event, event_id = None, None
    return out


def test_decisions_from_another_thread_reach_every_stream_in_order():
    async def main():
        feed = DecisionFeed("backup", incarnation=7)
        feed.publish(decision(1), 1_001)
        client = await serve(feed)
        try:
            first = await client.get("/stream")
            second = await client.get("/stream", headers={"Last-Event-ID": "7-1"})
            assert first.headers["Content-Type"] == "text/event-stream"
            assert await read_events(first, 2) == [("decision", "7-1"), ("live", None)]
            assert await read_events(second, 1) == [("live", None)]  # it had 7-1 already
            thread = threading.Thread(target=lambda: [feed.publish(decision(n), 2_000) for n in range(2, 6)])
            thread.start()
            expected = [("decision", f"7-{n}") for n in range(2, 6)]
            assert await read_events(first, 4) == expected
            assert await read_events(second, 4) == expected
            thread.join()
            assert feed.streams == 2 and feed.dropped == 0
        finally:
            feed.close()
            await client.close()
        assert feed.streams == 0

    asyncio.run(main())


def test_a_client_that_stops_reading_is_dropped(monkeypatch):
    monkeypatch.setattr(decisions, "WRITE_TIMEOUT_S", 0.5)

    async def main():
        feed = DecisionFeed("backup", incarnation=1)
        client = await serve(feed)
        loop = asyncio.get_running_loop()
        slow = socket.socket()
        slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        try:
            await loop.sock_connect(slow, (HOST, client.port))
            await loop.sock_sendall(slow, f"GET /stream HTTP/1.1\r\nHost: {HOST}\r\n\r\n".encode())
            for _ in range(200):
                if feed.streams:
                    break
                await asyncio.sleep(0.02)
            assert feed.streams == 1
            big = "x" * 65_536
            for n in range(1, 4 * HISTORY):  # 16 MB offered to a reader that takes nothing
                feed.publish(decision(n, big), 2_000)
                await asyncio.sleep(0.01)
                if feed.dropped:
                    break
            for _ in range(200):
                if not feed.streams:
                    break
                await asyncio.sleep(0.05)
            assert feed.dropped == 1 and feed.streams == 0, (feed.dropped, feed.streams)
            assert len(feed.after(0)[0]) == HISTORY  # the ring stays bounded whatever the readers do
        finally:
            slow.close()
            feed.close()
            await client.close()

    asyncio.run(main())

"""Overload protection of the MQTT listener over real sockets: CONNECT queue, connection limit, in-flight window,
slow readers. The listener (with a real BrokerService on a real spool where the test needs one) runs on an event
loop in a background thread; clients are raw sockets and asyncio connections from the test thread."""

from __future__ import annotations

import asyncio
import logging
import resource
import socket
import threading
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pairmq.appliance.broker.service import BrokerService
from pairmq.appliance.mqtt.codec import Connack, Connect, Disconnect, PingReq, PingResp
from pairmq.appliance.mqtt.listener import MqttListener
from pairmq.appliance.mqtt.overload import OverloadLimits
from pairmq.appliance.mqtt.packets import Puback, Suback, Subscribe, Subscription
from pairmq.appliance.mqtt.properties import PropertyId
from pairmq.appliance.mqtt.publish import Publish
from pairmq.appliance.mqtt.wire import MQTT_3_1_1, MQTT_5, ReasonCode
from tests.harness.commit_gate import commits_stalled
from tests.unit.test_mqtt_listener import HOST, Events, FlipGate, LoopThread, Raw

R = ReasonCode
TIMEOUT_S = 10.0


class UvLoopThread(LoopThread):
    """The nodes run under uvloop when it is installed: the listener must behave the same on it."""

    def __init__(self) -> None:
        import uvloop

        self.loop = uvloop.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()


class Node:
    def __init__(self, tmp_path, *, with_broker: bool = False, loop_kind: str = "asyncio", **kw) -> None:
        self.gate, self.events = FlipGate(), Events()
        self.loop = UvLoopThread() if loop_kind == "uvloop" else LoopThread()
        self.broker = None
        if with_broker:
            self.broker = BrokerService.open(tmp_path / "spool", epoch=lambda: 1)
            self.loop.run(self.broker.start())
        self.listener = MqttListener(HOST, 0, self.gate, on_event=self.events, broker=self.broker, **kw)
        self.loop.run(self.listener.start())
        self.port = self.listener.port

    def stats(self) -> dict:
        return self.loop.call(self.listener.stats)

    def close(self) -> None:
        try:
            self.loop.run(self.listener.stop(), timeout=TIMEOUT_S)
            if self.broker is not None:
                self.loop.run(self.broker.stop())
        finally:
            self.loop.close()


@pytest.fixture(params=["asyncio", "uvloop"])
def node_factory(request, tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="pairmq.appliance")
    made: list[Node] = []

    def make(**kw) -> Node:
        made.append(Node(tmp_path / f"node{len(made)}", loop_kind=request.param, **kw))
        return made[-1]

    yield make
    for node in made:
        node.close()
    bugs = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not bugs, [r.getMessage() for r in bugs]


def need_fds(n: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < n <= hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (n, hard))
    elif soft < n:
        pytest.fail(f"this test needs {n} open files; the hard limit is {hard} (raise it with ulimit -Hn)")


async def storm(port: int, n: int, version_of=lambda i: MQTT_3_1_1) -> list[tuple[int, Connack | None]]:
    """n clients connect at once; (version, CONNACK or None if the connection ended without one) for each."""

    async def one(i: int):
        version = version_of(i)
        reader, writer = await asyncio.open_connection(HOST, port)
        writer.write(Connect(version, f"storm-{i}").encode())
        try:
            data = await reader.read(64)  # a CONNACK is one small read
        except ConnectionError:
            data = b""
        return version, writer, data

    results = await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(n))), TIMEOUT_S * 3)
    out = []
    for version, writer, data in results:
        out.append((version, _connack(data, version)))
        writer.transport.abort()
    return out


def _connack(data: bytes, version: int) -> Connack | None:
    from pairmq.appliance.mqtt.codec import decode_packet, parse_fixed_header

    header = parse_fixed_header(data)
    if header is None or len(data) < header.packet_size:
        return None
    return decode_packet(header, data[header.header_length:header.packet_size], version)


def test_a_storm_of_thousands_gets_no_refusal(node_factory):
    n = 3000
    need_fds(2 * n + 200)
    node = node_factory(with_broker=True)
    results = asyncio.run(storm(node.port, n, lambda i: MQTT_5 if i % 2 else MQTT_3_1_1))
    codes = [c.reason_code if c else None for _, c in results]
    assert codes.count(R.SUCCESS) == n, {code: codes.count(code) for code in set(codes)}
    stats = node.stats()
    assert stats["busy_refusals"] == 0 and stats["limit_refusals"] == 0


def test_a_tiny_queue_refuses_the_overflow_with_server_busy(node_factory):
    node = node_factory(connect_queue_size=3, connect_batch=1)
    n = 200
    socks = [socket.create_connection((HOST, node.port), timeout=TIMEOUT_S) for _ in range(n)]
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while node.stats()["connections"] < n:
            assert time.monotonic() < deadline, node.stats()
            time.sleep(0.01)
        # Every connection is accepted; the loop is held while the CONNECTs are sent, so it reads them all in one
        # turn and the queue overflows (sent one by one to a free loop, each would be admitted before the next).
        release = threading.Event()
        node.loop.loop.call_soon_threadsafe(release.wait, TIMEOUT_S)
        versions = [MQTT_5 if i % 2 else MQTT_3_1_1 for i in range(n)]
        try:
            for i, (s, v) in enumerate(zip(socks, versions)):
                s.sendall(Connect(v, f"tiny-{i}").encode())
        finally:
            release.set()
        replies = []
        for s, v in zip(socks, versions):
            data = b""
            while True:  # the whole CONNACK, then either silence (accepted) or the end of the stream (refused)
                connack = _connack(data, v)
                if connack is not None:
                    break
                chunk = s.recv(256)
                assert chunk, f"closed without a CONNACK: {data!r}"
                data += chunk
            replies.append((v, connack))
    finally:
        for s in socks:
            s.close()
    ok = [c for _, c in replies if c.reason_code == R.SUCCESS]
    busy = [(v, c) for v, c in replies if c.reason_code != R.SUCCESS]
    assert len(ok) >= 3 and busy, (len(ok), len(busy))
    for v, c in busy:
        if v == MQTT_5:
            assert c.reason_code == R.SERVER_BUSY
            assert c.properties[PropertyId.REASON_STRING].startswith("server busy: ")
        else:
            assert c.reason_code == R.SERVER_UNAVAILABLE  # 3.1.1 return code 3
    stats = node.stats()
    assert stats["busy_refusals"] == len(busy) and stats["limit_refusals"] == 0
    refused = node.events.expect("client_refused", reason_code=R.SERVER_BUSY)
    assert "CONNECTs waiting" in refused["reason"]
    # every connection ended or was accepted: nothing hangs; the listener still serves
    raw = Raw(node.port)
    raw.send(Connect(MQTT_5, "after").encode())
    assert raw.read_packet(MQTT_5).reason_code == R.SUCCESS
    raw.close()


def test_the_connection_limit_refuses_with_server_busy(node_factory):
    node = node_factory(max_connections=3)
    raws = [Raw(node.port) for _ in range(3)]
    for i, raw in enumerate(raws):
        raw.send(Connect(MQTT_5, f"c{i}").encode())
        assert raw.read_packet(MQTT_5).reason_code == R.SUCCESS
    over5 = Raw(node.port)
    over5.send(Connect(MQTT_5, "over5").encode())
    connack = over5.read_packet(MQTT_5)
    assert connack.reason_code == R.SERVER_BUSY
    assert connack.properties[PropertyId.REASON_STRING] == "server busy: connection limit 3 reached"
    assert over5.read_packet(MQTT_5) is None
    over3 = Raw(node.port)
    over3.send(Connect(MQTT_3_1_1, "over3").encode())
    assert over3.read_bytes_to_eof() == b"\x20\x02\x00\x03"
    refused = node.events.expect("client_refused", client_id="over3", return_code=3)
    assert refused["reason"] == "server busy: connection limit 3 reached"
    assert node.stats()["limit_refusals"] == 2
    raws[0].send(Disconnect().encode(MQTT_5))
    node.events.expect("client_closed", client_id="c0")
    again = Raw(node.port)
    again.send(Connect(MQTT_5, "again").encode())
    assert again.read_packet(MQTT_5).reason_code == R.SUCCESS
    for raw in (*raws, over5, over3, again):
        raw.close()


def test_a_full_window_stops_reading_the_publisher_until_commits_complete(node_factory):
    node = node_factory(with_broker=True)
    # A persistent subscriber, gone: every QoS 1 message is stored and queued, so its PUBACK waits for a commit.
    sub = Raw(node.port)
    sub.send(Connect(MQTT_3_1_1, "keeper", clean_start=False).encode())
    assert sub.read_packet(MQTT_3_1_1).reason_code == R.SUCCESS
    sub.send(Subscribe(1, (Subscription("w/t", 1),)).encode(MQTT_3_1_1))
    sub.read_packet(MQTT_3_1_1)
    sub.send(Disconnect().encode(MQTT_3_1_1))
    sub.close()
    pub = Raw(node.port)
    pub.send(Connect(MQTT_3_1_1, "fast").encode())
    assert pub.read_packet(MQTT_3_1_1).reason_code == R.SUCCESS
    payload = bytes(32 * 1024)
    packets = [Publish("w/t", payload, qos=1, packet_id=i).encode(MQTT_3_1_1) for i in range(1, 4001)]
    # The spool's commits wait at a gate (the broker's backpressure is tested, not the disk) until the block ends.
    with commits_stalled(node.broker.spool):
        pub.sock.setblocking(False)
        stream = memoryview(b"".join(packets))
        sent = 0
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            try:
                sent += pub.sock.send(stream[sent:sent + 65536])
                deadline = time.monotonic() + 0.5  # until the buffers stay full for half a second
            except BlockingIOError:
                time.sleep(0.01)
        assert sent < len(stream), "the whole stream was taken: the publisher was never stopped"
        stats = node.stats()
        assert stats["window"] == 100 and stats["throttled_clients"] == 1 and stats["throttle_events"] >= 1
        assert sent > 100 * len(packets[0]), "stopped before the window was full"
    pub.sock.setblocking(True)
    pub.sock.settimeout(TIMEOUT_S)
    full = sent // len(packets[0]) + (sent % len(packets[0]) > 0)
    pub.send(bytes(stream[sent:full * len(packets[0])]))  # finish the packet that was cut
    acked = set()
    while len(acked) < full:
        ack = pub.read_packet(MQTT_3_1_1)
        assert isinstance(ack, Puback), ack
        acked.add(ack.packet_id)
    assert acked == set(range(1, full + 1))
    assert node.stats()["throttled_clients"] == 0
    pub.close()


def test_a_reader_that_never_reads_is_aborted_without_blocking_others(node_factory):
    node = node_factory(with_broker=True, write_timeout_s=0.5)
    slow = socket.socket()
    slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    slow.settimeout(TIMEOUT_S)
    slow.connect((HOST, node.port))
    slow.sendall(Connect(MQTT_3_1_1, "slow").encode() + Subscribe(1, (Subscription("s/t", 0),)).encode(MQTT_3_1_1))
    node.events.expect("client_accepted", client_id="slow")
    time.sleep(0.2)  # the SUBSCRIBE's commit
    pub = Raw(node.port)
    pub.send(Connect(MQTT_3_1_1, "flood").encode())
    assert pub.read_packet(MQTT_3_1_1).reason_code == R.SUCCESS
    other = Raw(node.port)
    other.send(Connect(MQTT_5, "other").encode())
    assert other.read_packet(MQTT_5).reason_code == R.SUCCESS
    chunk = Publish("s/t", bytes(20_000)).encode(MQTT_3_1_1)  # slow enough never to reach max_output_bytes
    started = time.monotonic()
    closed = None
    while closed is None and time.monotonic() - started < TIMEOUT_S:
        pub.send(chunk)
        time.sleep(0.005)
        other.send(PingReq().encode(MQTT_5))
        assert other.read_packet(MQTT_5) == PingResp(), "another client waited behind the slow reader"
        closed = next((f for k, f in node.events.seen if k == "client_closed" and f["client_id"] == "slow"), None)
    assert closed is not None, "the slow reader was never aborted"
    assert closed["reason"] == "the client read nothing we sent for 0.5 s"
    assert time.monotonic() - started >= 0.5  # aborted only after the stall threshold
    for c in (pub, other):
        c.close()
    slow.close()


def test_output_past_the_limit_aborts_at_once(node_factory):
    node = node_factory(with_broker=True, max_output_bytes=1 << 20)
    slow = socket.socket()
    slow.settimeout(TIMEOUT_S)
    slow.connect((HOST, node.port))
    slow.sendall(Connect(MQTT_3_1_1, "hoarder").encode() + Subscribe(1, (Subscription("h/t", 0),)).encode(MQTT_3_1_1))
    node.events.expect("client_accepted", client_id="hoarder")
    pub = Raw(node.port)
    pub.send(Connect(MQTT_3_1_1, "flood").encode())
    assert pub.read_packet(MQTT_3_1_1).reason_code == R.SUCCESS
    time.sleep(0.2)  # the SUBSCRIBE's commit
    chunk = Publish("h/t", bytes(60_000)).encode(MQTT_3_1_1) * 8
    for _ in range(200):
        pub.send(chunk)
        if any(k == "client_closed" and f["client_id"] == "hoarder" for k, f in node.events.seen):
            break
    closed = node.events.expect("client_closed", client_id="hoarder")
    assert closed["reason"] == "more than 1048576 bytes wait for the client to read them"
    pub.close()
    slow.close()


def test_packets_pipelined_behind_a_queued_connect_are_handled_after_the_connack(node_factory):
    node = node_factory()
    raw = Raw(node.port)
    raw.send(Connect(MQTT_5, "pipe").encode() + PingReq().encode(MQTT_5) + b"\xc1\x00")  # then a bad PINGREQ
    assert raw.read_packet(MQTT_5).reason_code == R.SUCCESS
    assert raw.read_packet(MQTT_5) == PingResp()
    bad = raw.read_packet(MQTT_5)
    assert isinstance(bad, Disconnect) and bad.reason_code == R.MALFORMED_PACKET
    assert raw.read_packet(MQTT_5) is None
    node.events.expect("client_closed", client_id="pipe", reason=lambda r: r.startswith("bad packet"))
    raw.close()


@given(topic=st.text(st.characters(blacklist_characters="+#\x00", blacklist_categories=("Cs",)), min_size=1,
                     max_size=40),
       payload=st.binary(max_size=300), qos=st.integers(0, 2), retain=st.booleans(), dup=st.booleans(),
       packet_id=st.integers(1, 65535), version=st.sampled_from([MQTT_3_1_1, MQTT_5]))
def test_the_plain_publish_fast_path_makes_the_codecs_bytes(topic, payload, qos, retain, dup, packet_id, version):
    listener = MqttListener(HOST, 0, FlipGate())
    packet = Publish(topic, payload, qos=qos, retain=retain, dup=dup and qos > 0,
                     packet_id=packet_id if qos else None)
    encode = listener.traffic.plain_publish.encode
    assert encode(packet, version) is None  # first use: the full encoder validates
    assert encode(packet, version) == packet.encode(version)


def test_the_traffic_counts_every_packet_and_byte_both_ways(node_factory):
    """What the stats, $SYS and /metrics report, counted by the connections: a publisher and a subscriber, every
    packet and byte each sent and read, exactly."""
    node = node_factory(with_broker=True)
    sent, read = [], []

    def send(client: Raw, *packets) -> None:
        data = b"".join(p.encode(MQTT_3_1_1) for p in packets)
        client.send(data)
        sent.extend(packets)

    def receive(client: Raw, kind: type):
        packet = client.read_packet(MQTT_3_1_1)
        assert isinstance(packet, kind), packet
        read.append(packet)
        return packet

    sub, pub = Raw(node.port), Raw(node.port)
    send(sub, Connect(MQTT_3_1_1, "counted-sub"), Subscribe(1, (Subscription("c/t", 1),)))
    receive(sub, Connack)
    receive(sub, Suback)
    send(pub, Connect(MQTT_3_1_1, "counted-pub"))
    receive(pub, Connack)
    send(pub, *(Publish("c/t", b"m%d" % i, qos=1, packet_id=i) for i in range(1, 6)))  # one write, one read
    for _ in range(5):
        receive(pub, Puback)
    deliveries = [receive(sub, Publish) for _ in range(5)]
    send(sub, *(Puback(d.packet_id) for d in deliveries))

    def counts() -> tuple[int, ...]:
        return node.loop.call(lambda: (node.listener.packets_in, node.listener.bytes_in, node.listener.messages_in,
                                       node.listener.packets_out, node.listener.bytes_out,
                                       node.listener.messages_out))

    expected = (len(sent), sum(len(p.encode(MQTT_3_1_1)) for p in sent), 5,
                len(read), sum(len(p.encode(MQTT_3_1_1)) for p in read), 5)
    deadline = time.monotonic() + TIMEOUT_S
    while counts() != expected and time.monotonic() < deadline:
        time.sleep(0.01)  # the subscriber's PUBACKs are read in a callback of their own
    assert counts() == expected
    assert node.stats()["messages_in"] == 5 and node.stats()["messages_out"] == 5
    sub.close()
    pub.close()


def test_credential_checks_run_bounded_and_refuse_or_time_out(node_factory):
    running, most = [0], [0]

    async def check(connect: Connect, peer: str):
        running[0] += 1
        most[0] = max(most[0], running[0])
        try:
            if connect.username == "hang":
                await asyncio.sleep(60)
            await asyncio.sleep(0.05)
            return R.BAD_USER_NAME_OR_PASSWORD if connect.username == "bad" else None
        finally:
            running[0] -= 1

    node = node_factory(credential_check=check, max_connect_checks=2, connect_timeout_s=1.0)
    clients = []
    for i in range(6):
        raw = Raw(node.port)
        name = "bad" if i == 3 else "hang" if i == 5 else "good"
        raw.send(Connect(MQTT_5, f"cred-{i}", username=name).encode())
        clients.append((name, raw))
    for name, raw in clients:
        raw.sock.settimeout(TIMEOUT_S)
        connack = raw.read_packet(MQTT_5)
        expected = {"good": R.SUCCESS, "bad": R.BAD_USER_NAME_OR_PASSWORD, "hang": R.SERVER_UNAVAILABLE}[name]
        assert connack.reason_code == expected, (name, connack)
        raw.close()
    assert most[0] == 2, most
    node.events.expect("client_refused", client_id="cred-3", reason="credentials refused")
    node.events.expect("client_refused", client_id="cred-5", reason="no credential check answer within 1.0 s")


def test_a_commit_backlog_shrinks_the_window_and_it_grows_back(node_factory):
    node = node_factory(with_broker=True, overload=OverloadLimits(backlog_low_ops=0, backlog_high_ops=20))
    sub = Raw(node.port)
    sub.send(Connect(MQTT_3_1_1, "keeper2", clean_start=False).encode())
    assert sub.read_packet(MQTT_3_1_1).reason_code == R.SUCCESS
    sub.send(Subscribe(1, (Subscription("b/t", 1),)).encode(MQTT_3_1_1))
    sub.read_packet(MQTT_3_1_1)
    sub.send(Disconnect().encode(MQTT_3_1_1))
    sub.close()
    pub = Raw(node.port)
    pub.send(Connect(MQTT_3_1_1, "backlogged").encode())
    assert pub.read_packet(MQTT_3_1_1).reason_code == R.SUCCESS
    with commits_stalled(node.broker.spool):  # the spool's commits wait at a gate: a backlog builds up
        pub.send(b"".join(Publish("b/t", b"x", qos=1, packet_id=i).encode(MQTT_3_1_1) for i in range(1, 201)))
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            stats = node.stats()
            if stats["window"] == 1 and stats["throttled_clients"] == 1:
                break
            time.sleep(0.02)
        assert stats["window"] == 1 and stats["throttled_clients"] == 1, stats
    acked = set()
    while len(acked) < 200:
        ack = pub.read_packet(MQTT_3_1_1)
        assert isinstance(ack, Puback), ack
        acked.add(ack.packet_id)
    deadline = time.monotonic() + 3
    while node.stats()["window"] < 100 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert node.stats()["window"] == 100 and node.stats()["throttled_clients"] == 0
    pub.close()


def test_mate_link_backpressure_holds_publishers_and_keeps_reading_subscribers(node_factory):
    """`BrokerService.mate_over_lag` (the live mate link's backlog over max_lag; set by the node's replication)
    is the input here: while it holds, a publisher is not read after its next QoS 1 PUBLISH, while a subscriber
    keeps being read (its acks drain queues); once it clears, the next lag sample reads the publisher again."""
    node = node_factory(with_broker=True)
    lagging = [False]
    node.broker.mate_over_lag = lambda: lagging[0]
    sub = Raw(node.port)
    sub.send(Connect(MQTT_3_1_1, "reader").encode())
    assert sub.read_packet(MQTT_3_1_1).reason_code == R.SUCCESS
    sub.send(Subscribe(1, (Subscription("m/t", 1),)).encode(MQTT_3_1_1))
    sub.read_packet(MQTT_3_1_1)
    pub = Raw(node.port)
    pub.send(Connect(MQTT_3_1_1, "writer").encode())
    assert pub.read_packet(MQTT_3_1_1).reason_code == R.SUCCESS

    lagging[0] = True
    pub.send(Publish("m/t", b"1", qos=1, packet_id=1).encode(MQTT_3_1_1))
    assert isinstance(pub.read_packet(MQTT_3_1_1), Puback)  # the PUBLISH that found the lag is handled
    pub.send(Publish("m/t", b"2", qos=1, packet_id=2).encode(MQTT_3_1_1) + PingReq().encode(MQTT_3_1_1))
    first = sub.read_packet(MQTT_3_1_1)
    assert first.payload == b"1"
    sub.send(Puback(first.packet_id).encode(MQTT_3_1_1) + PingReq().encode(MQTT_3_1_1))
    assert isinstance(sub.read_packet(MQTT_3_1_1), PingResp), "the subscriber is still read"
    pub.sock.settimeout(0.5)
    with pytest.raises(TimeoutError):
        pub.read_packet(MQTT_3_1_1)  # neither PUBLISH 2 nor PINGREQ was read
    sub.sock.settimeout(0.3)
    with pytest.raises(TimeoutError):
        sub.read_packet(MQTT_3_1_1)  # message 2 was never taken
    held = node.loop.call(node.broker.backpressure.view)
    assert held == {"holding": True, "episodes": 1, "publishers_held": 1, "held_ms": 0}, held

    lagging[0] = False
    pub.sock.settimeout(TIMEOUT_S)
    sub.sock.settimeout(TIMEOUT_S)
    answers = {type(pub.read_packet(MQTT_3_1_1)).__name__ for _ in range(2)}
    assert answers == {"Puback", "PingResp"}, answers  # (the PINGRESP needs no commit: it may come first)
    assert sub.read_packet(MQTT_3_1_1).payload == b"2"
    after = node.loop.call(node.broker.backpressure.view)
    assert not after["holding"] and after["episodes"] == 1 and after["held_ms"] >= 500, after
    pub.close()
    sub.close()

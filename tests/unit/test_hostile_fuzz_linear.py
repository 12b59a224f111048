"""Decoding is linear in the input: a scaled-up input costs in proportion, never more.

Each case builds an input with n repeated parts (properties, filters, ops, chunks) and one with
SCALE * n. Two costs are compared, never a duration on its own:
- Python-level function calls counted with sys.setprofile: deterministic, and catches a loop
  over what was already decoded;
- CPU of SCALE runs of the small input against one run of the big one (time.process_time, the
  best of three): catches copies inside C (a tuple or bytes rebuilt per part), which no call
  counter sees. Quadratic work at this scale is 16 times over; the bound allows 4.
An input is allowed to be refused (a cap raises the decoder's protocol error early): a refusal
is cheap, and cheap is the point.
"""

from __future__ import annotations

import gc
import json
import sys
import time
from collections.abc import Callable

import pytest

from pairmq.appliance.errors import RemoteProtocolError
from pairmq.appliance.mqtt.codec import PacketReader, decode_packet, parse_fixed_header
from pairmq.appliance.mqtt.properties import PropertyId, encode_properties
from pairmq.appliance.mqtt.wire import MQTT_3_1_1, MQTT_5, PacketType, encode_vbi
from pairmq.appliance.spool.chain import CHECKSUM_BYTES, GENESIS, ChainPoint
from pairmq.appliance.spool.records import make_commit
from pairmq.configsync import exchange
from pairmq.mate_link import messages as mate
from pairmq.mate_link.secure import SecureChannel

SCALE = 16
CALLS_SLACK = 1.25
CPU_SLACK = 4.0


def _calls(fn: Callable[[], object]) -> int:
    count = 0

    def profile(frame, event, arg) -> None:
        nonlocal count
        if event in ("call", "c_call"):
            count += 1

    # Garbage of earlier tests collected meanwhile runs its finalizers as Python calls: not the decoder's, and
    # against a compiled decoder (a handful of visible calls) they would be most of the count.
    gc.collect()
    gc.disable()
    sys.setprofile(profile)
    try:
        _run(fn)
    finally:
        sys.setprofile(None)
        gc.enable()
    return count


def _run(fn: Callable[[], object]) -> None:
    try:
        fn()
    except RemoteProtocolError:
        pass  # refused early by a cap: allowed (see the module docstring)


def _cpu(fn: Callable[[], object], repeat: int, enough: float = 0.0) -> float:
    """Best of three (a loaded machine only adds); stops early once at or under `enough`."""
    best = float("inf")
    for _ in range(3):
        start = time.process_time()
        for _ in range(repeat):
            _run(fn)
        best = min(best, time.process_time() - start)
        if best <= enough:
            break
    return best


def assert_linear(build: Callable[[int], Callable[[], object]], n: int) -> None:
    small, big = build(n), build(n * SCALE)
    calls_small, calls_big = _calls(small), _calls(big)
    assert calls_big <= SCALE * calls_small * CALLS_SLACK + 50, (
        f"{calls_big} Python calls for {SCALE}x the input, {calls_small} for 1x: super-linear")
    cpu_small = _cpu(small, SCALE)
    cpu_big = _cpu(big, 1, enough=cpu_small)
    assert cpu_big <= cpu_small * CPU_SLACK, (
        f"one {SCALE}x input cost {cpu_big / max(cpu_small, 1e-9):.1f} times {SCALE} 1x inputs: super-linear")


# --- MQTT --------------------------------------------------------------------------------------------

def _packet(first: int, body: bytes) -> bytes:
    return bytes([first]) + encode_vbi(len(body)) + body


def _decoder(data: bytes, version: int | None) -> Callable[[], object]:
    header = parse_fixed_header(data, version)
    body = data[header.header_length:]
    return lambda: decode_packet(header, body, version)


def _empty_user_properties(n: int) -> bytes:
    block = b"\x26\x00\x00\x00\x00" * n  # a quadratic decoder would stall a node on 80,000 of these
    return encode_vbi(len(block)) + block


def _connect_with_user_properties(n: int):
    body = b"\x00\x04MQTT\x05\x02\x00\x3c" + _empty_user_properties(n) + b"\x00\x01c"
    return _decoder(_packet(0x10, body), None)


def _publish_with_user_properties(n: int):
    body = b"\x00\x03a/b" + _empty_user_properties(n) + b"payload"
    return _decoder(_packet(0x30, body), MQTT_5)


def _subscribe_with_filters(version: int):
    def build(n: int):
        props = b"\x00" if version == MQTT_5 else b""
        filters = b"".join(b"\x00\x06a/%04x\x01" % (i % 65536) for i in range(n))
        return _decoder(_packet(0x82, b"\x00\x01" + props + filters), version)
    return build


def _unsubscribe_with_filters(n: int):
    filters = b"".join(b"\x00\x06a/%04x" % (i % 65536) for i in range(n))
    return _decoder(_packet(0xA2, b"\x00\x01\x00" + filters), MQTT_5)


def _user_properties_encoded(n: int):
    """The broker re-encodes what it decoded: a PUBLISH's properties go to every subscriber."""
    props = {PropertyId.USER_PROPERTY: (("", ""),) * n}
    return lambda: encode_properties(props, PacketType.PUBLISH)


def _reader_fed_in_small_chunks(n: int):
    connect = _packet(0x10, b"\x00\x04MQTT\x04\x02\x00\x3c\x00\x01c")
    publish = _packet(0x30, b"\x00\x01t" + bytes(64 * n))
    stream = connect + publish

    def run():
        reader = PacketReader(max_packet_size=1 << 24)
        for i in range(0, len(stream), 64):  # a sender trickling one big packet
            reader.feed(stream[i:i + 64])
            while reader.next_packet() is not None:
                pass
    return run


@pytest.mark.parametrize("build, n", [
    pytest.param(_connect_with_user_properties, 2000, id="connect_user_properties"),
    pytest.param(_publish_with_user_properties, 2000, id="publish_user_properties"),
    pytest.param(_subscribe_with_filters(MQTT_5), 500, id="subscribe_filters_v5"),
    pytest.param(_subscribe_with_filters(MQTT_3_1_1), 500, id="subscribe_filters_v311"),
    pytest.param(_unsubscribe_with_filters, 500, id="unsubscribe_filters"),
    pytest.param(_user_properties_encoded, 4000, id="user_properties_encode"),
    pytest.param(_reader_fed_in_small_chunks, 200, id="reader_small_chunks"),
])
def test_mqtt_decoding_is_linear(build, n):
    assert_linear(build, n)


# --- mate link and config-sync ---------------------------------------------------------------------------

def _mate_ops(n: int):
    data = mate.encode(mate.Ops(3, tuple(make_commit(GENESIS, 3, [b"op", b"op"]) for i in range(n))))
    return lambda: mate.decode(data)


def _mate_snapshot(n: int):
    data = mate.encode(mate.Snapshot(3, tuple(b"body" for _ in range(n)), ChainPoint(3, n, bytes(CHECKSUM_BYTES))))
    return lambda: mate.decode(data)


def _sealed_frame_in_small_chunks(n: int):
    key = bytes(32)
    frame = SecureChannel(send_key=key, receive_key=key).seal(bytes(64 * n))

    def run():
        channel = SecureChannel(send_key=key, receive_key=key)
        for i in range(0, len(frame), 64):
            channel.receive_data(frame[i:i + 64])
            channel.next_frame()
    return run


def _configsync_changes(n: int):
    entries = [{"version": i + 1, "chain": "c" * 64, "change": {"kind": "anonymous.set", "allowed": False}}
               for i in range(n)]
    data = json.dumps({"type": "changes", "epoch": 1, "entries": entries}).encode()
    return lambda: exchange.StandbyEnd(epoch_seen=1, now_ms=0).receive(exchange.decode(data), 1)


@pytest.mark.parametrize("build, n", [
    pytest.param(_mate_ops, 300, id="mate_ops"),
    pytest.param(_mate_snapshot, 300, id="mate_snapshot"),
    pytest.param(_sealed_frame_in_small_chunks, 200, id="mate_frame_small_chunks"),
    pytest.param(_configsync_changes, 30, id="configsync_changes"),
])
def test_link_decoding_is_linear(build, n):
    assert_linear(build, n)

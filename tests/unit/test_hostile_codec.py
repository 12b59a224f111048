"""Hostile input to the MQTT front door's sans-I/O parts: the codec, the pre-auth budget, the refusal throttle.

Outcome-based (no timing asserts): the live stall is proven on real nodes in
tests/processes/test_hostile_front_door.py.
"""

from __future__ import annotations


import pytest

from pairmq.appliance.eventlog import EventLog, EventSettings, RefusalThrottle, read_events
from pairmq.appliance.mqtt.budget import PreAuthBudget, PreAuthLimits
from pairmq.appliance.mqtt.codec import Connect, PacketReader, decode_connect
from pairmq.appliance.mqtt.properties import PropertyId, decode_properties, encode_properties
from pairmq.appliance.mqtt.wire import Cursor, PacketType, ProtocolError, ReasonCode, encode_vbi
from tests.harness.mqttraw import connect_with_properties, empty_user_properties

USER = PropertyId.USER_PROPERTY


@pytest.mark.parametrize("n", [10_000, 20_000])
def test_repeated_properties_decode_to_every_value_in_order(n):
    props = decode_properties(Cursor(empty_user_properties(n)), PacketType.CONNECT)
    assert props == {USER: (("", ""),) * n}


def test_subscription_identifiers_repeat_in_publish_and_stay_tuples():
    block = encode_properties({PropertyId.SUBSCRIPTION_IDENTIFIER: tuple(range(1, 5001))}, PacketType.PUBLISH)
    assert decode_properties(Cursor(block), PacketType.PUBLISH) == {
        PropertyId.SUBSCRIPTION_IDENTIFIER: tuple(range(1, 5001))}


def test_many_user_properties_round_trip_through_the_encoder():
    pairs = tuple((f"k{i}", f"v{i}") for i in range(10_000))
    block = encode_properties({USER: pairs}, PacketType.PUBLISH)
    assert decode_properties(Cursor(block), PacketType.PUBLISH) == {USER: pairs}


def test_a_connect_over_the_property_cap_is_packet_too_large():
    body = connect_with_properties(129)[3:]  # 129 * 5 + ... < 16 KiB: a two-byte remaining length
    with pytest.raises(ProtocolError) as err:
        decode_connect(body, max_properties=128)
    assert err.value.reason_code == ReasonCode.PACKET_TOO_LARGE
    assert err.value.protocol_version == 5  # answered with a v5 CONNACK, not a bare close
    assert decode_connect(connect_with_properties(128)[3:], max_properties=128).properties[USER] == (("", ""),) * 128


def test_the_will_properties_have_the_same_cap():
    will_props = empty_user_properties(10)
    body = (b"\x00\x04MQTT\x05\x06\x00\x3c\x00" + b"\x00\x01x" + will_props
            + b"\x00\x01t" + b"\x00\x00")
    with pytest.raises(ProtocolError) as err:
        decode_connect(body, max_properties=9)
    assert err.value.reason_code == ReasonCode.PACKET_TOO_LARGE
    assert decode_connect(body, max_properties=10).will.properties[USER] == (("", ""),) * 10


def test_the_80000_property_connect_is_refused_by_the_reader_before_authentication():
    reader = PacketReader(max_connect_properties=128)
    reader.feed(connect_with_properties(80_000))
    with pytest.raises(ProtocolError) as err:
        reader.next_packet()
    assert err.value.reason_code == ReasonCode.PACKET_TOO_LARGE and "more than 128 properties" in err.value.message
    assert reader.buffered_bytes == 0


def test_a_connect_over_the_size_cap_is_refused_from_its_fixed_header_alone():
    reader = PacketReader(max_connect_size=128 * 1024)
    reader.feed(b"\x10" + encode_vbi(512 * 1024))  # a 512 KiB CONNECT announced, not a byte of it sent yet
    with pytest.raises(ProtocolError) as err:
        reader.next_packet()
    assert err.value.reason_code == ReasonCode.PACKET_TOO_LARGE
    assert "allowed before authentication" in err.value.message


def test_after_connect_the_full_packet_size_and_no_property_cap_apply():
    reader = PacketReader(max_connect_size=1024, max_connect_properties=4)
    reader.feed(Connect(5, "c").encode())
    assert isinstance(reader.next_packet(), Connect)
    props = encode_properties({USER: (("a", "b"),) * 1000}, PacketType.PUBLISH)
    body = b"\x00\x01t" + props + b"x" * 4000  # a 9 KiB PUBLISH with 1000 User Properties
    reader.feed(b"\x30" + encode_vbi(len(body)) + body)
    assert len(reader.next_packet().properties[USER]) == 1000


def test_the_pre_auth_budget_caps_connections_per_address_under_pressure_and_in_total():
    budget = PreAuthBudget(PreAuthLimits(max_connections=8, max_per_address=2, max_bytes=1 << 20))
    assert [budget.open("10.0.0.1") for _ in range(4)] == [None] * 4  # a storm from one address, no pressure yet
    assert "from 10.0.0.1" in budget.open("10.0.0.1")  # half the total in use: the per-address cap applies
    assert budget.open("10.0.0.2") is None and budget.open("10.0.0.2") is None
    assert "from 10.0.0.2" in budget.open("10.0.0.2")
    assert budget.open("10.0.0.3") is None and budget.open("10.0.0.4") is None
    assert "limit 8" in budget.open("10.0.0.5")  # the total
    budget.close("10.0.0.3", 0)
    assert budget.open("10.0.0.5") is None  # a slot freed is a slot again
    assert (budget.refused_address, budget.refused_total) == (2, 1)
    for address in ("10.0.0.1",) * 4 + ("10.0.0.2",) * 2 + ("10.0.0.4", "10.0.0.5"):
        budget.close(address, 0)
    assert budget.by_address == {} and budget.connections == 0  # nothing kept per address once all are gone


def test_the_pre_auth_budget_caps_bytes_in_total():
    budget = PreAuthBudget(PreAuthLimits(max_bytes=1000))
    budget.open("a")
    budget.open("b")
    assert budget.hold(600)
    assert not budget.hold(500)  # the read that passes the cap: that connection is closed
    budget.close("b", 500)
    budget.close("a", 600)
    assert budget.bytes == 0 and budget.refused_bytes == 1


def test_the_refusal_throttle_counts_what_it_does_not_write():
    throttle = RefusalThrottle(per_source=10)
    peer = {"peer": "192.0.2.7:40000"}
    written = sum(throttle.admit("client_refused", peer, now_ms=5_000 + i // 100) for i in range(1000))
    assert written == 10
    assert throttle.admit("client_refused", {"peer": "[2001:db8::1]:5"}, now_ms=5_500)  # another source
    assert throttle.due(5_999) == []  # the window is not over yet
    [summary] = throttle.due(6_000)
    assert summary["kind"] == "client_refused" and summary["count"] == 990
    assert summary["by_source"] == {"192.0.2.7": 990} and summary["other_sources"] == 0
    assert summary["reason"].startswith("suppressed 990 client_refused events in the last 1.0 s (990 from 192.0.2.7")
    assert throttle.admit("client_refused", peer, now_ms=6_001)  # a new window


def test_the_event_log_throttles_refusals_and_writes_the_summary(tmp_path):
    log = EventLog(tmp_path, "primary", EventSettings(refusal_events_per_s=5))
    log.write("redundancy_decision", kind="activate", epoch=1, reason="test")
    for i in range(500):
        log.write("bad_packet", peer=f"198.51.100.9:{1000 + i}", reason_code=0x81)
    log.write("client_accepted", client_id="ok", peer="198.51.100.9:1")
    log.close()  # a window still open is summed at close: counted, not lost
    events = read_events(tmp_path)
    kinds = [e["event"] for e in events]
    assert kinds.count("bad_packet") == 5 and "client_accepted" in kinds and "redundancy_decision" in kinds
    [summary] = [e for e in events if e["event"] == "events_suppressed"]
    assert (summary["kind"], summary["count"], summary["by_source"]) == ("bad_packet", 495, {"198.51.100.9": 495})
    assert log.view()["suppressed"] == 495

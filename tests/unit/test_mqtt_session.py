"""The sans-I/O MQTT session (appliance/mqtt/session.py): time passed in, bytes asserted, no sockets or sleeps."""

from __future__ import annotations

import pytest

from pairmq.appliance.mqtt.codec import (
    Connack, Connect, Disconnect, PingReq, PingResp, Will, decode_packet, parse_fixed_header,
)
from pairmq.appliance.mqtt.packets import Subscribe, Subscription
from pairmq.appliance.mqtt.properties import PropertyId as P
from pairmq.appliance.mqtt.publish import Publish
from pairmq.appliance.mqtt.session import (
    HANDLED, NOT_SUPPORTED_YET, WILL_TOPIC_RESERVED, FrontDoor, MqttSession, Phase, SessionLimits,
)
from pairmq.appliance.mqtt.wire import MQTT_3_1_1, MQTT_5, ReasonCode as R

T0 = 1_000_000  # any monotonic instant, in ms
CONNECT_TIMEOUT_S = 10.0
VERSIONS = pytest.mark.parametrize("version", [MQTT_3_1_1, MQTT_5], ids=["v311", "v5"])


class Harness:
    """One session with its narrow dependencies as plain values the test can change."""

    def __init__(self, *, broker: bool = False, serving: bool = True, reference: str | None = None,
                 max_keep_alive_s: int = 0) -> None:
        self.serving = serving
        self.reference = reference
        self.gate_asks = 0
        self.events: list[tuple[str, dict]] = []
        self.opened: list[Connect] = []
        limits = SessionLimits(max_packet_size=65536, max_connect_bytes=4096, max_connect_properties=64,
                               connect_timeout_s=CONNECT_TIMEOUT_S, max_keep_alive_s=max_keep_alive_s)
        door = FrontDoor(may_serve=self._may_serve, server_reference=lambda: self.reference,
                         emit=lambda kind, fields: self.events.append((kind, fields)),
                         new_client_id=lambda: "pairmq-assigned")
        self.session = MqttSession("192.0.2.7:50000", T0, limits, door, self._open if broker else None)

    def _may_serve(self) -> bool:
        self.gate_asks += 1
        return self.serving

    def _open(self, c: Connect) -> str:
        self.opened.append(c)
        return c.client_id or "broker-assigned"

    def feed(self, data: bytes, now_ms: int = T0) -> list:
        """What `next_event` hands on for `data`, as the adapter would take it in one turn."""
        s = self.session
        s.receive_data(data, now_ms)
        s.begin_turn()
        out = []
        while (event := s.next_event()) is not None:
            if event is not HANDLED:
                out.append(event)
        return out

    def sent(self, version: int | None) -> list:
        data = b"".join(self.session.data_to_send())
        packets = []
        while data:
            header = parse_fixed_header(data)
            packets.append(decode_packet(header, data[header.header_length:header.packet_size], version,
                                         from_client=False))
            data = data[header.packet_size:]
        return packets

    def connect(self, c: Connect, now_ms: int = T0) -> None:
        """CONNECT read, checked and accepted."""
        assert self.feed(c.encode(), now_ms) == [c]
        assert self.session.check_connect(c)
        self.session.accept(c, now_ms)

    def kinds(self) -> list[str]:
        return [kind for kind, _ in self.events]


# --- CONNECT: what is handed on, and accepted ------------------------------------------------------------

@VERSIONS
def test_a_connect_is_handed_on_and_stops_the_connect_timer(version):
    h = Harness()
    assert h.session.get_timer() == T0 + 10_000
    c = Connect(version, "c1")
    assert h.feed(c.encode()) == [c]
    assert h.session.phase is Phase.CONNECTING and h.session.get_timer() is None
    assert h.session.protocol_version == version


def test_alone_the_session_sends_connack_success_and_assigns_a_v5_client_id():
    h = Harness()
    h.connect(Connect(MQTT_5, ""))
    (connack,) = h.sent(MQTT_5)
    assert connack == Connack(R.SUCCESS, False, {P.MAXIMUM_PACKET_SIZE: 65536,
                                                 P.ASSIGNED_CLIENT_IDENTIFIER: "pairmq-assigned"})
    assert h.session.accepted and h.session.connacked and h.session.client_id == "pairmq-assigned"
    assert h.events == [("client_accepted", {
        "client_id": "pairmq-assigned", "protocol_version": MQTT_5, "peer": "192.0.2.7:50000", "keep_alive_s": 60,
        "clean_start": True, "assigned_client_id": True})]


def test_with_a_broker_the_broker_answers_and_gets_every_packet():
    h = Harness(broker=True)
    c = Connect(MQTT_3_1_1, "", username="u")
    h.connect(c)
    assert h.opened == [c] and h.sent(MQTT_3_1_1) == []  # the broker sends the CONNACK
    assert h.session.client_id == "broker-assigned" and h.session.username == "u"
    sub = Subscribe(1, (Subscription("a/b", 1),))
    pub = Publish("a/b", b"x", qos=1, packet_id=2)
    ping = PingReq()
    assert h.feed(sub.encode(MQTT_3_1_1) + pub.encode(MQTT_3_1_1) + ping.encode(MQTT_3_1_1)) == [sub, pub, ping]
    assert h.gate_asks == 2  # the CONNECT check, then once for the whole turn


def test_a_client_disconnect_is_handed_to_the_broker_and_closes():
    h = Harness(broker=True)
    h.connect(Connect(MQTT_5, "c"))
    d = Disconnect(R.DISCONNECT_WITH_WILL_MESSAGE)
    assert h.feed(d.encode(MQTT_5) + PingReq().encode(MQTT_5)) == [d]
    assert h.session.closing and h.session.close_reason == "client sent DISCONNECT 0x04"
    assert h.sent(MQTT_5) == [] and h.session.get_timer() is None


# --- CONNECT refusals, per version -----------------------------------------------------------------------

@pytest.mark.parametrize("reference, v5_answer", [
    ("10.0.0.2:1883", Connack(R.USE_ANOTHER_SERVER, False, {
        P.REASON_STRING: "not active; active is 10.0.0.2:1883", P.SERVER_REFERENCE: "10.0.0.2:1883"})),
    (None, Connack(R.SERVER_UNAVAILABLE, False, {P.REASON_STRING: "not active; active unknown"})),
], ids=["active known", "active unknown"])
@VERSIONS
def test_a_node_that_may_not_serve_refuses_the_connect(version, reference, v5_answer):
    h = Harness(serving=False, reference=reference)
    c = Connect(version, "c")
    assert h.feed(c.encode()) == [c]
    assert not h.session.check_connect(c)
    expected = v5_answer if version == MQTT_5 else Connack(R.SERVER_UNAVAILABLE)
    assert h.sent(version) == [expected]
    assert h.session.closing
    assert h.events[0][0] == "client_refused"
    fields = h.events[0][1]
    assert fields["reason_code"] == expected.reason_code
    if version == MQTT_3_1_1:
        assert fields["return_code"] == 3  # the 3.1.1 CONNACK encodes 0x88 and 0x9C as "server unavailable"


@pytest.mark.parametrize("case, c, version, answer", [
    ("empty id, no clean session", Connect(MQTT_3_1_1, "", clean_start=False), MQTT_3_1_1,
     Connack(R.CLIENT_IDENTIFIER_NOT_VALID)),
    ("enhanced auth", Connect(MQTT_5, "c", properties={P.AUTHENTICATION_METHOD: "SCRAM"}), MQTT_5,
     Connack(R.BAD_AUTHENTICATION_METHOD, False, {P.REASON_STRING: "enhanced authentication is not supported"})),
    ("v5 reserved will", Connect(MQTT_5, "c", will=Will("$SYS/x", b"")), MQTT_5,
     Connack(R.TOPIC_NAME_INVALID, False, {P.REASON_STRING: WILL_TOPIC_RESERVED})),
    ("v311 reserved will", Connect(MQTT_3_1_1, "c", will=Will("$SYS/x", b"")), MQTT_3_1_1, None),
], ids=lambda v: v if isinstance(v, str) else "")
def test_connect_checks_refuse_with_the_version_s_code(case, c, version, answer):
    h = Harness()
    h.feed(c.encode())
    assert not h.session.check_connect(c)
    assert h.sent(version) == ([answer] if answer else [])
    assert h.session.closing
    if answer is None:  # 3.1.1 has no return code for it: a plain close, no refusal event
        assert h.session.close_reason == f"refused: {WILL_TOPIC_RESERVED}" and h.events == []


@VERSIONS
def test_a_listener_refusal_is_a_connack_with_its_reason(version):
    h = Harness()
    c = Connect(version, "c")
    h.feed(c.encode())
    h.session.refuse(c, R.SERVER_BUSY, "server busy: connection limit 1 reached")
    if version == MQTT_5:
        assert h.sent(version) == [Connack(R.SERVER_BUSY, False, {
            P.REASON_STRING: "server busy: connection limit 1 reached"})]
    else:  # 3.1.1 has return code 3 "server unavailable" for it
        assert h.sent(version) == [Connack(R.SERVER_UNAVAILABLE)] and h.events[0][1]["return_code"] == 3
    assert h.session.close_reason == "refused 0x89: server busy: connection limit 1 reached"
    h.session.send(PingResp())  # nothing is sent once closing
    assert h.sent(version) == []


# --- bad packets -----------------------------------------------------------------------------------------

def test_an_unsupported_protocol_level_gets_a_3_1_1_connack_return_code_1():
    h = Harness()
    bad = bytearray(Connect(MQTT_3_1_1, "c").encode())
    bad[8] = 3  # protocol level 3 (MQIsdp era)
    assert h.feed(bytes(bad)) == []
    assert h.sent(MQTT_3_1_1) == [Connack(R.UNSUPPORTED_PROTOCOL_VERSION)]
    assert h.kinds() == ["bad_packet"] and h.session.close_reason.startswith("bad packet: ")


@VERSIONS
def test_a_bad_packet_before_connack(version):
    h = Harness()
    bad = bytearray(Connect(version, "c").encode())
    bad[9] |= 1  # the reserved CONNECT flag
    assert h.feed(bytes(bad)) == []
    sent = h.sent(version)
    if version == MQTT_5:  # an error in CONNECT is answered with CONNACK, never DISCONNECT
        assert len(sent) == 1 and type(sent[0]) is Connack and sent[0].reason_code >= 0x80
    else:
        assert sent == []
    assert h.session.closing and h.kinds() == ["bad_packet"]


@VERSIONS
def test_a_bad_packet_after_connack(version):
    h = Harness(broker=True)
    h.connect(Connect(version, "c"))
    assert h.feed(b"\xc1\x00") == []  # PINGREQ with a reserved flag set
    sent = h.sent(version)
    if version == MQTT_5:
        assert len(sent) == 1 and type(sent[0]) is Disconnect and sent[0].reason_code == R.MALFORMED_PACKET
    else:
        assert sent == []
    assert h.session.closing and h.session.get_timer() is None
    assert h.events[-1][0] == "bad_packet" and h.events[-1][1]["client_id"] == "c"


# --- the gate after CONNACK, and the front door alone ------------------------------------------------------

@VERSIONS
def test_a_packet_after_the_lease_ended_is_refused(version):
    h = Harness(broker=True)
    h.connect(Connect(version, "c"))
    h.serving = False
    assert h.feed(PingReq().encode(version)) == []
    assert h.sent(version) == ([Disconnect(R.SERVER_SHUTTING_DOWN)] if version == MQTT_5 else [])
    assert h.session.close_reason == "this node may no longer serve"


@VERSIONS
def test_alone_pingreq_is_answered_and_anything_else_is_not_supported(version):
    h = Harness()
    h.connect(Connect(version, "c"))
    h.sent(version)
    sub = Subscribe(1, (Subscription("a", 0),))
    assert h.feed(PingReq().encode(version) + sub.encode(version)) == []
    expected = [PingResp()]
    if version == MQTT_5:
        expected.append(Disconnect(R.IMPLEMENTATION_SPECIFIC_ERROR, {P.REASON_STRING: NOT_SUPPORTED_YET}))
    assert h.sent(version) == expected
    assert h.session.close_reason == f"SUBSCRIBE is {NOT_SUPPORTED_YET}"


# --- timers: time is passed in ------------------------------------------------------------------------------

def test_no_connect_within_the_connect_timeout_closes():
    h = Harness()
    h.session.handle_timer(T0 + 9_999)
    assert not h.session.closing and h.session.get_timer() == T0 + 10_000
    h.session.handle_timer(T0 + 10_000)
    assert h.session.closing and h.session.close_reason == "no CONNECT within 10.0 s"
    assert h.sent(None) == []


@VERSIONS
def test_keep_alive_expires_at_one_and_a_half_times(version):
    h = Harness(broker=True)
    h.connect(Connect(version, "sleepy", keep_alive_s=10))
    assert h.session.get_timer() == T0 + 15_000
    h.session.handle_timer(T0 + 14_999)
    assert not h.session.closing
    h.session.handle_timer(T0 + 15_000)
    assert h.sent(version) == ([Disconnect(R.KEEP_ALIVE_TIMEOUT)] if version == MQTT_5 else [])
    assert h.session.close_reason == "no packet within 1.5 x keep alive 10 s"
    assert h.session.get_timer() is None


def test_a_read_moves_the_keep_alive_deadline_when_the_timer_fires():
    h = Harness(broker=True)
    h.connect(Connect(MQTT_5, "c", keep_alive_s=10))
    h.feed(PingReq().encode(MQTT_5), T0 + 12_000)
    assert h.session.get_timer() == T0 + 15_000  # lazy: nothing re-armed per packet
    h.session.handle_timer(T0 + 15_000)
    assert not h.session.closing and h.session.get_timer() == T0 + 27_000
    h.session.handle_timer(T0 + 27_000)
    assert h.session.closing


def test_a_client_we_do_not_read_is_not_late():
    h = Harness(broker=True)
    h.connect(Connect(MQTT_5, "c", keep_alive_s=2))
    h.session.handle_timer(T0 + 3_000, unread=True)
    assert not h.session.closing and h.session.get_timer() == T0 + 6_000
    h.session.handle_timer(T0 + 6_000)
    assert h.session.closing and h.sent(MQTT_5) == [Disconnect(R.KEEP_ALIVE_TIMEOUT)]


@pytest.mark.parametrize("asked, runs", [(600, 30), (0, 30), (30, 30), (10, 10)])
def test_a_v5_keep_alive_over_the_cap_or_zero_runs_at_the_cap(asked, runs):
    h = Harness(max_keep_alive_s=30)
    h.connect(Connect(MQTT_5, "c", keep_alive_s=asked))
    [connack] = h.sent(MQTT_5)
    assert connack.properties.get(P.SERVER_KEEP_ALIVE) == (runs if runs != asked else None)
    assert h.session.keep_alive_s == runs and h.session.get_timer() == T0 + runs * 1500
    assert h.events[-1][1]["keep_alive_s"] == runs


@pytest.mark.parametrize("asked, refused", [(600, True), (0, True), (31, True), (30, False), (1, False)])
def test_a_v311_keep_alive_over_the_cap_or_zero_is_refused_with_return_code_2(asked, refused):
    h = Harness(max_keep_alive_s=30)
    c = Connect(MQTT_3_1_1, "c", keep_alive_s=asked)
    assert h.feed(c.encode()) == [c]
    assert h.session.check_connect(c) is not refused
    if refused:
        assert h.sent(MQTT_3_1_1) == [Connack(R.CLIENT_IDENTIFIER_NOT_VALID)]  # encoded as return code 2
        assert h.events[-1][1]["return_code"] == 2 and h.session.closing


def test_without_a_cap_any_keep_alive_is_taken_as_asked():
    h = Harness()
    h.connect(Connect(MQTT_5, "c", keep_alive_s=65535))
    assert P.SERVER_KEEP_ALIVE not in h.sent(MQTT_5)[0].properties and h.session.keep_alive_s == 65535


def test_a_will_on_a_dollar_topic_other_than_sys_is_accepted():
    h = Harness()
    c = Connect(MQTT_5, "c", will=Will("$foo/bar", b""))
    assert h.feed(c.encode()) == [c] and h.session.check_connect(c)


def test_keep_alive_zero_has_no_timer():
    h = Harness(broker=True)
    h.connect(Connect(MQTT_3_1_1, "c", keep_alive_s=0))
    assert h.session.get_timer() is None


# --- closes asked from outside, and the one closed event ----------------------------------------------------

def test_a_broker_close_before_connack_is_a_connack_after_it_a_disconnect():
    h = Harness(broker=True)
    h.connect(Connect(MQTT_5, "c"))
    h.session.close_with(R.QUOTA_EXCEEDED, "the disk is full")
    assert h.sent(MQTT_5) == [Connack(R.QUOTA_EXCEEDED, False, {P.REASON_STRING: "the disk is full"})]
    h2 = Harness(broker=True)
    h2.connect(Connect(MQTT_5, "c"))
    h2.session.send(Connack(R.SUCCESS))
    h2.session.close_with(R.QUOTA_EXCEEDED, "the disk is full")
    assert h2.sent(MQTT_5)[1:] == [Disconnect(R.QUOTA_EXCEEDED, {P.REASON_STRING: "the disk is full"})]
    assert h2.session.close_reason == "closed by the broker (0x97): the disk is full"


@VERSIONS
def test_a_drop_tells_only_accepted_v5_clients(version):
    h = Harness(broker=True)
    h.connect(Connect(version, "c"))
    assert h.session.drop(R.USE_ANOTHER_SERVER, "10.0.0.2:1883")
    assert h.sent(version) == ([Disconnect(R.USE_ANOTHER_SERVER, {P.SERVER_REFERENCE: "10.0.0.2:1883"})]
                               if version == MQTT_5 else [])
    assert not h.session.drop(R.USE_ANOTHER_SERVER, None)  # already closing


def test_exactly_one_closed_event_with_the_first_reason():
    h = Harness()
    h.session.close("peer closed the connection")
    h.session.close("connection error: reset")
    h.session.report_closed()
    h.session.report_closed()
    assert h.events == [("client_closed", {"client_id": None, "protocol_version": None, "peer": "192.0.2.7:50000",
                                           "was_accepted": False, "reason": "peer closed the connection"})]


def test_an_illegal_transition_raises_and_leaves_the_phase():
    h = Harness()
    with pytest.raises(AssertionError, match="await_connect -> accepted"):
        h.session.accept(Connect(MQTT_5, "c"), T0)
    assert h.session.phase is Phase.AWAIT_CONNECT and h.session.keep_alive_s == 0 and h.events == []


def test_a_packet_before_connect_is_a_bad_packet():
    h = Harness()
    assert h.feed(b"\xe0\x00") == []  # DISCONNECT as the first packet: the codec wants a CONNECT first
    assert h.session.closing and h.kinds() == ["bad_packet"] and h.sent(None) == []


def test_alone_a_second_connect_is_a_protocol_error():
    h = Harness()
    h.connect(Connect(MQTT_5, "c"))
    h.sent(MQTT_5)
    assert h.feed(Connect(MQTT_5, "c").encode()) == []
    (answer,) = h.sent(MQTT_5)
    assert type(answer) is Disconnect and answer.reason_code == R.PROTOCOL_ERROR
    assert h.session.closing

"""A 3.1.1 publisher with 200 QoS 2 PUBLISHes unacknowledged: every message exactly once (real group).

With mosquitto's defaults (max_inflight_messages 20) a 3.1.1 QoS 2 publisher
with more than 20 in flight saw acknowledged messages vanish: 3.1.1 cannot be
told a receive maximum, and mosquitto drops what is above its window. PairMQ
takes every one: each PUBLISH is stored and recorded (`InboundQos2Received`)
before its PUBREC, a retransmission (DUP) of a packet id not yet released is
answered with PUBREC again and never routed twice, and the subscriber (paho,
3.1.1, persistent session, QoS 2) gets each payload exactly once, in order.
"""

from __future__ import annotations

import pytest

from tests.harness.group import active_group
from tests.harness.mqttraw import PUBCOMP, PUBREC, PUBREL, V311, Raw
from tests.processes.test_broker_interop import Paho

WINDOW = 200  # unacknowledged QoS 2 PUBLISHes in flight at once (mosquitto's default window is 20)
ROUNDS = 3
RESENT = 20  # of each window, sent again with DUP before the PUBRELs


@pytest.fixture(scope="module")
def group(tmp_path_factory):
    with active_group(tmp_path_factory.mktemp("qos2window") / "group") as g:
        yield g


def packet_ids(packets) -> list[int]:
    return [int.from_bytes(p.body[:2], "big") for p in packets]


def test_deep_qos2_window_from_a_311_publisher_arrives_exactly_once(group):
    sub = Paho("q2w-sub", version=V311, clean=False)
    try:
        assert sub.subscribe("q2w/t", "q2w/marker", qos=2) == [2, 2]
        pub = Raw(V311)
        try:
            assert pub.connect("q2w-pub").reason_and_props()[0] == 0
            sent = []
            for r in range(ROUNDS):
                ids = [r * WINDOW + i + 1 for i in range(WINDOW)]
                for pid in ids:
                    payload = b"%d" % pid
                    sent.append(payload)
                    pub.publish("q2w/t", payload, qos=2, packet_id=pid)
                for pid in ids[:RESENT]:  # the publisher thinks these were lost: DUP retransmissions
                    pub.send(0x30 | 0x08 | (2 << 1), _publish_body("q2w/t", pid, b"%d" % pid))
                recs = [pub.expect(PUBREC) for _ in range(WINDOW + RESENT)]
                assert sorted(packet_ids(recs)) == sorted(ids + ids[:RESENT])
                for pid in ids:
                    pub.ack(PUBREL, pid)
                assert packet_ids(pub.expect(PUBCOMP) for _ in ids) == ids
            got = [sub.get(timeout_s=20).payload for _ in sent]
            assert got == sent, "every message once, in publish order"
            sub.publish("q2w/marker", b"", qos=2)  # behind anything routed before it
            assert [m.payload for m in sub.until("q2w/marker")] == [], "a message arrived twice"
        finally:
            pub.close()
    finally:
        sub.stop()


def _publish_body(topic: str, packet_id: int, payload: bytes) -> bytes:
    encoded = topic.encode()
    return len(encoded).to_bytes(2, "big") + encoded + packet_id.to_bytes(2, "big") + payload

"""Ops nobody waits for are held back and ride with the next submission (appliance/broker/service.py's rules).

A real BrokerService and MqttListener on an event loop in a background thread, raw MQTT clients over real
sockets from the test thread, and the spool's segment files read back (their committed ops replayed): what a subscriber's PUBACK makes
(MessagesAcked, and the MessagesInflight of the refill) is not committed on its own but with the next
publish, reaches the disk by itself within `defer_ms` when nothing else comes, and is dropped (never
written) by a broker that no longer serves. Its message events are written when it is made.
"""

from __future__ import annotations

import json
import time

import pytest

from pairmq.appliance.broker.message_events import MessageEvents
from pairmq.appliance.broker.service import BrokerService
from pairmq.appliance.spool.codec import decode_op
from pairmq.appliance.spool.state import StateModel
from tests.harness.oplog import logged_ops
from tests.harness.inprocess_broker import HOST, InProcessBroker
from tests.harness.mqttraw import PUBACK, PUBLISH, SUBACK, V5, Raw

WAIT_S = 5.0
HOLD_MS = 60_000  # "for ever" within one test


class Recorder:
    """The event log's `write`, kept in memory (the node's EventLog writes the same calls to files)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, dict]] = []

    def write(self, event: str, **fields) -> None:
        self.events.append((event, fields))

    def write_lines(self, event: str, count: int, render, *args) -> None:
        for line in render('{"event":"', event, *args).splitlines():  # each line: the stamp, its event, its own
            fields = json.loads(line)
            self.events.append((fields.pop("event"), fields))

    def kinds(self) -> list[str]:
        return [kind for kind, _ in list(self.events)]


class Broker(InProcessBroker):
    def __init__(self, tmp_path, defer_ms: int) -> None:
        self.recorder = Recorder()
        service = BrokerService.open(tmp_path / "spool", epoch=lambda: 1, defer_ms=defer_ms,
                                     message_events=MessageEvents(self.recorder))
        super().__init__(service)

    def view(self) -> dict:
        return self.call(self.service.view)["writer"] | {"deferred_ops": self.call(lambda: self.service.deferred_ops)}

    def queued_on_disk(self, client_id: str) -> int:
        """The client's queue as the committed records in the segment files say (read from disk, replayed)."""
        model = StateModel()
        for seq, body in logged_ops(self.service.spool):  # the log from the start: never compacted here
            model.apply(seq, decode_op(body))
        session = model.state(self.service.spool.log.head).sessions.get(client_id)
        return len(session.queue) if session is not None else 0

    def wait_for(self, what: str, predicate) -> None:
        deadline = time.monotonic() + WAIT_S
        while not predicate():
            if time.monotonic() > deadline:
                pytest.fail(f"not within {WAIT_S} s: {what}; writer {self.view()}")
            time.sleep(0.005)


@pytest.fixture
def make(tmp_path):
    made: list[Broker] = []
    clients: list[Raw] = []

    def broker(defer_ms: int) -> tuple[Broker, Raw, Raw]:
        b = Broker(tmp_path / f"b{len(made)}", defer_ms)
        made.append(b)
        sub, pub = Raw(V5, HOST, b.port), Raw(V5, HOST, b.port)
        clients.extend((sub, pub))
        assert sub.connect("sub", clean=False, properties=[(0x11, 3600)]).reason_and_props()[0] == 0
        assert sub.subscribe(1, "t", 1).type == SUBACK
        assert pub.connect("pub").reason_and_props()[0] == 0
        return b, sub, pub

    yield broker
    for c in clients:
        c.sock.close()
    for b in made:
        b.close()


def publish_and_deliver(pub: Raw, sub: Raw, packet_id: int) -> int:
    """One QoS 1 PUBLISH acknowledged to the publisher and delivered to the subscriber; its packet id there."""
    pub.publish("t", b"m%d" % packet_id, qos=1, packet_id=packet_id)
    assert pub.expect(PUBACK).reason_and_props()[0] == 0
    got = sub.expect(PUBLISH)
    return got.publish()[1]


def test_a_subscribers_ack_rides_with_the_next_publish(make):
    broker, sub, pub = make(HOLD_MS)
    delivered = publish_and_deliver(pub, sub, 1)
    assert broker.queued_on_disk("sub") == 1
    sub.ack(PUBACK, delivered)
    broker.wait_for("the ack to be taken and held back", lambda: broker.view()["deferred_ops"] >= 1)
    writer = broker.view()
    assert writer["pending_ops"] == 0, writer  # the writer has nothing: the ack is held, not committing
    assert broker.queued_on_disk("sub") == 1, "the ack was written on its own"

    delivered = publish_and_deliver(pub, sub, 2)  # its commit carries the held-back ack, in front of it
    after = broker.view()  # (message 2's own in-flight mark is held back now, as the ack was)
    assert after["deferred_submissions"] == 0, after
    assert after["submissions"] == writer["submissions"] + 1, (writer, after)
    assert broker.queued_on_disk("sub") == 1  # message 1 gone, message 2 queued: one commit did both


def test_held_back_ops_reach_the_disk_by_themselves(make):
    broker, sub, pub = make(50)
    for i in range(1, 4):
        sub.ack(PUBACK, publish_and_deliver(pub, sub, i))
    broker.wait_for("the held-back acks to be committed", lambda: broker.queued_on_disk("sub") == 0)
    writer = broker.view()
    assert writer["deferred_submissions"] >= 1 and writer["deferred_ops"] == 0, writer
    assert writer["pending_ops"] == 0 and writer["durable_seq"] == broker.call(lambda: broker.service.writer.head.seq)


def test_a_broker_that_no_longer_serves_drops_them(make):
    broker, sub, pub = make(50)
    delivered = publish_and_deliver(pub, sub, 1)
    broker.wait_for("the delivery's in-flight mark to be written",
                    lambda: broker.view()["deferred_ops"] == 0 and broker.view()["pending_ops"] == 0)
    head = broker.call(lambda: broker.service.writer.head.seq)
    deferred_submissions = broker.view()["deferred_submissions"]
    broker.call(setattr, broker.service, "serving", lambda: False)  # e.g. the lease ran out: a step-down
    sub.ack(PUBACK, delivered)
    broker.wait_for("the ack to be taken",
                    lambda: broker.call(lambda: len(broker.service.core.sessions["sub"].queue)) == 0)
    broker.wait_for("the held-back ack to be dropped", lambda: broker.view()["deferred_ops"] == 0)
    assert broker.call(lambda: broker.service.writer.head.seq) == head, "a broker that stopped serving wrote ops"
    assert broker.queued_on_disk("sub") == 1
    assert broker.view()["deferred_submissions"] == deferred_submissions


def test_the_events_of_held_back_ops_are_written_when_they_are_made(make):
    broker, sub, pub = make(HOLD_MS)
    delivered = publish_and_deliver(pub, sub, 1)
    sub.ack(PUBACK, delivered)
    broker.wait_for("the ack to be taken and held back", lambda: broker.view()["deferred_ops"] >= 2)
    broker.wait_for("the acknowledged event", lambda: "message_acknowledged" in broker.recorder.kinds())
    assert broker.view()["pending_ops"] == 0 and broker.queued_on_disk("sub") == 1  # still held back
    assert broker.recorder.kinds() == ["message_published", "message_spooled", "message_delivered",
                                       "message_acknowledged"]
    publish_and_deliver(pub, sub, 2)
    broker.wait_for("message 2's spooled event", lambda: broker.recorder.kinds().count("message_spooled") == 2)
    assert broker.recorder.kinds().count("message_acknowledged") == 1  # not written again at submission

"""Every PUBLISH a client sends gets one outcome, counted per topic, QoS and outcome (appliance/broker/outcomes.py):
the core driven directly, as in test_broker_core.py."""

from pairmq.appliance.broker import outcomes
from pairmq.appliance.broker.core import Limits
from pairmq.appliance.mqtt import codec
from pairmq.appliance.mqtt.properties import PropertyId as P
from tests.unit.test_broker_core import Harness


def counted(core) -> dict:
    return {(o["topic"], o["qos"], o["outcome"]): o["messages"] for o in outcomes.as_event(core.outcomes)}


def test_each_publish_is_counted_once_by_what_became_of_it():
    h = Harness(limits=Limits(max_queued_messages=2), authorize=lambda user, action, topic: topic != "secret")
    h.connect(1, "live")
    h.subscribe(1, "live/#", qos=0)
    h.connect(2, "away", clean=False, props={P.SESSION_EXPIRY_INTERVAL: 600})
    h.subscribe(2, "kept/#", qos=1)
    h.lose(2)
    h.connect(3, "pub")
    for i in range(1000):  # nobody subscribes: acknowledged, never stored
        h.send(3, codec.Publish("nobody/1", b"m", qos=1, packet_id=i % 60000 + 1))
    h.send(3, codec.Publish("live/1", b"m", qos=1, packet_id=1))  # a QoS 0 copy, sent at once
    h.send(3, codec.Publish("live/1", b"m", qos=0))
    for pid in (2, 3, 4):  # the offline session's queue takes two, the third is refused
        h.send(3, codec.Publish("kept/1", b"m", qos=1, packet_id=pid))
    h.send(3, codec.Publish("secret", b"m", qos=1, packet_id=5))  # the ACL
    h.send(3, codec.Publish("$SYS/x", b"m", qos=0))  # the broker's
    assert counted(h.core) == {("nobody/1", 1, "no_subscriber"): 1000, ("live/1", 1, "delivered"): 1,
                               ("live/1", 0, "delivered"): 1, ("kept/1", 1, "queued"): 2,
                               ("kept/1", 1, "refused"): 1, ("secret", 1, "refused"): 1,
                               ("$SYS/x", 0, "refused"): 1}
    assert outcomes.as_event({"b": [0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0], "a": [1] + [0] * 11}) == [
        {"topic": "a", "qos": 0, "outcome": "delivered", "messages": 1},
        {"topic": "b", "qos": 1, "outcome": "queued", "messages": 2}]


def test_a_retransmission_and_a_wills_publish_are_not_counted_again():
    h = Harness()
    h.connect(1, "pub")
    h.send(1, codec.Publish("t", b"m", qos=2, packet_id=7))
    h.send(1, codec.Publish("t", b"m", qos=2, packet_id=7, dup=True))  # the same QoS 2 message again
    h.connect(2, "dying", will=codec.Will("w", b"bye", 1, False, {}))
    h.lose(2)  # the broker publishes the will: not a client's PUBLISH
    assert counted(h.core) == {("t", 2, "no_subscriber"): 1}


def test_the_topics_of_one_window_are_bounded():
    h = Harness()
    for i in range(outcomes.MAX_OUTCOME_TOPICS + 500):
        h.core.count_outcome(f"t/{i}", 1, outcomes.QUEUED)
    h.core.count_outcome("t/0", 1, outcomes.QUEUED)  # a named topic still counts under its own name
    got = counted(h.core)
    assert len(got) == outcomes.MAX_OUTCOME_TOPICS + 1
    assert got[(outcomes.OTHER_TOPICS, 1, "queued")] == 500 and got[("t/0", 1, "queued")] == 2

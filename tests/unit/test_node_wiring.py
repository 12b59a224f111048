"""The node as wiring (appliance/node/, monitor/node.py): the monitor has no broker, a routing node hands
one spool to its broker and its mate link, the quorum core is reached through one handle, and the
broker's release rule follows the mate's acknowledgement. No sockets: the nodes are built, not run."""

import asyncio
import threading
import types

import pytest

from pairmq.appliance.errors import LocalProtocolError
from pairmq.appliance.node.quorum_handle import QuorumHandle
from pairmq.appliance.node.replication import MateRelease
from pairmq.appliance.node.routing import RoutingNode
from pairmq.appliance.roles import Role
from pairmq.monitor.node import MonitorNode
from tests.harness.group import Group


def test_the_quorum_handle_calls_into_the_core_under_the_lock_with_a_fresh_now():
    lock, woken = threading.Lock(), []
    handle = QuorumHandle("the core", lock, lambda: woken.append(True))
    core, held, now = handle.call(lambda c, n: (c, lock.locked(), n))
    assert core == "the core" and held and now > 0
    assert not lock.locked()
    handle.wake()
    assert woken == [True]


def test_the_release_rule_waits_for_the_mates_ack_or_alone_for_a_peers_echo():
    active = types.SimpleNamespace(acked_seq=3)
    asked = []
    rule = MateRelease(active, ask=lambda: asked.append(True))
    assert rule.allows(3) and not rule.allows(4), "nothing past the mate's ack while the mate is needed"
    assert asked == [], "in sync nothing is advertised early"
    active.acked_seq = 4
    assert rule.allows(4), "the ack itself releases: nothing polled"
    rule.alone_bound = 10  # the mate is out of sync, its lease has ended, and a peer echoed position 10
    assert rule.allows(10) and not rule.allows(11), "alone, only what a peer echoed back (core.py R9)"
    assert not rule.allows(11) and asked == [True], "op 11 asks once for its position to be advertised"
    assert not rule.allows(12) and asked == [True, True]


def test_a_monitor_node_has_no_broker_and_never_holds_activity(tmp_path):
    node = MonitorNode(Group(tmp_path).config, Role.MONITOR)
    try:
        assert not any(hasattr(node, part) for part in ("broker", "replication", "configuration", "listener"))
        assert node.management.ports.routing is None  # the API's broker reads answer 404 on a monitor
        view = node.redundancy_view()
        assert (view["role"], view["activity"], view["serving"]) == ("monitor", "Monitor", False)
        assert view["in_sync"] is None and view["mqtt"] is None and view["mate_link_refusals"] is None
        with pytest.raises(LocalProtocolError, match="the monitor never holds activity"):
            asyncio.run(node.handover("operator released activity"))
    finally:
        asyncio.run(node.management.stop())
        node.events.close()


def test_a_routing_node_hands_one_spool_to_its_broker_and_its_mate_link(tmp_path):
    node = RoutingNode(Group(tmp_path).config, Role.PRIMARY)
    try:
        assert node.broker.local is node.replication.active.local
        assert node.broker.writer is node.broker.local.writer
        view = node.redundancy_view()
        assert view["activity"] == "Standby" and view["serving"] is False and view["in_sync"] is False
        assert view["mate_link_refusals"] == {}
        with pytest.raises(AssertionError):
            RoutingNode(node.config, Role.MONITOR)
    finally:
        asyncio.run(node.management.stop())
        node.authn.close()
        node.configuration.store.close()
        node.broker.spool.close()
        node.events.close()

"""S2 with real node processes on loopback (127.0.0.1-3, as `pairmq local up` runs them): messages a
publisher got PUBACK/PUBCOMP for survive two failovers and an incremental resync.

The clients and the checker are tests/harness/streams.py's; the other faults (kill -9 mid-stream, SIGSTOP,
mate-link cut, full-snapshot resync) are in tests/netns/test_replication_faults.py, in network namespaces.
"""

from __future__ import annotations

import pytest

from pairmq.appliance.roles import Role
from tests.harness.group import active_group
from tests.harness.streams import Publisher, Subscriber, finish, streams, wait_until

P, B = Role.PRIMARY, Role.BACKUP


@pytest.fixture
def group(tmp_path):
    with active_group(tmp_path / "group") as g:
        yield g


def publish_all(hosts: list[str], tag: str) -> list[Publisher]:
    """A QoS 1 and a QoS 2 stream of 50 messages each, until all are acknowledged."""
    pubs = streams(hosts, qos1=1, qos2=1, count=50, tag=tag)
    for pub in pubs:
        pub.start()
    wait_until(f"streams {tag} acknowledged", lambda: all(p.all_acked() for p in pubs), timeout_s=20)
    return pubs


def test_the_old_primary_resyncs_as_standby_then_takes_over_with_everything(group):
    """kill -9 the primary; the backup serves more traffic; the primary restarts, resyncs from the backup
    and stands by in sync; more traffic; kill -9 the backup: the primary serves every message acknowledged
    by either to a persistent subscriber that was offline throughout."""
    hosts = [group.address(P), group.address(B)]
    parked = Subscriber("parked", hosts)
    parked.start()
    parked.go_offline()

    pubs = publish_all(hosts, "a")
    group.kill(P)
    group.wait_for("the backup to take over", lambda: group.probe_once()[B] == 0, timeout_s=10)
    pubs += publish_all(hosts, "b")
    group.start(P)
    group.wait_for("the old primary to resync and stand by in sync", lambda: any(
        "in sync with backup" in d["reason"] for d in group.decisions(P, "sync")), timeout_s=20)
    pubs += publish_all(hosts, "c")
    group.kill(B)
    group.wait_for("the primary to take over again", lambda: group.probe_once()[P] == 0, timeout_s=10)

    parked.come_back()
    report = finish("two failovers and a resync", pubs, [parked], describe=group.logs_tail)
    assert report.acknowledged == report.published == 300

"""Regressions for what the nemesis found (docs/reliability.md "Findings"), as focused process tests.

Each replays, with real nodes in namespaces, the shortest fault sequence that showed the bug.
"""

from __future__ import annotations

import pytest

from pairmq.appliance.roles import Role
from bench.spoolfill import fill
from tests.harness.netns import hosts  # noqa: F401  (fixture)
from tests.harness.streams import finish, streams, wait_until
from tests.netns.test_replication_faults import group, in_sync_again, resync_plans, subscribers  # noqa: F401  (fixture)

pytestmark = pytest.mark.processes
P, B = Role.PRIMARY, Role.BACKUP
DIVERGED_OPS = 3  # messages written by the old active after the backup's last op: its tail diverged


def test_a_node_that_resynced_by_snapshot_replicates_to_its_standby_once_active(group):  # noqa: F811
    """Seed 7 of the nemesis: the primary is paused past its lease, the backup takes over, the primary's
    diverged tail makes it resync by full snapshot (a new spool and spool writer). (A pause leaves such a
    tail only if it lands between a local commit and its shipping, which is luck, so here the primary is
    killed and an unacknowledged tail of its epoch is written into its spool while it is down.) The backup dies, the
    primary takes over, the backup restarts and joins. New messages must reach the backup -- it stays in
    sync and can take over when the primary dies in turn. The bug: the new spool writer lacked the mate
    link's taps, so the active never shipped a new op, the standby fell out of sync for good, and kill -9
    of the primary left nobody to take over."""
    live, parked = subscribers(group)
    before = streams(group.client_hosts, qos1=1, qos2=1, count=300, netns=group.client_netns)
    for pub in before:
        pub.start()
    wait_until("a third of the messages acknowledged", lambda: sum(len(p.acked_now()) for p in before) > 200,
               timeout_s=20, on_timeout=group.logs_tail)
    group.kill(P)
    group.wait_for("the backup to take over", lambda: group.probe_once()[B] == 0, timeout_s=10)
    fill(group.config.node(P).data_dir / "spool", DIVERGED_OPS, 64, first_msg_id=10**9)  # never acknowledged
    group.start(P)
    group.wait_for("the old primary to resync and stand by in sync", lambda: in_sync_again(group, P), timeout_s=20)
    plans = resync_plans(group, B)
    assert plans and "diverged" in plans[-1], f"the primary was to resync by full snapshot; the backup planned {plans}"
    wait_until("the first streams to finish on the backup", lambda: all(p.all_acked() for p in before),
               timeout_s=30, on_timeout=group.logs_tail)

    group.kill(B)
    group.wait_for("the primary to take over", lambda: group.probe_once()[P] == 0, timeout_s=10)
    group.start(B)
    group.wait_for("the restarted backup to be in sync", lambda: in_sync_again(group, B), timeout_s=20)
    after = streams(group.client_hosts, qos1=1, qos2=1, count=300, tag="-after", netns=group.client_netns)
    for pub in after:
        pub.start()
    wait_until("the second streams acknowledged", lambda: all(p.all_acked() for p in after), timeout_s=30,
               on_timeout=group.logs_tail)
    assert in_sync_again(group, B), (f"the backup fell out of sync while the primary acknowledged new messages: "
                                     f"{group.decisions(P, 'sync')[-1]['reason']}\n{group.logs_tail(12)}")

    group.kill(P)
    group.wait_for("the backup to take over with everything", lambda: group.probe_once()[B] == 0, timeout_s=10)
    parked.come_back()
    finish("snapshot resync, then active, then a standby rejoins", [*before, *after], [live, parked],
           describe=group.logs_tail)

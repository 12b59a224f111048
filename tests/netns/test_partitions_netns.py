"""Partitions with real processes, each node on its own host (network namespace).

Links are cut in the switch (tests/harness/netns.py), so a cut is silent like a pulled
cable. A sampler in the client host CONNECTs to both message-routing nodes
every 15 ms throughout; S1 is checked from its rounds and from the nodes' own
event logs.
"""

import json
import re
import subprocess
import sys
import time

import pytest

from pairmq.appliance.config import Timers
from pairmq.appliance.roles import Role
from tests.harness.group import REPO, Group
from tests.harness.netns import hosts  # noqa: F401  (fixture)
from tests.harness.probe import double_service

P, B, M = Role.PRIMARY, Role.BACKUP, Role.MONITOR
TIMERS = Timers()
SETTLE_S = 3 * (TIMERS.lease_ms + TIMERS.takeover_margin_ms) / 1000  # several chances to (wrongly) fail over

pytestmark = pytest.mark.processes


@pytest.fixture
def group(hosts, tmp_path):  # noqa: F811
    addresses = {r: hosts.address(r.value) for r in Role}
    with Group(tmp_path / "group", addresses, hosts=hosts) as g:
        g.start()
        g.wait_for("the primary to take activity", lambda: g.probe_once()[P] == 0)
        g.wait_for("the backup to be in sync", g.backup_in_sync)
        g.sampler_out = tmp_path / "samples.jsonl"
        yield g
        assert g.accept_order_violations() == []


def sampled(group, hosts, fault, duration_s: float) -> list[dict]:  # noqa: F811
    sampler = group.start_sampler(group.sampler_out, duration_s=duration_s)
    time.sleep(0.3)
    fault()
    sampler.wait(duration_s + 30)
    rounds = [json.loads(line) for line in group.sampler_out.read_text().splitlines()]
    assert len({r["tick"] for r in rounds}) > 50
    assert double_service(rounds) == [], "two nodes accepted the same instant's CONNECT"
    return rounds


def test_monitor_isolated_nothing_changes(group, hosts):  # noqa: F811
    sampled(group, hosts, lambda: hosts.isolate("monitor"), SETTLE_S)
    assert group.probe_once() == {P: 0, B: 3}
    assert group.decisions(B, "activate") == []
    assert group.decisions(P, "step_down") == []


def test_primary_backup_link_cut_only_no_failover(group, hosts):  # noqa: F811
    rounds = sampled(group, hosts, lambda: hosts.cut("primary", "backup"), SETTLE_S)
    assert {r["host"] for r in rounds if r["rc"] == 0} == {hosts.address("primary")}
    assert group.probe_once() == {P: 0, B: 3}
    assert group.decisions(B, "activate") == []
    # The monitor still hears the primary, so it refuses the backup's bid.
    refusals = [d["reason"] for d in group.decisions(M, "refuse") if "not voting for backup" in d["reason"]]
    assert refusals and all("primary claimed activity" in r for r in refusals)
    # The primary stops counting on its mate once the mate's in-sync lease is surely over.
    assert any("backup unseen past its in-sync lease" in d["reason"] for d in group.decisions(P, "sync"))


def test_partition_active_from_standby_one_way(group, hosts):  # noqa: F811
    sampled(group, hosts, lambda: hosts.cut_one_way("primary", "backup"), SETTLE_S)
    assert group.probe_once() == {P: 0, B: 3}
    assert group.decisions(B, "activate") == []


def test_active_cut_off_from_both_stops_serving_and_backup_takes_over(group, hosts):  # noqa: F811
    holder = hosts.popen("client", [sys.executable, "-m", "tests.harness.probe", "--hosts", hosts.address("primary"),
                                    "--hold-s", "10"], cwd=REPO, stdout=subprocess.PIPE, text=True)
    time.sleep(0.3)  # connected
    cut_at = []

    def cut_primary_from_its_peers():
        cut_at.append(time.monotonic_ns() / 1e6)
        hosts.cut("primary", "backup")
        hosts.cut("primary", "monitor")  # the client can still reach it: it must refuse by itself

    rounds = sampled(group, hosts, cut_primary_from_its_peers, 3.0)
    held = json.loads(holder.communicate(timeout=15)[0])
    assert held["connack_rc"] == 0
    assert held["disconnect_rc"] == 0x9C, "a connected MQTT 5 client is told to use another server"
    dropped_after = held["dropped_ms"] - cut_at[0]  # how soon is bench/failover.py's; a loaded machine stalls it
    assert dropped_after > 0, f"client dropped {-dropped_after:.0f} ms before the cut"
    print(f"client dropped {dropped_after:.0f} ms after the cut (lease {TIMERS.lease_ms} ms)")
    assert group.probe_once() == {P: 3, B: 0}
    [step_down] = group.decisions(P, "step_down")
    assert "lease expired" in step_down["reason"]
    [activation] = group.decisions(B, "activate")
    assert re.search(r"monitor concurs, (in sync|holds all the primary released \(spool \d+/\d+\)) → taking "
                     r"activity, epoch 2$", activation["reason"]), activation["reason"]  # R4' if it stalled
    # Unavailability as the client saw it: from the primary's last accept to the backup's first.
    last_p = max(r["sent_ms"] for r in rounds if r["rc"] == 0 and r["host"] == hosts.address("primary"))
    first_b = min(r["sent_ms"] for r in rounds if r["rc"] == 0 and r["host"] == hosts.address("backup"))
    assert first_b > last_p, "the backup accepted before the primary's last accept"
    print(f"unavailable {first_b - last_p:.0f} ms between the primary's last accept and the backup's first")
    # Healing does not move activity back (auto-revert is off by default).
    hosts.heal()
    time.sleep(SETTLE_S)
    assert group.probe_once() == {P: 3, B: 0}


def test_active_loses_all_inbound_traffic_backup_takes_over(group, hosts):  # noqa: F811
    def one_way_cuts():
        hosts.cut_one_way("backup", "primary")
        hosts.cut_one_way("monitor", "primary")

    sampled(group, hosts, one_way_cuts, 3.0)
    assert group.probe_once()[B] == 0
    assert any("closed epoch 1 with us in sync" in d["reason"] for d in group.decisions(B, "sync"))

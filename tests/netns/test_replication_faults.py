"""S2 with real node processes and paho-mqtt streams across faults of the active (docs/mate_link.md).

Every host (primary, backup, monitor, clients) is its own network namespace (tests/harness/netns.py), so
these tests need no loopback port lock and a fault can cut one port of one link.

Each test runs QoS 1 and QoS 2 publishers (tests/harness/streams.py) and two persistent subscribers:
"live" stays connected and follows the host list through the fault, "parked" is offline during it
and resumes its session afterwards. The checker's rules are in tests/harness/streams.py; each test prints
its summary line (`pytest -s`).
"""

from __future__ import annotations

import signal
import time

import pytest

from pairmq.appliance.config import Timers
from pairmq.appliance.roles import Role
from bench.spoolfill import fill
from tests.harness.group import Group
from tests.harness.netns import hosts  # noqa: F401  (fixture)
from tests.harness.streams import Subscriber, check, finish, streams, wait_until

pytestmark = pytest.mark.processes
P, B = Role.PRIMARY, Role.BACKUP
LEASE_S = Timers().lease_ms / 1000


@pytest.fixture
def group(hosts, tmp_path):  # noqa: F811
    addresses = {r: hosts.address(r.value) for r in Role}
    with Group(tmp_path / "group", addresses, hosts=hosts) as g:
        g.start()
        g.wait_for("the primary to take activity", lambda: g.probe_once()[P] == 0, timeout_s=20)
        g.wait_for("the backup to be in sync", g.backup_in_sync, timeout_s=20)
        g.client_hosts = [g.address(P), g.address(B)]
        g.client_netns = hosts.netns_name("client")
        yield g
        assert g.accept_order_violations() == []


def subscribers(group) -> tuple[Subscriber, Subscriber]:
    live = Subscriber("live", group.client_hosts, netns=group.client_netns)
    parked = Subscriber("parked", group.client_hosts, v5=False, netns=group.client_netns)
    for sub in (live, parked):
        sub.start()
    parked.go_offline()
    return live, parked


def start_streams(group, count: int):
    pubs = streams(group.client_hosts, qos1=1, qos2=2, count=count, netns=group.client_netns)
    for pub in pubs:
        pub.start()
    return pubs


def test_kill_9_of_the_active_qos1_and_qos2_streams(group):
    live, parked = subscribers(group)
    pubs = start_streams(group, 300)
    wait_until("a third of the messages acknowledged", lambda: sum(len(p.acked_now()) for p in pubs) > 300,
               timeout_s=20, on_timeout=group.logs_tail)
    group.kill(P)  # mid-stream: what is in flight is unacknowledged and is resent to the backup
    group.wait_for("the backup to take over", lambda: group.probe_once()[B] == 0, timeout_s=10)
    parked.come_back()

    report = finish("kill-9 QoS1+QoS2", pubs, [live, parked], describe=group.logs_tail)
    assert report.acknowledged == report.published, f"publishers not all finished on the backup: {report}"
    assert all(host == group.address(B) for host, code in live.connects[-1:] if code == 0)


def test_sigstop_of_the_active_past_its_lease(group):
    """The paused primary loses activity to the backup; on SIGCONT it steps down without accepting a
    packet (what its sockets buffered meanwhile included), its clients go to the backup, and nothing
    acknowledged is lost or doubled. It then resyncs as standby (discarding any unacknowledged tail it
    wrote after SIGCONT) and, once the backup is killed, serves everything to a subscriber that was
    offline throughout."""
    live, parked = subscribers(group)
    late = Subscriber("late", group.client_hosts, netns=group.client_netns)
    late.start()
    late.go_offline()
    pubs = start_streams(group, 300)
    wait_until("a third of the messages acknowledged", lambda: sum(len(p.acked_now()) for p in pubs) > 300,
               timeout_s=20, on_timeout=group.logs_tail)
    group.signal(P, signal.SIGSTOP)
    try:
        group.wait_for("the backup to take over", lambda: group.probe_once()[B] == 0, timeout_s=10)
        time.sleep(2 * LEASE_S)  # the clients still sit on the paused primary's sockets
    finally:
        group.signal(P, signal.SIGCONT)
    group.wait_for("the old primary to step down", lambda: group.decisions(P, "step_down"), timeout_s=10)
    parked.come_back()

    report = finish("SIGSTOP QoS1+QoS2", pubs, [live, parked], describe=group.logs_tail)
    assert report.acknowledged == report.published, f"publishers not all finished on the backup: {report}"
    assert group.probe_once() == {P: 3, B: 0}
    for client in (*pubs, live):
        assert client.connects[-1] == (group.address(B), 0), f"{client.client_id}: {client.connects}"

    group.wait_for("the old primary to resync and stand by in sync", lambda: in_sync_again(group, P),
                   timeout_s=20)
    group.kill(B)
    group.wait_for("the primary to take over again", lambda: group.probe_once()[P] == 0, timeout_s=10)
    late.come_back()
    print("resync of the paused primary:", "; ".join(resync_plans(group, B)))
    finish("SIGSTOP, resync, kill -9 of the backup", pubs, [late], describe=group.logs_tail)


def in_sync_again(group, role: Role) -> bool:
    """`role`'s latest sync decision, after it stood by for the other node, says it is in sync."""
    syncs = [d["reason"] for d in group.decisions(role, "sync")]
    return bool(syncs) and f"in sync with {role.mate().value}" in syncs[-1]


def resync_plans(group, active: Role) -> list[str]:
    """The resync plans `active` made for its standby, from its log ("standby at op N: <reason>")."""
    text = (group.dir / f"{active.value}.log").read_text(errors="replace")
    return [line.split("mate link: ", 1)[1] for line in text.splitlines() if "mate link: standby at op" in line]


MATE_LINK_PORT = 8301


def traffic_then_mate_link_cut(group, hosts):  # noqa: F811
    """Subscribers and 400-message streams, 150 of them acknowledged, then only TCP 8301 between primary
    and backup cut (heartbeats flow)."""
    live, parked = subscribers(group)
    pubs = start_streams(group, 400)
    wait_until("some messages acknowledged", lambda: sum(len(p.acked_now()) for p in pubs) > 150,
               timeout_s=20, on_timeout=group.logs_tail)
    hosts.cut_tcp_port("primary", "backup", MATE_LINK_PORT)
    return live, parked, pubs


def test_mate_link_cut_then_resync_then_kill_9_of_the_active(group, hosts):  # noqa: F811
    """Only TCP 8301 between primary and backup is cut (heartbeats flow): the primary drops the backup
    from sync and, once the backup's in-sync lease is surely over, acknowledges on local durability;
    the backup, out of sync, never takes over. The link heals, the backup resyncs and is in sync
    again; kill -9 of the primary then loses nothing acknowledged before, during or after the cut."""
    live, parked, pubs = traffic_then_mate_link_cut(group, hosts)
    group.wait_for("the backup to know it is out of sync",
                   lambda: "out of sync" in group.decisions(B, "sync")[-1]["reason"], timeout_s=10)
    acked_at_cut = sum(len(p.acked_now()) for p in pubs)
    wait_until("acknowledgements on local durability while the mate link is cut",
               lambda: sum(len(p.acked_now()) for p in pubs) > acked_at_cut + 150, timeout_s=20,
               on_timeout=group.logs_tail)
    time.sleep(3 * LEASE_S)  # chances for a wrong take-over
    assert group.probe_once() == {P: 0, B: 3}
    assert group.decisions(B, "activate") == [], "the out-of-sync backup took activity"
    hosts.heal_tcp_port("primary", "backup", MATE_LINK_PORT)
    group.wait_for("the backup to resync and be in sync again", lambda: in_sync_again(group, B), timeout_s=20)
    plans = resync_plans(group, P)
    group.kill(P)
    group.wait_for("the backup to take over", lambda: group.probe_once()[B] == 0, timeout_s=10)
    parked.come_back()
    print("mate link cut:", "; ".join(plans))
    report = finish("mate-link cut, resync, kill-9 QoS1+QoS2", pubs, [live, parked], describe=group.logs_tail)
    assert report.acknowledged == report.published, f"publishers not all finished on the backup: {report}"


def test_sigterm_while_the_backup_catches_up_waits_for_it_then_hands_over(group, hosts):  # noqa: F811
    """`systemctl stop` of the active while its mate link is being repaired: the backup is reachable
    (heartbeats flow) but out of sync, so a handover is refused at first. The primary serves on until the
    backup is in sync again, then hands over: the backup takes activity on the yield, not on the lease
    expiry a plain stop would leave it, and nothing acknowledged is lost."""
    live, parked, pubs = traffic_then_mate_link_cut(group, hosts)
    group.wait_for("the primary to drop the backup from sync",
                   lambda: "out of sync" in group.decisions(P, "sync")[-1]["reason"], timeout_s=10)
    hosts.heal_tcp_port("primary", "backup", MATE_LINK_PORT)
    group.signal(P, signal.SIGTERM)  # at once: the backup redials and catches up only now
    assert group.procs.pop(P).wait(20) == 0, "the terminated primary did not exit 0\n" + group.logs_tail(30)
    log_text = (group.dir / "primary.log").read_text(errors="replace")
    assert "SIGTERM: the backup is not in sync" in log_text and "serving on until it is in sync" in log_text, \
        group.logs_tail(30)
    assert any("SIGTERM: the backup holds every op through" in d["reason"] for d in group.decisions(P, "step_down")), \
        group.logs_tail(30)
    activations = [d["reason"] for d in group.decisions(B, "activate")]
    assert activations and activations[-1].startswith("backup: primary handed activity over"), activations
    parked.come_back()
    report = finish("SIGTERM during a catch-up", pubs, [live, parked], describe=group.logs_tail)
    assert report.acknowledged == report.published, f"publishers not all finished on the backup: {report}"


def test_a_diverged_old_primary_restarts_resyncs_by_full_snapshot_and_loses_nothing(group, hosts):  # noqa: F811
    """The primary is paused past its lease, the backup takes over; on SIGCONT the primary steps down and
    records its clients' disconnections in epoch 1 (ops the new active never had: a diverged history),
    but its mate link is cut so it cannot resync, and it is killed. Traffic goes on; the link heals, the
    primary restarts and must resync by full snapshot; then kill -9 of the backup: the primary serves
    every acknowledged message to a subscriber that was offline throughout, and to the live one."""
    live, parked = subscribers(group)
    pubs = start_streams(group, 300)
    wait_until("a quarter of the messages acknowledged", lambda: sum(len(p.acked_now()) for p in pubs) > 225,
               timeout_s=20, on_timeout=group.logs_tail)
    group.signal(P, signal.SIGSTOP)
    try:
        group.wait_for("the backup to take over", lambda: group.probe_once()[B] == 0, timeout_s=10)
        hosts.cut_tcp_port("primary", "backup", MATE_LINK_PORT)
    finally:
        group.signal(P, signal.SIGCONT)
    group.wait_for("the old primary to step down", lambda: group.decisions(P, "step_down"), timeout_s=10)
    time.sleep(0.5)  # it writes what it must on stepping down
    group.kill(P)
    # What it wrote on stepping down may be nothing now (ops nobody waits for are dropped by a node that
    # stopped serving, appliance/broker/service.py): an unacknowledged tail of its epoch, written while it is down.
    fill(group.config.node(P).data_dir / "spool", 3, 64, first_msg_id=10**9)
    wait_until("the streams to finish on the backup", lambda: all(p.all_acked() for p in pubs), timeout_s=20,
               on_timeout=group.logs_tail)
    hosts.heal_tcp_port("primary", "backup", MATE_LINK_PORT)
    group.start(P)
    group.wait_for("the old primary to resync and stand by in sync", lambda: in_sync_again(group, P), timeout_s=20)
    plans = resync_plans(group, B)
    print("restart of the diverged primary:", "; ".join(plans))
    assert plans and ("diverged" in plans[-1] or "no longer" in plans[-1] or "starts after" in plans[-1]), \
        f"expected a full-snapshot resync, the backup planned: {plans}\n{group.logs_tail(20)}"
    group.kill(B)
    group.wait_for("the primary to take over again", lambda: group.probe_once()[P] == 0, timeout_s=10)
    parked.come_back()
    finish("diverged primary, full-snapshot resync, kill-9 of the backup", pubs, [live, parked],
           describe=group.logs_tail)


def test_an_old_primary_that_could_not_resync_does_not_take_over_when_the_active_dies(group, hosts):  # noqa: F811
    """kill -9 of the primary; the backup serves on; the primary restarts but its mate link is cut, so it
    stays behind and out of sync. kill -9 of the backup: the primary must not take activity with its stale
    spool (DESIGN §3 rules 2 and 4: it cannot show it is up to date). The backup restarts, serves again,
    the link heals, and nothing acknowledged is lost."""
    live, parked = subscribers(group)
    pubs = start_streams(group, 200)
    wait_until("some messages acknowledged", lambda: sum(len(p.acked_now()) for p in pubs) > 150,
               timeout_s=20, on_timeout=group.logs_tail)
    group.kill(P)
    wait_until("the streams to finish on the backup", lambda: all(p.all_acked() for p in pubs), timeout_s=20,
               on_timeout=group.logs_tail)
    hosts.cut_tcp_port("primary", "backup", MATE_LINK_PORT)
    group.start(P)
    group.wait_for("the old primary to stand by", lambda: group.probe_once()[P] == 3, timeout_s=10)
    time.sleep(2 * LEASE_S)
    group.kill(B)
    time.sleep(4 * LEASE_S)  # several chances to take over wrongly
    took = group.decisions(P, "activate")
    assert [d for d in took if d["epoch"] > 2] == [], (
        f"the primary, out of sync and behind, took activity after the backup died: "
        f"{[d['reason'] for d in took]}\n{group.logs_tail(12)}")
    group.start(B)
    group.wait_for("the backup to serve again", lambda: group.probe_once()[B] == 0, timeout_s=15)
    hosts.heal_tcp_port("primary", "backup", MATE_LINK_PORT)
    parked.come_back()
    finish("stale primary held back, backup restarted", pubs, [live, parked], describe=group.logs_tail)


def test_mate_link_cut_while_the_backup_is_active_then_kill_9_of_the_backup(group, hosts):  # noqa: F811
    """DESIGN §4: once the mate link breaks and the active acknowledges on local durability, "an
    acknowledged message is always either on the standby or the standby knows it may not take activity".
    Here the backup is active (epoch 2) and the primary stands by in sync; only TCP 8301 is cut, the
    backup acknowledges alone, then it is killed: the primary, out of sync and missing those messages,
    must not take activity."""
    backup_acks_alone_then_dies(group, hosts, alone=100)


@pytest.fixture
def advert_lag(monkeypatch):
    """Every node hears its own positions 3 s late (appliance/node/replication.py `AdvertLag`): the window
    between releasing an acknowledgement and advertising its position, held open."""
    monkeypatch.setenv("PAIRMQ_TEST_ADVERTISE_DELAY_MS", "3000")


def test_kill_9_of_the_active_inside_the_window_between_acking_alone_and_advertising(advert_lag, group, hosts):  # noqa: F811
    """The same incident with the window forced open: the backup is killed as soon as 20 acknowledgements
    alone reached the publishers, well inside the 3 s its positions lag. Acknowledging before the position
    was advertised would leave the primary a tie it wins (it lost those messages every time); the
    release rule (appliance/quorum/core.py R9) waits for a peer's echo of the advertised position, so the
    primary knows the backup got further and stays out."""
    backup_acks_alone_then_dies(group, hosts, alone=20)


def backup_acks_alone_then_dies(group, hosts, *, alone: int) -> None:  # noqa: F811
    group.kill(P)
    group.wait_for("the backup to take over", lambda: group.probe_once()[B] == 0, timeout_s=10)
    group.start(P)
    group.wait_for("the primary to stand by in sync", lambda: in_sync_again(group, P), timeout_s=20)
    live, parked = subscribers(group)
    pubs = start_streams(group, 300)
    wait_until("some messages acknowledged", lambda: sum(len(p.acked_now()) for p in pubs) > 150,
               timeout_s=20, on_timeout=group.logs_tail)
    hosts.cut_tcp_port("primary", "backup", MATE_LINK_PORT)
    group.wait_for("the primary to know it is out of sync",
                   lambda: "out of sync" in group.decisions(P, "sync")[-1]["reason"], timeout_s=10)
    acked_at_cut = sum(len(p.acked_now()) for p in pubs)
    wait_until("acknowledgements on local durability while the mate link is cut",
               lambda: sum(len(p.acked_now()) for p in pubs) > acked_at_cut + alone, timeout_s=20,
               on_timeout=group.logs_tail)
    group.kill(B)
    time.sleep(4 * LEASE_S)  # several chances to take over wrongly
    took = [d["reason"] for d in group.decisions(P, "activate") if d["epoch"] > 2]
    if took:  # what it cost: the subscriber offline throughout resumes on the primary
        parked.come_back()
        time.sleep(2)
    report = check("mate-link cut while the backup is active, kill-9 of the backup", pubs, [parked])
    for client in (*pubs, live, parked):
        client.stop()
    assert took == [], (f"the primary took activity without the messages the backup acknowledged alone "
                        f"(appliance/quorum/core.py R9: the backup released them before a peer echoed their "
                        f"position, and on the tie the primary counts as most up to date): {took}\n{report}")

"""The host-list client across kill -9 and release-activity of the active: the application sees
no error, every message it published is acknowledged, a persistent subscriber on the same client gets every
one (QoS 2 exactly once) in order; a refused publish is an error; and bad host lists are clear errors."""

from __future__ import annotations

import threading
import time

import pytest

from pairmq.appliance.roles import Role
from pairmq.appliance.broker.access import AccessPolicy, Action, Effect, Rule
from pairmq.cli.hostlist import ClientError, HostListClient, PublishRefused, parse_hosts
from tests.harness.group import active_group
from tests.harness.http_api import hand_over

P, B = Role.PRIMARY, Role.BACKUP
QOS1, QOS2 = 300, 150


@pytest.fixture
def group(tmp_path):
    with active_group(tmp_path / "group") as g:
        yield g


def hosts(g) -> list[str]:
    return [f"{g.address(P)}:1883", f"{g.address(B)}:1883"]


@pytest.mark.processes
@pytest.mark.timeout(180)
@pytest.mark.parametrize("fault", ["kill -9", "release-activity"])
def test_no_error_and_nothing_lost_across_a_failover_of_the_active(group, fault):
    got: dict[str, list[int]] = {"cars/7/door": [], "pay/7": []}
    lock = threading.Lock()

    def record(topic: str, payload: bytes) -> None:
        with lock:
            got[topic].append(int(payload))

    sub = HostListClient(hosts(group), "fleet")
    sub.subscribe("cars/+/door", 1, record)
    sub.subscribe("pay/+", 2, record)
    sub.start()
    time.sleep(0.3)  # the SUBACKs
    pub = HostListClient(hosts(group), "car-7")
    pub.start()
    handles = []
    for i in range(max(QOS1, QOS2)):
        if i < QOS1:
            handles.append(("cars/7/door", i, pub.publish("cars/7/door", str(i).encode(), qos=1)))
        if i < QOS2:
            handles.append(("pay/7", i, pub.publish("pay/7", str(i).encode(), qos=2)))
        if i == QOS1 // 3:  # mid-stream, with messages in flight
            if fault == "kill -9":
                group.kill(P)
            else:
                assert hand_over(group.config, P)["result"] == "handed over"
        time.sleep(0.004)
    unacknowledged = [(t, i) for t, i, h in handles if not h.wait(timeout_s=20)]
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with lock:
            if set(got["cars/7/door"]) >= set(range(QOS1)) and len(got["pay/7"]) >= QOS2:
                break
        time.sleep(0.1)
    time.sleep(0.5)  # any late duplicate
    with lock:
        q1, q2 = list(got["cars/7/door"]), list(got["pay/7"])
    sub.stop(), pub.stop()
    lost1, lost2 = sorted(set(range(QOS1)) - set(q1)), sorted(set(range(QOS2)) - set(q2))
    dup1, dup2 = len(q1) - len(set(q1)), len(q2) - len(set(q2))
    firsts = [x for n, x in enumerate(q1) if x not in q1[:n]]
    print(f"host-list client across {fault}: published {QOS1} QoS 1 + {QOS2} QoS 2, unacknowledged "
          f"{len(unacknowledged)}; received QoS 1 {len(set(q1))} (+{dup1} duplicates), QoS 2 {len(set(q2))} "
          f"(+{dup2} duplicates); lost {len(lost1) + len(lost2)}; publisher failovers {pub.failovers}, "
          f"subscriber failovers {sub.failovers}\n  publisher: {pub.history}")
    import collections
    print("QoS 1 out of order:", [(a, b) for a, b in zip(firsts, firsts[1:]) if b < a][:5],
          "QoS 2 duplicates:", [k for k, v in collections.Counter(q2).items() if v > 1], "sub:", sub.history)
    assert not unacknowledged, f"the application saw messages never acknowledged: {unacknowledged[:10]}"
    assert not lost1 and not lost2, f"lost: QoS 1 {lost1[:10]}, QoS 2 {lost2[:10]}"
    assert dup2 == 0, f"QoS 2 delivered twice: {dup2}"
    assert firsts == sorted(firsts) and q2 == sorted(q2), "per-publisher order"
    assert pub.failovers == 1 and pub.current == (group.address(B), 1883)


@pytest.mark.processes
def test_a_refused_publish_is_an_error_for_the_application_not_an_acknowledgement(tmp_path):
    policy = AccessPolicy(True, {}, (Rule(Effect("deny"), Action("publish"), "locked/#", "all"),
                                     Rule(Effect("allow"), Action("both"), "#", "all")))
    with active_group(tmp_path / "group", access=policy) as g:
        pub = HostListClient(hosts(g), "car-8")
        pub.start()
        try:
            for qos in (1, 2):
                with pytest.raises(PublishRefused, match=rf"refused the publish to 'locked/{qos}': "
                                                         r"Not authorized \(0x87\)"):
                    pub.publish(f"locked/{qos}", b"x", qos=qos).wait(timeout_s=10)
                assert pub.publish(f"open/{qos}", b"x", qos=qos).wait(timeout_s=10)  # the session goes on
        finally:
            pub.stop()


def test_host_lists_are_checked():
    assert parse_hosts("a:1,b") == [("a", 1), ("b", 1883)]
    for bad, why in (("", "not HOST"), ("a:0", "not HOST"), ("a:x", "not HOST"), (":1883", "not HOST")):
        with pytest.raises(ClientError, match=why):
            parse_hosts(bad)


def test_no_host_answering_is_a_clear_error():
    client = HostListClient(["127.0.9.1:1883", "127.0.9.2:1883"], "nobody", connect_timeout_s=0.2)
    with pytest.raises(ClientError, match="no host of 127.0.9.1:1883,127.0.9.2:1883 accepted 'nobody' within 1 s"):
        client.start(timeout_s=1)
    client.stop()


@pytest.mark.processes
def test_pairmq_pub_and_sub_like_mosquitto(group):
    import subprocess
    import sys

    from tests.unit.test_cli_commands import REPO, assert_one_sentence

    host_list = ",".join(reversed(hosts(group)))  # the standby first: both commands follow its server reference
    cli = [sys.executable, "-m", "pairmq.cli.main"]
    sub = subprocess.Popen([*cli, "sub", "--hosts", host_list, "-t", "cli/#", "-v", "-C", "3", "-W", "20", "-q", "2"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    time.sleep(1.5)  # subscribed
    one = subprocess.run([*cli, "pub", "--hosts", host_list, "-t", "cli/a", "-m", "hello"], capture_output=True,
                         text=True, cwd=REPO, timeout=30)
    assert one.returncode == 0, one.stderr
    lines = subprocess.run([*cli, "pub", "--hosts", host_list, "-t", "cli/b", "-l", "-q", "2"], input="x\ny\n",
                           capture_output=True, text=True, cwd=REPO, timeout=30)
    assert lines.returncode == 0, lines.stderr
    out, err = sub.communicate(timeout=30)
    assert sub.returncode == 0, err
    assert out.splitlines() == ["cli/a hello", "cli/b x", "cli/b y"]
    nobody = subprocess.run([*cli, "pub", "--hosts", "127.0.9.1", "-t", "t", "-m", "x", "--timeout", "1"],
                            capture_output=True, text=True, cwd=REPO, timeout=30)
    assert_one_sentence(nobody, "no host of 127.0.9.1:1883 accepted", code=1)

"""The host-list client across kill -9 and release-activity of the active: the application sees
no error, every message it published is acknowledged, a persistent subscriber on the same client gets every
one (QoS 2 exactly once) in order; a refused publish is an error; and bad host lists are clear errors."""

from __future__ import annotations

import time

import pytest

from pairmq.appliance.roles import Role
from pairmq.appliance.broker.access import AccessPolicy, Action, Effect, Rule
from pairmq.cli.hostlist import ClientError, HostListClient, PublishRefused, parse_hosts
from tests.harness.group import active_group
from tests.harness.ride import ride_a_failover

P, B = Role.PRIMARY, Role.BACKUP


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
    ride_a_failover(group, fault)


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

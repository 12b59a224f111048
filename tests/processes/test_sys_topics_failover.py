"""`$SYS` follows activity: after release-activity the backup publishes the tree with its own epoch, and a
client of the old active's address is refused. Its own group (the handover moves activity), `$SYS` every
second, no ACL."""

from __future__ import annotations

import subprocess

from pairmq.appliance.config import SysTopics
from pairmq.appliance.roles import Role
from tests.harness.group import active_group
from tests.processes.test_handover_processes import pairmq

P, B = Role.PRIMARY, Role.BACKUP
T = "$SYS/broker/"


def read_retained(group, role: Role, *topics: str) -> dict[str, str]:
    """The retained values of `topics` on `role`'s MQTT address, as mosquitto_sub gets them."""
    argv = ["mosquitto_sub", "-h", group.config.node(role).address, "-p", str(group.config.ports.mqtt),
            "-F", "%t =>%p", "--retained-only", "-W", "2"]
    for topic in topics:
        argv += ["-t", topic]
    got = subprocess.run(argv, capture_output=True, text=True, timeout=10)
    return dict(line.partition(" =>")[::2] for line in got.stdout.splitlines())


def test_the_new_active_publishes_sys_with_its_epoch(tmp_path):
    with active_group(tmp_path / "group", sys=SysTopics(interval_s=1)) as group:
        watched = (T + "redundancy/#", T + "uptime", T + "version")
        group.wait_for("the primary's $SYS", lambda: len(read_retained(group, P, *watched)) >= 6, timeout_s=10)
        before = read_retained(group, P, *watched)
        assert before[T + "redundancy/activity"] == "active" and before[T + "redundancy/in_sync"] == "true"

        released = pairmq(group, "release-activity")
        assert released.returncode == 0, released.stderr + group.logs_tail(40)
        group.wait_for("the backup's $SYS", lambda: len(read_retained(group, B, *watched)) >= 6, timeout_s=10)
        after = read_retained(group, B, *watched)
        assert int(after[T + "redundancy/epoch"]) > int(before[T + "redundancy/epoch"])
        assert after[T + "redundancy/activity"] == "active"
        assert after[T + "version"] == before[T + "version"]
        refused = subprocess.run(["mosquitto_sub", "-h", group.config.node(P).address, "-p",
                                  str(group.config.ports.mqtt), "-t", "$SYS/#", "-W", "2"],
                                 capture_output=True, text=True, timeout=10)
        assert refused.returncode != 0 and refused.stdout == "", "the standby serves nobody, $SYS included"

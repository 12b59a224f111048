"""SIGTERM to all three nodes at once (a whole group shut down, as `systemctl stop` on every host does):
every node exits by itself, with status 0 and its "stopped" line.

The active hands activity over to a backup that is stopping too; if the backup took that handover while
its config-sync follower task outlived the node's stop (a cancel lost in 3.11's wait_for), asyncio would
never finish and the process would hang until killed."""

from __future__ import annotations

import pytest

from pairmq.appliance.roles import Role
from tests.harness.group import active_group

EXIT_WAIT_S = 15.0  # generous: a node stops in about a second; a hung one never does


@pytest.mark.parametrize("round_", range(2))
def test_a_group_stopped_all_at_once_exits_by_itself(tmp_path, round_):
    with active_group(tmp_path) as group:
        procs = dict(group.procs)
        for proc in procs.values():
            proc.terminate()
        hung = []
        for role, proc in procs.items():
            try:
                proc.wait(EXIT_WAIT_S)
            except Exception:  # noqa: BLE001 - TimeoutExpired: reported below, the group's teardown kills it
                hung.append(role.value)
        assert not hung, f"still running {EXIT_WAIT_S:g} s after SIGTERM: {hung}\n{group.logs_tail(30)}"
        assert {r.value: p.returncode for r, p in procs.items()} == {r.value: 0 for r in Role}
        for role in Role:
            log = (group.dir / f"{role.value}.log").read_text()
            assert f"{role.value}: stopped" in log, group.logs_tail(30)

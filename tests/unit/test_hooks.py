"""Activity hooks without a group: the [hooks] table's checks at load, and the runner with real scripts
(real subprocesses: order, arguments and environment, the timeout's process-group kill, the queue's bound,
stderr's tail), plus which decision calls which hook."""

from __future__ import annotations

import asyncio
import os
import stat
import time
from pathlib import Path

import pytest

from pairmq.appliance.config import GroupConfig, NodeSpec, load_group, render_group
from pairmq.appliance.errors import ConfigError
from pairmq.appliance.hooks_settings import HookEvent, HookSettings, parse_hooks
from pairmq.appliance.node.hooks import STDERR_TAIL_BYTES, HookRunner, RedundancyWatch, decision_event
from pairmq.appliance.quorum.decisions import DecisionKind
from pairmq.appliance.roles import Role

RECORD = '#!/bin/sh\nprintf "%s|%s|%s|%s|%s|%s|%s|%s\\n" "$PAIRMQ_EVENT" "$1" "$2" "$3" "$PAIRMQ_ROLE" "$PAIRMQ_EPOCH" ' \
         '"$PAIRMQ_REASON" "$PAIRMQ_GROUP" >> "{out}"\n'


def script(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def recorder(tmp_path: Path, name: str = "record.sh") -> tuple[Path, Path]:
    out = tmp_path / f"{name}.calls"
    return script(tmp_path / name, RECORD.format(out=out)), out


class Events:
    def __init__(self) -> None:
        self.seen: list[tuple[str, dict]] = []

    def __call__(self, kind: str, **fields) -> None:
        self.seen.append((kind, fields))

    def of(self, kind: str) -> list[dict]:
        return [f for k, f in self.seen if k == kind]


def run(coro):
    return asyncio.run(coro)


async def outcomes(events: Events, n: int) -> None:
    """Until `n` hooks have an outcome: `close` gives what is queued only one timeout's worth of time."""
    deadline = time.monotonic() + 30
    while len(events.of("hook_finished")) + len(events.of("hook_failed")) < n:
        assert time.monotonic() < deadline, events.seen
        await asyncio.sleep(0.02)


# --- the [hooks] table ----------------------------------------------------------------------------------


def group_file(tmp_path: Path, hooks: HookSettings) -> Path:
    nodes = {r: NodeSpec(r, f"127.0.0.{i + 1}", tmp_path / r.value) for i, r in enumerate(Role)}
    path = tmp_path / "group.toml"
    path.write_text(render_group(GroupConfig("g", nodes, tmp_path / "secret", hooks=hooks)))
    return path


def test_hooks_round_trip_through_the_group_file(tmp_path):
    active, _ = recorder(tmp_path, "active.sh")
    fault, _ = recorder(tmp_path, "fault.sh")
    hooks = HookSettings({HookEvent.ACTIVE: active, HookEvent.FAULT: fault}, hook_timeout_ms=750)
    config = load_group(group_file(tmp_path, hooks))
    assert config.hooks == hooks and config.hooks.script(HookEvent.STANDBY) is None
    assert load_group(group_file(tmp_path, HookSettings())).hooks == HookSettings()
    assert "[hooks]" not in group_file(tmp_path, HookSettings()).read_text()


def test_relative_paths_are_relative_to_the_group_file(tmp_path):
    recorder(tmp_path, "up.sh")
    assert parse_hooks({"on_redundancy_up": "up.sh"}, tmp_path).script(HookEvent.REDUNDANCY_UP) == tmp_path / "up.sh"


@pytest.mark.parametrize("table,sentence", [
    ({"on_active": "missing.sh"}, "hooks.on_active: {dir}/missing.sh does not exist (install the script on every host "
                             "of the group)"),
    ({"on_standby": "plain.txt"}, "hooks.on_standby: {dir}/plain.txt is not executable (chmod +x it)"),
    ({"on_fault": "."}, "hooks.on_fault: {dir} is not a regular file"),
    ({"on_fault": 3}, "hooks.on_fault must be the path of an executable file, not 3"),
    ({"on_fault": ""}, "hooks.on_fault must be the path of an executable file, not ''"),
    ({"on_master": "x"}, "unknown key 'on_master' in [hooks] (known: hook_timeout_ms, on_active, on_fault, "
                         "on_redundancy_down, on_redundancy_up, on_standby)"),
    ({"hook_timeout_ms": 50}, "hooks.hook_timeout_ms must be a whole number from 100 to 600,000, not 50"),
    ({"hook_timeout_ms": True}, "hooks.hook_timeout_ms must be a whole number from 100 to 600,000, not True"),
    ({"hook_timeout_ms": "5s"}, "hooks.hook_timeout_ms must be a whole number from 100 to 600,000, not '5s'"),
])
def test_a_bad_hooks_table_is_one_sentence(tmp_path, table, sentence):
    (tmp_path / "plain.txt").write_text("echo not executable\n")
    with pytest.raises(ConfigError) as err:
        parse_hooks(table, tmp_path)
    assert str(err.value) == sentence.format(dir=tmp_path)


def test_a_group_file_naming_a_missing_hook_does_not_load(tmp_path):
    path = group_file(tmp_path, HookSettings())
    path.write_text(path.read_text() + '\n[hooks]\non_active = "nowhere/active.sh"\n')
    with pytest.raises(ConfigError, match=r"hooks.on_active: .*nowhere/active.sh does not exist"):
        load_group(path)


# --- which decision calls which hook ----------------------------------------------------------------------


@pytest.mark.parametrize("kind,routes,failed,event", [
    (DecisionKind.ACTIVATE, True, False, HookEvent.ACTIVE),
    (DecisionKind.STEP_DOWN, True, False, HookEvent.STANDBY),
    (DecisionKind.BOOT, True, False, HookEvent.STANDBY),
    (DecisionKind.BOOT, False, False, None),  # the monitor has no activity to announce
    (DecisionKind.STORAGE, False, True, HookEvent.FAULT),
    (DecisionKind.STORAGE, True, False, None),  # "saved again": the end of a fault, not a new one
    (DecisionKind.BID, True, False, None),
    (DecisionKind.VOTE, False, False, None),
    (DecisionKind.HANDOVER, True, False, None),
])
def test_decisions_map_to_hooks(kind, routes, failed, event):
    assert decision_event(kind, routes_messages=routes, storage_failed=failed) is event


def test_redundancy_edges_after_the_first_status():
    watch = RedundancyWatch()
    seen = [watch.change(up) for up in (False, False, True, True, False, True)]
    assert seen == [None, None, HookEvent.REDUNDANCY_UP, None, HookEvent.REDUNDANCY_DOWN, HookEvent.REDUNDANCY_UP]


# --- the runner, with real scripts ----------------------------------------------------------------------


def test_hooks_run_in_order_with_role_epoch_and_reason_as_arguments_and_environment(tmp_path):
    path, out = recorder(tmp_path)
    events = Events()
    settings = HookSettings({e: path for e in HookEvent}, hook_timeout_ms=5_000)

    async def main():
        runner = HookRunner(settings, group="grp", role="backup", events=events)
        runner.notify(HookEvent.STANDBY, 1, "backup: started")
        runner.notify(HookEvent.REDUNDANCY_UP, 1, "backup: redundancy Up (standby, in sync with the active)")
        runner.notify(HookEvent.ACTIVE, 2, "backup: taking activity")
        runner.notify(HookEvent.REDUNDANCY_DOWN, 2, "backup: redundancy Down")
        await runner.close()

    run(main())
    lines = [line.split("|") for line in out.read_text().splitlines()]
    assert [(l[0], l[1], l[2], l[3]) for l in lines] == [
        ("standby", "backup", "1", "backup: started"),
        ("redundancy_up", "backup", "1", "backup: redundancy Up (standby, in sync with the active)"),
        ("active", "backup", "2", "backup: taking activity"),
        ("redundancy_down", "backup", "2", "backup: redundancy Down")]
    assert all(l[4:] == [l[1], l[2], l[3], "grp"] for l in lines)  # the environment says the same
    finished = events.of("hook_finished")
    assert [f["hook"] for f in finished] == ["standby", "redundancy_up", "active", "redundancy_down"]
    assert all(f["exit_code"] == 0 and f["timed_out"] is False and f["script"] == str(path) for f in finished)


def test_an_event_without_a_script_runs_nothing(tmp_path):
    path, out = recorder(tmp_path)
    events = Events()

    async def main():
        runner = HookRunner(HookSettings({HookEvent.ACTIVE: path}), group="g", role="primary", events=events)
        runner.notify(HookEvent.STANDBY, 1, "primary: started")
        runner.notify(HookEvent.ACTIVE, 1, "primary: taking activity")
        await runner.close()

    run(main())
    assert [l.split("|")[0] for l in out.read_text().splitlines()] == ["active"]
    assert [f["hook"] for f in events.of("hook_finished")] == ["active"]


def test_a_hung_hook_is_killed_with_its_children_and_the_next_one_runs(tmp_path):
    """The hang forks a child that would outlive a plain kill; the whole process group goes."""
    child_pid = tmp_path / "child.pid"
    hang = script(tmp_path / "hang.sh", f'#!/bin/sh\nsleep 600 &\necho $! > "{child_pid}"\necho hanging >&2\n'
                                        "sleep 600\n")
    record, out = recorder(tmp_path)
    events = Events()
    settings = HookSettings({HookEvent.ACTIVE: hang, HookEvent.REDUNDANCY_DOWN: record}, hook_timeout_ms=300)

    async def main():
        runner = HookRunner(settings, group="g", role="backup", events=events)
        runner.notify(HookEvent.ACTIVE, 2, "backup: taking activity")
        runner.notify(HookEvent.REDUNDANCY_DOWN, 2, "backup: redundancy Down")
        returned = "notify returned"  # with the hung hook started and nothing awaited
        await outcomes(events, 2)
        await runner.close()
        return returned

    assert run(main()) == "notify returned"
    first, second = events.of("hook_finished")
    assert first["hook"] == "active" and first["timed_out"] is True and first["exit_code"] == -9
    assert first["stderr_tail"] == "hanging"
    assert second["hook"] == "redundancy_down" and second["exit_code"] == 0 and not second["timed_out"]
    assert out.read_text().split("|")[0] == "redundancy_down"
    pid = int(child_pid.read_text())
    deadline = time.monotonic() + 5
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not _alive(pid), "the hung hook's child survived the timeout"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"  # a zombie is dead, only not yet reaped
    except FileNotFoundError:
        return False


def test_a_full_queue_drops_the_oldest_waiting_call(tmp_path):
    slow_out = tmp_path / "slow.calls"
    slow = script(tmp_path / "slow.sh", f'#!/bin/sh\necho "$PAIRMQ_EPOCH" >> "{slow_out}"\nsleep 0.5\n')
    events = Events()

    async def main():
        runner = HookRunner(HookSettings({HookEvent.ACTIVE: slow}), group="g", role="primary", events=events,
                            max_queued=2)
        for epoch in range(1, 7):
            runner.notify(HookEvent.ACTIVE, epoch, f"epoch {epoch}")
            await asyncio.sleep(0)  # let the worker take the first call before the rest queue
        await outcomes(events, 3)
        await runner.close()

    run(main())
    # 1 runs at once; 2..6 queue behind it in a queue of 2: 2, 3 and 4 are dropped in turn.
    assert [int(x) for x in slow_out.read_text().split()] == [1, 5, 6]
    assert [d["epoch"] for d in events.of("hook_dropped")] == [2, 3, 4]


def test_stderr_is_kept_to_its_tail_and_a_failure_is_reported(tmp_path):
    noisy = script(tmp_path / "noisy.sh", "#!/bin/sh\nhead -c 100000 /dev/zero | tr '\\0' x >&2\n"
                                          "echo ' the end' >&2\nexit 3\n")
    events = Events()

    async def main():
        runner = HookRunner(HookSettings({HookEvent.FAULT: noisy}), group="g", role="monitor", events=events)
        runner.notify(HookEvent.FAULT, 4, "monitor: cannot save the quorum state")
        await runner.close()

    run(main())
    (done,) = events.of("hook_finished")
    assert done["exit_code"] == 3 and done["timed_out"] is False
    assert done["stderr_tail"].endswith("x the end") and len(done["stderr_tail"]) <= STDERR_TAIL_BYTES


def test_a_script_that_cannot_start_is_an_event(tmp_path):
    gone = script(tmp_path / "gone.sh", "#!/bin/sh\n")
    events = Events()

    async def main():
        runner = HookRunner(HookSettings({HookEvent.ACTIVE: gone}), group="g", role="primary", events=events)
        gone.unlink()  # removed after the group file was checked
        runner.notify(HookEvent.ACTIVE, 1, "primary: taking activity")
        await runner.close()

    run(main())
    (failed,) = events.of("hook_failed")
    assert failed["hook"] == "active" and "No such file" in failed["error"]


def test_hostile_reasons_reach_the_script_verbatim_and_bounded(tmp_path):
    """A reason is an argument, never shell text: quotes, `$(...)` and newlines arrive as they are."""
    args_out = tmp_path / "args"
    dump = script(tmp_path / "dump.sh", f'#!/bin/sh\nprintf "%s" "$3" > "{args_out}"\n')
    marker = tmp_path / "injected"
    hostile = f'a "quoted" $(touch {marker}) `touch {marker}`; touch {marker}\nsecond line'

    async def main(reason):
        runner = HookRunner(HookSettings({HookEvent.STANDBY: dump}), group="g", role="backup", events=Events())
        runner.notify(HookEvent.STANDBY, 1, reason)
        await runner.close()

    run(main(hostile))
    assert args_out.read_text() == hostile and not marker.exists()
    run(main("r" * 100_000))
    assert args_out.read_text() == "r" * 1000


def test_a_reason_no_exec_can_carry_is_an_event_not_a_crash(tmp_path):
    events = Events()
    dump = script(tmp_path / "dump.sh", "#!/bin/sh\n")

    async def main():
        runner = HookRunner(HookSettings({HookEvent.FAULT: dump}), group="g", role="backup", events=events)
        runner.notify(HookEvent.FAULT, 1, "a NUL \0 byte")
        runner.notify(HookEvent.FAULT, 1, "then a fine one")
        await outcomes(events, 2)
        await runner.close()

    run(main())
    assert [k for k, _ in events.seen] == ["hook_failed", "hook_finished"]


def test_close_kills_a_hung_hook_and_drops_what_waits_behind_it(tmp_path):
    """A stopping node: the hung hook's group is killed within the shutdown bound, not its own long timeout."""
    child_pid = tmp_path / "child.pid"
    hang = script(tmp_path / "hang.sh", f'#!/bin/sh\nsleep 600 &\necho $! > "{child_pid}"\nsleep 600\n')
    record, out = recorder(tmp_path)
    events = Events()
    settings = HookSettings({HookEvent.STANDBY: hang, HookEvent.FAULT: record}, hook_timeout_ms=600_000)

    async def main():
        runner = HookRunner(settings, group="g", role="backup", events=events)
        runner.notify(HookEvent.STANDBY, 1, "backup: started")
        runner.notify(HookEvent.FAULT, 1, "backup: the spool is lost")
        while not child_pid.exists() or not child_pid.read_text().strip():
            await asyncio.sleep(0.02)
        await runner.close()

    run(main())
    assert not out.exists()  # it waited behind the hang, and the node stopped first
    assert events.of("hook_finished") == []  # killed at shutdown: no outcome to report
    pid = int(child_pid.read_text())
    deadline = time.monotonic() + 5
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not _alive(pid), "the hung hook's child survived the node's stop"

"""Activity hooks on a live loopback group: a script that records its calls sees, on each node, exactly the
sequence of that node's activity changes across release-activity, revert-activity and kill -9 of the active;
the redundancy hooks follow the loss of the primary; and a hook that hangs holds no decision back: the
failover happens while it hangs, it is killed at its timeout, and the next hook runs after it."""

from __future__ import annotations

import stat
import subprocess
import sys
import time
from pathlib import Path

from pairmq.appliance.hooks_settings import HookEvent, HookSettings
from pairmq.appliance.roles import Role
from tests.harness.group import REPO, Group, active_group
from tests.harness.http_api import hand_over

P, B, M = Role.PRIMARY, Role.BACKUP, Role.MONITOR

RECORD = '#!/bin/sh\nprintf "%s|%s|%s|%s|%s\\n" "$PAIRMQ_EVENT" "$1" "$2" "$PAIRMQ_GROUP" "$3" ' \
         '>> "{dir}/calls.$PAIRMQ_ROLE"\n'
HANG = "#!/bin/sh\nsleep 600\n"


def script(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def calls(directory: Path, role: Role) -> list[dict]:
    path = directory / f"calls.{role.value}"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        event, who, epoch, group, reason = line.split("|", 4)
        assert who == role.value and group == "test", line  # argument and environment name this node
        out.append({"event": event, "epoch": int(epoch), "reason": reason})
    return out


def transitions(g, role: Role) -> list[tuple[str, int, str]]:
    """What the node's event log says its activity did: boot and step_down → standby, activate → active."""
    kinds = {"boot": "standby", "step_down": "standby", "activate": "active"}
    return [(kinds[d["kind"]], d["epoch"], d["reason"]) for d in g.decisions(role) if d["kind"] in kinds]


def activity_calls(directory: Path, role: Role) -> list[tuple[str, int, str]]:
    return [(c["event"], c["epoch"], c["reason"]) for c in calls(directory, role)
            if c["event"] in ("active", "standby")]


def in_sync_for(g, standby: Role, active: Role) -> bool:
    """`standby`'s latest sync decision says it holds the data of `active`'s latest epoch."""
    activations = g.decisions(active, "activate")  # the event log is written behind the hook's start
    if not activations:
        return False
    epoch = activations[-1]["epoch"]
    syncs = [d for d in g.decisions(standby, "sync") if d["epoch"] == epoch and "in sync" in d["reason"]]
    return bool(syncs) and "out of sync" not in syncs[-1]["reason"]


def hook_outcomes(g, role: Role) -> list[dict]:
    return [e for e in g.events(role) if e["event"] in ("hook_finished", "hook_failed", "hook_dropped")]


def test_a_recording_hook_sees_each_nodes_transitions_in_order(tmp_path):
    out = tmp_path / "calls"
    out.mkdir()
    record = script(tmp_path / "record.sh", RECORD.format(dir=out))
    hooks = HookSettings({e: record for e in HookEvent}, hook_timeout_ms=5_000)
    with active_group(tmp_path / "group", hooks=hooks) as g:
        g.wait_for("the backup's redundancy Up hook",
                   lambda: any(c["event"] == "redundancy_up" for c in calls(out, B)), timeout_s=20)

        assert hand_over(g.config, P)["result"] == "handed over"  # release-activity
        g.wait_for("the backup's active hook", lambda: [c[0] for c in activity_calls(out, B)][-1:] == ["active"],
                   timeout_s=20)
        g.wait_for("the primary in sync under the backup", lambda: in_sync_for(g, P, B), timeout_s=20)
        assert hand_over(g.config, B, "revert-activity")["result"] == "handed over"
        g.wait_for("the primary's active hook again",
                   lambda: [c[0] for c in activity_calls(out, P)].count("active") == 2, timeout_s=20)
        g.wait_for("the backup in sync under the primary again", lambda: in_sync_for(g, B, P), timeout_s=20)
        time.sleep(0.5)  # past the in-sync flag's first heartbeats, so the monitor knows it too

        g.kill(P)  # kill -9 of the active
        g.wait_for("the backup's active hook after the kill",
                   lambda: [c[0] for c in activity_calls(out, B)].count("active") == 2, timeout_s=20)
        for role in (B, M):
            g.wait_for(f"the {role.value}'s redundancy Down hook",
                       lambda: (calls(out, role) or [{}])[-1].get("event") == "redundancy_down", timeout_s=20)

        # Each node's script saw exactly its own transitions, in order, with their epochs and decision sentences.
        for role in (P, B):
            seen = activity_calls(out, role)
            assert seen == transitions(g, role), (role, seen, transitions(g, role))
        assert [c[0] for c in activity_calls(out, P)] == ["standby", "active", "standby", "active"]
        assert [c[0] for c in activity_calls(out, B)] == ["standby", "active", "standby", "active"]
        epochs = [c[1] for c in activity_calls(out, B) if c[0] == "active"]
        assert epochs[1] > epochs[0]  # the takeover after the kill is a newer epoch than the release's
        assert "taking activity" in activity_calls(out, B)[-1][2]

        # The monitor has no activity: only redundancy hooks, Up once it saw both, Down once the primary died.
        monitor = calls(out, M)
        assert {c["event"] for c in monitor} <= {"redundancy_up", "redundancy_down"}
        assert monitor[0]["event"] == "redundancy_up" and "does not see the primary" in monitor[-1]["reason"]
        for role in (B, M):  # redundancy hooks alternate: each is a change
            events = [c["event"] for c in calls(out, role) if c["event"].startswith("redundancy")]
            assert all(a != b for a, b in zip(events, events[1:])), (role, events)
        assert [c["event"] for c in calls(out, B) if c["event"].startswith("redundancy")][-1] == "redundancy_down"

        # Every run is in the node's event log, with its outcome.
        for role in (B, M):
            g.wait_for(f"the {role.value}'s hook outcomes in its event log",
                       lambda: len(hook_outcomes(g, role)) >= len(calls(out, role)))
            outcomes = hook_outcomes(g, role)
            assert [o["hook"] for o in outcomes] == [c["event"] for c in calls(out, role)]
            assert all(o["event"] == "hook_finished" and o["exit_code"] == 0 and not o["timed_out"]
                       for o in outcomes)


def test_a_hanging_hook_does_not_delay_the_failover(tmp_path):
    """The backup's standby hook (run at its boot) hangs; the primary is killed while it hangs. The backup
    still takes over, while its hook queue is blocked; the hang is killed at its timeout; then the active
    hook runs."""
    out = tmp_path / "calls"
    out.mkdir()
    record = script(tmp_path / "record.sh", RECORD.format(dir=out))
    hang = script(tmp_path / "hang.sh", HANG)
    hooks = HookSettings({HookEvent.STANDBY: hang, HookEvent.ACTIVE: record}, hook_timeout_ms=15_000)
    with active_group(tmp_path / "group", hooks=hooks) as g:
        assert not [e for e in g.events(B) if e["event"] == "hook_finished"], "the hang ended before the kill"
        g.kill(P)
        g.wait_for("the backup to take activity", lambda: g.decisions(B, "activate"), timeout_s=20)
        log = g.events(B)
        activated_at = next(i for i, e in enumerate(log) if e["event"] == "redundancy_decision"
                            and e["kind"] == "activate")
        assert not [e for e in log[:activated_at] if e["event"] == "hook_finished"], \
            "the activation waited for the hung hook"

        g.wait_for("the active hook, after the hung one", lambda: activity_calls(out, B), timeout_s=60)
        g.wait_for("both outcomes in the event log", lambda: len(hook_outcomes(g, B)) == 2)
        outcomes = hook_outcomes(g, B)
        assert [(o["hook"], o["timed_out"], o["exit_code"]) for o in outcomes] == [
            ("standby", True, -9), ("active", False, 0)]
        log = g.events(B)
        killed_at = next(i for i, e in enumerate(log) if e["event"] == "hook_finished")
        assert activated_at < killed_at  # decided first, the hang's kill came later
        ((event, epoch, reason),) = activity_calls(out, B)
        assert event == "active" and (event, epoch, reason) == transitions(g, B)[-1]


def test_a_node_whose_hook_is_not_executable_does_not_start(tmp_path):
    """Checked at load: one sentence, exit 1, before any socket is bound."""
    hook = script(tmp_path / "active.sh", "#!/bin/sh\n")
    group = Group(tmp_path / "group", hooks=HookSettings({HookEvent.ACTIVE: hook}))  # written, not entered
    hook.chmod(0o644)
    result = subprocess.run([sys.executable, "-m", "pairmq.cli.main", "node", "--role", "backup", "--group",
                             str(group.dir / "group.toml")], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip().splitlines()[-1] == f"error: hooks.on_active: {hook} is not executable (chmod +x it)"

"""Files private whatever the umask: nobody but the node's user reads payloads, events or secrets.

A real group is started from a process whose umask is 022 (a common default); its data directories
are even made 0755 beforehand, as a tool run under that umask would. Messages are published and
spooled, events written, the configuration stored; then every file and directory under each
node's data directory (the spool database and its -wal / -shm, the event log segments, the config
store, the quorum state and the keyring) must have no group or other permission bits.
"""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

from pairmq.appliance.roles import Role
from tests.harness.group import Group

P, B, M = Role.PRIMARY, Role.BACKUP, Role.MONITOR


def too_open(root: Path) -> dict[str, str]:
    """Every path under `root` (itself included) that its group or others may read, enter or write."""
    found = {}
    for path in [root, *root.rglob("*")]:
        mode = stat.S_IMODE(path.lstat().st_mode)
        if mode & 0o077:
            found[str(path.relative_to(root.parent))] = f"{mode:o}"
    return found


def test_every_file_under_the_data_dirs_is_private_under_umask_022(tmp_path):
    old = os.umask(0o022)
    try:
        with Group(tmp_path / "group") as group:
            for role in Role:
                data_dir = group.config.node(role).data_dir
                data_dir.mkdir(parents=True, exist_ok=True)
                data_dir.chmod(0o755)  # as `mkdir` under umask 022 would leave it
            group.start()
            group.wait_for("the primary to serve", lambda: group.serving(P), timeout_s=20)
            group.wait_for("the backup to be in sync", group.backup_in_sync, timeout_s=20)
            for i in range(5):  # retained QoS 1: its payload stays in the spool of both routing nodes
                subprocess.run(["mosquitto_pub", "-h", group.address(P), "-p", str(group.config.ports.mqtt),
                                "-q", "1", "-r", "-t", f"private/{i}", "-m", f"payload {i}"], check=True, timeout=10)
            spools = {r: list(group.config.node(r).data_dir.rglob("*-wal")) for r in (P, B)}
            assert all(spools.values()), f"no SQLite write-ahead log to check: {spools}"
            opened = {r: too_open(group.config.node(r).data_dir) for r in Role}  # while the nodes run
            events = {r: list(group.config.node(r).data_dir.rglob("*.jsonl")) for r in Role}
            assert all(events.values()), "no event log segment to check"
        closed = {r: too_open(group.config.node(r).data_dir) for r in Role}  # and what they leave behind
    finally:
        os.umask(old)
    assert opened == {r: {} for r in Role}, opened
    assert closed == {r: {} for r in Role}, closed

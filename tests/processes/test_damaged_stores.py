"""A damaged store stops a node at start-up (the bad-input sweep's on-disk half, docs/reliability.md).

Rules: a damaged spool, config store or quorum state file stops the node before it serves, with
one sentence on stderr that names the file (no traceback), and the file is left byte for byte as
it was, for the operator to inspect or restore from the mate.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import subprocess
import sys

import pytest

from pairmq.appliance.roles import Role
from tests.harness.group import REPO, Group

P = Role.PRIMARY


def _damage_spool(data_dir):
    path = data_dir / "spool" / "spool.db"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"SQLite format 3\x00" + os.urandom(8192))
    return path


def _damage_config_store(data_dir):
    path = data_dir / "config" / "config.db"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(os.urandom(4096))
    return path


def _alter_config_store(data_dir):
    """A real store whose document was edited behind its digest (a hand edit, or bit rot)."""
    from pairmq.configsync.store import ConfigStore, store_path
    path = store_path(data_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    ConfigStore(path).close()
    with contextlib.closing(sqlite3.connect(path)) as db, db:  # closed: the WAL is checkpointed into the file
        db.execute("UPDATE head SET document = replace(document, '\"users\"', '\"usres\"')")
    return path


def _damage_quorum_state(data_dir):
    path = data_dir / "quorum.json"
    data_dir.mkdir(parents=True, exist_ok=True)
    path.write_text("{\"epoch\": 7, \"incarn")
    return path


@pytest.mark.parametrize("damage, words", [
    (_damage_spool, "spool"),
    (_damage_config_store, "config"),
    (_alter_config_store, "config"),
    (_damage_quorum_state, "quorum"),
])
def test_a_damaged_store_stops_the_node_at_start_with_one_sentence(tmp_path, damage, words):
    with Group(tmp_path / "group") as g:
        path = damage(g.config.node(P).data_dir)
        before = path.read_bytes()
        proc = subprocess.run([sys.executable, "-m", "pairmq.cli.main", "node", "--role", "primary",
                               "--group", str(g.dir / "group.toml")],
                              cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0, f"the node started on a damaged {path.name}:\n{proc.stderr[-2000:]}"
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert "Traceback" not in proc.stderr, proc.stderr
    assert lines and words in lines[-1] and str(path.name) in lines[-1], proc.stderr
    assert path.read_bytes() == before, f"{path} was changed by the refused start"

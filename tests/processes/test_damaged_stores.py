"""A damaged store stops a node at start-up (the bad-input sweep's on-disk half, docs/reliability.md).

Rules: a damaged spool, config store or quorum state file stops the node before it serves, with
one sentence on stderr that names the file (no traceback), and the file is left byte for byte as
it was (nothing else in its directory removed, no spool file added), for the operator to inspect or
restore from the mate. A spool in the old layout (SQLite's spool.db) is refused the same way, its sentence
saying how to convert it.
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


def _written_spool(data_dir):
    """A real spool of the node's, several segments long, written by the engine (what a node leaves)."""
    from pairmq.appliance.spool import ops as o
    from pairmq.appliance.spool.store import Spool
    from pairmq.appliance.spool.writer import SpoolWriter
    directory = data_dir / "spool"
    directory.parent.mkdir(parents=True, exist_ok=True)
    with Spool.open(directory, segment_bytes=2000) as spool, SpoolWriter(spool) as writer:
        writer.submit([o.SessionOpened("sub", 5, 3600, 1)], 1).future.result(30)
        for i in range(1, 40):
            writer.submit([o.MessageStored(i, "t", b"m" * 100, 1, False, b"", 0, "p", i),
                           o.MessageQueued("sub", i, 1, False)], 1).future.result(30)
    return directory


def _damage_spool(data_dir):
    """A byte flipped in the middle of the first segment: its record's CRC no longer matches."""
    path = sorted(_written_spool(data_dir).glob("*.seg"))[0]
    data = bytearray(path.read_bytes())
    assert len(sorted(path.parent.glob("*.seg"))) > 2
    data[len(data) // 2] ^= 0x10
    path.write_bytes(bytes(data))
    return path


def _old_layout_spool(data_dir):
    """A spool from before the op log became the store: SQLite's spool.db, one queued message in it."""
    from tests.harness.legacy_spool import offline_session, write_old_spool
    write_old_spool(data_dir / "spool", offline_session("sub", "t/#", [b"old"]))
    return data_dir / "spool" / "spool.db"


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
    (_damage_spool, "refusing to serve from a corrupt spool"),
    (_old_layout_spool, "pairmq spool migrate"),
    (_damage_config_store, "config"),
    (_alter_config_store, "config"),
    (_damage_quorum_state, "quorum"),
])
def test_a_damaged_store_stops_the_node_at_start_with_one_sentence(tmp_path, damage, words):
    with Group(tmp_path / "group") as g:
        path = damage(g.config.node(P).data_dir)
        before = path.read_bytes()
        files = {p.name for p in path.parent.iterdir()}
        proc = subprocess.run([sys.executable, "-m", "pairmq.cli.main", "node", "--role", "primary",
                               "--group", str(g.dir / "group.toml")],
                              cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0, f"the node started on a damaged {path.name}:\n{proc.stderr[-2000:]}"
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert "Traceback" not in proc.stderr, proc.stderr
    assert lines and words in lines[-1] and str(path.name) in lines[-1], proc.stderr
    assert path.read_bytes() == before, f"{path} was changed by the refused start"
    after = {p.name for p in path.parent.iterdir()}
    assert files <= after, f"the refused start removed {sorted(files - after)}"
    assert not [name for name in after - files if name.endswith((".seg", ".ckpt"))], "the refused start wrote a spool"

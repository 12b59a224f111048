"""`pairmq spool migrate DIR` on real old-layout spools (written by the old layout's own code), and the spool's
files in `pairmq show message-spool` (exact output from a fixed `--json` document)."""

import fcntl
import json
import os
from io import StringIO

from rich.console import Console

from pairmq.appliance.spool.store import Spool
from pairmq.cli.main import main
from pairmq.cli.show_spool import spool_table
from pairmq.cli.terminal import Terminal
from tests.harness.legacy_spool import offline_session, write_old_spool
from tests.unit.test_cli_show_broker import SPOOL, rendered


def cli(*argv: str) -> tuple[int, str, str]:
    out, err = StringIO(), StringIO()
    term = Terminal(Console(file=out, width=400, color_system=None), Console(file=err, width=400, color_system=None))
    code = main(list(argv), term)
    return code, out.getvalue(), err.getvalue()


def listing(directory) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def test_migrate_converts_the_old_layout_and_moves_its_files_aside(tmp_path):
    spool_dir = tmp_path / "spool"
    head = write_old_spool(spool_dir, offline_session("keeper", "old/#", [b"one", b"two", b"three"]))
    old_bytes = (spool_dir / "spool.db").read_bytes()
    code, out, err = cli("spool", "migrate", str(spool_dir))
    assert (code, err) == (0, ""), err
    checkpoint = spool_dir / f"{head.seq:020d}.ckpt"
    aside = tmp_path / "spool.old-layout"
    assert out.strip() == (f"migrated {spool_dir}: head op 9 (epoch 1), 1 session, 3 stored messages; wrote the "
                           f"checkpoint {checkpoint}; the old files are in {aside}")
    assert (aside / "spool.db").read_bytes() == old_bytes and not (spool_dir / "spool.db").exists()
    with Spool.open(spool_dir) as spool:
        state = spool.load_state()
    assert state.head == head
    assert [(e.msg_id, state.messages[e.msg_id].payload) for e in state.sessions["keeper"].queue] == [
        (1, b"one"), (2, b"two"), (3, b"three")]
    code, out, err = cli("spool", "migrate", str(spool_dir))
    assert (code, out) == (1, "")
    assert err.strip() == f"error: nothing to migrate: {spool_dir} holds no old-layout spool (spool.db)"


def test_migrate_json(tmp_path):
    head = write_old_spool(tmp_path / "spool", offline_session("keeper", "old/#", [b"x"]))
    code, out, _ = cli("spool", "migrate", str(tmp_path / "spool"), "--json")
    assert code == 0 and json.loads(out) == {
        "schema": 1, "directory": str(tmp_path / "spool"),
        "head": {"epoch": 1, "seq": head.seq, "checksum": head.checksum.hex()}, "sessions": 1, "messages": 1,
        "checkpoint": str(tmp_path / "spool" / f"{head.seq:020d}.ckpt"),
        "old_files": str(tmp_path / "spool.old-layout")}


def test_migrate_refuses_while_a_node_holds_the_spool(tmp_path):
    spool_dir = tmp_path / "spool"
    write_old_spool(spool_dir, offline_session("keeper", "old/#", [b"x"]))
    fd = os.open(spool_dir / "spool.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as Spool.open holds it in a running node
        before = listing(spool_dir)
        code, out, err = cli("spool", "migrate", str(spool_dir))
        assert (code, out) == (1, "")
        assert err.strip() == f"error: spool {spool_dir}: another process has it open (stop the node first)"
        assert listing(spool_dir) == before and not (tmp_path / "spool.old-layout").exists()
    finally:
        os.close(fd)


def test_migrate_refuses_a_damaged_old_file_and_changes_nothing(tmp_path):
    spool_dir = tmp_path / "spool"
    spool_dir.mkdir()
    (spool_dir / "spool.db").write_bytes(b"SQLite format 3\x00" + bytes(range(256)) * 32)
    before = listing(spool_dir)
    code, out, err = cli("spool", "migrate", str(spool_dir))
    assert (code, out) == (1, "")
    assert err.startswith(f"error: spool {spool_dir / 'spool.db'}: ") and err.strip().endswith("; not migrated")
    assert listing(spool_dir) == {**before, "spool.lock": b""} and not list(spool_dir.glob("*.ckpt"))


DISK = {"segments": 3, "segment_bytes": 201326592, "checkpoint_bytes": 1572864, "bytes_on_disk": 202899456,
        "checkpoint": {"epoch": 4, "seq": 1200000}, "log_base": {"epoch": 3, "seq": 1100000},
        "log_head": {"epoch": 4, "seq": 1234567}, "log_bytes_since_checkpoint": 3774873, "keep_ops": 100000}


def test_message_spool_table_shows_the_spools_files():
    document = {**SPOOL, "nodes": [{**SPOOL["nodes"][0], "disk": DISK}, SPOOL["nodes"][1]]}
    lines = rendered(spool_table(document))
    old = rendered(spool_table(SPOOL))
    assert [" ".join(line.split()) for line in lines[3:13]] == [" ".join(line.split()) for line in old[3:13]]
    assert lines[13:] == [  # the rows of the existing figures stay as they were, the files' rows follow
        'Log                       ops 1,100,001-1,234,567 (epoch 4)                    -',
        'Checkpoint                         at op 1,200,000, 1.5 MiB                    -',
        'Log since checkpoint                                3.6 MiB                    -',
        'Segments                                       3, 192.0 MiB                    -',
        'On disk                                           193.5 MiB                    -',
        'Unreachable                                                   connection refused',
    ]

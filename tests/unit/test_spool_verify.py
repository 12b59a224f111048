"""`pairmq spool verify DIR` (appliance/spool/verify.py and cli/spool_cmd.py) on real spool directories written by
the real writer: a sound spool is listed with the totals a node would load, damage is one sentence naming the file
and the byte offset of the record it hit (and `Spool.open` refuses the same directory), an unfinished write at the
end is not damage, a checkpoint of another history is refused, the old layout is named, and nothing is changed."""

import json
import os
import sqlite3
from io import StringIO
from pathlib import Path

import pytest
from rich.console import Console

from pairmq.appliance.errors import SpoolCorruption
from pairmq.appliance.spool import ops as o
from pairmq.appliance.spool import records as r
from pairmq.appliance.spool.legacy import sql as legacy_sql
from pairmq.appliance.spool.store import Spool
from pairmq.appliance.spool.verify import NotASpool, verify
from pairmq.appliance.spool.writer import SpoolWriter
from pairmq.cli.main import main
from pairmq.cli.terminal import Terminal

SEGMENT_BYTES = 2000  # several segments from a few dozen messages


def publish(writer: SpoolWriter, first: int, n: int, epoch: int = 1, client: str = "c1") -> None:
    for msg_id in range(first, first + n):
        writer.submit([o.MessageStored(msg_id, "t/x", b"m" * 100, 1, False, b"", 0, "p", 1),
                       o.MessageQueued(client, msg_id, 1, False)], epoch).future.result()


def make_spool(directory: Path, *, checkpoint_after: int | None = 20, total: int = 30, client: str = "c1") -> Spool:
    """A spool of `total` messages queued for one session (op 1 opens it, each message is two ops), checkpointed
    after `checkpoint_after` of them; left as a process killed after its last commit leaves it: no closing
    checkpoint, so the log after the checkpoint is what a reader replays."""
    spool = Spool.open(directory, segment_bytes=SEGMENT_BYTES)
    writer = SpoolWriter(spool)
    writer.submit([o.SessionOpened(client, 5, 3600, 1)], 1).future.result()
    done = 0
    if checkpoint_after is not None:
        publish(writer, 1, checkpoint_after, client=client)
        spool.write_checkpoint()
        done = checkpoint_after
    publish(writer, done + 1, total - done, epoch=2, client=client)
    writer.close()
    spool.log.close()
    os.close(spool._lock_fd)
    spool._lock_fd = -1
    return spool


def files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def record_offsets(path: Path) -> list[int]:
    data = path.read_bytes()
    pos, out = r.HEADER_BYTES, []
    while pos < len(data):
        out.append(pos)
        _, pos = r.next_record(data, pos)
    return out


def flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))


def cli(*argv: str) -> tuple[int, str, str]:
    out, err = StringIO(), StringIO()
    term = Terminal(Console(file=out, width=160, color_system=None), Console(file=err, width=400, color_system=None))
    code = main(list(argv), term)
    return code, out.getvalue(), err.getvalue()


def test_a_sound_spool_is_listed_with_the_totals_a_node_loads(tmp_path):
    make_spool(tmp_path)
    report = verify(tmp_path)
    assert report.sound and report.damage is None and not report.in_use
    segs = report.segments
    assert len(segs) >= 3
    assert segs[0].base.seq == 0 and all(a.last == b.base for a, b in zip(segs, segs[1:]))
    assert sum(s.ops for s in segs) == 61 and sum(s.commits for s in segs) == 31  # one commit per submission
    assert segs[0].first_epoch == 1 and segs[-1].last.epoch == 2
    assert [(c.point.seq, c.ops) for c in report.checkpoints] == [(41, 21)] and report.checkpoints[0].verified  # a session, 20 routed messages
    with Spool.open(tmp_path) as spool:
        state = spool.load_state()
    assert report.head == state.head and report.base.seq == 0
    t = report.totals
    assert (t.sessions, t.queued_messages, t.retained, t.stored_messages, t.stored_bytes) == (
        len(state.sessions), sum(len(s.queue) for s in state.sessions.values()), len(state.retained),
        len(state.messages), state.stored_bytes) == (1, 30, 0, 30, state.stored_bytes)
    code, out, err = cli("spool", "verify", str(tmp_path), "--json")
    document = json.loads(out)
    assert code == 0 and err == "" and document["sound"] and document["totals"]["queued_messages"] == 30


def test_verify_changes_nothing_and_reads_beside_a_node_holding_the_spool(tmp_path):
    make_spool(tmp_path)
    before = files(tmp_path)
    with Spool.open(tmp_path, segment_bytes=SEGMENT_BYTES):  # the lock held, as by a node serving from it
        report = verify(tmp_path)
        code, _, err = cli("spool", "verify", str(tmp_path))
    assert report.sound and report.in_use
    assert code == 0 and "a process holds" in err
    assert not verify(tmp_path).in_use


def test_verify_leaves_the_directory_as_it_was(tmp_path):
    make_spool(tmp_path)
    last = sorted(tmp_path.glob("*.seg"))[-1]
    with open(last, "ab") as f:
        f.write(b"\x00\x00\x00\x40torn")  # an unfinished write: a frame cut short
    (tmp_path / "00000000000000000099.ckpt.new").write_bytes(b"half a checkpoint")
    before = files(tmp_path)
    report = verify(tmp_path)
    assert files(tmp_path) == before
    assert report.sound and report.segments[-1].unfinished_bytes == 8
    assert report.leftovers == ("00000000000000000099.ckpt.new",)


def test_a_torn_last_commit_is_an_unfinished_write_not_damage(tmp_path):
    make_spool(tmp_path, checkpoint_after=None)
    last = sorted(tmp_path.glob("*.seg"))[-1]
    offsets = record_offsets(last)
    cut = offsets[-2] + 7  # inside the last commit's op record: its commit record never reached the disk
    last.write_bytes(last.read_bytes()[:cut])
    report = verify(tmp_path)
    assert report.sound
    assert report.head.seq == 59 and report.totals.queued_messages == 29  # the last message's commit is cut
    assert report.segments[-1].unfinished_bytes == cut - offsets[-3]
    with Spool.open(tmp_path, segment_bytes=SEGMENT_BYTES) as spool:  # the node agrees (and cuts it off)
        assert spool.log.head == report.head


def test_damage_in_the_middle_names_the_segment_and_the_record_offset(tmp_path):
    make_spool(tmp_path)
    victim = sorted(tmp_path.glob("*.seg"))[1]
    at = record_offsets(victim)[5]
    flip(victim, at + 20)  # inside the record's payload: its CRC no longer matches
    report = verify(tmp_path)
    assert report.damage == f"segment {victim}: at byte {at}: a record whose CRC does not match"
    assert report.totals is None
    with pytest.raises(SpoolCorruption, match=str(victim)):
        Spool.open(tmp_path)
    code, out, err = cli("spool", "verify", str(tmp_path))
    assert code == 1 and "DAMAGED" in out
    assert err.strip() == f"error: {report.damage}"


def test_a_missing_segment_breaks_the_chain(tmp_path):
    make_spool(tmp_path)
    paths = sorted(tmp_path.glob("*.seg"))
    paths[1].unlink()
    report = verify(tmp_path)
    assert report.damage.startswith(f"segment {paths[2]}: it follows op {int(paths[2].stem) - 1}")


def test_a_damaged_checkpoint_is_named_with_its_offset(tmp_path):
    make_spool(tmp_path)
    (ckpt,) = tmp_path.glob("*.ckpt")
    at = record_offsets(ckpt)[0]  # its first record of ops (a record holds up to CHUNK_BYTES of them)
    flip(ckpt, at + 40)
    report = verify(tmp_path)
    assert report.damage == f"checkpoint {ckpt}: at byte {at}: a record whose CRC does not match"


def test_a_checkpoint_whose_counts_do_not_match_is_damage(tmp_path):
    """A record lost from a checkpoint's middle leaves every remaining record sound: its end's counts tell."""
    make_spool(tmp_path)
    (ckpt,) = tmp_path.glob("*.ckpt")
    offsets = record_offsets(ckpt)
    data = bytearray(ckpt.read_bytes())
    payload, _ = r.next_record(bytes(data), offsets[-1])
    ops, records = r.parse_end(payload, offsets[-1])
    data[offsets[-1]:] = r.checkpoint_end_record(ops + 1, records)  # a sound record, the wrong count
    ckpt.write_bytes(bytes(data))
    assert verify(tmp_path).damage == (f"checkpoint {ckpt}: at byte {offsets[-1]}: the end counts {ops + 1} ops in "
                                       f"{records} records, the file holds {ops} in {records}")


def test_a_checkpoint_of_another_history_is_not_on_the_log(tmp_path):
    mine, other = tmp_path / "mine", tmp_path / "other"
    make_spool(mine)
    make_spool(other, client="c2")  # the same seqs, other ops: another history
    (theirs,) = other.glob("*.ckpt")
    (ours,) = mine.glob("*.ckpt")
    assert theirs.name == ours.name
    ours.write_bytes(theirs.read_bytes())
    report = verify(mine)
    assert report.damage == f"spool {mine}: its checkpoint at op 41 is not on its log (another history)"
    with pytest.raises(SpoolCorruption, match="is not on its log"):
        Spool.open(mine)


def test_a_log_that_no_longer_reaches_the_checkpoint(tmp_path):
    make_spool(tmp_path)
    for path in sorted(tmp_path.glob("*.seg")):
        if int(path.stem) <= 42:  # every segment holding op 41, the checkpoint's, or the one just after it
            path.unlink()
    first = sorted(tmp_path.glob("*.seg"))[0]
    assert verify(tmp_path).damage.startswith(f"spool {tmp_path}: its log starts after op {int(first.stem) - 1}, "
                                              "but its checkpoint is at op 41")


def test_the_old_layout_is_named_with_what_to_do(tmp_path):
    conn = sqlite3.connect(tmp_path / "spool.db")
    legacy_sql.create(conn)
    conn.close()
    report = verify(tmp_path)
    assert report.damage.startswith(f"spool {tmp_path} holds the old SQLite layout (spool.db)")
    assert f"pairmq spool migrate {tmp_path}" in report.damage
    code, _, err = cli("spool", "verify", str(tmp_path))
    assert code == 1 and "old SQLite layout" in err


def test_a_directory_that_is_no_spool_is_a_usage_mistake(tmp_path):
    with pytest.raises(NotASpool):
        verify(tmp_path)
    code, out, err = cli("spool", "verify", str(tmp_path))
    assert (code, out) == (2, "") and "holds no spool" in err
    code, _, err = cli("spool", "verify", str(tmp_path / "absent"))
    assert code == 2 and "is not a directory" in err


def test_the_files_table(tmp_path):
    make_spool(tmp_path)
    code, out, _ = cli("spool", "verify", str(tmp_path))
    lines = [line.rstrip() for line in out.splitlines()]
    assert code == 0 and lines[0] == f"Spool {tmp_path}: sound"
    assert lines[3].split()[:5] == ["00000000000000000041.ckpt", "at", "41", "1", "-"]
    assert lines[3].endswith("checkpoint, 21 ops, records ok")
    second = int(sorted(tmp_path.glob("*.seg"))[1].stem)
    assert lines[4].split()[:3] == ["00000000000000000001.seg", f"1-{second - 1}", "1"]
    summary = [" ".join(line.split()) for line in lines[-7:]]
    assert summary[:2] == ["Log ops 1-61, head epoch 2", "Commits 31"]
    assert summary[3:6] == ["Sessions 1", "Queued messages 30", "Retained 0"]
    assert summary[2].startswith("On disk ") and summary[6].startswith("Stored 30 messages, ")


def test_an_older_checkpoint_left_beside_is_listed_not_read(tmp_path):
    """A crash between a checkpoint's rename and the removal of the one before leaves both; a node reads only the
    newest, so a damaged older one is no damage to the spool."""
    make_spool(tmp_path)
    (tmp_path / f"{7:020d}.ckpt").write_bytes(b"not a checkpoint at all, not even its header")
    report = verify(tmp_path)
    assert report.sound
    assert [(c.name, c.point, c.verified) for c in report.checkpoints][0] == (f"{7:020d}.ckpt", None, False)
    code, out, _ = cli("spool", "verify", str(tmp_path))
    assert code == 0 and "older checkpoint (removed by the next one)" in out
    with Spool.open(tmp_path, segment_bytes=SEGMENT_BYTES) as spool:
        assert spool.log.head == report.head


def test_without_a_checkpoint_the_log_must_start_at_the_beginning(tmp_path):
    make_spool(tmp_path, checkpoint_after=None)
    first, second = sorted(tmp_path.glob("*.seg"))[:2]
    first.unlink()
    assert verify(tmp_path).damage == (f"spool {tmp_path}: its log starts after op {int(second.stem) - 1}, but its "
                                       f"checkpoint is at op 0 (ops 1..{int(second.stem) - 1} are missing)")
    with pytest.raises(SpoolCorruption, match="are missing"):
        Spool.open(tmp_path)

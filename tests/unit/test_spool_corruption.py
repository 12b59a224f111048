"""A damaged spool is refused with `SpoolCorruption`: one sentence naming the file (and the byte offset of a
damaged record) and the fault, never another error; a write a crash cut short at the end of the log is not
damage and is cut off.

The spool under test is what a kill -9 leaves: several segments, a checkpoint in the middle of the log and
the ops after it (the files of an open spool whose commits all returned). Damage is done to the bytes on
disk; where a test needs a record that still parses (a changed checksum, epoch or body), it reframes the
record with a correct CRC, so that only the chain can tell. A commit record's payload is: kind [0], epoch [1:9],
last seq [9:17], ops [17:21], checksum [21:37].
"""

import logging
import random
import shutil
import zlib

import pytest

from pairmq.appliance.errors import SpoolCorruption
from pairmq.appliance.spool import ops as o
from pairmq.appliance.spool import records as r
from pairmq.appliance.spool.chain import GENESIS
from pairmq.appliance.spool.errors import ChainError
from pairmq.appliance.spool.store import Spool, SpoolOldLayout, old_layout_sentence
from pairmq.appliance.spool.writer import SpoolWriter

from tests.harness.legacy_spool import write_old_spool

MARKER = b"MARKER-only-in-the-op-log-"
SEGMENT_BYTES = 400  # a few commits each: the 38 ops span several segments
CHECKPOINT_AT = 17  # after the session and 8 messages
HEAD = 38


def submissions():
    yield [o.SessionOpened("a", 5, 0, 1)], 1
    for i in range(1, 19):
        yield [o.MessageStored(i, "t", b"payload %d" % i, 1, False, b"", 0, "p", 1),
               o.MessageQueued("a", i, 1, False)], 1
    yield [o.MessageDropped("a", 1, (MARKER * 4).decode())], 2


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """The files of an open spool (as a kill -9 leaves them) with HEAD ops, a commit each, a checkpoint at op
    CHECKPOINT_AT; the last commit (epoch 2) carries MARKER. Open only copies of it: `close` writes a checkpoint."""
    live = tmp_path_factory.mktemp("live")
    copy = tmp_path_factory.mktemp("pristine") / "spool"
    with Spool.open(live, segment_bytes=SEGMENT_BYTES) as spool:
        spool.checkpoint_bytes = 1 << 30  # only the checkpoint forced here
        with SpoolWriter(spool) as writer:
            for ops, epoch in submissions():
                writer.submit(ops, epoch).future.result(timeout=30)
                if writer.durable.seq == CHECKPOINT_AT:
                    spool.write_checkpoint()
        shutil.copytree(live, copy, ignore=shutil.ignore_patterns("spool.lock"))
    assert len(segments(copy)) >= 4 and checkpoints(copy) == [copy / r.checkpoint_name(CHECKPOINT_AT)]
    return copy


@pytest.fixture(scope="module")
def pristine_state(pristine, tmp_path_factory):
    directory = tmp_path_factory.mktemp("state") / "spool"
    shutil.copytree(pristine, directory)
    with Spool.open(directory) as spool:
        assert spool.head.seq == HEAD and spool.checkpoint.seq == CHECKPOINT_AT
        return spool.load_state()


@pytest.fixture
def damaged(pristine, tmp_path):
    shutil.copytree(pristine, tmp_path / "spool")
    return tmp_path / "spool"


def segments(directory):
    return sorted(directory.glob("*" + r.SEGMENT_SUFFIX))


def checkpoints(directory):
    return sorted(directory.glob("*" + r.CHECKPOINT_SUFFIX))


def records(path):
    """(offset, payload) of every record of a segment or checkpoint file, after its header."""
    data = path.read_bytes()
    out, pos = [], r.HEADER_BYTES
    while pos < len(data):
        payload, end = r.next_record(data, pos)
        out.append((pos, payload))
        pos = end
    return out


def op_record(directory, seq):
    """(segment path, offset, payload) of op `seq` (an op's seq is its place: counted from the segment's header)."""
    for path in segments(directory):
        at_seq = r.parse_header(path.read_bytes(), r.SEGMENT_MAGIC).seq
        for at, payload in records(path):
            if payload[0] == r.OP:
                at_seq += 1
                if at_seq == seq:
                    return path, at, payload
    raise AssertionError(f"op {seq} is in no segment")


def commits_in(path):
    """(start, at, fields) of each commit of a segment: where its first record starts, where its commit record is."""
    data, out, start = path.read_bytes(), [], r.HEADER_BYTES
    for at, payload in records(path):
        if payload[0] == r.COMMIT:
            out.append((start, at, r.parse_commit(data, at)))
            start = at + r.COMMIT_BYTES
    return out


def commit_record(directory, last_seq):
    """(segment path, offset, payload) of the commit record of the commit ending at op `last_seq`."""
    for path in segments(directory):
        for _, at, fields in commits_in(path):
            if fields.last_seq == last_seq:
                return path, at, dict(records(path))[at]
    raise AssertionError(f"no commit ends at op {last_seq}")


def reframe(path, at, payload):
    """Replace the record at `at` by `payload` (same length) with a correct CRC: it still parses."""
    data = bytearray(path.read_bytes())
    new = r.frame(payload)
    assert len(new) == r.FRAME_BYTES + int.from_bytes(data[at:at + 4], "big"), "the same length"
    data[at:at + len(new)] = new
    path.write_bytes(bytes(data))


def refused(directory, path, *fragments):
    """Opening fails with one sentence that names `path` (the file at fault) and holds every fragment."""
    with pytest.raises(SpoolCorruption) as info:
        with Spool.open(directory) as spool:
            spool.load_state()
    message = str(info.value)
    assert str(path) in message and "\n" not in message, message
    assert message.endswith("refusing to serve from a corrupt spool"), message
    for fragment in fragments:
        assert fragment in message, message
    return message


def opens(directory):
    with Spool.open(directory) as spool:
        return spool.load_state()


def test_the_pristine_copy_opens_from_its_checkpoint_and_the_log_after_it(damaged, pristine_state):
    state = opens(damaged)
    assert state == pristine_state and state.head.seq == HEAD and state.position[0] == 2
    assert len(state.sessions["a"].queue) == 17


# Damage inside a segment.

def test_a_flipped_byte_in_an_op_record_is_caught_by_its_crc_naming_the_segment_and_offset(damaged):
    path, at, payload = op_record(damaged, 12)
    data = bytearray(path.read_bytes())
    data[at + len(r.frame(payload)) - 3] ^= 0x01
    path.write_bytes(bytes(data))
    refused(damaged, path, f"at byte {at}: a record whose CRC does not match")


def test_a_changed_checksum_in_the_middle_of_a_segment_breaks_the_chain(damaged):
    path, at, payload = commit_record(damaged, 31)
    reframe(path, at, payload[:21] + bytes(16))
    refused(damaged, path, f"the commit at byte {at}: ops 30..31: their checksum does not chain")


def test_a_changed_body_with_a_recomputed_crc_breaks_the_chain(damaged):
    path, at, payload = op_record(damaged, HEAD)
    assert MARKER in payload
    i = payload.index(MARKER)
    reframe(path, at, payload[:i + 3] + b"k" + payload[i + 4:])  # 'K' -> 'k': a well-formed op, other contents
    _, commit_at, _ = commit_record(damaged, HEAD)
    refused(damaged, path, f"the commit at byte {commit_at}: ops {HEAD}..{HEAD}: their checksum does not chain")


def test_a_commit_before_the_checkpoint_is_checked_by_its_crcs_and_seqs_at_open_and_by_its_chain_when_shipped(
        damaged):
    """Commits the checkpoint covers are kept only for an incremental resync (segments.py's rules): opening checks
    their records' frames and CRCs and their seqs; the chain is checked where they are used, by the standby
    receiving them."""
    path, at, payload = commit_record(damaged, 5)
    assert 5 <= CHECKPOINT_AT
    reframe(path, at, payload[:21] + bytes(16))
    with Spool.open(damaged) as spool:
        commits = spool.read_commits(0, 1000)
    with pytest.raises(ChainError, match="ops 4..5: their checksum does not chain"):
        r.verify_chain(commits, GENESIS)
    data = bytearray(path.read_bytes())
    data[at + r.FRAME_BYTES + 12] ^= 0x01  # its last seq, the CRC not redone
    path.write_bytes(bytes(data))
    refused(damaged, path, f"at byte {at}: a record whose CRC does not match")
    reframe(path, at, payload[:9] + (6).to_bytes(8, "big") + payload[17:])  # its last seq, the CRC redone
    refused(damaged, path, f"the commit at byte {at}: ops 5..6 follow op 3 (op 4 is missing)")


def test_a_changed_epoch_breaks_the_chain(damaged):
    path, at, payload = commit_record(damaged, 21)
    reframe(path, at, payload[:1] + (7).to_bytes(8, "big") + payload[9:])
    refused(damaged, path, f"the commit at byte {at}: ops 20..21: their checksum does not chain")


def test_a_commit_taken_back_to_an_older_epoch_is_refused(damaged):
    path, at, payload = commit_record(damaged, HEAD)  # epoch 2 after epoch 1
    reframe(path, at, payload[:1] + (0).to_bytes(8, "big") + payload[9:])
    refused(damaged, path, f"the commit at byte {at}: ops {HEAD}..{HEAD} have epoch 0, older than op {HEAD - 1}'s")


def test_a_commit_record_that_does_not_count_its_ops_is_refused(damaged):
    path, at, payload = commit_record(damaged, 9)
    reframe(path, at, payload[:9] + (10).to_bytes(8, "big") + (3).to_bytes(4, "big") + payload[21:])
    refused(damaged, path, f"the commit at byte {at}: it is for 3 ops, but 2 op records come before it")


def test_a_whole_commit_appended_twice_is_refused_not_cut(damaged):
    """A sound record that repeats a commit is not a torn write: the chain refuses it."""
    path = segments(damaged)[-1]
    data = path.read_bytes()
    start, at, _ = commits_in(path)[-1]
    path.write_bytes(data + data[start:])
    refused(damaged, path, f"the commit at byte {len(data) + at - start}: ops {HEAD}..{HEAD} repeat or go back "
                           f"after op {HEAD}")


@pytest.mark.parametrize("which", [0, 1, -2])
def test_damage_in_a_segment_that_is_not_the_last_is_refused(damaged, which):
    """Before the checkpoint or after it: every segment is scanned, and only the last may end torn."""
    path = segments(damaged)[which]
    data = path.read_bytes()
    path.write_bytes(data[:-5])
    refused(damaged, path, f"at byte {len(data) - r.COMMIT_BYTES}: a record of {r.COMMIT_BYTES - r.FRAME_BYTES} "
                           "bytes cut off")


def test_a_segment_whose_header_is_damaged_is_refused(damaged):
    path = segments(damaged)[2]
    data = bytearray(path.read_bytes())
    data[12] ^= 0x40  # inside the header's point
    path.write_bytes(bytes(data))
    refused(damaged, path, "the header's CRC does not match")


def test_a_segment_under_another_name_is_refused(damaged):
    path = segments(damaged)[2]
    wrong = path.with_name(r.segment_name(int(path.stem) + 1))
    path.rename(wrong)
    refused(damaged, wrong, "its header says its first op is")


# Missing segments.

def test_a_missing_segment_in_the_middle_is_refused(damaged):
    paths = segments(damaged)
    paths[2].unlink()
    refused(damaged, paths[3], "but the segment before ends at op")


def test_a_missing_segment_after_the_checkpoint_is_refused(damaged):
    """The segments holding the checkpoint's point and before it may go (compaction); the one after it may not."""
    paths = segments(damaged)
    holding = [p for p in paths if int(p.stem) <= CHECKPOINT_AT + 1]
    for path in holding:
        path.unlink()
    first_kept = int(paths[len(holding)].stem)
    refused(damaged, damaged, f"its log starts after op {first_kept - 1}, but its checkpoint is at op {CHECKPOINT_AT}")


def test_segments_compacted_away_before_the_checkpoint_are_not_missing(damaged, pristine_state):
    paths = segments(damaged)
    for path, after in zip(paths, paths[1:]):
        if int(after.stem) - 1 <= CHECKPOINT_AT:  # every op of `path` is in the checkpoint
            path.unlink()
    assert int(segments(damaged)[0].stem) > 1
    assert opens(damaged) == pristine_state


def test_a_missing_last_segment_after_a_clean_close_is_refused(damaged):
    """After `close` the checkpoint is at the head: a log that ends before it lost its last segment."""
    with Spool.open(damaged):
        pass  # the checkpoint at the head
    last = segments(damaged)[-1]
    last.unlink()
    refused(damaged, damaged, f"its log ends at op {int(last.stem) - 1}, before its checkpoint at op {HEAD}")


# Torn writes at the end of the log: cut off, not damage.

def test_every_cut_inside_the_last_commit_is_a_torn_write_and_loses_only_that_commit(damaged, tmp_path, caplog):
    path = segments(damaged)[-1]
    data = path.read_bytes()
    start, _, _ = commits_in(path)[-1]
    before = None
    for cut in range(start, len(data)):
        directory = tmp_path / f"cut{cut}"
        shutil.copytree(damaged, directory)
        (directory / path.name).write_bytes(data[:cut])
        caplog.clear()
        with caplog.at_level(logging.WARNING, "pairmq.appliance.spool.segments"):
            state = opens(directory)
        assert state.head.seq == HEAD - 1
        assert before is None or state == before
        before = state
        assert (directory / path.name).stat().st_size == start, "the torn bytes are cut off the file"
        if cut > start:
            assert f"{cut - start} bytes after the last commit were cut off" in caplog.text
            assert path.name in caplog.text
        shutil.rmtree(directory)


@pytest.mark.parametrize("extra_zeros", [0, 4096])
def test_a_zeroed_tail_is_a_torn_write(damaged, extra_zeros, pristine_state):
    """A crash can leave the last write's blocks allocated but zero (and the file longer than written)."""
    path = segments(damaged)[-1]
    data = path.read_bytes()
    start, _, _ = commits_in(path)[-1]
    path.write_bytes(data[:start] + bytes(len(data) - start + extra_zeros))
    state = opens(damaged)
    assert state.head.seq == HEAD - 1 and len(state.sessions["a"].queue) == 18
    assert path.stat().st_size == start


def test_a_torn_write_before_a_sound_commit_is_damage_not_a_tail(damaged):
    """Bad bytes followed by a commit that survived them: not a write cut short, so refused."""
    path = segments(damaged)[-1]
    commits = commits_in(path)
    assert len(commits) >= 2
    start, _, _ = commits[-1]
    data = bytearray(path.read_bytes())
    data[start + 2] ^= 0xFF  # the last commit's first op's length
    path.write_bytes(bytes(data))
    refused(damaged, path, f"at byte {start}: ")


# Damaged checkpoints.

def test_a_flipped_byte_in_the_checkpoint_is_refused_naming_it(damaged):
    path = checkpoints(damaged)[0]
    at, payload = records(path)[0]
    data = bytearray(path.read_bytes())
    data[at + r.FRAME_BYTES + len(payload) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    refused(damaged, path, f"at byte {at}: a record whose CRC does not match")


def test_a_checkpoint_op_of_impossible_length_is_refused_though_its_record_crc_matches(damaged):
    path = checkpoints(damaged)[0]
    at, payload = records(path)[0]
    assert payload[0] == r.SNAPSHOT_OP
    seq, n = r.SNAPSHOT_ITEM.unpack_from(payload, 1)
    reframe(path, at, payload[:1] + r.SNAPSHOT_ITEM.pack(seq, len(payload)) + payload[1 + r.SNAPSHOT_ITEM.size:])
    refused(damaged, path, f"at byte {at}: a checkpoint op of impossible length {len(payload)}")


def test_a_checkpoint_whose_end_does_not_count_its_contents_is_refused(damaged):
    """A record lost between the others: the end counts the ops and the records."""
    path = checkpoints(damaged)[0]
    (at, payload), (end_at, end) = records(path)
    data = path.read_bytes()
    path.write_bytes(data[:at] + data[end_at:])  # the snapshot's record gone, header and end kept
    ops, chunks = r.parse_end(end, end_at)
    refused(damaged, path, f"at byte {at}: the end counts {ops} ops in {chunks} records, the file holds 0 in 0")


def test_bytes_after_a_checkpoints_end_are_refused(damaged):
    path = checkpoints(damaged)[0]
    data = path.read_bytes()
    path.write_bytes(data + b"\0")
    refused(damaged, path, f"at byte {len(data)}: bytes after its end")


@pytest.mark.parametrize("keep", [lambda n: 0, lambda n: 10, lambda n: n // 2, lambda n: n - 1],
                         ids=["empty", "part-of-the-header", "half", "all-but-one-byte"])
def test_a_truncated_checkpoint_is_refused(damaged, keep):
    path = checkpoints(damaged)[0]
    data = path.read_bytes()
    path.write_bytes(data[:keep(len(data))])
    refused(damaged, path)


def test_a_damaged_newest_checkpoint_is_refused_though_an_older_one_is_sound(damaged, pristine):
    """A crash between a checkpoint's rename and the removal of the one before leaves two; the newest is the one
    that counts, and its damage is not passed over for the older one."""
    with Spool.open(damaged):
        pass  # a checkpoint at the head; the one at CHECKPOINT_AT goes
    shutil.copy(pristine / r.checkpoint_name(CHECKPOINT_AT), damaged)
    newest = damaged / r.checkpoint_name(HEAD)
    assert checkpoints(damaged) == [damaged / r.checkpoint_name(CHECKPOINT_AT), newest]
    assert opens(damaged).head.seq == HEAD
    shutil.copy(pristine / r.checkpoint_name(CHECKPOINT_AT), damaged)
    data = bytearray(newest.read_bytes())
    data[r.HEADER_BYTES + 20] ^= 0x01
    newest.write_bytes(bytes(data))
    refused(damaged, newest, f"at byte {r.HEADER_BYTES}: a record whose CRC does not match")


def test_a_checkpoint_under_another_name_is_refused(damaged):
    path = checkpoints(damaged)[0]
    wrong = path.with_name(r.checkpoint_name(CHECKPOINT_AT + 2))
    path.rename(wrong)
    refused(damaged, wrong, f"its header holds op {CHECKPOINT_AT}, its name says otherwise")


def test_a_checkpoint_of_another_history_is_refused(damaged, tmp_path):
    """A checkpoint whose point is not on this log (another spool's at the same seq)."""
    other = tmp_path / "other"
    with Spool.open(other) as spool, SpoolWriter(spool) as writer:
        for i in range(CHECKPOINT_AT):
            writer.submit([o.MessageIdSeen("z", f"m{i}", i)], 1).future.result(timeout=30)
    (damaged / r.checkpoint_name(CHECKPOINT_AT)).unlink()
    shutil.copy(other / r.checkpoint_name(CHECKPOINT_AT), damaged)
    refused(damaged, damaged, f"its checkpoint at op {CHECKPOINT_AT} is not on its log")


# Garbage, leftovers, the old layout.

@pytest.mark.parametrize("garbage", [b"", b"garbage" * 1000, bytes(8192), random.Random(7).randbytes(20_000)])
@pytest.mark.parametrize("kind", [r.SEGMENT_SUFFIX, r.CHECKPOINT_SUFFIX])
def test_garbage_under_a_spool_file_name_is_refused(damaged, garbage, kind):
    path = damaged / (f"{HEAD + 1:020d}" + kind)
    path.write_bytes(garbage)
    refused(damaged, path)
    assert path.read_bytes() == garbage


def test_garbage_in_place_of_the_first_segment_is_refused(damaged):
    path = segments(damaged)[0]
    path.write_bytes(random.Random(8).randbytes(path.stat().st_size))
    refused(damaged, path, "not a PairMQ segment")


def test_files_of_other_names_are_left_alone(damaged, pristine_state):
    (damaged / "notes.txt").write_text("an operator's note")
    (damaged / "00000000000000000001.seg.bak").write_bytes(b"garbage")
    assert opens(damaged) == pristine_state
    assert (damaged / "notes.txt").read_text() == "an operator's note"


@pytest.mark.parametrize("name", [r.segment_name(HEAD + 1) + ".new", r.checkpoint_name(HEAD) + ".new"])
def test_a_leftover_new_file_is_removed_and_the_spool_opens(damaged, pristine_state, name):
    """A segment or checkpoint a crash left before its rename was never in use."""
    (damaged / name).write_bytes(r.header(r.SEGMENT_MAGIC, pristine_state.head)[:20])
    assert opens(damaged) == pristine_state
    assert not (damaged / name).exists()


def test_random_byte_flips_anywhere_give_a_clean_refusal_or_a_consistent_spool(pristine, pristine_state, tmp_path):
    """Flips in any spool file: refused naming the file, or (a flip in the last commit record, taken for a torn
    write) the state one commit back, or (a flip in no record) the same state. Never another error."""
    files = segments(pristine) + checkpoints(pristine)
    one_back = tmp_path / "one-back"
    shutil.copytree(pristine, one_back)
    last = segments(one_back)[-1]
    start, _, _ = commits_in(last)[-1]
    last.write_bytes(last.read_bytes()[:start])
    states = {"same": pristine_state, "one commit back": opens(one_back)}
    rng = random.Random(2024)
    outcomes = {"refused": 0, "same": 0, "one commit back": 0}
    for trial in range(150):
        directory = tmp_path / f"t{trial}"
        shutil.copytree(pristine, directory)
        path = directory / rng.choice(files).name
        flipped = bytearray(path.read_bytes())
        for _ in range(rng.choice([1, 1, 3])):
            flipped[rng.randrange(len(flipped))] ^= 1 << rng.randrange(8)
        path.write_bytes(bytes(flipped))
        try:
            state = opens(directory)
        except SpoolCorruption as exc:
            message = str(exc)
            assert (str(path) in message or message.startswith(f"spool {directory}: ")) and "\n" not in message
            outcomes["refused"] += 1
        else:
            outcome = next(k for k, v in states.items() if v == state)  # StopIteration: another state
            outcomes[outcome] += 1
        shutil.rmtree(directory)
    print(outcomes)
    assert outcomes["refused"] > 100 and sum(outcomes.values()) == 150


@pytest.mark.parametrize("magic, kind", [(r.SEGMENT_MAGIC, "segment"), (r.CHECKPOINT_MAGIC, "checkpoint")])
def test_a_file_of_another_format_or_magic_is_refused(damaged, magic, kind):
    """A sound header (its CRC right) of a format this build does not read, or another kind of file's magic."""
    path = (segments if kind == "segment" else checkpoints)(damaged)[-1]
    data = path.read_bytes()
    point = r.parse_header(data, magic)
    head = data[:8] + (r.FORMAT + 1).to_bytes(4, "big") + data[12:r.HEADER_BYTES - 4]  # magic, format, point
    path.write_bytes(head + zlib.crc32(head).to_bytes(4, "big") + data[r.HEADER_BYTES:])
    refused(damaged, path, f"format {r.FORMAT + 1}, but this build reads format {r.FORMAT}")
    other = r.CHECKPOINT_MAGIC if magic == r.SEGMENT_MAGIC else r.SEGMENT_MAGIC
    path.write_bytes(r.header(other, point) + data[r.HEADER_BYTES:])
    refused(damaged, path, f"not a PairMQ {kind}")


@pytest.mark.parametrize("old", ["written by the SQLite spool", "garbage", "beside segments"])
def test_the_old_layout_is_refused_with_one_sentence_and_left_untouched(tmp_path, pristine, old):
    directory = tmp_path / "spool"
    if old == "beside segments":
        shutil.copytree(pristine, directory)
    directory.mkdir(exist_ok=True)
    if old == "garbage":
        (directory / "spool.db").write_bytes(b"SQLite format 3\x00" + random.Random(3).randbytes(8192))
    else:
        write_old_spool(directory, [o.SessionOpened("a", 5, 0, 1),
                                    o.MessageStored(1, "t", b"old", 1, False, b"", 0, "p", 1),
                                    o.MessageQueued("a", 1, 1, False)])
    before = {p.name: p.read_bytes() for p in directory.iterdir()}
    with pytest.raises(SpoolOldLayout) as info:
        Spool.open(directory)
    assert str(info.value) == old_layout_sentence(directory)
    assert str(info.value) == (f"spool {directory} holds the old SQLite layout (spool.db), which this version no "
                               f"longer reads: convert it with `pairmq spool migrate {directory}` (offline), or move "
                               "it aside and let this node take a full resync from its mate")
    after = {p.name: p.read_bytes() for p in directory.iterdir() if p.name != "spool.lock"}
    assert after == before, "the refused open changed the directory"
    with pytest.raises(SpoolOldLayout):  # not SpoolLocked: the refused open let go of the lock
        Spool.open(directory)

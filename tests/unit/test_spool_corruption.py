"""A damaged spool file is refused with `SpoolCorruption` naming the file and the fault, never another error."""

import random
import shutil
import sqlite3

import pytest

from pairmq.appliance.errors import SpoolCorruption
from pairmq.appliance.spool import ops as o
from pairmq.appliance.spool.store import Spool
from pairmq.appliance.spool.writer import SpoolWriter

MARKER = b"MARKER-only-in-the-op-log-"
N_OPS = 40


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """A closed spool (WAL checkpointed into spool.db) with N_OPS ops, one of them carrying MARKER."""
    directory = tmp_path_factory.mktemp("pristine")
    with Spool.open(directory) as spool, SpoolWriter(spool) as writer:
        writer.submit([o.SessionOpened("a", 5, 0, 1)], 1).future.result()
        for i in range(1, 19):
            writer.submit([o.MessageStored(i, "t", b"payload %d" % i, 1, False, b"", 0, "p", 1),
                           o.MessageQueued("a", i, 1, False)], 1).future.result()
        writer.submit([o.MessageDropped("a", 1, (MARKER * 4).decode())], 2).future.result()
    with Spool.open(directory) as spool:
        assert spool.head.seq == N_OPS - 2 and spool.load_state()
    return directory


@pytest.fixture
def damaged(pristine, tmp_path):
    shutil.copytree(pristine, tmp_path / "spool")
    return tmp_path / "spool"


def refused(directory, *fragments):
    with pytest.raises(SpoolCorruption) as info:
        with Spool.open(directory) as spool:
            spool.load_state()
    message = str(info.value)
    assert message.startswith(f"spool {directory / 'spool.db'}: "), message
    assert message.endswith("refusing to serve from a corrupt spool"), message
    for fragment in fragments:
        assert fragment in message, message
    return message


def sql(directory, statement, *args):
    conn = sqlite3.connect(directory / "spool.db", isolation_level=None)
    conn.execute(statement, args)
    conn.close()


def test_the_pristine_copy_opens(damaged):
    with Spool.open(damaged) as spool:
        assert len(spool.load_state().sessions["a"].queue) == 17


def test_a_flipped_byte_in_an_op_body_breaks_the_chain(damaged):
    sql(damaged, "UPDATE oplog SET body = CAST(substr(body, 1, 5) || x'ff' || substr(body, 7) AS BLOB) WHERE seq = 12")
    refused(damaged, "op 12's checksum does not chain")


def test_a_changed_checksum_breaks_the_chain(damaged):
    sql(damaged, "UPDATE oplog SET checksum = zeroblob(16) WHERE seq = 30")
    refused(damaged, "op 30's checksum does not chain")


def test_a_changed_epoch_breaks_the_chain(damaged):
    sql(damaged, "UPDATE oplog SET epoch = 7 WHERE seq = 3")
    refused(damaged, "op 3's checksum does not chain")


@pytest.mark.parametrize("seq, fragment", [
    (1, "op 2 follows op 0 (op 1 is missing)"),
    (20, "op 21 follows op 19 (op 20 is missing)"),
    (N_OPS - 2, f"the op log ends at op {N_OPS - 3} but the spool's head is op {N_OPS - 2}"),
])
def test_a_missing_op_is_detected(damaged, seq, fragment):
    sql(damaged, "DELETE FROM oplog WHERE seq = ?", seq)
    refused(damaged, fragment)


def test_an_extra_op_after_the_head_is_detected(damaged):
    sql(damaged, "INSERT INTO oplog (seq, epoch, checksum, body) "
                 "SELECT seq + 1, epoch, checksum, body FROM oplog WHERE seq = ?", N_OPS - 2)
    refused(damaged, f"op {N_OPS - 1}'s checksum does not chain")


def test_a_raw_byte_flip_inside_an_op_row_in_the_file_is_detected(damaged):
    path = damaged / "spool.db"
    data = bytearray(path.read_bytes())
    at = data.find(MARKER)
    assert at > 0 and data.count(MARKER) == 4, "the marker lives in exactly one op row"
    data[at + 3] ^= 0x20  # 'K' -> 'k': still a well-formed record, now with different contents
    path.write_bytes(bytes(data))
    refused(damaged, f"op {N_OPS - 2}'s checksum does not chain")


def test_a_raw_byte_flip_in_a_stored_body_is_caught_by_its_crc(damaged):
    path = damaged / "spool.db"
    data = bytearray(path.read_bytes())
    hits = [i for i in range(len(data)) if data.startswith(b"payload 17", i)]
    assert len(hits) == 2, "one copy in the op log, one in the messages table"
    copies = []
    for at in hits:
        flipped = bytearray(data)
        flipped[at + 1] ^= 0x01
        copies.append(flipped)
    path.write_bytes(bytes(copies[0]))
    first = refused(damaged)
    path.write_bytes(bytes(copies[1]))
    second = refused(damaged)
    assert sorted(["checksum does not chain" in first, "CRC" in first]) == [False, True]
    assert {("checksum does not chain" in m) for m in (first, second)} == {True, False}
    assert any("stored message 17's body does not match its CRC" in m for m in (first, second))


@pytest.mark.parametrize("keep", [0.5, 0.9])
def test_a_truncated_file_is_refused(damaged, keep):
    path = damaged / "spool.db"
    data = path.read_bytes()
    path.write_bytes(data[:int(len(data) * keep) // 512 * 512 + 100])
    refused(damaged)


def test_an_empty_file_is_refused_rather_than_taken_for_a_new_spool(damaged):
    (damaged / "spool.db").write_bytes(b"")
    refused(damaged, "the file is empty")


@pytest.mark.parametrize("garbage", [b"garbage" * 1000, bytes(8192), random.Random(7).randbytes(20_000)])
def test_garbage_is_refused(damaged, garbage):
    (damaged / "spool.db").write_bytes(garbage)
    refused(damaged)


def test_a_damaged_header_is_refused(damaged):
    path = damaged / "spool.db"
    data = bytearray(path.read_bytes())
    data[0:16] = b"SQLite format 4\x00"
    path.write_bytes(bytes(data))
    refused(damaged, "file is not a database")


@pytest.mark.parametrize("pragma, fragment", [
    ("PRAGMA user_version = 3", "schema version 3, but this build reads version 2"),
    ("PRAGMA application_id = 42", "not a PairMQ spool (application id 0x2a)"),
    ("DROP TABLE wills", "tables missing: wills"),
    ("PRAGMA journal_mode = DELETE", "journal mode is delete"),
    ("INSERT INTO meta SELECT 2, head_epoch, head_seq, head_checksum, base_epoch, base_seq, base_checksum, "
     "stored_bytes FROM meta", "CHECK constraint failed in meta"),
])
def test_a_foreign_or_altered_schema_is_refused(damaged, pragma, fragment):
    conn = sqlite3.connect(damaged / "spool.db", isolation_level=None)
    conn.execute("PRAGMA ignore_check_constraints = ON")
    conn.execute(pragma)
    conn.close()
    refused(damaged, fragment)


def test_a_write_ahead_log_without_its_database_is_refused(damaged):
    (damaged / "spool.db").rename(damaged / "elsewhere.db")
    (damaged / "spool.db-wal").write_bytes(b"\x37\x7f\x06\x82" + bytes(28))
    refused(damaged, "the file is missing but its write-ahead log")


def test_random_byte_flips_anywhere_give_a_clean_refusal_or_a_consistent_spool(pristine, tmp_path):
    data = (pristine / "spool.db").read_bytes()
    rng = random.Random(2024)
    outcomes = {"refused": 0, "opened": 0}
    for trial in range(120):
        directory = tmp_path / f"t{trial}"
        directory.mkdir()
        flipped = bytearray(data)
        for _ in range(rng.choice([1, 1, 3])):
            flipped[rng.randrange(len(flipped))] ^= 1 << rng.randrange(8)
        (directory / "spool.db").write_bytes(bytes(flipped))
        try:
            with Spool.open(directory) as spool:
                spool.load_state()
            outcomes["opened"] += 1  # the flip hit free space, or a state row we hold no checksum for
        except SpoolCorruption as exc:
            assert str(exc).startswith(f"spool {directory / 'spool.db'}: ")
            outcomes["refused"] += 1
    print(outcomes)
    assert outcomes["refused"] > 0 and sum(outcomes.values()) == 120

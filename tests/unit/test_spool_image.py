"""A full resync by the spool's file image (appliance/spool/image.py, mate_link IMAGE/IMAGE_END).

Real spool files, a real backup, real sockets for the link test; the damage is done to bytes on disk or
on the way, as it would happen, and each refusal must say what was wrong and leave the standby's live
spool as it was.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import os
import sqlite3

import pytest

from pairmq.appliance.spool import ops as o
from pairmq.appliance.spool.chain import ChainPoint, chain
from pairmq.appliance.spool.codec import encode_op
from pairmq.appliance.spool.image import (ImageReceiver, ImageRefused, SpoolImage, check_pages, image_dir, make_image,
                                   read_chunks)
from pairmq.appliance.spool.store import FILE_NAME, Spool
from pairmq.appliance.spool.writer import SpoolWriter
from pairmq.appliance.errors import SpoolCorruption
from pairmq.appliance.roles import Role
from pairmq.mate_link.active import LinkFault
from pairmq.mate_link.messages import Catchup, Image, ImageEnd, Plan, Snapshot
from pairmq.mate_link.service import ActiveReplication, StandbyReplication
from pairmq.mate_link.standby import ImageChunk, ImageDone, StandbyLink
from tests.harness.group import LOOPBACK
from tests.unit.test_mate_link_service import GROUP, SECRET, Port, state_of, stop, until, write
from tests.unit.test_spool_store import EVERY_OP, body, load
from tests.unit.test_spool_store import write as write_spool

PIECE = 4096


def in_a_loop(test):
    @functools.wraps(test)
    def run(tmp_path, caplog):
        asyncio.run(asyncio.wait_for(test(tmp_path, caplog), 120))
    return run


def image_of(tmp_path, name="active"):
    """An image of a spool holding every kind of op, its pieces and digest."""
    write_spool(tmp_path / name, EVERY_OP, epoch=4)
    info = make_image(tmp_path / name / FILE_NAME, tmp_path / f"{name}.outgoing")
    digest = hashlib.sha256()
    data = b"".join(read_chunks(info.path, digest, info.size))
    assert len(data) == info.size
    return info, data, digest.digest()


def receive(tmp_path, data, pieces=PIECE):
    receiver = ImageReceiver(tmp_path / "standby.incoming")
    for at in range(0, len(data), pieces):
        receiver.write(at, [data[at:at + pieces]])
    return receiver


def stale_standby(tmp_path):
    write_spool(tmp_path / "standby", [[o.SessionOpened("stale", 5, 60, 1)]], epoch=2)
    return load(tmp_path / "standby")


def test_an_image_installs_the_same_state_and_the_log_continues_from_its_head(tmp_path):
    info, data, digest = image_of(tmp_path)
    original = load(tmp_path / "active")
    assert info.point == original.head
    before = stale_standby(tmp_path)
    receiver = receive(tmp_path, data)
    receiver.finish(info.point, len(data), digest)
    assert load(tmp_path / "standby") == before, "the live spool is untouched until the swap"
    receiver.swap_into(tmp_path / "standby")
    assert not (tmp_path / "standby.incoming").exists()
    assert load(tmp_path / "standby") == original
    continues_the_chain(tmp_path / "standby", original)


def continues_the_chain(spool_dir, original) -> None:
    """The installed spool takes the active's next live ops after the image's head."""
    live = chain(original.head, 4, [encode_op(body(99)), encode_op(o.MessageQueued("a", 99, 1, False))])
    with Spool.open(spool_dir) as spool, SpoolWriter(spool) as writer:
        writer.submit_entries(live).future.result(timeout=10)
    assert load(spool_dir).sessions["a"].queue[-1].msg_id == 99


def test_the_image_is_one_consistent_read_while_the_writer_commits(tmp_path):
    write_spool(tmp_path / "active", EVERY_OP, epoch=4)
    with Spool.open(tmp_path / "active") as spool, SpoolWriter(spool) as writer:
        for i in range(200):  # commits racing the backup
            writer.submit([body(1000 + i), o.MessageQueued("a", 1000 + i, 1, False)], 4)
            if i == 20:
                info = make_image(spool.path, tmp_path / "out")
        writer.submit([], 4).future.result(timeout=10)
    os.makedirs(tmp_path / "copy")
    os.replace(info.path, tmp_path / "copy" / FILE_NAME)
    with Spool.open(tmp_path / "copy") as copy:  # the store's checks: pages, schema, the log's chain to its head
        assert copy.head == info.point and copy.load_state().head == info.point


def streamed(image: SpoolImage, directory) -> Spool:
    """What a standby would install from `image`: its chunks written to `directory`, opened as a spool."""
    os.makedirs(directory)
    data = b"".join(image.chunks(hashlib.sha256()))
    assert len(data) == image.info.size
    (directory / FILE_NAME).write_bytes(data)
    return Spool.open(directory)  # the store's checks: pages, schema, the log's chain to its head


def test_an_idle_spools_image_is_its_live_file_and_stays_its_snapshot_while_the_writer_commits(tmp_path):
    write_spool(tmp_path / "active", EVERY_OP, epoch=4)
    with Spool.open(tmp_path / "active") as spool, SpoolWriter(spool) as writer:
        writer.submit([body(500), o.MessageQueued("a", 500, 1, False)], 4).future.result(timeout=10)  # in the WAL
        head = writer.durable
        image = SpoolImage(spool.path, tmp_path / "out")
        try:
            assert image.info.how == "live" and image.info.point == head and image.info.path == spool.path
            for i in range(600, 900):  # commits (and the writer's checkpoints) while the image is held
                last = writer.submit([body(i), o.MessageQueued("a", i, 1, False)], 4)
            last.future.result(timeout=10)
            assert writer.durable.seq == head.seq + 600
            other = sqlite3.connect(spool.path)  # a checkpoint now may copy nothing past the image's snapshot
            busy, in_log, copied = other.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            other.close()
            assert in_log > copied, "the commits since the image stay in the WAL while it is held"
            image.check()
            with streamed(image, tmp_path / "copy") as copy:
                assert copy.head == head and copy.load_state().sessions["a"].queue[-1].msg_id == 500
        finally:
            image.close()
    assert not (tmp_path / "out").exists(), "nothing copied"


def test_frames_an_older_reader_holds_back_make_the_image_a_backup_of_the_same_snapshot(tmp_path):
    """A reader that began before the last commit keeps the checkpoint from copying it into the file: the file is
    then not our snapshot, so the image is a copy by the backup API, with that commit in it."""
    write_spool(tmp_path / "active", EVERY_OP, epoch=4)
    with Spool.open(tmp_path / "active") as spool, SpoolWriter(spool) as writer:
        older = sqlite3.connect(spool.path)
        older.execute("BEGIN")
        older.execute("SELECT count(*) FROM oplog").fetchall()  # its snapshot: before the commit below
        writer.submit([body(500), o.MessageQueued("a", 500, 1, False)], 4).future.result(timeout=10)
        head = writer.durable
        image = SpoolImage(spool.path, tmp_path / "out")
        older.close()
        try:
            assert image.info.how == "backup" and image.info.point == head and image.info.path.parent == tmp_path / "out"
            image.check()
            with streamed(image, tmp_path / "copy") as copy:
                assert copy.head == head and copy.load_state().sessions["a"].queue[-1].msg_id == 500
        finally:
            image.close()


def test_the_active_refuses_to_send_its_live_spool_with_a_damaged_page(tmp_path):
    write_spool(tmp_path / "active", EVERY_OP, epoch=4)
    damage_a_page(tmp_path / "active" / FILE_NAME)
    image = SpoolImage(tmp_path / "active" / FILE_NAME, tmp_path / "out")
    try:
        assert image.info.how == "live"
        with pytest.raises(SpoolCorruption, match="damaged database pages.*our spool cannot be sent"):
            image.check()
    finally:
        image.close()


def test_an_image_file_shorter_than_its_size_is_an_error_not_a_short_image(tmp_path):
    path = tmp_path / "short.db"
    path.write_bytes(b"x" * 10_000)
    with pytest.raises(OSError, match="short.db ended 2000 bytes before the image's 12000"):
        list(read_chunks(path, hashlib.sha256(), 12_000))
    assert b"".join(read_chunks(path, hashlib.sha256(), 4_000)) == b"x" * 4_000


@pytest.mark.parametrize("damage, why", [
    ("truncated", "but .* arrived \\(truncated or padded\\)"),
    ("flipped in transit", "SHA-256 does not match"),
    ("not a spool at the source", "not a sound spool"),
    ("another head", "announced op"),
])
def test_a_damaged_or_truncated_image_is_refused_and_the_live_spool_stays(tmp_path, damage, why):
    info, data, digest = image_of(tmp_path)
    before = stale_standby(tmp_path)
    size, point = len(data), info.point
    if damage == "truncated":
        data = data[:-PIECE]
    elif damage == "flipped in transit":
        data = data[:5000] + bytes([data[5000] ^ 1]) + data[5001:]
    elif damage == "not a spool at the source":  # a sound digest of a file that is no spool: the store refuses it
        data = data[:100] + b"\xff" * (len(data) - 100)
        digest = hashlib.sha256(data).digest()
    else:
        point = ChainPoint(point.epoch, point.seq - 1, point.checksum)
    receiver = receive(tmp_path, data)
    with pytest.raises(ImageRefused, match=why):
        receiver.finish(point, size, digest)
    assert not (tmp_path / "standby.incoming").exists(), "a refused image is removed"
    assert load(tmp_path / "standby") == before


def damage_a_page(path, table="messages"):
    conn = sqlite3.connect(path)
    (root,), = conn.execute("SELECT rootpage FROM sqlite_schema WHERE name = ?", (table,))
    (page_bytes,), = conn.execute("PRAGMA page_size")
    conn.close()
    with open(path, "r+b") as f:
        f.seek((root - 1) * page_bytes)
        f.write(b"\xff" * page_bytes)


def test_the_active_checks_its_images_pages_and_refuses_a_damaged_one(tmp_path):
    info, data, _ = image_of(tmp_path)
    check_pages(info.path)  # sound: no error, and the file is only read
    assert info.path.read_bytes() == data and not os.path.exists(f"{info.path}-wal")
    damage_a_page(info.path)
    with pytest.raises(SpoolCorruption, match="damaged database pages"):
        check_pages(info.path)
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"\x07" * 8192)
    with pytest.raises(SpoolCorruption, match="junk.db: damaged database pages"):
        check_pages(junk)


def test_the_active_walks_its_images_log_and_refuses_a_broken_chain(tmp_path):
    # Sound pages, one op's body changed: only the chain walk finds it. The standby does not walk it (the active
    # did, on these very bytes), so this check is the only one.
    info, _, _ = image_of(tmp_path)
    conn = sqlite3.connect(info.path)
    conn.execute("UPDATE oplog SET body = CAST(body || x'00' AS BLOB) WHERE seq = (SELECT max(seq) FROM oplog)")
    conn.commit()
    conn.close()
    with pytest.raises(SpoolCorruption, match="its op log is broken .*op .*; our spool cannot be sent"):
        check_pages(info.path)


def test_a_checked_image_is_not_checked_page_by_page_again_once_and_only_if_unchanged(tmp_path):
    info, data, digest = image_of(tmp_path)
    stale_standby(tmp_path)
    receiver = receive(tmp_path, data)
    receiver.finish(info.point, len(data), digest)
    receiver.swap_into(tmp_path / "standby")
    path = tmp_path / "standby" / FILE_NAME
    # Damage a page behind the store's back, keeping size and mtime: the one vouched open does not look at pages
    # (that is the saving), and the next open, with the vouch used up, refuses the file.
    conn = sqlite3.connect(path)
    (root,), = conn.execute("SELECT rootpage FROM sqlite_schema WHERE name = 'messages'")
    (page_bytes,), = conn.execute("PRAGMA page_size")
    conn.close()
    for stale in (tmp_path / "standby" / f"{FILE_NAME}-wal", tmp_path / "standby" / f"{FILE_NAME}-shm"):
        stale.unlink(missing_ok=True)
    st = path.stat()
    with open(path, "r+b") as f:
        f.seek((root - 1) * page_bytes)
        f.write(b"\xff" * page_bytes)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    Spool.open(tmp_path / "standby").close()
    with pytest.raises(SpoolCorruption, match="malformed|damaged database pages"):
        Spool.open(tmp_path / "standby")


def test_a_vouched_file_that_changed_is_checked_whole(tmp_path):
    info, data, digest = image_of(tmp_path)
    stale_standby(tmp_path)
    receiver = receive(tmp_path, data)
    receiver.finish(info.point, len(data), digest)
    with open(receiver.path, "ab") as f:
        f.write(b"\x00" * 4096)  # a page more: the size differs, so the vouch does not apply
    receiver.swap_into(tmp_path / "standby")
    with Spool.open(tmp_path / "standby") as spool:  # fully checked (and sound: a zero page past the end)
        assert spool.head == info.point


def test_an_image_piece_out_of_order_is_refused(tmp_path):
    receiver = ImageReceiver(tmp_path / "incoming")
    receiver.write(0, [b"x" * 10])
    with pytest.raises(ImageRefused, match="at byte 20, but 10 bytes arrived"):
        receiver.write(20, [b"y"])
    receiver.abandon()
    assert not (tmp_path / "incoming").exists()


# --- the standby's link end -----------------------------------------------------------------------

HEAD = ChainPoint(4, 10, bytes(16))


def snapshot_standby() -> StandbyLink:
    link = StandbyLink(ChainPoint(0, 0, bytes(16)), 1, 0, 0)
    link.receive(Plan(4, Catchup.SNAPSHOT, 0, HEAD), 0)
    link.requests()
    return link


def test_the_standby_hands_image_pieces_over_in_order_then_the_end():
    link = snapshot_standby()
    link.receive(Image(4, 0, 7, b"abc"), 1)
    link.receive(Image(4, 3, 7, b"defg"), 2)
    link.receive(ImageEnd(4, HEAD, 7, bytes(32)), 3)
    assert link.requests() == [ImageChunk(0, b"abc", True), ImageChunk(3, b"defg", False),
                               ImageDone(HEAD, 7, bytes(32))]
    assert link.progress.image and link.progress.bytes_total == 7
    assert link.resyncing, "until it is installed and acknowledged"
    link.progressed(0, 7, 4)
    link.snapshot_installed(HEAD, 5)
    assert not link.resyncing and link.progress.finished_ms == 5


@pytest.mark.parametrize("messages, why", [
    ([Image(4, 0, 9, b"abc"), Image(4, 4, 9, b"d")], "at byte 4, but 3 bytes arrived"),
    ([Image(4, 0, 9, b"abc"), ImageEnd(4, HEAD, 9, bytes(32))], "for 9 bytes, but 3 arrived"),
    ([ImageEnd(4, HEAD, 0, bytes(32))], "before any IMAGE piece"),
    ([Snapshot(4, (b"x",)), Image(4, 0, 1, b"a")], "after SNAPSHOT batches"),
    ([Image(4, 0, 1, b"a"), Snapshot(4, (b"x",))], "inside a spool image"),
])
def test_the_standby_refuses_a_broken_image_stream(messages, why):
    link = snapshot_standby()
    with pytest.raises(LinkFault, match=why):
        for m in messages:
            link.receive(m, 1)


def test_an_image_outside_a_snapshot_plan_is_refused():
    link = StandbyLink(HEAD, 1, 0, 0)
    link.receive(Plan(4, Catchup.IN_STEP, HEAD.seq, HEAD), 0)
    with pytest.raises(LinkFault, match="IMAGE outside a snapshot catch-up"):
        link.receive(Image(4, 0, 1, b"a"), 1)


# --- on real sockets ------------------------------------------------------------------------------

async def image_group(tmp_path):
    active_port, standby_port = Port(tmp_path / "active"), Port(tmp_path / "standby")
    active = ActiveReplication(secret=SECRET, group=GROUP, me=Role.PRIMARY, spool=active_port, epoch=lambda: 4,
                               may_serve=lambda: True)
    await active.start(LOOPBACK[Role.PRIMARY], 0)
    standby = StandbyReplication(secret=SECRET, group=GROUP, me=Role.BACKUP, spool=standby_port,
                                 active_address=lambda: (LOOPBACK[Role.PRIMARY], active.bound_port), incarnation=1,
                                 highest_epoch=lambda: 3, incoming_dir=tmp_path / "standby.incoming")
    return active, standby, active_port, standby_port


@in_a_loop
async def test_a_standby_installs_an_image_of_many_pages_then_follows_live_ops(tmp_path, caplog):
    active, standby, ap, sp = await image_group(tmp_path)
    await write(ap, EVERY_OP)
    big = b"m" * 60_000
    for i in range(0, 400, 20):  # ~24 MB: many IMAGE pieces
        await write(ap, [[o.MessageStored(2000 + j, "t", big, 1, False, b"", 0, "pub", 0)
                          for j in range(i, i + 20)] + [o.MessageQueued("a", 2000 + j, 1, False)
                                                         for j in range(i, i + 20)]])
    await write(sp, [[o.SessionOpened("stale", 5, 60, 1)]], epoch=3)  # diverged: a snapshot
    await standby.start()
    await until("the image", lambda: sp.replaced == 1 and active.caught_up_now(), 60)
    await write(ap, [[body(60), o.MessageQueued("a", 60, 2, False)]])
    await until("the live op's ack", lambda: active.acked_seq == ap.writer.durable.seq)
    assert state_of(sp) == state_of(ap)
    progress = standby.progress(0)
    assert progress["kind"] == "snapshot" and progress["bytes_done"] > 24_000_000
    await until("the active's copy removed", lambda: not image_dir(ap.spool.path).exists())
    await stop(standby, active, ap, sp)


@in_a_loop
async def test_an_image_of_a_damaged_spool_is_refused_logged_and_counted(tmp_path, caplog):
    active, standby, ap, sp = await image_group(tmp_path)
    await write(ap, EVERY_OP)
    for i in range(0, 200, 20):
        await write(ap, [[o.MessageStored(2000 + j, "t", b"m" * 3000, 1, False, b"", 0, "pub", 0)
                          for j in range(i, i + 20)]])
    await write(sp, [[o.SessionOpened("stale", 5, 60, 1)]], epoch=3)
    before = state_of(sp)
    # Damage the root page of the active's messages table under it (its verified open is long past; the log and
    # meta stay readable): every image now carries the damage. Checkpointed first, so the file holds that page.
    path = ap.spool.path
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    (root,), = conn.execute("SELECT rootpage FROM sqlite_schema WHERE name = 'messages'")
    (page_bytes,), = conn.execute("PRAGMA page_size")
    conn.close()
    with open(path, "r+b") as f:
        f.seek((root - 1) * page_bytes)
        f.write(b"\xff" * page_bytes)
    caplog.set_level(logging.WARNING, "pairmq.mate_link")
    await standby.start()
    # The active checks the image's pages while it streams them (the standby relies on that and the SHA-256):
    # it refuses to end the image, and the standby never installs one.
    await until("a refused image", lambda: active.counters["bad_image"] >= 1, 60)
    await stop(standby)
    assert sp.replaced == 0 and state_of(sp) == before, "the standby's spool is as it was"
    assert not (tmp_path / "standby.incoming").exists()
    assert any("our spool image is not sound" in r.getMessage() and "damaged database pages" in r.getMessage()
               for r in caplog.records), caplog.text
    await stop(active, ap, sp)


def page_size(directory) -> int:
    conn = sqlite3.connect(directory / FILE_NAME)
    try:
        return conn.execute("PRAGMA page_size").fetchone()[0]
    finally:
        conn.close()


def test_an_image_carries_the_actives_page_size_and_an_existing_spool_keeps_its_own(tmp_path, monkeypatch):
    from pairmq.appliance.spool import sql
    monkeypatch.setattr(sql, "PAGE_SIZE", 4096)  # a standby whose spool predates the larger pages
    before = stale_standby(tmp_path)
    assert page_size(tmp_path / "standby") == 4096
    monkeypatch.setattr(sql, "PAGE_SIZE", 16384)
    assert load(tmp_path / "standby") == before and page_size(tmp_path / "standby") == 4096, "reopening keeps it"
    info, data, digest = image_of(tmp_path)  # the active's spool is new: 16 KiB pages
    assert page_size(tmp_path / "active") == 16384
    receiver = receive(tmp_path, data)
    receiver.finish(info.point, len(data), digest)
    receiver.swap_into(tmp_path / "standby")
    assert page_size(tmp_path / "standby") == 16384
    original = load(tmp_path / "active")
    assert load(tmp_path / "standby") == original
    continues_the_chain(tmp_path / "standby", original)


def test_a_new_spool_has_the_configured_page_size(tmp_path):
    from pairmq.appliance.spool import sql
    Spool.open(tmp_path / "s").close()
    assert page_size(tmp_path / "s") == sql.PAGE_SIZE

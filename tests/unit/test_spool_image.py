"""A full resync by the spool's image (appliance/spool/image.py, mate_link IMAGE/IMAGE_END).

The image is a checkpoint of the active's state written for the standby, streamed with its SHA-256
and installed whole. Real spool files, a real backup, real sockets for the link test; the damage is
done to bytes on disk or on the way, as it would happen, and each refusal must say what was wrong
and leave the standby's live spool as it was.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import os

import pytest

from pairmq.appliance.spool import checkpoint as ckpt
from pairmq.appliance.spool import ops as o
from pairmq.appliance.spool import records as r
from pairmq.appliance.spool.chain import ChainPoint
from tests.harness.oplog import logged_ops
from pairmq.appliance.spool.codec import decode_op, encode_op
from pairmq.appliance.spool.image import ImageReceiver, ImageRefused, SpoolImage, image_dir, read_chunks
from pairmq.appliance.spool.state import StateModel
from pairmq.appliance.spool.store import Spool
from pairmq.appliance.spool.writer import SpoolWriter, WriterLimits
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
    """An image of a spool holding every kind of op, its bytes and digest."""
    write_spool(tmp_path / name, EVERY_OP, epoch=4)
    with Spool.open(tmp_path / name) as spool:
        image = SpoolImage(spool, tmp_path / f"{name}.outgoing")
        image.check()
    info = image.info
    digest = hashlib.sha256()
    data = b"".join(image.chunks(digest))
    assert len(data) == info.size and digest.digest() == hashlib.sha256(info.path.read_bytes()).digest()
    return info, data, digest.digest()


def receive(tmp_path, data, pieces=PIECE):
    receiver = ImageReceiver(tmp_path / "standby.incoming")
    for at in range(0, len(data), pieces):
        receiver.write(at, [data[at:at + pieces]])
    return receiver


def stale_standby(tmp_path):
    write_spool(tmp_path / "standby", [[o.SessionOpened("stale", 5, 60, 1)]], epoch=2)
    return load(tmp_path / "standby")


def files_of(directory) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def replayed(spool: Spool, through: ChainPoint):
    """The state the spool's log holds at `through`, replayed from its first op into the model."""
    model = StateModel()
    for seq, body_ in logged_ops(spool):
        if seq <= through.seq:
            model.apply(seq, decode_op(body_))
    return model.state(through)


def test_an_image_is_a_checkpoint_of_the_actives_state_at_its_head(tmp_path):
    info, data, _ = image_of(tmp_path)
    original = load(tmp_path / "active")
    assert info.how.startswith("its newest checkpoint") and info.point == original.head and info.size == len(data)
    assert info.path.parent == tmp_path / "active.outgoing" and info.path.name == r.checkpoint_name(info.point.seq)
    assert info.path.stat().st_ino == (tmp_path / "active" / info.path.name).stat().st_ino, "linked, not written"
    assert data.startswith(r.CHECKPOINT_MAGIC) and ckpt.read_point(info.path) == info.point
    model = StateModel()
    assert ckpt.load(info.path, model)[0] == info.point and model.state(info.point) == original


def test_without_a_checkpoint_the_image_is_written_from_the_state_at_the_head(tmp_path):
    with Spool.open(tmp_path / "active") as spool, SpoolWriter(spool) as writer:
        for batch in EVERY_OP:
            writer.submit(batch, 4).future.result(10)
        assert spool.checkpoint.seq == 0
        image = SpoolImage(spool, tmp_path / "out")
        expected = spool.load_state()
    assert image.info.how == "a checkpoint written for it" and image.info.point == expected.head
    model = StateModel()
    ckpt.load(image.info.path, model)
    assert model.state(image.info.point) == expected


def test_an_image_installs_the_same_state_and_the_log_continues_from_its_head(tmp_path):
    info, data, digest = image_of(tmp_path)
    original = load(tmp_path / "active")
    before = stale_standby(tmp_path)
    live_files = files_of(tmp_path / "standby")
    receiver = receive(tmp_path, data)
    receiver.finish(info.point, len(data), digest)
    assert files_of(tmp_path / "standby") == live_files, "the live spool is untouched until the swap"
    assert load(tmp_path / "standby") == before
    receiver.swap_into(tmp_path / "standby")
    assert not (tmp_path / "standby.incoming").exists()
    assert sorted(p.name for p in (tmp_path / "standby").iterdir() if p.name != "spool.lock") == [
        r.checkpoint_name(info.point.seq)], "the image alone: the stale spool's segments and checkpoint are gone"
    assert load(tmp_path / "standby") == original
    continues_the_chain(tmp_path / "standby", original)


def continues_the_chain(spool_dir, original) -> None:
    """The installed spool takes the active's next live ops after the image's head, in a segment of its own."""
    live = r.make_commit(original.head, 4, [encode_op(body(99)), encode_op(o.MessageQueued("a", 99, 1, False))])
    with Spool.open(spool_dir) as spool, SpoolWriter(spool) as writer:
        assert spool.log_base() == original.head and spool.log_point(original.head.seq) == original.head
        writer.submit_commits([live]).future.result(timeout=10)
        assert spool.read_commits(original.head.seq, 10) == [live]
    assert (spool_dir / r.segment_name(original.head.seq + 1)).exists()
    assert load(spool_dir).sessions["a"].queue[-1].msg_id == 99


def test_the_image_is_one_consistent_state_while_the_writer_commits(tmp_path):
    write_spool(tmp_path / "active", EVERY_OP, epoch=4)
    with Spool.open(tmp_path / "active") as spool, SpoolWriter(spool) as writer:
        for i in range(200):  # commits racing the image
            writer.submit([body(1000 + i), o.MessageQueued("a", 1000 + i, 1, False)], 4)
            if i == 20:
                image = SpoolImage(spool, tmp_path / "out")
        writer.submit([], 4).future.result(timeout=10)
        head = writer.durable
        info = image.info
        assert info.point.seq <= head.seq and spool.log_point(info.point.seq) == info.point, "a point of the log"
        at_image = replayed(spool, info.point)
    image.check()
    os.makedirs(tmp_path / "copy")
    os.replace(info.path, tmp_path / "copy" / info.path.name)
    with Spool.open(tmp_path / "copy") as copy:  # the store's checks: every record, the count, the digest
        assert copy.log.head == info.point and copy.load_state() == at_image


def test_an_image_carries_what_the_log_no_longer_holds(tmp_path):
    """Checkpoints dropped the segments of the first ops (what an incremental resync can no longer send): the image
    still holds their state."""
    directory = tmp_path / "active"
    write_spool(directory, EVERY_OP, epoch=4)
    with Spool.open(directory, segment_bytes=512) as spool:
        with SpoolWriter(spool, WriterLimits(keep_ops=1)) as writer:
            for i in range(50):
                writer.submit([body(3000 + i), o.MessageQueued("a", 3000 + i, 1, False)], 4).future.result(10)
        spool.write_checkpoint()
        assert spool.log_base().seq > len([op for batch in EVERY_OP for op in batch]), "the first ops were dropped"
        with pytest.raises(LookupError):
            spool.read_commits(0, 1)
        image = SpoolImage(spool, tmp_path / "out")
        expected = spool.load_state()
    image.check()
    model = StateModel()
    ckpt.load(image.info.path, model)
    assert model.state(image.info.point) == expected


def test_the_active_refuses_to_send_an_image_its_disk_damaged(tmp_path):
    write_spool(tmp_path / "active", EVERY_OP, epoch=4)
    with Spool.open(tmp_path / "active") as spool:
        image = SpoolImage(spool, tmp_path / "out")
    path, data = image.info.path, image.info.path.read_bytes()
    damaged = bytearray(data)
    damaged[r.HEADER_BYTES + 20] ^= 0x01  # inside the first record: its CRC no longer matches
    path.write_bytes(bytes(damaged))
    with pytest.raises(SpoolCorruption, match=f"checkpoint {path}: at byte {r.HEADER_BYTES}: a record whose CRC does "
                                              "not match; refusing to serve"):
        image.check()
    end_bytes = len(r.checkpoint_end_record(0, 0))
    path.write_bytes(data[:-end_bytes] + r.checkpoint_end_record(10**6, 1))  # a sound end that counts other ops
    with pytest.raises(SpoolCorruption, match=f"checkpoint {path}: .*the end counts 1000000 ops"):
        image.check()
    path.write_bytes(data[:-1])  # the end record cut short
    with pytest.raises(SpoolCorruption, match=f"checkpoint {path}: "):
        image.check()
    path.write_bytes(data)
    image.check()


def test_an_image_file_shorter_than_its_size_is_an_error_not_a_short_image(tmp_path):
    path = tmp_path / "short.ckpt"
    path.write_bytes(b"x" * 10_000)
    with pytest.raises(OSError, match="short.ckpt ended 2000 bytes before the image's 12000"):
        list(read_chunks(path, hashlib.sha256(), 12_000))
    assert b"".join(read_chunks(path, hashlib.sha256(), 4_000)) == b"x" * 4_000


@pytest.mark.parametrize("damage, why", [
    ("truncated", "but .* arrived \\(truncated or padded\\)"),
    ("padded", "but .* arrived \\(truncated or padded\\)"),
    ("flipped in transit", "SHA-256 does not match"),
    ("not a checkpoint at the source", "not a sound checkpoint"),
    ("another head", "announced op"),
    ("another epoch", "announced op"),
])
def test_a_damaged_or_truncated_image_is_refused_and_the_live_spool_stays(tmp_path, damage, why):
    info, data, digest = image_of(tmp_path)
    before = stale_standby(tmp_path)
    live_files = files_of(tmp_path / "standby")
    size, point = len(data), info.point
    if damage == "truncated":
        data = data[:-PIECE]
    elif damage == "padded":
        data = data + bytes(PIECE)
    elif damage == "flipped in transit":
        at = len(data) // 2
        data = data[:at] + bytes([data[at] ^ 1]) + data[at + 1:]
    elif damage == "not a checkpoint at the source":  # a sound digest of a file that is no checkpoint
        data = b"\xff" * 100 + data[100:]
        digest = hashlib.sha256(data).digest()
    elif damage == "another head":
        point = ChainPoint(point.epoch, point.seq - 1, point.checksum)
    else:
        point = ChainPoint(point.epoch + 1, point.seq, point.checksum)
    receiver = receive(tmp_path, data)
    with pytest.raises(ImageRefused, match=why):
        receiver.finish(point, size, digest)
    assert not (tmp_path / "standby.incoming").exists(), "a refused image is removed"
    assert files_of(tmp_path / "standby") == live_files and load(tmp_path / "standby") == before


def test_an_image_damaged_at_the_source_passes_the_transit_checks_but_is_refused_when_opened(tmp_path):
    """The SHA-256 covers the transit only; the active checks the records before it ends the image, and the
    standby's open checks them again: a damaged checkpoint is never served from."""
    info, data, _ = image_of(tmp_path)
    stale_standby(tmp_path)
    damaged = bytearray(data)
    damaged[r.HEADER_BYTES + 20] ^= 0x01
    receiver = receive(tmp_path, bytes(damaged))
    receiver.finish(info.point, len(damaged), hashlib.sha256(damaged).digest())
    receiver.swap_into(tmp_path / "standby")
    with pytest.raises(SpoolCorruption, match=f"checkpoint .*{r.checkpoint_name(info.point.seq)}: "):
        Spool.open(tmp_path / "standby")


def test_an_image_piece_out_of_order_is_refused(tmp_path):
    receiver = ImageReceiver(tmp_path / "incoming")
    receiver.write(0, [b"x" * 10])
    with pytest.raises(ImageRefused, match="at byte 20, but 10 bytes arrived"):
        receiver.write(20, [b"y"])
    with pytest.raises(ImageRefused, match="at byte 0, but 10 bytes arrived"):
        receiver.write(0, [b"x" * 10])  # a piece again
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
async def test_a_standby_installs_an_image_of_many_pieces_then_follows_live_ops(tmp_path, caplog):
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
    await until("the active's copy removed", lambda: not image_dir(ap.spool.path).exists()
                and not image_dir(ap.spool.path, linked=True).exists())
    await stop(standby, active, ap, sp)


@in_a_loop
async def test_an_image_the_actives_disk_damaged_is_refused_logged_and_counted(tmp_path, caplog):
    """The image's file is damaged on the active's disk after it was written (a disk that changes what was written:
    one byte flipped once the file is whole). The active reads it back while it streams it and must not end it."""
    active, standby, ap, sp = await image_group(tmp_path)
    await write(ap, EVERY_OP)
    for i in range(0, 200, 20):
        await write(ap, [[o.MessageStored(2000 + j, "t", b"m" * 3000, 1, False, b"", 0, "pub", 0)
                          for j in range(i, i + 20)]])
    await write(sp, [[o.SessionOpened("stale", 5, 60, 1)]], epoch=3)
    before = state_of(sp)
    written = ckpt.write_checkpoint

    def write_then_damage(directory, state):
        path = written(directory, state)
        if directory != ap.directory:  # the image's, not the spool's own checkpoints
            with open(path, "r+b") as f:
                f.seek(r.HEADER_BYTES + 20)
                byte = f.read(1)
                f.seek(r.HEADER_BYTES + 20)
                f.write(bytes([byte[0] ^ 0x01]))
        return path

    ckpt.write_checkpoint = write_then_damage
    try:
        caplog.set_level(logging.WARNING, "pairmq.mate_link")
        await standby.start()
        await until("a refused image", lambda: active.counters["bad_image"] >= 1, 60)
        await stop(standby)
    finally:
        ckpt.write_checkpoint = written
    assert sp.replaced == 0 and state_of(sp) == before, "the standby's spool is as it was"
    assert not (tmp_path / "standby.incoming").exists()
    assert any("our spool image is not sound" in rec.getMessage() and "CRC does not match" in rec.getMessage()
               for rec in caplog.records), caplog.text
    await stop(active, ap, sp)

"""The op log as segment files (segments.py), on real files: group commits, rolling, reading back, compaction,
a failed write cut back off, and what a reopen sees."""

import errno
import os

import pytest

from pairmq.appliance.spool import records as r
from pairmq.appliance.spool.chain import GENESIS
from pairmq.appliance.spool.segments import SegmentLog

from tests.harness.tmpfs import small_disks


def commits(n, ops_per_commit=3, body_bytes=40, prev=GENESIS, epoch=1):
    """`n` chained commits of `ops_per_commit` ops each."""
    out = []
    for c in range(n):
        commit = r.make_commit(prev, epoch, [bytes([c % 251, i]) * (body_bytes // 2) for i in range(ops_per_commit)])
        out.append(commit)
        prev = commit.point
    return out


def bodies_of(commit_list):
    return [(c.first_seq + i, body) for c in commit_list for i, body in enumerate(r.op_bodies(c))]


def seg_names(directory):
    return sorted(p.name for p in directory.glob("*" + r.SEGMENT_SUFFIX))


def test_commits_read_back_as_written_across_segments_and_after_a_reopen(tmp_path):
    log = SegmentLog.open(tmp_path, segment_bytes=600)
    everything = commits(40)
    for i in range(0, 40, 2):
        log.append(everything[i:i + 2])  # two commits a group commit
    assert log.head == everything[-1].point and log.base == GENESIS
    assert log.read_commits(0, 10_000) == everything
    assert log.read_commits(48, 7) == everything[16:19], "whole commits, until they hold the ops asked for"
    with pytest.raises(LookupError, match="not the end of a commit"):
        log.read_commits(50, 7)
    assert log.point_at(0) == GENESIS and log.point_at(78) == everything[25].point
    assert log.point_at(77) is None, "a point is a commit's end"
    assert log.point_at(121) is None
    log.close()

    replayed = []
    again = SegmentLog.open(tmp_path, replay_after=30, replay=lambda seq, body: replayed.append((seq, body)),
                            segment_bytes=600)
    assert replayed == bodies_of(everything[10:])
    assert again.read_commits(0, 10_000) == everything and again.head == log.head
    assert again.bytes_after(0) == sum(s.size - r.HEADER_BYTES for s in again.segment_list())
    assert again.bytes_after(30) == sum(len(c.data) for c in everything[10:])
    again.close()


def test_a_segment_rolls_at_its_size_never_inside_a_commit_and_follows_the_one_before(tmp_path):
    log = SegmentLog.open(tmp_path, segment_bytes=600)
    for commit in commits(30):
        log.append([commit])
    segments = [(s.path, s.base, s.last, s.size) for s in log.segment_list()]
    assert len(segments) > 5
    assert seg_names(tmp_path) == [r.segment_name(base.seq + 1) for _, base, _, _ in segments]
    for (_, _, last, _), (_, base, _, _) in zip(segments, segments[1:]):
        assert base == last, "each segment's header holds the point of the one before's last commit"
    for path, base, last, size in segments:
        assert (last.seq - base.seq) % 3 == 0, "a whole number of commits"
        assert path.stat().st_size == size
        data = path.read_bytes()
        assert r.parse_header(data, r.SEGMENT_MAGIC) == base
        assert size < 600 + r.COMMIT_BYTES + 3 * (r.OP_OVERHEAD + 40), "rolled at the first commit past the size"
        assert size >= 600 or path == segments[-1][0]
    log.close()


def test_a_commit_is_its_op_records_then_a_commit_record_and_the_segment_holds_its_bytes_as_made(tmp_path):
    log = SegmentLog.open(tmp_path)
    first, second = commits(2, ops_per_commit=5)
    log.append([first, second])
    log.close()
    data = (tmp_path / r.segment_name(1)).read_bytes()
    assert data[r.HEADER_BYTES:] == first.data + second.data, "the bytes made at submit are the bytes on disk"
    pos, kinds = r.HEADER_BYTES, []
    while pos < len(data):
        payload, end = r.next_record(data, pos)
        kinds.append(chr(payload[0]))
        if payload[0] == r.COMMIT:
            fields = r.parse_commit(data, pos)
            assert (fields.epoch, fields.ops) == (1, 5) and fields.last_seq in (5, 10)
        pos = end
    assert kinds == (["O"] * 5 + ["C"]) * 2
    assert len(first.data) == 5 * (r.OP_OVERHEAD + 40) + r.COMMIT_BYTES


def test_drop_through_deletes_only_whole_segments_and_never_the_last(tmp_path):
    log = SegmentLog.open(tmp_path, segment_bytes=600)
    batches = commits(30)
    for commit in batches:
        log.append([commit])
    segments = log.segment_list()
    second_last = segments[1].last.seq
    assert log.drop_through(second_last + 1) == 2, "the third segment still holds ops after seq"
    assert log.base == segments[2].base and seg_names(tmp_path)[0] == r.segment_name(second_last + 1)
    with pytest.raises(LookupError, match="no longer in the log"):
        log.read_commits(second_last - 3, 10)
    kept = log.read_commits(log.base.seq, 10_000)
    assert r.verify_chain(kept, log.base) == log.head
    log.drop_through(10**9)
    assert len(log.segment_list()) == 1 and log.head == batches[-1].point
    log.close()
    assert SegmentLog.open(tmp_path).base == log.base, "a reopen starts where compaction left the log"


def test_a_write_the_disk_cannot_hold_is_cut_back_off_and_nothing_of_it_counts(tmp_path):
    with small_disks([tmp_path / "tiny"], "256k") as (mount,):
        log = SegmentLog.open(mount)
        prev, written = GENESIS, []
        with pytest.raises(OSError) as info:
            while True:
                commit = r.make_commit(prev, 1, [os.urandom(8000) for _ in range(4)])
                log.append([commit])
                written.append(commit)
                prev = commit.point
        assert info.value.errno == errno.ENOSPC
        (segment,) = log.segment_list()
        assert segment.last == prev and segment.path.stat().st_size == segment.size, "the failed commit was cut off"
        small = r.make_commit(prev, 1, [b"fits"])
        log.append([small])  # the space the cut freed takes a small commit
        log.close()
        replayed = []
        SegmentLog.open(mount, replay=lambda seq, body: replayed.append((seq, body))).close()
        assert replayed == bodies_of(written + [small])

"""The spooled event log (appliance/eventlog.py) and per-message events (appliance/broker/message_events.py),
on real files: rotation by size and by age, retention, a leftover active segment closed at start, a bounded
queue whose overflow is counted and recorded, a full disk (/dev/full) that stops logging and nothing else,
sampling by message id with the skipped events counted, and the [events] table of the group file."""

from __future__ import annotations

import concurrent.futures
import os
from pathlib import Path

import pytest

from pairmq.appliance.broker.message_events import MessageEvents
from pairmq.appliance.config import load_group, parse_group, render_group
from pairmq.appliance.errors import ConfigError
from pairmq.appliance.spool.chain import GENESIS
from pairmq.appliance.spool.records import make_commit
from pairmq.appliance.eventlog import ACTIVE_NAME, EventLog, EventSettings, read_events, segments
from pairmq.appliance.spool import ops
from tests.harness.group import Group
from tests.harness.held_eventlog import held_event_log, wait_until


def test_size_rotation_keeps_every_event_in_order(tmp_path):
    log = EventLog(tmp_path, "primary", EventSettings(segment_max_bytes=4096))
    for i in range(300):
        log.write("tick", i=i)
    log.close()
    closed = [p for p in segments(tmp_path) if p.name != ACTIVE_NAME]
    assert len(closed) >= 3 and all(p.name.startswith("events-primary-") for p in closed)
    assert all(p.stat().st_size < 4096 + 4096 for p in closed)
    events = read_events(tmp_path)
    assert [e["i"] for e in events] == list(range(300))
    assert {e["v"] for e in events} == {2} and {e["node"] for e in events} == {"primary"}
    assert log.view()["written"] == 300 and log.lost == 0


def test_age_rotation_closes_an_idle_segment(tmp_path):
    now = [1000.0]
    log = EventLog(tmp_path, "backup", EventSettings(segment_max_age_s=60), clock=lambda: now[0])
    log.write("hello")
    wait_until(lambda: log.written == 1, "the first write")
    assert [p.name for p in segments(tmp_path)] == [ACTIVE_NAME]
    now[0] += 61  # nothing written since: the segment still closes
    wait_until(lambda: log.rotations == 1, "the age rotation")
    log.close()
    assert [p.name for p in segments(tmp_path)] == ["events-backup-00000001.jsonl", ACTIVE_NAME]
    assert (tmp_path / ACTIVE_NAME).stat().st_size == 0


def test_a_leftover_active_segment_is_closed_at_start_and_sequence_numbers_continue(tmp_path):
    first = EventLog(tmp_path, "primary", EventSettings(segment_max_bytes=4096))
    for i in range(100):
        first.write("tick", i=i)
    first.close()
    before = [p.name for p in segments(tmp_path)]
    second = EventLog(tmp_path, "primary")
    second.write("again")
    second.close()
    names = [p.name for p in segments(tmp_path)]
    assert names[:-1] == [n for n in before if n != ACTIVE_NAME] + [f"events-primary-{len(before):08d}.jsonl"]
    assert [e.get("i", "again") for e in read_events(tmp_path)] == [*range(100), "again"]


def test_retention_deletes_the_oldest_closed_segments(tmp_path):
    log = EventLog(tmp_path, "primary", EventSettings(segment_max_bytes=4096, retain_max_bytes=65536))
    for i in range(3000):
        log.write("tick", i=i, pad="x" * 40)
    log.close()
    closed = [p for p in segments(tmp_path) if p.name != ACTIVE_NAME]
    assert sum(p.stat().st_size for p in closed) <= 65536
    events = read_events(tmp_path)
    assert events[-1]["i"] == 2999 and events[0]["i"] > 0  # the oldest went, the newest stayed
    assert [e["i"] for e in events] == list(range(events[0]["i"], 3000))


def test_a_full_queue_loses_events_but_counts_and_records_them(tmp_path):
    log, gate = held_event_log(tmp_path)
    for i in range(150):
        log.write("burst", i=i)
    assert log.lost == 50
    gate.set()
    log.close()
    events = read_events(tmp_path)
    assert [e["i"] for e in events if e["event"] == "burst"] == list(range(100))
    lost = [e for e in events if e["event"] == "events_lost"]
    assert [(e["count"], e["reason"]) for e in lost] == [(50, "event queue full")]


def test_a_full_disk_stops_event_logging_not_the_caller(tmp_path, caplog):
    if not os.path.exists("/dev/full"):
        pytest.fail("this test needs /dev/full (a device whose writes fail with ENOSPC)")
    (tmp_path / ACTIVE_NAME).symlink_to("/dev/full")
    log = EventLog(tmp_path, "primary")
    for i in range(10):
        log.write("tick", i=i)
    wait_until(lambda: log.failed is not None, "the failed write")
    for i in range(5):
        log.write("after")  # never raises, never queues
    log.close()
    assert "No space left on device" in log.failed and log.written == 0 and log.lost == 15
    assert log.view()["failed"] == log.failed
    assert any("event logging stopped" in r.getMessage() for r in caplog.records)


def stored(msg_id: int) -> ops.MessageStored:
    return ops.MessageStored(msg_id, "t/1", b"x" * 10, 1, False, b"", 0, "pub", 5)


def test_message_events_follow_a_message_through_its_stages(tmp_path):
    log = EventLog(tmp_path, "primary")
    acked = [0]
    events = MessageEvents(log, 1.0, acked_seq=lambda: acked[0])
    commit = concurrent.futures.Future()
    events.submitted([stored(1), stored(2), ops.MessageQueued("s", 1, 1, False)], 3, commit)
    commit.set_result((make_commit(GENESIS, 3, [b"op"] * 7),))  # ops 1..7 durable locally: spooled
    events.submitted([ops.MessagesInflight("s", (1, 2), (10, 11))], 3, concurrent.futures.Future())
    acked[0] = 7
    events.check_replicated()
    events.submitted([ops.MessagesAcked("s", (1,)), ops.MessageDropped("s", 2, "expired"),
                      ops.MessageDropped("s", 9, "queue full")], 3, concurrent.futures.Future())
    log.close()
    got = [(e["event"], e.get("msg_id"), e.get("msg_ids")) for e in read_events(tmp_path)]
    assert got == [("message_published", 1, None), ("message_published", 2, None), ("message_spooled", None, [1, 2]),
                   ("message_delivered", None, [1, 2]), ("message_replicated", None, [1, 2]),
                   ("message_acknowledged", None, [1]), ("message_expired", 2, None), ("message_dropped", 9, None)]
    first = read_events(tmp_path)[0]
    assert (first["topic"], first["bytes"], first["client"], first["epoch"], first["created_ms"]) == ("t/1", 10, "pub",
                                                                                                     3, 5)


def test_a_commit_made_while_the_standby_was_out_of_sync_is_replicated_after_resync(tmp_path):
    """Acks did not wait for the standby when commit 2 was made (it was out of sync): the standby got it when it
    caught up, and its `message_replicated` says so; commit 1, made while it was in sync, does not."""
    log = EventLog(tmp_path, "primary")
    acked, mate_needed = [0], [True]
    events = MessageEvents(log, 1.0, acked_seq=lambda: acked[0], mate_needed=lambda: mate_needed[0])
    for msg_id, seq in ((1, 3), (2, 6)):
        commit = concurrent.futures.Future()
        events.submitted([stored(msg_id)], 3, commit)
        commit.set_result((make_commit(GENESIS, 3, [b"op"] * seq),))  # durable through op `seq`
        mate_needed[0] = False  # the standby dropped out of sync after the first commit
    acked[0] = 6
    events.check_replicated()
    log.close()
    got = [(e["msg_ids"], e.get("after_resync")) for e in read_events(tmp_path) if e["event"] == "message_replicated"]
    assert got == [([1], None), ([2], True)]


def test_sampling_keeps_whole_messages_and_counts_what_it_skips(tmp_path):
    log = EventLog(tmp_path, "primary")
    events = MessageEvents(log, 0.25)
    ids = list(range(1, 4001))
    events.submitted([stored(i) for i in ids], 1, concurrent.futures.Future())
    events.submitted([ops.MessagesInflight("s", tuple(ids), tuple(ids))], 1, concurrent.futures.Future())
    skipped = dict(events.unsampled)
    events.flush_counts()
    log.close()
    got = read_events(tmp_path)
    published = [e["msg_id"] for e in got if e["event"] == "message_published"]
    [delivered] = [e["msg_ids"] for e in got if e["event"] == "message_delivered"]
    assert 800 < len(published) < 1200 and delivered == published  # the same messages at every stage
    assert skipped == {"message_published": 4000 - len(published), "message_delivered": 4000 - len(published)}
    [counts] = [e["counts"] for e in got if e["event"] == "message_events_unsampled"]
    assert counts == skipped


@pytest.mark.parametrize("table, message", [
    ("message_sample_ratio = 1.5", "events.message_sample_ratio must be a number from 0 to 1, not 1.5"),
    ("segment_max_bytes = 10", "events.segment_max_bytes must be a whole number from 4,096"),
    ("message_events = 1", "events.message_events must be true or false, not 1"),
    ("retain_max_bytes = 70000\nsegment_max_bytes = 80000", "events.retain_max_bytes must be at least"),
    ("colour = 'red'", "colour"),
])
def test_bad_events_tables_are_refused(tmp_path, table, message):
    with Group(tmp_path / "g", hosts=object()) as g:
        text = (g.dir / "group.toml").read_text() + f"\n[events]\n{table}\n"
    (g.dir / "group.toml").write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_group(g.dir / "group.toml")


def test_events_settings_round_trip(tmp_path):
    with Group(tmp_path / "g", hosts=object(), events=EventSettings(message_sample_ratio=0.5,
                                                                   message_events=False)) as g:
        assert g.config.events == EventSettings(message_sample_ratio=0.5, message_events=False)
        assert parse_group(__import__("tomllib").loads(render_group(g.config)), g.dir).events == g.config.events
    assert Path(g.dir / "group.toml").exists()


def test_a_published_event_rendered_on_the_writer_thread_reads_as_the_dict_would(tmp_path):
    """message_published is made on the writer thread (EventLog.write_lines): the same JSON as `write`'s, escapes
    included; an entry whose render raises leaves one `render_error` line, the rest of it counted as lost, and the
    writer still running."""
    def fields(op, epoch):  # message_published's own fields, as docs/events.md names them
        return {"msg_id": op.msg_id, "topic": op.topic, "qos": op.qos, "bytes": len(op.payload),
                "client": op.publisher, "epoch": epoch, "retain": op.retain, "created_ms": op.created_at_ms}

    odd = ops.MessageStored(7, 'plant/"hall"\\5/ünï\n', b"x" * 3, 2, True, b"", 0, 'pub "1"\u2028', 1234)
    log = EventLog(tmp_path, "primary")
    MessageEvents(log, 1.0).submitted([odd, stored(8)], 5, concurrent.futures.Future())
    log.write_lines("message_published", 3, lambda stamp, event: 1 // 0)
    log.write("after", n=1)
    log.close()
    got = read_events(tmp_path)
    own = [{k: v for k, v in e.items() if k not in ("v", "ts", "mono_ms", "node", "event")} for e in got]
    assert own[:2] == [fields(odd, 5), fields(stored(8), 5)]
    assert own[2] == {"render_error": "ZeroDivisionError('integer division or modulo by zero')"}
    assert [e["event"] for e in got] == ["message_published"] * 3 + ["after"]
    assert log.written == 4 and log.lost == 2


def test_a_submissions_published_events_are_written_in_the_order_of_its_ops(tmp_path):
    """The published events of a submission are queued together, but never ahead of an earlier op's event."""
    log = EventLog(tmp_path, "primary")
    inflight = ops.MessagesInflight("sub", (1,), (11,))
    MessageEvents(log, 1.0).submitted([stored(1), stored(2), inflight, stored(3)], 4, concurrent.futures.Future())
    log.close()
    got = [(e["event"], e.get("msg_id", e.get("msg_ids"))) for e in read_events(tmp_path)]
    assert got == [("message_published", 1), ("message_published", 2), ("message_delivered", [1]),
                   ("message_published", 3)]


def test_a_batch_of_rendered_events_after_close_is_counted_as_lost(tmp_path):
    log = EventLog(tmp_path, "primary")
    log.close()
    log.write_lines("message_published", 150, lambda stamp, event: "")
    assert log.lost == 150 and read_events(tmp_path) == []

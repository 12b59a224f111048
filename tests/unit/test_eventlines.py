"""Event log lines byte for byte (appliance/eventlines.py, eventlog.py, broker/message_events.py):
analytics reads these bytes, so every line a node writes is pinned here, odd strings included; the renderers read
as json.dumps would for any input; and the log's rules for entries of many events: a segment ends within one line
of its limit inside an entry, an entry that finds the queue too full is lost whole and counted."""

from __future__ import annotations

import concurrent.futures
import json
from pathlib import Path

from hypothesis import given, settings, strategies as st

from pairmq.appliance import eventlines
from pairmq.appliance.broker import message_events
from pairmq.appliance.broker.message_events import MessageEvents
from pairmq.appliance.eventlog import ACTIVE_NAME, EventLog, EventSettings, read_events, segments
from pairmq.appliance.spool import ops
from pairmq.appliance.spool.chain import GENESIS
from pairmq.appliance.spool.records import make_commit
from tests.harness.held_eventlog import held_event_log


def scenario(directory: Path) -> bytes:
    """Every kind of line a routing node writes on the message path, and some of the group's, at fixed times."""
    now, mono = [1795958807.1365492], [71926872_654321]
    log = EventLog(directory, "primary", EventSettings(refusal_events_per_s=1), clock=lambda: now[0],
                   mono=lambda: mono[0])
    acked, mate_needed = [0], [True]
    events = MessageEvents(log, 1.0, acked_seq=lambda: acked[0], mate_needed=lambda: mate_needed[0])
    odd = ops.MessageStored(7, 'plant/"hall"\\5/ünï\n', b"x" * 3, 2, True, b"", 0, 'pub "1"\u2028\U0001F600', 1234)
    routed = [ops.MessageRouted(10 + i, "bench/q1", b"y" * 100, 1, False, b"", 0, "bench-q1-pub",
                                1795958807133 + i // 2, "bench-q1-sub", 1, False, ()) for i in range(4)]
    first = concurrent.futures.Future()
    events.submitted([odd, *routed[:2], ops.MessageQueued("s", 7, 1, False),
                      ops.MessagesInflight("bench-q1-sub", (10, 11), (1, 2)), routed[2],
                      ops.MessageInflight("s", 7, 3)], 3, first)
    now[0], mono[0] = 1795958807.2, 71926872_999999
    events.submitted([routed[3], ops.MessagesAcked("bench-q1-sub", (10, 11)), ops.MessageAcked("s", 7),
                      ops.MessageDropped("s", 12, "expired"), ops.MessageDropped("s", 13, "not authorized")], 3,
                     concurrent.futures.Future())
    first.set_result((make_commit(GENESIS, 3, [b"op"] * 9),))
    mate_needed[0] = False
    second = concurrent.futures.Future()
    events.submitted([ops.MessageStored(2**40, "", b"", 0, False, b"", 0, "", 0)], 4, second)
    second.set_result((make_commit(GENESIS, 4, [b"op"] * 12),))
    acked[0] = 12
    events.check_replicated()
    now[0] = 1795958808.0000004
    log.write("client_refused", client_id="c", peer="192.0.2.7:5", reason_code=135, reason='bad "password"', epoch=3)
    log.write("client_refused", client_id="c", peer="192.0.2.7:6", reason_code=135, reason="x", epoch=3)
    log.write("node_alive", serving=True, epoch=3)
    log.write("node_stopped")
    log.write("publish_outcomes", epoch=3, outcomes=[{"topic": "a/b", "qos": 1, "outcome": "queued", "messages": 2}],
              extra=Path("/x"), ratio=0.1, none=None)
    sampled = MessageEvents(log, 0.25)
    sampled.submitted([ops.MessageStored(i, "s/t", b"z", 1, False, b"", 0, "p", 99) for i in range(1, 9)], 5,
                      concurrent.futures.Future())
    sampled.flush_counts()
    mono[0] += 5_000_000_000  # past the throttle's window: its summary is written at close
    log.close()
    return b"".join(p.read_bytes() for p in segments(directory))


# What the log wrote before message_published was rendered in batches by compiled code: these bytes may not change.
EXPECTED = (
    '{"v":2,"ts":1795958807.136549,"mono_ms":71926872,"node":"primary","event":"message_published","msg_id":7,'
    '"topic":"plant/\\"hall\\"\\\\5/\\u00fcn\\u00ef\\n","qos":2,"bytes":3,'
    '"client":"pub \\"1\\"\\u2028\\ud83d\\ude00","epoch":3,"retain":true,"created_ms":1234}\n'
    '{"v":2,"ts":1795958807.136549,"mono_ms":71926872,"node":"primary","event":"message_published","msg_id":10,'
    '"topic":"bench/q1","qos":1,"bytes":100,"client":"bench-q1-pub","epoch":3,"retain":false,'
    '"created_ms":1795958807133}\n'
    '{"v":2,"ts":1795958807.136549,"mono_ms":71926872,"node":"primary","event":"message_published","msg_id":11,'
    '"topic":"bench/q1","qos":1,"bytes":100,"client":"bench-q1-pub","epoch":3,"retain":false,'
    '"created_ms":1795958807133}\n'
    '{"v":2,"ts":1795958807.136549,"mono_ms":71926872,"node":"primary","event":"message_delivered",'
    '"client":"bench-q1-sub","msg_ids":[10,11],"epoch":3}\n'
    '{"v":2,"ts":1795958807.136549,"mono_ms":71926872,"node":"primary","event":"message_published","msg_id":12,'
    '"topic":"bench/q1","qos":1,"bytes":100,"client":"bench-q1-pub","epoch":3,"retain":false,'
    '"created_ms":1795958807134}\n'
    '{"v":2,"ts":1795958807.136549,"mono_ms":71926872,"node":"primary","event":"message_delivered",'
    '"client":"s","msg_ids":[7],"epoch":3}\n'
    '{"v":2,"ts":1795958807.200000,"mono_ms":71926872,"node":"primary","event":"message_published","msg_id":13,'
    '"topic":"bench/q1","qos":1,"bytes":100,"client":"bench-q1-pub","epoch":3,"retain":false,'
    '"created_ms":1795958807134}\n'
    '{"v":2,"ts":1795958807.200000,"mono_ms":71926872,"node":"primary","event":"message_acknowledged",'
    '"client":"bench-q1-sub","msg_ids":[10,11],"epoch":3}\n'
    '{"v":2,"ts":1795958807.200000,"mono_ms":71926872,"node":"primary","event":"message_acknowledged",'
    '"client":"s","msg_ids":[7],"epoch":3}\n'
    '{"v":2,"ts":1795958807.200000,"mono_ms":71926872,"node":"primary","event":"message_expired","client":"s",'
    '"msg_id":12,"reason":"expired","epoch":3}\n'
    '{"v":2,"ts":1795958807.200000,"mono_ms":71926872,"node":"primary","event":"message_dropped","client":"s",'
    '"msg_id":13,"reason":"not authorized","epoch":3}\n'
    '{"v":2,"ts":1795958807.200000,"mono_ms":71926872,"node":"primary","event":"message_spooled",'
    '"msg_ids":[7,10,11,12],"seq":9,"epoch":3}\n'
    '{"v":2,"ts":1795958807.200000,"mono_ms":71926872,"node":"primary","event":"message_published",'
    '"msg_id":1099511627776,"topic":"","qos":0,"bytes":0,"client":"","epoch":4,"retain":false,"created_ms":0}\n'
    '{"v":2,"ts":1795958807.200000,"mono_ms":71926872,"node":"primary","event":"message_spooled",'
    '"msg_ids":[1099511627776],"seq":12,"epoch":4}\n'
    '{"v":2,"ts":1795958807.200000,"mono_ms":71926872,"node":"primary","event":"message_replicated",'
    '"msg_ids":[7,10,11,12],"seq":9,"epoch":3}\n'
    '{"v":2,"ts":1795958807.200000,"mono_ms":71926872,"node":"primary","event":"message_replicated",'
    '"msg_ids":[1099511627776],"seq":12,"epoch":4,"after_resync":true}\n'
    '{"v":2,"ts":1795958808.000000,"mono_ms":71926872,"node":"primary","event":"client_refused",'
    '"client_id":"c","peer":"192.0.2.7:5","reason_code":135,"reason":"bad \\"password\\"","epoch":3}\n'
    '{"v":2,"ts":1795958808.000000,"mono_ms":71926872,"node":"primary","event":"node_alive","serving":true,'
    '"epoch":3}\n'
    '{"v":2,"ts":1795958808.000000,"mono_ms":71926872,"node":"primary","event":"node_stopped"}\n'
    '{"v":2,"ts":1795958808.000000,"mono_ms":71926872,"node":"primary","event":"publish_outcomes","epoch":3,'
    '"outcomes":[{"topic":"a/b","qos":1,"outcome":"queued","messages":2}],"extra":"/x","ratio":0.1,'
    '"none":null}\n'
    '{"v":2,"ts":1795958808.000000,"mono_ms":71926872,"node":"primary","event":"message_published","msg_id":2,'
    '"topic":"s/t","qos":1,"bytes":1,"client":"p","epoch":5,"retain":false,"created_ms":99}\n'
    '{"v":2,"ts":1795958808.000000,"mono_ms":71926872,"node":"primary","event":"message_published","msg_id":5,'
    '"topic":"s/t","qos":1,"bytes":1,"client":"p","epoch":5,"retain":false,"created_ms":99}\n'
    '{"v":2,"ts":1795958808.000000,"mono_ms":71926872,"node":"primary","event":"message_events_unsampled",'
    '"counts":{"message_published":6}}\n'
    '{"v":2,"ts":1795958808.000000,"mono_ms":71931872,"node":"primary","event":"events_suppressed",'
    '"kind":"client_refused","count":1,"window_s":5.0,"by_source":{"192.0.2.7":1},"other_sources":0,'
    '"reason":"suppressed 1 client_refused events in the last 5.0 s (1 from 192.0.2.7)"}\n'
)


def test_every_line_is_byte_for_byte_what_analytics_reads(tmp_path):
    assert scenario(tmp_path).decode("ascii").splitlines(keepends=True) == EXPECTED.splitlines(keepends=True)


TEXT = st.text(st.characters(codec="utf-8"), max_size=30) | st.sampled_from(["", "a/b", '"', "\\", "\u2028", "\x00"])
INT = st.integers(min_value=0, max_value=2**63 - 1)
IDS = st.lists(INT, min_size=1, max_size=300)


COMMON = ("v", "ts", "mono_ms", "node", "event")  # every line's first members: an event's own never repeat them


def dumps(event: str, fields: dict) -> str:
    """json.dumps's line of an event at the stamp below."""
    return json.dumps({"v": 2, "ts": 0.25, "mono_ms": 7, "node": 'n"1', "event": event, **fields},
                      separators=(",", ":")).replace('"ts":0.25', '"ts":0.250000', 1) + "\n"


STAMP = eventlines.stamp(json.dumps('n"1'), 0.25, 7)
STORED = st.builds(lambda msg_id, topic, payload, qos, retain, publisher, created_ms, routed: (
    ops.MessageRouted(msg_id, topic, payload, qos, retain, b"", 0, publisher, created_ms, "sub", 1, False, ())
    if routed else ops.MessageStored(msg_id, topic, payload, qos, retain, b"", 0, publisher, created_ms)),
    INT, TEXT, st.binary(max_size=40), st.integers(0, 2), st.booleans(), TEXT, INT, st.booleans())
DELIVERY = st.builds(message_events.Delivery, st.sampled_from(["message_delivered", "message_acknowledged"]), TEXT,
                     IDS.map(tuple))
DROPPED = st.builds(message_events.Dropped, st.sampled_from(["message_expired", "message_dropped"]), TEXT, INT, TEXT)


def fields_of(item, epoch: int) -> tuple[str, dict]:
    """An item's event and members as docs/events.md names them."""
    if isinstance(item, message_events.Delivery):
        return item.event, {"client": item.client, "msg_ids": list(item.msg_ids), "epoch": epoch}
    if isinstance(item, message_events.Dropped):
        return item.event, {"client": item.client, "msg_id": item.msg_id, "reason": item.reason, "epoch": epoch}
    return "message_published", {"msg_id": item.msg_id, "topic": item.topic, "qos": item.qos,
                                 "bytes": len(item.payload), "client": item.publisher, "epoch": epoch,
                                 "retain": item.retain, "created_ms": item.created_at_ms}


@settings(max_examples=300, deadline=None)
@given(st.lists(STORED | STORED | DELIVERY | DROPPED, min_size=1, max_size=8), INT)
def test_a_submissions_lines_read_as_json_dumps_makes_them(items, epoch):
    expected = "".join(dumps(*fields_of(item, epoch)) for item in items)
    assert message_events.submission_lines(STAMP, "message_events", items, epoch) == expected


@settings(max_examples=200, deadline=None)
@given(IDS, INT, INT, st.booleans())
def test_a_commits_lines_read_as_json_dumps_makes_them(ids, seq, epoch, after_resync):
    commit = message_events.CommitIds(ids)
    spooled = message_events.commit_line(STAMP, "message_spooled", commit, seq, epoch, False)
    replicated = message_events.commit_line(STAMP, "message_replicated", commit, seq, epoch, after_resync)
    assert spooled == dumps("message_spooled", {"msg_ids": ids, "seq": seq, "epoch": epoch})
    assert replicated == dumps("message_replicated", {"msg_ids": ids, "seq": seq, "epoch": epoch}
                               | ({"after_resync": True} if after_resync else {}))


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(TEXT.filter(lambda k: k not in COMMON),
                       st.none() | st.booleans() | INT | TEXT | st.lists(INT, max_size=5), max_size=5))
def test_a_dict_events_line_reads_as_json_dumps_makes_it(fields):
    assert eventlines.line(STAMP, "e", fields) == dumps("e", fields)


def test_a_batch_across_the_segment_limit_ends_each_segment_within_one_line(tmp_path):
    limit = 4096
    log = EventLog(tmp_path, "primary", EventSettings(segment_max_bytes=limit))
    batch = [ops.MessageStored(i, f"t/{i}", b"x" * (i % 7), 1, False, b"", 0, "pub", i) for i in range(200)]
    events = MessageEvents(log, 1.0)
    log.write("before")
    events.submitted(batch, 1, concurrent.futures.Future())  # one queue entry of 200 lines, ~40 KB
    log.close()
    closed = [p for p in segments(tmp_path) if p.name != ACTIVE_NAME]
    assert len(closed) >= 8
    for path in closed:
        text = path.read_text()
        last = text.splitlines(keepends=True)[-1]
        assert len(text) >= limit > len(text) - len(last), path.name
    got = read_events(tmp_path)
    assert [e["event"] for e in got] == ["before"] + ["message_published"] * 200
    assert [e["msg_id"] for e in got[1:]] == list(range(200)) and log.written == 201 and log.lost == 0


def test_a_submission_that_finds_the_queue_too_full_is_lost_whole_and_counted(tmp_path):
    log, gate = held_event_log(tmp_path)
    events = MessageEvents(log, 1)  # a whole number, as the group file may give it
    for first in (0, 60, 120):  # 45 events each: the third finds room for 10
        events.submitted([ops.MessageStored(i, "t", b"", 1, False, b"", 0, "p", 0) for i in range(first, first + 44)]
                         + [ops.MessagesInflight("s", (first,), (1,))], 1, concurrent.futures.Future())
    assert log.lost == 45 and log.view()["queued"] == 90
    for i in range(15):
        log.write("tick", i=i)
    assert log.lost == 50 and log.view()["queued"] == 100
    gate.set()
    log.close()
    got = read_events(tmp_path)
    assert [e["msg_id"] for e in got if e["event"] == "message_published"] == [*range(44), *range(60, 104)]
    assert [e["msg_ids"] for e in got if e["event"] == "message_delivered"] == [[0], [60]]
    assert [e["i"] for e in got if e["event"] == "tick"] == list(range(10))
    assert [(e["count"], e["reason"]) for e in got if e["event"] == "events_lost"] == [(50, "event queue full")]
    assert log.written == 1 + 90 + 10 + 1

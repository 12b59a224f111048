"""`GET /api/v1/events` reads the end of a node's event-log segments (appliance/api/reads.py tail_events):
newest `limit` at or after `since`, oldest first, across segments, bounded in bytes; torn lines skipped."""

import json

from pairmq.appliance.api.reads import tail_events


def write_segments(directory, *segments):
    for name, stamps in segments:
        lines = [json.dumps({"v": 2, "ts": ts, "node": "primary", "event": "e", "n": ts}) for ts in stamps]
        (directory / name).write_text("\n".join(lines) + "\n")


def test_across_segments_since_and_limit(tmp_path):
    write_segments(tmp_path, ("events-primary-00000001.jsonl", [1, 2, 3]), ("events-primary-00000002.jsonl", [4, 5]),
                   ("events.jsonl", [6, 7]))
    assert [e["ts"] for e in tail_events(tmp_path, 0, 100)[0]] == [1, 2, 3, 4, 5, 6, 7]
    assert [e["ts"] for e in tail_events(tmp_path, 0, 4)[0]] == [4, 5, 6, 7]
    assert [e["ts"] for e in tail_events(tmp_path, 3, 100)[0]] == [3, 4, 5, 6, 7]
    assert tail_events(tmp_path, 8, 100) == ([], True)
    assert tail_events(tmp_path / "none", 0, 10) == ([], True)


def test_a_torn_last_line_is_skipped_and_the_byte_budget_holds(tmp_path):
    write_segments(tmp_path, ("events-primary-00000001.jsonl", range(1, 1001)))
    with open(tmp_path / "events.jsonl", "w") as f:
        f.write(json.dumps({"v": 2, "ts": 2000, "node": "primary", "event": "e"}) + "\n" + '{"v": 2, "ts": 20')
    events, complete = tail_events(tmp_path, 0, 1000)
    assert [e["ts"] for e in events][-2:] == [1000, 2000] and complete is True and len(events) == 1000
    events, complete = tail_events(tmp_path, 0, 1000, budget=2000)
    assert complete is False and 0 < len(events) < 40 and events[-1]["ts"] == 2000
    assert [e["ts"] for e in events[:-1]] == list(range(1001 - len(events) + 1, 1001))  # contiguous, newest

"""--since/--until: the bounds parsed, the segments that cannot hold an event of the window never read, and the
reports of a window the same whether they come from the ingested table or from parsing the segments."""

from __future__ import annotations

import datetime

import pytest

from pairmq.analytics import ingest, summary
from pairmq.analytics.window import Window, WindowError, first_ts, overlapping, parse, parse_bound
from tests.harness.spark_session import spark  # noqa: F401
from tests.harness.synthetic_logs import RATE, T0, generate

NOW = 1_800_000_000.0


def test_bounds_are_iso_8601_or_a_time_ago():
    assert parse_bound("2h", NOW, "--since") == NOW - 7200
    assert parse_bound("90s", NOW, "--since") == NOW - 90
    assert parse_bound("1.5d", NOW, "--since") == NOW - 1.5 * 86400
    assert parse_bound("1w", NOW, "--since") == NOW - 7 * 86400
    utc = datetime.datetime(2026, 11, 28, 14, 0, tzinfo=datetime.timezone.utc).timestamp()
    assert parse_bound("2026-11-28T14:00", NOW, "--since") == utc  # UTC unless it says
    assert parse_bound("2026-11-28T14:00Z", NOW, "--since") == utc
    assert parse_bound("2026-11-28T15:00+01:00", NOW, "--since") == utc
    assert parse_bound("2026-11-28", NOW, "--since") == utc - 14 * 3600
    assert parse(None, None, NOW) is None
    assert parse("2h", None, NOW) == Window(NOW - 7200, None)


@pytest.mark.parametrize("since, until, message", [
    ("yesterday", None, "--since 'yesterday' is neither an ISO 8601 time"),
    (None, "2 hours", "--until '2 hours' is neither an ISO 8601 time"),
    ("1h", "2h", "--since (2027-01-15T07:00:00+00:00) must be before --until (2027-01-15T06:00:00+00:00)"),
])
def test_a_bad_window_is_one_sentence(since, until, message):
    with pytest.raises(WindowError) as got:
        parse(since, until, NOW)
    assert str(got.value).startswith(message)


def test_a_segment_outside_the_window_is_not_read():
    # One node: segments starting at 10, 20, 30 and the active one at 40 (open-ended).
    log = [("n/events", [10.0, 20.0, 30.0, 40.0])]
    assert overlapping(log, Window(25, None)) == [1, 2, 3]
    assert overlapping(log, Window(None, 20)) == [0]  # until is exclusive: the segment starting at 20 is out
    assert overlapping(log, Window(20, 30)) == [0, 1]  # the first may end with an event at exactly 20
    assert overlapping(log, Window(100, None)) == [3]  # the active segment may still be writing
    assert overlapping(log, Window(None, 5)) == []
    # A segment whose first line gives no time is read; the one before it then ends at the next known start.
    assert overlapping([("n", [10.0, None, 30.0])], Window(25, None)) == [0, 1, 2]
    assert overlapping([("n", [10.0, None, 30.0])], Window(35, None)) == [2]  # it ends before 30, though
    assert overlapping([("n", [10.0, None, 30.0])], Window(None, 20)) == [0, 1]
    assert first_ts(b'{"v":2,"ts":12.5,"node":"p"}\n{"ts":13}') == 12.5
    assert first_ts(b'{"v":2,"ts":broken\n') is None and first_ts(b'[1]\n') is None
    assert first_ts(b'{"ts":true}\n') is None


def test_a_window_reports_its_events_alike_from_the_table_and_from_the_segments(spark, tmp_path):  # noqa: F811
    logs = tmp_path / "logs"
    generated = generate(logs, 20_000, segment_bytes=128 * 1024)
    window = Window(T0 + 0.5, None)  # the primary's first 2,500 messages are before it (RATE per second)
    first_index = int(0.5 * RATE)
    roots = [logs.as_uri()]
    parsed = summary.summarize(spark, roots, None, window=window)
    out = (tmp_path / "out").as_uri()
    summary.summarize(spark, roots, out)  # ingested whole first
    from_table = summary.summarize(spark, roots, out, window=window)
    assert from_table["inputs"]["segments_ingested_now"] == 0
    expected = {"primary": generated["published"]["primary"] - first_index, "backup": generated["published"]["backup"],
                "monitor": 0}
    assert parsed["messages"]["published_per_node"] == expected
    for view in (parsed, from_table):
        del view["elapsed_s"], view["inputs"]
    assert from_table == parsed
    # Ended before the failover: only the primary published, none of the backup's events are read.
    before = summary.summarize(spark, roots, out, window=Window(None, T0 + 0.5))
    assert before["messages"]["published_per_node"].get("primary") == first_index
    assert before["messages"]["published_per_node"].get("backup", 0) == 0


def test_segments_past_the_window_are_pruned_before_any_task(spark, tmp_path):  # noqa: F811
    logs = tmp_path / "logs"
    generate(logs, 20_000, segment_bytes=128 * 1024)
    found = ingest.list_segments(spark, [logs.as_uri()])
    late = ingest.in_window(spark, found, Window(T0 + 2.0, None))
    assert 0 < len(late) < len(found)
    assert all(p in {s.path for s in found} for p in late)
    assert ingest.in_window(spark, found, Window(None, T0 - 10)) == []

"""A catch-up's ops applied in bulk (SqlApplier.apply_many, SpoolWriter.submit_entries(bulk=True)).

What must hold: the same spool as applying the same entries one op at a time (state, reference counts, stored
bytes, ops ignored), for any sequence, including the ones the fast path must not take (a queue row the table
already holds, a message stored twice, a queue entry before its message, an unknown session). Real spool files;
each case is applied both ways and the two spools compared.
"""

from __future__ import annotations

import sqlite3

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pairmq.appliance.spool import ops as o
from pairmq.appliance.spool.chain import GENESIS, chain
from pairmq.appliance.spool.codec import encode_op
from pairmq.appliance.spool.sql import SqlApplier
from pairmq.appliance.spool.store import FILE_NAME, Spool, connect
from pairmq.appliance.spool.writer import SpoolWriter
from tests.unit.test_spool_store import EVERY_OP, body, load

CLIENTS = ("a", "b", "gone")  # "gone" never has a session


def apply_both_ways(tmp_path, rounds: list[list[list[o.Op]]]) -> None:
    """Apply `rounds` (each: submissions of ops, one writer per round, so the applier reloads in between) per op
    and in bulk, to two spools; they must end the same."""
    outcomes = []
    for bulk in (False, True):
        directory = tmp_path / ("bulk" if bulk else "per-op")
        head, ignored = GENESIS, 0
        for submissions in rounds:
            with Spool.open(directory) as spool, SpoolWriter(spool) as writer:
                subs = []
                for ops in submissions:
                    entries = chain(head, 1, [encode_op(op) for op in ops])
                    head = entries[-1].point
                    subs.append(writer.submit_entries(entries, bulk=bulk))
                for sub in subs:
                    sub.future.result(timeout=30)
                ignored += writer.metrics().ignored_ops
        outcomes.append((load(directory), ignored, head))
    assert outcomes[0] == outcomes[1]


def test_every_op_and_a_run_of_queued_messages_end_the_same(tmp_path):
    run = [op for m in range(100, 160) for op in (body(m, payload=b"x" * 900), o.MessageQueued("a", m, 1, False),
                                                    o.MessageQueued("b", m, 1, False, (3, 4)))]
    apply_both_ways(tmp_path, [EVERY_OP[:2] + [run] + EVERY_OP[2:]])


def test_a_queue_row_the_table_still_holds_makes_the_run_go_op_by_op(tmp_path):
    # Message 10 queued for "a", PUBREC'd (its body released and deleted, the queue row kept); after a restart the
    # highest msg_id held is below 10 again, so the fast path starts, and the INSERT meets the UNIQUE row.
    first = [[o.SessionOpened("a", 5, 3600, 1)], [body(10), o.MessageQueued("a", 10, 2, False)],
             [o.MessageInflight("a", 10, 1), o.MessagePubrecReceived("a", 10)]]
    again = [[body(10), o.MessageQueued("a", 10, 2, False), body(11), o.MessageQueued("a", 11, 1, False)]]
    apply_both_ways(tmp_path, [first, again])


def test_the_fast_path_is_taken_for_queued_messages_and_refused_where_it_could_differ(tmp_path):
    Spool.open(tmp_path / "s").close()
    conn = connect(tmp_path / "s" / FILE_NAME)
    applier = SqlApplier(conn, 100)
    conn.execute("BEGIN IMMEDIATE")
    applier.apply(1, o.SessionOpened("a", 5, 3600, 1), b"")
    applier.apply(2, body(5), encode_op(body(5)))

    def run(ops, seq=10):
        entries = chain(GENESIS, 1, [encode_op(op) for op in ops])
        entries = [e._replace(seq=seq + i) for i, e in enumerate(entries)]
        conn.execute("SAVEPOINT t")
        try:
            return applier._apply_run(entries, ops, 0, len(ops))
        finally:
            conn.execute("ROLLBACK TO t")
            conn.execute("RELEASE t")

    assert run([body(6), o.MessageQueued("a", 6, 1, False), body(7), o.MessageQueued("a", 7, 1, False)])
    assert not run([body(5), o.MessageQueued("a", 5, 1, False)]), "a msg_id already held"
    assert not run([o.MessageQueued("a", 8, 1, False), body(8)]), "queued before it is stored"
    assert not run([body(8), o.MessageQueued("gone", 8, 1, False)]), "no such session"
    assert not run([body(9), body(8)]), "msg_ids not rising"
    conn.execute("ROLLBACK")
    conn.close()


_msg_ids = st.integers(1, 6)
_op = st.one_of(
    st.builds(lambda m: body(m), _msg_ids),
    st.builds(lambda c, m, q: o.MessageQueued(c, m, q, False), st.sampled_from(CLIENTS), _msg_ids, st.integers(0, 2)),
    st.builds(lambda c, m: o.MessageInflight(c, m, 7), st.sampled_from(CLIENTS), _msg_ids),
    st.builds(lambda c, m: o.MessagePubrecReceived(c, m), st.sampled_from(CLIENTS), _msg_ids),
    st.builds(lambda c, m: o.MessageAcked(c, m), st.sampled_from(CLIENTS), _msg_ids),
    st.builds(lambda c, m: o.MessageDropped(c, m, "x"), st.sampled_from(CLIENTS), _msg_ids),
    st.builds(lambda m: o.RetainedSet("r", m), _msg_ids),
    st.just(o.SessionDeleted("b")),
    st.just(o.SessionOpened("b", 4, 0, 2)),
)
_round = st.lists(st.lists(_op, min_size=1, max_size=12), min_size=1, max_size=4)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rounds=st.lists(_round, min_size=1, max_size=3))
def test_any_sequence_ends_the_same_in_bulk_as_op_by_op(tmp_path_factory, rounds):
    sessions = [[o.SessionOpened("a", 5, 3600, 1), o.SessionOpened("b", 4, 0, 2)]]
    apply_both_ways(tmp_path_factory.mktemp("bulk"), [sessions + rounds[0]] + rounds[1:])


def test_a_bulk_submission_with_a_malformed_op_is_refused_whole(tmp_path):
    with Spool.open(tmp_path / "s") as spool, SpoolWriter(spool) as writer:
        entries = chain(GENESIS, 1, [encode_op(o.SessionOpened("a", 5, 3600, 1)), b"\x01\x02\xff"])
        try:
            writer.submit_entries(entries, bulk=True)
        except Exception as exc:  # noqa: BLE001 - the codec's error names the fault
            assert "MessageQueued" in str(exc) or "truncated" in str(exc), exc
        else:
            raise AssertionError("a malformed op was queued")
        assert writer.head == GENESIS and writer.pending_ops == 0
    assert sqlite3.connect(tmp_path / "s" / FILE_NAME).execute("SELECT count(*) FROM oplog").fetchone() == (0,)

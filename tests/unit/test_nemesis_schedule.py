"""The nemesis's sans-I/O parts: the seeded schedule, the unavailability measure and the report's verdict."""

from __future__ import annotations

import pytest

from tests.harness.nemesis_report import VIOLATIONS, build, table
from tests.harness.nemesis_schedule import KINDS, LEASE_S, LINKS, schedule
from tests.harness.streams import longest_gap


def test_a_seed_names_its_whole_schedule_and_another_seed_differs():
    assert schedule(7, 30) == schedule(7, 30)
    assert [s.describe() for s in schedule(7, 30)] != [s.describe() for s in schedule(8, 30)]


def test_cover_injects_every_kind_once_first():
    for seed in range(20):
        steps = schedule(seed, len(KINDS) + 3, "cover")
        assert sorted(s.kind for s in steps[:len(KINDS)]) == sorted(KINDS)
        assert [s.index for s in steps] == list(range(len(KINDS) + 3))


def test_steps_stay_within_their_bounds():
    for step in schedule(3, 2000):
        if step.kind == "pause":
            assert step.hold_s > LEASE_S, step.describe()  # longer than the lease, or it tests nothing
        if step.kind in ("partition", "flap"):
            assert step.target in LINKS
        if step.kind == "one_way":
            assert step.target in LINKS or step.target[::-1] in LINKS
        if step.kind == "release_revert":
            assert 1 <= step.params["repeats"] <= 3
        assert 0 <= step.hold_s <= 4.0


@pytest.mark.parametrize("args, words", [
    ((1, 0), "at least one step"),
    ((1, 5, "sometimes"), "mode must be"),
    ((1, 5, "random", ("kill9", "meteor")), "unknown fault kinds"),
    ((1, 5, "random", ()), "unknown fault kinds"),
])
def test_bad_schedules_are_refused_clearly(args, words):
    with pytest.raises(ValueError, match=words):
        schedule(*args)


def test_longest_gap_counts_the_edges_of_the_window():
    assert longest_gap([1.0, 1.1, 1.2], 0.0, 1.5) == pytest.approx(1.0)  # start to the first ack
    assert longest_gap([0.5, 3.0, 3.1], 1.0, 4.0) == pytest.approx(2.0)  # a hole inside
    assert longest_gap([0.5, 1.1, 1.2], 1.0, 4.0) == pytest.approx(2.8)  # the last ack to the end
    assert longest_gap([], 1.0, 2.5) == pytest.approx(1.5)  # nothing acknowledged at all


def _run(seed: int, **counts) -> dict:
    step = {"kind": "kill9", "target": ["active"], "unavailable_s": 1.5, "recover_s": 2.0, "recovered": True}
    return {"seed": seed, "steps": [step], "counts": {"published": 10, "acknowledged": 10, **counts}, "problems": []}


def test_the_report_names_every_count_and_fails_on_any_violation():
    clean = build([_run(1), _run(2)])
    assert clean["ok"] and clean["failed_seeds"] == []
    assert clean["per_kind"]["kill9"] == {"injected": 2, "unavailable_p50_s": 1.5, "unavailable_max_s": 1.5,
                                          "recover_p50_s": 2.0, "recover_max_s": 2.0, "recovery_timeouts": 0}
    assert clean["per_kind_and_target"]["kill9 active"]["injected"] == 2
    text = table(clean, by_target=True)
    assert all(f"{key} 0" in text for key in VIOLATIONS) and "OK, zero violations" in text
    for key in VIOLATIONS:
        bad = build([_run(1), _run(2, **{key: 1})])
        assert not bad["ok"] and bad["failed_seeds"] == [2], key
        assert "--seed: [2]" in table(bad)


class _Logs:
    """Two nodes' accept events, as tests.harness.group.Group.events gives them (the thing tested is `unexplained`)."""

    def __init__(self, accepts: dict) -> None:
        self.accepts = accepts

    def address(self, role):
        return {"primary": "10.77.0.1", "backup": "10.77.0.2"}[role.value]

    def events(self, role):
        return [{"event": "client_accepted", "client_id": "prob", "mono_ms": t, "epoch": epoch}
                for t, epoch in self.accepts[role.value]]


def _round(p_window, b_window):
    return [{"host": "10.77.0.1", "sent_ms": p_window[0], "done_ms": p_window[1], "rc": 0},
            {"host": "10.77.0.2", "sent_ms": b_window[0], "done_ms": b_window[1], "rc": 0}]


def test_a_late_reply_across_a_handover_is_explained_by_the_logs_and_anything_else_is_a_violation():
    from tests.harness.nemesis import unexplained

    handover = _Logs({"primary": [(1000, 1)], "backup": [(2030, 2)]})  # the backup's SYN was resent after 1 s
    violations, explained = unexplained([_round((999, 1002), (999, 2031))], handover)
    assert violations == [] and len(explained) == 1
    same_epoch = _Logs({"primary": [(1000, 2)], "backup": [(1001, 2)]})
    assert len(unexplained([_round((999, 1002), (999, 1003))], same_epoch)[0]) == 1
    older_later = _Logs({"primary": [(1000, 3)], "backup": [(1001, 2)]})  # a lower epoch accepting after a higher
    assert len(unexplained([_round((999, 1002), (999, 1003))], older_later)[0]) == 1
    unlogged = _Logs({"primary": [(1000, 1)], "backup": []})
    assert len(unexplained([_round((999, 1002), (999, 2031))], unlogged)[0]) == 1

"""The in-flight window policy (appliance/mqtt/overload.py): a pure function of load, time passed in."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pairmq.appliance.mqtt.overload import OverloadLimits, WindowPolicy

LIM = OverloadLimits()


def test_idle_is_the_full_window():
    policy = WindowPolicy()
    assert policy.update(0, backlog_ops=0, lag_ms=0.0) == 100
    assert policy.update(10, backlog_ops=LIM.backlog_low_ops, lag_ms=LIM.lag_low_ms) == 100
    assert policy.load == 0.0


@pytest.mark.parametrize("backlog, lag, window", [
    (LIM.backlog_high_ops, 0.0, 1),
    (0, LIM.lag_high_ms, 1),
    (10 * LIM.backlog_high_ops, 10 * LIM.lag_high_ms, 1),
    ((LIM.backlog_low_ops + LIM.backlog_high_ops) // 2, 0.0, 50),
    (0, (LIM.lag_low_ms + LIM.lag_high_ms) / 2, 50),
    # the worse input decides
    ((LIM.backlog_low_ops + LIM.backlog_high_ops) // 2, LIM.lag_high_ms, 1),
])
def test_the_window_shrinks_at_once_with_the_worse_input(backlog, lag, window):
    policy = WindowPolicy()
    assert policy.update(0, backlog, lag) == window


def test_it_grows_back_at_most_doubling_per_interval():
    policy = WindowPolicy()
    assert policy.update(0, LIM.backlog_high_ops, 0.0) == 1
    steps = []
    for now in range(0, 1000, 50):
        steps.append(policy.update(now, 0, 0.0))
    # 50 ms samples from the shrink at 0 ms, 100 ms interval: a doubling at 100, 200, 300 ms...
    assert steps[:6] == [1, 1, 2, 2, 4, 4]
    assert steps[-1] == 100 and all(b <= 2 * a for a, b in zip(steps, steps[1:]))


def test_a_new_rise_interrupts_growth():
    policy = WindowPolicy()
    policy.update(0, LIM.backlog_high_ops, 0.0)
    policy.update(100, 0, 0.0)
    policy.update(200, 0, 0.0)
    assert policy.window == 4
    assert policy.update(210, 0, LIM.lag_high_ms) == 1
    assert policy.update(250, 0, 0.0) == 1  # growth waits a whole interval after the shrink


@given(st.lists(st.tuples(st.integers(0, 10**6), st.floats(0, 10_000, allow_nan=False)), max_size=60))
def test_the_window_stays_in_bounds(samples):
    policy = WindowPolicy()
    before = policy.window
    for i, (backlog, lag) in enumerate(samples):
        window = policy.update(i * 37, backlog, lag)
        assert LIM.min_window <= window <= LIM.max_window
        assert window <= policy.target(backlog, lag)  # never above what the load allows
        assert window <= 2 * before  # never a burst
        before = window


@pytest.mark.parametrize("kwargs", [
    {"min_window": 0}, {"min_window": 5, "max_window": 4}, {"backlog_low_ops": 10, "backlog_high_ops": 10},
    {"lag_low_ms": -1.0}, {"grow_interval_ms": 0}])
def test_bad_limits_are_refused(kwargs):
    with pytest.raises(ValueError):
        OverloadLimits(**kwargs)

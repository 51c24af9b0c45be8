"""The rounds a trace calibration pools and the host time of a recorded step outside its
op spans (``executor.trace_rounds``), against values derived by hand."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from executor.calibrate_ops import OpSample
from executor.trace_rounds import fold_step_gap, middle_rounds, round_times, step_gap


def _ev(name, ts, dur):
    return {"ph": "X", "cat": "meshplan", "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": 1}


def test_round_times_take_the_slowest_rank_of_each_round_common_to_all_ranks():
    metas = [{"span_steps_s": [0.30, 0.11, 0.10, 0.5]}, {"span_steps_s": [0.25, 0.12, 0.20]}]
    assert round_times(metas) == [0.30, 0.12, 0.20]


def test_nine_rounds_pool_the_three_around_the_median():
    """Slowest-rank times by round 0..8: 9, 1, 8, 2, 7, 3, 6, 4, 5 (ms). Sorted: rounds 1
    (1), 3 (2), 5 (3), 7 (4), 8 (5), 6 (6), 4 (7), 2 (8), 0 (9); the median is round 8 (5
    ms) and the middle third is rounds 7, 8, 6 (4, 5, 6 ms)."""
    times = [9, 1, 8, 2, 7, 3, 6, 4, 5]
    assert middle_rounds([{"span_steps_s": times}]) == [6, 7, 8]


def test_the_pooled_count_is_odd_and_centred_on_the_median():
    """31 rounds (time = index): ceil(31 / 3) = 11 rounds, 10..20 around the median 15; 4
    rounds: ceil(4 / 3) = 2, made odd: 3 rounds, the median (the shorter middle, index 1)
    at their centre; one round: itself; share 1: every round."""
    assert middle_rounds([{"span_steps_s": list(range(31))}]) == list(range(10, 21))
    assert middle_rounds([{"span_steps_s": [0.0, 1.0, 2.0, 3.0]}]) == [0, 1, 2]
    assert middle_rounds([{"span_steps_s": [0.7]}]) == [0]
    assert middle_rounds([{"span_steps_s": [3.0, 1.0, 2.0]}], share=1.0) == [0, 1, 2]
    with pytest.raises(ValueError, match="in \\(0, 1\\]"):
        middle_rounds([{"span_steps_s": [1.0]}], share=0.0)


@given(st.lists(st.floats(0.001, 10.0), min_size=1, max_size=60))
def test_the_pooled_rounds_always_hold_the_median_round(times):
    """Whatever the times, the pooled rounds hold the round of median time (the shorter
    middle one for an even count) and are ranked contiguously around it."""
    got = middle_rounds([{"span_steps_s": times}])
    order = sorted(range(len(times)), key=lambda i: (times[i], i))
    median = order[(len(times) - 1) // 2]
    assert median in got and len(got) % 2 == 1 or len(got) == len(times)
    ranks = sorted(order.index(i) for i in got)
    assert ranks == list(range(ranks[0], ranks[0] + len(got)))


def test_step_gap_is_the_step_outside_its_top_level_spans():
    """A 1,000 us step with spans 100-300 us, 150-200 us (inside the first) and 400-900
    us: the top-level spans cover 200 + 500 us, so 300 us are outside; less 10 us of the
    recorder's cost per top-level span (2): 280 us."""
    step = _ev("meshplan-step 0", 0, 1000)
    inner = [_ev("meshplan::unit F0 mb0", 100, 200), _ev("meshplan::F #3 matmul", 150, 50),
             _ev("meshplan::O #9 sgd_", 400, 500)]
    assert step_gap(step, inner) == pytest.approx(300e-6)
    assert step_gap(step, inner, eps=10e-6) == pytest.approx(280e-6)
    assert step_gap(step, [_ev("meshplan::O #9 sgd_", 0, 1000)], eps=1e-6) == 0.0  # never negative


def test_the_gap_is_spread_over_the_action_samples_only():
    """400 us over two action samples: +200 us each; the GEMM sample is untouched; without
    action samples nothing changes; a negative gap is refused."""
    smp = [OpSample("action", "F", 0.0, 0.0, 1e-4), OpSample("gemm", "matmul", 1e6, 0.0, 5e-4),
           OpSample("action", "B", 0.0, 0.0, 3e-4)]
    got = fold_step_gap(smp, 4e-4)
    assert [s.seconds for s in got] == pytest.approx([3e-4, 5e-4, 5e-4])
    assert fold_step_gap(smp[1:2], 4e-4) == smp[1:2]
    with pytest.raises(ValueError, match="negative"):
        fold_step_gap(smp, -1e-6)


def test_partly_overlapping_spans_count_once_and_a_duplicate_step_span_is_no_cover():
    """Spans 100-300 us and 250-400 us overlap: their union covers 300 us, so a 1,000 us
    step has 700 us outside them (one run of spans: 10 us of recorder cost off, 690 us).
    A copy of the step span among the inner events covers nothing."""
    step = _ev("meshplan-step 0", 0, 1000)
    inner = [_ev("meshplan::unit F0 mb0", 100, 200), _ev("meshplan::O #9 sgd_", 250, 150)]
    assert step_gap(step, inner) == pytest.approx(700e-6)
    assert step_gap(step, inner, eps=10e-6) == pytest.approx(690e-6)
    assert step_gap(step, [*inner, dict(step)]) == pytest.approx(700e-6)

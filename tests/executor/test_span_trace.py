"""executor.span_trace (the span recorder the trace calibration fits) and how
``calibrate --from-trace`` reads its events: Chrome-trace events from a clock set by hand,
the recorder's cost measured against a span made slow on purpose, recorder spans matched
apart from the profiler's events of the same thread with the recorder's cost taken off,
and the measured step taken from the unrecorded steps that alternated with the recorded
ones; one single-process executor run records a trace of the MLP plan end to end."""

from __future__ import annotations

import json
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from executor import span_trace
from executor.span_trace import SPAN_CAT, SpanRecorder, span_cost
from executor.trace_match import Target, event_cost, match_trace, recorded_spans
from meshplan.calibration_trace import cpu_medians, measured_step, recording_cost


def _clock(*ticks_ns: int):
    it = iter(ticks_ns)
    return lambda: next(it)


def test_events_of_nested_spans_in_microseconds():
    """Outer span 1000..12000 ns around inner 3000..7000 ns: outer ts = offset, dur 11 us;
    inner ts = offset + 2 us, dur 4 us; sorted by start although the inner one ends first."""
    rec = SpanRecorder(_clock(1000, 3000, 7000, 12000))
    with rec.span("meshplan::unit F0 mb0"), rec.span("meshplan::F #3 matmul"):
        pass
    got = rec.events(pid=7, tid=9, offset_us=500.0)
    assert got == [
        {"ph": "X", "cat": SPAN_CAT, "name": "meshplan::unit F0 mb0", "pid": 7, "tid": 9, "ts": 500.0, "dur": 11.0},
        {"ph": "X", "cat": SPAN_CAT, "name": "meshplan::F #3 matmul", "pid": 7, "tid": 9, "ts": 502.0, "dur": 4.0}]
    assert rec.origin_ns == 1000  # the clock time that ts = offset stands for
    rec.clear()
    assert rec.events(1, 1) == [] and rec.origin_ns is None


def test_a_span_is_recorded_when_its_body_raises():
    rec = SpanRecorder(_clock(0, 2500))
    with pytest.raises(KeyError), rec.span("meshplan::F #4 reshape"):
        raise KeyError("x")
    assert rec.spans == [("meshplan::F #4 reshape", 0, 2500)]


def test_span_cost_measures_what_a_span_adds(monkeypatch):
    """A span whose exit busy-waits 300 us costs at least that; a plain span costs far
    less than a plan op (under 50 us on any host that runs the suite)."""
    assert 0.0 <= span_cost(spans=200, repeats=3) < 50e-6
    plain_exit = span_trace._Span.__exit__

    def slow_exit(self, *exc):
        t = time.perf_counter() + 300e-6
        while time.perf_counter() < t:
            pass
        return plain_exit(self, *exc)

    monkeypatch.setattr(span_trace._Span, "__exit__", slow_exit)
    assert 290e-6 <= span_cost(spans=20, repeats=2) < 5e-3
    with pytest.raises(ValueError, match="spans >= 1"):
        span_cost(spans=0)


LABELS = {"meshplan::F #3 matmul": Target("gemm", "matmul", 1e6, 0.0, "F"),
          "meshplan::F #4 reshape": Target("view", "reshape", 0.0, 0.0, "F")}


def _ev(name, ts, dur, cat=SPAN_CAT):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": 1}


def test_recorder_spans_are_matched_apart_from_profiler_events_of_the_thread():
    """Recorder spans on the thread of a profiler pass whose clock overlaps: the profiler's
    aten::mm at 12 us is not counted inside the recorder's matmul span (10..50 us), so with
    the recorder's 0.5 us per span: matmul 40 - 0.5 = 39.5 us; the unit (100 us) less its
    two spans (50 us) less 0.5 us for itself = 49.5 us; reshape 10 - 0.5 = 9.5 us."""
    events = [_ev("meshplan::unit F0 mb0", 0, 100), _ev("meshplan::F #3 matmul", 10, 40),
              _ev("meshplan::F #4 reshape", 60, 10), _ev("aten::mm", 12, 30, "cpu_op")]
    assert recorded_spans(events) == events[:3]
    meta = {"span_event_s": 0.5e-6, "profiler_event_s": 2e-6}
    assert event_cost(meta, "span_event_s") == 0.5e-6 and event_cost(meta) == 2e-6
    got = {(s.kind, s.op_type): s.seconds for s in match_trace(events, LABELS, event_cost(meta, "span_event_s"))}
    assert got == pytest.approx({("gemm", "matmul"): 39.5e-6, ("view", "reshape"): 9.5e-6,
                                 ("action", "F"): 49.5e-6})


def test_measured_step_is_the_median_of_the_alternating_unrecorded_steps():
    """Per round the slowest rank: unrecorded (0.12, 0.10, 0.30) -> median 0.12 s; recorded
    (0.13, 0.11, 0.20) -> 0.13 s; 250 spans of 0.4 us per recorded step on rank 1 (the
    larger) -> 0.1 ms. An older trace without rounds: its timed steps' median."""
    metas = [{"paired_steps_s": [0.12, 0.09, 0.30], "span_steps_s": [0.13, 0.11, 0.2],
              "step_times_s": [9.0], "span_event_s": 0.2e-6, "span_count": 750},
             {"paired_steps_s": [0.11, 0.10, 0.25], "span_steps_s": [0.12, 0.10, 0.19],
              "step_times_s": [9.0], "span_event_s": 0.4e-6, "span_count": 750}]
    assert measured_step(metas) == (pytest.approx(0.12), "paired_steps_s")
    rec, plain, cost = recording_cost(metas)
    assert (rec, plain, cost) == pytest.approx((0.13, 0.12, 1e-4))
    old = [{"step_times_s": [0.2, 0.5, 0.3]}, {"step_times_s": [0.25, 0.1, 0.3]}]
    assert measured_step(old) == (pytest.approx(0.3), "step_times_s") and recording_cost(old) is None
    assert measured_step([{}]) is None
    # CPU time of the rounds, per round the larger rank's: recorded (0.07, 0.09, 0.06) ->
    # 0.07 s, unrecorded (0.07, 0.08, 0.05) -> 0.07 s
    cpu = [{"span_cpu_s": [0.07, 0.09, 0.05], "paired_cpu_s": [0.07, 0.08, 0.04]},
           {"span_cpu_s": [0.06, 0.08, 0.06], "paired_cpu_s": [0.06, 0.07, 0.05]}]
    assert cpu_medians(cpu) == pytest.approx((0.07, 0.07)) and cpu_medians(old) is None


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=10**6), min_size=2, max_size=40))
def test_every_span_becomes_one_event_with_its_duration(ticks):
    """Property: spans recorded one after another from any clock readings keep their
    count, names and durations (ns / 1000) in the events, which start at the offset."""
    ticks = sorted(ticks)[: len(ticks) // 2 * 2]
    rec = SpanRecorder(_clock(*ticks))
    for i in range(len(ticks) // 2):
        with rec.span(f"s{i}"):
            pass
    ev = rec.events(0, 0, offset_us=3.0)
    assert len(ev) == len(ticks) // 2 and min(e["ts"] for e in ev) == 3.0
    assert sorted(e["dur"] for e in ev) == pytest.approx(sorted((ticks[2 * i + 1] - ticks[2 * i]) / 1e3
                                                                for i in range(len(ticks) // 2)))


@pytest.mark.slow  # the first torch.profiler session of a process imports torch._dynamo & co: 8-20 s here
def test_one_process_run_records_spans_and_the_profiler_pass(tmp_path):
    """The MLP plan on one process with ``profile_dir``: the trace holds the profiler
    pass's aten ops with shapes and PAIRED_STEPS recorded steps of spans the plan's labels
    all match, and the metadata holds both step series."""
    from executor.profile import PAIRED_STEPS, PROFILE_STEPS
    from executor.run import run_plan
    from executor.trace_calibrate import load_trace
    from executor.trace_match import median_step, plan_labels
    from meshplan.plan import Plan
    from meshplan.strategy import Strategy
    from tests.conftest import SHARED

    plan = Plan(str(SHARED / "data" / "programs" / "mlp_sgd_no_dist_attrs.pir"), "cpu-local",
                Strategy(dtype="float32", optimizer="sgd", micro_batch_size=4, global_batch_size=8))
    run_plan(plan, 1, steps=2, warmup=1, _single=True, profile_dir=str(tmp_path))
    doc = json.loads((tmp_path / "rank0.json").read_text())
    meta = doc["meshplan"]
    assert len(meta["profiled_steps_s"]) == PROFILE_STEPS and len(meta["step_times_s"]) == 2
    assert len(meta["paired_steps_s"]) == len(meta["span_steps_s"]) == PAIRED_STEPS
    assert len(meta["paired_cpu_s"]) == len(meta["span_cpu_s"]) == PAIRED_STEPS
    assert all(0 < c for c in meta["paired_cpu_s"] + meta["span_cpu_s"])
    assert meta["span_event_s"] >= 0 and meta["span_count"] > PAIRED_STEPS
    events = load_trace(tmp_path / "rank0.json")
    mm = [e for e in events if e.get("name") == "aten::mm"]
    assert mm and all(e["args"]["Input Dims"] for e in mm)
    spans = recorded_spans(events)
    assert sum(e["name"].startswith("meshplan-step ") for e in spans) == PAIRED_STEPS
    assert min(e["ts"] for e in spans) > max(e["ts"] for e in mm)  # after the profiler pass
    samples = match_trace(median_step(spans), plan_labels(plan, 0), meta["span_event_s"])
    assert sum(s.kind == "gemm" for s in samples) >= 2 and all(s.seconds >= 0 for s in samples)


def test_the_fitted_rounds_are_the_middle_third_by_the_slowest_rank():
    """Rounds' slowest-rank times (0.30, 0.12, 0.20): round 2 is the median one, on every
    rank, even where that rank's own median round differs (rank 0: round 1 at 0.11 s is
    its median); an even count takes the shorter middle round; round_step keeps only the
    events inside that round's span and names a round the trace lacks."""
    from executor.trace_match import TraceMatchError, round_step
    from executor.trace_rounds import middle_rounds

    metas = [{"span_steps_s": [0.30, 0.11, 0.10]}, {"span_steps_s": [0.25, 0.12, 0.20]}]
    assert middle_rounds(metas) == [2]
    assert middle_rounds([{"span_steps_s": [0.4, 0.1, 0.3, 0.2]}], share=0.25) == [3]
    assert middle_rounds([{}]) == []
    ev = [_ev("meshplan-step 0", 0, 300), _ev("meshplan::F #3 matmul", 10, 20),
          _ev("meshplan-step 2", 500, 200), _ev("meshplan::F #3 matmul", 510, 30)]
    assert round_step(ev, 2) == [ev[3]]
    with pytest.raises(TraceMatchError, match="no span 'meshplan-step 1'"):
        round_step(ev, 1)

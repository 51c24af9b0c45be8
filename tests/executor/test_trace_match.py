"""executor.trace_match and executor.trace_plan_fit: the executor's span names; a plan's
ops matched to their names with the FLOPs and bytes the cost model charges (hand-derived
for the MLP program on 2 data-parallel ranks); span times less the profiler's cost per
event and unit calls less their ops (hand-built events); constants generated into samples
come back out of the fit, and the calibrated spec predicts each class's measured time."""

from __future__ import annotations

import pytest

from clusters import load_cluster
from clusters.spec import parse_spec
from executor.calibrate_fit import collective_terms
from executor.calibrate_ops import OpSample
from executor.profile import bucket_label, item_label, unit_label
from executor.trace_match import Target, TraceMatchError, event_cost, match_trace, plan_labels
from executor.trace_plan_fit import (
    apply_plan_fit,
    class_times,
    fit_plan_samples,
    gemm_groups,
    measured_class_times,
)
from meshplan.plan import Plan
from meshplan.strategy import Strategy
from tests.conftest import SHARED

MLP = str(SHARED / "data" / "programs" / "mlp_sgd_no_dist_attrs.pir")


def test_span_names():
    assert item_label(("F", 0), 6, "matmul") == "meshplan::F #6 matmul"
    assert item_label("step", 26, "sgd_") == "meshplan::O #26 sgd_"
    assert unit_label(("W", 1), 3) == "meshplan::unit W1 mb3"
    assert bucket_label(0) == "meshplan::O bucket0 all_reduce"


def test_plan_labels_of_the_mlp_on_two_ranks():
    """The MLP (input 4x16, W0 16x16, W1 16x8) with dp 2: 2 rows per rank; fp32."""
    plan = Plan(MLP, "cpu-local", Strategy(dtype="float32", optimizer="sgd", dp=2, micro_batch_size=2,
                                           global_batch_size=4))
    lab = plan_labels(plan, 0)
    mm = lab["meshplan::F #6 matmul"]  # [2,16] @ [16,16]
    assert (mm.kind, mm.flops, mm.bytes) == ("gemm", 2.0 * 2 * 16 * 16, 4.0 * (2 * 16 + 16 * 16 + 2 * 16))
    assert lab["meshplan::F #8 matmul"].flops == 2.0 * 2 * 16 * 8
    relu = lab["meshplan::F #5 relu"]  # reads and writes 2x16 floats
    assert (relu.kind, relu.bytes) == ("memory", 2 * 2 * 16 * 4.0)
    dw = lab["meshplan::W #23 matmul_grad"]  # the W part: dW0 = x^T dy, one GEMM part
    assert (dw.flops, dw.accumulates) == (2.0 * 2 * 16 * 16, True)
    assert lab["meshplan::B #23 matmul_grad"].accumulates is False
    # the fused gradient bucket: both weight gradients, (16*8 + 16*16) floats
    assert lab[bucket_label(0)] == Target("collective", "all_reduce/2", 0.0, 4.0 * (16 * 8 + 16 * 16), "O")
    assert lab["meshplan::F #13 all_reduce"].kind == "other"  # the loss average: logging only
    assert lab["meshplan::F #14 shadow_output"].kind == "view"


def _ev(name, ts, dur, cat="user_annotation", tid=1):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": tid}


LABELS = {"meshplan::F #3 matmul": Target("gemm", "matmul", 1e6, 0.0, "F"),
          "meshplan::F #4 reshape": Target("view", "reshape", 0.0, 0.0, "F"),
          "meshplan::W #5 matmul_grad": Target("gemm", "matmul_grad", 2e6, 0.0, "W", accumulates=True)}


def test_match_trace_takes_the_profiler_cost_off_and_units_less_their_ops():
    """eps = 1 us per event: matmul span 40 us enclosing 2 ops -> 40 - 3 = 37 us;
    reshape 10 us, no ops -> 9 us; the unit (100 us) less its two spans (50 us) less eps
    for itself and the one op outside them -> 48 us. In micro-batch 1 the accumulating
    W span is left out, the unit still counted."""
    events = [_ev("meshplan::unit F0 mb0", 0, 100),
              _ev("meshplan::F #3 matmul", 10, 40), _ev("aten::mm", 12, 30, "cpu_op"),
              _ev("aten::resolve_conj", 13, 1, "cpu_op"),
              _ev("meshplan::F #4 reshape", 60, 10), _ev("aten::empty", 90, 2, "cpu_op"),
              _ev("meshplan::unit W0 mb1", 200, 50), _ev("meshplan::W #5 matmul_grad", 205, 40)]
    got = match_trace(events, LABELS, eps=1e-6)
    by = {(s.kind, s.op_type): s.seconds for s in got}
    assert by[("gemm", "matmul")] == pytest.approx(37e-6)
    assert by[("view", "reshape")] == pytest.approx(9e-6)
    actions = sorted(s.seconds for s in got if s.kind == "action")
    assert actions == pytest.approx([9e-6, 48e-6])  # W unit: 50 - 40 - 1
    assert not any(s.op_type == "matmul_grad" for s in got)
    with pytest.raises(TraceMatchError, match="'meshplan::F #9 add' is no op of the plan"):
        match_trace([_ev("meshplan::F #9 add", 0, 5)], LABELS)
    assert event_cost({"profiler_event_s": 2.5e-6}) == 2.5e-6 and event_cost({}) == 0.0


O_OP, P, F_HALF, B_MEM, ATTN, ACT = 8e-6, 4e10, 2e6, 3e9, 1e10, 30e-6
A_LINK, B_LINK = 5e-5, 1.5e9


def _samples():
    """Samples timed from known constants: t = o + (F + F_half)/P, o + M/B_mem,
    o + F/ATTN, the action overhead, steps a + share S / B."""
    out = [OpSample("view", "reshape", 0.0, 64.0, O_OP, "F") for _ in range(5)]
    for f in (1e6, 8e6, 6.4e7, 5e8):
        out += [OpSample("gemm", "matmul", f, 0.0, O_OP + (f + F_HALF) / P, "F")] * 3
    for m in (1e4, 1e6, 3e7):
        out.append(OpSample("memory", "add", 0.0, m, O_OP + m / B_MEM, "F"))
    out.append(OpSample("attention", "flash_attention", 1e9, 0.0, O_OP + 1e9 / ATTN, "F"))
    out += [OpSample("action", "F", 0.0, 0.0, ACT, "F")] * 3
    steps, share = collective_terms("all_reduce", 2)
    out.append(OpSample("collective", "all_reduce/2", 0.0, 8e6, steps * A_LINK + share * 8e6 / B_LINK, "O"))
    return out


def test_fit_recovers_the_constants_and_predicts_each_class():
    s = _samples()
    groups = sorted(gemm_groups([x for x in s if x.kind == "gemm"]))
    assert [f for f, _ in groups] == [1e6, 8e6, 6.4e7, 5e8]
    assert [t for _, t in groups] == pytest.approx([O_OP + (f + F_HALF) / P for f, _ in groups])
    fit = fit_plan_samples(s, latency=A_LINK, peak=1e11, bandwidth=1e10)
    assert fit.kernel_overhead == pytest.approx(O_OP)
    assert fit.gemm_rate == pytest.approx(P, rel=1e-6)
    assert fit.gemm_half_flops == pytest.approx(F_HALF, rel=1e-6)
    assert fit.memory_rate == pytest.approx(B_MEM, rel=1e-9)
    assert fit.attention_rate == pytest.approx(ATTN, rel=1e-9)
    assert fit.action_overhead == pytest.approx(ACT)
    # one message size: the latency is the spec's, the bandwidth from share S / (t - steps a)
    assert (fit.link_latency, fit.link_latency_fitted) == (A_LINK, False)
    assert fit.link_bandwidth == pytest.approx(B_LINK, rel=1e-9)
    assert fit.by_op["add:F"][0] == pytest.approx(B_MEM / 1e10) and fit.by_op["add:F"][2] == "memory"
    assert fit.by_op["flash_attention:F"][0] == pytest.approx(ATTN / 1e11)
    base = load_cluster("cpu-local").spec.model_dump(exclude_none=True)
    spec = apply_plan_fit(base, fit, "float32", "rank0.json")
    parse_spec(spec, "fitted")
    eff = spec["device"]["efficiency"]
    assert eff["gemm"]["value"] == pytest.approx(P / 1e11) and eff["kernel_overhead_s"]["value"] == pytest.approx(O_OP)
    assert eff["memory_kernels"]["value"] == pytest.approx(B_MEM / 1e10)
    assert "rank0.json" in eff["gemm"]["provenance"]
    measured, after = measured_class_times(s), class_times(s, spec, "float32")
    for cls in ("view", "gemm", "memory", "attention", "action", "collective"):
        assert after[cls] == pytest.approx(measured[cls], rel=1e-6), cls
    before = class_times(s, base, "float32")
    assert abs(before["gemm"] - measured["gemm"]) / measured["gemm"] > 0.1  # the fit changed it


def test_streaming_ops_set_the_copy_bandwidth():
    """Streams at 6 GB/s: memory_bandwidth 6e9 with efficiency 1, memory-bound fractions
    relative to it."""
    s = _samples()
    fit = fit_plan_samples(s, A_LINK, 1e11, 1e10, streams=[(6e6, 1e-3), (1.2e7, 2e-3)])
    assert fit.stream_bandwidth == pytest.approx(6e9)
    base = load_cluster("cpu-local").spec.model_dump(exclude_none=True)
    spec = apply_plan_fit(base, fit, "float32", "t.json")
    dev = spec["device"]
    assert dev["memory_bandwidth"]["value"] == pytest.approx(6e9)
    assert dev["efficiency"]["memory_bandwidth"]["value"] == 1.0
    assert dev["efficiency"]["memory_kernels"]["value"] == pytest.approx(B_MEM / 6e9)
    assert dev["efficiency"]["by_op"]["add:F"]["value"] == pytest.approx(B_MEM / 6e9)
    assert class_times(s, spec, "float32")["memory"] == pytest.approx(measured_class_times(s)["memory"])


def test_a_rate_above_the_spec_peak_replaces_it():
    s = _samples()
    fit = fit_plan_samples(s, latency=A_LINK, peak=1e10, bandwidth=1e9)  # placeholders below
    base = load_cluster("cpu-local").spec.model_dump(exclude_none=True)
    base["device"]["peak_flops"]["fp32"]["value"] = 1e10
    base["device"]["memory_bandwidth"]["value"] = 1e9
    spec = apply_plan_fit(base, fit, "float32", "t.json")
    assert spec["device"]["peak_flops"]["fp32"]["value"] == pytest.approx(P)
    assert spec["device"]["efficiency"]["gemm"]["value"] == 1.0
    assert spec["device"]["memory_bandwidth"]["value"] == pytest.approx(B_MEM)
    assert class_times(s, spec, "float32")["memory"] == pytest.approx(measured_class_times(s)["memory"])


def test_too_few_samples_is_one_clear_error():
    from executor.trace_plan_fit import PlanFitError

    with pytest.raises(PlanFitError, match="no kernel-less"):
        fit_plan_samples([OpSample("gemm", "matmul", 1e6, 0.0, 1e-3, "F")] * 2, 0.0, 1e11, 1e10)
    with pytest.raises(PlanFitError, match="fewer than 2 GEMM"):
        fit_plan_samples([OpSample("view", "reshape", 0.0, 0.0, 1e-5, "F")], 0.0, 1e11, 1e10)


def test_a_preempted_streaming_op_does_not_set_the_copy_bandwidth():
    """Four adds of 1 MB, three at 100 us and one preempted for 10 ms: each takes its
    size's median, 100 us, so 4 MB over 400 us = 10 GB/s (the plain ratio of the sums:
    0.39 GB/s); a 2 MB add at 100 us beside them: 6 MB over 500 us."""
    from executor.trace_plan_fit import stream_bandwidth

    ops = [(1e6, 1e-4), (1e6, 1e-4), (1e6, 1e-2), (1e6, 1e-4)]
    assert stream_bandwidth(ops) == pytest.approx(4e6 / 4e-4)
    assert stream_bandwidth([*ops, (2e6, 1e-4)]) == pytest.approx(6e6 / 5e-4)
    assert sum(b for b, _ in ops) / sum(t for _, t in ops) < 4e8  # the plain ratio: 0.39 GB/s
    with pytest.raises(ValueError, match="positive time"):
        stream_bandwidth([(1e6, 0.0)])


def test_stream_samples_count_one_pass_per_operand():
    """acc += g of 1000 floats: 3 x 4000 bytes; g /= m (a scalar): 2 x 4000 bytes; the
    profiler's 1 us per event is taken off; other ops are not streams."""
    from executor.trace_match import stream_samples

    ev = [dict(_ev("aten::add_", 0, 11, "cpu_op"), args={"Input Dims": [[1000], [1000], []],
                                                         "Input type": ["float", "float", "Scalar"]}),
          dict(_ev("aten::div_", 20, 5, "cpu_op"), args={"Input Dims": [[10, 100], []],
                                                         "Input type": ["float", "Scalar"]}),
          dict(_ev("aten::add", 30, 5, "cpu_op"), args={"Input Dims": [[1000], [1000]],
                                                        "Input type": ["float", "float"]})]
    got = stream_samples(ev, eps=1e-6)
    assert [b for b, _ in got] == [12000.0, 8000.0]
    assert [t for _, t in got] == pytest.approx([10e-6, 4e-6])


def test_merge_collectives_keeps_each_at_its_shortest_rank():
    """Rank 0 arrived last at the first all_reduce (2 ms), rank 1 at the second (3 ms)."""
    from executor.trace_match import merge_collectives

    def c(t):
        return OpSample("collective", "all_reduce/2", 0.0, 8e6, t, "O")

    g = OpSample("gemm", "matmul", 1e6, 0.0, 1e-3, "F")
    got = merge_collectives([[g, c(2e-3), c(9e-3)], [g, c(7e-3), c(3e-3)]])
    assert sorted(s.seconds for s in got if s.kind == "collective") == [2e-3, 3e-3]
    assert sum(s.kind == "gemm" for s in got) == 2
    odd = merge_collectives([[c(2e-3)], [c(1e-3), c(1e-3)]])  # sequences differ: all kept
    assert len(odd) == 3


def test_the_optimizer_update_runs_at_its_measured_efficiency():
    """simulator.grad_sync.optimizer_time: an SGD plan's update of P fp32 parameters moves
    P (2 x 4 weight + 4 gradient) bytes; with by_op["sgd_:O"] = 0.5 of a 1e10 B/s device
    it takes 12 P / 5e9 s (plus one kernel), without it the memory-bound kernels' 0.1."""
    from simulator.grad_sync import optimizer_time
    from simulator.roofline import Roofline
    from simulator.step import StepConfig

    rf = Roofline(peak_flops={"fp32": 1e11}, gemm_efficiency=1.0, gemm_half_flops=1.0,
                  mem_bandwidth=1e10, mem_efficiency=1.0, kernel_overhead=0.0,
                  memory_kernel_efficiency=0.1, by_op={"sgd_:O": 0.5})
    cfg = StepConfig.of(Strategy(dtype="float32", optimizer="sgd"), rf,
                        boundary_bytes=0.0, seq_len=8, accumulate_grads=False)
    assert cfg.optimizer == "sgd"
    assert optimizer_time(cfg, rf, 1_000_000, 1) == pytest.approx(12e6 / 5e9)
    plain = Roofline(**{**rf.__dict__, "by_op": {}})
    assert optimizer_time(cfg, plain, 1_000_000, 1) == pytest.approx(12e6 / 1e9)


def test_calibrate_from_a_trace_of_another_plan_is_one_clear_error(tmp_path, capsys):
    import json as _json

    from tests._cli import one_line_error, run_main

    plan = Plan(MLP, "cpu-local", Strategy(dtype="float32", optimizer="sgd", dp=2, micro_batch_size=2,
                                           global_batch_size=4)).save(tmp_path / "plan.json")
    traces = tmp_path / "traces"
    traces.mkdir()
    (traces / "rank0.json").write_text(_json.dumps({
        "meshplan": {"rank": 0, "world_size": 2, "step_times_s": [0.1]},
        "traceEvents": [_ev("meshplan::F #999 matmul", 0, 5)]}))
    out = str(tmp_path / "fitted.yaml")
    line = one_line_error(*run_main(capsys, "calibrate", "--from-trace", str(traces), "--plan", str(plan),
                                    "-o", out))
    assert "'meshplan::F #999 matmul' is no op of the plan" in line
    line = one_line_error(*run_main(capsys, "calibrate", "--from-trace", str(traces), "--cluster",
                                    "cpu-local", "-o", out))
    assert "needs --plan PLAN.json" in line
    (tmp_path / "empty").mkdir()
    line = one_line_error(*run_main(capsys, "calibrate", "--from-trace", str(tmp_path / "empty"), "--plan",
                                    str(plan), "-o", out))
    assert "holds no rank*.json trace" in line
    (traces / "rank0.json").write_text(_json.dumps({"traceEvents": [_ev("meshplan::F #6 matmul", 0, 5)]}))
    line = one_line_error(*run_main(capsys, "calibrate", "--from-trace", str(traces), "--plan", str(plan),
                                    "-o", out))
    assert "no 'meshplan' metadata" in line


def test_slowest_ranks_keeps_the_slowest_replica_of_each_set():
    """Ranks 0 and 1 run the same ops (rank 1 took 5 ms, rank 0 3 ms, collectives not
    counted); rank 2 runs others and stays."""
    from executor.trace_match import slowest_ranks

    def g(t):
        return OpSample("gemm", "matmul", 1e6, 0.0, t, "F")

    c = OpSample("collective", "all_reduce/2", 0.0, 8e6, 1.0, "O")
    r0, r1, r2 = [g(3e-3), c], [g(2e-3), g(3e-3)], [g(1e-3)]
    assert slowest_ranks([r0, r1, r2], ["a", "a", "b"]) == [r1, r2]


def test_a_by_op_efficiency_below_the_spec_minimum_is_left_out():
    """An op of 1.2 bytes taking 300 us beyond o: 4e3 B/s, 4e-7 of the 1e10 B/s device,
    below clusters.spec.MIN_POSITIVE (1e-6): dropped, and the spec stays valid."""
    s = _samples() + [OpSample("memory", "full_like", 0.0, 1.2, O_OP + 3e-4, "B")]
    fit = fit_plan_samples(s, A_LINK, 1e11, 1e10)
    spec = apply_plan_fit(load_cluster("cpu-local").spec.model_dump(exclude_none=True), fit, "float32", "t")
    parse_spec(spec, "fitted")
    assert fit.dropped == ["full_like:B"] and "full_like:B" not in spec["device"]["efficiency"]["by_op"]


def test_median_step_keeps_the_events_of_the_median_profiled_step():
    """Three profiled steps of 100, 300 and 120 us: the 120 us one (the median) and only its
    events are kept; a trace without step spans is kept whole."""
    from executor.trace_match import median_step

    ev = [_ev("meshplan-step 0", 0, 100), _ev("meshplan::F #3 matmul", 10, 20),
          _ev("meshplan-step 1", 200, 300), _ev("meshplan::F #3 matmul", 210, 250),
          _ev("meshplan-step 2", 600, 120), _ev("meshplan::F #3 matmul", 610, 30),
          _ev("aten::mm", 612, 25, "cpu_op")]
    got = median_step(ev)
    assert [(e["name"], e["ts"]) for e in got] == [("meshplan::F #3 matmul", 610), ("aten::mm", 612)]
    assert median_step(ev[1:2]) == ev[1:2]


def _steps(origin_ns: int, offset_us: float, host: str | None, steps: list[tuple[float, float]]):
    """(metadata, events) of a rank whose recorded steps start and end at the given clock
    times (seconds); the events' ts counted from the first start, shifted by offset_us."""
    from executor.profile import step_label

    t0 = min(a for a, _ in steps)
    meta = {"host": host, "span_origin_ns": origin_ns, "span_offset_us": offset_us}
    ev = [{"name": step_label(i), "ph": "X", "ts": offset_us + (a - t0) * 1e6, "dur": (b - a) * 1e6}
          for i, (a, b) in enumerate(steps)]
    return meta, ev


def test_round_alignment_puts_the_ranks_on_one_clock():
    """Rank 0 starts its rounds at clock 10.000 s and 10.100 s, rank 1 at 10.004 s and
    10.099 s (each trace counts ts from its own first span and its own offset): skews 4 ms
    and 1 ms; slowest own durations max(40, 36) = 40 ms and max(30, 33) = 33 ms; from the
    last start to the last end: 10.040 - 10.004 = 36 ms and 10.132 - 10.100 = 32 ms."""
    from executor.trace_match import round_alignment

    r0 = _steps(10_000_000_000, 5e5, "h", [(10.000, 10.040), (10.100, 10.130)])
    r1 = _steps(10_004_000_000, 9e5, "h", [(10.004, 10.040), (10.099, 10.132)])
    got = round_alignment([r0, r1])
    assert got.skew == pytest.approx([0.004, 0.001], abs=1e-9)
    assert got.slowest == pytest.approx([0.040, 0.033], abs=1e-9)
    assert got.synced == pytest.approx([0.036, 0.032], abs=1e-9)
    # a step span whose name carries no round number is no round (it raised on int())
    bad = {"name": "meshplan-step x", "ph": "X", "ts": 0.0, "dur": 1.0}
    again = round_alignment([(r0[0], [*r0[1], bad]), (r1[0], [*r1[1], bad])])
    assert again.skew == pytest.approx(got.skew, abs=1e-9)


def test_round_alignment_needs_one_host_and_the_clock_origin():
    from executor.trace_match import round_alignment

    r0 = _steps(10_000_000_000, 0.0, "a", [(10.0, 10.04)])
    assert round_alignment([r0, _steps(10_000_000_000, 0.0, "b", [(10.0, 10.04)])]) is None
    assert round_alignment([r0]) is None
    old = ({"host": "a"}, r0[1])  # a trace written before span_origin_ns was recorded
    assert round_alignment([r0, old]) is None


def test_slowest_segments_takes_each_segment_from_its_slowest_replica():
    """Replicas a (ranks 0, 1) meet at one all_reduce: before it rank 0 took 3 ms and rank 1
    2 + 0.5 ms, after it rank 0 1 ms and rank 1 4 ms; the step is max(3, 2.5) + max(1, 4) =
    7 ms of ops (rank 0's whole 4 ms and rank 1's 6.5 ms each miss one segment). Rank 2 runs
    other ops and stays whole; replicas whose segment counts differ fall back to the busiest."""
    from executor.trace_match import slowest_segments

    def g(t, ph="F"):
        return OpSample("gemm", "matmul", 1e6, 0.0, t, ph)

    c = OpSample("collective", "all_reduce/2", 0.0, 8e6, 1.0, "O")
    r0 = [g(3e-3), c, g(1e-3, "O")]
    r1 = [g(2e-3), g(0.5e-3), c, g(4e-3, "O")]
    r2 = [g(1e-3)]
    got = slowest_segments([r0, r1, r2], ["a", "a", "b"])
    assert got == [[r0[0], r1[3]], r2]
    assert sum(x.seconds for x in got[0]) == pytest.approx(7e-3)
    uneven = slowest_segments([r0, [g(9e-3)]], ["a", "a"])  # no collective on rank 1
    assert uneven == [[g(9e-3)]]

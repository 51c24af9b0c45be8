"""executor.trace_calibrate: a GPU-style Kineto trace generated from known constants
(GEMM rate and half-size, memory-bound bandwidth, link latency and bandwidth) gives those
constants back within 2%; the calibrated spec predicts each kernel class's time of that
trace within 2%; a CPU trace recorded by torch.profiler yields GEMM and memory samples with
the FLOPs and bytes of their shapes; bad traces are one clear error."""

from __future__ import annotations

import json

import pytest
import torch

from clusters import load_cluster
from clusters.spec import parse_spec
from executor.trace_calibrate import (
    TraceError,
    apply_fit,
    class_times,
    classify,
    fit_trace,
    gemm_flops,
    load_trace,
    measured_times,
    trace_samples,
)

P, F_HALF = 2.0e14, 3.0e10  # FLOP/s, FLOPs
B_MEM = 1.5e12  # bytes/s
A_LINK, B_LINK = 5.0e-6, 1.5e11  # s per step, bytes/s


def _synthetic_trace(noise: float = 0.0) -> dict:
    """Kernels launched by CPU ops (External id), timed from the model; ``noise``: a
    deterministic +-relative wobble."""
    events, ext = [], 0

    def add(op: str, dims, types, kernel: str, seconds: float, args=None) -> None:
        nonlocal ext
        ext += 1
        wobble = 1.0 + noise * (1 if ext % 2 else -1)
        events.append({"ph": "X", "cat": "cpu_op", "name": op, "ts": ext, "dur": 5,
                       "args": {"External id": ext, "Input Dims": dims, "Input type": types}})
        events.append({"ph": "X", "cat": "kernel", "name": kernel, "ts": ext, "dur": seconds * 1e6 * wobble,
                       "args": {"External id": ext, **(args or {})}})

    for m, n, k in [(4096, 4096, 4096), (8192, 4096, 11008), (1024, 1024, 1024), (256, 512, 4096),
                    (8192, 12288, 4096)]:
        add("aten::mm", [[m, k], [k, n]], ["c10::BFloat16"] * 2, "sm90_xmma_gemm_bf16bf16",
            (2.0 * m * n * k + F_HALF) / P)
    add("aten::bmm", [[32, 2048, 128], [32, 128, 2048]], ["c10::BFloat16"] * 2, "cutlass_80_gemm",
        (2.0 * 32 * 2048 * 2048 * 128 + F_HALF) / P)
    for numel in (1 << 20, 1 << 24, 3 << 22):
        add("aten::add", [[numel], [numel]], ["float", "float"],
            "vectorized_elementwise_kernel", 3 * 4 * numel / B_MEM)
    for nel, n in [(1 << 20, 8), (1 << 26, 8), (1 << 24, 4)]:
        steps, share = 2 * (n - 1), 2 * (n - 1) / n
        add("record_param_comms", [[nel]], ["float"], "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
            steps * A_LINK + share * 4 * nel / B_LINK,
            {"Collective name": "allreduce", "In msg nelems": nel, "Group size": n, "dtype": "Float"})
    add("aten::_flash_attention_forward", [[1, 32, 2048, 128]] * 3, ["c10::BFloat16"] * 3,
        "flash_fwd_kernel", 1e-3)
    return {"traceEvents": events}


def _write(tmp_path, doc) -> str:
    p = tmp_path / "trace.json"
    p.write_text(json.dumps(doc))
    return str(p)


def test_constants_of_a_synthetic_trace_are_recovered_within_2_percent(tmp_path):
    s = trace_samples(load_trace(_write(tmp_path, _synthetic_trace(noise=0.005))))
    assert (len(s.gemm), len(s.memory), sum(map(len, s.collective.values()))) == (6, 3, 3)
    assert s.counts["attention"] == 1 and s.dtype == "bf16"
    fit = fit_trace(s)
    assert fit.gemm_rate == pytest.approx(P, rel=0.02)
    assert fit.gemm_half_flops == pytest.approx(F_HALF, rel=0.02)
    assert fit.memory_bandwidth == pytest.approx(B_MEM, rel=0.02)
    assert fit.link_latency == pytest.approx(A_LINK, rel=0.02)
    assert fit.link_bandwidth == pytest.approx(B_LINK, rel=0.02)


def test_the_calibrated_spec_predicts_each_class_of_the_trace(tmp_path):
    """Before: the dgx-h100 catalog's datasheet numbers; after: within 2% of measured."""
    s = trace_samples(load_trace(_write(tmp_path, _synthetic_trace())))
    base = load_cluster("dgx-h100").spec.model_dump(exclude_none=True)
    after = apply_fit(base, fit_trace(s), s.dtype, "trace.json")
    parse_spec(after, "calibrated")  # a valid cluster spec
    measured, before, now = measured_times(s), class_times(s, base), class_times(s, after)
    for cls in ("gemm", "memory", "collective"):
        assert now[cls] == pytest.approx(measured[cls], rel=0.02), cls
    assert abs(before["gemm"] - measured["gemm"]) / measured["gemm"] > 0.02  # it did change
    assert after["device"]["efficiency"]["gemm"]["value"] == pytest.approx(
        P / base["device"]["peak_flops"]["bf16"]["value"], rel=0.02)


def test_a_cpu_trace_recorded_by_torch_profiler(tmp_path):
    """The executor's kind of trace: CPU ops only; aten::mm of 64x128 @ 128x32 = 2*64*32*128
    FLOPs, aten::add of two 1000-element fp32 tensors = 3 * 4000 bytes."""
    a, b = torch.randn(64, 128), torch.randn(128, 32)
    x, y = torch.randn(1000), torch.randn(1000)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                record_shapes=True) as prof:
        for _ in range(3):
            torch.mm(a, b)
            torch.add(x, y)
    path = tmp_path / "cpu.json"
    prof.export_chrome_trace(str(path))
    s = trace_samples(load_trace(path))
    assert sorted({f for f, _ in s.gemm}) == [2.0 * 64 * 32 * 128]
    assert sorted({m for m, _ in s.memory}) == [3 * 4 * 1000]
    assert len(s.gemm) == 3 and len(s.memory) == 3


def test_classify_and_gemm_flops():
    assert classify("ncclDevKernel_AllGather_RING_LL") == "collective"
    assert classify("flash_fwd_kernel") == "attention"
    assert classify("ampere_sgemm_128x64_nn") == "gemm"
    assert classify("vectorized_elementwise_kernel<4>") == "memory"
    assert classify("triu_tril_kernel") == "other"
    assert gemm_flops("aten::addmm", [[32], [16, 64], [64, 32]]) == 2.0 * 16 * 64 * 32
    assert gemm_flops("aten::baddbmm", [[2, 4, 8], [2, 4, 16], [2, 16, 8]]) == 2.0 * 2 * 4 * 16 * 8
    assert gemm_flops("aten::mm", [[3]]) == 0.0


def test_bad_traces_are_one_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="trace file not found"):
        load_trace(tmp_path / "none.json")
    p = tmp_path / "bad.json"
    p.write_text("{not json")
    with pytest.raises(TraceError, match="not a JSON Chrome trace"):
        load_trace(p)
    p.write_text('{"events": []}')
    with pytest.raises(TraceError, match="no 'traceEvents' list"):
        load_trace(p)
    p.write_text(json.dumps({"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 0, "dur": 3}]}))
    with pytest.raises(TraceError, match="no GEMM .* to fit"):
        fit_trace(trace_samples(load_trace(p)))


def test_calibrate_from_trace_command(tmp_path, capsys):
    from meshplan.cli import main
    from meshplan.plan import Plan
    from meshplan.strategy import Strategy
    from tests._cli import one_line_error

    trace = _write(tmp_path, _synthetic_trace())
    plan = Plan("llama2-7b", "dgx-h100", Strategy()).save(tmp_path / "plan.json")
    out = tmp_path / "h100-fitted.yaml"
    assert main(["calibrate", "--from-trace", trace, "--plan", str(plan), "--output", str(out)]) == 0
    text = capsys.readouterr().out
    assert "gemm" in text and "collective" in text and "after ms" in text
    spec = load_cluster(str(out)).spec
    assert spec.node.intra_bandwidth.value == pytest.approx(B_LINK, rel=0.02)
    assert spec.device.efficiency.gemm_half_flops.value == pytest.approx(F_HALF, rel=0.02)
    line = one_line_error(main(["calibrate", "--from-trace", trace, "--output", str(out)]),
                          *capsys.readouterr())
    assert "exists" in line and "--force" in line  # issue 43: not replaced in silence
    line = one_line_error(main(["calibrate", "--from-trace", trace, "--output", str(out), "--force"]),
                          *capsys.readouterr())
    assert "exactly one of --plan" in line


def test_absurd_traces_are_refused_naming_the_trace(tmp_path, capsys):
    """Found by a bad-input hunt: an event of 1e30 elements in 10 us fitted a CPU's memory
    bandwidth at 8e35 B/s and wrote it; an Infinity duration blamed the output file. Now a
    non-finite time or dimension is a TraceError naming the event, a bandwidth or FLOP rate
    above the spec's ceiling (1e16 B/s, 1e19 FLOP/s: a thousand times today's fastest) is
    refused, and calibrate says the fit to the trace is implausible and writes nothing."""
    from clusters.errors import ClusterSpecError
    from meshplan.cli import main

    p = tmp_path / "t.json"
    ev = {"ph": "X", "name": "aten::add", "cat": "cpu_op", "ts": 0, "dur": 10,
          "args": {"Input Dims": [[3]], "Input type": ["float"]}}
    p.write_text(json.dumps({"traceEvents": [dict(ev, dur=float("inf"))]}))
    with pytest.raises(TraceError, match="event 'aten::add' has a non-finite time"):
        load_trace(p)
    p.write_text(json.dumps({"traceEvents": [{k: v for k, v in ev.items() if k != "ts"}]}))
    with pytest.raises(TraceError, match="event 'aten::add' has no 'ts'"):
        load_trace(p)
    spec = load_cluster("dgx-h100").spec.model_dump(exclude_none=True)
    spec["device"]["memory_bandwidth"]["value"] = 8e35
    with pytest.raises(ClusterSpecError, match="must be between 1e\\+06 .* and 1e\\+16"):
        parse_spec(spec, "x.yaml")
    p.write_text(json.dumps({"traceEvents": [dict(ev, args={"Input Dims": [[1e30]], "Input type": ["float"]})]}))
    out = tmp_path / "o.yaml"
    assert main(["calibrate", "--from-trace", str(p), "--cluster", "cpu-local", "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"the fit to {p} is implausible, {out} not written" in err and "memory_bandwidth" in err
    assert not out.exists()

"""``meshplan calibrate --quick`` writes a cluster YAML that load_cluster reads, with
positive, plausible measured numbers and provenance."""

from __future__ import annotations

import math

import pytest
import yaml

from clusters import load_cluster
from executor.calibrate import CalibrationError, calibrate, fit_line
from executor.calibrate_comm import link_estimates
from executor.calibrate_fit import FitError, fit_gemm, fit_links, fit_ratio
from executor.calibrate_ops import classify
from meshplan.cli import main


def test_fit_line_recovers_a_known_line():
    slope, icpt = fit_line([1.0, 2.0, 4.0], [3.5, 5.5, 9.5])
    assert math.isclose(slope, 2.0) and math.isclose(icpt, 1.5)


def test_link_estimates_invert_the_cluster_model():
    # ring all_reduce on n=4 with a=1e-5 s, B=1e9 B/s: alpha = 6a, beta = 6/(4B)
    a, b = link_estimates("all_reduce", 4, 6e-5, 6 / (4 * 1e9))
    assert math.isclose(a, 1e-5) and math.isclose(b, 1e9)
    a, b = link_estimates("all_gather", 4, 3e-5, 3 / (4 * 1e9))
    assert math.isclose(a, 1e-5) and math.isclose(b, 1e9)
    a, b = link_estimates("send_recv", 2, 2e-5, 1e-9)
    assert math.isclose(a, 2e-5) and math.isclose(b, 1e9)


def test_fit_gemm_recovers_rate_and_half_flops():
    # t = o + (F + H) / P with P = 1e11 FLOP/s, H = 2e6 FLOPs, o = 1e-5 s
    flops = [2e6, 1e7, 5e7, 2e8]
    secs = [1e-5 + (f + 2e6) / 1e11 for f in flops]
    rate, half = fit_gemm(flops, secs, 1e-5)
    assert rate == pytest.approx(1e11) and half == pytest.approx(2e6)
    with pytest.raises(FitError, match="GEMM rate"):
        fit_gemm([1e6], [1e-3], 0.0)


def test_fit_ratio_is_time_weighted_beyond_the_overhead():
    # 3 MB in (1 ms - 0.1 ms) and 1 MB in (0.4 ms - 0.1 ms): 4 MB / 1.2 ms
    assert fit_ratio([3e6, 1e6], [1e-3, 4e-4], 1e-4, "x") == pytest.approx(4e6 / 1.2e-3)


def test_fit_links_inverts_the_single_node_model():
    a, b = 2e-4, 1e9  # ring all_reduce on 2: 2a + S/B; all_gather: a + S/(2B); p2p: a + S/B
    pts = {"all_reduce/2": [(s, 2 * a + s / b) for s in (1e3, 1e5, 1e6)],
           "all_gather/2": [(s, a + s / (2 * b)) for s in (1e3, 1e5, 1e6)],
           "send_recv/2": [(s, a + s / b) for s in (1e3, 1e6)]}
    got_a, got_b = fit_links(pts)
    assert got_a == pytest.approx(a) and got_b == pytest.approx(b)


def test_fit_links_falls_back_when_noise_swamps_the_bytes():
    """Small messages on a loaded host: times fall as sizes grow, the free fit gives a
    negative 1/B. Then B = the fastest observed byte rate and a = median residual / steps.
    all_reduce on 2 ranks: steps 2, share 1. Rates 1e3/5e-4 = 2e6 and 1e4/4e-4 = 2.5e7 B/s,
    so B = 2.5e7; residuals (5e-4 - 4e-5)/2 = 2.3e-4 and (4e-4 - 4e-4)/2 = 0: median 1.15e-4."""
    pts = {"all_reduce/2": [(1e3, 5e-4), (1e4, 4e-4)]}
    a, b = fit_links(pts)
    assert b == pytest.approx(2.5e7)
    assert a == pytest.approx(1.15e-4)
    with pytest.raises(FitError, match="moved any bytes"):
        fit_links({"all_reduce/2": [(0.0, 5e-4), (0.0, 4e-4)]})


def test_fit_gemm_falls_back_to_the_fastest_rate_when_noise_swamps_size():
    """Times that fall as FLOPs grow give a negative 1/P: P = max(F / (t - o)) =
    4e6 / 1e-3 = 4e9 FLOP/s, no small-size penalty (F_half = 1)."""
    p, half = fit_gemm([1e6, 4e6], [3e-3, 1.1e-3], 1e-4)
    assert p == pytest.approx(4e9) and half == 1.0


def test_classify_counts_gemm_flops_and_memory_bytes():
    import torch

    from completion import append_backward, build_mlp

    prog = build_mlp(batch_size=4, in_features=16, hidden=16, out_features=8)
    append_backward(prog)
    mm = next(op for op in prog.ops if op.type == "matmul")
    x, w = torch.zeros(4, 16), torch.zeros(16, 16)
    assert classify(mm, [x, w], [4 * 16 * 4], None) == ("gemm", 2.0 * 4 * 16 * 16, (64 + 256 + 64) * 4)
    grad = next(op for op in prog.ops if op.type == "matmul_grad")
    assert classify(grad, [x, w, torch.zeros(4, 16)], [256, 1024], (1,))[1] == 2.0 * 4 * 16 * 16
    relu = next(op for op in prog.ops if op.type == "relu")
    assert classify(relu, [x], [256], None) == ("memory", 0.0, 512.0)


def test_calibrate_refuses_one_rank():
    with pytest.raises(CalibrationError, match="nproc >= 2"):
        calibrate(nproc=1)


@pytest.mark.distributed
def test_calibrate_quick_writes_a_loadable_plausible_cluster(quick_calibration):
    out, printed = quick_calibration  # `meshplan calibrate --nproc 2 --quick -o here.yaml`
    assert f"wrote {out}" in printed
    c = load_cluster(out)
    d, n = c.spec.device, c.spec.node
    assert c.name == "here" and c.world_size == 2
    assert 1e8 < d.peak_flops["fp32"].value < 1e13  # 0.1 GFLOP/s .. 10 TFLOP/s per CPU rank
    assert 1e7 < d.peak_flops["bf16"].value < 1e13
    assert 1e8 < d.memory_bandwidth.value < 1e12
    assert 1e-8 < d.efficiency.kernel_overhead_s.value < 1e-2
    assert 0 <= n.intra_latency.value < 1e-2 and 1e6 < n.intra_bandwidth.value < 1e12
    assert d.peak_flops["fp32"].provenance.startswith("measured on ")
    assert 0 < d.efficiency.attention.value <= 1 and 0 < d.efficiency.memory_kernels.value <= 1
    raw = yaml.safe_load(out.read_text())
    assert "all_reduce/2 alpha=" in raw["node"]["intra_bandwidth"]["provenance"]


def test_fit_by_op_is_the_time_weighted_rate_per_op_and_phase():
    from executor.calibrate_fit import fit_by_op
    from executor.calibrate_ops import OpSample

    o, bw, rate = 1e-5, 1e10, 1e11
    samples = [OpSample("memory", "rms_norm_grad", 0.0, 4e5, 1e-5 + 1e-4, "W"),
               OpSample("memory", "rms_norm_grad", 0.0, 2e5, 1e-5 + 1e-4, "W"),
               OpSample("memory", "rms_norm_grad", 0.0, 1e6, 1e-5 + 1e-4, "B"),
               OpSample("attention", "flash_attention", 2e6, 0.0, 1e-5 + 1e-3, "F")]
    got = fit_by_op(samples, o, bw, rate)
    assert got["rms_norm_grad:W"][0] == pytest.approx(6e5 / 2e-4 / bw)  # 0.3
    assert got["rms_norm_grad:W"][1] == 2
    assert got["rms_norm_grad:B"][0] == pytest.approx(1e6 / 1e-4 / bw)  # 1.0
    assert got["flash_attention:F"][0] == pytest.approx(2e6 / 1e-3 / rate)  # 0.02


def test_an_efficiency_below_the_spec_minimum_is_dropped_not_written():
    """CI of stop 26: ``full_like:B`` (a scalar's 4 bytes in ~6 us on a loaded host) fitted
    6.3e-7 of the copy bandwidth, below clusters.spec.MIN_POSITIVE (1e-6), and the written
    YAML failed to load. Such a key is dropped; the overall memory-bound rate applies."""
    from clusters.spec import MIN_POSITIVE
    from executor.calibrate_fit import fit_by_op, split_representable
    from executor.calibrate_ops import OpSample

    o, bw, rate = 1e-5, 1e10, 1e11
    samples = [OpSample("memory", "full_like", 0.0, 4.0, 1e-5 + 1e-3, "B"),
               OpSample("memory", "rms_norm", 0.0, 1e6, 1e-5 + 1e-4, "F")]
    got = fit_by_op(samples, o, bw, rate)
    assert got["full_like:B"][0] == pytest.approx(4.0 / 1e-3 / bw)  # 4e-10 < 1e-6
    kept, dropped = split_representable(got)
    assert dropped == ["full_like:B"]
    assert set(kept) == {"rms_norm:F"} and kept["rms_norm:F"] == got["rms_norm:F"]
    assert all(v[0] >= MIN_POSITIVE for v in kept.values())


def test_a_bad_device_is_refused_before_any_rank_starts(tmp_path, capsys):

    out = str(tmp_path / "o.yaml")
    assert main(["calibrate", "--device", "tpu", "--quick", "--output", out]) == 2
    assert "'--device'" in capsys.readouterr().err
    assert main(["calibrate", "--device", "cuda:x", "--quick", "--output", out]) == 2
    assert "'--device'" in capsys.readouterr().err


def test_an_output_it_cannot_write_is_refused_before_measuring(tmp_path, capsys):
    """The YAML is written after minutes of measuring: a folder, or a file in a missing
    folder, is refused first (it was refused after the measurement, with an errno)."""

    assert main(["calibrate", "--quick", "--output", str(tmp_path)]) == 2
    assert f"--output '{tmp_path}' is a directory" in capsys.readouterr().err
    missing = tmp_path / "nowhere" / "o.yaml"
    assert main(["calibrate", "--quick", "--output", str(missing)]) == 2
    assert f"its folder {tmp_path / 'nowhere'} does not exist" in capsys.readouterr().err


def test_a_trace_dimension_that_is_not_an_integer_is_named():
    from executor.trace_calibrate import TraceError, memory_bytes

    assert memory_bytes([[2, 3], [3]], ["float", "float"]) == (24 + 12) + 24
    with pytest.raises(TraceError, match=r"'Input Dims' entry \['a'\]"):
        memory_bytes([["a"], [3]], ["float", "float"])


def test_without_a_terminal_each_phase_is_announced_on_stderr(tmp_path, capsys, monkeypatch):
    """Piped (no progress bar), calibrate says what it starts and each phase as it ends,
    instead of a silent minute: the phases of ``calibration_phases``, counted."""
    import executor.calibrate as ec
    from meshplan import terminal

    monkeypatch.setattr(terminal, "progress_enabled", lambda: False)
    phases = ec.calibration_phases("cpu")

    def two_phases_then_fail(nproc, quick, device, on_phase):
        on_phase(phases[0])
        on_phase(phases[1])
        raise CalibrationError("stopped by the test")

    monkeypatch.setattr(ec, "calibrate", two_phases_then_fail)
    assert main(["calibrate", "--quick", "--output", str(tmp_path / "o.yaml")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0] == f"calibrating on 2 ranks (seconds; {len(phases)} phases)"
    assert err[1:3] == [f"  1/{len(phases)} {phases[0]}", f"  2/{len(phases)} {phases[1]}"]
    assert "stopped by the test" in err[3]

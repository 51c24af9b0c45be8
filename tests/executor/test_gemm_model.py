"""GEMM time by shape: output tiles in waves of SMs (wave and tile quantization), the
SM-reduced variant, the batched attention GEMMs, and the calibration of the plateau.

Every expected value is derived by hand from the model of ``simulator.roofline`` (NVIDIA
"Matrix Multiplication Background" user's guide, ch. 3):

    tiles = batch * ceil(m / tm) * ceil(n / tn);  waves = ceil(tiles / S)
    compute = waves * 2 tm tn k / (peak / sm_count * plateau)
    t = max(compute, bytes / (bandwidth * mem_eff)) + overhead

on an A100-like device: peak 312 TFLOP/s bf16, 108 SMs, plateau 0.8, so one SM runs at
R = 3.12e14 / 108 * 0.8 = 2.3111e12 FLOP/s; HBM 2.0 TB/s at 0.8 (1.6e12 B/s); 5 us per
kernel. The candidate tiles, in order: 256x128, 128x256, 128x128, 256x64, 64x256,
128x64, 64x128, 64x64 (ties go to the earlier one).
"""

from __future__ import annotations

import copy

import pytest

from clusters import catalog_spec, load_cluster, parse_spec
from executor.calibrate import (
    Calibration,
    CalibrationError,
    catalog_peaks,
    fit_gemm_curve,
    format_gemm_curve,
    gemm_bytes,
    gemm_sweep_shapes,
    measure_gemm_shapes,
    spec_dict,
)
from executor.calibrate_fit import GEMM_TILES as EXECUTOR_TILES
from executor.calibrate_fit import FitError, fit_plateau, wave_flops
from simulator.errors import SimulatorError
from simulator.op_cost import KernelCost, op_cost
from simulator.op_signature import OpSig, TensorSig
from simulator.roofline import DEFAULT_GEMM_HALF_FLOPS, GEMM_TILES, Roofline

PEAK, SMS, PLATEAU = 3.12e14, 108, 0.8
R = PEAK / SMS * PLATEAU  # FLOP/s of one SM
BW = 2.0e12 * 0.8
OVH = 5e-6


def rf(**kw) -> Roofline:
    args = dict(peak_flops={"bf16": PEAK}, gemm_efficiency=PLATEAU,
                gemm_half_flops=DEFAULT_GEMM_HALF_FLOPS, mem_bandwidth=2.0e12,
                mem_efficiency=0.8, kernel_overhead=OVH, sm_count=SMS)
    args.update(kw)
    return Roofline(**args)


def T(*shape: int) -> TensorSig:
    return TensorSig(tuple(shape), "bfloat16")


def mm(m: int, n: int, k: int) -> KernelCost:
    """The forward kernel of x[m, k] @ w[k, n] in bf16, as op_cost builds it."""
    (kc,) = op_cost(OpSig("matmul", (T(m, k), T(k, n)), (T(m, n),)))
    return kc


# -- one wave, one more row ------------------------------------------------------------------
def test_one_full_wave_of_128x128_tiles():
    """m = 128 * 108, n = 128, k = 4096: 128x128 gives 108 tiles = 1 wave, work 2*128*128*4096
    per SM. 256x128: 54 tiles, 1 wave but twice the work; 128x64, 64x128 (216 tiles, 2 waves)
    and 64x64 (432, 4 waves) and 256x64 (108, 1) tie with 128x128, which comes first."""
    t = rf().gemm_tiling((1, 128 * 108, 128, 4096), "bf16")
    assert (t.tile, t.tiles, t.waves, t.sms) == ((128, 128), 108, 1, 108)
    assert t.compute_s == pytest.approx(2 * 128 * 128 * 4096 / R)  # 58.07 us
    assert t.compute_s == pytest.approx(58.074978e-6)


def test_one_more_row_doubles_the_waves_of_128x128_and_the_model_takes_64x64():
    """m = 128 * 108 + 1: with 128x128 only, 109 tiles = 2 waves, twice the time. Over all
    tiles (S = 108): 256x128 55 tiles / 1 wave / 2*256*128*4096 = 268.4M; 128x256 109/2/536.9M;
    128x128 109/2/268.4M; 256x64 110/2/268.4M; 64x256 217/3/402.7M; 128x64 218/3/201.3M;
    64x128 217/3/201.3M; 64x64 217*2 = 434 tiles / 5 waves / 5*2*64*64*4096 = 167.8M: the
    pick, 1.25x the one-wave time."""
    only_128 = rf(gemm_tiles=((128, 128),)).gemm_tiling((1, 128 * 108 + 1, 128, 4096), "bf16")
    assert (only_128.tiles, only_128.waves) == (109, 2)
    assert only_128.compute_s == pytest.approx(2 * 2 * 128 * 128 * 4096 / R)
    t = rf().gemm_tiling((1, 128 * 108 + 1, 128, 4096), "bf16")
    assert (t.tile, t.tiles, t.waves) == ((64, 64), 434, 5)
    assert t.compute_s == pytest.approx(5 * 2 * 64 * 64 * 4096 / R)  # 72.59 us
    assert t.compute_s / rf().gemm_tiling((1, 128 * 108, 128, 4096), "bf16").compute_s == pytest.approx(1.25)


def test_kernel_time_of_a_compute_bound_gemm_and_its_wave_quantization():
    """x[13824, 4096] @ w[4096, 256] (bf16): 256x128 gives 54 * 2 = 108 tiles, one wave,
    2*256*128*4096 = 268,435,456 FLOPs per SM -> 116.15 us; bytes 2 (13824*4096 +
    4096*256 + 13824*256) = 122,421,248 -> 76.51 us, so compute-bound. One row more
    (m = 13825): 64x64 gives 217 * 4 = 868 tiles, 9 waves (8 * 108 = 864), 9*2*64*64*4096 =
    301,989,888 -> 130.67 us (9/8 of it; every larger tile needs 2 or 3 waves of more work)."""
    k = mm(13824, 256, 4096)
    assert k.gemm_shape == (1, 13824, 256, 4096)
    assert k.bytes == 122_421_248
    assert rf().kernel_time(k) == pytest.approx(268_435_456 / R + OVH)
    assert 122_421_248 / BW < 268_435_456 / R
    k1 = mm(13825, 256, 4096)
    t1 = rf().gemm_tiling(k1.gemm_shape, "bf16")
    assert (t1.tile, t1.tiles, t1.waves) == ((64, 64), 868, 9)
    assert rf().kernel_time(k1) == pytest.approx(301_989_888 / R + OVH)
    # the smooth model of a spec without sm_count charges 1 row more almost nothing
    smooth = rf(sm_count=None)
    assert smooth.kernel_time(k1) / smooth.kernel_time(k) == pytest.approx(13825 / 13824, rel=1e-4)


def test_tile_quantization_m_129():
    """n = 64 * 108 = 6912, k = 4096. m = 128: 128x64 gives 1 * 108 tiles, 1 wave,
    2*128*64*4096 = 67,108,864 -> 29.04 us (64x128: 2*54 = 108, 1 wave, ties; 64x64: 216
    tiles, 2 waves, ties; every other tile does twice the work). m = 129: rows need 3 tiles
    of 64, 2 of 128 or 1 of 256: 64x64 gives 3 * 108 = 324 tiles, 3 waves, 100,663,296 ->
    43.56 us; 128x64 (216 tiles, 2 waves), 64x128 (162, 2), 128x128 (108, 1), 256x64 (108, 1),
    256x128 (54, 1), 64x256 (81, 1) all do 134,217,728 and 128x256 twice that. So 0.8%
    more rows cost 50% more compute."""
    t128 = rf().gemm_tiling((1, 128, 6912, 4096), "bf16")
    t129 = rf().gemm_tiling((1, 129, 6912, 4096), "bf16")
    assert (t128.tile, t128.tiles, t128.waves) == ((128, 64), 108, 1)
    assert (t129.tile, t129.tiles, t129.waves) == ((64, 64), 324, 3)
    assert t128.compute_s == pytest.approx(67_108_864 / R)
    assert t129.compute_s == pytest.approx(100_663_296 / R)
    # kernel times: m = 128 reads 2 (128*4096 + 4096*6912 + 128*6912) = 59,441,152 B in
    # 37.15 us > 29.04 us (bandwidth-bound); m = 129 moves 59,463,168 B (37.16 us) < 43.56 us
    assert rf().kernel_time(mm(128, 6912, 4096)) == pytest.approx(59_441_152 / BW + OVH)
    assert rf().kernel_time(mm(129, 6912, 4096)) == pytest.approx(100_663_296 / R + OVH)


def test_batched_qkt_is_bandwidth_bound():
    """QK^T of 32 heads, s = 2048, head_dim 64: q [1, 32, 2048, 64] @ k^T -> gemm_shape
    (32, 2048, 2048, 64). Compute: 256x128 gives 32 * 8 * 16 = 4096 tiles, 38 waves (37 * 108
    = 3996), 38 * 2*256*128*64 = 159,383,552 FLOPs per SM -> 68.96 us (128x128: 8192 tiles,
    76 waves, and 64x64: 32768, 304, do the same work). Bytes: 2 (2 * 32*2048*64 +
    32*2048*2048) = 285,212,672 -> 178.26 us: bandwidth-bound, t = bytes / (bw eff) + o."""
    q = T(1, 32, 2048, 64)
    sig = OpSig("matmul", (q, q), (T(1, 32, 2048, 2048),), (("transpose_y", True),))
    (k,) = op_cost(sig)
    assert k.gemm_shape == (32, 2048, 2048, 64)
    assert k.bytes == 285_212_672
    t = rf().gemm_tiling(k.gemm_shape, "bf16")
    assert (t.tile, t.tiles, t.waves) == ((256, 128), 4096, 38)
    assert t.compute_s == pytest.approx(159_383_552 / R)
    assert rf().kernel_time(k) == pytest.approx(285_212_672 / BW + OVH)
    assert rf().kernel_time(k) == pytest.approx(183.2579e-6, rel=1e-6)


# -- fewer SMs (a collective beside the GEMM) ------------------------------------------------
def test_fewer_sms_cost_exactly_the_extra_waves():
    """x[13824, 4096] @ w[4096, 256] on 108 - 16 = 92 SMs (the per-SM rate unchanged):
    256x128 / 128x256: 108 tiles, 2 waves, 536.9M; 128x128, 256x64, 64x256: 216 tiles, 3
    waves (276 > 216 > 184), 402.7M; 128x64 and 64x128: 432 tiles, 5 waves (460), 335.5M;
    64x64: 864 tiles, 10 waves (920), 335.5M. The pick: 128x64, 5 * 2*128*64*4096 =
    335,544,320 -> 145.19 us, 1.25x the 108-SM time (not 108/92 = 1.17x)."""
    k = mm(13824, 256, 4096)
    t = rf().gemm_tiling(k.gemm_shape, "bf16", sms_available=92)
    assert (t.tile, t.tiles, t.waves, t.sms) == ((128, 64), 432, 5, 92)
    assert rf().kernel_time(k, sms_available=92) == pytest.approx(335_544_320 / R + OVH)
    assert rf().gemm_time(k, 92) == rf().kernel_time(k, sms_available=92)
    assert rf().kernel_time(k, sms_available=108) == rf().kernel_time(k)
    assert rf().kernels_time([k], sms_available=92) == {"F": pytest.approx(335_544_320 / R + OVH)}
    # memory-bound kernels beside a collective: unchanged (the hook only)
    mem = KernelCost("F", 1e6, 1e6, 4e9, "memory", "bfloat16")
    assert rf().kernel_time(mem, sms_available=92) == rf().kernel_time(mem)
    for bad in (0, 109, True, 2.5):
        with pytest.raises(SimulatorError, match="sms_available"):
            rf().kernel_time(k, sms_available=bad)
    with pytest.raises(SimulatorError, match="sm_count"):
        rf(sm_count=None).kernel_time(k, sms_available=92)
    with pytest.raises(SimulatorError, match="GEMM kernel"):
        rf().gemm_time(mem)


def test_roofline_refuses_bad_sm_counts_and_tiles():
    with pytest.raises(SimulatorError, match="sm_count"):
        rf(sm_count=0)
    with pytest.raises(SimulatorError, match="gemm_tiles"):
        rf(gemm_tiles=())
    with pytest.raises(SimulatorError, match="shape"):
        rf().gemm_tiling((1, -1, 2, 3), "bf16")
    assert rf().gemm_tiling((1, 0, 64, 64), "bf16").compute_s == 0.0


# -- shapes from op_cost ---------------------------------------------------------------------
def test_gemm_shapes_of_matmul_and_its_grads():
    """x[m, k] @ w[k, n]: forward (1, m, n, k); dX = dY w^T (1, m, k, n); dW = x^T dY
    (1, k, n, m). Activations [b, s, k] fold into the rows (one 2-D GEMM, as torch's
    at::matmul): (1, b s, n, k), dX (1, b s, k, n), dW (1, k, n, b s). Both operands
    batched (attention): the batch stays, dX (B, m, k, n), dY (B, k, n, m)."""
    x, w, dy = T(8, 16), T(16, 32), T(8, 32)
    assert mm(8, 32, 16).gemm_shape == (1, 8, 32, 16)
    grad = OpSig("matmul_grad", (x, w, dy), (x, w), weights=(False, True))
    assert [k.gemm_shape for k in op_cost(grad)] == [(1, 8, 16, 32), (1, 16, 32, 8)]
    xb, dyb = T(4, 8, 16), T(4, 8, 32)
    (f,) = op_cost(OpSig("matmul", (xb, w), (dyb,)))
    assert f.gemm_shape == (1, 32, 32, 16)
    gb = OpSig("matmul_grad", (xb, w, dyb), (xb, w), weights=(False, True))
    assert [k.gemm_shape for k in op_cost(gb)] == [(1, 32, 16, 32), (1, 16, 32, 32)]
    # QK^T: q [2, 4, 128, 64] @ k[2, 4, 128, 64]^T -> scores [2, 4, 128, 128]
    q, sc = T(2, 4, 128, 64), T(2, 4, 128, 128)
    (a,) = op_cost(OpSig("matmul", (q, q), (sc,), (("transpose_y", True),)))
    assert a.gemm_shape == (8, 128, 128, 64)
    ga = OpSig("matmul_grad", (q, q, sc), (q, q), (("transpose_y", True),))
    assert [k.gemm_shape for k in op_cost(ga)] == [(8, 128, 64, 128), (8, 64, 128, 128)]
    # a matrix times batched operands: dX sums over the batch
    (f2,) = op_cost(OpSig("matmul", (T(8, 16), T(3, 16, 32)), (T(3, 8, 32),)))
    assert f2.gemm_shape == (3, 8, 32, 16)
    g2 = OpSig("matmul_grad", (T(8, 16), T(3, 16, 32), T(3, 8, 32)), (T(8, 16), T(3, 16, 32)))
    assert [k.gemm_shape for k in op_cost(g2)] == [(1, 8, 16, 96), (3, 16, 32, 8)]
    # every shape's FLOPs are the kernel's
    for k in (*op_cost(grad), *op_cost(gb), *op_cost(ga), *op_cost(g2), f, a, f2):
        b, m, n, kk = k.gemm_shape
        assert 2 * b * m * n * kk == k.flops


# -- specs: with and without sm_count --------------------------------------------------------
def test_catalog_sm_counts_and_specs_without_them_keep_the_smooth_model():
    for name, sms in (("dgx-a100-80g", 108), ("dgx-a100-40g", 108), ("selene", 108),
                      ("zb-paper-a100", 108), ("dgx-h100", 132), ("hgx-h200", 132)):
        dev = catalog_spec(name).device
        assert dev.sm_count.value == sms and dev.sm_count.provenance
        assert Roofline.from_device(dev).sm_count == sms
    assert catalog_spec("cpu-local").device.sm_count is None
    assert Roofline.from_device(load_cluster("cpu-local").device).sm_count is None
    # selene without sm_count: a GEMM with its shape is timed as before (smooth)
    data = copy.deepcopy(catalog_spec("selene").model_dump(exclude_none=True))
    del data["device"]["sm_count"]
    dev = parse_spec(data, "no-sms").device
    smooth = Roofline.from_device(dev)
    assert smooth.sm_count is None
    k = mm(13825, 256, 4096)
    f = k.flops
    eff = dev.efficiency.gemm.value * f / (f + DEFAULT_GEMM_HALF_FLOPS)
    bw = dev.memory_bandwidth.value * dev.efficiency.memory_bandwidth.value
    expect = max(f / (dev.peak("fp16") * eff), k.bytes / bw) + dev.efficiency.kernel_overhead_s.value
    assert smooth.kernel_time(k) == pytest.approx(expect)
    # with sm_count, a GEMM kernel that carries no shape keeps the smooth model too
    waves = Roofline.from_device(catalog_spec("selene").device)
    shapeless = KernelCost("F", f, f, k.bytes, "gemm", "bfloat16", f)
    assert waves.kernel_time(shapeless) == pytest.approx(expect)
    assert waves.kernel_time(k) > expect  # 9 waves for 8.0 waves of work


def test_spec_refuses_a_bad_sm_count():
    from clusters import ClusterSpecError

    data = copy.deepcopy(catalog_spec("selene").model_dump(exclude_none=True))
    for bad in (0, 108.0, "108", True):
        data["device"]["sm_count"] = {"value": bad, "provenance": "x"}
        with pytest.raises(ClusterSpecError, match="sm_count"):
            parse_spec(data, "bad")


# -- calibration: the executor's replica of the model, the plateau fit -----------------------
def test_executor_wave_replica_matches_the_roofline():
    assert EXECUTOR_TILES == GEMM_TILES
    r = rf()
    for shape in [(1, 13825, 256, 4096), (32, 2048, 2048, 64), (1, 129, 6912, 4096),
                  (3, 1000, 777, 512), (1, 1, 1, 1), (7, 300, 5000, 64)]:
        for sms in (1, 50, 92, 108):
            work, tile, waves = wave_flops(shape, sms)
            t = r.gemm_tiling(shape, "bf16", sms)
            assert (tile, waves) == (t.tile, t.waves)
            assert work / R == pytest.approx(t.compute_s)
    with pytest.raises(FitError):
        wave_flops((1, 2, 3, 4), 0)


def _synthetic(g: float, peak: float, sms: int, bw: float) -> list:
    """The sweep as the model with plateau g would measure it (no per-kernel overhead)."""
    pts = []
    for shape in gemm_sweep_shapes(sms):
        work, _, _ = wave_flops(shape, sms)
        pts.append((shape, max(work / (peak / sms * g), gemm_bytes(shape, 2) / bw)))
    return pts


def test_fit_gemm_curve_recovers_the_plateau_and_keeps_the_curve():
    """H100-like: peak 989 TFLOP/s, 132 SMs, 3.0e12 B/s measured copy rate, plateau 0.7."""
    peak, sms, bw = 9.89e14, 132, 3.0e12
    pts = _synthetic(0.7, peak, sms, bw)
    cal = Calibration("h", "2025-01-01", 2, 1)
    assert fit_gemm_curve(cal, pts, sms, peak, bw) == pytest.approx(peak)
    assert cal.gemm_plateau == pytest.approx(0.7) and cal.sm_count == sms
    # the bandwidth-bound attention GEMMs are left out of the fit
    assert cal.gemm_plateau_samples < len(pts)
    assert all(abs(p.error) < 1e-9 for p in cal.gemm_curve)
    wave, plus = (p for p in cal.gemm_curve if p.shape[1] in (128 * sms, 128 * sms + 1))
    assert (wave.tile, wave.waves) == ((256, 128), 1)
    assert plus.model_s > 1.1 * plus.ideal_s  # the nearly empty last waves
    table = format_gemm_curve(cal)
    assert "plateau 0.700 on 132 SMs" in table and f"1 x {128 * sms + 1} x 256 x 4096" in table
    # a plateau above 1 (the peak given is below what the GPU reaches) folds into the peak
    cal2 = Calibration("h", "2025-01-01", 2, 1)
    assert fit_gemm_curve(cal2, _synthetic(1.0, peak, sms, bw), sms, peak / 1.25, bw) == pytest.approx(peak)
    assert cal2.gemm_plateau == 1.0
    with pytest.raises(CalibrationError, match="compute-bound"):
        fit_gemm_curve(Calibration("h", "d", 2, 1), [((32, 2048, 2048, 64), 1.0)], sms, peak, bw)


def test_fit_plateau_is_relative_least_squares_on_compute_bound_samples():
    """t - o = C / g: samples (C, M, t) = (1, 0.5, 2) and (2, 1, 4) give g = 0.5 exactly; a
    memory-bound one (C < M) is ignored."""
    g, n = fit_plateau([1.0, 2.0, 1.0], [0.5, 1.0, 3.0], [2.0 + 1e-3, 4.0 + 1e-3, 3.0], 1e-3)
    assert g == pytest.approx(0.5) and n == 2
    with pytest.raises(FitError, match="compute-bound"):
        fit_plateau([1.0], [2.0], [2.0])


def test_a_gpu_calibration_writes_sm_count_and_the_plateau():
    peak, sms, bw = 9.89e14, 132, 3.0e12
    cal = Calibration("gpuhost", "2025-01-01", 2, 8, memory_bandwidth=bw, kernel_overhead=1e-5,
                      memory_bytes=8e10, intra_latency=1e-5, intra_bandwidth=1e11,
                      device_name="NVIDIA H100 80GB HBM3", peak_source="catalog dgx-h100",
                      gemm_rate={"bf16": peak, "fp16": peak, "fp32": 6.7e13})
    fit_gemm_curve(cal, _synthetic(0.7, peak, sms, bw), sms, peak, bw)
    spec = parse_spec(spec_dict(cal, "gpu"), "gpu")
    d = spec.device
    assert d.name == "NVIDIA H100 80GB HBM3" and d.sm_count.value == 132
    assert d.efficiency.gemm.value == pytest.approx(0.7)
    assert "wave model" in d.efficiency.gemm.provenance and "dgx-h100" in d.peak_flops["bf16"].provenance
    r = Roofline.from_device(d)
    assert r.sm_count == 132 and r.gemm_efficiency == pytest.approx(0.7)
    # CPU calibrations (no SMs) write no sm_count and keep gemm = 1
    cpu = Calibration("cpuhost", "2025-01-01", 2, 1, memory_bandwidth=1e10, kernel_overhead=1e-5,
                      memory_bytes=8e9, intra_latency=1e-5, intra_bandwidth=1e9,
                      gemm_rate={"fp32": 1e10})
    d = parse_spec(spec_dict(cpu, "cpu"), "cpu").device
    assert d.sm_count is None and d.efficiency.gemm.value == 1.0


def test_catalog_peaks_match_by_model_and_sm_count():
    name, peaks = catalog_peaks("NVIDIA H100 80GB HBM3", 132)
    assert name == "dgx-h100" and peaks["bf16"][0] == 9.89e14
    assert catalog_peaks("NVIDIA A100-SXM4-80GB", 108)[1]["bf16"][0] == 3.12e14
    assert catalog_peaks("NVIDIA H200", 132)[0] == "hgx-h200"
    assert catalog_peaks("NVIDIA H100 PCIe", 114) is None  # 114 SMs: no catalog device
    assert catalog_peaks("NVIDIA L4", 58) is None


def test_sweep_shapes_hold_the_quantized_pairs_and_run_on_cpu():
    shapes = gemm_sweep_shapes(108)
    assert (1, 128 * 108, 256, 4096) in shapes and (1, 128 * 108 + 1, 256, 4096) in shapes
    assert (1, 128, 6912, 4096) in shapes and (1, 129, 6912, 4096) in shapes
    assert any(b > 1 for b, *_ in shapes)
    assert set(gemm_sweep_shapes(108, quick=True)) <= set(shapes)
    import torch

    got = measure_gemm_shapes([(1, 8, 8, 8), (2, 8, 4, 8)], torch.float32, 2)
    assert [s for s, _ in got] == [(1, 8, 8, 8), (2, 8, 4, 8)] and all(t > 0 for _, t in got)


def test_fit_gpu_gemm_glue_with_a_faked_gpu(monkeypatch):
    """The GPU path of ``calibrate`` without a GPU: an H100 (132 SMs) whose sweep times are
    the model's with plateau 0.75 -> sm_count 132, plateau 0.75, the catalog's peaks."""
    import types

    import torch

    import executor.calibrate as ec

    bw = 3.0e12
    pts = dict(_synthetic(0.75, 9.89e14, 132, bw))
    props = types.SimpleNamespace(multi_processor_count=132, name="NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda dev: props)
    monkeypatch.setattr(ec, "measure_gemm_shapes",
                        lambda shapes, dtype, reps, device: [(s, pts[s]) for s in shapes])
    cal = Calibration("gpuhost", "2025-01-01", 2, 8, memory_bandwidth=bw)
    ec.fit_gpu_gemm(cal, "cuda", False, 7)
    assert (cal.sm_count, cal.device_name, cal.peak_source) == (132, props.name, "catalog dgx-h100")
    assert cal.gemm_plateau == pytest.approx(0.75)
    assert cal.gemm_rate["bf16"] == pytest.approx(9.89e14) and cal.gemm_rate["fp32"] == 6.7e13
    assert len(cal.gemm_curve) == len(gemm_sweep_shapes(132))

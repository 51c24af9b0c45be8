"""Measure this machine as the executor uses it and write a cluster YAML that
``clusters.load_cluster`` reads, so predictions and measurements share one spec.

Everything is measured on ``nproc`` spawned ranks at once (torch with ``cpu_count //
nproc`` threads each, gloo between them), exactly as ``executor.run_plan`` runs a plan, so
the cores, caches and memory bus are as shared as during a plan's step; rank 0's timings
are kept. Fits: :mod:`executor.calibrate_fit`.

- Executor ops (:mod:`executor.calibrate_ops`): the executor's own interpreter runs a
  1-layer LLaMA-style training step at a few sizes and times every executed op:
  ``kernel_overhead_s`` = median time of the kernel-less ops (views: the interpreter
  loop plus one dispatch); ``peak_flops[fp32]`` and ``gemm_half_flops`` = relative
  least-squares fit of the GEMM ops to ``t = o + (F + F_half) / P`` (``efficiency.gemm``
  = 1: P is the achieved asymptote); ``efficiency.attention`` = achieved rate of the
  attention ops on executed FLOPs over P; ``efficiency.memory_kernels`` = the bytes the
  memory-bound ops move (operands + results) per second of their time beyond ``o``, over
  ``memory_bandwidth``; ``efficiency.action_overhead_s`` = median over the F/B/W unit
  calls (pipeline action passes) of the unit's wall time minus its ops' time (the
  interpreter's per-action host work outside any op); ``efficiency.by_op`` = the same two
  ratios per op type and phase
  (key ``op:phase``, e.g. ``rms_norm_grad:W``): each kernel as it really runs (several
  passes over its data, or none for a gradient passed through as a view).
- ``memory_bandwidth``: a large tensor copy (bytes read + written per second), with
  ``efficiency.memory_bandwidth`` = 1.
- Other dtypes' ``peak_flops``: square matmuls per dtype, their rate scaled by the fp32
  ratio executor-GEMM-fit / square-matmul (the same interpreter and shapes cost).
- Collectives: all_reduce, reduce_scatter, all_gather, all_to_all on groups of 2..nproc
  and p2p send/recv (the executor's own collective functions), several buffer sizes S
  up to 16 MiB (a step's fused gradient bucket; nccl-tests convention,
  ``clusters.collectives``). One joint relative least-squares fit of the group
  collectives to the single-node model ``steps a + share S / B`` gives ``intra_latency``
  a and ``intra_bandwidth`` B (bus bandwidth from collectives, as nccl-tests' busbw);
  send/recv is left out of it -- gloo's point-to-point moves a byte about 3x faster than
  its collectives, which also reduce and copy, and the plans' p2p messages are
  latency-bound -- and, with every per-kind line fit, goes into the provenance.
- memory size: physical memory / nproc. Inter-node values cannot be measured on one host
  and keep the ``cpu-local`` catalog placeholders (their provenance says so).
- On a GPU (``device="cuda"``) also the GEMM curve by shape (:func:`fit_gemm_curve`):
  ``sm_count`` = the GPU's multiprocessor count; bf16 GEMMs of a sweep of shapes
  (:func:`gemm_sweep_shapes`: large aligned ones, the layer GEMMs of a 7B model, a full
  wave of tiles and the same plus one row -- wave quantization --, m = 128 and 129 --
  tile quantization --, and the unfused attention's batched GEMMs) timed back to back
  with CUDA events (the launch hidden behind the previous kernel, so no per-kernel
  overhead); ``efficiency.gemm`` = the plateau of ``simulator.roofline``'s wave model
  fitted to the compute-bound ones (``executor.calibrate_fit.fit_plateau``) against
  ``peak_flops`` = the catalog's datasheet peaks when the GPU's name and SM count match a
  catalog device, else the fastest rate of the sweep. The measured curve vs the model's
  is kept per shape (``Calibration.gemm_curve``; ``meshplan calibrate`` prints it, the
  spec's provenance summarises it). On CPU (no SMs) none of this: no ``sm_count``, so the
  smooth size model stays.

Provenance of every measured value: ``measured on <UTC date>, <host>, load <1-min load
average>``. Measure on an otherwise idle machine: other processes on the cores inflate
every number.
"""

from __future__ import annotations

import datetime
import os
import socket
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml

from clusters import catalog_spec, list_catalog, load_cluster
from clusters.spec import parse_spec
from executor.calibrate_fit import (
    FitError,
    fit_by_op,
    fit_gemm,
    fit_links,
    fit_overhead,
    fit_plateau,
    fit_ratio,
    split_representable,
    wave_flops,
)
from executor.errors import ExecutorError

GEMM_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
#: dtype of the GPU GEMM sweep (the training dtype the catalog's plateaus describe)
SWEEP_DTYPE = "bf16"
COLLECTIVE_KINDS = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all", "send_recv")


class CalibrationError(ExecutorError, ValueError):
    """Bad calibration arguments or a measurement that produced no usable fit."""


def _sync() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def time_fn(fn: Callable[[], Any], reps: int, warmup: int = 2) -> float:
    """Median seconds of ``reps`` calls of ``fn`` after ``warmup`` calls (CUDA work is
    synchronised around each call)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        _sync()
        t0 = time.perf_counter()
        fn()
        _sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def fit_line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares ``y = slope x + intercept``. Raises CalibrationError for < 2 points."""
    import numpy as np

    if len(xs) < 2:
        raise CalibrationError(f"a line fit needs at least 2 points, got {len(xs)}")
    slope, intercept = np.polyfit(np.asarray(xs, float), np.asarray(ys, float), 1)
    return float(slope), float(intercept)


@dataclass(frozen=True)
class GemmCurvePoint:
    """One GEMM of the GPU sweep: its ``(batch, m, n, k)``, the wave model's tile and
    waves, the measured seconds, the model's ``max(compute, memory)`` seconds (no
    per-kernel overhead: the sweep hides launches) and the ideal ``max(2 b m n k / (P g),
    memory)`` without quantization, for comparison."""

    shape: tuple[int, int, int, int]
    tile: tuple[int, int]
    waves: int
    measured_s: float
    model_s: float
    ideal_s: float

    @property
    def error(self) -> float:
        """(model - measured) / measured."""
        return (self.model_s - self.measured_s) / self.measured_s


@dataclass
class Calibration:
    """Measured values (seconds, bytes, FLOP/s) and where they come from."""

    host: str
    date: str
    nproc: int
    threads: int
    load: float = 0.0
    gemm_rate: dict[str, float] = field(default_factory=dict)
    gemm_points: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    gemm_half_flops: float = 1.0
    memory_bandwidth: float = 0.0
    kernel_overhead: float = 0.0
    action_overhead: float = 0.0
    attention_efficiency: float | None = None
    memory_kernel_efficiency: float | None = None
    op_counts: dict[str, int] = field(default_factory=dict)
    by_op: dict[str, tuple[float, int]] = field(default_factory=dict)
    dropped: list[str] = field(default_factory=list)
    """``op:phase`` keys fitted below ``clusters.spec.MIN_POSITIVE`` and left out of ``by_op``
    (``calibrate_fit.split_representable``)."""
    memory_bytes: float = 0.0
    collective_fits: dict[str, tuple[float, float]] = field(default_factory=dict)
    intra_latency: float = 0.0
    intra_bandwidth: float = 0.0
    device_name: str = ""
    sm_count: int | None = None
    gemm_plateau: float = 1.0
    gemm_plateau_samples: int = 0
    peak_source: str = ""
    gemm_curve: list[GemmCurvePoint] = field(default_factory=list)

    @property
    def provenance(self) -> str:
        return f"measured on {self.date}, {self.host}, load {self.load:.2f}"


def measure_gemm(dtype: torch.dtype, sizes: list[int], reps: int,
                 device: str = "cpu") -> list[tuple[float, float]]:
    """(FLOPs, seconds) of square matmuls n x n x n (2 n^3 FLOPs) for each size."""
    out = []
    for n in sizes:
        a = torch.randn(n, n).to(dtype).to(device)
        b = torch.randn(n, n).to(dtype).to(device)
        out.append((2.0 * n**3, time_fn(lambda a=a, b=b: torch.matmul(a, b), reps)))
    return out


def gemm_sweep_shapes(sm_count: int, quick: bool = False) -> list[tuple[int, int, int, int]]:
    """``(batch, m, n, k)`` GEMMs of the GPU sweep for a device of ``sm_count`` SMs:
    large aligned ones (the plateau); llama2-7b's layer GEMMs on 8192 tokens (attention
    out 4096, fused QKV 12288, MLP 11008); ``128 S x 256 x 4096`` -- S tiles of 256x128,
    one full wave -- and the same with one row more (wave quantization); m = 128 and 129
    at n = 64 S (tile quantization); the unfused attention's QK^T and scores x V (32
    heads, s 2048, head_dim 128 and 64: bandwidth-bound)."""
    big = [(1, 4096, 4096, 4096), (1, 8192, 8192, 8192)]
    layer = [(1, 8192, 4096, 4096), (1, 8192, 12288, 4096), (1, 8192, 11008, 4096)]
    wave = [(1, 128 * sm_count, 256, 4096), (1, 128 * sm_count + 1, 256, 4096)]
    tile = [(1, 128, 64 * sm_count, 4096), (1, 129, 64 * sm_count, 4096)]
    attn = [(32, 2048, 2048, 128), (32, 2048, 128, 2048), (32, 2048, 2048, 64)]
    if quick:
        return big[:1] + layer[1:2] + wave + tile + attn[:1]
    return big + layer + wave + tile + attn


def gemm_bytes(shape: tuple[int, int, int, int], elem: int) -> float:
    """A + B read + C written of a ``(batch, m, n, k)`` GEMM whose operands both carry
    the batch (``simulator.op_cost``'s count): ``elem * batch * (m k + k n + m n)``."""
    b, m, n, k = shape
    return float(elem * b * (m * k + k * n + m * n))


def time_device(fn: Callable[[], Any], reps: int, device: str, warmup: int = 3) -> float:
    """Mean seconds per call of ``fn`` run ``reps`` times back to back: on CUDA between
    two events (kernel time, launches overlapped with the previous kernel), elsewhere
    :func:`time_fn` (median, synchronised)."""
    if device == "cpu" or not torch.cuda.is_available():
        return time_fn(fn, reps, warmup)
    for _ in range(warmup):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / reps


def measure_gemm_shapes(shapes: list[tuple[int, int, int, int]], dtype: torch.dtype, reps: int,
                        device: str = "cpu") -> list[tuple[tuple[int, int, int, int], float]]:
    """(shape, seconds) of ``x[batch, m, k] @ y[batch, k, n]`` per ``(batch, m, n, k)``
    (``torch.mm`` for batch 1, ``torch.bmm`` otherwise; :func:`time_device`)."""
    out = []
    for shape in shapes:
        b, m, n, k = shape
        x = torch.randn(b, m, k, device=device).to(dtype)
        y = torch.randn(b, k, n, device=device).to(dtype)
        if b == 1:
            x, y = x[0], y[0]

        def fn(x: torch.Tensor = x, y: torch.Tensor = y) -> torch.Tensor:
            return torch.mm(x, y) if x.ndim == 2 else torch.bmm(x, y)

        out.append((shape, time_device(fn, reps, device)))
        del x, y, fn
    return out


def catalog_peaks(device_name: str, sm_count: int) -> tuple[str, dict[str, tuple[float, str]]] | None:
    """(catalog name, dtype -> (peak FLOP/s, its provenance)) of the first catalog device
    with this ``sm_count`` whose model (its name up to the first ``-``, e.g. ``A100``,
    ``H100``, ``H200``) appears in ``device_name`` (torch's, e.g. ``NVIDIA H100 80GB
    HBM3``); None when none matches."""
    for name in list_catalog():
        dev = catalog_spec(name).device
        model = dev.name.split("-")[0].lower()
        if dev.sm_count is None or dev.sm_count.value != sm_count or not model:
            continue
        if model in device_name.lower():
            return name, {k: (v.value, v.provenance) for k, v in dev.peak_flops.items()}
    return None


def fit_gemm_curve(cal: Calibration, points: list[tuple[tuple[int, int, int, int], float]],
                   sm_count: int, peak: float, mem_bandwidth: float, elem: int = 2,
                   o: float = 0.0) -> float:
    """Fit the plateau of the wave model to the sweep and keep the curve: per shape, the
    compute seconds at plateau 1, ``C = W / (peak / sm_count)`` (``W`` from
    :func:`executor.calibrate_fit.wave_flops`), and the memory seconds ``M = bytes /
    mem_bandwidth``; ``g`` = :func:`executor.calibrate_fit.fit_plateau`. A ``g`` above 1
    (``peak`` below what the GPU reaches) is folded into the returned peak, ``g`` = 1.
    Sets ``cal.sm_count``, ``cal.gemm_plateau``, ``cal.gemm_plateau_samples`` and
    ``cal.gemm_curve``; returns the peak FLOP/s to write. Raises CalibrationError when no
    sample is compute-bound."""
    per_sm = peak / sm_count
    waves = [wave_flops(shape, sm_count) for shape, _ in points]
    comp = [w / per_sm for w, _, _ in waves]
    mem = [gemm_bytes(shape, elem) / mem_bandwidth for shape, _ in points]
    try:
        g, used = fit_plateau(comp, mem, [t for _, t in points], o)
    except FitError as e:
        raise CalibrationError(str(e)) from None
    if g > 1.0:
        peak, comp, g = peak * g, [c / g for c in comp], 1.0
    cal.sm_count, cal.gemm_plateau, cal.gemm_plateau_samples = sm_count, g, used
    cal.gemm_curve = []
    for (shape, t), c, mm, (_, tile, nw) in zip(points, comp, mem, waves, strict=True):
        b, m, n, k = shape
        ideal = max(2.0 * b * m * n * k / (peak * g), mm)
        cal.gemm_curve.append(GemmCurvePoint(shape, tile, nw, t, max(c / g, mm), ideal))
    return peak


def format_gemm_curve(cal: Calibration) -> str:
    """The GPU GEMM sweep of a calibration (``executor.calibrate.Calibration``): per shape
    the wave model's tile and waves, measured and modelled microseconds (``max(compute,
    memory)``, launches hidden) and the ideal time without quantization."""
    head = (f"  GEMM plateau {cal.gemm_plateau:.3f} on {cal.sm_count} SMs "
            f"(peak from {cal.peak_source}); measured vs wave model:")
    rows = [f"    {'batch x m x n x k':>26} {'tile':>8} {'waves':>6} {'measured':>10} "
            f"{'model':>10} {'no-quant':>10} {'error':>7}"]
    for pt in cal.gemm_curve:
        shape = " x ".join(str(d) for d in pt.shape)
        tile = f"{pt.tile[0]}x{pt.tile[1]}"
        rows.append(f"    {shape:>26} {tile:>8} {pt.waves:>6} {pt.measured_s * 1e6:>8.1f}us "
                    f"{pt.model_s * 1e6:>8.1f}us {pt.ideal_s * 1e6:>8.1f}us {pt.error:>+7.1%}")
    return "\n".join([head, *rows])


def measure_memory_bandwidth(nbytes: int, reps: int, device: str = "cpu") -> float:
    """Bytes/s of ``dst.copy_(src)`` on float32 tensors of ``nbytes`` (read + write)."""
    src = torch.randn(nbytes // 4).to(device)
    dst = torch.empty_like(src)
    return 2.0 * src.numel() * 4 / time_fn(lambda: dst.copy_(src), reps)


@dataclass(frozen=True)
class Settings:
    """What to measure (see :func:`settings`)."""

    trace_sizes: tuple
    trace_steps: int
    gemm_sizes: tuple[int, ...]
    dtypes: tuple[str, ...]
    reps: int
    copy_bytes: int
    comm_sizes: tuple[int, ...]
    comm_iters: int


def settings(quick: bool, device: str = "cpu") -> Settings:
    """Quick (a few seconds, for tests) or full measurement settings."""
    from executor.calibrate_ops import FULL_SIZES, QUICK_SIZES

    gemm = (64, 128, 256) if quick else (128, 256, 384, 512, 768)
    if device != "cpu":
        gemm = (512, 1024, 2048, 4096) if quick else (512, 1024, 2048, 4096, 8192)
    return Settings(
        trace_sizes=QUICK_SIZES if quick else FULL_SIZES, trace_steps=3 if quick else 7,
        gemm_sizes=gemm, dtypes=("fp32", "bf16") if quick else ("fp32", "bf16", "fp16"),
        reps=3 if quick else 7, copy_bytes=(16 if quick else 64) << 20,
        comm_sizes=(1 << 12, 1 << 16, 1 << 18, 1 << 20) if quick else tuple(1 << k for k in range(10, 25, 2)),
        comm_iters=3 if quick else 10)


def compute_worker(st: Settings, device: str = "cpu") -> dict[str, Any]:
    """Op traces, square GEMMs per dtype and the copy bandwidth, in this process."""
    from executor.calibrate_ops import trace_layer

    ops = [s for size in st.trace_sizes for s in trace_layer(size, st.trace_steps, device)]
    gemm = {n: measure_gemm(GEMM_DTYPES[n], list(st.gemm_sizes), st.reps, device) for n in st.dtypes}
    return {"ops": ops, "gemm": gemm, "copy": measure_memory_bandwidth(st.copy_bytes, st.reps, device)}


def calibration_worker(rank: int, nproc: int, st: Settings, device: str) -> dict[str, Any] | None:
    """Per-rank body under ``executor.launch``: every rank measures compute at once (CPU),
    then the collectives; rank 0 returns everything."""
    import torch.distributed as dist

    from executor.calibrate_comm import collective_worker

    dist.barrier()
    comp = compute_worker(st) if device == "cpu" else {}
    dist.barrier()
    comm = collective_worker(rank, nproc, list(st.comm_sizes), st.comm_iters, st.reps)
    return {**comp, "comm": comm} if rank == 0 else None


def _fit_compute(cal: Calibration, ops: list, gemm: dict, copy_bw: float) -> None:
    by = {k: [s for s in ops if s.kind == k]
          for k in ("view", "gemm", "attention", "memory", "action")}
    cal.op_counts = {k: len(v) for k, v in by.items()}
    try:
        o = fit_overhead([s.seconds for s in by["view"]])
        rate, half = fit_gemm([s.flops for s in by["gemm"]], [s.seconds for s in by["gemm"]], o)
        cal.memory_bandwidth = copy_bw
        mem = fit_ratio([s.bytes for s in by["memory"]], [s.seconds for s in by["memory"]], o,
                        "memory-bound ops")
        attn = fit_ratio([s.flops for s in by["attention"]], [s.seconds for s in by["attention"]],
                         o, "attention ops")
    except FitError as e:
        raise CalibrationError(str(e)) from None
    cal.kernel_overhead, cal.gemm_half_flops = o, half
    if by["action"]:  # per F/B/W pass: unit wall minus its ops' time (median)
        cal.action_overhead = statistics.median(s.seconds for s in by["action"])
    cal.memory_kernel_efficiency = min(mem / copy_bw, 1.0)
    cal.attention_efficiency = min(attn / rate, 1.0)
    cal.by_op, cal.dropped = split_representable(
        fit_by_op(by["memory"] + by["attention"], o, copy_bw, rate))
    cal.gemm_points = gemm
    square_fp32 = max(f / t for f, t in gemm["fp32"])
    for name, pts in gemm.items():  # other dtypes: square-matmul rate x executor/square fp32
        cal.gemm_rate[name] = max(f / t for f, t in pts) * rate / square_fp32
    cal.gemm_rate["fp32"] = rate


def fit_gpu_gemm(cal: Calibration, device: str, quick: bool, reps: int) -> None:
    """The GPU's SM count, the bf16 sweep and the plateau fit (module docstring)."""
    props = torch.cuda.get_device_properties(torch.device(device))
    sms = int(props.multi_processor_count)
    cal.device_name = str(props.name)
    points = measure_gemm_shapes(gemm_sweep_shapes(sms, quick), GEMM_DTYPES[SWEEP_DTYPE],
                                 max(reps, 10), device)
    match = catalog_peaks(cal.device_name, sms)
    if match is not None:
        name, peaks = match
        peak = peaks.get(SWEEP_DTYPE, max(peaks.values()))[0]
        cal.peak_source = f"catalog {name}"
    else:
        peak = max(2.0 * b * m * n * k / t for (b, m, n, k), t in points)
        cal.peak_source = "fastest GEMM of the sweep"
    peak = fit_gemm_curve(cal, points, sms, peak, cal.memory_bandwidth)
    if match is not None:  # the datasheet peaks of every dtype the catalog lists
        cal.gemm_rate = {k: v for k, (v, _) in match[1].items()}
    cal.gemm_rate[SWEEP_DTYPE] = peak


def _fit_comm(cal: Calibration, points: dict[str, list[tuple[float, float]]]) -> None:
    for key, pts in sorted(points.items()):
        beta, alpha = fit_line([s for s, _ in pts], [t for _, t in pts])
        cal.collective_fits[key] = (alpha, beta)
    try:
        cal.intra_latency, cal.intra_bandwidth = fit_links(
            {k: v for k, v in points.items() if not k.startswith("send_recv")})
    except FitError as e:
        raise CalibrationError(f"{e}; rerun without --quick") from None


def calibration_phases(device: str = "cpu") -> list[str]:
    """The phases :func:`calibrate` reports to ``on_phase``, in order (what a progress bar
    counts): the ranks' measurements, on a GPU its compute timings, the compute fit, on a
    GPU the GEMM sweep, the collective fit."""
    gpu = device != "cpu"
    return (["ops, GEMMs and collectives timed on the ranks"] + (["GPU compute timed"] if gpu else [])
            + ["compute constants fitted"] + (["GPU GEMM sweep fitted"] if gpu else [])
            + ["collective constants fitted"])


def calibrate(nproc: int = 2, quick: bool = False, backend: str = "gloo",
              device: str = "cpu", on_phase: Any = None) -> Calibration:
    """Measure this machine (module docstring). ``quick`` uses fewer sizes and repeats
    (a few seconds; for tests); ``device="cuda"`` measures compute on the GPU in this
    process (collectives still on ``nproc`` ``backend`` ranks). ``on_phase(name)`` is
    called as each phase of :func:`calibration_phases` ends. Raises CalibrationError
    for nproc < 2 or a failed fit, LaunchError / RankFailure from the ranks."""
    from executor.launch import launch

    phases = iter(calibration_phases(device))

    def done() -> None:
        name = next(phases)
        if on_phase is not None:
            on_phase(name)

    if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 2:
        raise CalibrationError(f"calibrate needs nproc >= 2 to time collectives, got {nproc!r}")
    threads = max(1, (os.cpu_count() or 1) // nproc)
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    cal = Calibration(socket.gethostname(), date, nproc, threads, load=os.getloadavg()[0])
    st = settings(quick, device)
    res = launch(calibration_worker, nproc, args=(st, device), backend=backend, timeout=900)[0]
    done()
    if device != "cpu":
        old = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            res.update(compute_worker(st, device))
        finally:
            torch.set_num_threads(old)
        done()
    _fit_compute(cal, res["ops"], res["gemm"], res["copy"])
    done()
    if device != "cpu":
        fit_gpu_gemm(cal, device, quick, st.reps)
        done()
    pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    cal.memory_bytes = float(pages) / nproc
    _fit_comm(cal, res["comm"])
    done()
    return cal


def _q(value: float, provenance: str) -> dict[str, Any]:
    return {"value": float(value), "provenance": provenance}


def _device_spec(cal: Calibration) -> dict[str, Any]:
    p = cal.provenance
    per = f"{p} ({cal.threads} torch threads per rank, {cal.nproc} ranks measuring at once)"
    ops = ", ".join(f"{v} {k}" for k, v in cal.op_counts.items())
    trace = f"{per}: executor interpreter on 1-layer LLaMA training steps ({ops} op samples)"
    squares = {k: [round((f / 2) ** (1 / 3)) for f, _ in pts] for k, pts in cal.gemm_points.items()}
    gemm = _q(1.0, f"{p}: 1 because peak_flops is the achieved GEMM asymptote")
    if cal.sm_count is not None and cal.gemm_curve:
        errs = sorted(abs(pt.error) for pt in cal.gemm_curve)
        gemm = _q(cal.gemm_plateau, f"{p}: plateau of the wave model (simulator/roofline.py, "
                                    f"{cal.sm_count} SMs) fitted to {cal.gemm_plateau_samples} "
                                    f"compute-bound {SWEEP_DTYPE} GEMMs of a {len(errs)}-shape sweep "
                                    f"(executor/calibrate.py) against peak_flops from "
                                    f"{cal.peak_source}; |model - measured| median "
                                    f"{statistics.median(errs):.1%}, max {errs[-1]:.1%}")
    eff: dict[str, Any] = {
        "gemm": gemm,
        "memory_bandwidth": _q(1.0, f"{p}: 1 because memory_bandwidth is measured"),
        "kernel_overhead_s": _q(cal.kernel_overhead, f"{trace}: median time of kernel-less ops "
                                                     f"(interpreter loop + one dispatch)"),
        "gemm_half_flops": _q(cal.gemm_half_flops, f"{trace}: GEMM fit t = o + (F + F_half)/P"),
        "action_overhead_s": _q(cal.action_overhead, f"{trace}: median over F/B/W unit calls of "
                                                     f"unit wall time minus its ops' time "
                                                     f"(per-action host work outside ops)"),
    }
    if cal.attention_efficiency is not None:
        eff["attention"] = _q(cal.attention_efficiency, f"{trace}: attention executed FLOP/s "
                                                        f"beyond o, over peak_flops fp32")
    if cal.memory_kernel_efficiency is not None:
        eff["memory_kernels"] = _q(cal.memory_kernel_efficiency,
                                   f"{trace}: memory-bound ops' (operands + results) bytes/s "
                                   f"beyond o, over memory_bandwidth")
    if cal.by_op:
        eff["by_op"] = {k: _q(v, f"{trace}: {k.split(':')[0]} ({n} samples, phase "
                                 f"{k.split(':')[1]}): bytes/s (memory-bound; FLOP/s for "
                                 f"attention) beyond o, over memory_bandwidth (peak_flops fp32)")
                        for k, (v, n) in sorted(cal.by_op.items())}
    flops = {}
    for k, v in cal.gemm_rate.items():
        how = ("GEMM fit t = o + (F + F_half)/P over the executor's matmul ops" if k == "fp32" else
               f"best square matmul {squares.get(k)} x (executor fp32 fit / best fp32 square matmul)")
        if cal.sm_count is not None and (cal.peak_source.startswith("catalog") or k == SWEEP_DTYPE):
            how = (f"datasheet peak from the {cal.peak_source} spec ({cal.device_name} with "
                   f"{cal.sm_count} SMs matches its device)" if cal.peak_source.startswith("catalog")
                   else "fastest GEMM of the sweep (no catalog device matches this GPU)")
            how += ", x plateau fit if it exceeded 1" if k == SWEEP_DTYPE else ""
        flops[k] = _q(v, f"{per}: {how}")
    out: dict[str, Any] = {
        "name": cal.device_name or f"cpu ({cal.host})",
        "peak_flops": flops,
        "memory_bytes": _q(cal.memory_bytes, f"{p}: physical memory / {cal.nproc} ranks"),
        "memory_bandwidth": _q(cal.memory_bandwidth, f"{per}: tensor copy, read + write bytes/s"),
        "efficiency": eff,
    }
    if cal.sm_count is not None:
        out["sm_count"] = {"value": int(cal.sm_count),
                           "provenance": f"{p}: torch.cuda.get_device_properties()"
                                         f".multi_processor_count of {cal.device_name}"}
    return out


def spec_dict(cal: Calibration, name: str) -> dict[str, Any]:
    """The cluster spec mapping of a calibration (validated by ``clusters.parse_spec``)."""
    p = cal.provenance
    fits = "; ".join(f"{k} alpha={a:.3g}s beta={b:.3g}s/B" for k, (a, b) in sorted(cal.collective_fits.items()))
    base = load_cluster("cpu-local").spec
    joint = (f"{p}: joint relative least-squares fit of the executor's gloo collectives "
             f"(all_reduce, reduce_scatter, all_gather, all_to_all; not send_recv) to "
             f"steps*a + share*S/B (clusters.collectives); per-kind lines [{fits}]")
    spec = {
        "name": name,
        "description": f"{cal.host}: {cal.nproc} gloo ranks, calibrated by meshplan calibrate on {cal.date}",
        "device": _device_spec(cal),
        "node": {
            "devices_per_node": {"value": cal.nproc, "provenance": f"{p}: ranks calibrated"},
            "intra_bandwidth": _q(cal.intra_bandwidth, joint),
            "intra_latency": _q(cal.intra_latency, f"{p}: the same joint fit (a)"),
            "nic_count": {"value": base.node.nic_count.value, "provenance": "not measured (one host): cpu-local placeholder"},
            "nic_bandwidth": _q(base.node.nic_bandwidth.value, "not measured (one host): cpu-local placeholder"),
            "collective_model": {"value": "alpha-beta", "provenance": f"{p}: gloo collectives, fitted to steps*a + share*S/B"},
        },
        "cluster": {
            "num_nodes": {"value": 1, "provenance": f"{p}: this host only"},
            "inter_latency": _q(base.cluster.inter_latency.value, "not measured (one host): cpu-local placeholder"),
        },
    }
    parse_spec(spec, name)
    return spec


def write_cluster_yaml(cal: Calibration, path: str | Path, name: str | None = None) -> Path:
    """Write the calibration as a cluster YAML file; returns the path."""
    p = Path(path)
    spec = spec_dict(cal, name or p.stem)
    header = f"# Written by `meshplan calibrate` ({cal.provenance}); see executor/calibrate.py.\n"
    p.write_text(header + yaml.safe_dump(spec, sort_keys=False, width=200))
    return p

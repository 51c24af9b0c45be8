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

from clusters import load_cluster
from clusters.spec import parse_spec
from executor.calibrate_fit import (
    FitError,
    fit_by_op,
    fit_gemm,
    fit_links,
    fit_overhead,
    fit_ratio,
)
from executor.errors import ExecutorError

GEMM_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
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
    memory_bytes: float = 0.0
    collective_fits: dict[str, tuple[float, float]] = field(default_factory=dict)
    intra_latency: float = 0.0
    intra_bandwidth: float = 0.0

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
    cal.by_op = fit_by_op(by["memory"] + by["attention"], o, copy_bw, rate)
    cal.gemm_points = gemm
    square_fp32 = max(f / t for f, t in gemm["fp32"])
    for name, pts in gemm.items():  # other dtypes: square-matmul rate x executor/square fp32
        cal.gemm_rate[name] = max(f / t for f, t in pts) * rate / square_fp32
    cal.gemm_rate["fp32"] = rate


def _fit_comm(cal: Calibration, points: dict[str, list[tuple[float, float]]]) -> None:
    for key, pts in sorted(points.items()):
        beta, alpha = fit_line([s for s, _ in pts], [t for _, t in pts])
        cal.collective_fits[key] = (alpha, beta)
    try:
        cal.intra_latency, cal.intra_bandwidth = fit_links(
            {k: v for k, v in points.items() if not k.startswith("send_recv")})
    except FitError as e:
        raise CalibrationError(f"{e}; rerun without --quick") from None


def calibrate(nproc: int = 2, quick: bool = False, backend: str = "gloo",
              device: str = "cpu") -> Calibration:
    """Measure this machine (module docstring). ``quick`` uses fewer sizes and repeats
    (a few seconds; for tests); ``device="cuda"`` measures compute on the GPU in this
    process (collectives still on ``nproc`` ``backend`` ranks). Raises CalibrationError
    for nproc < 2 or a failed fit, LaunchError / RankFailure from the ranks."""
    from executor.launch import launch

    if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 2:
        raise CalibrationError(f"calibrate needs nproc >= 2 to time collectives, got {nproc!r}")
    threads = max(1, (os.cpu_count() or 1) // nproc)
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    cal = Calibration(socket.gethostname(), date, nproc, threads, load=os.getloadavg()[0])
    st = settings(quick, device)
    res = launch(calibration_worker, nproc, args=(st, device), backend=backend, timeout=900)[0]
    if device != "cpu":
        old = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            res.update(compute_worker(st, device))
        finally:
            torch.set_num_threads(old)
    _fit_compute(cal, res["ops"], res["gemm"], res["copy"])
    pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    cal.memory_bytes = float(pages) / nproc
    _fit_comm(cal, res["comm"])
    return cal


def _q(value: float, provenance: str) -> dict[str, Any]:
    return {"value": float(value), "provenance": provenance}


def _device_spec(cal: Calibration) -> dict[str, Any]:
    p = cal.provenance
    per = f"{p} ({cal.threads} torch threads per rank, {cal.nproc} ranks measuring at once)"
    ops = ", ".join(f"{v} {k}" for k, v in cal.op_counts.items())
    trace = f"{per}: executor interpreter on 1-layer LLaMA training steps ({ops} op samples)"
    squares = {k: [round((f / 2) ** (1 / 3)) for f, _ in pts] for k, pts in cal.gemm_points.items()}
    eff: dict[str, Any] = {
        "gemm": _q(1.0, f"{p}: 1 because peak_flops is the achieved GEMM asymptote"),
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
        flops[k] = _q(v, f"{per}: {how}")
    return {
        "name": f"cpu ({cal.host})",
        "peak_flops": flops,
        "memory_bytes": _q(cal.memory_bytes, f"{p}: physical memory / {cal.nproc} ranks"),
        "memory_bandwidth": _q(cal.memory_bandwidth, f"{per}: tensor copy, read + write bytes/s"),
        "efficiency": eff,
    }


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

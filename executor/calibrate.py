"""Measure this machine and write a cluster YAML that ``clusters.load_cluster`` reads.

What is measured (per rank: torch runs with ``cpu_count // nproc`` threads, as executor
ranks do):

- GEMM: square matmuls of several sizes per dtype (fp32, bf16; fp16 too unless quick).
  The simulator's roofline (``simulator.roofline``) predicts a GEMM of F FLOPs in
  ``t = F / (P g F / (F + F_half)) + o = F / (P g) + F_half / (P g) + o``: a line in F.
  A least-squares line through the (F, t) points gives ``P g`` = 1 / slope (written as
  ``peak_flops[dtype]`` with ``efficiency.gemm = 1``: the measured asymptote, efficiency
  folded in) and ``F_half = (intercept - o) / slope`` (fp32 fit, at least 1 FLOP).
- memory bandwidth: a large tensor copy (bytes read + written per second), written as
  ``memory_bandwidth`` with ``efficiency.memory_bandwidth = 1``.
- kernel overhead ``o``: seconds per op of a width-1 MLP training step run by the
  executor's interpreter (dispatch, bookkeeping and the tiny kernel: what each executed op
  pays on top of its roofline time).
- collectives: all_reduce, reduce_scatter, all_gather, all_to_all on groups of 2..nproc
  ranks and send/recv between two ranks, over several buffer sizes S (nccl-tests
  convention, see ``clusters.collectives``). Each (kind, n) gets ``t = alpha + beta S`` by
  least squares. The spec has one intra-node latency ``a`` and bandwidth ``B``; the model
  of ``clusters.collectives`` gives each kind's alpha and beta in terms of them (ring
  all_reduce: alpha = 2(n-1) a, beta = 2(n-1)/(n B); reduce_scatter / all_gather /
  all_to_all: alpha = (n-1) a, beta = (n-1)/(n B); send_recv: alpha = a, beta = 1/B), so
  every fit yields one estimate of a and of B; the spec gets their medians, and the
  per-kind fits are listed in the provenance.
- memory size: physical memory / nproc. Inter-node values cannot be measured on one host
  and keep the ``cpu-local`` catalog placeholders (their provenance says so).

Provenance of every measured value: ``measured on <UTC date>, <host>``.
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

import numpy as np
import torch
import yaml

from clusters import load_cluster
from clusters.spec import parse_spec

GEMM_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
COLLECTIVE_KINDS = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all", "send_recv")


class CalibrationError(ValueError):
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
    gemm_rate: dict[str, float] = field(default_factory=dict)
    gemm_points: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    gemm_half_flops: float = 1.0
    memory_bandwidth: float = 0.0
    kernel_overhead: float = 0.0
    memory_bytes: float = 0.0
    collective_fits: dict[str, tuple[float, float]] = field(default_factory=dict)
    intra_latency: float = 0.0
    intra_bandwidth: float = 0.0

    @property
    def provenance(self) -> str:
        return f"measured on {self.date}, {self.host}"


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


def measure_kernel_overhead(reps: int) -> float:
    """Seconds per executed op of a tiny program (the seed MLP at width 1, forward +
    backward + sgd) run by the executor's interpreter in this process: the dispatch cost
    each op pays on top of its roofline time."""
    from completion import append_backward, apply_optimizer, build_mlp
    from executor.collectives import Groups
    from executor.rank_exec import RankExecutor
    from executor.rank_plan import build_rank_plan
    from simulator.schedules import Action

    prog = build_mlp(batch_size=1, in_features=1, hidden=1, out_features=1)
    append_backward(prog)
    apply_optimizer(prog, "sgd", learning_rate=0.1)
    plan = build_rank_plan(prog, 0)
    ex = RankExecutor(plan, Groups([]), batch=1, num_microbatches=1)
    actions = [Action("F", 0, 0, 0), Action("BW", 0, 0, 0)]
    n_ops = sum(len(items) for items in plan.units.values()) + len(plan.sources)
    return time_fn(lambda: ex.run_step(actions), reps, warmup=5) / max(n_ops, 1)


def _fit_gemm(cal: Calibration) -> None:
    for name, pts in cal.gemm_points.items():
        slope, intercept = fit_line([f for f, _ in pts], [t for _, t in pts])
        best = max(f / t for f, t in pts)
        # a noisy non-positive slope falls back to the best observed rate
        cal.gemm_rate[name] = 1.0 / slope if slope > 0 else best
        if name == "fp32" and slope > 0:
            cal.gemm_half_flops = max((intercept - cal.kernel_overhead) / slope, 1.0)


def _fit_links(cal: Calibration, points: dict[str, list[tuple[float, float]]]) -> None:
    from executor.calibrate_comm import link_estimates

    lats, bws = [], []
    for key, pts in sorted(points.items()):
        kind, n = key.split("/")
        beta, alpha = fit_line([s for s, _ in pts], [t for _, t in pts])
        cal.collective_fits[key] = (alpha, beta)
        a, b = link_estimates(kind, int(n), alpha, beta)
        lats.append(a)
        if np.isfinite(b):
            bws.append(b)
    if not bws:
        raise CalibrationError("no collective fit gave a positive bandwidth; rerun without --quick")
    cal.intra_latency = float(statistics.median(lats))
    cal.intra_bandwidth = float(statistics.median(bws))


def calibrate(nproc: int = 2, quick: bool = False, backend: str = "gloo",
              device: str = "cpu") -> Calibration:
    """Measure this machine (module docstring). ``quick`` uses fewer sizes and repeats
    (a few seconds; for tests); ``device="cuda"`` times GEMMs and memory bandwidth on the
    GPU (collectives still on ``nproc`` ``backend`` ranks). Raises CalibrationError for nproc < 2, LaunchError /
    RankFailure from the collective run."""
    from executor.calibrate_comm import collective_worker
    from executor.launch import launch

    if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 2:
        raise CalibrationError(f"calibrate needs nproc >= 2 to time collectives, got {nproc!r}")
    threads = max(1, (os.cpu_count() or 1) // nproc)
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    cal = Calibration(socket.gethostname(), date, nproc, threads)
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        reps = 3 if quick else 7
        cal.kernel_overhead = measure_kernel_overhead(20 if quick else 200)
        sizes = [64, 128, 192, 256] if quick else [128, 256, 384, 512, 768, 1024]
        if device != "cpu":
            sizes = [512, 1024, 2048, 4096] if quick else [512, 1024, 2048, 4096, 8192]
        dtypes = ("fp32", "bf16") if quick else ("fp32", "bf16", "fp16")
        for name in dtypes:
            cal.gemm_points[name] = measure_gemm(GEMM_DTYPES[name], sizes, reps, device)
        _fit_gemm(cal)
        cal.memory_bandwidth = measure_memory_bandwidth((16 if quick else 128) << 20, reps, device)
    finally:
        torch.set_num_threads(old)
    pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    cal.memory_bytes = float(pages) / nproc
    sizes_b = [1 << 12, 1 << 16, 1 << 18, 1 << 20] if quick else [1 << k for k in range(10, 25, 2)]
    points = launch(collective_worker, nproc, args=(sizes_b, 3 if quick else 10, reps),
                    backend=backend, timeout=600)[0]
    _fit_links(cal, points)
    return cal


def _q(value: float, provenance: str) -> dict[str, Any]:
    return {"value": float(value), "provenance": provenance}


def spec_dict(cal: Calibration, name: str) -> dict[str, Any]:
    """The cluster spec mapping of a calibration (validated by ``clusters.parse_spec``)."""
    p = cal.provenance
    fits = "; ".join(f"{k} alpha={a:.3g}s beta={b:.3g}s/B" for k, (a, b) in sorted(cal.collective_fits.items()))
    base = load_cluster("cpu-local").spec
    per = f"{p} ({cal.threads} torch threads per rank)"
    spec = {
        "name": name,
        "description": f"{cal.host}: {cal.nproc} gloo ranks, calibrated by meshplan calibrate on {cal.date}",
        "device": {
            "name": f"cpu ({cal.host})",
            "peak_flops": {k: _q(v, f"{per}: least-squares GEMM rate, matmul sizes "
                                    f"{[round((f / 2) ** (1 / 3)) for f, _ in cal.gemm_points[k]]}")
                           for k, v in cal.gemm_rate.items()},
            "memory_bytes": _q(cal.memory_bytes, f"{p}: physical memory / {cal.nproc} ranks"),
            "memory_bandwidth": _q(cal.memory_bandwidth, f"{per}: tensor copy, read + write bytes/s"),
            "efficiency": {
                "gemm": _q(1.0, f"{p}: 1 because peak_flops is the measured asymptote"),
                "memory_bandwidth": _q(1.0, f"{p}: 1 because memory_bandwidth is measured"),
                "kernel_overhead_s": _q(cal.kernel_overhead, f"{p}: seconds per op of a width-1 MLP step in the executor"),
                "gemm_half_flops": _q(cal.gemm_half_flops, f"{p}: fp32 GEMM line fit intercept"),
            },
        },
        "node": {
            "devices_per_node": {"value": cal.nproc, "provenance": f"{p}: ranks calibrated"},
            "intra_bandwidth": _q(cal.intra_bandwidth, f"{p}: median B over gloo fits [{fits}]"),
            "intra_latency": _q(cal.intra_latency, f"{p}: median per-step alpha over the same fits"),
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

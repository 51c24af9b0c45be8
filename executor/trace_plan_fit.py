"""Fit the cost model's constants to the plan-matched samples of an executor trace
(``executor.trace_match``) and write them into a cluster spec.

The samples are the plan's own executed ops, so the constants are the ones
``meshplan calibrate`` measures on its calibration program (``executor.calibrate``), here
measured on the plan's real step; the fits are the same (``executor.calibrate_fit``):

- ``kernel_overhead_s`` ``o``: median seconds of the kernel-less ops (views);
- GEMM: ``t = o + (F + F_half) / P``: ``F_half`` (the curve's shape) from the relative
  fit (:func:`~executor.calibrate_fit.fit_gemm`) to the mean time of each distinct GEMM
  (:func:`gemm_groups`), then ``P = sum(F + F_half) / sum(t - o)`` over every GEMM, the
  rate this plan's GEMMs achieved together (time-weighted, as the memory-bound and
  attention rates: on a shared host a GEMM now and then waits for the core, and the
  relative fit alone would follow the undisturbed ones and miss that time, which the
  timed steps hold too);
- memory-bound ops: achieved bytes/s beyond ``o`` (:func:`~executor.calibrate_fit.fit_ratio`;
  ``efficiency.memory_kernels``) and per ``op:phase`` (``efficiency.by_op``), over the
  spec's ``memory_bandwidth``;
- attention: executed FLOP/s beyond ``o``, overall (``efficiency.attention``) and per
  ``op:phase`` (``by_op``), over the spec's ``peak_flops[dtype]``;
- ``action_overhead_s``: mean over the unit calls of their time outside named ops, with
  (``meshplan calibrate --from-trace`` of a one-stage plan) each recorded step's host time
  outside every span spread over its unit calls (``executor.trace_rounds``; the
  mean, as the rates are time-weighted: the fitted model then gives the traced step's
  total; ``meshplan calibrate``'s median of a quiet program would drop the moments the
  core was taken);
- collectives ``steps a + share S / B`` (:func:`~executor.calibrate_fit.fit_links`) when
  the samples have at least two distinct ``(steps, share S)``; with fewer (a data-parallel
  plan has one gradient bucket per step) ``a`` keeps the spec's ``node.intra_latency`` and
  ``B = sum(share S) / sum(t - steps a)``.

- ``memory_bandwidth`` (with ``efficiency.memory_bandwidth`` 1): the rate of the trace's
  in-place streaming ops (the executor's gradient accumulation ``acc += g`` and scaling
  ``g /= m``), the copy bandwidth ``simulator.stage_timing.stream_time`` charges them at.

A ``by_op`` efficiency below ``clusters.spec.MIN_POSITIVE`` (an op of a few bytes whose
time is overhead, not bytes, e.g. ``full_like`` of a scalar) is left out
(``PlanFit.dropped``); the overall memory-bound rate applies to it.

A rate above the spec's peak (``peak_flops[dtype]``, ``memory_bandwidth``) replaces the
peak (a placeholder may be below what was measured), so every fraction stays in (0, 1].
"""

from __future__ import annotations

import copy
import statistics
from dataclasses import dataclass, field
from typing import Any

from executor.calibrate_fit import (
    FitError,
    collective_terms,
    fit_by_op,
    fit_gemm,
    fit_links,
    fit_ratio,
    split_representable,
)
from executor.errors import ExecutorError

#: plan dtypes -> the cluster spec's ``peak_flops`` keys
DTYPE_KEYS = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "fp32": "fp32",
              "bf16": "bf16", "fp16": "fp16"}


class PlanFitError(ExecutorError, ValueError):
    """Too few samples of a trace to fit a constant the cost model needs; names it."""


@dataclass
class PlanFit:
    """Fitted constants (seconds, FLOP/s, bytes/s) and sample counts per kind."""

    kernel_overhead: float
    gemm_rate: float
    gemm_half_flops: float
    action_overhead: float | None = None
    memory_rate: float | None = None
    attention_rate: float | None = None
    by_op: dict[str, tuple[float, int, str]] = field(default_factory=dict)
    link_latency: float | None = None
    link_bandwidth: float | None = None
    link_latency_fitted: bool = False
    stream_bandwidth: float | None = None
    dropped: list[str] = field(default_factory=list)
    """``by_op`` keys left out of the spec: efficiencies below ``clusters.spec.MIN_POSITIVE``."""
    counts: dict[str, int] = field(default_factory=dict)


def _by_kind(samples: list) -> dict[str, list]:
    out: dict[str, list] = {}
    for s in samples:
        out.setdefault(s.kind, []).append(s)
    return out


def _links(pts: list, latency: float) -> tuple[float, float, bool]:
    points: dict[str, list[tuple[float, float]]] = {}
    for s in pts:
        points.setdefault(s.op_type, []).append((s.bytes, s.seconds))
    terms = set()
    for key, ps in points.items():
        kind, n = key.split("/")
        steps, share = collective_terms(kind, int(n))
        terms.update((steps, round(share * b)) for b, _ in ps)
    if len(terms) >= 2:
        try:
            a, b = fit_links(points)
            return a, b, True
        except FitError:
            pass
    moved, busy = 0.0, 0.0
    for key, ps in points.items():
        kind, n = key.split("/")
        steps, share = collective_terms(kind, int(n))
        moved += sum(share * b for b, _ in ps)
        busy += sum(t - steps * latency for _, t in ps)
    if moved <= 0 or busy <= 0:
        raise PlanFitError(f"collective bandwidth: {len(pts)} collective(s) moved {moved:g} bytes in "
                           f"{busy:g} s beyond the latency {latency:g} s: nothing to fit")
    return latency, moved / busy, False


def gemm_groups(samples: list) -> list[tuple[float, float]]:
    """(FLOPs, mean seconds) per distinct (op type, phase, FLOPs) of GEMM samples: a plan
    repeats each GEMM per layer and micro-batch, and the curve is fitted to their mean
    times, so the fitted curve times the counts gives their total (the relative fit to
    each sample would follow the fastest and miss the time host noise adds to all)."""
    groups: dict[tuple, list[float]] = {}
    for s in samples:
        groups.setdefault((s.op_type, s.phase, s.flops), []).append(s.seconds)
    return [(k[2], sum(v) / len(v)) for k, v in groups.items()]


def stream_bandwidth(streams: list[tuple[float, float]]) -> float:
    """Bytes/s of the in-place streaming ops ``streams`` ((bytes, seconds) each): the sum of
    their bytes over the sum of their times, each time the median of the ops of the same
    bytes (the same tensor, once per profiled step and layer): an op the host's scheduler
    preempted (one ``add_`` of 540 KB taking 7.8 ms where its twins took 30 us, issue 19)
    would otherwise set the copy bandwidth of the whole fit, 1.5 GB/s instead of 20-35.
    Raises ValueError without a stream of positive time."""
    groups: dict[float, list[float]] = {}
    for b, t in streams:
        groups.setdefault(b, []).append(t)
    total_t = sum(len(ts) * statistics.median(ts) for ts in groups.values())
    if total_t <= 0:
        raise ExecutorError("no in-place streaming op with a positive time")
    return sum(b * len(ts) for b, ts in groups.items()) / total_t


def fit_plan_samples(samples: list, latency: float, peak: float, bandwidth: float,
                     streams: list[tuple[float, float]] | None = None) -> PlanFit:
    """Fit the constants (module docstring) to ``samples`` (``calibrate_ops.OpSample``
    with kinds view, gemm, memory, attention, action, collective, other). ``latency``: the
    spec's link step latency, used when the collectives cannot separate it; ``peak`` and
    ``bandwidth``: the spec's ``peak_flops[dtype]`` and ``memory_bandwidth``, to which
    ``by_op`` attention (memory) efficiencies are relative after a measured rate above
    them replaced them; ``streams``: (bytes, seconds) of the trace's in-place streaming
    ops (``trace_match.stream_samples``), whose rate ``sum(bytes) / sum(seconds)``
    becomes ``memory_bandwidth`` (the copy bandwidth the cost model streams gradient
    accumulation and scaling at) and the reference of the memory-bound fractions. Raises
    PlanFitError without view ops or two GEMMs."""
    by = _by_kind(samples)
    counts = {k: len(v) for k, v in sorted(by.items())}
    if not by.get("view"):
        raise PlanFitError(f"kernel overhead: the trace has no kernel-less (view) op of the plan (samples: {counts})")
    if len(by.get("gemm", [])) < 2:
        raise PlanFitError(f"GEMM rate: the trace has fewer than 2 GEMM ops of the plan (samples: {counts})")
    o = statistics.median(s.seconds for s in by["view"])
    groups = gemm_groups(by["gemm"])
    if len(groups) < 2:
        groups = [(s.flops, s.seconds) for s in by["gemm"]]
    _, half = fit_gemm([f for f, _ in groups], [t for _, t in groups], o)
    busy = sum(max(s.seconds - o, 1e-9) for s in by["gemm"])
    rate = sum(s.flops + half for s in by["gemm"]) / busy
    fit = PlanFit(kernel_overhead=float(o), gemm_rate=float(rate), gemm_half_flops=float(half), counts=counts)
    if by.get("action"):
        fit.action_overhead = float(statistics.fmean(s.seconds for s in by["action"]))
    if by.get("memory"):
        fit.memory_rate = fit_ratio([s.bytes for s in by["memory"]], [s.seconds for s in by["memory"]], o,
                                    "memory-bound ops")
    if by.get("attention"):
        fit.attention_rate = fit_ratio([s.flops for s in by["attention"]],
                                       [s.seconds for s in by["attention"]], o, "attention ops")
    peak = max(peak, rate)
    if streams and sum(t for _, t in streams) > 0:
        fit.stream_bandwidth = bandwidth = stream_bandwidth(streams)
        counts["stream"] = len(streams)
    else:
        bandwidth = max(bandwidth, fit.memory_rate or 0.0)
    for key, (eff, n) in fit_by_op(by.get("memory", []) + by.get("attention", []), o, bandwidth, peak).items():
        kind = "attention" if any(s.kind == "attention" and f"{s.op_type}:{s.phase}" == key
                                  for s in by.get("attention", [])) else "memory"
        fit.by_op[key] = (eff, n, kind)
    if by.get("collective"):
        fit.link_latency, fit.link_bandwidth, fit.link_latency_fitted = _links(by["collective"], latency)
    return fit


def _q(value: float, provenance: str) -> dict[str, Any]:
    return {"value": float(value), "provenance": provenance}


def _rate_into(holder: dict, key: str, rate: float, prov: str) -> float:
    """``rate`` as a fraction of ``holder[key]``; a rate above it replaces it (fraction 1)."""
    peak = float(holder[key]["value"])
    if rate <= peak:
        return rate / peak
    holder[key] = _q(rate, f"{prov}: measured above the spec's {peak:.4g}")
    return 1.0


def apply_plan_fit(spec: dict[str, Any], fit: PlanFit, dtype: str, source: str) -> dict[str, Any]:
    """A copy of cluster ``spec`` (a mapping as ``clusters.parse_spec`` reads) with the
    fitted constants, each with a provenance naming ``source``; ``dtype``: the plan's
    (``float32`` -> ``peak_flops.fp32``). Raises PlanFitError for a dtype the spec has no
    peak for."""
    key = DTYPE_KEYS.get(dtype, dtype)
    out = copy.deepcopy(spec)
    dev, node = out["device"], out["node"]
    eff = dev["efficiency"]
    if key not in dev["peak_flops"]:
        raise PlanFitError(f"the cluster has no peak_flops.{key} for the plan's dtype {dtype}")
    n = fit.counts
    prov = f"fitted to the plan's ops in the profiler trace {source} (executor/trace_plan_fit.py)"
    eff["kernel_overhead_s"] = _q(fit.kernel_overhead, f"{prov}: median of {n.get('view', 0)} kernel-less ops")
    g = _rate_into(dev["peak_flops"], key, fit.gemm_rate, prov)
    eff["gemm"] = _q(g, f"{prov}: {n.get('gemm', 0)} GEMMs, t = o + (F + F_half) / (peak g), "
                        f"{fit.gemm_rate:.4g} FLOP/s")
    eff["gemm_half_flops"] = _q(fit.gemm_half_flops, f"{prov}: the same GEMM fit")
    peak = float(dev["peak_flops"][key]["value"])
    if fit.action_overhead is not None:
        eff["action_overhead_s"] = _q(fit.action_overhead, f"{prov}: mean over {n.get('action', 0)} "
                                                           f"unit calls of their time outside named ops "
                                                           f"(one-stage plans: with the step's host time "
                                                           f"outside every span spread over them)")
    if fit.stream_bandwidth is not None:
        dev["memory_bandwidth"] = _q(fit.stream_bandwidth, f"{prov}: {n.get('stream', 0)} in-place streaming "
                                                           f"ops (gradient accumulation, scaling), bytes/s")
        eff["memory_bandwidth"] = _q(1.0, f"{prov}: 1 because memory_bandwidth is measured")
    if fit.memory_rate is not None:
        m = (min(fit.memory_rate / fit.stream_bandwidth, 1.0) if fit.stream_bandwidth is not None
             else _rate_into(dev, "memory_bandwidth", fit.memory_rate, prov))
        eff["memory_kernels"] = _q(m, f"{prov}: {n.get('memory', 0)} memory-bound ops, operands + "
                                      f"results bytes/s beyond o over memory_bandwidth")
    if fit.attention_rate is not None:
        eff["attention"] = _q(min(fit.attention_rate / peak, 1.0),
                              f"{prov}: {n.get('attention', 0)} attention ops, executed FLOP/s "
                              f"beyond o over peak_flops.{key}")
    kept, fit.dropped = split_representable(fit.by_op)
    if kept:
        by_op = dict(eff.get("by_op") or {})
        for k, (v, cnt, kind) in sorted(kept.items()):
            over = f"peak_flops.{key}" if kind == "attention" else "memory_bandwidth"
            by_op[k] = _q(v, f"{prov}: {cnt} samples, {'FLOP/s' if kind == 'attention' else 'bytes/s'} "
                             f"beyond o over {over}")
        eff["by_op"] = by_op
    if fit.link_bandwidth is not None:
        how = "fit" if fit.link_latency_fitted else "kept from the spec (one message size: a and B not separable)"
        node["intra_latency"] = _q(fit.link_latency, f"{prov}: collective a, {how}")
        node["intra_bandwidth"] = _q(fit.link_bandwidth, f"{prov}: {n.get('collective', 0)} collectives, "
                                                         f"steps a + share S / B")
        node["collective_model"] = {"value": "alpha-beta", "provenance": f"{prov}: the fitted a and B are the "
                                                                       f"plain steps a + share S / B model"}
    out["description"] = f"{spec.get('description', spec['name'])}; calibrated from {source}"
    return out


def class_times(samples: list, spec: dict[str, Any], dtype: str) -> dict[str, float]:
    """Per kind, the seconds the cost model's formulas give ``samples`` under ``spec``
    (``simulator.roofline``'s smooth model without ``sm_count``): view ``o``; GEMM ``o +
    (F + F_half) / (peak g)``; memory ``o + M / (B e)`` (``e``: ``by_op[op:phase]``, else
    ``memory_kernels``, else ``efficiency.memory_bandwidth``); attention ``o + F / (peak
    a)``; action ``action_overhead_s``; collective ``steps a + share S / B_intra``.
    ``other`` is not modelled (0)."""
    dev, node = spec["device"], spec["node"]
    eff = dev["efficiency"]
    val = lambda d, k, default=None: float(d[k]["value"]) if k in d else default  # noqa: E731
    peak = float(dev["peak_flops"][DTYPE_KEYS.get(dtype, dtype)]["value"])
    o, g = val(eff, "kernel_overhead_s"), val(eff, "gemm")
    half = val(eff, "gemm_half_flops", 0.0)
    bw = float(dev["memory_bandwidth"]["value"])
    mem_e = val(eff, "memory_kernels", val(eff, "memory_bandwidth"))
    attn_e = val(eff, "attention", g)
    by_op = {k: float(v["value"]) for k, v in (eff.get("by_op") or {}).items()}
    a, b = val(node, "intra_latency"), val(node, "intra_bandwidth")
    out: dict[str, float] = {}
    for s in samples:
        key = f"{s.op_type}:{s.phase}"
        if s.kind == "view":
            t = o
        elif s.kind == "gemm":
            t = o + (s.flops + half) / (peak * g)
        elif s.kind == "memory":
            t = o + s.bytes / (bw * by_op.get(key, by_op.get(s.op_type, mem_e)))
        elif s.kind == "attention":
            t = o + s.flops / (peak * by_op.get(key, by_op.get(s.op_type, attn_e)))
        elif s.kind == "action":
            t = val(eff, "action_overhead_s", 0.0)
        elif s.kind == "collective":
            kind, n = s.op_type.split("/")
            steps, share = collective_terms(kind, int(n))
            t = steps * a + share * s.bytes / b
        else:
            t = 0.0
        out[s.kind] = out.get(s.kind, 0.0) + t
    return out


def measured_class_times(samples: list) -> dict[str, float]:
    """Per kind, the samples' measured seconds."""
    out: dict[str, float] = {}
    for s in samples:
        out[s.kind] = out.get(s.kind, 0.0) + s.seconds
    return out

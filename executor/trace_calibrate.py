"""Calibrate the cost model's device and link constants from a profiled step: a PyTorch
profiler (Kineto) Chrome trace (``torch.profiler.profile(record_shapes=True)``,
``prof.export_chrome_trace(path)``).

Samples (:func:`trace_samples`), by kernel class (:data:`KERNEL_CLASSES`, matched on the
event name in order, first match wins):

- a trace with GPU kernels (``cat`` ``kernel``) is read kernel by kernel, each kernel's
  shapes taken from the CPU op that launched it (same ``External id``); a CPU-only trace
  (the executor on gloo ranks) is read op by op (``cat`` ``cpu_op``), only the leaf ops of
  :data:`GEMM_OPS` and :data:`MEMORY_OPS` (their parents would count the time twice);
- ``gemm``: FLOPs from the ``Input Dims`` of ``aten::mm`` / ``addmm`` / ``bmm`` / ``baddbmm``
  (``2 b m n k``);
- ``memory``: bytes of the operands plus one result the size of the largest operand
  (``Input Dims`` x ``Input type`` item sizes), the memory-bound model's "operands +
  results" (``executor.calibrate_fit``);
- ``collective``: events carrying ``Collective name``, ``In msg nelems``, ``Group size`` and
  ``dtype`` (the profiler's ``record_param_comms`` / NCCL kernel arguments); bytes = the
  message elements x the dtype's size.

Model and fits (``executor.calibrate_fit``, the model ``simulator.roofline`` and
``clusters.collectives`` use): GEMM ``t = (F + F_half) / P`` (kernel times exclude launch
overhead, so ``o`` = 0; :func:`~executor.calibrate_fit.fit_gemm`), memory-bound ``t = M /
B`` (:func:`~executor.calibrate_fit.fit_ratio`), collective ``t = steps_k(n) a + share_k(n)
S / B_link`` (:func:`~executor.calibrate_fit.fit_links`). :func:`apply_fit` writes them into
a cluster spec as ``efficiency.gemm`` = P / ``peak_flops[dtype]``,
``efficiency.gemm_half_flops``, ``efficiency.memory_kernels`` = B / ``memory_bandwidth``,
``node.intra_latency`` and ``node.intra_bandwidth``; :func:`class_times` predicts each
class's total time under a spec with the same formulas, before and after.

This module reads any Kineto trace by kernel class (matched by name and shape); attention
kernels are counted, not fitted, and inter-node links are not fitted. The executor's own
traces (``executor.profile``: every plan op a named span) are instead matched op by op to
the plan (``executor.trace_match``) and fitted as ``meshplan calibrate`` fits its program
(``executor.trace_plan_fit``).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from completion.errors import InputFileNotFoundError
from executor.calibrate_fit import FitError, collective_terms, fit_gemm, fit_links, fit_ratio
from executor.errors import ExecutorError

#: (class, pattern on the event name), first match wins; anything else is ``other``
KERNEL_CLASSES: tuple[tuple[str, re.Pattern], ...] = (
    ("collective", re.compile(r"nccl|record_param_comms|gloo|c10d::|allreduce|all_gather|reduce_scatter", re.I)),
    ("attention", re.compile(r"flash|fmha|scaled_dot_product|attention", re.I)),
    ("gemm", re.compile(r"gemm|aten::(mm|addmm|bmm|baddbmm)$|cutlass|xmma|cublas", re.I)),
    ("memory", re.compile(r"elementwise|vectorized|reduce_kernel|aten::(add|mul|sub|div|copy_|silu|"
                          r"gelu|rsqrt|pow|mean|sum|neg|exp|add_|mul_|fill_|zero_)$", re.I)),
)
GEMM_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")
MEMORY_OPS = ("aten::add", "aten::mul", "aten::sub", "aten::div", "aten::copy_", "aten::silu",
              "aten::gelu", "aten::rsqrt", "aten::pow", "aten::mean", "aten::sum", "aten::neg",
              "aten::exp", "aten::add_", "aten::mul_")
#: bytes per element of the profiler's ``Input type`` / ``dtype`` names
ITEM_BYTES = {"float": 4, "Float": 4, "float32": 4, "double": 8, "Double": 8, "c10::Half": 2,
              "Half": 2, "float16": 2, "c10::BFloat16": 2, "BFloat16": 2, "bfloat16": 2,
              "long int": 8, "Long": 8, "int": 4, "Int": 4, "bool": 1, "Bool": 1}
#: profiler collective names -> ``clusters.collectives`` kinds
COLLECTIVE_KINDS = {"allreduce": "all_reduce", "all_reduce": "all_reduce",
                    "allgather": "all_gather", "all_gather": "all_gather",
                    "_allgather_base": "all_gather", "allgather_into_tensor_coalesced": "all_gather",
                    "reduce_scatter": "reduce_scatter", "_reduce_scatter_base": "reduce_scatter",
                    "reduce_scatter_tensor_coalesced": "reduce_scatter",
                    "all_to_all": "all_to_all", "alltoall": "all_to_all", "alltoall_base": "all_to_all"}
#: Largest trace read (bytes): a profiled step is a few MiB to a few hundred
MAX_TRACE_BYTES = 1 << 30


class TraceError(ExecutorError, ValueError):
    """A trace that cannot be read or holds nothing to fit; names the file and field."""


@dataclass
class TraceSamples:
    """Per class, what was timed: ``gemm`` (FLOPs, s), ``memory`` (bytes, s), ``collective``
    ``{kind/n: [(bytes, s)]}``, and ``counts``/``seconds`` of every class (``attention`` and
    ``other`` included)."""

    gemm: list[tuple[float, float]] = field(default_factory=list)
    memory: list[tuple[float, float]] = field(default_factory=list)
    collective: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    dtype: str = "fp32"


def classify(name: str) -> str:
    """The :data:`KERNEL_CLASSES` class of an event name, else ``other``."""
    for cls, pat in KERNEL_CLASSES:
        if pat.search(name):
            return cls
    return "other"


def load_trace(path: str | Path) -> list[dict[str, Any]]:
    """The complete (``ph`` X) events of a Chrome trace file. Raises FileNotFoundError, or
    TraceError naming the file for bad JSON, a missing ``traceEvents`` list or a file
    larger than :data:`MAX_TRACE_BYTES`."""
    return read_trace(path)[1]


def read_trace(path: str | Path) -> tuple[Any, list[dict[str, Any]]]:
    """``(document, complete events)`` of a Chrome trace file, parsed once: the JSON
    document as it is (an executor trace's metadata sits beside its events) and
    :func:`load_trace`'s events. Raises as :func:`load_trace`."""
    p = Path(path)
    if not p.is_file():
        raise InputFileNotFoundError(f"trace file not found: {p}")
    if p.stat().st_size > MAX_TRACE_BYTES:
        raise TraceError(f"{p}: {p.stat().st_size} bytes, above the {MAX_TRACE_BYTES} a trace may have")
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise TraceError(f"{p}: not a JSON Chrome trace ({e})") from None
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc
    if not isinstance(events, list):
        raise TraceError(f"{p}: no 'traceEvents' list (not a Chrome trace)")
    out = [e for e in events if isinstance(e, dict) and e.get("ph") == "X"
           and isinstance(e.get("dur"), (int, float)) and e["dur"] > 0]
    for e in out:  # JSON's Infinity / NaN parse as floats: a time no fit can use
        if "ts" not in e:
            raise TraceError(f"{p}: event {e.get('name')!r} has no 'ts' (start time, us)")
        if not all(isinstance(e.get(k, 0), (int, float)) and math.isfinite(e.get(k, 0)) for k in ("ts", "dur")):
            raise TraceError(f"{p}: event {e.get('name')!r} has a non-finite time "
                             f"(ts {e.get('ts')!r}, dur {e.get('dur')!r})")
    return doc, out


def _numel(dims: Any) -> int:
    """Elements of one ``Input Dims`` entry; TraceError naming it when it is not a list of
    non-negative integers."""
    n = 1
    try:
        for d in dims:
            if isinstance(d, bool) or int(d) != d or d < 0:
                raise ExecutorError
            n *= int(d)
    except (TypeError, ValueError, OverflowError):
        raise TraceError(f"an event's 'Input Dims' entry {dims!r} is not a list of "
                         f"non-negative integers") from None
    return n


def gemm_flops(op: str, dims: list) -> float:
    """``2 b m n k`` of a GEMM op from its ``Input Dims`` (mm [m,k],[k,n]; addmm
    [bias],[m,k],[k,n]; bmm [b,m,k],[b,k,n]; baddbmm [bias],[b,m,k],[b,k,n]); 0 when the
    dims do not fit."""
    try:
        a, b = (dims[1], dims[2]) if op in ("aten::addmm", "aten::baddbmm") else (dims[0], dims[1])
        if len(a) == 2:
            return 2.0 * a[0] * a[1] * b[1]
        return 2.0 * a[0] * a[1] * a[2] * b[2]
    except (IndexError, TypeError):
        return 0.0


def memory_bytes(dims: list, types: list) -> float:
    """Operand bytes plus one result as large as the largest operand (0 without dims)."""
    sizes = [_numel(d) * ITEM_BYTES.get(t, 4) for d, t in zip(dims, types or ["float"] * len(dims),
                                                              strict=False) if d]
    return float(sum(sizes) + max(sizes)) if sizes else 0.0


def _collective(args: dict) -> tuple[str, float] | None:
    kind = COLLECTIVE_KINDS.get(str(args.get("Collective name", "")).lower())
    n, nel = args.get("Group size"), args.get("In msg nelems")
    if kind is None or not isinstance(n, int) or n < 2 or not isinstance(nel, (int, float)):
        return None
    nbytes = nel * ITEM_BYTES.get(str(args.get("dtype", "Float")), 4)
    return f"{kind}/{n}", float(nbytes)


def trace_samples(events: list[dict[str, Any]]) -> TraceSamples:
    """The fit samples of a trace's events (see the module docstring)."""
    out = TraceSamples()
    kernels = [e for e in events if e.get("cat") == "kernel"]
    ops = {e["args"]["External id"]: e for e in events
           if e.get("cat") == "cpu_op" and isinstance(e.get("args"), dict) and "External id" in e["args"]}
    timed = kernels or [e for e in events if e.get("cat") == "cpu_op"]
    half = 0
    for e in timed:
        args = e.get("args") or {}
        src = ops.get(args.get("External id"), e) if kernels else e
        sargs = src.get("args") or {}
        name, t = str(e.get("name", "")), e["dur"] * 1e-6
        coll = _collective(args) or _collective(sargs)
        cls = "collective" if coll else classify(name)
        if not kernels and cls in ("gemm", "memory") and src.get("name") not in GEMM_OPS + MEMORY_OPS:
            continue  # a parent op of a CPU trace: its children are timed
        out.counts[cls] = out.counts.get(cls, 0) + 1
        out.seconds[cls] = out.seconds.get(cls, 0.0) + t
        dims, types = sargs.get("Input Dims") or [], sargs.get("Input type") or []
        if cls == "gemm":
            f = gemm_flops(str(src.get("name")), dims)
            if f > 0:
                out.gemm.append((f, t))
                half += any(ITEM_BYTES.get(x) == 2 for x in types)
        elif cls == "memory":
            m = memory_bytes(dims, types)
            if m > 0:
                out.memory.append((m, t))
        elif cls == "collective" and coll is not None:
            out.collective.setdefault(coll[0], []).append((coll[1], t))
    out.dtype = "bf16" if out.gemm and half * 2 > len(out.gemm) else "fp32"
    return out


@dataclass
class TraceFit:
    """Fitted constants: GEMM rate ``P`` (FLOP/s) and ``F_half`` (FLOPs), memory-bound
    bandwidth (bytes/s), link step latency (s) and bandwidth (bytes/s); None where the trace
    had no samples of that class."""

    gemm_rate: float | None = None
    gemm_half_flops: float | None = None
    memory_bandwidth: float | None = None
    link_latency: float | None = None
    link_bandwidth: float | None = None


def fit_trace(s: TraceSamples) -> TraceFit:
    """Fit the constants (see the module docstring). Raises TraceError when no class had a
    usable sample."""
    fit = TraceFit()
    if len(s.gemm) >= 2:
        rate, half = fit_gemm([f for f, _ in s.gemm], [t for _, t in s.gemm], 0.0)
        fit.gemm_rate, fit.gemm_half_flops = float(rate), float(half)
    if s.memory:
        fit.memory_bandwidth = float(fit_ratio([m for m, _ in s.memory], [t for _, t in s.memory], 0.0,
                                               "memory-bound bandwidth"))
    if s.collective and sum(len(v) for v in s.collective.values()) >= 2:
        try:
            a, b = fit_links(s.collective)
            fit.link_latency, fit.link_bandwidth = float(a), float(b)
        except FitError:
            pass
    if all(v is None for v in vars(fit).values()):
        raise TraceError(f"the trace has no GEMM (with shapes), memory-bound or collective samples "
                         f"to fit (classes seen: {s.counts}); record it with record_shapes=True")
    return fit


def _value(d: dict, *keys: str) -> float:
    for k in keys:
        d = d[k]
    return float(d["value"])


def class_times(s: TraceSamples, spec: dict[str, Any]) -> dict[str, float]:
    """Predicted total seconds per class of the samples under cluster ``spec`` (a spec
    mapping as ``clusters.parse_spec`` reads): GEMM ``(F + F_half) / (peak g)``, memory
    ``M / (B_mem e)`` (``e``: ``memory_kernels``, else ``memory_bandwidth``), collective
    ``steps a + share S / B_intra``."""
    dev, eff = spec["device"], spec["device"]["efficiency"]
    p = _value(dev, "peak_flops", s.dtype) * _value(eff, "gemm")
    f_half = _value(eff, "gemm_half_flops") if "gemm_half_flops" in eff else 0.0
    b = _value(dev, "memory_bandwidth") * _value(eff, "memory_kernels" if "memory_kernels" in eff
                                                 else "memory_bandwidth")
    a, bi = _value(spec["node"], "intra_latency"), _value(spec["node"], "intra_bandwidth")
    out = {"gemm": sum((f + f_half) / p for f, _ in s.gemm), "memory": sum(m / b for m, _ in s.memory)}
    coll = 0.0
    for key, pts in s.collective.items():
        kind, n = key.split("/")
        steps, share = collective_terms(kind, int(n))
        coll += sum(steps * a + share * x / bi for x, _ in pts)
    out["collective"] = coll
    return out


def measured_times(s: TraceSamples) -> dict[str, float]:
    """Measured total seconds of the fitted samples per class."""
    return {"gemm": sum(t for _, t in s.gemm), "memory": sum(t for _, t in s.memory),
            "collective": sum(t for pts in s.collective.values() for _, t in pts)}


def _fraction(holder: dict, key: str, rate: float, prov: str) -> float:
    """``rate`` as a fraction of ``holder[key]``; a rate above it replaces it (fraction 1):
    a catalog peak is a datasheet number, a placeholder may be below what was measured."""
    peak = float(holder[key]["value"])
    if rate <= peak:
        return rate / peak
    holder[key] = {"value": rate, "provenance": f"{prov}: measured above the spec's {peak:.4g}"}
    return 1.0


def apply_fit(spec: dict[str, Any], fit: TraceFit, dtype: str, source: str) -> dict[str, Any]:
    """A copy of cluster ``spec`` with the fitted constants (provenance naming ``source``);
    constants the trace did not fit keep the spec's value."""
    import copy

    out = copy.deepcopy(spec)
    dev, eff, node = out["device"], out["device"]["efficiency"], out["node"]
    prov = f"fitted to the profiler trace {source} (executor/trace_calibrate.py)"
    if fit.gemm_rate is not None:
        g = _fraction(dev["peak_flops"], dtype, fit.gemm_rate, prov)
        eff["gemm"] = {"value": g, "provenance": f"{prov}: GEMM t = (F + F_half) / (peak g), "
                                                 f"{fit.gemm_rate:.4g} FLOP/s"}
        eff["gemm_half_flops"] = {"value": fit.gemm_half_flops, "provenance": f"{prov}: the same GEMM fit"}
    if fit.memory_bandwidth is not None:
        m = _fraction(dev, "memory_bandwidth", fit.memory_bandwidth, prov)
        eff["memory_kernels"] = {"value": m, "provenance": f"{prov}: memory-bound (operands + "
                                                           f"results) bytes/s over memory_bandwidth"}
    if fit.link_latency is not None:
        node["intra_latency"] = {"value": fit.link_latency, "provenance": f"{prov}: collective fit (a)"}
        node["intra_bandwidth"] = {"value": fit.link_bandwidth,
                                   "provenance": f"{prov}: collective fit steps a + share S / B"}
        node["collective_model"] = {"value": "alpha-beta", "provenance": f"{prov}: the fitted a and B are the "
                                                                       f"plain steps a + share S / B model"}
    out["description"] = f"{spec.get('description', spec['name'])}; calibrated from {source}"
    return out

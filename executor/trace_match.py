"""Match a trace the executor recorded (``executor.profile``) to the plan's ops: one
sample per executed op of the plan, with the FLOPs and bytes the cost model charges it.

The executor names every executed item's span ``meshplan::<phase> #<program op index>
<op type>`` (``executor.profile.item_label``). :func:`plan_labels` rebuilds the plan's
partitioned program and the rank plan of the trace's rank (``executor.program``,
``executor.rank_plan``: the same pipeline the executor ran) and maps each label to its
item; a label the plan does not have, or whose op type differs, means the trace was not
recorded from this plan (:class:`TraceMatchError`).

Per matched span, a :class:`~executor.calibrate_ops.OpSample` classified as
``executor.calibrate_ops.classify`` does for the calibration program (the cost model's
kernel kinds, FLOPs and operands + results bytes), with shapes from the plan: operand
``v`` on rank ``r`` has the local shape ``value_layout(v).local_shape(v.shape, r)`` (its
global shape without a layout), result shapes are the rank op's ``result_shapes``.
Collective ops (``executor.collectives.COLLECTIVES``) become kind ``collective`` with
``S`` bytes (the op's ``nbytes`` attribute when the reshard pass set one, else the
nccl-tests buffer: the operand of all_reduce / reduce_scatter / all_to_all, the result of
all_gather; ``clusters.collectives``) and op type ``<kind>/<group size>``; the step's
fused gradient buckets (``meshplan::O bucket<i> all_reduce``) sum their gradients' bytes
(``executor.rank_exec.gradient_buckets``, the executor's own grouping). A logging-only
all_reduce (its result read only by ``shadow_output``: the executor posts it
asynchronously, its span holds the issue only) is kind ``other``, not fitted.

Each span's seconds are its duration less the recording's own cost inside it: ``eps`` per
recorded event (:func:`event_cost`, measured by the executor in the same run: the span
recorder's cost per span for its spans, ``executor.span_trace``, the profiler's per event
for a profiler trace) times the events the span encloses (itself included).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any

import torch

from completion.passes.reshard import value_layout
from executor.calibrate_ops import OpSample, classify
from executor.errors import ExecutorError
from executor.profile import PREFIX, UNIT_PREFIX, bucket_label, item_label, phase_of

#: kinds of samples :func:`match_trace` returns besides ``calibrate_ops``' own
COLLECTIVE, OTHER = "collective", "other"


class TraceMatchError(ExecutorError, ValueError):
    """A trace whose named spans do not belong to the plan; names the span."""


@dataclass(frozen=True)
class Target:
    """What one span name stands for: ``kind``, ``op_type`` (``<kind>/<n>`` for a
    collective), FLOPs and bytes (``S`` for a collective), ``phase``."""

    kind: str
    op_type: str
    flops: float
    bytes: float
    phase: str
    accumulates: bool = False
    """A result is a gradient summed over micro-batches: in later micro-batches its span
    also holds the in-place accumulation add, which the cost model charges apart."""


def local_shape(v: Any, rank: int) -> tuple[int, ...]:
    """Shape of value ``v`` on ``rank``: its layout's local shape, else its global shape."""
    lay = value_layout(v)
    if lay is None or rank not in lay.mesh.process_ids:
        return tuple(v.shape)
    return tuple(lay.local_shape(v.shape, rank))


def _meta(v: Any, rank: int) -> torch.Tensor:
    from executor.kernels import torch_dtype

    return torch.empty(local_shape(v, rank), dtype=torch_dtype(v.dtype), device="meta")


def _nbytes(v: Any, rank: int) -> float:
    t = _meta(v, rank)
    return float(t.numel() * t.element_size())


def collective_bytes(op: Any, rank: int) -> float:
    """``S`` of a collective op (module docstring)."""
    if op.attrs.get("nbytes"):
        return float(op.attrs["nbytes"])
    v = op.results[0] if op.type == "all_gather" else op.operands[0]
    return _nbytes(v, rank)


def item_target(it: Any, key: Any, rank: int, accum: frozenset = frozenset()) -> Target:
    """The :class:`Target` of rank plan item ``it`` run in unit ``key`` on ``rank``;
    ``accum``: ids of the values summed over micro-batches (``RankPlan.accum``)."""
    from executor.calibrate_ops import out_bytes
    from executor.collectives import COLLECTIVES
    from executor.rank_exec import RankExecutor

    op, phase = it.op, phase_of(key)
    if op.type in COLLECTIVES:
        if RankExecutor.logging_only(op):
            return Target(OTHER, op.type, 0.0, 0.0, phase)
        n = len(it.ro.group or (rank,))
        return Target(COLLECTIVE, f"{op.type}/{n}", 0.0, collective_bytes(op, rank), phase)
    ins = [_meta(v, rank) for v in op.operands if v is not None]
    kind, flops, nbytes = classify(op, ins, out_bytes(it), it.want)
    acc = any(v is not None and id(v) in accum and (it.want is None or i in it.want)
              for i, v in enumerate(op.results))
    return Target(kind, op.type, float(flops), float(nbytes), phase, acc)


def plan_labels(plan: Any, rank: int) -> dict[str, Target]:
    """Span name -> :class:`Target` of every item, unit and gradient bucket rank ``rank``
    and gradient bucket rank ``rank`` of ``plan`` runs (``plan`` read as
    ``executor.program.build_program`` reads it); unit calls are recognised by their
    name (:func:`unit_target`)."""
    from executor.program import build_program
    from executor.rank_exec import gradient_buckets
    from executor.rank_plan import build_rank_plan

    rp = build_rank_plan(build_program(plan).program, rank)
    out: dict[str, Target] = {}
    for key, items in rp.units.items():
        for it in items:
            out[item_label(key, it.index, it.op.type)] = item_target(it, key, rank, frozenset(rp.accum))
    buckets = gradient_buckets(rp.units.get("step", []),
                               lambda x: str(x.dtype) if id(x) in rp.accum else None)
    for i, ((group, _, _), its) in enumerate(buckets.items()):
        s = sum(_nbytes(it.op.operands[0], rank) for it in its)
        out[bucket_label(i)] = Target(COLLECTIVE, f"all_reduce/{len(group)}", 0.0, s, "O")
    return out


def event_cost(meta: dict, key: str = "profiler_event_s") -> float:
    """Seconds the recording added per event: the executor's metadata ``key``
    (``profiler_event_s``: the profiler's, ``executor.profile.profiler_event_cost``;
    ``span_event_s``: the span recorder's, ``executor.span_trace.span_cost``); 0 when
    absent or not a positive number."""
    eps = meta.get(key) if isinstance(meta, dict) else None
    return float(eps) if isinstance(eps, (int, float)) and eps > 0 else 0.0


def recorded_spans(events: list[dict]) -> list[dict]:
    """The span recorder's events of a trace (``cat`` ``executor.span_trace.SPAN_CAT``)."""
    from executor.span_trace import SPAN_CAT

    return [e for e in events if e.get("cat") == SPAN_CAT]


def _thread_events(events: list[dict]) -> dict[Any, list[dict]]:
    """Per (pid, tid, recorder's or not), the events sorted by start: the recorder's spans
    and the profiler's events of one thread never enclose each other."""
    from executor.span_trace import SPAN_CAT

    out: dict[Any, list[dict]] = {}
    for e in events:
        cat = e.get("cat")
        if cat in ("cpu_op", "user_annotation", SPAN_CAT):
            out.setdefault((e.get("pid"), e.get("tid"), cat == SPAN_CAT), []).append(e)
    for evs in out.values():
        evs.sort(key=lambda e: (e["ts"], -e["dur"]))
    return out


def unit_target(name: str) -> Target | None:
    """The ``action`` :class:`Target` of a unit-call span name (``meshplan::unit F0
    mb1``: phase ``F``), else None."""
    if not name.startswith(UNIT_PREFIX):
        return None
    phase = name[len(UNIT_PREFIX):][:1]
    return Target("action", phase, 0.0, 0.0, phase)


def _encloses(a: dict, b: dict) -> bool:
    return a["ts"] <= b["ts"] and b["ts"] + b["dur"] <= a["ts"] + a["dur"]


def _later_microbatch(e: dict, units: list[dict]) -> bool:
    return any(_encloses(u, e) and not u["name"].endswith(" mb0") for u in units)


def match_trace(events: list[dict], labels: dict[str, Target], eps: float = 0.0) -> list[OpSample]:
    """One :class:`OpSample` per executor-named span of ``events`` (complete events of a
    Chrome trace): its target's kind, op type, FLOPs and bytes, seconds = duration less
    ``eps`` per event it encloses (itself included); an ``action`` sample (a unit call)
    gets the unit's seconds minus its outermost named spans' durations, less ``eps`` per
    event outside them (the per-action host work outside ops). A span of an
    ``accumulates`` target inside a unit call of a later micro-batch (``mb1`` ...) is left
    out: it also holds the accumulation add (as ``executor.calibrate_ops`` keeps the
    first micro-batch only). Raises TraceMatchError naming the first span the plan does
    not have."""
    out: list[OpSample] = []
    for evs in _thread_events(events).values():
        starts = [e["ts"] for e in evs]
        units = [e for e in evs if str(e.get("name", "")).startswith(UNIT_PREFIX)]
        for e in evs:
            name = str(e.get("name", ""))
            if not name.startswith(PREFIX):
                continue
            tgt = labels.get(name) or unit_target(name)
            if tgt is None:
                raise TraceMatchError(f"trace span {name!r} is no op of the plan on this rank: "
                                      f"the trace was recorded from another plan (or rank)")
            if tgt.accumulates and _later_microbatch(e, units):
                continue
            lo, hi = bisect.bisect_left(starts, e["ts"]), bisect.bisect_right(starts, e["ts"] + e["dur"])
            inner = [x for x in evs[lo:hi] if x is not e and _encloses(e, x)]
            if tgt.kind != "action":
                secs = e["dur"] * 1e-6 - eps * (len(inner) + 1)
            else:
                kids = [x for x in inner if str(x.get("name", "")).startswith(PREFIX)]
                top = [x for x in kids if not any(y is not x and _encloses(y, x) for y in kids)]
                outside = [x for x in inner if not any(_encloses(t, x) for t in top)]
                secs = (e["dur"] - sum(x["dur"] for x in top)) * 1e-6 - eps * (len(outside) + 1)
            out.append(OpSample(tgt.kind, tgt.op_type, tgt.flops, tgt.bytes, max(secs, 0.0), tgt.phase))
    return out


#: in-place streaming aten ops (one read / write pass per operand): the executor's
#: gradient accumulation (``acc += g``) and 1/m scaling (``g /= m``), an update's adds
STREAM_OPS = ("aten::add_", "aten::div_", "aten::mul_")


def stream_samples(events: list[dict], eps: float = 0.0) -> list[tuple[float, float]]:
    """(bytes, seconds) of every :data:`STREAM_OPS` ``cpu_op`` with its shapes: bytes =
    the tensor operands read plus the first one written (``Input Dims`` x ``Input type``
    item sizes; ``g /= m``: 2 x, ``acc += g``: 3 x the gradient's bytes, the count of
    ``simulator.stage_timing.stream_time``), seconds = duration less ``eps``."""
    from executor.trace_calibrate import ITEM_BYTES

    out = []
    for e in events:
        if e.get("cat") != "cpu_op" or e.get("name") not in STREAM_OPS:
            continue
        args = e.get("args") or {}
        dims, types = args.get("Input Dims") or [], args.get("Input type") or []
        sizes = [n * ITEM_BYTES.get(t, 4) for d, t in zip(dims, types, strict=False)
                 if isinstance(d, list) and d and (n := _numel(d)) > 0]
        if sizes and e["dur"] * 1e-6 > eps:
            out.append((float(sum(sizes) + sizes[0]), e["dur"] * 1e-6 - eps))
    return out


def _numel(dims: list) -> int:
    n = 1
    for d in dims:
        n *= int(d)
    return n


def slowest_ranks(per_rank: list[list[OpSample]], signatures: list[Any]) -> list[list[OpSample]]:
    """Of ranks with the same ``signature`` (the same ops: e.g. the data-parallel replicas
    of a stage, :func:`plan_labels` equal), the one whose non-collective samples took
    longest, alone; ranks with a signature of their own stay. The executor's step time is
    the slowest rank's (``executor.run.gathered_measurement``) and the cost model's rank
    runs the same ops as its replicas, so the replicas' slowest is the one to fit: on a
    shared host one replica gets less of the cores."""
    groups: dict[Any, list[int]] = {}
    for i, sig in enumerate(signatures):
        groups.setdefault(sig, []).append(i)

    def busy(i: int) -> float:
        return sum(s.seconds for s in per_rank[i] if s.kind != COLLECTIVE)

    keep = sorted(max(idx, key=busy) for idx in groups.values())
    return [per_rank[i] for i in keep]


def _segments(samples: list[OpSample]) -> list[list[OpSample]]:
    """A rank's non-collective samples, in trace order, cut at each collective: segment k
    holds what the rank ran between its k-th and (k+1)-th collective."""
    segs: list[list[OpSample]] = [[]]
    for smp in samples:
        if smp.kind == COLLECTIVE:
            segs.append([])
        else:
            segs[-1].append(smp)
    return segs


def slowest_segments(per_rank: list[list[OpSample]], signatures: list[Any]) -> list[list[OpSample]]:
    """Of ranks with the same ``signature`` (replicas running the same ops), segment by
    segment (:func:`_segments`: the work between two collectives) the samples of the
    replica that took longest in it; ranks with a signature of their own stay whole.

    Replicas meet at every collective, so a step takes, segment after segment, the slowest
    replica's time plus the collective (the executor's step time is the slowest rank's,
    ``executor.run.gathered_measurement``): one replica's ops for the whole step
    (:func:`slowest_ranks`) miss the segments in which another replica was slower (issue
    19: rank 1's optimizer segment after the gradient all_reduce 3.5 ms longer than that of
    rank 0, the busiest rank of the round). Replicas whose segment counts differ fall back
    to :func:`slowest_ranks`. Collective samples are not returned (``merge_collectives``)."""
    groups: dict[Any, list[int]] = {}
    for i, sig in enumerate(signatures):
        groups.setdefault(sig, []).append(i)
    out = []
    for idx in sorted(groups.values()):
        segs = [_segments(per_rank[i]) for i in idx]
        if len({len(s) for s in segs}) != 1:
            out += [[x for x in r if x.kind != COLLECTIVE] for r in slowest_ranks([per_rank[i] for i in idx],
                                                                                 [0] * len(idx))]
            continue
        out.append([x for k in range(len(segs[0]))
                    for x in max((s[k] for s in segs), key=lambda seg: sum(y.seconds for y in seg))])
    return out


def merge_collectives(per_rank: list[list[OpSample]]) -> list[OpSample]:
    """Every rank's samples, each collective taken once, at its shortest span over the
    ranks: a collective's span on a rank also holds the wait for peers still computing,
    and the last rank to arrive sees the transfer alone. Ranks whose collective sequences
    (op type and bytes, in trace order) differ keep all their spans."""
    colls = [[s for s in r if s.kind == COLLECTIVE] for r in per_rank]
    rest = [s for r in per_rank for s in r if s.kind != COLLECTIVE]
    keys = {tuple((s.op_type, s.bytes) for s in c) for c in colls}
    if len(per_rank) < 2 or len(keys) != 1:
        return rest + [s for c in colls for s in c]
    return rest + [min(group, key=lambda s: s.seconds) for group in zip(*colls, strict=True)]


def round_step(events: list[dict], i: int) -> list[dict]:
    """The events inside the recorded step ``i`` (the span ``meshplan-step <i>``,
    ``executor.profile.step_label``). Raises TraceMatchError when the trace has no such
    span."""
    from executor.profile import step_label

    name = step_label(i)
    step = next((e for e in events if e.get("name") == name), None)
    if step is None:
        raise TraceMatchError(f"the trace has no span {name!r}: its recorded rounds do not match "
                              f"its metadata's span_steps_s")
    return [e for e in events if e is not step and _encloses(step, e)]


@dataclass(frozen=True)
class RoundAlignment:
    """The recorded rounds of several ranks on one clock (seconds, one entry per round):
    ``skew`` = latest minus earliest start of the round's step over the ranks (how far
    apart they left the barrier before it), ``slowest`` = the longest of the ranks' own
    step durations (what ``executor.run.gathered_measurement`` reports per step), ``synced``
    = latest end minus latest start (the step from the moment every rank was in it)."""

    skew: list[float]
    slowest: list[float]
    synced: list[float]


def round_alignment(traces: list[tuple[dict, list[dict]]]) -> RoundAlignment | None:
    """Line up the recorded steps (``meshplan-step <i>`` spans) of ``traces``, each
    ``(metadata, span events)`` of one rank (``executor.profile``), on the host's clock: a
    span's clock time is ``span_origin_ns + (ts - span_offset_us) * 1000`` ns. None unless
    there are at least two ranks, all on one host (the same ``host``; other hosts' clocks
    are not comparable) with ``span_origin_ns`` recorded (older traces lack it), and some
    round recorded on every rank."""
    from executor.profile import STEP_PREFIX

    if len(traces) < 2 or len({m.get("host") for m, _ in traces}) != 1 or traces[0][0].get("host") is None:
        return None
    per_rank = []
    for meta, events in traces:
        origin, offset = meta.get("span_origin_ns"), meta.get("span_offset_us")
        if origin is None or offset is None:
            return None
        per_rank.append({e["name"]: (origin / 1e9 + (e["ts"] - offset) / 1e6, e["dur"] / 1e6)
                         for e in events if str(e.get("name", "")).startswith(STEP_PREFIX)
                         and str(e["name"])[len(STEP_PREFIX):].isdigit()})  # a round's number
    names = sorted(set.intersection(*(set(r) for r in per_rank)), key=lambda n: int(n[len(STEP_PREFIX):]))
    if not names:
        return None
    out = RoundAlignment([], [], [])
    for n in names:
        starts = [r[n][0] for r in per_rank]
        ends = [r[n][0] + r[n][1] for r in per_rank]
        out.skew.append(max(starts) - min(starts))
        out.slowest.append(max(r[n][1] for r in per_rank))
        out.synced.append(max(ends) - max(starts))
    return out


def median_step(events: list[dict]) -> list[dict]:
    """The events of the recorded step of median duration (``meshplan-step <i>`` spans,
    ``executor.profile.step_label``; with an even count the shorter middle one): the
    step a trace stands for, as the measured step is the median of the unrecorded ones (a
    step on a shared host now and then runs far slower than the others: one step's mean
    would carry it). All events when the trace has no step spans."""
    from executor.profile import STEP_PREFIX

    steps = sorted((e for e in events if str(e.get("name", "")).startswith(STEP_PREFIX)),
                   key=lambda e: e["dur"])
    if not steps:
        return events
    s = steps[(len(steps) - 1) // 2]
    return [e for e in events if e is not s and _encloses(s, e)]

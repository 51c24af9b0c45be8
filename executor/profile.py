"""Record the trace of a rank that ``meshplan calibrate --from-trace`` fits: the plan's
ops, each named, timed as a timed step runs them (``executor.span_trace``), and one short
PyTorch profiler (Kineto) pass for the aten ops' shapes.

:func:`profile_step` runs, after a rank's timed steps, (1) :data:`PROFILE_STEPS` steps
under ``torch.profiler.profile(activities=[CPU (+ CUDA)], record_shapes=True)`` (after one
warm-up step it discards, ``torch.profiler.schedule(warmup=1)``: the first profiled step of
a process is slower, the profiler's first-use costs), each in a span ``meshplan-profiled-step
<i>``, then (2) :data:`PAIRED_STEPS` rounds of one unrecorded step and one step whose
executed items are each in a :class:`~executor.span_trace.SpanRecorder` span, every step
after a barrier (as ``executor.run.rank_main`` times its steps), and writes it all to
``DIR/rank<R>.json``: the profiler's Chrome trace with the recorder's events
(``cat`` :data:`~executor.span_trace.SPAN_CAT`) appended after them.

Why two passes (issue 19): the profiler's spans and per-op events slowed the steps they
named (on 2 gloo ranks of a 2-layer LLaMA on this project's 2-core host the profiled steps
took 12% to 34% more CPU time of the rank's own threads than the unprofiled ones, from
``/proc/self/task``; the per-event probe explained 3% to 7%), and the
profiled steps ran at other moments than the timed ones, while other work on a shared host
comes and goes within seconds. The recorder costs well under a microsecond per span
(measured in the same run, :func:`~executor.span_trace.span_cost`, and taken off every span
by ``executor.trace_match``), and its steps alternate with unrecorded ones, whose median is
the step the fit is checked against. The profiler pass is read only for what needs aten
shapes (the in-place streaming ops' bytes, ``executor.trace_match.stream_samples``; a
foreign trace's GEMMs). Threads: each rank runs ``torch.set_num_threads(cores // ranks)``
intra-op threads (``executor.launch``; torchrun sets ``OMP_NUM_THREADS=1`` per process
itself); the executor issues no inter-op work, and gloo's two threads per rank
(``gloo_tcp_loop``, ``pt_gloo_runloop``) took under 1% of a core in those measurements.

Span names: each executed item of the rank plan ``meshplan::<phase> #<program op index>
<op type>`` (:func:`item_label`; phase F, B, W or O, the unit it ran in), each F/B/W unit
call ``meshplan::unit <phase><chunk> mb<m>``, each fused gradient all_reduce bucket of the
step ``meshplan::O bucket<i> all_reduce`` (its i-th bucket, ``RankExecutor.gradient_buckets``
order), each recorded step ``meshplan-step <i>``.

Why names instead of the profiler's own collective records: on torch 2.13 with gloo on
CPU the profiler records no ``record_param_comms`` event with message sizes; a gloo
collective shows as a ``c10d::allreduce_`` (etc.) ``cpu_op`` that only enqueues the work
(tens of microseconds) and a ``gloo:all_reduce`` annotation on gloo's worker thread, with
neither group size nor the wait. The item's span (issue to completion on the rank's
thread) and the plan's op (group and local bytes) give both: the bytes are the plan's,
matched by the span's name (its op index), not by order. Pipeline sends and receives get
no span.

The trace's top-level key :data:`META_KEY` holds ``rank``, ``world_size``,
``layers_per_stage`` (the layer split the run used), ``step_times_s`` (this rank's timed
steps), ``profiled_steps_s`` (the profiler pass's steps), ``profiler_event_s`` (what the
profiler costs per recorded op, :func:`profiler_event_cost`, taken off the streaming ops)
with ``probe_events`` (the events the probe left in the trace), ``paired_steps_s`` and
``span_steps_s`` (the unrecorded and the recorded steps of the rounds, in order),
``paired_cpu_s`` and ``span_cpu_s`` (the CPU time of the rank's thread in each of them,
``time.thread_time``: what the recording costs, which other processes' load does not add
to),
``span_event_s`` (the recorder's cost per span), ``span_count``, ``host`` (the host name)
and ``span_origin_ns`` / ``span_offset_us`` (a span's ``perf_counter_ns`` clock time is
``span_origin_ns + (ts - span_offset_us) * 1000``: the ranks of one host share that clock,
``executor.trace_match.round_alignment``). Step times are as
``rank_main`` counts them: from the step's start to the end of its optimizer phase.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import torch

from executor.errors import ExecutorError
from executor.quiet_stderr import kineto_quiet

#: Prefix of every name the executor gives a profiler span
PREFIX = "meshplan::"
#: Prefix of a unit call's span name
UNIT_PREFIX = f"{PREFIX}unit "
#: Prefix of a recorded step's span name
STEP_PREFIX = "meshplan-step "
#: Prefix of the span name of a step of the profiler pass
PROFILED_PREFIX = "meshplan-profiled-step "
#: Span names (not under :data:`PREFIX`: no op of the plan, ``trace_match`` skips them) of
#: a recorded step's work outside its units that the cost model charges elsewhere: the 1/m
#: scaling of the accumulated gradients (``simulator.grad_sync``'s ``scale``) and the
#: average over expert-data-parallel copies; in a span, they stay out of the step's
#: uncovered host time (``executor.trace_rounds.step_gap``)
GRAD_SCALE_LABEL = "meshplan-aside grad scale"
COPIES_AVERAGE_LABEL = "meshplan-aside copies average"
#: Top-level key of the trace metadata the executor adds
META_KEY = "meshplan"


def span(name: str) -> Any:
    """A profiler span named ``name``: torch's C++ ``_RecordFunctionFast`` where this torch
    has it (no Python work per span: ``torch.profiler.record_function`` costs tens of
    microseconds per span on a CPU host, as much as a small op, and would distort the very
    ops it names), else ``record_function``."""
    fast = getattr(torch._C._profiler, "_RecordFunctionFast", None)
    return fast(name) if fast is not None else torch.profiler.record_function(name)


def phase_of(key: Any) -> str:
    """The phase letter of a unit key: ``("F", c)`` -> ``F``; ``"step"``/``"pre"`` -> ``O``."""
    return str(key[0]) if isinstance(key, tuple) else "O"


def item_label(key: Any, index: int, op_type: str) -> str:
    """The span name of an executed item: ``meshplan::<phase> #<index> <op type>``."""
    return f"{PREFIX}{phase_of(key)} #{index} {op_type}"


def step_label(i: int) -> str:
    """The span name of the ``i``-th recorded step (``meshplan-step 0``; not under
    :data:`PREFIX`: it is no op of the plan)."""
    return f"{STEP_PREFIX}{i}"


def bucket_label(i: int) -> str:
    """The span name of the step's ``i``-th fused gradient all_reduce bucket."""
    return f"{PREFIX}O bucket{i} all_reduce"


def unit_label(key: Any, mb: int) -> str:
    """The span name of one F/B/W unit call: ``meshplan::unit F0 mb1``."""
    return f"{UNIT_PREFIX}{phase_of(key)}{key[1] if isinstance(key, tuple) else ''} mb{mb}"


def trace_path(directory: str | Path, rank: int) -> Path:
    """``DIR/rank<R>.json``."""
    return Path(directory) / f"rank{rank}.json"


#: calls of the probe mix per timing, and timings (the fastest kept) of :func:`profiler_event_cost`
PROBE_CALLS, PROBE_REPEATS = 40, 7
#: steps of the profiler pass (their streaming ops are pooled); 3, so that each streaming
#: op's size has at least 3 timings and a median that one preempted op does not move
#: (``executor.trace_plan_fit.stream_bandwidth``)
PROFILE_STEPS = 3
#: rounds of (unrecorded step, recorded step): one step on a shared host is one draw of
#: its noise; the fit pools the middle third of the recorded rounds by time
#: (``executor.trace_rounds.middle_rounds``), the measured step is the median of the
#: unrecorded ones; odd, so that both medians are steps that ran (an even count's two
#: middle steps, averaged, may be far apart on a loaded host: 193 and 288 ms in one run of
#: issue 19). 31, not 9: with per-step noise of +-15-20% the medians of 9 recorded and 9
#: unrecorded steps differed by up to 9% on their own; 31 rounds of the 2-layer test plan
#: add about 2.5 s a rank (issue 19, benchmarks/RESULTS.md)
PAIRED_STEPS = 31


def _probe_mix(x: torch.Tensor, y: torch.Tensor, a: torch.Tensor) -> None:
    """Small ops of the kinds a plan's kernels dispatch (a view, binary and reduction ops,
    a matmul, a concatenation, a where, a transposed copy): 1 to 3 inputs each, some
    with nested aten calls."""
    x.view(-1)
    torch.add(x, y)
    torch.mm(a, a)
    x.sum()
    torch.cat([x, y])
    torch.where(x > 0, x, y)
    a.t().contiguous()


def _probe_seconds() -> float:
    x, y, a = torch.zeros(4), torch.zeros(4), torch.zeros(4, 4)
    times = []
    for _ in range(PROBE_REPEATS):
        t0 = time.perf_counter()
        for _ in range(PROBE_CALLS):
            _probe_mix(x, y, a)
        times.append((time.perf_counter() - t0) / PROBE_CALLS)
    return min(times)  # other work on the core only ever adds time


def events_per_mix() -> int:
    """Profiler events one probe mix records (a short profiling session of one mix, with
    shapes; depends on the torch version)."""
    from torch.profiler import ProfilerActivity, profile

    x, y, a = torch.zeros(4), torch.zeros(4), torch.zeros(4, 4)
    with kineto_quiet(), profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        _probe_mix(x, y, a)
    return len(prof.events())


def profiler_event_cost(unprofiled: float, per_mix: int) -> float:
    """Seconds the active profiler adds per recorded op (with its shapes): the fastest
    time of the probe mix (:func:`_probe_mix`, :data:`PROBE_REPEATS` timings) while
    profiling less ``unprofiled`` (the same before the profiler started), over the
    ``per_mix`` events one mix records
    (:func:`events_per_mix`), >= 0. Call inside the profiling session."""
    return 0.0 if per_mix <= 0 else max(0.0, _probe_seconds() - unprofiled) / per_mix


def _finish(path: Path, rec: Any, pid: int, tid: int, **meta: Any) -> None:
    """Add ``meta`` under :data:`META_KEY` and the recorder's span events (placed 1 ms
    after the profiler's last event on the trace's timeline) to the trace file."""
    doc = json.loads(path.read_text(encoding="utf-8"))
    events = doc.setdefault("traceEvents", [])
    end = max((e["ts"] + e.get("dur", 0) for e in events
               if isinstance(e, dict) and isinstance(e.get("ts"), (int, float))), default=0.0)
    offset = float(end) + 1e3
    events.extend(rec.events(pid, tid, offset_us=offset))
    # a span's clock time is span_origin_ns + (ts - span_offset_us) * 1e3: comparable
    # between the ranks of one host (trace_match.round_alignment)
    doc.setdefault(META_KEY, {}).update(meta, span_origin_ns=rec.origin_ns, span_offset_us=offset)
    path.write_text(json.dumps(doc), encoding="utf-8")


def _barrier() -> None:
    if torch.distributed.is_initialized():
        torch.distributed.barrier()


def _timed_step(ex: Any, actions: Any) -> float:
    """One step of ``ex``, after a barrier as ``executor.run.rank_main`` times its steps;
    returns its time as rank_main counts it (step start to the optimizer phase's end)."""
    _barrier()
    return float(ex.run_step(actions)[-1][-1])


def profile_step(ex: Any, actions: Any, directory: str | Path, step_times: list[float],
                 layers: Any = None, steps: int = PROFILE_STEPS, pairs: int = PAIRED_STEPS) -> Path:
    """Record the trace of ``ex`` (a RankExecutor) over ``actions`` that ``meshplan
    calibrate --from-trace`` reads, to ``DIR/rank<R>.json`` (the directory is created):

    1. ``steps`` steps under ``torch.profiler`` (CPU activity, + CUDA on a GPU;
       ``record_shapes=True``, no stacks, memory or FLOPs), after one warm-up step it
       discards: every aten op with its shapes (the GEMMs' dims, the in-place streaming
       ops the copy bandwidth is fitted to); each step a span ``meshplan-profiled-step
       <i>``;
    2. ``pairs`` rounds of one unrecorded step and one step with every executed item, unit
       call and gradient bucket in a :class:`~executor.span_trace.SpanRecorder` span
       (names as the module docstring; each recorded step in ``meshplan-step <i>``),
       every step after a barrier, the unrecorded one first in even rounds and second in
       odd ones (so that neither kind is always the one right after the other): the op
       times the fit reads, taken as a timed step runs its ops, next to unrecorded steps
       of the same moments of the host.

    ``step_times``: this rank's timed steps (seconds), kept in the metadata with ``layers``
    (the run's layers per stage). Returns the path. Raises OSError when the directory
    cannot be written, ValueError for ``steps`` or ``pairs`` < 1."""
    from executor.span_trace import SpanRecorder, span_cost

    if steps < 1 or pairs < 1:
        raise ExecutorError(f"profile_step needs steps >= 1 and pairs >= 1, got {steps}, {pairs}")
    out = trace_path(directory, ex.rank)
    out.parent.mkdir(parents=True, exist_ok=True)
    per_mix = events_per_mix()
    wall, eps = _profiled_steps(ex, actions, out, steps, per_mix)
    rec = SpanRecorder()
    cost = span_cost()
    plain, recorded, plain_cpu, recorded_cpu = _paired_steps(ex, actions, rec, pairs)
    import os
    import socket
    import threading

    world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
    _finish(out, rec, os.getpid(), threading.get_native_id(), rank=ex.rank, world_size=world,
            layers_per_stage=layers, step_times_s=[float(t) for t in step_times],
            profiled_steps_s=wall, profiler_event_s=eps,
            probe_events=PROBE_REPEATS * PROBE_CALLS * per_mix, paired_steps_s=plain,
            span_steps_s=recorded, paired_cpu_s=plain_cpu, span_cpu_s=recorded_cpu,
            span_event_s=cost, span_count=len(rec.spans), host=socket.gethostname())
    return out


def _profiled_steps(ex: Any, actions: Any, out: Path, steps: int, per_mix: int) -> tuple[list[float], float]:
    """Phase 1 of :func:`profile_step`: one discarded warm-up step and ``steps`` steps under
    ``torch.profiler``, exported to ``out`` as a Chrome trace; returns their wall seconds and
    the profiler's cost per recorded event (seconds, ``profiler_event_cost``, probed while
    the last step records)."""
    from torch.profiler import ProfilerActivity, profile, schedule

    acts = [ProfilerActivity.CPU]
    if ex.device.type == "cuda":
        acts.append(ProfilerActivity.CUDA)
    bare = _probe_seconds()
    sched = schedule(wait=0, warmup=1, active=steps, repeat=1)
    wall: list[float] = []
    eps = 0.0
    with kineto_quiet(), profile(activities=acts, record_shapes=True, schedule=sched,
                                 on_trace_ready=lambda p: p.export_chrome_trace(str(out))) as prof:
        _timed_step(ex, actions)  # the profiler's warm-up step: recorded, then discarded
        prof.step()
        for i in range(steps):
            with span(f"{PROFILED_PREFIX}{i}"):
                wall.append(_timed_step(ex, actions))
            if i == steps - 1:  # while recording: the probe
                eps = profiler_event_cost(bare, per_mix)
            prof.step()
    return wall, eps


def _paired_steps(ex: Any, actions: Any, rec: Any, pairs: int
                  ) -> tuple[list[float], list[float], list[float], list[float]]:
    """Phase 2 of :func:`profile_step`: ``pairs`` ABBA rounds of one unrecorded step and one
    step with every item, unit call and gradient bucket in a span of ``rec`` (a
    ``SpanRecorder``); returns the wall and thread-CPU seconds of the unrecorded and the
    recorded steps (plain, recorded, plain_cpu, recorded_cpu)."""
    run_item, run_unit = ex.exec_item, ex.run_unit

    def named_item(it, mb, env, left, key):
        with rec.span(item_label(key, it.index, it.op.type)):
            run_item(it, mb, env, left, key)

    def named_unit(key, mb, env, left):
        if not isinstance(key, tuple):
            return run_unit(key, mb, env, left)
        with rec.span(unit_label(key, mb)):
            return run_unit(key, mb, env, left)

    def recorded_step(i: int) -> float:
        ex.exec_item, ex.run_unit, ex.bucket_span = named_item, named_unit, rec.span
        try:
            _barrier()
            with rec.span(step_label(i)):
                return float(ex.run_step(actions)[-1][-1])
        finally:
            ex.exec_item, ex.run_unit, ex.bucket_span = run_item, run_unit, None

    plain: list[float] = []
    recorded: list[float] = []
    plain_cpu: list[float] = []
    recorded_cpu: list[float] = []

    def cpu_timed(step: Any, walls: list, cpus: list) -> None:
        c0 = time.thread_time()
        walls.append(step())
        cpus.append(time.thread_time() - c0)

    for i in range(pairs):  # ABBA: the unrecorded step first in even rounds, second in odd ones
        if i % 2 == 0:
            cpu_timed(lambda: _timed_step(ex, actions), plain, plain_cpu)
        cpu_timed(lambda i=i: recorded_step(i), recorded, recorded_cpu)
        if i % 2 == 1:
            cpu_timed(lambda: _timed_step(ex, actions), plain, plain_cpu)
    return plain, recorded, plain_cpu, recorded_cpu

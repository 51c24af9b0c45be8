"""Record a PyTorch profiler (Kineto) Chrome trace of a few steps of a rank, with every
executed op of the plan named, so ``executor.trace_match`` can match the trace's time to
the plan's ops.

:func:`profile_step` runs :data:`PROFILE_STEPS` more steps of a
:class:`~executor.rank_exec.RankExecutor` under ``torch.profiler.profile(activities=[CPU
(+ CUDA)], record_shapes=True)`` and writes them to ``DIR/rank<R>.json``. They are extra
steps after the timed ones (the profiler's own per-event work slows them, so they are
never measured steps); several, because one step on a shared host is one draw of its
noise. One more step runs first under the profiler's warm-up (``torch.profiler.schedule(
warmup=1)``: recorded and discarded): the first profiled step of a process is slower
than the next ones (in this project's runs up to 2x: the profiler's first-use costs). Each
executed item of the rank plan is wrapped in a profiler span (:func:`span`) whose name
(:func:`item_label`) is ``meshplan::<phase> #<program op index> <op type>`` (phase F, B,
W or O, the unit it ran in), each F/B/W unit call in ``meshplan::unit <phase><chunk>
mb<m>`` and each fused gradient all_reduce bucket of the step in ``meshplan::O bucket<i>
all_reduce`` (its i-th bucket, ``RankExecutor.gradient_buckets`` order), each profiled
step in ``meshplan-step <i>``. The aten ops
(``cpu_op``) that an item launched lie inside its span on the same thread.

Why names instead of the profiler's own collective records: on torch 2.13 with gloo on
CPU the profiler records no ``record_param_comms`` event with message sizes; a gloo
collective shows as a ``c10d::allreduce_`` (etc.) ``cpu_op`` that only enqueues the work
(tens of microseconds) and a ``gloo:all_reduce`` annotation on gloo's worker thread, with
neither group size nor the wait. The item's span (issue to completion on the rank's
thread) and the plan's op (group and local bytes) give both: the bytes are the plan's, matched by
the span's name (its op index), not by order. Pipeline sends and receives get no span.

The trace's metadata (``prof.add_metadata_json``) key :data:`META_KEY` holds ``rank``,
``world_size``, ``layers_per_stage`` (the layer split the run used), ``step_times_s``
(this rank's timed steps, unprofiled), ``profiled_steps_s`` (the profiled steps' wall
times) and ``profiler_event_s``: what the profiler itself costs per recorded op, measured
by :func:`profiler_event_cost` in the same session (``executor.trace_match`` takes it off
every span), with ``probe_events``, the events the probe itself left in the trace, and
``after_step_s``: one more step right after, unprofiled (its time against the profiled
steps' tells the profiler's slowdown from the host's at that moment).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import torch

#: Prefix of every name the executor gives a profiler span
PREFIX = "meshplan::"
#: Prefix of a unit call's span name
UNIT_PREFIX = f"{PREFIX}unit "
#: Prefix of a profiled step's span name
STEP_PREFIX = "meshplan-step "
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
    """The span name of the ``i``-th profiled step (``meshplan-step 0``; not under
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
#: steps one trace records (their samples are pooled: one step on a shared host is one
#: draw of its noise)
PROFILE_STEPS = 3


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
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        _probe_mix(x, y, a)
    return len(prof.events())


def profiler_event_cost(unprofiled: float, per_mix: int) -> float:
    """Seconds the active profiler adds per recorded op (with its shapes): the fastest
    time of the probe mix (:func:`_probe_mix`, :data:`PROBE_REPEATS` timings) while
    profiling less ``unprofiled`` (the same before the profiler started), over the
    ``per_mix`` events one mix records
    (:func:`events_per_mix`), >= 0. Call inside the profiling session."""
    return 0.0 if per_mix <= 0 else max(0.0, _probe_seconds() - unprofiled) / per_mix


def _add_meta(path: Path, **kv: Any) -> None:
    doc = json.loads(path.read_text(encoding="utf-8"))
    doc.setdefault(META_KEY, {}).update(kv)
    path.write_text(json.dumps(doc), encoding="utf-8")


def profile_step(ex: Any, actions: Any, directory: str | Path, step_times: list[float],
                 layers: Any = None, steps: int = PROFILE_STEPS) -> Path:
    """Run ``steps`` steps of ``ex`` (a RankExecutor) over ``actions`` under the profiler,
    every item, unit call and gradient bucket named (module docstring), and write their
    trace to ``DIR/rank<R>.json`` (the directory is created). ``step_times``: this rank's
    timed steps (seconds), kept in the metadata with ``layers`` (the run's layers per
    stage). Returns the path. Raises OSError when the directory cannot be written."""
    from torch.profiler import ProfilerActivity, profile, schedule

    out = trace_path(directory, ex.rank)
    out.parent.mkdir(parents=True, exist_ok=True)
    run_item, run_unit = ex.exec_item, ex.run_unit

    def named_item(it, mb, env, left, key):
        with span(item_label(key, it.index, it.op.type)):
            run_item(it, mb, env, left, key)

    def named_unit(key, mb, env, left):
        if not isinstance(key, tuple):
            return run_unit(key, mb, env, left)
        with span(unit_label(key, mb)):
            return run_unit(key, mb, env, left)

    acts = [ProfilerActivity.CPU]
    if ex.device.type == "cuda":
        acts.append(ProfilerActivity.CUDA)
    per_mix, bare = events_per_mix(), _probe_seconds()
    ex.exec_item, ex.run_unit, ex.profile_buckets = named_item, named_unit, True
    try:
        sched = schedule(wait=0, warmup=1, active=steps, repeat=1)
        with profile(activities=acts, record_shapes=True, schedule=sched,
                     on_trace_ready=lambda p: p.export_chrome_trace(str(out))) as prof:
            ex.run_step(actions)  # the profiler's warm-up step: recorded, then discarded
            prof.step()
            wall = []
            for i in range(steps):
                t0 = time.perf_counter()
                with span(step_label(i)):
                    ex.run_step(actions)
                wall.append(time.perf_counter() - t0)
                if i == steps - 1:  # while recording: the probe and the metadata
                    eps = profiler_event_cost(bare, per_mix)
                    prof.add_metadata_json(META_KEY, json.dumps({
                        "rank": ex.rank, "world_size": torch.distributed.get_world_size()
                        if torch.distributed.is_initialized() else 1, "layers_per_stage": layers,
                        "step_times_s": [float(t) for t in step_times], "profiled_steps_s": wall,
                        "profiler_event_s": eps, "probe_events": PROBE_REPEATS * PROBE_CALLS * per_mix}))
                prof.step()
    finally:
        ex.exec_item, ex.run_unit, ex.profile_buckets = run_item, run_unit, False
    t0 = time.perf_counter()  # one unprofiled step after: the profiler's cost vs the moment's
    ex.run_step(actions)
    _add_meta(out, after_step_s=time.perf_counter() - t0)
    return out

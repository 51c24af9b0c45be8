"""Lower bounds on a plan's simulated step time and peak memory, without building or
playing its pipeline schedule: what an exhaustive search prunes with.

For a :class:`simulator.step.StepModel` (the same stage times, gradient sync, optimizer
and memory terms :meth:`StepModel.run` uses), :func:`step_lower_bound` returns
``(time_s, memory_bytes)`` with ``time_s <= run().step_time`` and ``memory_bytes <=
run().max_memory_bytes``. Proof, term by term (the engine's model, module docstring of
:mod:`simulator.pipeline_sim`):

* Every action of pipeline rank r runs on its one compute stream, one after another, so
  its last action ends no earlier than its first starts plus the sum of its actions'
  durations ``busy_r = m * sum over its virtual stages of (T_F + T_BW)`` (fused backward
  schedules) or ``(T_F + T_B + T_W)`` (split ones) -- the per-layer costs.
* No action of rank r can start before the forward of micro-batch 0 has passed every
  virtual stage below the rank's lowest one, ``s_r``: every pass of a virtual stage
  ``vs >= s_r`` depends on F(vs - 1) and so down to F(0). So its first action starts no
  earlier than ``chain_r = sum_{vs < s_r} T_F(vs) + T_comm * (rank changes among them)``:
  the schedule's ideal warm-up bubble (Narayanan et al. 2021, sec. 2.2: the (p - 1) T_F
  a 1F1B pipeline fills before the last stage starts).
* Rank r's finish is its last action's end plus its gradient sync and its optimizer step
  (:meth:`StepModel._rank`); of the sync, the exposed part of the dp stream,
  ``max(0, dp_end - end)``, is >= 0 and dropped, every other term does not depend on the
  timeline and is kept as computed there.

So ``step_time = max_r finish_r >= max_r (chain_r + busy_r + sync_r + opt_r)``. Times enter
the engine rounded to integer ns, so each action may be up to 0.5 ns shorter than its
float: the bound subtracts 1 ns per action and per hop counted.

Memory: a rank's total is a sum of non-negative terms of which only the activation peak
depends on the timeline (:func:`simulator.step_memory.rank_memory`); at the start of the
first forward of any of its chunks the rank holds at least that chunk's M_B (every free
follows its own forward's start when pass times are positive, which they are: each pass
carries the per-pass host overhead), so the peak is at least the largest chunk's M_B.

For a schedule whose order does not depend on the stage times (every builder but the
time-aware ones, ``simulator.schedules.base.TIME_AWARE``) the activation peak is not a
bound but the simulated value itself (:func:`order_activation_peaks`): a rank plays its
actions strictly in schedule order on its one compute stream (``simulator.pipeline_sim``),
so with every pass at least 1 ns long action k+1 starts no earlier than action k ends and
ends later than it starts. The timeline's changes of the rank (+M_B at an F's start, a free
at a B / W / BW end, frees before allocations at equal times:
``simulator.memory.activation_changes``) then sort exactly in action order, and the running
sum over them -- the same float additions in the same order -- is the simulated peak. The
memory "bound" of such a plan is its simulated peak memory, so the search prunes every plan
that cannot fit without playing its pipeline.
"""

from __future__ import annotations

import functools
import itertools
from typing import Any

from simulator.bounds.tier0 import INFLIGHT
from simulator.grad_sync import (
    fixed_time,
    held_reduce_time,
    optimizer_time,
    param_gather_time,
    sync_time,
    tail_collectives,
)
from simulator.memory import activation_delta
from simulator.schedules import build_schedule
from simulator.schedules.base import TIME_AWARE
from simulator.stage_cost import BlockCost
from simulator.stage_timing import vstage_ranks
from simulator.step_memory import vstage_activation_bytes

NS = 1e-9


@functools.lru_cache(maxsize=64)
def fused_backward(schedule: str, vpp: int) -> bool:
    """Whether the registered ``schedule`` runs fused BW actions (read off its smallest
    instance: one stage, one micro-batch) rather than split B and W."""
    kinds = {a.kind for row in build_schedule(schedule, 1, 1, vpp).actions for a in row}
    return "BW" in kinds


def _passes_positive(t: dict[str, float], fused: bool) -> bool:
    """Whether every pass a virtual stage plays lasts at least 1 ns once the engine rounds
    it (``simulator.pipeline_sim.normalize_stage_times``: a fused BW is its own time, else
    B + W)."""
    f, b, w = (round(float(t.get(k, 0.0)) * 1e9) for k in "FBW")
    bw = round(float(t["BW"]) * 1e9) if "BW" in t else b + w
    return f >= 1 and (bw >= 1 if fused else min(b, w) >= 1)


def order_activation_peaks(model: Any, times: list[dict[str, float]]) -> list[float] | None:
    """Per pipeline rank, the activation peak (bytes) ``model.run()`` finds, from the
    schedule's action order alone (module docstring), or None where the order depends on
    the stage times (a time-aware schedule) or a pass of the rank would round to 0 ns (the
    order argument needs positive passes). ``times``: the stage times per virtual stage
    (``model.stage_time(vs)[0]``). The per-chunk bytes are those of ``StepModel.run``."""
    c = model.cfg
    if c.schedule in TIME_AWARE:
        return None
    fused = fused_backward(c.schedule, c.vpp)
    if not all(_passes_positive(t, fused) for t in times):
        return None
    if c.schedule in INFLIGHT and c.vpp == 1 and fused:
        # one chunk per rank, F and BW only: the running sum peaks at k_r forwards in a row
        # (INFLIGHT: the builder's in-flight counts), k_r x M_B -- exact in floats for whole
        # byte counts below 2**53, as the play's repeated additions are
        ks = INFLIGHT[c.schedule](c.pp, c.num_microbatches)
        mbs = [vstage_activation_bytes(model.costs.activations, "by_block", model.costs.layer_keys,
                                       model.vs_layers[r], r == 0, r == model.nvs - 1) for r in range(c.pp)]
        if all(mb >= 0 and mb == int(mb) and k * mb < 2**53 for k, mb in zip(ks, mbs, strict=True)):
            return [k * mb for k, mb in zip(ks, mbs, strict=True)]
    sched = model.schedule(times)
    where = sched.rank_of_vstage()
    per_chunk = {}
    for vs in range(model.nvs):
        args = (model.costs.layer_keys, model.vs_layers[vs], vs == 0, vs == model.nvs - 1)
        mb = vstage_activation_bytes(model.costs.activations, "by_block", *args)
        mw = vstage_activation_bytes(model.costs.activations, "w_by_block", *args)
        per_chunk[where[vs]] = (mb, min(mw, mb))
    peaks = []
    for r, (kinds, codes) in enumerate(_action_codes(sched)):
        table = [activation_delta(k, *per_chunk.get((r, ch), (0.0, 0.0))) for k, ch in kinds]
        # the running sum of StepModel.run's peak (timeline_activation_peaks), the same float
        # additions in the same order: accumulate adds left to right
        peaks.append(max(itertools.accumulate(map(table.__getitem__, codes), initial=0.0)))
    return peaks


def _action_codes(sched: Any) -> list[tuple[list[tuple[str, int]], list[int]]]:
    """Per rank of ``sched``: its distinct (kind, chunk) pairs and, per action in order, the
    index of its pair; computed once per schedule (kept on it: a built schedule is
    immutable and shared by every plan of its shape, ``build_schedule``'s cache)."""
    hit = sched.__dict__.get("_action_codes")
    if hit is None:
        hit = []
        for row in sched.actions:
            index: dict[tuple[str, int], int] = {}
            codes = [index.setdefault((a[0], a[3]), len(index)) for a in row]
            hit.append((list(index), codes))
        object.__setattr__(sched, "_action_codes", hit)
    return hit


def step_lower_bound(model: Any) -> tuple[float, int]:
    """``(seconds, bytes)``: lower bounds on ``model.run().step_time`` and on its
    ``max_memory_bytes`` (module docstring), for a :class:`simulator.step.StepModel`.
    Costs what computing the stage times costs; builds no schedule and plays nothing."""
    c = model.cfg
    nvs, m = model.nvs, c.num_microbatches
    timed = [model.stage_time(vs) for vs in range(nvs)]
    times = [t for t, _ in timed]
    t_comm = model.comm_time()
    fused = fused_backward(c.schedule, c.vpp)
    where = vstage_ranks(c.schedule, c.pp, c.vpp)
    per_rank: list[list[int]] = [[] for _ in range(c.pp)]
    for vs, r in enumerate(where):
        per_rank[r].append(vs)
    # chain[vs]: forward of micro-batch 0 through virtual stages 0..vs-1 and its hops
    chain, hops = [0.0] * (nvs + 1), [0] * (nvs + 1)
    for vs in range(nvs):
        cross = vs + 1 < nvs and where[vs + 1] != where[vs]
        chain[vs + 1] = chain[vs] + times[vs]["F"] + (t_comm if cross else 0.0)
        hops[vs + 1] = hops[vs] + 1 + cross
    prof = c.profile
    exact = order_activation_peaks(model, times)
    best_t, best_m = 0.0, 0
    for r, vstages in enumerate(per_rank):
        if not vstages:
            continue
        per_mb = sum(t["F"] + (t["BW"] if fused else t["B"] + t["W"]) for t in (times[vs] for vs in vstages))
        n_actions = m * len(vstages) * (2 if fused else 3)
        rank_layers = sorted({i for vs in vstages for i in model.vs_layers[vs]})
        params = model.rank_params(vstages)
        synced = model.rank_params(vstages, synced=True)
        expert = params - synced  # as StepModel._rank (simulator.expert_parallel)
        layer_blocks: list[BlockCost] = [model.costs.layers[i] for i in rank_layers]
        blocks = [b for vs in vstages for b in model.timer.blocks(vs)]
        tensors = len({name for b in blocks for name in b.params})
        if prof is None:
            sync = sync_time(c, model.cluster, r, synced, layer_blocks, times[vstages[0]]["B"])
            fixed = 0.0
        else:
            sync = tail_collectives(c, model.cluster, r, layer_blocks)
            sync += held_reduce_time(c, model.cluster, r, synced)
            sync += param_gather_time(c, model.cluster, r, synced, times[vstages[0]]["F"])
            fixed = fixed_time(c, model.cluster, model.rf, r, params, model.tied_elems(), expert=expert)
        opt = optimizer_time(c, model.rf, params, tensors, expert=expert) + fixed
        first = min(vstages)
        lb = chain[first] + m * per_mb + sync + opt - (n_actions + hops[first]) * NS
        best_t = max(best_t, lb)
        chunk_mb = [vstage_activation_bytes(model.costs.activations, "by_block", model.costs.layer_keys,
                                            model.vs_layers[vs], vs == 0, vs == nvs - 1) for vs in vstages]
        freed = None
        if exact is None:
            act = max(chunk_mb, default=0.0)
        else:  # the simulated peak, and the bytes a backward frees as StepModel.run counts them
            act, freed = exact[r], int(min(chunk_mb, default=0))
        # the same memory terms as StepModel.run (model states by profile, the loss's
        # temporaries on its rank, FP8 weight copies): only the activation peak is a bound
        mem = model.rank_memory_terms(vstages, params, expert, rank_layers, layer_blocks, blocks, act, freed)
        best_m = max(best_m, int(mem["total"]))
    return max(0.0, best_t), best_m


__all__ = ["fused_backward", "step_lower_bound"]

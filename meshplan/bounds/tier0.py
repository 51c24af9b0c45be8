"""The tier-0 bound of a scorer config: ``candidate -> Bound`` without completing its layout.

``simulator.bounds.tier0`` proves the inequality; this module feeds it. Per micro-batch size
and per ``seq_len / cp`` it builds the unsharded one-rank representative program of the
model (``completion.plan_program.build_plan_program`` with dp = tp = pp = cp = 1: no
completion, a few milliseconds) under the scorer's framework profile and attention, and
reads its per-block works (``simulator.bounds.tier0.block_work``); each candidate then
costs a few arithmetic operations (:class:`Tier0Bound`).

Memory: the peak of a rank is its model states plus non-negative terms
(``simulator.step_memory.rank_memory``), and every state model of
``simulator.model_states`` is non-decreasing in the rank's parameter elements P with its
buffer terms >= 0. Tensor rank 0 holds at least ``1 / tp`` of each parameter (the shards
cover it; the first is the largest) -- and all of each parameter its annotation places
``Replicate()`` on the tensor mesh dim (a pattern candidate's ``replicated`` templates,
``tuner.patterns.apply_templates``; completion keeps a user's placement) -- so the
pipeline ranks of tensor rank 0 hold at least ``P_rank0 = sum over parameters of
(elements if replicated else elements / tp)`` together and the fullest at least
``P_rank0 / pp``. The bound is
the state model of the framework profile at that P, sharded over ``N`` = the ZeRO shard
degree of the folded strategy (``dp * cp``, or ``fsdp_shard_size * cp``), with every buffer
term (largest tensor, FSDP root and blocks) at 0 (and, where the pipeline accumulates
FSDP gradients unsharded, ``simulator.dp_groups.pipeline_holds_unsharded``, its unsharded
weights and gradients at that P: non-decreasing in P too). With expert parallelism (``ep`` > 1) a
rank holds 1 / ep of the experts and all of the dense parameters, at least ``P / ep``
elements, and its expert states shard over dp / ep ranks (``simulator.expert_parallel``):
the bound takes ``P_rank0 / (pp * ep)`` sharded over N, below both.

A second memory bound (:meth:`Tier0Bound.split_memory_bytes`) adds each rank's activations
and the fixed lines, per pipeline rank and for every split of the layers at once
(``simulator.bounds.tier0.least_peak``: the heaviest rank is at least the least, over all
splits, of the heaviest rank). Rank r holding ``n`` decoder layers has at least

* model states at ``n * p_layer`` elements plus the "pre" block's on rank 0 and the "post"
  block's on the rank of the last virtual stage (``p_layer``: the smallest layer's
  elements on tensor rank 0 as above; an end block's unsharded elements over ``tp``), by
  the same monotone state model;
* activations ``k_r * A(n)``: ``k_r`` micro-batches in flight
  (``simulator.bounds.tier0.inflight_counts`` for an order-fixed schedule; at least
  ``1 / vpp`` of the rank's layers for any schedule: the first forward of its largest
  chunk) times ``A(n) = n a_mid - (a_mid - a_first)^+ - (a_mid - a_last)^+``: of any n
  layers at most one is the model's first and one its last, the others stand for the
  middle ones (``simulator.program_costs.layer_roles``), each role's saved bytes per
  micro-batch at least ``a_role`` (:meth:`Tier0Bound.layer_activation_bytes`);
* the recompute transient: at least the smallest role's dropped bytes ``d``, a middle
  layer's once ``n >= 3``; on the loss's rank the framework's loss temporaries
  (``memory.loss_temp_bytes`` x the local logits, at least the unsharded ones over tp);
* the profile's library workspace, its fragmentation share of these allocator lines
  (floor), the CUDA context and the NCCL buffers of its communicators
  (``simulator.step_memory.rank_memory``; ``communicators`` without the HSDP group).

FP8 weight copies and amax histories (``simulator.fp8.fp8_state_bytes``, added to a rank's
total outside the allocator lines): at least ``n`` times the unsharded FP8 program's
smallest layer's over ``tp * ep`` (the same linears are marked at every tp,
``completion.fp8.mark_fp8_linears``; a local weight is at least the global one over the
ranks that split it).

Time under ZeRO-3 (:meth:`Tier0Bound.zero3_time_s`): every layer's chain all_gathers its
weights over the shard group in each micro-batch's forward (and again in its backward when
the profile reshards after forward, or always when nothing is prefetched) and, unless the
pipeline holds its gradients unsharded, reduce-scatters its gradients in the backward, all
on one communication stream (``simulator.stage_timing.StageTimer._zero3_times``,
``simulator.streams.prefetched_chain``: a chain ends after every item its stream ran), so
``sum_r busy_r >= m * L * (per-layer collectives)`` with the layer's bytes at least
``p_layer`` elements x the smallest parameter element size (1 byte where the framework
keeps FP8 parameters) and the cluster's collective times non-decreasing in bytes; the
bound is that over pp, less 1 ns per action, beside the compute bound (their maximum).

``a``, ``d``, logits: the unsharded one-rank program of the micro-batch (its ``seq_len /
cp`` tokens and FP8 recipe) saves, per layer, the values its backward reads
(``simulator.memory.saved_activations``, same recompute policy and framework reads). The
plan's costing program runs the same forward and backward ops on its ``[D, tp]`` mesh with
reshards between them (``completion.plan_program``; D data-parallel replicas: dp, dp x cp
once a cp plan is folded, ``completion.context_parallel.fold_strategy``, or the ep ranks
of one expert-data-parallel copy); a value its backward reads is the same global tensor,
or, read through a reshard, the reshard's input (the same tensor; the sequence-parallel
all_gather keeps its sharded input: ``simulator.memory``), with D times the batch (expert
slots are per sequence, ``completion.models.moe``: D times too). The accounting takes each
value's largest shard on the mesh, at least its global size over the ``D * tp`` ranks,
hence at least the unsharded value over ``tp``: each bound is the unsharded one ``// tp``.
Made where the in-flight argument holds (forward passes of at least 1 ns: a layer's
forward kernels over ``tp``, ``simulator.bounds.tier0``, or the per-pass host overhead)
and for at least 3 layers; elsewhere 0. ``tests/meshplan/test_tier0_memory.py`` checks them against
every layer of completed programs (Megatron and pattern layouts, cp, FP8 recipes, expert
parallelism) and the whole bound against simulated peaks (hypothesis, four frameworks,
every schedule).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from clusters import load_cluster
from clusters.spec import DEFAULT_MEMORY_HEADROOM
from completion.models import get_model_config
from completion.models.source import resolve_model
from completion.plan_program import build_plan_program
from completion.strategy import Strategy
from meshplan.engine import Engine
from simulator.bounds.step import fused_backward
from simulator.bounds.tier0 import (
    INFLIGHT,
    BlockWork,
    block_work,
    compute_peak,
    inflight_counts,
    least_peak,
    tier0_step_time,
)
from simulator.dp_groups import pipeline_holds_unsharded
from simulator.model_states import StateInputs, model_states
from simulator.program_costs import layer_roles
from simulator.stage_timing import reduce_bytes
from simulator.step_memory import communicators
from tuner.exhaustive import Bound
from tuner.space import Candidate


class Tier0Bound:
    """``bound(c) -> Bound(time_s, 0, memory limit)`` with ``time_s <=`` the step time
    ``meshplan.tuning.make_scorer(config)(c)`` simulates (``simulator.bounds.tier0``).

    ``config``: the scorer config (model, cluster, nodes, global_batch_size, seq_len, dtype,
    num_layers, framework, attention, memory_headroom). Raises ValueError (the engine's
    errors) for a model or cluster the engine refuses."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        self.cl = load_cluster(config["cluster"], config.get("nodes"))
        self.model, self.num_layers = config["model"], config.get("num_layers")
        self.seq, self.gb = int(config["seq_len"]), int(config["global_batch_size"])
        self.dtype = config.get("dtype", "bfloat16")
        self.framework = config.get("framework") or "megatron-core"
        self.cap = int(self.cl.device.memory_limit(config.get("memory_headroom", DEFAULT_MEMORY_HEADROOM)))
        one = Strategy(dp=1, tp=1, pp=1, micro_batch_size=1, global_batch_size=1, dtype=self.dtype,
                       framework=self.framework, attention=config.get("attention"))
        e = Engine(self.model, self.cl, one, seq_len=self.seq, num_layers=self.num_layers)
        self.rf, self.profile, self.attention = e.roofline, e.profile, e.strategy.attention
        sm = e.step_model()
        self.params, self.step_cfg = sm.rank_params([0]), sm.cfg  # every parameter, once
        self.layers = self.num_layers or get_model_config(self.model).num_layers
        self._rank_params: dict[tuple[int, tuple], int] = {}
        self._times: dict[tuple, float] = {}
        self._works: dict[tuple[int, int, bool], tuple[list[BlockWork], BlockWork | None, BlockWork | None]] = {}
        self._programs: dict[tuple[int, int, str | None], tuple[Any, int]] = {}
        self._layer_params: dict[tuple, int] = {}
        self._acts: dict[tuple, tuple[tuple[int, int, int], tuple[int, int, int], int]] = {}
        self._split: dict[tuple, int] = {}
        self._inflight: dict[tuple, tuple[float, ...]] = {}
        self.one = sm
        self._ends: dict[int, tuple[int, int, int]] = {}
        self._z3: dict[tuple, float] = {}
        self._fp8_state: dict[tuple, int] = {}
        self.elem_bytes = min((b // n for blk in sm.costs.layers for n, b in blk.params.values() if n),
                              default=1)
        self._n = np.arange(self.layers + 1, dtype=np.int64)
        self._states: dict[tuple, np.ndarray] = {}
        self.tied = sm.tied_elems() > 0
        self.layer_elems = min((sum(n for n, _ in b.params.values()) for b in sm.costs.layers), default=0)

    def program(self, mbs: int, cp: int, fp8: str | None = None) -> Any:
        """The unsharded one-rank representative program of micro-batch ``mbs`` and
        ``seq_len / cp`` tokens, under FP8 recipe ``fp8`` (built once per key)."""
        key = (mbs, cp, fp8)
        if key not in self._programs:
            src = resolve_model(self.model, self.seq // cp, None, self.num_layers)
            s = Strategy(dp=1, tp=1, pp=1, micro_batch_size=mbs, global_batch_size=mbs, dtype=self.dtype,
                         framework=self.framework, attention=self.attention,
                         **({"fp8": fp8} if fp8 is not None else {}))
            self._programs[key] = (build_plan_program(src, s, representative=True, resolve_reshards=False,
                                                      fp8_weights=self.profile.fp8_weights).program,
                                   src.num_layers)
        return self._programs[key][0]

    def works(self, mbs: int, cp: int, fp8: bool = False
              ) -> tuple[list[BlockWork], BlockWork | None, BlockWork | None]:
        """(per model layer, pre, post) works in seconds of micro-batch ``mbs`` of
        ``seq_len / cp`` tokens at the peak of an ``fp8`` plan or not (built once per key)."""
        key = (mbs, cp, fp8)
        if key not in self._works:
            prog = self.program(mbs, cp)
            w = block_work(prog, self.rf, self.profile, compute_peak(self.rf, fp8))
            ids = sorted(k for k in w if isinstance(k, int))
            layers = [w[k] for k in layer_roles(ids, self._programs[(mbs, cp, None)][1])] if ids else []
            self._works[key] = (layers, w.get("pre"), w.get("post"))
        return self._works[key]

    def time_s(self, c: Candidate) -> float:
        """The tier-0 time bound (s) of candidate ``c``: a function of (micro-batch, cp, FP8
        or not, tp, pp, vpp, micro-batches, recompute, fused backward) only, computed once
        per such key (candidates differing in ZeRO, SP, templates or dp share it)."""
        m, fused = c.num_microbatches(self.gb), fused_backward(c.schedule, c.vpp)
        key = (c.micro_batch_size, c.cp, c.fp8 is not None, c.tp, c.pp, c.vpp, m, c.recompute, fused)
        t = self._times.get(key)
        if t is None:
            layers, pre, post = self.works(c.micro_batch_size, c.cp, c.fp8 is not None)
            t = self._times[key] = tier0_step_time(layers, pre, post, peak=1.0, tp=c.tp, pp=c.pp, vpp=c.vpp,
                                                   num_microbatches=m, recompute=c.recompute,
                                                   fused_backward=fused)
        return t

    def zero3_time_s(self, c: Candidate) -> float:
        """A second tier-0 time bound (s) for ZeRO-3: the parameter gathers and gradient
        reduces every layer's chain runs on one communication stream per micro-batch
        (module docstring), 0 below ZeRO-3 or with one shard rank."""
        n = (c.fsdp_shard_size or c.dp) * c.cp
        if c.zero < 3 or c.dp * c.cp == 1:
            return 0.0
        key = (self.layer_params(c), self._param_bytes(c), c.zero, c.dp, c.cp, c.fsdp_shard_size, c.tp, c.pp,
               c.vpp, c.num_microbatches(self.gb), fused_backward(c.schedule, c.vpp))
        t = self._z3.get(key)
        if t is None:
            from types import SimpleNamespace

            from simulator import dp_groups
            from simulator.stage_timing import reduce_bytes as _reduce_bytes

            cfg = SimpleNamespace(dp=c.dp * c.cp, tp=c.tp, pp=c.pp, zero=c.zero, profile=self.profile,
                                  fsdp_shard_size=None if c.fsdp_shard_size is None else c.fsdp_shard_size * c.cp)
            g = dp_groups.gather_time(self.cl, cfg, 0, self._param_bytes(c) * self.layer_params(c))
            depth = self.profile.overlap.fsdp_prefetch.value
            unsharded = dp_groups.pipeline_holds_unsharded(self.profile, c.pp, c.zero, n)
            if depth < 1:  # every gather exposed, in F and again in B
                per = 2 * g
            else:
                again = self.profile.overlap.fsdp_reshard_after_forward.value and not unsharded
                red = 0.0 if unsharded else dp_groups.reduce_time(
                    self.cl, cfg, 0, self.layer_params(c) * _reduce_bytes(self.step_cfg))
                per = g * (2 if again else 1) + red
            m, nvs = c.num_microbatches(self.gb), c.pp * c.vpp
            actions = m * nvs * (2 if key[-1] else 3) + 2 * nvs
            t = self._z3[key] = max(0.0, m * self.layers * per / c.pp - actions * 1e-9)
        return t

    def _param_bytes(self, c: Candidate) -> int:
        """Bytes per parameter element a layer's gathered weights have at least: the
        smallest of the one-rank program's layer parameters' (1 for an FP8 recipe whose
        framework keeps FP8 parameters, its profile's ``fp8.params``)."""
        if c.fp8 is not None and self.profile.fp8_weights.params:
            return 1
        return self.elem_bytes

    def rank_params(self, c: Candidate) -> int:
        """A lower bound on the parameter elements tensor rank 0 holds over all its
        pipeline ranks (module docstring): a template candidate's replicated parameters
        whole, every other one split ``tp`` ways (a parameter of the one-layer template
        program named ``...layers.0...`` stands for every layer)."""
        if c.tp == 1:
            return self.params
        if c.annotation != "templates":
            return self.params // c.tp
        key = (c.tp, c.templates)
        if key not in self._rank_params:
            from meshplan.templates import template_program
            from tuner.patterns import apply_templates

            prog, pats = template_program(self.model, self.seq)
            ann = apply_templates(prog, pats, c.template_dict())
            whole = shard = 0.0
            for v in prog.parameters():
                n = 1
                for d in v.shape:
                    n *= d
                n *= self.layers if ".layers.0." in (v.name or "") else 1
                pl = ann.get(v.name or "")
                if pl is not None and len(pl) == 2 and pl[1].startswith("Replicate"):
                    whole += n
                else:
                    shard += n
            # never above the step model's own count (tied tables, a program of other shape)
            self._rank_params[key] = int(min(self.params, whole + shard / c.tp))
        return self._rank_params[key]

    def memory_bytes(self, c: Candidate) -> int:
        """The tier-0 memory bound (bytes) of candidate ``c`` (module docstring)."""
        x = self.step_cfg
        n = (c.fsdp_shard_size or c.dp) * c.cp
        states = model_states(self.profile.memory.model_states.value,
                              StateInputs(params=self.rank_params(c) // c.pp // c.ep, dp=n, zero=c.zero,
                                          param_bytes=x.param_bytes, grad_bytes=x.grad_bytes,
                                          optimizer_bytes=x.optimizer_bytes,
                                          reduce_bytes=reduce_bytes(x),
                                          accumulate_unsharded=pipeline_holds_unsharded(
                                              self.profile, c.pp, c.zero, n)))
        return int(states.total)

    def layer_params(self, c: Candidate) -> int:
        """A lower bound on the parameter elements one decoder layer has on tensor rank 0
        (the smallest layer's; a template candidate's replicated parameters whole, every
        other one split ``tp`` ways), over ``ep`` (module docstring)."""
        key = (c.tp, c.templates if c.annotation == "templates" else None)
        if key not in self._layer_params:
            if c.annotation != "templates" or c.tp == 1:
                n = self.layer_elems // c.tp
            else:
                from meshplan.templates import template_program
                from tuner.patterns import apply_templates

                prog, pats = template_program(self.model, self.seq)
                ann = apply_templates(prog, pats, c.template_dict())
                whole = shard = 0
                for v in prog.parameters():
                    if ".layers.0." not in (v.name or ""):
                        continue
                    size = 1
                    for d in v.shape:
                        size *= d
                    pl = ann.get(v.name or "")
                    if pl is not None and len(pl) == 2 and pl[1].startswith("Replicate"):
                        whole += size
                    else:
                        shard += size
                n = min(self.layer_elems, whole + shard // c.tp)
            self._layer_params[key] = n
        return self._layer_params[key] // c.ep

    def layer_activation_bytes(self, c: Candidate) -> tuple[tuple[int, int, int], tuple[int, int, int], int]:
        """``((a_first, a_mid, a_last), (d_first, d_mid, d_last), l)``: lower bounds on the
        bytes the first, a middle and the last decoder layer save per micro-batch on tensor
        rank 0 (``a``: the representative program's layer roles,
        ``simulator.program_costs.layer_roles``; the first layer's input may be held by the
        embedding's block instead, so its own can be 0), on those its recompute drops
        (``d``: the transient of recomputing it) and on the local logits of the loss
        (``l``), all from the unsharded program over ``tp`` (module docstring); zeros where
        the argument is not made (and for fewer than 3 layers)."""
        zero = ((0, 0, 0), (0, 0, 0), 0)
        if self.layers < 3:
            return zero
        key = (c.micro_batch_size, c.recompute, c.tp, c.cp, c.fp8)
        hit = self._acts.get(key)
        if hit is None:
            from simulator.memory import loss_logits, moe_unsaved
            from simulator.program_costs import merged_activations

            layers = self.works(c.micro_batch_size, c.cp)[0]
            if min((w.phase["F"] for w in layers), default=0.0) / c.tp < 1e-9 and self.rf.action_overhead < 1e-9:
                hit = zero  # a forward pass might round to 0 ns: the in-flight argument needs >= 1
            else:
                prog = self.program(c.micro_batch_size, c.cp, c.fp8)
                acts = merged_activations(prog, c.recompute, moe_unsaved(self.profile))
                roles = self._roles(c.micro_batch_size, c.cp, c.fp8)
                tp = c.tp
                a = tuple(min(acts.by_block.get(k, 0) for k in ks) // tp for ks in roles)
                d = (0, 0, 0) if c.recompute == "none" else tuple(
                    min(acts.dropped_by_block.get(k, 0) for k in ks) // tp for ks in roles)
                hit = (a, d, loss_logits(prog).elements // tp)
            self._acts[key] = hit
        return hit

    def _roles(self, mbs: int, cp: int, fp8: str | None) -> tuple[set, set, set]:
        """The unsharded program's layer keys standing for the first model layer, the
        middle ones and the last (``layer_roles``)."""
        prog = self.program(mbs, cp, fp8)
        from simulator.blocks import assign_blocks

        ids = sorted({k for k in assign_blocks(prog).values() if isinstance(k, int)})
        roles = layer_roles(ids, self._programs[(mbs, cp, fp8)][1])
        return {roles[0]}, set(roles[1:-1]), {roles[-1]}

    def inflight(self, c: Candidate) -> tuple[float, ...]:
        """Per pipeline rank, the micro-batches of its layers' activations it holds at
        least once (``inflight_counts``; for a time-aware schedule, whose order depends on
        the times, and beside those counts: the first forward of its largest chunk, at
        least ``1 / vpp`` of its layers)."""
        m = c.num_microbatches(self.gb)
        key = (c.schedule, c.pp, c.vpp, m)
        if key not in self._inflight:
            from simulator.schedules import build_schedule
            from simulator.schedules.base import TIME_AWARE

            ks = [0] * c.pp
            if c.schedule in INFLIGHT:  # the builder's counts in closed form (no schedule built)
                ks = INFLIGHT[c.schedule](c.pp, m)
            elif not (c.schedule in TIME_AWARE or c.schedule.startswith("ZB-")):
                ks = inflight_counts(build_schedule(c.schedule, c.pp, m, c.vpp))
            self._inflight[key] = tuple(max(float(k), 1.0 / c.vpp) for k in ks)
        return self._inflight[key]

    def _end_params(self, c: Candidate) -> tuple[int, int, int]:
        """Elements of the "pre" block, of the "post" block and of both together (a tied
        table once) on tensor rank 0: at least the unsharded ones over ``tp``."""
        hit = self._ends.get(c.tp)
        if hit is None:
            pre, post = self.one.costs.pre, self.one.costs.post
            p_pre = {k: n for k, (n, _) in pre.params.items()} if pre is not None else {}
            p_post = {k: n for k, (n, _) in post.params.items()} if post is not None else {}
            both = {**p_pre, **p_post}
            hit = self._ends[c.tp] = (sum(p_pre.values()) // c.tp, sum(p_post.values()) // c.tp,
                                      sum(both.values()) // c.tp)
        return hit

    def _states_table(self, c: Candidate, extra: int) -> np.ndarray:
        """Model states (bytes) of a rank holding ``n`` layers and ``extra`` more elements,
        for n = 0 .. layers (the monotone state model, buffer terms at 0)."""
        x = self.step_cfg
        n = (c.fsdp_shard_size or c.dp) * c.cp
        p_layer = self.layer_params(c)
        key = (p_layer, extra, n, c.zero, c.pp)
        tab = self._states.get(key)
        if tab is None:
            holds = pipeline_holds_unsharded(self.profile, c.pp, c.zero, n)
            tab = np.array([model_states(self.profile.memory.model_states.value, StateInputs(
                params=k * p_layer + extra, dp=n, zero=c.zero, param_bytes=x.param_bytes,
                grad_bytes=x.grad_bytes, optimizer_bytes=x.optimizer_bytes, reduce_bytes=reduce_bytes(x),
                accumulate_unsharded=holds)).total for k in range(self.layers + 1)], dtype=np.int64)
            self._states[key] = tab
        return tab

    def split_memory_bytes(self, c: Candidate) -> int:
        """The second tier-0 memory bound (bytes): the heaviest pipeline rank over every
        split of the layers (module docstring, ``least_peak``); computed once per the
        candidate fields it reads."""
        acts, p_layer = self.layer_activation_bytes(c), self.layer_params(c)
        key = (acts, p_layer, c.tp, c.dp, c.cp, c.ep, c.fsdp_shard_size, c.zero, c.pp, c.vpp, c.schedule,
               c.num_microbatches(self.gb), c.fp8, c.micro_batch_size)
        hit = self._split.get(key)
        if hit is None:
            hit = self._split[key] = self._split_memory(c, *acts)
        return hit

    def _split_memory(self, c: Candidate, a: tuple[int, int, int], d: tuple[int, int, int], logits: int) -> int:
        from simulator.stage_timing import vstage_ranks

        mem = self.profile.memory
        ks = self.inflight(c)
        pre, post, both = self._end_params(c)
        loss_rank = vstage_ranks(c.schedule, c.pp, c.vpp)[-1]
        temp = getattr(mem, "loss_temp_bytes", None)
        loss_temp = int(temp.value * logits) if temp is not None else 0
        n = self._n
        fixed = int(mem.workspace_bytes.value)
        frac = float(mem.fragmentation.value)
        outside = int(mem.cuda_context_bytes.value) + int(
            mem.nccl_buffer_bytes.value * communicators(c.dp * c.cp, c.tp, c.pp, self.tied, False, c.cp, c.ep))
        # saved bytes of any n layers: at most one of them is the first and one the last
        # layer (whichever rank holds them), the others middle ones; recompute drops at
        # least the smallest role's bytes, and a middle layer's once n >= 3
        held = np.maximum(n * a[1] - max(a[1] - a[0], 0) - max(a[1] - a[2], 0), 0)
        drop = np.where(n >= 3, max(d[1], min(d)), min(d)) * (n > 0)
        states = np.repeat(self._states_table(c, 0)[None, :], c.pp, axis=0)
        if loss_rank == 0:
            states[0] = self._states_table(c, both)
        else:
            states[0], states[loss_rank] = self._states_table(c, pre), self._states_table(c, post)
        alloc = states + np.floor(np.asarray(ks)[:, None] * held[None, :]).astype(np.int64) + drop + fixed
        alloc[loss_rank] += loss_temp
        rows = alloc + np.floor(frac * alloc).astype(np.int64) + outside + self.fp8_state_bytes(c) * n
        return least_peak(rows, self.layers)

    def fp8_state_bytes(self, c: Candidate) -> int:
        """A lower bound on the FP8 weight copies and amax histories one decoder layer keeps
        on tensor rank 0 (``simulator.fp8.fp8_state_bytes`` of its FP8 linears, added to
        the rank's total outside the allocator lines): the unsharded FP8 program's
        smallest layer's over ``tp * ep`` (its local weights are at least the global ones
        over the ranks that split them; the histories are per op). 0 without a recipe."""
        if c.fp8 is None:
            return 0
        key = (c.micro_batch_size, c.cp, c.fp8)
        if key not in self._fp8_state:
            from simulator.blocks import assign_blocks
            from simulator.fp8 import fp8_state_bytes
            from simulator.op_signature import op_signature

            prog = self.program(*key)
            blocks = assign_blocks(prog)
            names = frozenset(p.name for p in prog.parameters() if p.name)
            per: dict[Any, float] = {}
            for op in prog.ops:
                blk = blocks.get(id(op))
                if isinstance(blk, int) and op.attrs.get("fp8"):
                    per[blk] = per.get(blk, 0.0) + fp8_state_bytes(op_signature(op, 0, names))
            roles = self._roles(*key)
            self._fp8_state[key] = int(min((min((per.get(k, 0.0) for k in ks), default=0.0)  # a role
                                             for ks in roles), default=0.0))  # without blocks: 0
        return self._fp8_state[key] // (c.tp * c.ep)

    def __call__(self, c: Candidate) -> Bound:
        mem = self.memory_bytes(c)
        if mem <= self.cap:  # the second bound only where the first does not prune
            mem = max(mem, self.split_memory_bytes(c))
        return Bound(max(self.time_s(c), self.zero3_time_s(c)), mem, self.cap)


__all__ = ["Tier0Bound"]

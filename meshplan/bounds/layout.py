"""The tight lower bound of a candidate (``Engine.lower_bound``) from layout costs shared
over data-parallel degrees and recompute modes: what an exhaustive search costs per layout.

``Engine.lower_bound`` (``simulator.bounds.step.step_lower_bound``) needs the block costs of
the candidate's representative program, keyed by its costing strategy
(``simulator.program_costs.costing_strategy``: dp, tp, micro-batch, recompute, SP,
annotation, ...). Two of those key parts do not change what rank 0 computes:

* **dp >= 2.** Data parallelism splits the batch dim of the representative program's
  ``[dp, tp]`` mesh (``completion.plan_program``); the completion's rules read placements,
  not mesh sizes, so for every ``dp >= 2`` with ``global_batch = mbs * dp`` the program has
  the same ops and placements as at ``dp = 2``, and rank 0 the same local shapes, kernels,
  tensor-parallel collectives (its tp group is ranks ``0 .. tp - 1`` for every dp) and saved
  activations. (``dp = 1`` is not such a layout: a mesh dim of size 1 changes what the
  completion shards, e.g. SP position ids, so a dp = 1 candidate is costed as it is.) The
  collectives over the dp mesh dim inside the program are the loss's mean (Megatron-LM
  ``average_losses_across_data_parallel_group``: the scalar loss, Partial(avg) on dim 0,
  all_reduced; ``simulator.stage_cost.StageCoster._collectives``), charged to the "post"
  block's forward comm: at ``dp`` this module charges it on rank 0's dp group of the
  row-major mesh, ``(0, tp, 2 tp, ..., (dp - 1) tp)``, instead of ``(0, tp)``. The gradient
  sync, ZeRO and the optimizer are not in the block costs (the step model computes them
  from the real strategy, ``simulator.grad_sync``).
* **recompute.** The program does not depend on the recompute mode (``build_plan_program``
  reads no ``recompute``); only its saved activations do
  (``simulator.program_costs.merged_activations(program, mode)``), so one program and one
  set of block costs serve every mode.

So for a ``dp >= 2``, ``cp = 1`` candidate without expert parallelism the layout costs
equal those ``Engine.program_costs`` builds -- the post block's forward comm to the
rounding of one float sum (~1e-19 s), far inside the 0.5 ns per action the bound already
leaves for the engine's integer-ns rounding (``simulator.bounds.step``) -- hence the same
balanced layer split and the same bounds; any other candidate (dp = 1, cp > 1, ep > 1, a
given program) takes ``Engine.lower_bound`` as it is. The equality is tested on random
candidates of several spaces and frameworks (``tests/meshplan/test_layout_bound.py``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from clusters import Cluster
from completion.ir import OpRole
from completion.reshard.planner import plan_reshard
from completion.strategy import Strategy
from meshplan.engine import Engine
from simulator.blocks import assign_blocks
from simulator.bounds.step import fused_backward
from simulator.memory import StageActivations, loss_logits, moe_unsaved
from simulator.program_costs import (
    ProgramCosts,
    boundary_bytes,
    costing_strategy,
    framework_activations,
    layer_roles,
    merged_activations,
)
from simulator.recompute import recompute_policy
from simulator.stage_cost import BlockCost
from tuner.exhaustive_report import Bound

NS = 1e-9

#: the data-parallel degree the shared program of a layout is built at (module docstring)
SHARED_DP = 2


def shares_layout(s: Strategy) -> bool:
    """Whether the shared costs of this module give ``s``'s bound (module docstring):
    dp >= 2, no context or expert parallelism."""
    return s.dp >= SHARED_DP and s.cp == 1 and (getattr(s, "ep", 1) or 1) == 1


def layout_key(s: Strategy) -> Strategy:
    """The strategy whose program serves every dp >= 2 and recompute mode of ``s``'s
    layout: the costing strategy at dp = 2 (its global batch two micro-batches), recompute
    ``none``."""
    return costing_strategy(s).replace(dp=SHARED_DP, global_batch_size=SHARED_DP * s.micro_batch_size,
                                       recompute="none")


class LayoutCosts:
    """The dp = 1 program of one layout and its rank-0 block costs; per (dp, recompute) the
    :class:`simulator.program_costs.ProgramCosts` a plan of that layout has (module
    docstring), built once each. ``num_layers``: the model layers the program stands for."""

    def __init__(self, engine: Engine, num_layers: int) -> None:
        pp, costs, self.tables = engine.shared_program(layout_key(engine.strategy))  # shared with the simulation
        self.program, self.cluster, self.profile = pp.program, engine.cluster, engine.profile
        ids = sorted(k for k in costs if isinstance(k, int))
        self.keys = layer_roles(ids, num_layers) if ids else ids
        self.layers = [costs[k] for k in self.keys]
        self.pre, self.post = costs.get("pre"), costs.get("post")
        blocks = assign_blocks(pp.program)
        self.boundary = boundary_bytes(pp.program, blocks)
        self.loss = loss_logits(pp.program)
        self.loss_bytes = _dp_loss_bytes(pp.program, blocks, engine.strategy.tp)
        self._acts: dict[str, StageActivations] = {}
        self._posts: dict[int, BlockCost | None] = {}
        self._work: dict[tuple[str, bool], tuple[float, float, float]] = {}

    def activations(self, recompute: str) -> StageActivations:
        """Saved activation bytes per block under ``recompute`` (``ProgramCosts.of``'s)."""
        if recompute not in self._acts:
            acts = merged_activations(self.program, recompute, moe_unsaved(self.profile), self.tables)
            self._acts[recompute] = framework_activations(acts, self.loss, self.profile)
        return self._acts[recompute]

    def post_at(self, dp: int, tp: int) -> BlockCost | None:
        """The post block of a plan at ``dp`` data-parallel replicas: the shared one with
        the loss's all_reduce charged on rank 0's dp group (module docstring)."""
        if dp == SHARED_DP or self.post is None or not self.loss_bytes:
            return self.post
        if dp not in self._posts:
            ar = self.cluster.collective_time
            delta = sum(ar("all_reduce", nb, tuple(range(0, dp * tp, tp)))
                        - ar("all_reduce", nb, tuple(range(0, SHARED_DP * tp, tp))) for nb in self.loss_bytes)
            comm = dict(self.post.comm)
            comm["F"] += delta
            self._posts[dp] = dataclasses.replace(self.post, comm=comm)
        return self._posts[dp]

    def work(self, recompute: str, fused: bool) -> tuple[float, float, float]:
        """(W, F_min, F_pre) seconds per micro-batch for :meth:`SharedLayoutBound.layout_time`:
        W = the sum over every model layer of its phase times as the stage timer charges them
        (``BlockCost.times`` under the profile's overlap flags, F + BW for a fused backward
        else F + B + W, plus ``recompute``'s rerun: full the forward again, a partial policy
        its ``recompute_f``) + the pre block's + the post block's kernels alone (its comm
        varies with dp; every phase time is at least its kernels'), F_min the smallest layer
        forward, F_pre the pre block's forward."""
        key = (recompute, fused)
        if key not in self._work:
            policy = recompute_policy(recompute)

            def phases(blk: BlockCost, layer: bool) -> tuple[float, float]:
                t = blk.times(self.profile, 0.0)
                extra = 0.0
                if layer:
                    extra = policy.rerun_time(t["F"], blk.recompute_f)
                return t["F"] + (t["BW"] if fused else t["B"] + t["W"]) + extra, t["F"]
            per = {id(b): phases(b, True) for b in self.layers}
            total = sum(per[id(b)][0] for b in self.layers)
            f_min = min((per[id(b)][1] for b in self.layers), default=0.0)
            pre = (0.0, 0.0) if self.pre is None else phases(self.pre, False)
            post = 0.0 if self.post is None else sum(self.post.compute.values())
            self._work[key] = (total + pre[0] + post, f_min, pre[1])
        return self._work[key]

    def costs(self, dp: int, tp: int, recompute: str) -> ProgramCosts:
        """The ProgramCosts of a plan of this layout at ``dp`` replicas under ``recompute``
        (``model_flops`` empty: the bound reads none)."""
        return ProgramCosts(self.layers, self.pre, self.post_at(dp, tp), self.keys,
                            self.activations(recompute), {}, self.boundary, self.loss)


def _dp_loss_bytes(program: Any, blocks: dict[int, Any], tp: int) -> list[float]:
    """Bytes of each all_reduce over the dp mesh dim (dim 0) that the post block's forward
    reshards charge (``StageCoster._collectives``'s steps): the loss's mean."""
    out = []
    for op in program.ops:
        if op.type != "reshard" or blocks.get(id(op)) != "post" or op.role not in (OpRole.FORWARD, OpRole.LOSS):
            continue
        x, y = op.operands[0], op.results[0]
        if x is None or y is None or x.dist_attr is None or y.dist_attr is None:
            continue
        for st in plan_reshard(x.dist_attr, y.dist_attr, tuple(x.shape), x.dtype).steps:
            group = next((tuple(g) for g in st.groups if 0 in g), ())
            if st.is_collective and st.kind == "all_reduce" and group == (0, tp):
                out.append(st.nbytes)  # rank 0's dp group on the [2, tp] mesh
    return out


class SharedLayoutBound:
    """``bound(c) -> tuner.exhaustive.Bound`` for ``meshplan.tuning.make_scorer``'s
    candidates: ``Engine.lower_bound`` with the layout costs of this module (one program per
    layout at dp = 1, shared by every dp, pp, schedule, ZeRO stage and recompute mode).

    ``config``: the scorer config; ``strategy_of(c)``: the candidate's Strategy;
    ``cluster``: the scorer's Cluster; ``cap``: its memory limit (bytes). Raises ValueError
    (the engine's errors) for a plan the engine refuses, as ``Engine.lower_bound`` does."""

    def __init__(self, config: Mapping[str, Any], strategy_of: Any, cluster: Cluster, cap: int) -> None:
        self.config, self.strategy_of, self.cluster, self.cap = config, strategy_of, cluster, cap
        self.layouts: dict[Any, LayoutCosts] = {}
        self._of_candidate: dict[tuple, LayoutCosts | None] = {}

    def _layout(self, c: Any) -> tuple[Engine, LayoutCosts | None]:
        e = Engine(self.config["model"], self.cluster, self.strategy_of(c), seq_len=int(self.config["seq_len"]),
                   num_layers=self.config.get("num_layers"))
        lay = None
        if shares_layout(e.strategy) and not e.source.is_program:
            key = _hashable(layout_key(e.strategy))
            lay = self.layouts.get(key)
            if lay is None:
                lay = self.layouts[key] = LayoutCosts(e, e.num_layers or e.source.num_layers)
        self._of_candidate[candidate_layout(c)] = lay
        return e, lay

    def __call__(self, c: Any) -> Bound:
        e, lay = self._layout(c)
        if lay is None:
            t, mem = e.lower_bound()
        else:
            t, mem = e.lower_bound(lay.costs(e.strategy.dp, e.strategy.tp, e.strategy.recompute))
        return Bound(t, mem, self.cap)

    def layout_time(self, c: Any) -> float:
        """A time bound (s) of candidate ``c`` from its layout's block costs alone, between
        the tier-0 bound and :meth:`__call__`'s: a few operations once the layout is costed
        (``-inf`` for a candidate whose layout is not shared). As in ``simulator.bounds.step``
        each pipeline rank r ends no earlier than ``chain_r + busy_r``; ``sum_r busy_r >= m
        * W`` (every block on one rank, each stage time at least the sum of its blocks'
        phase times: ZeRO-3 chains, scatter-gather, accumulation and host overheads add >=
        0) and ``chain_r >= r * F_min + F_pre`` for r >= 1 (``LayoutCosts.work``), so::

            step >= (m * W + sum_{r=1}^{pp-1} (r * F_min + F_pre)) / pp - actions * 1 ns

        with ``m`` micro-batches and ``actions = m * nvs * 3 + 2 * nvs + 2`` (the rounding
        slack of the rank the step bound subtracts it for). Raises ValueError as
        :meth:`__call__` does."""
        key = candidate_layout(c)
        if key not in self._of_candidate:
            self._layout(c)
        lay = self._of_candidate[key]
        if lay is None:
            return -math.inf
        gb = int(self.config["global_batch_size"])
        m, nvs = c.num_microbatches(gb), c.pp * c.vpp
        w, f_min, f_pre = lay.work(c.recompute, fused_backward(c.schedule, c.vpp))
        chains = sum(r * f_min + f_pre for r in range(1, c.pp))
        return (m * w + chains) / c.pp - (m * nvs * 3 + 2 * nvs + 2) * NS


def candidate_layout(c: Any) -> tuple:
    """The fields of a tuner Candidate its shared layout depends on (``layout_key`` of its
    strategy drops dp >= 2, pp, vpp, schedule, ZeRO, the HSDP group and recompute)."""
    return (c.tp, c.micro_batch_size, c.sequence_parallel, c.templates, c.annotation,
            c.annotation_seed, c.cp, c.fp8, c.dp >= SHARED_DP)


def _hashable(s: Strategy) -> Any:
    ann = s.annotation
    if isinstance(ann, dict):
        ann = tuple(sorted((k, tuple(v)) for k, v in ann.items()))
    return (s.replace(annotation="none"), ann)


__all__ = ["LayoutCosts", "SharedLayoutBound", "candidate_layout", "layout_key", "shares_layout"]

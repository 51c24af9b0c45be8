"""The tier-0 bound of a scorer config: ``candidate -> Bound`` without completing its layout.

``simulator.tier0_bound`` proves the inequality; this module feeds it. Per micro-batch size
and per ``seq_len / cp`` it builds the unsharded one-rank representative program of the
model (``completion.plan_program.build_plan_program`` with dp = tp = pp = cp = 1: no
completion, a few milliseconds) under the scorer's framework profile and attention, and
reads its per-block works (``simulator.tier0_bound.block_work``); each candidate then
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
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from clusters import load_cluster
from clusters.spec import DEFAULT_MEMORY_HEADROOM
from completion.models import get_model_config
from completion.models.source import resolve_model
from completion.plan_program import build_plan_program
from completion.strategy import Strategy
from meshplan.engine import Engine
from simulator.dp_groups import pipeline_holds_unsharded
from simulator.model_states import StateInputs, model_states
from simulator.program_costs import layer_roles
from simulator.stage_timing import reduce_bytes
from simulator.step_bound import fused_backward
from simulator.tier0_bound import BlockWork, block_work, compute_peak, tier0_step_time
from tuner.exhaustive import Bound
from tuner.space import Candidate


class Tier0Bound:
    """``bound(c) -> Bound(time_s, 0, memory limit)`` with ``time_s <=`` the step time
    ``meshplan.tuning.make_scorer(config)(c)`` simulates (``simulator.tier0_bound``).

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

    def works(self, mbs: int, cp: int, fp8: bool = False
              ) -> tuple[list[BlockWork], BlockWork | None, BlockWork | None]:
        """(per model layer, pre, post) works in seconds of micro-batch ``mbs`` of
        ``seq_len / cp`` tokens at the peak of an ``fp8`` plan or not (built once per key)."""
        key = (mbs, cp, fp8)
        if key not in self._works:
            src = resolve_model(self.model, self.seq // cp, None, self.num_layers)
            s = Strategy(dp=1, tp=1, pp=1, micro_batch_size=mbs, global_batch_size=mbs, dtype=self.dtype,
                         framework=self.framework, attention=self.attention)
            prog = build_plan_program(src, s, representative=True, resolve_reshards=False).program
            w = block_work(prog, self.rf, self.profile, compute_peak(self.rf, fp8))
            ids = sorted(k for k in w if isinstance(k, int))
            layers = [w[k] for k in layer_roles(ids, src.num_layers)] if ids else []
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

    def __call__(self, c: Candidate) -> Bound:
        return Bound(self.time_s(c), self.memory_bytes(c), self.cap)


__all__ = ["Tier0Bound"]

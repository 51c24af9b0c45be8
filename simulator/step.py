"""One training step of a plan: layers over pipeline stages, stage times, the pipeline on
the SimPy engine, the gradient synchronisation, the optimizer step, memory per rank and the
breakdowns.

:meth:`StepModel.from_program` builds the model from a plan's representative program
(``completion.plan_program``); the parts live in their own modules: per-block costs
(:mod:`simulator.program_costs`), the layer split (:mod:`simulator.layer_split`), stage
times (:mod:`simulator.stage_timing`), gradient sync and optimizer
(:mod:`simulator.grad_sync`) and the memory of a rank (:mod:`simulator.step_memory`).

Rank layout (Megatron-LM's default order, tensor-parallel innermost, then data, then
pipeline): rank = stage * dp * tp + d * tp + t. Step time of pipeline rank r = the end of
its last action in the simulated schedule + its gradient sync + its optimizer step; the
step is the maximum over ranks. ZeRO-3 also all_gathers each block's parameters before
its forward and its backward (:meth:`simulator.stage_timing.StageTimer.zero3_gather_time`).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from typing import Any

from completion.dtypes import DTYPE_BYTES
from simulator.cluster_memo import memoised
from simulator.dp_stream import grad_reduce_intervals
from simulator.expert_parallel import expert_dp_degree, expert_sync_time
from simulator.grad_sync import (
    fixed_time,
    grad_buckets,
    held_reduce_time,
    optimizer_time,
    param_gather_time,
    sync_time,
    tail_collectives,
)
from simulator.layer_split import split_layers
from simulator.memory import optimizer_bytes_per_param, timeline_activation_peaks
from simulator.pipeline_sim import simulate_pipeline
from simulator.program_costs import EXECUTED_EXTRA, ProgramCosts
from simulator.recompute import RecomputePolicy, recompute_policy
from simulator.result import SimResult
from simulator.roofline import Roofline
from simulator.schedules import Schedule, build_schedule
from simulator.schedules.base import TIME_AWARE
from simulator.stage_cost import PHASES, BlockCost
from simulator.stage_timing import StageTimer, block_time, reduce_bytes, vstage_ranks
from simulator.step_memory import RankParams, rank_memory, vstage_activation_bytes


@dataclass(frozen=True)
class StepConfig:
    """What the step needs besides the block costs (see module docstring). Degrees and
    knobs carry the names of ``completion.strategy.Strategy``; ``schedule`` is the
    registered schedule builder (``Strategy.registered_schedule``) and ``memory_limit`` the
    ZB heuristic's limit in M_B units."""

    dp: int
    tp: int
    pp: int
    vpp: int
    num_microbatches: int
    schedule: str
    memory_limit: float | None
    recompute: str
    zero: int
    param_bytes: int
    grad_bytes: int
    optimizer_bytes: int
    boundary_bytes: float
    tokens_per_step: int
    peak_flops: float
    """FLOP/s MFU divides by: the peak of the plan's fastest GEMM precision
    (``Roofline.mfu_peak``: FP8's for an FP8 plan)."""
    overlap: float = 0.0
    overlap_dp_sync: bool = False
    layers_per_stage: tuple[int, ...] | None = None
    dtype: str = "bfloat16"
    profile: Any = None
    """The framework profile (``simulator.profiles.ProfileSpec``) the plan runs under
    (None: no profile-specific behaviour)."""
    accumulate_grads: bool = False
    """True: the framework adds each later micro-batch's parameter gradients into an
    accumulator with a separate kernel and scales by 1/m before the update (Paddle's
    gradient merge, PyTorch ``.grad`` accumulation, this project's executor); False
    (default): accumulation is fused into the dW GEMM (Megatron-LM
    ``gradient_accumulation_fusion``) and the 1/m into the loss, free in the roofline."""
    fsdp_shard_size: int | None = None
    """HSDP shard group (``Strategy.fsdp_shard_size``): ZeRO-3 gathers and reduce_scatters
    within groups of this many consecutive dp ranks and all_reduces the sharded gradients
    across the dp / N groups (:mod:`simulator.dp_groups`); None: one group of all dp."""
    ep: int = 1
    """Expert-parallel ranks (``Strategy.ep``): expert gradients are reduced and their ZeRO-1
    states sharded over the edp = dp * tp / (ep * etp) expert-data-parallel ranks
    (:mod:`simulator.expert_parallel`; dp holds cp, folded)."""
    etp: int | None = None
    """Expert tensor-parallel ranks (``Strategy.etp``; None: tp)."""
    fp8_params: bool = False
    """The FP8 linears' weights are FP8 parameters (an FP8 recipe under a framework of
    its profile's ``fp8.params``): the state model sees no 16-bit weights."""
    optimizer: str = ""
    """The strategy's optimizer (``sgd``, ``adam``, ``adamw``): its update op's measured
    efficiency (``device.efficiency.by_op["<op>:O"]``) times the update when present."""
    bf16_peak_flops: float = 0.0
    """The device's BF16 peak (``Roofline.bf16_mfu_peak``): NeMo's and torchtitan's MFU
    of an FP8 plan divides by it (0: :attr:`peak_flops`)."""
    cp: int = 1
    """Context-parallel ranks of the plan before folding (``completion.context_parallel
    .fold_strategy``: the step runs dp * cp replicas, so ``dp`` holds both): only the NCCL
    communicator count reads it (the cp group is a communicator of its own)."""

    @property
    def recompute_policy(self) -> RecomputePolicy:
        """The policy ``recompute`` names (``simulator.recompute``): what the backward reruns
        (its time) and what the forward keeps (its memory); every reader of the step's
        recompute asks it, not the name."""
        return recompute_policy(self.recompute)

    @classmethod
    def of(cls, strategy: Any, roofline: Roofline, *, boundary_bytes: float, seq_len: int,
           profile: Any = None, overlap: float = 0.0, overlap_dp_sync: bool = False,
           accumulate_grads: bool | None = None, cp: int | None = None) -> StepConfig:
        """The config of a ``completion.strategy.Strategy`` under framework ``profile``:
        16-bit (or the strategy's dtype) parameters and gradients, the optimizer's state
        bytes per parameter (``simulator.memory.optimizer_bytes_per_param``), tokens per
        step = global batch x ``seq_len``, the device's peak for the dtype. Gradient
        accumulation is the profile's (``gradients.accumulation == "separate"``) unless
        ``accumulate_grads`` says. ``cp``: the unfolded plan's context-parallel ranks
        (:attr:`cp`; None: the strategy's own, for a strategy that is not folded)."""
        s = strategy
        if cp is None:
            cp = int(getattr(s, "cp", 1) or 1)
        if accumulate_grads is None:
            accumulate_grads = profile is not None and profile.gradients.accumulation.value == "separate"
        sched, limit = s.registered_schedule()
        dbytes = DTYPE_BYTES[s.dtype]
        return cls(dp=s.dp, tp=s.tp, pp=s.pp, vpp=s.vpp, num_microbatches=s.num_microbatches,
                   schedule=sched, memory_limit=limit, recompute=s.recompute, zero=s.zero,
                   param_bytes=dbytes, grad_bytes=dbytes,
                   optimizer_bytes=optimizer_bytes_per_param(s.dtype, s.optimizer),
                   boundary_bytes=boundary_bytes, tokens_per_step=s.global_batch_size * seq_len,
                   peak_flops=roofline.mfu_peak(fp8=getattr(s, "fp8", None) is not None),
                   bf16_peak_flops=roofline.bf16_mfu_peak(), overlap=overlap,
                   overlap_dp_sync=overlap_dp_sync, layers_per_stage=s.layers_per_stage,
                   dtype=s.dtype, profile=profile, accumulate_grads=accumulate_grads,
                   fsdp_shard_size=getattr(s, "fsdp_shard_size", None),
                   ep=int(getattr(s, "ep", 1) or 1), etp=getattr(s, "etp", None), optimizer=str(getattr(s, "optimizer", "") or ""),
                   fp8_params=getattr(s, "fp8", None) is not None
                   and profile is not None and profile.fp8_weights.params, cp=cp)


#: MFU's two conventions, by the key each is reported under (``StepResult.to_dict``)
MFU_CONVENTIONS = {
    "mfu_megatron": "causal attention counted in full, every query against every key "
                    "(Megatron-LM's and PaLM's count; also reported as mfu)",
    "mfu_causal": "causal attention counted as executed, the scores the mask keeps "
                  "(about half the attention FLOPs)",
}

#: the one-line statement of the convention a table's MFU column uses (``mfu``)
MFU_NOTE = ("MFU counts causal attention in full, as Megatron-LM does (--json: mfu_causal "
            "counts it as executed, about half)")


@dataclass
class StepResult:
    """Outcome of one simulated step (seconds, bytes, FLOPs).

    ``schedule`` is the pipeline schedule the step played (for the time-aware ZB heuristics,
    the one built from these stage times): running it reproduces the prediction.

    ``time_breakdown`` (seconds, the critical rank: the pipeline rank that finishes last) is a
    partition of the step: ``compute`` (kernels, recompute and host overhead of its actions) +
    ``tp_comm`` (in-stage collectives issued: TP, CP, ZeRO-3) - ``overlapped`` (the part of
    tp_comm that ran beside compute: TP comm overlap, prefetched ZeRO-3 gathers) +
    ``bubble`` (idle inside the pipeline) + ``dp_sync`` (gradient sync and parameter gathers
    not hidden behind the backward) + ``optimizer``, plus ``pp_comm`` (the p2p hops the rank
    sends, T_comm each) when the profile's sends are synchronous (with asynchronous sends a
    hop is a delay already inside the bubble).

    ``tflops_per_gpu`` counts the executed FLOPs (recompute and padded expert slots
    included: the hardware FLOP/s, Megatron-LM's logged TFLOP/s with recompute) and ``mfu``
    the model FLOPs only (``model_flops`` / (step x GPUs x peak); Chowdhery et al. 2022,
    app. B), so with recompute tflops_per_gpu / peak exceeds mfu.

    MFU comes in two conventions (:data:`MFU_CONVENTIONS`): ``mfu`` counts causal attention
    in full, every query against every key (Megatron-LM d98e8a64
    ``num_floating_point_operations``: ``seq_length / hidden_size`` in the attention term;
    PaLM's 12 L h s per token), ``mfu_causal`` only the scores the mask keeps
    (``model_flops_causal``: about half the attention FLOPs; FlashAttention-2's count of
    causal attention). They differ by the attention's share of the step: little at 4k
    tokens, much at 32k."""

    step_time: float
    tokens_per_s: float
    tflops_per_gpu: float
    mfu: float
    """Model FLOPs / (step x GPUs x the peak of the plan's fastest GEMM precision: FP8's for
    an FP8 plan, else the largest 16-bit one), in [0, 1]."""
    max_memory_bytes: int
    time_breakdown: dict[str, float]
    memory_breakdown: dict[str, int]
    memory_per_stage: list[dict[str, int]]
    stage_times: list[dict[str, float]]
    layers_per_vstage: list[int]
    model_flops: float
    executed_flops: float
    sim: SimResult = field(repr=False)
    mfu_causal: float = 0.0
    """MFU with causal attention counted as executed (:data:`MFU_CONVENTIONS`)."""
    model_flops_causal: float = 0.0
    """Model FLOPs per step with causal attention counted over the scores the mask keeps."""
    schedule: Schedule | None = field(default=None, repr=False)
    activation_per_chunk: dict[tuple[int, int], tuple[float, float]] = field(default_factory=dict,
                                                                           repr=False)
    """(rank, chunk) -> (M_B, M_W) bytes per micro-batch: what the memory timeline plays
    (``simulator.memory_timeline``)."""
    stage_parts: list[dict[str, float]] = field(default_factory=list, repr=False)
    """Per virtual stage, {compute, comm} seconds per micro-batch (the in-stage collectives'
    share of its actions, ``StageTimer.stage_time``)."""
    comm_time: float = 0.0
    """Seconds of one pipeline p2p hop between ranks (``StageTimer.comm_time``)."""
    rank_tails: list[dict[str, float]] = field(default_factory=list, repr=False)
    """Per pipeline rank, seconds of what follows its last action (``StepModel._rank``):
    ``end`` (the last action's end), ``dp_wait`` (its dp stream still reducing),
    ``grad_reduce`` (the one reduce of gradients accumulated unsharded,
    ``simulator.grad_sync.held_reduce_time``), ``tail_collectives``, ``optimizer`` (with the fixed per-step work), ``param_gather``
    and, without a profile, ``grad_sync`` (the legacy one-piece sync)."""
    dp_buckets: list[list[tuple[int, int]]] = field(default_factory=list, repr=False)
    """Per pipeline rank, (start, end) ns of each gradient bucket's reduce on its dp
    stream (``simulator.dp_stream.grad_reduce_intervals``)."""
    mfu_bf16: float = 0.0
    """Model FLOPs over the BF16 peak instead (NeMo's and torchtitan's MFU, an FP8 run's
    too; above 1 for a fast FP8 plan); equal to :attr:`mfu` for a plan without FP8."""

    def events(self) -> list[Any]:
        """Every action of the step on its stream, start order
        (``simulator.step_trace.step_events``)."""
        from simulator.step_trace import step_events

        return step_events(self)

    def to_frame(self) -> Any:
        """A pandas DataFrame with one row per action of the step on its stream
        (:meth:`events`): columns ``rank``, ``stream`` (compute, tp_comm, pp_comm,
        dp_sync, optimizer), ``name``, ``kind``, ``microbatch``, ``chunk`` (-1 where
        none), ``start_ms``, ``end_ms``, ``dur_ms``. E.g.
        ``res.to_frame().groupby("stream").dur_ms.sum()``. A compute action spans its
        exposed in-stage collectives too (``tp_comm`` rows repeat them at its end), so the
        streams are not to be added."""
        from simulator.step_trace import events_frame

        return events_frame(self.events())

    @property
    def zb_bubble_rate(self) -> float:
        """The Zero Bubble paper's bubble rate of the pipeline (Qi et al. 2024, sec. 5.3):
        (cost - ideal) / cost, cost the largest per-rank span of the schedule, ideal the
        largest per-rank busy time (``SimResult.bubble_ratio``; dimensionless, in [0, 1)).
        It looks at the pipeline only: gradient sync and optimizer are outside it."""
        return self.sim.bubble_ratio

    @property
    def critical_rank_idle_fraction(self) -> float:
        """The plain idle fraction of the critical rank (the pipeline rank that finishes the
        step last, whose ``time_breakdown`` the report shows): its idle time inside the
        pipeline (``time_breakdown["bubble"]`` = last action end - the busy time of its actions) over
        the whole step time (pipeline + DP sync + optimizer); dimensionless, in [0, 1).
        Unlike :attr:`zb_bubble_rate` it counts the warm-up wait before the rank's first
        action and divides by the step the user waits for."""
        return self.time_breakdown.get("bubble", 0.0) / self.step_time if self.step_time > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly view (times in ms for the headline, seconds in breakdowns).
        ``bubble_ratio`` is :attr:`zb_bubble_rate` under its older name (kept for readers
        of earlier output). ``mfu`` and ``mfu_megatron`` are the same number (causal
        attention counted in full; ``mfu`` kept for readers of earlier output),
        ``mfu_causal`` counts causal attention as executed, and ``mfu_conventions`` says
        so in words."""
        return {
            "step_time_ms": self.step_time * 1e3,
            "tokens_per_s": self.tokens_per_s,
            "tflops_per_gpu": self.tflops_per_gpu,
            "mfu": self.mfu,
            "mfu_megatron": self.mfu,
            "mfu_causal": self.mfu_causal,
            "mfu_conventions": dict(MFU_CONVENTIONS),
            "mfu_bf16": self.mfu_bf16,
            "max_memory_bytes": self.max_memory_bytes,
            "time_breakdown_s": self.time_breakdown,
            "memory_breakdown_bytes": self.memory_breakdown,
            "memory_per_stage_bytes": self.memory_per_stage,
            "stage_times_s": self.stage_times,
            "layers_per_vstage": self.layers_per_vstage,
            "bubble_ratio": self.sim.bubble_ratio,
            "zb_bubble_rate": self.zb_bubble_rate,
            "critical_rank_idle_fraction": self.critical_rank_idle_fraction,
            "model_flops_per_step": self.model_flops,
            "model_flops_causal_per_step": self.model_flops_causal,
            "executed_flops_per_step": self.executed_flops,
        }


class StepModel:
    """A step assembled from a plan program's costs.

    Args:
        costs: :class:`simulator.program_costs.ProgramCosts` of the program.
        cluster, roofline, cfg: the hardware and the :class:`StepConfig`.

    Raises ValueError when the layers cannot fill the pipeline's virtual stages (or the
    config's ``layers_per_stage`` does not fit them).
    """

    def __init__(self, costs: ProgramCosts, cluster: Any, roofline: Roofline, cfg: StepConfig) -> None:
        # the cluster's collective and p2p times, memoised per cluster (pure functions)
        self.costs, self.cluster, self.rf, self.cfg = costs, memoised(cluster), roofline, cfg
        self.nvs = cfg.pp * cfg.vpp
        weight = [block_time(b, cfg, True) for b in costs.layers]
        self.split = split_layers(len(costs.layers), self.nvs, cfg.layers_per_stage, weight,
                                  block_time(costs.pre, cfg, False), block_time(costs.post, cfg, False),
                                  tuple(vstage_ranks(cfg.schedule, cfg.pp, cfg.vpp)))
        starts = [sum(self.split[:i]) for i in range(self.nvs)]
        self.vs_layers = [list(range(starts[i], starts[i] + self.split[i])) for i in range(self.nvs)]
        self.timer = StageTimer(costs.layers, costs.pre, costs.post, self.vs_layers, cfg, self.cluster, roofline)

    @classmethod
    def from_program(cls, plan_program: Any, cluster: Any, roofline: Roofline, *, seq_len: int,
                     profile: Any = None, num_layers: int | None = None, overlap: float = 0.0,
                     overlap_dp_sync: bool = False, accumulate_grads: bool | None = None) -> StepModel:
        """The step of a ``completion.plan_program.PlanProgram`` (normally the
        representative one) on ``cluster``.

        Args:
            seq_len: tokens per sequence (for tokens per step).
            profile: the framework profile (``simulator.profiles``).
            num_layers: model layers the program's first layer stands for (None: every
                layer of the program costed on its own).
            overlap: fraction of in-stage collective time hidden behind compute.
            overlap_dp_sync: hide the gradient sync behind the last backward where possible.
            accumulate_grads: see :attr:`StepConfig.accumulate_grads`.
        Raises ValueError (``ProgramCostError``) for a split that does not fit."""
        costs = ProgramCosts.of(plan_program, cluster, roofline, num_layers, profile)
        cfg = StepConfig.of(plan_program.strategy, roofline, boundary_bytes=costs.boundary_bytes,
                            seq_len=seq_len, profile=profile, overlap=overlap,
                            overlap_dp_sync=overlap_dp_sync, accumulate_grads=accumulate_grads)
        return cls(costs, cluster, roofline, cfg)

    # -- per virtual stage ---------------------------------------------------------------
    def stage_time(self, vs: int) -> tuple[dict[str, float], dict[str, float]]:
        """({F, B, W} seconds, {compute, comm} seconds) of virtual stage ``vs`` per
        micro-batch (:meth:`simulator.stage_timing.StageTimer.stage_time`)."""
        return self.timer.stage_time(vs)

    def comm_time(self) -> float:
        """T_comm between adjacent stages (:meth:`StageTimer.comm_time`)."""
        return self.timer.comm_time()

    def rank_params(self, vstages: list[int], synced: bool = False) -> int:
        """Local parameter elements of a pipeline rank holding ``vstages`` (tied weights
        counted once); ``synced``: only those the data-parallel gradient sync reduces (not
        the ``BlockCost.dp_split`` ones: expert-parallel experts)."""
        named: dict[str, int] = {}
        total = 0
        for vs in vstages:
            for i in self.vs_layers[vs]:
                blk = self.costs.layers[i]
                total += sum(n for k, (n, _) in blk.params.items() if not (synced and k in blk.dp_split))
            for blk, on in ((self.costs.pre, vs == 0), (self.costs.post, vs == self.nvs - 1)):
                if blk is not None and on:
                    named.update({k: n for k, (n, _) in blk.params.items()})
        return total + sum(named.values())

    # -- the pipeline --------------------------------------------------------------------
    def schedule(self, times: list[dict[str, float]] | None = None) -> Schedule:
        """The schedule the step plays: the registered one, or for the time-aware ZB
        heuristics the one built from the slowest stage's T_F, T_B, T_W (``times`` per
        virtual stage; computed when not given) and T_comm."""
        c = self.cfg
        if c.schedule not in TIME_AWARE:
            return build_schedule(c.schedule, c.pp, c.num_microbatches, c.vpp, c.memory_limit)
        if times is None:  # stage times do not depend on which rank runs a virtual stage
            times = [self.stage_time(vs)[0] for vs in range(self.nvs)]
        worst = {ph: max(t[ph] for t in times) for ph in PHASES}
        return build_schedule(c.schedule, c.pp, c.num_microbatches, c.vpp, c.memory_limit,
                              stage_times=worst, comm_time=self.comm_time())

    def pair_hidden(self, sched: Schedule, times: list[dict[str, float]]) -> dict | None:
        """Seconds of expert-parallel all_to_all each overlapped F&B pair of ``sched`` hides
        (``Schedule.pairs``: DualPipeV) under the profile's ``overlap.moe_a2a``: the
        forward's all_to_all runs beside the backward's compute and the backward's beside
        the forward's (DeepSeek-V3 report sec. 3.2.1, Fig. 4: one chunk's dispatch and
        combine beside the other chunk's attention and MLP), each hidden up to the other
        pass's compute: min(a2a_F, B - a2a_B) + min(a2a_B, F - a2a_F), per rank and
        (forward chunk, backward chunk); a BW backward counts B + W. None when nothing is
        hidden (no pairs, no profile, or the flag off)."""
        prof = self.cfg.profile
        if not sched.pairs or prof is None or not prof.overlap.moe_a2a.value:
            return None
        where = {rc: vs for vs, rc in sched.rank_of_vstage().items()}
        out = {}
        for r in range(sched.num_stages):
            for c0, c1 in itertools.product(range(sched.num_chunks), repeat=2):
                v0, v1 = where[(r, c0)], where[(r, c1)]
                (a_f, _), (_, a_b) = self.timer.a2a_time(v0), self.timer.a2a_time(v1)
                bwd = times[v1]["BW"]
                out[(r, c0, c1)] = min(a_f, bwd - a_b) + min(a_b, times[v0]["F"] - a_f)
        return out

    def run(self) -> StepResult:
        """Simulate the step (see module docstring)."""
        c = self.cfg
        t_comm = self.comm_time()
        timed = [self.stage_time(vs) for vs in range(self.nvs)]
        times, parts = [t for t, _ in timed], [p for _, p in timed]
        sched = self.schedule(times)
        where = sched.rank_of_vstage()
        prof = c.profile
        sync_p2p = self.sync_p2p()
        sim = simulate_pipeline(sched, times, t_comm, p2p_sync=sync_p2p,
                                pair_hidden=self.pair_hidden(sched, times))
        spans = self._dp_stream(sched, sim) if prof is not None else [[] for _ in range(c.pp)]
        dp_ends = [s[-1][1] * 1e-9 if s else 0.0 for s in spans]
        per_chunk = {}
        for vs in range(self.nvs):
            args = (self.costs.layer_keys, self.vs_layers[vs], vs == 0, vs == self.nvs - 1)
            mb = vstage_activation_bytes(self.costs.activations, "by_block", *args)
            mw = vstage_activation_bytes(self.costs.activations, "w_by_block", *args)
            per_chunk[where[vs]] = (mb, min(mw, mb))
        peaks = timeline_activation_peaks(sim.timeline, c.pp, per_chunk)
        ends = [0.0] * c.pp
        for e in sim.timeline:
            ends[e.rank] = max(ends[e.rank], e.end * 1e-9)
        # one micro-batch's activations a backward frees on each rank (its smallest chunk's)
        freed = [int(min((mb for (rk, _), (mb, _) in per_chunk.items() if rk == r), default=0))
                 for r in range(c.pp)]
        ranks = [self._rank(r, sched, peaks[r], ends[r], times, parts, t_comm, dp_ends[r], freed[r])
                 for r in range(c.pp)]
        crit = max(ranks, key=lambda x: x["finish"])
        heavy = max(ranks, key=lambda x: x["memory"]["total"])
        step = crit["finish"]
        gflops = self.costs.model_flops
        mflops = c.num_microbatches * sum(v for k, v in gflops.items() if not isinstance(k, tuple))
        # executed beyond the model's FLOPs: recompute and padded expert slots
        rec = c.num_microbatches * sum(v for k, v in gflops.items()
                                       if isinstance(k, tuple) and k[0] in EXECUTED_EXTRA)
        skip = c.num_microbatches * sum(v for k, v in gflops.items()
                                        if isinstance(k, tuple) and k[0] == "causal_skip")
        world = c.dp * c.tp * c.pp
        return StepResult(
            step_time=step, tokens_per_s=c.tokens_per_step / step,
            tflops_per_gpu=(mflops + rec) / step / world / 1e12,
            mfu=mflops / (step * world * c.peak_flops),
            mfu_causal=(mflops - skip) / (step * world * c.peak_flops),
            model_flops_causal=mflops - skip,
            mfu_bf16=mflops / (step * world * (c.bf16_peak_flops or c.peak_flops)),
            max_memory_bytes=int(heavy["memory"]["total"]),
            time_breakdown=crit["time"], memory_breakdown=heavy["memory"],
            memory_per_stage=[x["memory"] for x in ranks], stage_times=times,
            layers_per_vstage=self.split, model_flops=mflops, executed_flops=mflops + rec,
            sim=sim, schedule=sched, activation_per_chunk=per_chunk, stage_parts=parts,
            comm_time=t_comm, rank_tails=[x["tail"] for x in ranks], dp_buckets=spans)

    def _chunk_params(self, vstages: list[int]) -> dict[int, int]:
        """Local parameter elements per chunk of a pipeline rank holding ``vstages`` that the
        data-parallel gradient sync reduces (a tied parameter counted once, in the first
        chunk that reads it; ``BlockCost.dp_split`` ones skipped)."""
        seen: set[str] = set()
        out = {}
        for chunk, vs in enumerate(vstages):
            n = 0
            for blk in self.timer.blocks(vs):
                for name, (elems, _) in blk.params.items():
                    if blk is self.costs.pre or blk is self.costs.post:
                        if name in seen:
                            continue
                        seen.add(name)
                    if name not in blk.dp_split:  # no dp replicas: nothing to reduce
                        n += elems
            out[chunk] = n
        return out

    def _dp_stream(self, sched: Schedule, sim: SimResult) -> list[list[tuple[int, int]]]:
        """Per pipeline rank, the (start, end) ns of its gradient buckets' reduces on its dp
        stream (``simulator.dp_stream``; empty with nothing to reduce)."""
        c = self.cfg
        buckets = {}
        for r in range(c.pp):
            for chunk, items in grad_buckets(c, self.cluster, r, self._chunk_params(list(sched.vstage[r]))).items():
                buckets[(r, chunk)] = items
        return grad_reduce_intervals(sim.timeline, c.pp, buckets, c.profile.overlap.dp_grad_reduce.value)

    def rank_param_facts(self, vstages: list[int], total: int, layer_blocks: list[BlockCost],
                     blocks: list[BlockCost]) -> RankParams:
        """Parameter facts of a pipeline rank for its model states
        (``simulator.step_memory.RankParams``): its largest tensor and layer, the elements
        of its "pre" / "post" blocks (tied weights once), of its embedding tables (the "pre"
        block's parameters, or the tied table a "post" block reads on a rank without
        "pre"), whether it runs the loss."""
        root: dict[str, int] = {}
        held = [blk for blk in (self.costs.pre, self.costs.post)
                if blk is not None and any(b is blk for b in blocks)]
        for blk in held:
            root.update({k: n for k, (n, _) in blk.params.items()})
        pre = self.costs.pre
        if any(blk is pre for blk in held):
            tables = sum(n for n, _ in pre.params.values())
        else:  # a last stage holding a tied head reads the table too
            tables = self.tied_elems() if held else 0
        largest = max((n for b in blocks for n, _ in b.params.values()), default=0)
        block = max((sum(n for n, _ in b.params.values()) for b in layer_blocks), default=0)
        return RankParams(total=total, largest_param=largest, largest_block=block,
                          root=sum(root.values()), holds_loss=self.nvs - 1 in vstages,
                          embedding=tables)

    def rank_memory_terms(self, vstages: list[int], params: int, expert: int, rank_layers: list[int],
                          layer_blocks: list[BlockCost], blocks: list[BlockCost], act_peak: float,
                          freed: int | None) -> dict[str, int]:
        """Peak memory terms of the pipeline rank holding ``vstages``, bytes: its model
        states by profile (``simulator.step_memory.rank_memory``: ``params`` local parameter
        elements, ``expert`` of them expert ones), the loss's temporaries on the rank that
        runs it, the activation peak ``act_peak`` (``freed``: bytes a backward frees), and
        the FP8 weight copies and amax histories of ``layer_blocks`` (``simulator.fp8``) as
        ``fp8_weights`` before ``total``. ``meshplan``'s step bound
        (``simulator.bounds.step``) reads the same terms with its own activation bound."""
        facts = replace(self.rank_param_facts(vstages, params, layer_blocks, blocks), expert=expert,
                        backward_freed=freed)
        memory = rank_memory(self.cfg, facts, act_peak,
                             self.costs.activations, self.costs.layer_keys, rank_layers, blocks,
                             loss_elements=self.costs.loss.elements, loss_block=self.costs.post,
                             tied=self.tied_elems() > 0)
        fp8_state = int(sum(b.fp8_state_bytes for b in layer_blocks))
        if fp8_state:
            total = memory.pop("total") + fp8_state
            memory["fp8_weights"] = fp8_state
            memory["total"] = total
        return memory

    def tied_elems(self) -> int:
        """Local elements of the parameters read by both "pre" and "post" (tied embeddings)."""
        pre, post = self.costs.pre, self.costs.post
        if pre is None or post is None:
            return 0
        return sum(n for name, (n, _) in pre.params.items() if name in post.params)

    def sync_p2p(self) -> bool:
        """Whether the framework profile's pipeline sends are synchronous (they occupy the
        sending rank: ``pipeline.p2p`` = ``sync``, Megatron-LM 2021)."""
        prof = self.cfg.profile
        return prof is not None and prof.pipeline.p2p.value == "sync"

    def _rank(self, r: int, sched: Schedule, act_peak: float, end: float, times: list,
              parts: list, t_comm: float, dp_end: float = 0.0, freed: int | None = None) -> dict[str, Any]:
        """Finish time, memory and time breakdown of pipeline rank ``r``: its last action's
        end, then (under a profile) what its dp stream still has to reduce, the per-step
        collectives on weight gradients, the fixed per-iteration work, the optimizer and
        the exposed parameter gather; without a profile the legacy sum
        (:func:`simulator.grad_sync.sync_time`)."""
        c = self.cfg
        vstages = list(sched.vstage[r])
        rank_layers = sorted({i for vs in vstages for i in self.vs_layers[vs]})
        params = self.rank_params(vstages)
        synced = self.rank_params(vstages, synced=True)
        expert = params - synced  # expert-parallel experts: reduced over dp / ep (expert_parallel)
        layer_blocks: list[BlockCost] = [self.costs.layers[i] for i in rank_layers]
        blocks = [b for vs in vstages for b in self.timer.blocks(vs)]
        tensors = len({name for b in blocks for name in b.params})
        if c.profile is None:
            sync = sync_time(c, self.cluster, r, synced, layer_blocks, times[vstages[0]]["B"])
            sync += expert_sync_time(c, self.cluster, r, expert, c.grad_bytes)
            fixed = 0.0
            tail = {"end": end, "grad_sync": sync}
        else:
            tail = {"end": end, "dp_wait": max(0.0, dp_end - end),
                    "grad_reduce": held_reduce_time(c, self.cluster, r, synced),
                    "tail_collectives": tail_collectives(c, self.cluster, r, layer_blocks),
                    "param_gather": param_gather_time(c, self.cluster, r, synced,
                                                      times[vstages[0]]["F"])}
            if expert and expert_dp_degree(c) > 1:
                tail["expert_sync"] = expert_sync_time(c, self.cluster, r, expert, reduce_bytes(c))
            sync = (tail["dp_wait"] + tail["grad_reduce"] + tail["tail_collectives"] + tail["param_gather"]
                    + tail.get("expert_sync", 0.0))
            fixed = fixed_time(c, self.cluster, self.rf, r, params, self.tied_elems(), expert=expert)
        # + once-per-step kernels of the layers (simulator.fp8: TE's FP8 weight casts)
        opt = optimizer_time(c, self.rf, params, tensors, expert=expert) + fixed + sum(b.per_step for b in layer_blocks)
        tail["optimizer"] = opt
        m = c.num_microbatches
        fused = any(a[0] == "BW" for a in sched.actions[r])
        # kernels, plus what the host's dispatch added to the actions the schedule runs
        # (simulator.host_time; StageTimer.stage_time)
        host = "host_fused" if fused else "host_split"
        compute = m * sum(parts[vs]["compute"] + parts[vs].get(host, 0.0) for vs in vstages)
        # issued in-stage collectives: what the actions carry plus the context-parallel
        # exchange hidden beside attention (it is then all "overlapped")
        comm = m * sum(parts[vs]["comm"] + parts[vs].get("cp_hidden", 0.0) for vs in vstages)
        memory = self.rank_memory_terms(vstages, params, expert, rank_layers, layer_blocks, blocks,
                                        act_peak, freed)
        # the hops this rank sends: an F output to the next virtual stage and a B output to
        # the previous one when that stage is on another rank (ZB-V's turn of the V is not);
        # with synchronous sends each keeps the rank busy for t_comm after the action
        owner = sched.rank_of_vstage()  # vs -> (rank, chunk)
        sends = sum((vs + 1 < self.nvs and owner[vs + 1][0] != r) + (vs > 0 and owner[vs - 1][0] != r)
                    for vs in vstages)
        hops = m * sends * t_comm
        # what the rank's actions really took (compute + the collectives not hidden by it):
        # the in-stage collectives that ran beside kernels (TP comm overlap, prefetched
        # ZeRO-3 gathers) are "overlapped", so the lines add up to the step:
        # compute + tp_comm - overlapped + bubble (+ pp_comm with synchronous sends)
        # + dp_sync + optimizer = step time
        busy = m * sum(times[vs]["F"] + (times[vs]["BW"] if fused else times[vs]["B"] + times[vs]["W"])
                       for vs in vstages)
        exposed = max(0.0, busy - compute)
        sync_busy = hops if self.sync_p2p() else 0.0
        time = {"compute": compute, "tp_comm": comm, "overlapped": max(0.0, comm - exposed),
                "pp_comm": hops, "bubble": max(0.0, end - busy - sync_busy), "dp_sync": sync,
                "optimizer": opt}
        return {"finish": end + sync + opt, "memory": memory, "time": time, "tail": tail}

"""One training step from per-block costs: layers over pipeline stages, stage times, the
pipeline on the SimPy engine, the gradient synchronisation, the optimizer step, memory per
rank, and the breakdowns.

Rank layout (Megatron-LM's default order, tensor-parallel innermost, then data, then
pipeline): rank = stage * dp * mp + d * mp + t. Step time of pipeline rank r = the end of
its last action in the simulated schedule + its gradient sync + its optimizer step; the
step is the maximum over ranks. Gradient sync (per step, after the last backward):
all_reduce of the rank's gradients over its dp group as one fused bucket (ZeRO 0/1), or
reduce_scatter of the gradients + all_gather of the parameters (ZeRO 2/3); ZeRO-3 also
all_gathers each layer's parameters in every F and B. With ``overlap_dp_sync`` the sync
hides behind the rank's last backward (B of its first chunk) as far as that lasts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from simulator.memory import (
    StageActivations,
    timeline_activation_peaks,
    zero_model_states,
)
from simulator.pipeline_sim import simulate_pipeline
from simulator.result import SimResult
from simulator.roofline import Roofline
from simulator.schedules import build_schedule
from simulator.stage_cost import PHASES, BlockCost


@dataclass(frozen=True)
class StepConfig:
    """What the step needs besides the block costs (see module docstring)."""

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
    overlap: float = 0.0
    overlap_dp_sync: bool = False
    layers_per_stage: tuple[int, ...] | None = None
    accumulate_grads: bool = False
    """True: the framework adds each later micro-batch's parameter gradients into an
    accumulator with a separate kernel and scales by 1/m before the update (Paddle's
    gradient merge, PyTorch ``.grad`` accumulation, this project's executor); False
    (default): accumulation is fused into the dW GEMM (Megatron-LM
    ``gradient_accumulation_fusion``) and the 1/m into the loss, free in the roofline."""


@dataclass
class StepResult:
    """Outcome of one simulated step (seconds, bytes, FLOPs)."""

    step_time: float
    tokens_per_s: float
    tflops_per_gpu: float
    mfu: float
    max_memory_bytes: int
    time_breakdown: dict[str, float]
    memory_breakdown: dict[str, int]
    memory_per_stage: list[dict[str, int]]
    stage_times: list[dict[str, float]]
    layers_per_vstage: list[int]
    model_flops: float
    executed_flops: float
    sim: SimResult = field(repr=False)

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly view (times in ms for the headline, seconds in breakdowns)."""
        return {
            "step_time_ms": self.step_time * 1e3,
            "tokens_per_s": self.tokens_per_s,
            "tflops_per_gpu": self.tflops_per_gpu,
            "mfu": self.mfu,
            "max_memory_bytes": self.max_memory_bytes,
            "time_breakdown_s": self.time_breakdown,
            "memory_breakdown_bytes": self.memory_breakdown,
            "memory_per_stage_bytes": self.memory_per_stage,
            "stage_times_s": self.stage_times,
            "layers_per_vstage": self.layers_per_vstage,
            "bubble_ratio": self.sim.bubble_ratio,
            "model_flops_per_step": self.model_flops,
            "executed_flops_per_step": self.executed_flops,
        }


def split_layers(num_layers: int, num_vstages: int, explicit: tuple[int, ...] | None = None,
                 layer_cost: list[float] | None = None, pre: float = 0.0, post: float = 0.0) -> list[int]:
    """Layers per virtual stage.

    ``explicit`` is used as given (validated). Otherwise the split is balanced by cost:
    contiguous groups minimising the largest stage time, the first stage also paying
    ``pre`` (embeddings) and the last ``post`` (head and loss) -- the balancing the Zero
    Bubble paper does by hand (Table 3: first and last stages carry fewer layers).
    Bisection on the bottleneck T; for each T a right-to-left greedy packing gives the
    fewest groups (and the lightest first group); groups are then split to exactly
    ``num_vstages`` (splitting never raises the maximum). Without costs all layers weigh 1.

    Raises ValueError when there are fewer layers than virtual stages or ``explicit``
    does not fit."""
    if explicit is not None:
        if len(explicit) != num_vstages or sum(explicit) != num_layers or min(explicit) < 0:
            raise ValueError(f"layers_per_stage {list(explicit)} must have {num_vstages} entries "
                             f">= 0 summing to the {num_layers} layers")
        return list(explicit)
    if num_layers == 0 and num_vstages == 1:
        return [0]  # a program without decoder layers runs as one stage
    if num_layers < num_vstages:
        raise ValueError(f"{num_layers} layers cannot fill {num_vstages} pipeline stages x chunks")
    cost = layer_cost or [1.0] * num_layers
    lo = max(max(cost), cost[0] + pre, cost[-1] + post)
    hi = sum(cost) + pre + post
    best = _pack(cost, hi, pre, post)
    for _ in range(60):
        mid = (lo + hi) / 2
        groups = _pack(cost, mid, pre, post)
        if groups is not None and len(groups) <= num_vstages:
            hi, best = mid, groups
        else:
            lo = mid
    assert best is not None
    while len(best) < num_vstages:  # split the group with most layers (ties: the last)
        i = max(range(len(best)), key=lambda j: (best[j], j))
        best[i:i + 1] = [best[i] // 2, best[i] - best[i] // 2]
    return best


def _pack(cost: list[float], limit: float, pre: float, post: float) -> list[int] | None:
    """Right-to-left greedy groups (layer counts, model order) under ``limit``, or None."""
    groups: list[int] = []
    load, count = post, 0
    for c in reversed(cost):
        if load + c > limit * (1 + 1e-12) and count:
            groups.append(count)
            load, count = 0.0, 0
        load += c
        count += 1
        if load > limit * (1 + 1e-12):
            return None
    if load + pre > limit * (1 + 1e-12):
        return None
    groups.append(count)
    return groups[::-1]


def _sum_blocks(blocks: list[BlockCost], attr: str, phase: str) -> float:
    return sum(getattr(b, attr)[phase] for b in blocks)


class StepModel:
    """Assembles a step from block costs.

    Args:
        layer_blocks: one BlockCost per model layer (objects may repeat: identical layers).
        pre, post: the blocks before and after the layers (None if absent).
        acts: activations of the representative program; layer_keys: per model layer,
            its block key in ``acts`` (0 for every layer when one layer represents all).
        global_flops: per block key ("pre", layer key, "post") model FLOPs of F+B+W and
            ``("recompute", key)`` the forward FLOPs recompute re-runs, per micro-batch.
        cluster, roofline, cfg: the hardware and the :class:`StepConfig`.
    """

    def __init__(self, layer_blocks: list[BlockCost], pre: BlockCost | None, post: BlockCost | None,
                 acts: StageActivations, layer_keys: list[Any], global_flops: dict[Any, float],
                 cluster: Any, roofline: Roofline, cfg: StepConfig) -> None:
        self.layers, self.pre, self.post = layer_blocks, pre, post
        self.acts, self.keys, self.gflops = acts, layer_keys, global_flops
        self.cluster, self.rf, self.cfg = cluster, roofline, cfg
        self.nvs = cfg.pp * cfg.vpp
        weight = [self._block_time(b, True) for b in layer_blocks]
        self.split = split_layers(len(layer_blocks), self.nvs, cfg.layers_per_stage, weight,
                                  self._block_time(pre, False), self._block_time(post, False))
        starts = [sum(self.split[:i]) for i in range(self.nvs)]
        self.vs_layers = [list(range(starts[i], starts[i] + self.split[i])) for i in range(self.nvs)]

    def _block_time(self, blk: BlockCost | None, is_layer: bool) -> float:
        """F + B + W seconds of a block per micro-batch (with recompute for layers)."""
        if blk is None:
            return 0.0
        t = sum(blk.time(ph, self.cfg.overlap) for ph in PHASES)
        if is_layer and self.cfg.recompute == "full":
            t += blk.time("F", self.cfg.overlap)
        elif is_layer and self.cfg.recompute == "selective":
            t += blk.attn_core_f
        return t

    # -- per virtual stage ---------------------------------------------------------------
    def _vs_blocks(self, vs: int) -> list[BlockCost]:
        out = [self.layers[i] for i in self.vs_layers[vs]]
        if vs == 0 and self.pre is not None:
            out.append(self.pre)
        if vs == self.nvs - 1 and self.post is not None:
            out.append(self.post)
        return out

    def _zero3_gather(self, blk: BlockCost, stage: int) -> float:
        if self.cfg.zero < 3 or self.cfg.dp == 1:
            return 0.0
        nbytes = sum(b for _, b in blk.params.values())
        return self.cluster.collective_time("all_gather", nbytes, self._dp_group(stage))

    def stage_time(self, vs: int, stage: int) -> tuple[dict[str, float], dict[str, float]]:
        """({F, B, W} seconds, {compute, comm} seconds per micro-batch) of virtual stage vs.

        Each of T_F, T_B, T_W also carries the device's per-pass host overhead
        (``Roofline.action_overhead``, ``device.efficiency.action_overhead_s``): the
        framework's dispatch work per pipeline action outside its kernels (a BW action,
        B + W, pays it twice -- the executor runs its B and W units one after the other)."""
        ov, cfg = self.cfg.overlap, self.cfg
        t = dict.fromkeys(PHASES, 0.0)
        parts = {"compute": 0.0, "comm": 0.0}
        for i, blk in enumerate(self._vs_blocks(vs)):
            is_layer = i < len(self.vs_layers[vs])
            gather = self._zero3_gather(blk, stage)
            for ph in PHASES:
                t[ph] += blk.time(ph, ov)
                parts["compute"] += blk.compute[ph]
                parts["comm"] += (1 - ov) * blk.comm[ph]
            t["F"] += gather
            t["B"] += gather
            parts["comm"] += 2 * gather
            if is_layer and cfg.recompute == "full":
                t["B"] += blk.time("F", ov)
                parts["compute"] += blk.compute["F"]
                parts["comm"] += (1 - ov) * blk.comm["F"]
            elif is_layer and cfg.recompute == "selective":
                t["B"] += blk.attn_core_f
                parts["compute"] += blk.attn_core_f
        acc = self._accumulation_time(vs)
        t["W"] += acc
        parts["compute"] += acc
        host = self.rf.action_overhead  # per pass, outside kernels: serial host work
        for ph in PHASES:
            t[ph] += host
        parts["compute"] += len(PHASES) * host
        return t, parts

    def _accumulation_time(self, vs: int) -> float:
        """Gradient accumulation per micro-batch of virtual stage ``vs`` (seconds, in W).

        Only with ``StepConfig.accumulate_grads``: with m > 1 micro-batches every parameter gradient of the stage is added into its
        accumulator once per micro-batch after the first (the first one's gradient becomes
        the accumulator): one memory-bound in-place add per parameter, reading the
        accumulator and the new gradient and writing the accumulator (3 x gradient bytes)
        plus one kernel launch -- Paddle's gradient merge (an add per gradient per micro-
        batch) and PyTorch's ``.grad`` accumulation do this; Megatron-LM folds it into the
        dW GEMM (beta = 1). Spread evenly over the m W passes: ``(m-1)/m`` of it each.
        Tied parameters (embedding in "pre" and "post") are counted once. The in-place
        add streams at the device's achieved copy bandwidth (:meth:`_stream_time`)."""
        m = self.cfg.num_microbatches
        if m <= 1 or not self.cfg.accumulate_grads:
            return 0.0
        named: dict[str, int] = {}
        for blk in self._vs_blocks(vs):
            named.update({k: n for k, (n, _) in blk.params.items()})
        if not named:
            return 0.0
        nbytes = 3.0 * sum(named.values()) * self.cfg.grad_bytes
        per_step = self._stream_time(nbytes) + len(named) * self.rf.kernel_overhead
        return per_step * (m - 1) / m

    def _dp_group(self, stage: int) -> list[int]:
        base = stage * self.cfg.dp * self.cfg.tp
        return [base + d * self.cfg.tp for d in range(self.cfg.dp)]

    def comm_time(self) -> float:
        """T_comm: the slowest p2p hop of the boundary activation between adjacent stages'
        ranks (including the wrap-around hop of interleaved schedules)."""
        c, p = self.cfg, self.cfg.pp
        if p == 1:
            return 0.0
        width = c.dp * c.tp
        hops = [(k * width, (k + 1) * width) for k in range(p - 1)]
        if c.vpp > 1:
            hops.append(((p - 1) * width, 0))
        return max(self.cluster.p2p_time(c.boundary_bytes, a, b) for a, b in hops)

    # -- per pipeline rank -----------------------------------------------------------------
    def rank_params(self, vstages: list[int]) -> int:
        """Local parameter elements of a pipeline rank (tied weights counted once)."""
        named: dict[str, int] = {}
        total = 0
        for vs in vstages:
            total += sum(sum(n for n, _ in self.layers[i].params.values()) for i in self.vs_layers[vs])
            for blk, on in ((self.pre, vs == 0), (self.post, vs == self.nvs - 1)):
                if blk is not None and on:
                    named.update({k: n for k, (n, _) in blk.params.items()})
        return total + sum(named.values())

    def _act_bytes(self, vs: int, table: str) -> float:
        d = getattr(self.acts, table)
        total = sum(d.get(self.keys[i], 0) for i in self.vs_layers[vs])
        if vs == 0:
            total += d.get("pre", 0)
        if vs == self.nvs - 1:
            total += d.get("post", 0)
        return float(total)

    def _sync_time(self, stage: int, params: int, last_b: float) -> float:
        c = self.cfg
        grads = params * c.grad_bytes
        group = self._dp_group(stage)
        if c.zero >= 2:
            t = self.cluster.collective_time("reduce_scatter", grads, group)
            t += self.cluster.collective_time("all_gather", params * c.param_bytes, group)
        else:
            t = self.cluster.collective_time("all_reduce", grads, group)
        off = stage * c.dp * c.tp
        for i in range(len(self.layers)):
            if i in self._rank_layer_set:
                for kind, nb, g in self.layers[i].grad_sync:
                    t += self.cluster.collective_time(kind, nb, [r + off for r in g])
        return max(0.0, t - last_b) if c.overlap_dp_sync else t

    def _stream_time(self, nbytes: float) -> float:
        """Seconds of a streaming in-place kernel (one read / write pass per operand, as
        an accumulating add or a scaling) moving ``nbytes``: the achieved copy bandwidth
        ``memory_bandwidth * efficiency.memory_bandwidth``, not the average of the
        memory-bound kernels (which includes multi-pass ones)."""
        return nbytes / (self.rf.mem_bandwidth * self.rf.mem_efficiency)

    def _optimizer_time(self, params: int) -> float:
        """Memory-bound updates of the rank's (ZeRO-sharded) parameters: read and write
        parameter and optimizer state, read the gradient; with m > 1 micro-batches also
        the mean over micro-batches, one in-place scaling of every accumulated gradient by
        1/m (read + write; Paddle's gradient merge with ``avg``) when
        ``StepConfig.accumulate_grads``."""
        c = self.cfg
        shard = -(-params // c.dp) if c.zero >= 1 else params
        nbytes = shard * (2 * (c.param_bytes + c.optimizer_bytes) + c.grad_bytes)
        scale = 0.0
        if c.num_microbatches > 1 and c.accumulate_grads:
            scale = self._stream_time(2 * params * c.grad_bytes)
        return self.rf.memory_time(nbytes) + self.rf.kernel_overhead + scale  # memory-bound

    def _times(self, where: dict[int, tuple[int, int]]) -> tuple[list, list]:
        times, parts = [], []
        for vs in range(self.nvs):
            t, pt = self.stage_time(vs, where[vs][0])
            times.append(t)
            parts.append(pt)
        return times, parts

    def run(self) -> StepResult:
        """Simulate the step (see module docstring)."""
        c = self.cfg
        t_comm = self.comm_time()
        if c.schedule in ("ZB", "ZBVPP"):  # time-aware heuristics: place W by (slowest) stage times
            where = ({vs: (vs, 0) for vs in range(self.nvs)} if c.schedule == "ZB" else
                     build_schedule(c.schedule, c.pp, c.num_microbatches, c.vpp).rank_of_vstage())
            times, parts = self._times(where)
            worst = {ph: max(t[ph] for t in times) for ph in PHASES}
            sched = build_schedule(c.schedule, c.pp, c.num_microbatches, c.vpp, c.memory_limit,
                                   stage_times=worst, comm_time=t_comm)
            times, parts = self._times(sched.rank_of_vstage())
        else:
            sched = build_schedule(c.schedule, c.pp, c.num_microbatches, c.vpp, c.memory_limit)
            times, parts = self._times(sched.rank_of_vstage())
        where = sched.rank_of_vstage()
        sim = simulate_pipeline(sched, times, t_comm)
        per_chunk = {where[vs]: (self._act_bytes(vs, "by_block"), self._act_bytes(vs, "w_by_block"))
                     for vs in range(self.nvs)}
        per_chunk = {k: (mb, min(mw, mb)) for k, (mb, mw) in per_chunk.items()}
        peaks = timeline_activation_peaks(sim.timeline, c.pp, per_chunk)
        ends = [0.0] * c.pp
        for e in sim.timeline:
            ends[e.rank] = max(ends[e.rank], e.end * 1e-9)
        ranks = [self._rank(r, sched, peaks[r], ends[r], times, parts, t_comm) for r in range(c.pp)]
        crit = max(ranks, key=lambda x: x["finish"])
        heavy = max(ranks, key=lambda x: x["memory"]["total"])
        step = crit["finish"]
        mflops = c.num_microbatches * sum(v for k, v in self.gflops.items() if not isinstance(k, tuple))
        rec = c.num_microbatches * sum(v for k, v in self.gflops.items() if isinstance(k, tuple))
        world = c.dp * c.tp * c.pp
        return StepResult(
            step_time=step, tokens_per_s=c.tokens_per_step / step,
            tflops_per_gpu=(mflops + rec) / step / world / 1e12,
            mfu=mflops / (step * world * c.peak_flops),
            max_memory_bytes=int(heavy["memory"]["total"]),
            time_breakdown=crit["time"], memory_breakdown=heavy["memory"],
            memory_per_stage=[x["memory"] for x in ranks], stage_times=times,
            layers_per_vstage=self.split, model_flops=mflops, executed_flops=mflops + rec, sim=sim)

    def _rank(self, r: int, sched: Any, act_peak: float, end: float, times: list, parts: list,
              t_comm: float) -> dict[str, Any]:
        c = self.cfg
        vstages = list(sched.vstage[r])
        self._rank_layer_set = {i for vs in vstages for i in self.vs_layers[vs]}
        params = self.rank_params(vstages)
        states = zero_model_states(params, c.dp, c.zero, c.param_bytes, c.grad_bytes,
                                   c.optimizer_bytes)
        sync = self._sync_time(r, params, times[vstages[0]]["B"])
        opt = self._optimizer_time(params)
        m = c.num_microbatches
        compute = m * sum(parts[vs]["compute"] for vs in vstages)
        comm = m * sum(parts[vs]["comm"] for vs in vstages)
        blocks = [b for vs in vstages for b in self._vs_blocks(vs)]
        workspace = max((b.workspace for b in blocks), default=0)
        recompute = 0
        if c.recompute != "none":
            recompute = max((self.acts.dropped_by_block.get(self.keys[i], 0)
                             for i in self._rank_layer_set), default=0)
        memory = {"params": states.params, "grads": states.grads, "optimizer": states.optimizer,
                  "activations": int(act_peak), "recompute": int(recompute),
                  "workspace": int(workspace)}
        memory["total"] = sum(memory.values())
        hops = 2 * m * sum(1 for vs in vstages if vs > 0) * t_comm
        busy = compute + comm
        time = {"compute": compute, "tp_comm": comm, "pp_comm": hops,
                "bubble": max(0.0, end - busy), "dp_sync": sync, "optimizer": opt}
        return {"finish": end + sync + opt, "memory": memory, "time": time}

"""Per virtual stage times of one micro-batch: T_F, T_B, T_W from the block costs of the
layers placed on it (plus embeddings on the first, head and loss on the last), recompute,
gradient accumulation and the per-pass host overhead; and T_comm, the p2p hop between
adjacent stages.

Rank layout (Megatron-LM's order, tensor-parallel innermost): rank = stage * dp * tp +
d * tp + t, so pipeline stage k's ranks are ``k*dp*tp .. (k+1)*dp*tp - 1``.
"""

from __future__ import annotations

from typing import Any

from simulator.roofline import Roofline
from simulator.stage_cost import PHASES, BlockCost


def stream_time(rf: Roofline, nbytes: float) -> float:
    """Seconds of a streaming in-place kernel (one read / write pass per operand, as an
    accumulating add or a scaling) moving ``nbytes``: the achieved copy bandwidth
    ``memory_bandwidth * efficiency.memory_bandwidth``, not the average of the memory-bound
    kernels (which includes multi-pass ones)."""
    return nbytes / (rf.mem_bandwidth * rf.mem_efficiency)


def block_time(blk: BlockCost | None, cfg: Any, is_layer: bool) -> float:
    """F + B + W seconds of a block per micro-batch, with recompute for layers (full: the
    forward again; selective: the attention core's forward again)."""
    if blk is None:
        return 0.0
    t = sum(blk.time(ph, cfg.overlap) for ph in PHASES)
    if is_layer and cfg.recompute == "full":
        t += blk.time("F", cfg.overlap)
    elif is_layer and cfg.recompute == "selective":
        t += blk.attn_core_f
    return t


class StageTimer:
    """Times of the virtual stages of one split.

    Args:
        layers: one BlockCost per model layer; pre / post: the blocks before / after.
        vs_layers: per virtual stage (model order), the model layer indices it holds.
        cfg: the step's ``simulator.step.StepConfig``; cluster: ``clusters.Cluster``;
        rf: the device's Roofline.
    """

    def __init__(self, layers: list[BlockCost], pre: BlockCost | None, post: BlockCost | None,
                 vs_layers: list[list[int]], cfg: Any, cluster: Any, rf: Roofline) -> None:
        self.layers, self.pre, self.post = layers, pre, post
        self.vs_layers, self.cfg, self.cluster, self.rf = vs_layers, cfg, cluster, rf
        self.nvs = len(vs_layers)

    def blocks(self, vs: int) -> list[BlockCost]:
        """The blocks of virtual stage ``vs``: its layers, then "pre" on the first and
        "post" on the last."""
        out = [self.layers[i] for i in self.vs_layers[vs]]
        if vs == 0 and self.pre is not None:
            out.append(self.pre)
        if vs == self.nvs - 1 and self.post is not None:
            out.append(self.post)
        return out

    def stage_time(self, vs: int) -> tuple[dict[str, float], dict[str, float]]:
        """({F, B, W} seconds, {compute, comm} seconds) of virtual stage ``vs`` per
        micro-batch.

        Each of T_F, T_B, T_W also carries the device's per-pass host overhead
        (``Roofline.action_overhead``, ``device.efficiency.action_overhead_s``): the
        framework's dispatch work per pipeline action outside its kernels (a BW action,
        B + W, pays it twice -- the executor runs its B and W units one after the other)."""
        ov, cfg = self.cfg.overlap, self.cfg
        t = dict.fromkeys(PHASES, 0.0)
        parts = {"compute": 0.0, "comm": 0.0}
        for i, blk in enumerate(self.blocks(vs)):
            is_layer = i < len(self.vs_layers[vs])
            gather = self.zero3_gather_time(blk)
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
        acc = self.accumulation_time(vs)
        t["W"] += acc
        parts["compute"] += acc
        host = self.rf.action_overhead  # per pass, outside kernels: serial host work
        for ph in PHASES:
            t[ph] += host
        parts["compute"] += len(PHASES) * host
        return t, parts

    def zero3_gather_time(self, blk: BlockCost) -> float:
        """ZeRO-3: seconds of the all_gather of a block's parameters over the dp group,
        paid before its forward and again before its backward (Rajbhandari et al. 2020,
        sec. 5.3; one bucket per block, as DeepSpeed and FSDP gather a layer's flat
        parameters). 0 below stage 3 or with dp = 1. The group is stage 0's (stages are
        the same layout shifted; catalog topologies are uniform)."""
        c = self.cfg
        if c.zero < 3 or c.dp == 1:
            return 0.0
        nbytes = sum(b for _, b in blk.params.values())
        return self.cluster.collective_time("all_gather", nbytes, [d * c.tp for d in range(c.dp)])

    def accumulation_time(self, vs: int) -> float:
        """Gradient accumulation per micro-batch of virtual stage ``vs`` (seconds, in W).

        Only with ``StepConfig.accumulate_grads``: with m > 1 micro-batches every parameter
        gradient of the stage is added into its accumulator once per micro-batch after the
        first (the first one's gradient becomes the accumulator): one memory-bound in-place
        add per parameter, reading the accumulator and the new gradient and writing the
        accumulator (3 x gradient bytes) plus one kernel launch -- Paddle's gradient merge
        (an add per gradient per micro-batch) and PyTorch's ``.grad`` accumulation do this;
        Megatron-LM folds it into the dW GEMM (beta = 1). Spread evenly over the m W
        passes: ``(m-1)/m`` of it each. Tied parameters (embedding in "pre" and "post") are
        counted once. The add streams at the achieved copy bandwidth (:func:`stream_time`)."""
        m = self.cfg.num_microbatches
        if m <= 1 or not self.cfg.accumulate_grads:
            return 0.0
        named: dict[str, int] = {}
        for blk in self.blocks(vs):
            named.update({k: n for k, (n, _) in blk.params.items()})
        if not named:
            return 0.0
        nbytes = 3.0 * sum(named.values()) * self.cfg.grad_bytes
        per_step = stream_time(self.rf, nbytes) + len(named) * self.rf.kernel_overhead
        return per_step * (m - 1) / m

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

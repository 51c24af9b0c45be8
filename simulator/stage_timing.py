"""Per virtual stage times of one micro-batch: T_F, T_B, T_W from the block costs of the
layers placed on it (plus embeddings on the first, head and loss on the last), recompute,
gradient accumulation and the per-pass host overhead; and T_comm, the p2p hop between
adjacent stages.

Rank layout (Megatron-LM's order, tensor-parallel innermost): rank = stage * dp * tp +
d * tp + t, so pipeline stage k's ranks are ``k*dp*tp .. (k+1)*dp*tp - 1``.
"""

from __future__ import annotations

from typing import Any

from simulator import dp_groups
from simulator.host_time import Dispatch
from simulator.roofline import Roofline
from simulator.stage_cost import PHASES, BlockCost
from simulator.streams import Kernel, prefetched_chain


def stream_time(rf: Roofline, nbytes: float) -> float:
    """Seconds of a streaming in-place kernel (one read / write pass per operand, as an
    accumulating add or a scaling) moving ``nbytes``: the achieved copy bandwidth
    ``memory_bandwidth * efficiency.memory_bandwidth``, not the average of the memory-bound
    kernels (which includes multi-pass ones)."""
    return nbytes / (rf.mem_bandwidth * rf.mem_efficiency)


def reduce_bytes(cfg: Any) -> int:
    """Bytes per gradient element on the wire of a data-parallel reduction: 4 when the
    profile reduces in fp32 (Megatron's fp32 main grads, FSDP reduce_dtype float32), else
    the gradient bytes."""
    prof = cfg.profile
    if prof is not None and prof.gradients.reduce_dtype.value == "float32":
        return 4
    return cfg.grad_bytes


def vstage_ranks(schedule: str, pp: int, vpp: int) -> list[int]:
    """The pipeline rank of each virtual stage (model order): round robin (vs mod pp) for
    every schedule but ZB-V and DualPipeV, whose two chunks per rank run in a V (rank i
    holds vs i and 2p - 1 - i; formulas.md, Qi et al. 2024; ``simulator.schedules.dualpipe``)."""
    if schedule in ("ZBVPP", "DualPipeV"):
        return [vs if vs < pp else 2 * pp - 1 - vs for vs in range(pp * vpp)]
    return [vs % pp for vs in range(pp * vpp)]


def block_time(blk: BlockCost | None, cfg: Any, is_layer: bool) -> float:
    """F + B + W seconds of a block per micro-batch, with recompute for layers (full: the
    forward again; selective: the attention core's forward again)."""
    if blk is None:
        return 0.0
    t = sum(blk.time(ph, cfg.overlap) for ph in PHASES)
    if is_layer:
        t += blk.recompute_time(cfg.recompute, cfg.overlap)
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
        """The blocks of virtual stage ``vs`` in execution order: "pre" on the first, its
        layers, "post" on the last."""
        out = [self.layers[i] for i in self.vs_layers[vs]]
        if vs == 0 and self.pre is not None:
            out.insert(0, self.pre)
        if vs == self.nvs - 1 and self.post is not None:
            out.append(self.post)
        return out

    def _block_phases(self, vs: int) -> tuple[list[BlockCost], list[dict[str, float]]]:
        """The blocks of ``vs`` and, per block, its F, B, W seconds per micro-batch (layers
        with their recompute in B: full reruns the forward, selective the attention core)."""
        ov, cfg = self.cfg.overlap, self.cfg
        blocks = self.blocks(vs)
        recomputed = self._recomputed(vs)
        policy = cfg.recompute_policy
        out = []
        for blk in blocks:
            t = blk.times(cfg.profile, ov)
            extra = 0.0
            if id(blk) in recomputed:  # full: the forward again, overlapped as the forward is
                extra = policy.rerun_time(t["F"], blk.recompute_f)
            t["B"] += extra
            t["BW"] += extra
            out.append(t)
        return blocks, out

    def a2a_time(self, vs: int) -> tuple[float, float]:
        """(forward, backward) seconds per micro-batch of the all_to_all collectives of
        virtual stage ``vs`` (``BlockCost.a2a``, with the profile's in-stage overlap share
        off; under full recompute the backward reruns the forward's too)."""
        ov, cfg = self.cfg.overlap, self.cfg
        recomputed = self._recomputed(vs)
        f = b = 0.0
        for blk in self.blocks(vs):
            f += (1 - ov) * blk.a2a["F"]
            b += (1 - ov) * (blk.a2a["B"] + blk.a2a["W"])
            if id(blk) in recomputed and cfg.recompute_policy.reruns_forward:
                b += (1 - ov) * blk.a2a["F"]
        return f, b

    def _recomputed(self, vs: int) -> set[int]:
        """ids of the BlockCosts of ``vs`` that recompute applies to (its layers, not the
        embeddings or the head)."""
        return {id(self.layers[i]) for i in self.vs_layers[vs]} - {id(self.pre), id(self.post)}

    def stage_time(self, vs: int) -> tuple[dict[str, float], dict[str, float]]:
        """({F, B, W, BW} seconds, {compute, comm, cp_hidden, fsdp} seconds) of virtual stage
        ``vs`` per micro-batch; BW is a fused backward action (B then W); ``fsdp`` is the part
        of ``comm`` that ZeRO-3's parameter gathers and gradient reduces add; ``cp_hidden``
        the context-parallel exchange that ran beside attention (``BlockCost.cp_hidden``;
        in no action's time).

        ZeRO-3 gathers each block's parameters before its forward and backward: under a
        profile that prefetches (``overlap.fsdp_prefetch`` >= 1: FSDP, DeepSpeed stage 3)
        the gathers run on a communication stream ahead of the blocks and each block's
        gradients are reduce_scattered after its backward
        (:func:`simulator.streams.prefetched_chain`); otherwise every gather is exposed
        (:meth:`zero3_gather_time`). Where the pipeline accumulates FSDP gradients unsharded
        (:func:`simulator.dp_groups.accumulates_unsharded`) a block gathers once per
        micro-batch and reduces nothing until the stage's last backward. With the profile's
        pipeline scatter-gather (Megatron-LM 2021) a stage that receives a boundary tensor
        from another rank all_gathers it over its tensor-parallel group first
        (:meth:`scatter_gather_time`).

        Each action also waits for the host where the framework's eager dispatch is slower
        than its kernels (:meth:`_host_bound`, ``simulator.host_time``; profiles with a
        ``host`` section); ``parts`` then holds ``host_fused`` / ``host_split``, the seconds
        that adds per micro-batch when the schedule runs B and W as one action or apart.

        Each of T_F, T_B, T_W also carries the device's per-pass host overhead
        (``Roofline.action_overhead``, ``device.efficiency.action_overhead_s``): the
        framework's dispatch work per pipeline action outside its kernels (a BW action,
        B + W, pays it twice -- the executor runs its B and W units one after the other)."""
        ov = self.cfg.overlap
        blocks, per = self._block_phases(vs)
        parts = {"compute": 0.0, "comm": 0.0, "cp_hidden": 0.0}
        recomputed = self._recomputed(vs)
        policy = self.cfg.recompute_policy
        for blk in blocks:
            parts["compute"] += sum(blk.compute[ph] for ph in PHASES)
            parts["comm"] += (1 - ov) * sum(blk.comm[ph] for ph in PHASES)
            parts["cp_hidden"] += sum(blk.cp_hidden[ph] for ph in PHASES)
            if id(blk) in recomputed and policy.reruns_forward:
                parts["compute"] += blk.compute["F"]
                parts["comm"] += (1 - ov) * blk.comm["F"]
                parts["cp_hidden"] += blk.cp_hidden["F"]
            elif id(blk) in recomputed:
                parts["compute"] += policy.rerun_time(0.0, blk.recompute_f)
        times, gathered = self._zero3_times(blocks, per)
        parts.update(self._host_bound(vs, blocks, times))
        parts["comm"] += gathered
        parts["fsdp"] = gathered  # the ZeRO-3 part of comm (simulator.step_trace draws it apart)
        recv_f, recv_b = self.scatter_gather_time(vs)
        times["F"] += recv_f
        times["B"] += recv_b
        times["BW"] += recv_b
        parts["comm"] += recv_f + recv_b
        acc = self.accumulation_time(vs)
        times["W"] += acc
        times["BW"] += acc
        parts["compute"] += acc
        host = self.rf.action_overhead  # per pass, outside kernels: serial host work
        for ph in PHASES:
            times[ph] += host
        times["BW"] += 2 * host
        parts["compute"] += len(PHASES) * host
        return times, parts

    def action_dispatch(self, vs: int, blocks: list[BlockCost] | None = None) -> dict[str, Dispatch]:
        """Per action kind (F, B, W, BW) of virtual stage ``vs``, its blocks' kernels as the
        host dispatches them (``simulator.host_time.Dispatch``, composed): the forward in
        block order; the backward in reverse block order, a block under full recompute
        replaying its forward before its backward; BW each block's B then W."""
        blocks = self.blocks(vs) if blocks is None else blocks
        again = self._recomputed(vs) if self.cfg.recompute_policy.reruns_forward else set()
        prof = getattr(self.cfg, "profile", None)

        def back(*phases: Any) -> Dispatch:
            return Dispatch.chain((blk.dispatch("F", prof) if id(blk) in again else Dispatch()).then(
                Dispatch.chain(blk.dispatch(ph, prof) for ph in phases)) for blk in reversed(blocks))

        return {"F": Dispatch.chain(blk.dispatch("F", prof) for blk in blocks),
                "B": back("B"), "W": Dispatch.chain(blk.dispatch("W", prof) for blk in reversed(blocks)),
                "BW": back("B", "W")}

    def _host_bound(self, vs: int, blocks: list[BlockCost], times: dict[str, float]) -> dict[str, float]:
        """Add to each of ``times``' F, B, W and BW the seconds the host's dispatch adds to
        its kernels (:meth:`action_dispatch`, ``Dispatch.exposed``; 0 without a profile
        ``host`` section). Returns ``{"host_split": F + B + W gaps, "host_fused": F + BW
        gaps}`` (the step adds the one its schedule runs to the compute line)."""
        if getattr(getattr(self.cfg, "profile", None), "host", None) is None:
            return {"host_split": 0.0, "host_fused": 0.0}  # no dispatch time: nothing to compose
        gaps = {k: d.exposed for k, d in self.action_dispatch(vs, blocks).items()}
        for k, g in gaps.items():
            times[k] += g
        return {"host_split": gaps["F"] + gaps["B"] + gaps["W"], "host_fused": gaps["F"] + gaps["BW"]}

    def _zero3_times(self, blocks: list[BlockCost], per: list[dict[str, float]]) -> tuple[dict[str, float], float]:
        """(F, B, W, BW seconds of the chain of ``blocks``, seconds of collectives added)."""
        c = self.cfg
        f, b, w, bw = (sum(t[ph] for t in per) for ph in ("F", "B", "W", "BW"))
        if c.zero < 3 or c.dp == 1:
            return {"F": f, "B": b, "W": w, "BW": bw}, 0.0
        gathers = [self.zero3_gather_time(blk) for blk in blocks]
        prof = c.profile
        depth = prof.overlap.fsdp_prefetch.value if prof is not None else 0
        if depth < 1:  # every gather exposed, before the forward and again the backward
            g = sum(gathers)
            # a host synchronised before each gather waits for the reduce_scatters queued
            # before it too: they join the backward's critical path (dp_groups.host_synced;
            # simulator.grad_sync.grad_buckets then has none)
            r = sum(self.zero3_reduce_time(blk) for blk in blocks) if dp_groups.host_synced(c) else 0.0
            return {"F": f + g, "B": b + g + r, "W": w, "BW": bw + g + r}, 2 * g + r
        again = prof.overlap.fsdp_reshard_after_forward.value
        reduces = [self.zero3_reduce_time(blk) for blk in blocks]
        if dp_groups.accumulates_unsharded(c):
            # no reduce per micro-batch (one after the last backward:
            # simulator.grad_sync.held_reduce_time) and the weights stay gathered after a
            # backward, so a block gathers once per micro-batch (approx.: in its forward;
            # under 1F1B's steady state a resharding forward frees them and the backward
            # gathers them again, the same count)
            reduces, again = [0.0] * len(blocks), False
        bg = gathers[::-1] if again else [0.0] * len(blocks)

        def kernels(ph: str, order: int) -> list[Kernel]:
            return [Kernel(t[ph], t[ph]) for t in per][::order]

        times = {"F": prefetched_chain(kernels("F", 1), gathers, depth),
                 "B": prefetched_chain(kernels("B", -1), bg, depth),
                 "W": prefetched_chain(kernels("W", -1), [0.0] * len(blocks), depth, reduces[::-1]),
                 "BW": prefetched_chain(kernels("BW", -1), bg, depth, reduces[::-1])}
        return times, sum(gathers) * (2 if again else 1) + sum(reduces)

    def zero3_gather_time(self, blk: BlockCost) -> float:
        """ZeRO-3: seconds of the all_gather of a block's parameters over the dp group
        (one bucket per block, as FSDP gathers a layer's flat parameters; Rajbhandari et al.
        2020, sec. 5.3; one call per parameter tensor under the profile's
        ``overlap.fsdp_unit`` ``tensor``, :func:`simulator.dp_groups.unit_sizes`, each
        paying the ring's latency); under HSDP over the shard group
        (:func:`simulator.dp_groups.gather_time`). 0 below stage 3 or with dp = 1. The group
        is stage 0's (stages are the same layout shifted; catalog topologies are uniform)."""
        c = self.cfg
        if c.zero < 3 or c.dp == 1:
            return 0.0
        sizes = dp_groups.unit_sizes(c, list(blk.params.values()), gather=True)
        return sum(dp_groups.gather_time(self.cluster, c, 0, nb) + self.rank_copies_time(nb)
                   for nb in sizes)

    def rank_copies_time(self, nbytes: float) -> float:
        """Seconds of the per-rank copies of one ZeRO-3 list-form all_gather or
        reduce_scatter of ``nbytes`` (whole) under the profile's
        ``overlap.fsdp_rank_copies``: torch's ProcessGroupNCCL (pytorch 00f5dfd
        ``torch/lib/c10d/ProcessGroupNCCL.cpp`` ``allgather`` / ``reduce_scatter``) copies
        the flat buffer to (from) each of the shard group's N list tensors with one
        ``copy_`` each, ``N (kernel overhead) + 2 nbytes / copy bandwidth``
        (:func:`stream_time`); 0 otherwise. E.g. 1.2 GB over 768 ranks on an A100: 768 x 5
        us + 2.4 GB / 1.63 TB/s = 5.3 ms."""
        prof = self.cfg.profile
        fact = None if prof is None else prof.overlap.fsdp_rank_copies
        if fact is None or not fact.value:
            return 0.0
        n = dp_groups.shard_degree(self.cfg)
        return n * self.rf.kernel_overhead + stream_time(self.rf, 2 * nbytes)

    def zero3_reduce_time(self, blk: BlockCost) -> float:
        """ZeRO-3 / FSDP: seconds of the reduce_scatter of a block's gradients over the dp
        group after its backward, in the profile's reduce dtype (fp32: 4 bytes per
        element; else the gradient bytes), one call per unit as the gather
        (:func:`simulator.dp_groups.unit_sizes`); under HSDP within the shard group, then the
        1/N shard all_reduced across the replicas (:func:`simulator.dp_groups.reduce_time`)."""
        c = self.cfg
        if c.zero < 3 or c.dp == 1:
            return 0.0
        sizes = dp_groups.unit_sizes(c, [(n, n * reduce_bytes(c)) for n, _ in blk.params.values()])
        return sum(dp_groups.reduce_time(self.cluster, c, 0, nb) + self.rank_copies_time(nb)
                   for nb in sizes)

    def scatter_gather_time(self, vs: int) -> tuple[float, float]:
        """(F, B) seconds a virtual stage spends all_gathering the boundary tensor it
        receives from another rank over its tensor-parallel group, when the profile splits
        pipeline messages over the tp ranks (Megatron-LM 2021 scatter-gather; FN): the
        activation (F, from vs-1) and its gradient (B, from vs+1)."""
        c = self.cfg
        prof = c.profile
        if prof is None or not prof.pipeline.scatter_gather.value or c.tp == 1 or c.pp == 1:
            return 0.0, 0.0
        group = list(range(c.tp))
        t = self.cluster.collective_time("all_gather", c.boundary_bytes, group)
        where = vstage_ranks(c.schedule, c.pp, c.vpp)
        f = t if vs > 0 and where[vs - 1] != where[vs] else 0.0
        b = t if vs < self.nvs - 1 and where[vs + 1] != where[vs] else 0.0
        return f, b

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
        nbytes = c.boundary_bytes
        if c.profile is not None and c.profile.pipeline.scatter_gather.value and c.tp > 1:
            nbytes /= c.tp  # each tp rank sends its slice (scatter-gather, Megatron-LM 2021)
        return max(self.cluster.p2p_time(nbytes, a, b) for a, b in hops)

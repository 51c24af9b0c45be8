"""A tier-0 lower bound on a plan's simulated step time that needs no completion of its layout.

:mod:`simulator.bounds.step` bounds a plan from its layout's block costs, which need a
completion of the layout's representative program (0.15-0.4 s each). This module bounds it
from the *unsharded* one-rank program of the same model, micro-batch and sequence (built
once per micro-batch size and ``seq_len / cp``, shared by every layout), so an exhaustive
search can bound every candidate in microseconds and complete only the layouts of the
candidates this bound cannot prune (:mod:`tuner.exhaustive`).

Per kernel ``k`` the roofline charges (``simulator.roofline.Roofline.kernel_time``)::

    t_k >= exec_flops_k / (P * e_k)

with ``P`` the largest peak the plan's kernels can run at (:func:`compute_peak`) and
``e_k`` an upper bound on the fraction of it the kernel can reach:

* a GEMM: smooth model ``gemm * F / (F + F_half) <= gemm``; wave model ``waves * 2 tm tn k /
  (P / S_max * gemm)`` with ``waves >= tiles / S`` and ``tiles * tm * tn >= batch m n``,
  ``S <= S_max``, so ``>= 2 batch m n k / (P * gemm)`` = ``exec_flops / (P * gemm)``;
* an attention kernel: ``attention`` efficiency or a ``by_op`` entry (:func:`max_efficiency`);
* a memory-bound kernel, and a fused group's one kernel (kind ``memory``, its members'
  FLOPs, ``simulator.fusion.FusionPlan.kernel``): ``max(exec_flops / P_dtype, ...) >=
  exec_flops / P``: efficiency 1.

Every kernel's time is also at least its memory term ``bytes / (B * m_k)`` (``B`` the HBM
bandwidth, ``m_k`` its memory efficiency, at most :func:`max_memory_efficiency`), so
``t_k >= max(exec_flops_k / (P e_k), bytes_k / (B m_max))``; both terms shrink at most
``tp``-fold on a shard (bytes of operands and results, like FLOPs, cover the tensor).

:func:`max_efficiency` gives ``e_k`` per kind: so a GEMM or attention kernel is charged
``>= exec_flops / (P * e_kind)``; a kernel of a fused group ``>= exec_flops / P``. Each phase time of a block is
at least the sum of its kernels' times (``BlockCost.times``: in-stage collectives add
``(1 - overlap) * comm >= 0`` and an overlapped collective saves at most its own time,
``simulator.streams.overlapped_time >= sum of its window's kernel seconds`` in the fluid
model), and recompute adds the forward again (``full``) or the recomputed ops' forward
kernels (a partial policy; a fused recomputed op is counted 0 here).

Sharding: the plan's rank 0 runs every kernel of the unsharded program on a local shard.
Tensor parallelism splits each operand over ``tp`` ranks (or replicates it): the local
work of rank 0 is at least ``1 / tp`` of the unsharded one, since the shards of a split
cover the whole tensor and rank 0's is the largest (``completion.dist_attr.local_shape``
gives the first ranks the ceil chunks). Data parallelism and context parallelism are
folded as the engine folds them (``completion.context_parallel.fold_strategy``): each of
``dp * cp`` replicas runs micro-batches of ``mbs`` sequences of ``seq_len / cp`` tokens; the
unsharded program of ``seq_len / cp`` tokens has the GEMM FLOPs of a cp rank exactly and
at most its attention FLOPs (a cp rank attends its ``s / cp`` queries to more keys than
``s / cp``: ring attention, Liu et al. 2023).

Pipeline (:mod:`simulator.bounds.step`'s argument): rank r's last action ends no earlier than
``chain_r + busy_r``; ``sum_r busy_r = m * sum over every block of (F + B + W)`` (each
virtual stage is on one rank), and ``chain_r`` (the forward of micro-batch 0 through the
virtual stages below rank r's lowest, ``s_r = r`` for every registered placement,
``simulator.stage_timing.vstage_ranks``) is at least ``r`` layers' forward (every virtual
stage holds >= 1 layer: ``simulator.layer_split``) plus the embedding's forward when
``r > 0``. So::

    step >= max_r (chain_r + busy_r) >= (m * W_total / tp + sum_{r<pp} chain_r) / pp

The gradient sync, the optimizer step, the p2p hops and per-action host overheads are all
>= 0 and dropped; 1 ns per action and hop is subtracted for the engine's integer-ns
rounding.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from simulator.blocks import assign_blocks
from simulator.errors import SimulatorError
from simulator.fusion import FusionPlan
from simulator.op_signature import op_signature
from simulator.recompute import PARTIAL_RECOMPUTE, recompute_policy, recomputed_ops
from simulator.roofline import Roofline
from simulator.stage_cost import PHASES, StageCoster
from simulator.types import BlockKey

NS = 1e-9
#: kernel kinds charged at most ``max_efficiency`` of the peak (the rest: at most the peak)
COMPUTE_KINDS = ("gemm", "attention")


def max_efficiency(rf: Roofline, kind: str) -> float:
    """The largest fraction of the peak a kernel of ``kind`` reaches on ``rf``: a GEMM
    ``gemm_efficiency`` (``Roofline.gemm_time`` reads no ``by_op``); an attention kernel
    the largest of its efficiency (``attention_efficiency``, else ``gemm_efficiency``) and
    every ``by_op`` value (``Roofline.op_efficiency``); anything else 1."""
    if kind == "gemm":
        return float(rf.gemm_efficiency)
    if kind == "attention":
        base = rf.gemm_efficiency if rf.attention_efficiency is None else rf.attention_efficiency
        return float(max([base, *rf.by_op.values()]))
    return 1.0


def compute_peak(rf: Roofline, fp8: bool) -> float:
    """The largest FLOP/s any kernel of a plan runs at: the largest listed peak, FP8's
    included only for an FP8 plan (``Roofline.peak`` never gives a non-FP8 kernel the FP8
    rate). Raises SimulatorError when the device lists no peak."""
    vals = [v for k, v in rf.peak_flops.items() if fp8 or not (k.startswith("fp8") or k.startswith("float8"))]
    if not vals:
        raise SimulatorError("tier-0 bound: the device lists no peak_flops")
    return float(max(vals))


@dataclass
class BlockWork:
    """Lower bounds in seconds (at the ``peak`` given to :func:`block_work`; 1.0: in
    peak-seconds) of one block's kernels per micro-batch in the unsharded program: ``phase[F|B|W]`` and ``recompute``
    (policy -> its forward kernels again; ``full``: the whole forward)."""

    phase: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    recompute: dict[str, float] = field(default_factory=dict)

    @property
    def fbw(self) -> float:
        """F + B + W peak-seconds."""
        return sum(self.phase.values())

    def with_recompute(self, mode: str) -> float:
        """F + B + W + what ``mode`` reruns."""
        return self.fbw + recompute_policy(mode).rerun_time(self.phase["F"], self.recompute)


def max_memory_efficiency(rf: Roofline) -> float:
    """The largest fraction of the HBM bandwidth any kernel's memory term reaches on ``rf``:
    of ``mem_efficiency`` (GEMM, attention), ``memory_kernel_efficiency`` and every
    ``by_op`` value (memory-bound kernels, ``Roofline.memory_time``)."""
    vals = [rf.mem_efficiency, *([rf.memory_kernel_efficiency] if rf.memory_kernel_efficiency else []),
            *rf.by_op.values()]
    return float(max(vals))


def block_work(program: Any, rf: Roofline, profile: Any = None, peak: float = 1.0) -> dict[BlockKey, BlockWork]:
    """Per block (``"pre"``, layer index, ``"post"``) of an unsharded one-rank program (rank
    0's local shapes are its global ones), its :class:`BlockWork`: for each kernel the
    roofline charges (the framework's eager kernels, ``StageCoster._kernels``),
    ``max(exec_flops / (peak * e), bytes / (bandwidth * max_memory_efficiency))`` with ``e = max_efficiency(rf, kind)`` for GEMM and attention
    kernels outside a fused group and 1 for the rest (module docstring)."""
    blocks = assign_blocks(program)
    coster = StageCoster(program, None, rf, rank=0, profile=profile)
    plan = FusionPlan.of(program, profile, blocks)
    rec = {mode: recomputed_ops(program.ops, blocks, mode) for mode in PARTIAL_RECOMPUTE}
    eff_of = {kind: max_efficiency(rf, kind) for kind in COMPUTE_KINDS}
    bw = rf.mem_bandwidth * max_memory_efficiency(rf)
    out: dict[BlockKey, BlockWork] = {}
    for op in program.ops:
        blk = blocks.get(id(op))
        if blk is None or op.type in ("reshard", "parameter"):
            continue
        g = plan.group(op)
        fused_phase = None if g is None else g.phase
        sig = op_signature(op, 0, coster.names)
        w = out.setdefault(blk, BlockWork())
        for k in coster._kernels(sig):
            if k.phase not in PHASES:
                continue
            eff = eff_of[k.kind] if k.kind in COMPUTE_KINDS and k.phase != fused_phase else 1.0
            ps = max(k.exec_flops / (eff * peak), k.bytes / bw)
            w.phase[k.phase] += ps
            if k.phase == "F" and fused_phase != "F":
                for mode, ids in rec.items():
                    if id(op) in ids:
                        w.recompute[mode] = w.recompute.get(mode, 0.0) + ps
    return out


def tier0_step_time(layers: list[BlockWork], pre: BlockWork | None, post: BlockWork | None, *,
                    peak: float, tp: int, pp: int, vpp: int, num_microbatches: int,
                    recompute: str, fused_backward: bool = True) -> float:
    """Seconds <= the simulated step time of a plan whose unsharded program has the per
    model layer ``layers`` (model order) and ``pre`` / ``post`` works (module docstring's
    inequality), on ``tp`` x ``pp`` (``vpp`` chunks) ranks at ``peak`` FLOP/s, with
    ``num_microbatches`` micro-batches and ``recompute`` applied to the layers (works in
    peak-seconds with ``peak`` the FLOP/s, or in seconds with ``peak`` 1).

    Raises SimulatorError for a degree or micro-batch count below 1 or fewer layers than
    virtual stages."""
    for name, v in (("tp", tp), ("pp", pp), ("vpp", vpp), ("num_microbatches", num_microbatches)):
        if v < 1:
            raise SimulatorError(f"tier-0 bound: {name} must be >= 1, got {v}")
    nvs = pp * vpp
    if len(layers) < nvs and not (nvs == 1 and not layers):
        raise SimulatorError(f"tier-0 bound: {len(layers)} layers cannot fill {nvs} virtual stages")
    total = sum(w.with_recompute(recompute) for w in layers)
    total += sum(b.fbw for b in (pre, post) if b is not None)
    f_min = min((w.phase["F"] for w in layers), default=0.0)
    pre_f = 0.0 if pre is None else pre.phase["F"]
    chains = sum(r * f_min + pre_f for r in range(1, pp))
    work = (num_microbatches * total + chains) / (tp * peak)
    actions = num_microbatches * nvs * (2 if fused_backward else 3) + 2 * nvs
    return max(0.0, work / pp - actions * NS)


def inflight_counts(schedule: Any) -> list[int]:
    """Per pipeline rank of an order-fixed ``schedule`` (``simulator.schedules``), ``k_r``:
    the largest, over the prefixes of its action list, of the smallest over its chunks of
    the micro-batches that chunk has forwarded and not yet backwarded (F less B or BW).

    Why it bounds the activation peak: after a prefix the rank holds, per chunk c,
    ``(F_c - B_c - BW_c) M_B,c + (B_c - W_c) M_W,c >= (F_c - B_c - BW_c) M_B,c`` bytes
    (``simulator.memory.activation_delta``; a W follows its B, M_W >= 0), so at least
    ``k_r * sum_c M_B,c``. A rank plays its actions in order on one stream and every pass
    lasts at least the per-pass host overhead, so the simulated timeline reaches that
    prefix's holding at the start of its last F (1F1B on p stages: ``k_r = min(p - r, m)``,
    Narayanan et al. 2021, sec. 2.2)."""
    out = []
    for r, row in enumerate(schedule.actions):
        chunks = len(schedule.vstage[r])
        held = [0] * chunks
        best = 0
        for a in row:
            kind, c = a[0], a[3]
            if kind == "F":
                held[c] += 1
                low = min(held)
                if low > best:
                    best = low
            elif kind in ("B", "BW"):
                held[c] -= 1
        out.append(best)
    return out


#: ``inflight_counts`` of the registered order-fixed schedules in closed form, (pp, m) ->
#: per rank (``tests/meshplan/test_tier0_memory.py`` checks each against its builder over a grid):
#: 1F1B and ZB-H1 hold min(p - r, m) micro-batches on rank r (Narayanan et al. 2021, sec.
#: 2.2; ZB-H1 keeps 1F1B's warm-up, Qi et al. 2024, sec. 3), FThenB all m, Megatron's
#: interleaved schedule min(m, p, 2 (p - r) - 1) of every chunk at once (its warm-up of
#: 2 (p - r - 1) + (v - 1) p forwards goes chunk by chunk)
INFLIGHT: dict[str, Callable[[int, int], list[int]]] = {
    "1F1B": lambda p, m: [min(p - r, m) for r in range(p)],
    "ZBH1": lambda p, m: [min(p - r, m) for r in range(p)],
    "FThenB": lambda p, m: [m] * p,
    "VPP": lambda p, m: [min(m, p, 2 * (p - r) - 1) for r in range(p)],
}


def least_peak(rank_bytes: Sequence[Sequence[int]], layers: int) -> int:
    """The smallest ``max_r rank_bytes[r][n_r]`` over every split of ``layers`` decoder
    layers into ``n_r >= 0`` per pipeline rank (``rank_bytes[r][n]``: a lower bound on rank
    r's peak memory when it holds n layers, non-decreasing in n, for n = 0 .. layers).

    A lower bound on the heaviest rank whatever split the cost model picks: for the real
    split n* with ``L* = max_r rank_bytes[r][n*_r]``, every ``rank_bytes[r][0] <= L*`` and
    ``n*_r <= N_r(L*) = #{n >= 1 : rank_bytes[r][n] <= L*}`` (monotone rows), so at least
    ``layers`` of the values ``rank_bytes[r][n]``, n >= 1, are <= L*: ``L*`` is at least the
    ``layers``-th smallest of them, and at least every ``rank_bytes[r][0]``."""
    if layers == 0:
        return max(int(t[0]) for t in rank_bytes)
    rows = np.asarray(rank_bytes, dtype=np.int64)
    pooled = rows[:, 1:layers + 1].ravel()
    return int(max(rows[:, 0].max(), np.partition(pooled, layers - 1)[layers - 1]))


__all__ = ["BlockWork", "COMPUTE_KINDS", "INFLIGHT", "block_work", "compute_peak", "inflight_counts",
           "least_peak", "max_efficiency", "tier0_step_time"]

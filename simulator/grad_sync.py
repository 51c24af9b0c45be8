"""Per-step work after the last backward of a pipeline rank: the gradient synchronisation
over its data-parallel group and the optimizer update.

Gradient sync (once per step): all_reduce of the rank's gradients over its dp group as one
fused bucket (ZeRO 0/1), or reduce_scatter of the gradients + all_gather of the updated
parameters (ZeRO 2/3; Rajbhandari et al. 2020, sec. 5), plus the per-step collectives the
program puts on weight gradients (``BlockCost.grad_sync``, e.g. the tensor-parallel
all_reduce of sequence-parallel norm weights). With ``overlap_dp_sync`` it hides behind the
rank's last backward as far as that lasts. The optimizer is memory-bound: read and write
parameters and optimizer states, read the gradients.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from simulator.roofline import Roofline
from simulator.stage_cost import BlockCost
from simulator.stage_timing import stream_time


def dp_group(cfg: Any, stage: int) -> list[int]:
    """Ranks of pipeline stage ``stage``'s data-parallel group holding tensor rank 0."""
    base = stage * cfg.dp * cfg.tp
    return [base + d * cfg.tp for d in range(cfg.dp)]


def sync_time(cfg: Any, cluster: Any, stage: int, params: int, layers: Iterable[BlockCost],
              last_b: float) -> float:
    """Seconds of pipeline rank ``stage``'s gradient sync (module docstring).

    Args:
        params: local parameter elements of the rank; layers: the BlockCosts of its layers
            (their ``grad_sync`` collectives, on groups shifted to the stage's ranks);
        last_b: seconds of the rank's last backward, behind which the sync may hide when
            ``cfg.overlap_dp_sync``."""
    grads = params * cfg.grad_bytes
    group = dp_group(cfg, stage)
    if cfg.zero >= 2:
        t = cluster.collective_time("reduce_scatter", grads, group)
        t += cluster.collective_time("all_gather", params * cfg.param_bytes, group)
    else:
        t = cluster.collective_time("all_reduce", grads, group)
    off = stage * cfg.dp * cfg.tp
    for blk in layers:
        for kind, nb, g in blk.grad_sync:
            t += cluster.collective_time(kind, nb, [r + off for r in g])
    return max(0.0, t - last_b) if cfg.overlap_dp_sync else t


def optimizer_time(cfg: Any, rf: Roofline, params: int) -> float:
    """Seconds of the memory-bound update of the rank's (ZeRO-sharded) parameters: read and
    write parameter and optimizer state, read the gradient, one kernel launch; with m > 1
    micro-batches and ``cfg.accumulate_grads`` also the mean over micro-batches, one
    in-place scaling of every accumulated gradient by 1/m (read + write; Paddle's gradient
    merge with ``avg``)."""
    shard = -(-params // cfg.dp) if cfg.zero >= 1 else params
    nbytes = shard * (2 * (cfg.param_bytes + cfg.optimizer_bytes) + cfg.grad_bytes)
    scale = 0.0
    if cfg.num_microbatches > 1 and cfg.accumulate_grads:
        scale = stream_time(rf, 2 * params * cfg.grad_bytes)
    return rf.memory_time(nbytes) + rf.kernel_overhead + scale

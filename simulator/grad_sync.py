"""Per-step work after the last backward of a pipeline rank: the gradient synchronisation
over its data-parallel group and the optimizer update.

Gradient sync (once per step): all_reduce of the rank's gradients over its dp group as one
fused bucket (ZeRO 0/1), or reduce_scatter of the gradients + all_gather of the updated
parameters (ZeRO 2/3; Rajbhandari et al. 2020, sec. 5; under HSDP within the shard group,
then the gradient shard all_reduced across the replicas: :mod:`simulator.dp_groups`), plus
the per-step collectives the
program puts on weight gradients (``BlockCost.grad_sync``, e.g. the tensor-parallel
all_reduce of sequence-parallel norm weights). With ``overlap_dp_sync`` it hides behind the
rank's last backward as far as that lasts. The optimizer is memory-bound: read and write
parameters and optimizer states, read the gradients.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from completion.optimizer import OPTIMIZERS
from simulator.dp_groups import (
    accumulates_unsharded,
    dp_group,
    gather_time,
    host_synced,
    reduce_time,
    shard_group,
)
from simulator.expert_parallel import sharded_elements
from simulator.roofline import Roofline
from simulator.stage_cost import BlockCost
from simulator.stage_timing import reduce_bytes, stream_time

__all__ = ["accumulates_unsharded", "dp_group", "fixed_time", "fsdp_style", "grad_buckets",
           "held_reduce_time", "optimizer_time", "param_gather_time", "sync_time",
           "tail_collectives"]


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
        t = reduce_time(cluster, cfg, stage, grads)
        t += gather_time(cluster, cfg, stage, params * cfg.param_bytes)
    else:
        t = cluster.collective_time("all_reduce", grads, group)
    off = stage * cfg.dp * cfg.tp
    for blk in layers:
        for kind, nb, g in blk.grad_sync:
            t += cluster.collective_time(kind, nb, [r + off for r in g])
    return max(0.0, t - last_b) if cfg.overlap_dp_sync else t


def fsdp_style(cfg: Any) -> bool:
    """ZeRO-3 run the FSDP way: the profile prefetches per-block gathers and reduce_scatters
    each block's gradients in its backward (``simulator.stage_timing``), so no end-of-step
    gradient or parameter collective remains."""
    prof = cfg.profile
    return cfg.zero >= 3 and prof is not None and prof.overlap.fsdp_prefetch.value >= 1


def held_reduce_time(cfg: Any, cluster: Any, stage: int, params: int) -> float:
    """Seconds of the one reduce of pipeline rank ``stage``'s ``params`` accumulated
    unsharded gradient elements after its last backward, in the profile's reduce dtype
    (:func:`simulator.stage_timing.reduce_bytes`): a reduce_scatter within the shard group
    (under HSDP then an all_reduce of the shard, :func:`simulator.dp_groups.reduce_time`).
    Nothing overlaps it: the stage has no compute left (torch's ``perform_reduce_grad``
    waits for it before the step ends). 0 unless :func:`accumulates_unsharded`.

    E.g. 1e9 fp32 gradient elements over 8 ranks of one NVLink node at 360 GB/s busbw:
    4e9 x 7/8 / 360e9 = 9.7 ms."""
    if not accumulates_unsharded(cfg):
        return 0.0
    return reduce_time(cluster, cfg, stage, params * reduce_bytes(cfg))


def grad_buckets(cfg: Any, cluster: Any, stage: int, chunk_params: dict[int, int]
                 ) -> dict[int, list[tuple[float, float]]]:
    """Chunk -> [(fraction of the chunk's last backward at which the bucket is ready,
    seconds of its collective)] of pipeline rank ``stage`` (``simulator.dp_stream``).

    Buckets hold ``gradients.bucket_params`` parameters of one chunk (the profile's; a
    chunk's parameters fill buckets last layer first, as Megatron-Core and DDP order them),
    reduced over the dp group in the profile's reduce dtype: an all_reduce without ZeRO, a
    reduce_scatter with ZeRO 1-2 (the distributed optimizer) or non-FSDP ZeRO-3 (under HSDP
    within the shard group, then an all_reduce of the shard across the replicas:
    :func:`simulator.dp_groups.reduce_time`). Empty for dp = 1, for FSDP-style ZeRO-3
    (:func:`fsdp_style`) and when the stage reduces once after its last backward
    (:func:`accumulates_unsharded`: :func:`held_reduce_time`), and when a host
    synchronised before each ZeRO-3 gather puts the reduces in the backward
    (:func:`simulator.dp_groups.host_synced`)."""
    if cfg.dp == 1 or fsdp_style(cfg) or accumulates_unsharded(cfg) or host_synced(cfg):
        return {}
    kind = "reduce_scatter" if cfg.zero >= 1 else "all_reduce"
    per = int(cfg.profile.gradients.bucket_params.value) if cfg.profile is not None else 0
    group = dp_group(cfg, stage)
    nbytes = reduce_bytes(cfg)
    out: dict[int, list[tuple[float, float]]] = {}
    seconds: dict[int, float] = {}  # equal buckets cost the same: one collective_time each
    for chunk, n in sorted(chunk_params.items()):
        if n <= 0:
            continue
        size = per if 0 < per < n else n
        items, done = [], 0
        while done < n:
            k = min(size, n - done)
            done += k
            if k not in seconds:
                seconds[k] = (reduce_time(cluster, cfg, stage, k * nbytes) if kind == "reduce_scatter"
                              else cluster.collective_time(kind, k * nbytes, group))
            items.append((done / n, seconds[k]))
        out[chunk] = items
    return out


def tail_collectives(cfg: Any, cluster: Any, stage: int, layers: Iterable[BlockCost]) -> float:
    """Seconds of the per-step collectives the program itself puts on weight gradients of
    the rank's layers (``BlockCost.grad_sync``, e.g. the tensor-parallel all_reduce of
    sequence-parallel norm weights), on groups shifted to the stage's ranks, run after the
    backward."""
    off = stage * cfg.dp * cfg.tp
    return sum(cluster.collective_time(kind, nb, [r + off for r in g])
               for blk in layers for kind, nb, g in blk.grad_sync)


def param_gather_time(cfg: Any, cluster: Any, stage: int, params: int, first_forward: float) -> float:
    """Exposed seconds of the all_gather of the updated parameters over the dp group after
    the optimizer (ZeRO 1-2 with a distributed optimizer, non-FSDP ZeRO-3). With the
    profile's ``overlap.dp_param_gather`` it overlaps the next step's first forward
    (Megatron-Core ``--overlap-param-gather``): only what that forward cannot hide is
    exposed, and at least the first bucket. 0 without ZeRO, with dp = 1 or FSDP-style.
    Under HSDP the gather runs within the shard group (:mod:`simulator.dp_groups`). 0 under
    ZeRO-3 too: its parameters stay sharded after the step and each block gathers its own
    before its next forward (Rajbhandari et al. 2020, sec. 5.3), which the stage times
    charge (``simulator.stage_timing``)."""
    if cfg.zero < 1 or cfg.zero >= 3 or cfg.dp == 1 or fsdp_style(cfg):
        return 0.0
    total = gather_time(cluster, cfg, stage, params * cfg.param_bytes)
    prof = cfg.profile
    if prof is None or not prof.overlap.dp_param_gather.value:
        return total
    per = int(prof.gradients.bucket_params.value)
    first = gather_time(cluster, cfg, stage, min(per, params) * cfg.param_bytes)
    return max(first, total - first_forward)


def main_grad_bytes(cfg: Any) -> int:
    """Bytes of a gradient the optimizer reads: 4 for fp32 main grads (the profile's
    ``gradients.main_grad``), else the gradient bytes."""
    prof = cfg.profile
    if prof is not None and prof.gradients.main_grad.value == "float32":
        return 4
    return cfg.grad_bytes


def optimizer_grad_bytes(cfg: Any) -> int:
    """Bytes of a gradient the optimizer step works on: 4 when it keeps fp32 master
    weights (the profile's ``optimizer.master_weights``: a 16-bit gradient is first copied
    into an fp32 main gradient, :func:`grad_copy_bytes`), else :func:`main_grad_bytes`."""
    prof = cfg.profile
    if prof is not None and prof.optimizer.master_weights.value:
        return 4
    return main_grad_bytes(cfg)


def grad_copy_bytes(cfg: Any) -> int:
    """Bytes per parameter of copying 16-bit model gradients into fp32 main gradients
    before the step (read + write; Megatron-LM 6985e58 ``megatron/optimizer/optimizer.py``
    ``Float16OptimizerWithFloat16Params._copy_model_grads_to_main_grads``): when the
    optimizer keeps fp32 master weights but gradients accumulate in 16 bits; else 0."""
    if optimizer_grad_bytes(cfg) == 4 and main_grad_bytes(cfg) != 4:
        return main_grad_bytes(cfg) + 4
    return 0


def optimizer_time(cfg: Any, rf: Roofline, params: int, tensors: int = 1, *, expert: int = 0) -> float:
    """Seconds of the memory-bound update of the rank's (ZeRO-sharded) parameters: read and
    write the parameter and optimizer states (fp32 master weights and Adam moments:
    ``cfg.optimizer_bytes``), read the gradient (:func:`main_grad_bytes`), first copied to
    fp32 where the gradients are 16-bit and the weights' master copy fp32
    (:func:`grad_copy_bytes`); one kernel
    launch for a fused multi-tensor optimizer (the profile's ``optimizer.fused``), one per
    parameter tensor otherwise (``tensors``); with m > 1 micro-batches and
    ``cfg.accumulate_grads`` also the mean over micro-batches, one in-place scaling of
    every accumulated gradient by 1/m (read + write; Paddle's gradient merge with ``avg``).
    The update moves its bytes at the efficiency of the optimizer's update op where the
    device lists one (``by_op["sgd_:O"]`` etc., ``completion.optimizer.OPTIMIZERS``:
    ``meshplan calibrate`` measures it on that op), else the memory-bound kernels'. The ZeRO
    shard is params / dp, under HSDP params / N (:func:`simulator.dp_groups.shard_degree`);
    of those, ``expert`` expert-parallel elements are sharded over dp / ep
    (:func:`simulator.expert_parallel.sharded_elements`)."""
    shard = sharded_elements(cfg, params, expert)
    nbytes = shard * (2 * (cfg.param_bytes + cfg.optimizer_bytes) + main_grad_bytes(cfg)
                      + grad_copy_bytes(cfg))
    fused = cfg.profile is None or cfg.profile.optimizer.fused.value
    scale = 0.0
    if cfg.num_microbatches > 1 and cfg.accumulate_grads:
        scale = stream_time(rf, 2 * params * cfg.grad_bytes)
    op = OPTIMIZERS.get(str(getattr(cfg, "optimizer", "") or ""), "")
    return (rf.memory_time(nbytes, op, "O" if op else "") + rf.kernel_overhead * (1 if fused else max(1, tensors))
            + scale)


def fixed_time(cfg: Any, cluster: Any, rf: Roofline, stage: int, params: int,
               tied_elems: int = 0, *, expert: int = 0) -> float:
    """Per-iteration work outside the layers under the profile's ``fixed`` section:

    - gradient norm and clip: one read of the rank's (sharded) gradients as the optimizer
      holds them (:func:`optimizer_grad_bytes`: fp32 with master weights) and an all_reduce
      of the squared norm (one fp32) over the dp group (under HSDP over the shard group:
      the replicas hold the same shards, so the sum of squares is the shard group's);
    - loss-scale check (fp16 only): unscale and an inf/nan test, a read and a write of
      every gradient;
    - embedding gradient sync (pp > 1, tied input/output embeddings of ``tied_elems``
      local elements on the first and last stage): an all_reduce of that gradient between
      the two stages' ranks (Megatron ``finalize_model_grads``).

    0 without a profile. ``expert``: of ``params``, the expert-parallel elements, sharded
    over dp / ep under ZeRO (:func:`simulator.expert_parallel.sharded_elements`)."""
    prof = cfg.profile
    if prof is None:
        return 0.0
    grads = sharded_elements(cfg, params, expert) * optimizer_grad_bytes(cfg)
    t = 0.0
    if prof.fixed.grad_norm_clip.value:
        t += stream_time(rf, grads) + rf.kernel_overhead
        if cfg.dp > 1:
            t += cluster.collective_time("all_reduce", 4, shard_group(cfg, stage))
    if prof.fixed.loss_scale_check.value and cfg.dtype == "float16":
        t += stream_time(rf, 2 * grads) + rf.kernel_overhead
    if prof.fixed.embedding_grad_sync.value and cfg.pp > 1 and tied_elems and stage in (0, cfg.pp - 1):
        pair = [0, (cfg.pp - 1) * cfg.dp * cfg.tp]
        t += cluster.collective_time("all_reduce", tied_elems * reduce_bytes(cfg), pair)
    return t

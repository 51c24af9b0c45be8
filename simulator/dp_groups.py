"""The data-parallel groups of a pipeline rank, with HSDP's split of dp into shard and
replicate groups.

Without HSDP one group holds the dp ranks of a stage. HSDP (``StepConfig.fsdp_shard_size``
= N, ZeRO-3 only) splits them as torch FSDP2 does with a 2-D mesh ``(replicate, shard)``
(torchtitan b5bcd76 ``docs/fsdp.md``: "replication on the 0th mesh dim and sharding on the
1st"; ``torchtitan/distributed/parallel_dims.py`` orders the mesh ``pp, dp_replicate,
dp_shard, cp, tp``): the shard group is N consecutive dp ranks (``d = r * N + s``), so with
tensor parallelism innermost a shard group of N * tp <= devices per node stays inside a
node; the replicate group is the ranks with the same shard index ``s``, one in each of the
``R = dp / N`` shard groups, and crosses nodes once a shard group (N * tp ranks) fills a
node.

Per step each block's weights are all_gathered within the shard group and its gradients
reduce_scattered within it, then the 1/N gradient shard is all_reduced across the replicate
group (PyTorch ``torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py``
``foreach_reduce``: a reduce_scatter over the shard process group, then an all_reduce of its
output over the replicate group; reference/fidelity_notes.md "FSDP": "HSDP shards within a
group (usually a node) and all_reduces across groups"). Model states are divided by N, not
by dp (:func:`shard_degree`). Under a profile that reduces per block (FSDP2) this happens in
every micro-batch's backward: torchtitan (b5bcd76) never turns the replicate all_reduce off
between micro-batches (no ``set_requires_all_reduce`` under ``torchtitan/``), while
Megatron-FSDP all_reduces the outer dp "during the last backward pass before the
optimization step" (Megatron-LM d98e8a64 ``docs/user-guide/features/megatron_fsdp.md``),
as the end-of-step buckets of ``simulator.grad_sync.grad_buckets`` do. Under pipeline
parallelism torch's pipelining turns FSDP's sync off for every micro-batch and reduces once
after the stage's last backward (:func:`accumulates_unsharded`).

Rank layout: rank = stage * dp * tp + d * tp + t (``simulator.step``); the groups returned
hold tensor rank 0 of shard group 0 (stages and groups are the same layout shifted; catalog
topologies are uniform).
"""

from __future__ import annotations

from typing import Any


def shard_degree(cfg: Any) -> int:
    """Ranks the ZeRO-sharded states are split over: ``fsdp_shard_size`` (N) under HSDP,
    else dp."""
    return getattr(cfg, "fsdp_shard_size", None) or cfg.dp


def replicate_degree(cfg: Any) -> int:
    """R = dp / N: the replicas of a shard group (1 without HSDP)."""
    return cfg.dp // shard_degree(cfg)


def dp_group(cfg: Any, stage: int) -> list[int]:
    """Ranks of pipeline stage ``stage``'s whole data-parallel group holding tensor rank 0."""
    base = stage * cfg.dp * cfg.tp
    return [base + d * cfg.tp for d in range(cfg.dp)]


def shard_group(cfg: Any, stage: int) -> list[int]:
    """Ranks of the first shard group of stage ``stage`` (tensor rank 0): dp ranks 0..N-1;
    the whole dp group without HSDP."""
    base = stage * cfg.dp * cfg.tp
    return [base + d * cfg.tp for d in range(shard_degree(cfg))]


def replicate_group(cfg: Any, stage: int) -> list[int]:
    """Ranks holding the same shard as dp rank 0 of stage ``stage``: dp ranks 0, N, 2N, ...
    (one per shard group; a single rank without HSDP)."""
    base, n = stage * cfg.dp * cfg.tp, shard_degree(cfg)
    return [base + r * n * cfg.tp for r in range(replicate_degree(cfg))]


def accumulates_unsharded(cfg: Any) -> bool:
    """Whether the stage's FSDP-sharded gradients (ZeRO 2-3, shard degree > 1) accumulate
    unsharded over the micro-batches and are reduced once after its last backward: pp > 1
    under a profile with ``pipeline.fsdp_accumulate_unsharded`` (torch 2.13.0
    ``torch/distributed/pipelining/stage.py``: ``backward_maybe_with_nosync`` turns off an
    FSDP stage's gradient sync and its resharding after backward for every micro-batch, and
    ``perform_reduce_grad`` reduce_scatters once, after the stage's last backward). The
    weights then stay gathered from the first backward on and the unsharded gradients are
    held in the reduce dtype (``simulator.model_states.fsdp_states``)."""
    return pipeline_holds_unsharded(cfg.profile, cfg.pp, cfg.zero, shard_degree(cfg))


def pipeline_holds_unsharded(profile: Any, pp: int, zero: int, shard: int) -> bool:
    """:func:`accumulates_unsharded` of a plan given by parts: framework ``profile`` (None:
    no), ``pp`` stages, ZeRO stage ``zero`` and ``shard`` ranks the states are split over."""
    fact = None if profile is None else profile.pipeline.fsdp_accumulate_unsharded
    return fact is not None and fact.value and pp > 1 and zero >= 2 and shard > 1


def gather_time(cluster: Any, cfg: Any, stage: int, nbytes: float) -> float:
    """Seconds of the all_gather of ``nbytes`` of (whole) weights within the shard group."""
    return cluster.collective_time("all_gather", nbytes, shard_group(cfg, stage))


def reduce_time(cluster: Any, cfg: Any, stage: int, nbytes: float) -> float:
    """Seconds of synchronising ``nbytes`` of (whole) gradients under ZeRO-3 / FSDP: a
    reduce_scatter within the shard group, then under HSDP an all_reduce of the
    ``nbytes / N`` shard across the replicate group (module docstring)."""
    t = cluster.collective_time("reduce_scatter", nbytes, shard_group(cfg, stage))
    if replicate_degree(cfg) > 1:
        t += cluster.collective_time("all_reduce", nbytes / shard_degree(cfg),
                                     replicate_group(cfg, stage))
    return t


def fsdp_unit(cfg: Any) -> str:
    """What one ZeRO-3 gather / reduce moves under the plan's profile: ``block`` (absent
    fact, no profile) or ``tensor`` (``overlap.fsdp_unit``)."""
    fact = None if cfg.profile is None else cfg.profile.overlap.fsdp_unit
    return "block" if fact is None else fact.value


def host_synced(cfg: Any) -> bool:
    """Whether ZeRO-3 (stage 3, dp > 1) runs with the profile's ``overlap.fsdp_host_sync``:
    the host synchronises the device before every gather (DeepSpeed 8b8ed2a7d
    ``partition_parameters.py`` ``_allgather_param``: ``torch.cuda.synchronize()``), so its
    gathers and the gradient reduce_scatters queued before them run alone."""
    fact = None if cfg.profile is None else cfg.profile.overlap.fsdp_host_sync
    return cfg.zero >= 3 and cfg.dp > 1 and fact is not None and fact.value


def unit_sizes(cfg: Any, tensors: list[tuple[int, float]], gather: bool = False) -> list[float]:
    """The bytes each ZeRO-3 collective of a block moves, for its parameter ``tensors``
    given as (elements, bytes): each tensor alone under :func:`fsdp_unit` ``tensor``, else
    their sum in one call. A gather (``gather``) skips the tensors below the profile's
    ``overlap.fsdp_persist_below`` elements: they stay gathered between steps (DeepSpeed
    8b8ed2a7d ``stage3.py`` ``persistent_parameters``: ``ds_numel <
    param_persistence_threshold``, 1e5 by default in ``constants.py``)."""
    prof = cfg.profile
    fact = None if prof is None else prof.overlap.fsdp_persist_below
    if gather and fact is not None:
        tensors = [(n, b) for n, b in tensors if n >= fact.value]
    sizes = [b for _, b in tensors]
    if fsdp_unit(cfg) == "tensor":
        return sizes
    return [sum(sizes)] if sizes else []

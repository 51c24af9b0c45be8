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
as the end-of-step buckets of ``simulator.grad_sync.grad_buckets`` do.

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

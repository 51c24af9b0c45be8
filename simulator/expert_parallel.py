"""Expert data parallelism: where the gradients and optimizer states of a mixture-of-experts
model's routed experts are reduced and sharded, apart from the dense parameters.

With ``ep`` expert-parallel ranks (``completion.strategy.Strategy.ep``) and ``etp`` expert
tensor-parallel ones (``Strategy.etp``, default tp) the expert layers fold onto a stage's
dp x tp ranks (dp holding cp, folded) in Megatron-Core's expert order ``tp-ep-dp``: rank
``(ed * ep + e) * etp + e_t``; an ep group holds each expert once and the ``E = edp = dp *
tp / (ep * etp)`` ranks with the same (e, e_t) hold the same experts and form the
expert-data-parallel group (:mod:`completion.expert_layout`). With etp = tp that is: an ep
group is ``ep`` consecutive data-parallel ranks and E = dp / ep. Megatron-LM d98e8a64:

- ``megatron/core/parallel_state.py`` ``initialize_model_parallel``:
  ``expert_data_parallel_size = world_size // (expert_tensor_parallel_size *
  expert_model_parallel_size * pipeline_model_parallel_size)`` and the expert
  ``RankGenerator(tp=etp, ep=ep, dp=expert_data_parallel_size, cp=1, ...)`` in the dense
  order (``tp-cp-ep-dp-pp``): etp innermost, then ep, then the expert dp, over the same
  ranks as the dense layers' ``tp-cp-dp``;
- ``megatron/core/distributed/distributed_data_parallel.py``: the buffers of expert
  parameters (``is_expert_parallel``) are reduced over ``intra_expt_dp_group``, the others
  over ``intra_dp_cp_group`` (with ``expert_gradient_scaling_factor = expt_dp_group.size()
  / dp_cp_group.size()``, so both end averaged over dp);
- ``megatron/core/optimizer/__init__.py`` ``get_megatron_optimizer``: the expert
  parameter groups get their own (distributed) optimizer with ``data_parallel_group =
  intra_expt_dp_group``: with ``use_distributed_optimizer`` (ZeRO-1 here) expert optimizer
  states are sharded over E ranks, dense ones over dp.

So per rank, with P_d dense and P_e expert local elements (``BlockCost.dp_split``): the
gradient sync reduces P_d over dp and P_e over E (nothing when E = 1, ep = dp); ZeRO-1
keeps ``12 * (P_d / dp + P_e / E)`` optimizer bytes (:func:`sharded_elements`) and
all-gathers the updated P_d over dp and P_e over E. Rank layout ``stage * dp * tp + d * tp
+ t`` (``simulator.step``).
"""

from __future__ import annotations

from typing import Any

from simulator.dp_groups import shard_degree
from simulator.errors import SimulatorError


def _ceil(n: int, d: int) -> int:
    return -(-n // d)


def _degrees(cfg: Any) -> tuple[int, int]:
    """(ep, etp) of a step config (etp None: tp)."""
    ep, tp = int(getattr(cfg, "ep", 1) or 1), int(getattr(cfg, "tp", 1) or 1)
    etp = getattr(cfg, "etp", None)
    return ep, int(tp if etp is None else etp)


def expert_dp_degree(cfg: Any) -> int:
    """edp = dp * tp / (ep * etp): the ranks holding the same experts (``dp`` holds cp,
    folded; ``completion.expert_layout``): dp / ep with etp = tp (1 without expert
    parallelism: then every rank has its own copy, and edp = dp). Raises SimulatorError when
    the expert layers do not fold onto the stage."""
    ep, etp = _degrees(cfg)
    n = cfg.dp * int(getattr(cfg, "tp", 1) or 1)
    if ep < 1 or n % (ep * etp):
        raise SimulatorError(f"ep = {ep} x etp = {etp} must divide dp x tp = {n}")
    return n // (ep * etp)


def ep_group(cfg: Any, stage: int) -> list[int]:
    """Ranks of pipeline stage ``stage``'s first ep group (expert tensor rank 0): ranks
    ``e * etp`` for e < ep (dp ranks 0 .. ep - 1 at tensor rank 0 when etp = tp)."""
    base, (ep, etp) = stage * cfg.dp * int(getattr(cfg, "tp", 1) or 1), _degrees(cfg)
    return [base + e * etp for e in range(ep)]


def expert_dp_group(cfg: Any, stage: int) -> list[int]:
    """Ranks of the expert-data-parallel group of expert rank 0 of ``stage`` (expert tensor
    rank 0, ep rank 0): ranks ``g * ep * etp`` (dp ranks 0, ep, 2 ep, ... at tensor rank 0
    when etp = tp; module docstring)."""
    base, (ep, etp) = stage * cfg.dp * int(getattr(cfg, "tp", 1) or 1), _degrees(cfg)
    return [base + g * ep * etp for g in range(expert_dp_degree(cfg))]


def sharded_elements(cfg: Any, params: int, expert: int = 0) -> int:
    """Parameter elements of a rank's ZeRO shard (what its optimizer updates): all
    ``params`` without ZeRO; with ZeRO >= 1 the dense ``params - expert`` over the shard
    degree (dp, or the HSDP shard group) plus the ``expert`` ones over E (ceil shares)."""
    if cfg.zero < 1:
        return params
    dense = params - expert
    return _ceil(dense, shard_degree(cfg)) + (_ceil(expert, expert_dp_degree(cfg)) if expert else 0)


def expert_sync_time(cfg: Any, cluster: Any, stage: int, expert: int, grad_bytes: float) -> float:
    """Seconds of reducing the rank's ``expert`` gradient elements over its
    expert-data-parallel group (``grad_bytes`` each): an all_reduce without ZeRO, a
    reduce_scatter under the distributed optimizer (ZeRO-1), then the all_gather of the
    updated expert weights (``cfg.param_bytes``); 0 when E = 1 or there are none."""
    if expert <= 0 or expert_dp_degree(cfg) == 1:
        return 0.0
    group = expert_dp_group(cfg, stage)
    if cfg.zero < 1:
        return cluster.collective_time("all_reduce", expert * grad_bytes, group)
    return (cluster.collective_time("reduce_scatter", expert * grad_bytes, group)
            + cluster.collective_time("all_gather", expert * cfg.param_bytes, group))

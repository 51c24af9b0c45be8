"""DeepSpeed: a JSON config (the ``config`` of ``deepspeed.initialize``) as a Strategy
(:mod:`.config`, :func:`strategy_from_config`), and a plan as a config (:mod:`.export`,
``meshplan.frameworks.export_plan(plan, "deepspeed")``)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any


def strategy_from_config(config: str | Path | Mapping[str, Any], world: int, *, tp: int | None = None,
                         pp: int = 1, recompute: str | None = None, sequence_parallel: bool = False,
                         framework: str = "deepspeed", **fields: Any) -> tuple[Any, list[str]]:
    """The Strategy a DeepSpeed JSON config trains with on ``world`` GPUs, as ``meshplan cost
    --deepspeed-config`` reads it (:mod:`.config`'s docstring: dp = world / (tp x pp), the
    batch keys, ZeRO stage, MiCS shard group, dtype, optimizer, AutoTP), and its notes.

    Args:
        config: a JSON file's path, or the config as a mapping.
        world: GPUs of the run.
        tp: tensor parallelism of the training script (None: AutoTP's
            ``tensor_parallel.autotp_size``, else 1).
        pp: pipeline stages of the script's ``PipelineModule`` (no config key).
        recompute: the script's recompute (None: none, with a note when
            ``activation_checkpointing`` is present).
        sequence_parallel: the script's Megatron sequence parallelism.
        framework: the framework profile costed.
        fields: further Strategy fields the script sets (``schedule``, ``vpp``, ``ep``,
            ``attention``, ...); not the ones the config states.

    Returns:
        ``(strategy, notes)``: a ``meshplan.Strategy`` and one string per key read with a
        caveat (unknown keys, AutoTP's batch counting, BF16_Optimizer's stage, ...).

    Raises:
        DeepSpeedConfigError (a MeshplanError): a value meshplan cannot read or model,
            ``.field`` the dotted key (``zero_optimization.stage``).
        MeshplanError: a field in ``fields`` that the config states.
        StrategyError: the Strategy's own refusals.
    """
    import warnings

    from meshplan.errors import MeshplanError
    from meshplan.frameworks.deepspeed.config import deepspeed_knobs
    from meshplan.strategy import Strategy

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        knobs = deepspeed_knobs(config, world, tp, pp, recompute, sequence_parallel)
    stated = sorted(set(fields) & set(knobs))
    if stated:
        raise MeshplanError(f"the DeepSpeed config states {', '.join(stated)}", field=stated[0])
    strategy = Strategy(**knobs, **fields, sequence_parallel=sequence_parallel, framework=framework)
    return strategy, [str(w.message) for w in caught]


__all__ = ["strategy_from_config"]

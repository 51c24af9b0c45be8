"""torchtitan: a job TOML as a Strategy (:mod:`.config`, :func:`strategy_from_toml`), and a
plan as a job TOML (:mod:`.export`, ``meshplan.frameworks.export_plan(plan, "torchtitan")``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any


def strategy_from_toml(path: str | Path, world: int,
                       num_layers: int | Callable[[], int] | None = None) -> tuple[Any, int, list[str]]:
    """The Strategy a torchtitan job TOML trains with on ``world`` GPUs, as ``meshplan cost
    --torchtitan-config`` reads it (:mod:`.config`'s docstring: ``[parallelism]``,
    ``[training]``, ``[activation_checkpoint]``, ``[compile]``, float8), with the tokens per
    sequence it trains at and its notes.

    Args:
        path: the job TOML.
        world: GPUs of the run (``data_parallel_shard_degree = -1`` takes the rest).
        num_layers: the model's decoder layers (or a callable giving them), needed only for
            a pipeline without ``module_fqns_per_model_part``.

    Returns:
        ``(strategy, seq_len, notes)``: a ``meshplan.Strategy``, ``[training] seq_len``
        (tokens), and one string per key not read (unknown keys and sections).

    Raises:
        TorchtitanConfigError (a MeshplanError): a value meshplan cannot read or model,
            ``.field`` the section and key (``parallelism.pipeline_parallel_schedule``);
            naming the file for the Strategy's own refusals.
        MeshplanError: ``num_layers`` missing where the pipeline split needs it.
    """
    import warnings

    from meshplan.errors import MeshplanError
    from meshplan.frameworks.torchtitan.config import TorchtitanConfigError, torchtitan_knobs
    from meshplan.strategy import Strategy, StrategyError

    def layers() -> int:
        if num_layers is None:
            raise MeshplanError(f"{path}: the pipeline split needs the model's decoder layers: give "
                                "num_layers", field="parallelism.pipeline_parallel_degree")
        return int(num_layers() if callable(num_layers) else num_layers)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        knobs = torchtitan_knobs(path, world, layers)
    seq_len = int(knobs.pop("seq_len"))
    try:
        strategy = Strategy(**knobs)
    except StrategyError as e:  # as cost --torchtitan-config says it
        raise TorchtitanConfigError(f"{path}: {e}", field=getattr(e, "field", None)) from None
    return strategy, seq_len, [str(w.message) for w in caught]


__all__ = ["strategy_from_toml"]

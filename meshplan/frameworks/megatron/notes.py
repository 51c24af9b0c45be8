"""What a Megatron-LM run of a costed plan would do differently, said as a note."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def even_split_note(strategy: Any, costed_split: Callable[[], tuple[int, ...]]) -> str | None:
    """The note for a pipelined plan given in Megatron-LM arguments whose split the cost model
    balanced (``costed_split()``: the layers per virtual stage it costed, asked only for a
    pipelined plan without a split of its own): Megatron-LM splits the
    layers evenly unless told (d98e8a64 ``--decoder-first-pipeline-num-layers`` help:
    "Default None is even split"), so the figures are of another run than the arguments'.
    None when the plan has one stage, states its split, or the balanced split is the even one
    (or the layers do not divide evenly)."""
    from simulator.layer_split import even_split

    if strategy.pp * strategy.vpp == 1 or strategy.layers_per_stage:
        return None
    costed = tuple(costed_split())
    if not costed:
        return None
    layers, stages = sum(costed), strategy.pp * strategy.vpp
    if layers % stages or even_split(layers, stages) == costed:
        return None
    return (f"with Megatron-LM arguments: the cost model balanced the pipeline stages as "
            f"{list(costed)}, while Megatron-LM splits the layers evenly, "
            f"{list(even_split(layers, stages))}; --layers-per-stage even costs that split")

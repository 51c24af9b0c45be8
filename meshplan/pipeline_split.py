"""A pipeline split as a user writes it (``--layers-per-stage``, ``Strategy.layers_per_stage``):
``balanced`` (the cost model balances the stages, ``simulator.layer_split``), ``even``
(``num_layers / (pp * vpp)`` decoder layers on every virtual stage: Megatron-LM d98e8a64
``--decoder-first-pipeline-num-layers`` help, "Default None is even split"; torchtitan's
default split points) or the layers of each virtual stage as comma-separated integers.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from completion.choices import SPLITS as SPLIT_WORDS
from meshplan.errors import MeshplanError


def split_word(text: str | None) -> str | None:
    """The :data:`SPLIT_WORDS` word ``text`` names (any case, spaces around it), else None
    (not given, or a list)."""
    word = (text or "").strip().lower()
    return word if word in SPLIT_WORDS else None


def with_split(strategy: Any, text: str | None, num_layers: Callable[[], int],
               flag: str = "--layers-per-stage", pp_flag: str = "--pp",
               vpp_flag: str = "--vpp") -> Any:
    """``strategy`` (a ``meshplan.Strategy``) with the split ``text`` asks for: None or
    ``balanced`` leave it unset; ``even`` puts ``num_layers() / (pp * vpp)`` layers on every
    virtual stage (``num_layers``, a callable giving the model's decoder layers, is called
    only for ``even``); a comma list is used as given. ``flag``, ``pp_flag`` and
    ``vpp_flag`` name the inputs in messages (the CLI passes the spellings typed).

    Raises MeshplanError (field ``layers_per_stage``) for text it cannot read or an even
    split of layers that do not divide, StrategyError for a list of the wrong length; a
    list that does not sum to the model's layers is refused by the Engine
    (``completion.plan_program``)."""
    if text is None:
        return strategy
    word = split_word(text)
    stages = strategy.pp * strategy.vpp
    if word == "balanced" or (word == "even" and stages == 1):
        return strategy
    if word == "even":
        n = int(num_layers())
        if n % stages:
            raise MeshplanError(f"{flag} even: the model's {n} decoder layers do not divide over "
                                f"{pp_flag} * {vpp_flag} = {strategy.pp} * {strategy.vpp} = "
                                f"{stages} virtual stages; give the split as {stages} "
                                f"comma-separated integers, or 'balanced'", field="layers_per_stage")
        from simulator.layer_split import even_split

        split: tuple[int, ...] = even_split(n, stages)
    else:
        parts = text.split(",")
        if not all(re.fullmatch(r"\s*[0-9]+\s*", p) for p in parts):
            raise MeshplanError(f"{flag} {text!r}: give 'even', 'balanced' or the layers of each "
                                f"virtual stage as comma-separated integers (e.g. 5,3)",
                                field="layers_per_stage")
        split = tuple(int(p) for p in parts)
    return strategy.replace(layers_per_stage=split)

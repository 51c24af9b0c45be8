"""The partitioned program a plan runs: the whole model (every layer, every pipeline stage,
reshards resolved into collectives), built by the one plan pipeline
(:func:`completion.plan_program.build_plan_program`) that the cost model uses too.

A plan is read duck-typed (``model``, ``seq_len``, ``num_layers``, ``strategy``,
``annotations``), so the executor does not import ``meshplan``.
"""

from __future__ import annotations

from typing import Any

from completion.plan_program import (
    PlanProgram,
    PlanProgramError,
    build_plan_program,
    program_batch,
    resolve_plan,
    single_process_strategy,
)

__all__ = ["PlanProgram", "PlanProgramError", "build_program", "program_batch"]


def build_program(plan: Any, single_process: bool = False,
                  adam_epsilon: float | None = None) -> PlanProgram:
    """The partitioned program of ``plan`` (every layer; reshards resolved).

    ``single_process``: the reference run ``verify`` compares with -- the same model
    unpartitioned on one rank (:func:`completion.plan_program.single_process_strategy`).
    ``adam_epsilon``: Adam's epsilon for verification runs. Raises PlanProgramError (a
    ValueError) for an illegal plan, ModelSourceError for a missing model file, and
    completion's errors for a layout that does not fit.
    """
    source, strategy = resolve_plan(plan)
    if single_process:
        strategy = single_process_strategy(strategy, source)
    return build_plan_program(source, strategy, adam_epsilon=adam_epsilon)

"""Reshard planning: layouts with nested sharding, single-mesh-dim steps, the planner.

``plan_reshard(src, dst, global_shape, dtype)`` returns a :class:`ReshardPlan` whose steps
(all_reduce, reduce_scatter, all_gather, all_to_all, send_recv, slice, zero_fill, scale)
take a value from one layout to another. See ``planner`` and ``steps`` for the rules.
"""

from completion.reshard.layout import Layout, padded_local_shape
from completion.reshard.planner import (
    LOCAL_WEIGHT,
    STEP_OVERHEAD_BYTES,
    ReshardError,
    StepCost,
    default_step_cost,
    plan_reshard,
)
from completion.reshard.steps import (
    COLLECTIVE_KINDS,
    LOCAL_KINDS,
    ReshardPlan,
    ReshardStep,
)

__all__ = [
    "COLLECTIVE_KINDS",
    "LOCAL_KINDS",
    "LOCAL_WEIGHT",
    "STEP_OVERHEAD_BYTES",
    "Layout",
    "ReshardError",
    "ReshardPlan",
    "ReshardStep",
    "StepCost",
    "default_step_cost",
    "padded_local_shape",
    "plan_reshard",
]

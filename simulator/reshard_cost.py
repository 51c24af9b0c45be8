"""Reshard cost: the time of the steps a reshard plan really emits, on a cluster.

Collectives cost ``Cluster.collective_time(kind, nbytes, group)`` (nccl-tests buffer-size
convention, which is what ``ReshardStep.nbytes`` holds); the groups of one step run
concurrently, so a step costs its slowest group. send_recv pairs run concurrently too and
cost ``Cluster.p2p_time`` (0 when a rank sends to itself). Local steps (slice, zero_fill,
scale) cost memory traffic only: ``nbytes / (device.memory_bandwidth *
efficiency.memory_bandwidth)``, the roofline memory term of the op cost model.

``plan_reshard_on(cluster, ...)`` runs the planner with this time as its per-step cost, so
the plan is the cheapest on that cluster and its cost obeys the triangle inequality over
any intermediate layout in the planner's graph (see ``completion.reshard.planner``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from clusters import Cluster
from completion.reshard import Layout, ReshardPlan, ReshardStep, plan_reshard


def step_time(step: ReshardStep, cluster: Cluster) -> float:
    """Seconds one reshard step takes on ``cluster`` (module doc for the model).

    Raises ValueError (clusters.CollectiveError) when a rank of the step is not in the
    cluster."""
    if not step.is_collective:
        dev = cluster.device
        return step.nbytes / (dev.memory_bandwidth.value * dev.efficiency.memory_bandwidth.value)
    if step.kind == "send_recv":
        return max((cluster.p2p_time(step.nbytes, a, b) for a, b in step.groups), default=0.0)
    return max((cluster.collective_time(step.kind, step.nbytes, g) for g in step.groups), default=0.0)


def reshard_time(plan: ReshardPlan | Iterable[ReshardStep], cluster: Cluster) -> float:
    """Seconds to run a reshard plan (or a list of its steps): the sum of
    :func:`step_time` over the steps the plan emits. 0.0 for an identity plan; finite for
    every legal transition."""
    steps = plan.steps if isinstance(plan, ReshardPlan) else tuple(plan)
    return float(sum(step_time(s, cluster) for s in steps))


class ClusterStepCost:
    """A per-step cost for the planner: :func:`step_time` on one cluster (memoised)."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self._memo: dict[tuple, float] = {}

    def __call__(self, step: ReshardStep) -> float:
        key = (step.kind, step.nbytes, step.groups)
        t = self._memo.get(key)
        if t is None:
            t = self._memo[key] = step_time(step, self.cluster)
        return t


_COSTS: dict[int, ClusterStepCost] = {}


def cluster_step_cost(cluster: Cluster) -> ClusterStepCost:
    """The (cached) planner cost of ``cluster``; the same object for the same cluster."""
    cost = _COSTS.get(id(cluster))
    if cost is None or cost.cluster is not cluster:
        cost = _COSTS[id(cluster)] = ClusterStepCost(cluster)
    return cost


def plan_reshard_on(
    cluster: Cluster,
    src: Layout,
    dst: Layout,
    global_shape: Sequence[int],
    dtype: str = "float32",
    **kw,
) -> ReshardPlan:
    """``completion.plan_reshard`` minimising the time on ``cluster``; same arguments and
    errors (ReshardError)."""
    return plan_reshard(src, dst, global_shape, dtype, cost=cluster_step_cost(cluster), **kw)

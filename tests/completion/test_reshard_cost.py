"""Reshard cost on a cluster: identity, per-step sums, case 9 (triangle inequality on a
4-d mesh) and a triangle-inequality property on random layouts."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings

from clusters import load_cluster
from completion import Partial, ProcessMesh, Replicate, Shard
from completion.reshard import Layout, plan_reshard
from simulator import plan_reshard_on, reshard_time
from tests._reshard_strategies import reshard_case

R = Replicate()
CLUSTER = load_cluster("dgx-a100-80g", num_nodes=2)  # 16 ranks, 8 per node


def test_identity_costs_zero_and_steps_sum():
    mesh = ProcessMesh.of(2, 8)
    a = Layout(mesh, (Shard(0), Shard(1)))
    assert reshard_time(plan_reshard(a, a, (64, 64)), CLUSTER) == 0.0
    # one all_reduce over mesh dim 0: groups (i, 8+i) span the two nodes; all concurrent
    plan = plan_reshard(Layout(mesh, (Partial("sum"), R)), Layout(mesh, (R, R)), (1024, 1024), "bfloat16")
    assert plan.kinds() == ["all_reduce"] and plan.steps[0].nbytes == 1024 * 1024 * 2
    want = CLUSTER.collective_time("all_reduce", 1024 * 1024 * 2, (0, 8))
    assert reshard_time(plan, CLUSTER) == pytest.approx(want, rel=1e-12)
    # a local slice costs its memory traffic over HBM bandwidth x efficiency: 2.039e12 * 0.8
    plan = plan_reshard(Layout(mesh, (R, R)), Layout(mesh, (R, Shard(1))), (1024, 1024), "bfloat16")
    assert plan.kinds() == ["slice"]
    assert reshard_time(plan, CLUSTER) == pytest.approx(2 * 1024 * 128 * 2 / (2.039e12 * 0.8), rel=1e-12)


def _case9_layouts():
    mesh = ProcessMesh.of(2, 2, 2, 2)
    src = Layout(mesh, (R, Shard(0), R, R))
    dst = Layout(mesh, (Shard(1), R, Shard(1), Shard(1)))
    mid = Layout(mesh, (Shard(1), Shard(0), Shard(1), Shard(1)))
    return src, dst, mid


@pytest.mark.parametrize("shape", [(4096, 4096), (7, 5), (1000, 3)])
@pytest.mark.parametrize("planner", ["default", "cluster"])
def test_case9_triangle_inequality_4d_mesh(shape, planner):
    src, dst, mid = _case9_layouts()

    def cost(a, b):
        if planner == "cluster":
            return reshard_time(plan_reshard_on(CLUSTER, a, b, shape, "bfloat16"), CLUSTER)
        return reshard_time(plan_reshard(a, b, shape, "bfloat16"), CLUSTER)

    direct, via = cost(src, dst), cost(src, mid) + cost(mid, dst)
    assert 0 < direct <= via * (1 + 1e-12)
    assert math.isfinite(direct)


def test_case9_plan_is_slices_then_one_all_gather():
    src, dst, _ = _case9_layouts()
    plan = plan_reshard(src, dst, (4096, 4096), "bfloat16")
    assert plan.kinds() == ["slice", "slice", "slice", "all_gather"]
    ag = plan.steps[-1]
    assert ag.mesh_dim == 1 and ag.src_dim == 0
    # gathers [4096/2, 4096/8] blocks: whole output 2 x 2048 x 512 x 2 bytes
    assert ag.nbytes == 2 * 2048 * 512 * 2


@settings(max_examples=120, deadline=None, derandomize=True)
@given(reshard_case(n_layouts=3, max_dim=64))
def test_triangle_inequality_cluster_planner(case):
    """With the planner minimising cluster time, cost(a, c) <= cost(a, b) + cost(b, c):
    the path through b is one of the candidates (completion.reshard.planner doc)."""
    shape, (a, b, c) = case

    def cost(x, y):
        return reshard_time(plan_reshard_on(CLUSTER, x, y, shape), CLUSTER)

    ac = cost(a, c)
    assert math.isfinite(ac) and ac >= 0
    assert ac <= (cost(a, b) + cost(b, c)) * (1 + 1e-9) + 1e-15


@settings(max_examples=120, deadline=None, derandomize=True)
@given(reshard_case(n_layouts=3, max_dim=64))
def test_triangle_inequality_default_planner_on_its_own_cost(case):
    shape, (a, b, c) = case
    ac = plan_reshard(a, c, shape).cost
    assert ac <= (plan_reshard(a, b, shape).cost + plan_reshard(b, c, shape).cost) * (1 + 1e-9)

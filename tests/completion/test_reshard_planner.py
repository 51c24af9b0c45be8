"""Reshard planner: single transitions with hand-computed byte counts, cases 3, 6 and 7
of shared/reference/cases.md, mesh-dim locality, cross-mesh paths and errors."""

from __future__ import annotations

import numpy as np
import pytest

from completion import Partial, ProcessMesh, Replicate, Shard, TensorDistAttr
from completion.reshard import Layout, ReshardError, plan_reshard
from completion.testing import VirtualMesh

R = Replicate()
MESH4 = ProcessMesh.of(4)


def lay(mesh, *pl):
    return Layout(mesh, pl)


def run_exact(src, dst, shape, seed=0):
    rng = np.random.default_rng(seed)
    glob = rng.integers(-9, 10, size=shape).astype(np.float64)
    plan = plan_reshard(src, dst, shape)
    out = VirtualMesh.from_global(glob, src, rng).run(plan)
    assert np.array_equal(out.to_global(), glob)
    return plan, out, glob


# 1-d mesh [4], global [8, 6] float32 (4 bytes): hand-computed nccl-tests buffer sizes
@pytest.mark.parametrize(
    "src, dst, kind, nbytes",
    [
        (Partial("sum"), R, "all_reduce", 8 * 6 * 4),  # whole local buffer
        (Partial("sum"), Shard(0), "reduce_scatter", 4 * (2 * 6) * 4),  # whole input
        (Shard(0), R, "all_gather", 4 * (2 * 6) * 4),  # whole output
        (Shard(0), Shard(1), "all_to_all", 4 * (2 * 2) * 4),  # n x [2, ceil(6/4)=2] block
        (R, Shard(1), "slice", 2 * (8 * 2) * 4),  # read + write of [8, 2]
        (R, Partial("sum"), "zero_fill", 8 * 6 * 4),
        (Partial("sum"), Partial("avg"), "scale", 2 * 8 * 6 * 4),
    ],
)
def test_single_transition_1d(src, dst, kind, nbytes):
    plan = plan_reshard(lay(MESH4, src), lay(MESH4, dst), (8, 6))
    assert plan.kinds() == [kind]
    step = plan.steps[0]
    assert step.nbytes == nbytes
    assert step.groups == ((0, 1, 2, 3),)
    assert step.mesh_dim == 0
    run_exact(lay(MESH4, src), lay(MESH4, dst), (8, 6))


def test_identity_and_relabels_emit_nothing():
    assert plan_reshard(lay(MESH4, Shard(1)), lay(MESH4, Shard(1)), (8, 6)).steps == ()
    # Replicate -> Partial(max/avg): the copies already reduce to the value
    for rt in ("max", "min", "avg"):
        plan, out, glob = run_exact(lay(MESH4, R), lay(MESH4, Partial(rt)), (3, 5))
        assert plan.steps == ()


def test_case3_sum_to_avg_is_a_real_conversion():
    """Case 3: P(sum) -> P(avg) changes every local value by the factor n."""
    rng = np.random.default_rng(3)
    glob = rng.integers(-9, 10, size=(4, 4)).astype(np.float64)
    src, dst = lay(MESH4, Partial("sum")), lay(MESH4, Partial("avg"))
    plan = plan_reshard(src, dst, (4, 4))
    assert plan.kinds() == ["scale"] and plan.steps[0].factor == 4.0
    vm = VirtualMesh.from_global(glob, src, rng)
    out = vm.run(plan)
    for r in MESH4.process_ids:
        assert np.array_equal(out.arrays[r], 4 * vm.arrays[r])
    assert np.array_equal(out.to_global(), glob)
    # relabelling alone (no scale) would be wrong: the avg of the sum-parts is glob / 4
    assert np.array_equal(VirtualMesh(dst, (4, 4), vm.arrays).to_global(), glob / 4)
    back = plan_reshard(dst, src, (4, 4))
    assert back.kinds() == ["scale"] and back.steps[0].factor == 0.25


def test_case6_uneven_all_gather():
    """Case 6: [5, 10] S(0) on mesh [4] (rows 2, 2, 1, 0) to R: one all_gather of the
    padded buffer (4 x 2 x 10 x 4 bytes), every rank ends with exactly [5, 10]."""
    src, dst = lay(MESH4, Shard(0)), lay(MESH4, R)
    rng = np.random.default_rng(6)
    glob = rng.integers(-9, 10, size=(5, 10)).astype(np.float64)
    vm = VirtualMesh.from_global(glob, src, rng)
    assert [vm.arrays[r].shape[0] for r in range(4)] == [2, 2, 1, 0]
    plan = plan_reshard(src, dst, (5, 10))
    assert plan.kinds() == ["all_gather"] and plan.steps[0].nbytes == 4 * 2 * 10 * 4
    out = vm.run(plan)
    for r in range(4):
        assert out.arrays[r].shape == (5, 10)
        assert np.array_equal(out.arrays[r], glob)


def test_case7_minimal_on_2d_mesh():
    """Case 7: (S(1), S(1)) -> (S(1), S(2)) is one all_to_all on mesh dim 1."""
    mesh = ProcessMesh.of(2, 2)
    src, dst = lay(mesh, Shard(1), Shard(1)), lay(mesh, Shard(1), Shard(2))
    plan, out, glob = run_exact(src, dst, (4, 8, 6))
    assert plan.kinds() == ["all_to_all"]
    step = plan.steps[0]
    assert step.mesh_dim == 1 and step.groups == ((0, 1), (2, 3))
    # before: [4, 8/2/2, 6] per rank; block per peer [4, 2, 3]; buffer 2 blocks, float32
    assert step.nbytes == 2 * (4 * 2 * 3) * 4
    assert (step.src_dim, step.dst_dim) == (1, 2)


def test_change_on_one_mesh_dim_uses_only_its_groups():
    mesh = ProcessMesh.of(2, 4)
    plan, _, _ = run_exact(lay(mesh, Partial("sum"), Shard(0)), lay(mesh, R, Shard(0)), (8, 3))
    assert plan.kinds() == ["all_reduce"]
    assert plan.steps[0].groups == ((0, 4), (1, 5), (2, 6), (3, 7))
    assert plan.steps[0].nbytes == 2 * 3 * 4  # the local [8/4, 3] block


def test_tensor_dist_attr_input_and_nested_order():
    mesh = ProcessMesh.of(2, 2)
    src = TensorDistAttr(mesh, [0, 1])
    dst = TensorDistAttr(mesh, [1, 0])
    plan, _, _ = run_exact(Layout.of(src), Layout.of(dst), (5, 7))
    assert plan.src == Layout(mesh, (Shard(0), Shard(1)))
    # (S0, S0) -> (R, S0): mesh dim 1 is nested inside mesh dim 0, so dim 1 must move too
    plan, _, _ = run_exact(lay(mesh, Shard(0), Shard(0)), lay(mesh, R, Shard(0)), (9, 2))
    assert len(plan) >= 2 and {s.mesh_dim for s in plan.steps} == {0, 1}


def test_cross_mesh_same_shape_sends_shards():
    a, b = ProcessMesh.of(2), ProcessMesh.of(2, start=2)
    plan, out, _ = run_exact(lay(a, Shard(0)), lay(b, R), (6, 4))
    assert plan.kinds() == ["send_recv", "all_gather"]  # send the half, gather on arrival
    assert plan.steps[0].groups == ((0, 2), (1, 3))
    assert plan.steps[0].nbytes == 3 * 4 * 4
    plan, _, _ = run_exact(lay(a, R), lay(b, Shard(1)), (6, 4))
    assert plan.kinds() == ["slice", "send_recv"]  # slice before sending: half the bytes


def test_cross_mesh_different_shape_goes_through_replicate():
    a, b = ProcessMesh.of(2), ProcessMesh.of(2, 2, start=2)
    plan, out, _ = run_exact(lay(a, Partial("sum")), lay(b, Shard(0), Shard(1)), (5, 3))
    assert plan.kinds()[:2] == ["all_reduce", "send_recv"]
    assert plan.steps[1].groups == ((0, 2), (1, 3), (0, 4), (1, 5))


def test_errors_name_value_and_both_attrs():
    mesh = ProcessMesh.of(2, 2)
    src = TensorDistAttr(mesh, [0, -1])
    with pytest.raises(ReshardError, match=r"%7.*dims_mapping=\[0, -1\].*dims_mapping=\[-1, 1, 0\]"):
        plan_reshard(src, TensorDistAttr(mesh, [-1, 1, 0]), (4, 4), value="%7")
    with pytest.raises(ReshardError, match=r"Shard\(2\) on mesh dim 1"):
        plan_reshard(lay(mesh, R, R), lay(mesh, R, Shard(2)), (4, 4), value="x")
    with pytest.raises(ReshardError, match="mix partial reduce types"):
        plan_reshard(lay(mesh, Partial("sum"), Partial("max")), lay(mesh, R, R), (4, 4))
    other = ProcessMesh.of(2, 2, start=4)
    with pytest.raises(ReshardError, match=r"%3 .*no cross-mesh path"):
        plan_reshard(src, TensorDistAttr(other, [0, -1]), (4, 4), value="%3", cross_mesh=False)
    with pytest.raises(ReshardError, match="unknown dtype"):
        plan_reshard(src, src, (4, 4), "float33")

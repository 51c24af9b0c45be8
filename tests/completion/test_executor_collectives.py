"""Executor collectives on 4 gloo ranks against the numpy reference VirtualMesh.

One spawn runs every case: random source/target layouts (Shard, Replicate, Partial of
sum/avg/max, uneven extents, 1-d and 2-d meshes, cross-mesh send/recv), planned with
``completion.plan_reshard``; each rank executes the steps with ``executor.collectives`` /
the local kernels, and the parent compares every rank's block with VirtualMesh."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from completion.dist_attr import Partial, Replicate, Shard
from completion.mesh import ProcessMesh
from completion.ops.registry import TensorType
from completion.passes.reshard import STEP_OPS
from completion.reshard import Layout, ReshardError, plan_reshard
from completion.testing import VirtualMesh
from executor.launch import launch

M4 = ProcessMesh((4,), (0, 1, 2, 3))
M22 = ProcessMesh((2, 2), (0, 1, 2, 3))
MA, MB = ProcessMesh((2,), (0, 1)), ProcessMesh((2,), (2, 3))
MESH_PAIRS = [(M4, M4), (M22, M22), (MA, MA), (MA, MB), (M22, M22), (M4, M4)]


def _placement(rng, ndim):
    k = rng.integers(0, 3)
    if k == 0:
        return Shard(int(rng.integers(0, ndim)))
    if k == 1:
        return Replicate()
    return Partial(str(rng.choice(["sum", "sum", "avg", "max"])))


def _cases(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    out = []
    while len(out) < n:
        sm, dm = MESH_PAIRS[len(out) % len(MESH_PAIRS)]
        shape = tuple(int(s) for s in rng.integers(1, 8, size=int(rng.integers(1, 4))))
        src = Layout(sm, tuple(_placement(rng, len(shape)) for _ in sm.shape))
        dst = Layout(dm, tuple(_placement(rng, len(shape)) for _ in dm.shape))
        try:
            plan = plan_reshard(src, dst, shape, "float64")
            glob = rng.integers(-9, 10, size=shape).astype(np.float64)
            vm = VirtualMesh.from_global(glob, src, rng)
        except (ReshardError, ValueError):
            continue
        if not plan.steps:
            continue
        out.append((plan, vm.arrays, vm.run(plan).arrays))
    return out


def _step_local(step, cur, rank, shape):
    from executor.kernels import KernelContext, get_kernel

    lay = Layout(step.mesh, step.dst)
    group = next(tuple(g) for g in step.groups if rank in g)
    ctx = KernelContext(out_types=(TensorType(lay.local_shape(shape, rank), "float64"),),
                        group=group, rank=rank)
    attrs = {"src_dim": step.src_dim, "dst_dim": step.dst_dim, "factor": step.factor}
    return get_kernel(STEP_OPS[step.kind])([cur], attrs, ctx)[0]


def _run_cases(rank: int, nproc: int, cases) -> dict[int, np.ndarray]:
    from executor.collectives import Groups, p2p, run_collective

    groups = Groups([g for plan, _, _ in cases for s in plan.steps if s.kind != "send_recv"
                     for g in s.groups], timeout=60)
    results = {}
    for ci, (plan, init, _) in enumerate(cases):
        cur = torch.from_numpy(init[rank]) if rank in init else None
        shape = plan.global_shape
        for s in plan.steps:
            if s.kind == "send_recv":
                ops, buf = [], None
                for a, b in s.groups:
                    if a == rank:
                        ops.append(("send", cur.contiguous(), b))
                    if b == rank:
                        buf = torch.empty(Layout(s.dst_mesh, s.dst).local_shape(shape, rank),
                                          dtype=torch.float64)
                        ops.append(("recv", buf, a))
                for w in p2p(ops):
                    w.wait()
                cur = buf
            elif rank not in s.mesh.process_ids:
                continue
            elif s.kind in ("slice", "zero_fill", "scale"):
                cur = _step_local(s, cur, rank, shape)
            else:
                group = next(tuple(g) for g in s.groups if rank in g)
                attrs = {"reduce_type": s.reduce_type, "src_dim": s.src_dim, "dst_dim": s.dst_dim}
                out_shape = Layout(s.mesh, s.dst).local_shape(shape, rank)
                cur = run_collective(STEP_OPS[s.kind], cur, attrs, rank, group, groups, out_shape)
        if rank in plan.dst.mesh.process_ids:
            results[ci] = cur.numpy()
    return results


@pytest.mark.distributed
def test_collectives_match_virtual_mesh_on_4_gloo_ranks():
    cases = _cases(60)
    kinds = {k for plan, _, _ in cases for k in plan.kinds()}
    assert {"all_reduce", "reduce_scatter", "all_gather", "all_to_all", "send_recv", "slice",
            "zero_fill"} <= kinds, kinds
    uneven = [p for p, _, _ in cases if any(s % 2 for s in p.global_shape)]
    assert uneven
    per_rank = launch(_run_cases, 4, args=(cases,), timeout=120)
    for ci, (plan, _, want) in enumerate(cases):
        for r, arr in want.items():
            got = per_rank[r][ci]
            assert got.shape == arr.shape, (ci, plan, r)
            np.testing.assert_array_equal(got, arr, err_msg=f"case {ci} {plan.kinds()} rank {r}")

"""Property: every reshard plan, executed on the numpy VirtualMesh, yields exactly the
target layout of the same global array (uneven splits, zero-row ranks, partial layouts,
nested sharding, cross-mesh)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.distributed.tensor import Replicate as TReplicate
from torch.distributed.tensor import Shard as TShard
from torch.distributed.tensor._utils import _compute_local_shape_and_global_offset

from completion import Partial, ProcessMesh, Shard
from completion.reshard import Layout, plan_reshard
from completion.testing import VirtualMesh
from tests._reshard_strategies import MESH_SHAPES, placements, reshard_case


def _check(shape, src, dst, seed):
    rng = np.random.default_rng(seed)
    glob = rng.integers(-8, 9, size=shape).astype(np.float64)
    vm = VirtualMesh.from_global(glob, src, rng)
    assert np.array_equal(vm.to_global(), glob)  # the source split itself is exact
    out = vm.run(plan_reshard(src, dst, shape))
    assert out.layout == dst
    for r in dst.mesh.process_ids:  # exact local shapes, then exact values
        assert out.arrays[r].shape == dst.local_shape(shape, r)
    assert np.array_equal(out.to_global(), glob)


@settings(max_examples=500, deadline=None, derandomize=True)
@given(reshard_case(), st.integers(0, 2**31))
def test_plan_executes_exactly_on_virtual_mesh(case, seed):
    shape, (src, dst) = case
    _check(shape, src, dst, seed)


@settings(max_examples=100, deadline=None, derandomize=True)
@given(reshard_case(), st.sampled_from(MESH_SHAPES), st.data())
def test_cross_mesh_plan_executes_exactly(case, other_shape, data):
    shape, (src, _) = case
    mesh = ProcessMesh.of(*other_shape, start=8)
    types = tuple(sorted({p.reduce_type for p in src.placements if isinstance(p, Partial)})) or ("sum",)
    dst = Layout(mesh, data.draw(placements(len(other_shape), len(shape), types)))
    _check(shape, src, dst, 7)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(reshard_case(n_layouts=1, max_dim=9))
def test_layout_blocks_match_torch_dtensor(case):
    """Nested uneven sharding: block sizes and offsets agree with torch DTensor's own
    ``_compute_local_shape_and_global_offset`` (an independent implementation)."""
    shape, (lay,) = case
    tpl = [TShard(p.dim) if isinstance(p, Shard) else TReplicate() for p in lay.placements]
    for r in lay.mesh.process_ids:
        coord = list(lay.mesh.coord(r))
        tshape, toff = _compute_local_shape_and_global_offset(shape, lay.mesh.shape, coord, tpl)
        rng = lay.index_range(shape, r)
        assert tuple(tshape) == tuple(b - a for a, b in rng)
        for (a, b), off in zip(rng, toff, strict=True):
            if b > a:
                assert a == off

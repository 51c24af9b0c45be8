"""Hypothesis strategies for reshard tests: meshes of 1-3 dims (<= 8 ranks), global shapes
with dims not divisible by the mesh (zero-row ranks included), random layouts."""

from __future__ import annotations

import math

from hypothesis import strategies as st

from completion import Partial, ProcessMesh, Replicate, Shard
from completion.reshard import Layout

MESH_SHAPES = [
    s
    for nd in (1, 2, 3)
    for s in __import__("itertools").product(range(1, 9), repeat=nd)
    if math.prod(s) <= 8
]
# partial alphabets whose types combine in any order (see completion.reshard.layout)
REDUCE_ALPHABETS = [("sum", "avg"), ("sum",), ("max",), ("min",)]


@st.composite
def placements(draw, mesh_ndim: int, tensor_ndim: int, reduce_types) -> tuple:
    opts = [Replicate()] + [Shard(d) for d in range(tensor_ndim)] + [Partial(r) for r in reduce_types]
    return tuple(draw(st.sampled_from(opts)) for _ in range(mesh_ndim))


@st.composite
def reshard_case(draw, n_layouts: int = 2, max_dim: int = 7):
    """(global shape, [layouts...]) on one mesh, all drawing partials from one alphabet."""
    mshape = draw(st.sampled_from(MESH_SHAPES))
    mesh = ProcessMesh.of(*mshape)
    shape = tuple(draw(st.lists(st.integers(1, max_dim), min_size=1, max_size=3)))
    types = draw(st.sampled_from(REDUCE_ALPHABETS))
    layouts = [Layout(mesh, draw(placements(len(mshape), len(shape), types))) for _ in range(n_layouts)]
    return shape, layouts

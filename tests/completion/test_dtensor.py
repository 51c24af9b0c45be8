"""Placements print, parse and convert as torch DTensor's do (issue 20 item 3): the texts are
compared with torch's own ``repr`` / ``str`` of the same placement (an independent
implementation), conversions round-trip, and a DeviceMesh is built from a spec."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
from torch.distributed import tensor as tdt  # noqa: E402

from completion.dist_attr import DistAttrError, Partial, Replicate, Shard, parse_placement  # noqa: E402
from completion.dtensor import (  # noqa: E402
    device_mesh_spec,
    from_torch,
    placements_from_torch,
    placements_to_torch,
    to_torch,
)
from completion.mesh import ProcessMesh  # noqa: E402

placements = st.one_of(
    st.integers(0, 5).map(Shard),
    st.just(Replicate()),
    st.sampled_from(["sum", "avg", "max", "min"]).map(Partial),
)


@given(placements)
def test_repr_and_str_are_dtensors_and_parse_back(p):
    t = to_torch(p)
    assert repr(p) == repr(t) and str(p) == str(t)
    assert parse_placement(repr(p)) == p and parse_placement(str(p)) == p
    assert from_torch(t) == p


def test_is_methods_as_dtensor():
    s, r, pa = Shard(1), Replicate(), Partial("mean")
    assert repr(s) == "Shard(dim=1)" and str(s) == "S(1)"
    assert s.is_shard() and s.is_shard(1) and not s.is_shard(0) and not s.is_partial()
    assert r.is_replicate() and not r.is_shard() and str(r) == "R"
    assert pa.is_partial() and pa.is_partial("avg") and pa.is_partial("mean") and not pa.is_partial("sum")
    assert pa.reduce_op == "avg" and repr(pa) == "Partial(avg)"
    # torch agrees on each predicate
    for ours in (s, r, pa):
        theirs = to_torch(ours)
        assert (ours.is_shard(), ours.is_replicate(), ours.is_partial()) == (
            theirs.is_shard(), theirs.is_replicate(), theirs.is_partial())


def test_lists_and_unmodelled_kinds():
    ps = (Shard(0), Replicate(), Partial("max"))
    assert placements_from_torch(placements_to_torch(ps)) == ps
    with pytest.raises(DistAttrError, match="product"):
        from_torch(tdt.Partial("product"))
    with pytest.raises(DistAttrError, match="not a placement"):
        to_torch("Shard(0)")


def test_device_mesh_spec_builds_a_device_mesh(tmp_path):
    spec = device_mesh_spec(ProcessMesh.of(2, 3, start=4, dim_names=("dp", "tp")), "cpu")
    assert spec == {"device_type": "cpu", "mesh": [[4, 5, 6], [7, 8, 9]], "mesh_dim_names": ("dp", "tp")}
    cube = device_mesh_spec(ProcessMesh.of(2, 2, 2))
    assert cube["mesh"] == [[[0, 1], [2, 3]], [[4, 5], [6, 7]]] and cube["mesh_dim_names"] == ("d0", "d1", "d2")
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        m = DeviceMesh(**device_mesh_spec(ProcessMesh.of(1, dim_names=("dp",)), "cpu"))
        assert m.mesh.tolist() == [0] and m.mesh_dim_names == ("dp",)
    finally:
        dist.destroy_process_group()


def test_is_shard_of_each_dim_and_is_partial_of_each_op_agree_with_torch():
    ops = ("sum", "avg", "max", "min")
    for ours in [Shard(d) for d in range(3)] + [Replicate()] + [Partial(o) for o in ops]:
        theirs = to_torch(ours)
        assert [ours.is_shard(d) for d in range(3)] == [theirs.is_shard(d) for d in range(3)]
        assert [ours.is_partial(o) for o in ops] == [theirs.is_partial(o) for o in ops]


@pytest.mark.parametrize("text", ["Shard(dim=1)", "Shard(1)", "S(1)", "Replicate()", "R",
                                  "Partial(sum)", "Partial(reduce_op='sum')", "P(avg)",
                                  "Partial(reduce_op=\"max\")"])
def test_dtensor_texts_parse_to_the_placement_torch_prints_them_for(text):
    p = parse_placement(text)
    assert repr(to_torch(p)) == repr(p) and parse_placement(repr(to_torch(p))) == p


def test_strided_shard_is_refused_by_name():
    from torch.distributed.tensor.placement_types import _StridedShard

    with pytest.raises(DistAttrError, match="_StridedShard"):
        from_torch(_StridedShard(0, split_factor=2))


def test_a_dtensors_layout_converts_both_ways(tmp_path):
    """A real DTensor on a 1 x 1 mesh (one process: the only mesh a test can build) keeps the
    placements the attr gave it, and reads back as the same TensorDistAttr; the rank array of
    a 2 x 3 mesh round-trips through a DeviceMesh-like reader."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import distribute_tensor

    from completion.dist_attr import TensorDistAttr
    from completion.dtensor import dist_attr_from_torch, dist_attr_to_torch, process_mesh_of

    mesh = ProcessMesh.of(1, 1, dim_names=("dp", "tp"))
    attr = TensorDistAttr.from_placements(mesh, (Shard(1), Partial("max")), ndim=2)
    spec, places = dist_attr_to_torch(attr, "cpu")
    assert places == (tdt.Shard(1), tdt.Partial("max"))
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        dm = DeviceMesh(**spec)
        dt = distribute_tensor(torch.ones(4, 6), dm, [tdt.Shard(1), tdt.Replicate()])
        back = dist_attr_from_torch(dt.device_mesh, dt.placements, dt.ndim)
        assert back.placements == (Shard(1), Replicate()) and back.dims_mapping == (-1, 0)
        assert dist_attr_from_torch(dm, places, 2) == attr
        assert process_mesh_of(dm) == mesh and process_mesh_of(dm).dim_names == ("dp", "tp")
    finally:
        dist.destroy_process_group()

    class _Like:  # what process_mesh_of reads of a DeviceMesh: its rank tensor and names
        mesh = torch.tensor([[4, 5, 6], [7, 8, 9]])
        mesh_dim_names = None

    pm = process_mesh_of(_Like())
    assert (pm.shape, pm.process_ids, pm.dim_names) == ((2, 3), (4, 5, 6, 7, 8, 9), ("d0", "d1"))
    assert device_mesh_spec(pm)["mesh"] == _Like.mesh.tolist()
    with pytest.raises(DistAttrError, match="tensor dim 0 is sharded by mesh dims 0 and 1"):
        dist_attr_from_torch(_Like(), [tdt.Shard(0), tdt.Shard(0)], 2)

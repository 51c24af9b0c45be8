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

"""Issue 18 (fourth pass): the Propagator's per-op sites and the outcome memo beside its
rule cache give what running every rule and rebuilding every outcome gives, and an outcome
shared between ops never carries one op's mesh object into another's op dist attr."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from completion import apply_partition_pass, apply_reshard_pass, build_model
from completion.annotate import set_annotation, shard_megatron
from completion.backward import append_backward
from completion.completer import Completer
from completion.ir import OpRole
from completion.mesh import ProcessMesh
from completion.models.builder import ProgramBuilder
from completion.optimizer import apply_optimizer
from completion.pir.printer import print_program
from tests._rule_cache import disable_rule_cache

MESH = ProcessMesh.of(2, 4, dim_names=("dp", "mp"))


def _printed(sp: bool, zero: int, pp: int, vpp: int) -> str:
    p = build_model("zb-gpt-6.2b", 4, num_layers=2 * pp * vpp, seq_len=64)
    append_backward(p)
    apply_optimizer(p, "adamw")
    shard_megatron(p, MESH, "dp", "mp", sequence_parallel=sp)
    Completer(p, zero_stage=zero, pp_degree=pp, vpp_degree=vpp,
              schedule_mode="VPP" if vpp > 1 else "1F1B").complete()
    apply_partition_pass(p)
    apply_reshard_pass(p)
    return print_program(p)


@pytest.mark.parametrize(("sp", "zero", "pp", "vpp"), [(True, 0, 1, 1), (False, 3, 1, 1), (True, 2, 2, 2)])
def test_memo_equals_running_every_rule(monkeypatch, sp, zero, pp, vpp):
    """Sequence parallel, ZeRO-3, and VPP (chunks 0-3, so one rule answer has outcomes for
    several chunks) with ZeRO-2: the printed program after partition and reshard is the
    same when no cache entry is ever stored (every visit runs the rule and rebuilds its
    outcome)."""
    memo = _printed(sp, zero, pp, vpp)

    disable_rule_cache(monkeypatch)  # every infer runs the rule
    assert _printed(sp, zero, pp, vpp) == memo


def _two_chains(mesh_a: ProcessMesh, mesh_b: ProcessMesh):
    """Two identical x @ w chains (same shapes, attrs and layouts), the first annotated on
    ``mesh_a`` and the second on ``mesh_b``."""
    pb = ProgramBuilder(dtype="float32")
    chains = []
    for tag, mesh in (("a", mesh_a), ("b", mesh_b)):
        x = pb.data(f"x_{tag}", [8, 16], "float32")
        w = pb.param("", f"w_{tag}", [16, 32])
        y = pb.op1("matmul", [x, w])
        pb.op("shadow_output", [y], {"output_name": f"y_{tag}"}, role=OpRole.FORWARD)
        set_annotation(pb.program, x, mesh, [0, -1])
        set_annotation(pb.program, w, mesh, [-1, 1])
        chains.append((mesh, y))
    return pb.program, chains


def test_equal_meshes_with_other_dim_names_keep_their_own_mesh():
    """Meshes equal in shape and ranks but named differently share rule answers (they are
    equal keys), yet each op's dist attr holds the mesh object the op was placed on: the
    matmul of the second chain reports dims ("x", "y")."""
    named_b = ProcessMesh.of(2, 4, dim_names=("x", "y"))
    assert named_b == MESH
    prog, chains = _two_chains(MESH, named_b)
    comp = Completer(prog)
    comp.complete()
    for op in prog.ops:
        assert op.dist_attr is not None
        assert op.dist_attr.process_mesh is comp.op_mesh[id(op)], op.label()
    for mesh, y in chains:
        mm = y.op
        assert mm.dist_attr.process_mesh.dim_names == mesh.dim_names
        assert list(y.dist_attr.dims_mapping) == [0, 1]  # x split on dp, w on mp: [dp, mp]
        assert mm.dist_attr.operands[1].dims_mapping == (-1, 1)


def test_merge_hint_by_hand():
    from completion.propagate import merge_hint

    assert merge_hint(None, (-1, -1), (4, 8)) is None  # shards nothing: no hint
    assert merge_hint(None, (0, 1), (1, 8)) == (-1, 1)  # a size-1 dim stays replicated
    assert merge_hint((0, -1), (1, 0), (4, 8)) == (0, -1)  # first wins; mesh dim 0 is used
    assert merge_hint((-1, -1, 1), (0, 1, -1), (4, 8, 2)) == (0, -1, 1)  # 1 already used


DIMS = st.lists(st.integers(-1, 2), min_size=1, max_size=4)


@settings(max_examples=200, deadline=None)
@given(data=st.data(), first=DIMS)
def test_merge_hint_is_monotone_and_idempotent(data, first):
    """Hints only grow (-1 -> mesh dim, set entries kept), never name a mesh dim twice,
    and merging the same request again changes nothing: why the memoised merge and a
    revisit that repeats a request are safe."""
    from completion.propagate import merge_hint

    n = len(first)
    shape = tuple(data.draw(st.lists(st.integers(1, 4), min_size=n, max_size=n)))
    first = tuple(m if first.index(m) == i or m < 0 else -1 for i, m in enumerate(first))  # as a dims_mapping
    h = merge_hint(None, first, shape)
    for _ in range(3):
        req = data.draw(st.lists(st.integers(-1, 2), min_size=n, max_size=n))
        req = tuple(m if req.index(m) == i or m < 0 else -1 for i, m in enumerate(req))
        new = merge_hint(h, req, shape)
        if h is None:
            assert new is None or all(new[d] in (-1, req[d]) for d in range(n))
        else:
            assert all(h[d] < 0 or new[d] == h[d] for d in range(n))
            assert all(new[d] == h[d] or (h[d] < 0 and new[d] == req[d]) for d in range(n))
        if new is not None:
            used = [m for m in new if m >= 0]
            assert len(used) == len(set(used))
            assert all(new[d] < 0 for d in range(n) if shape[d] == 1)
        assert merge_hint(new, req, shape) == new
        h = new

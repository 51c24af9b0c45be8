"""Issue "Correct on every input": completion never relabels a layout the data does not
have, and a reshard op's source and target are facts.

Every program here is completed, partitioned, resolved into collectives and run on the
numpy virtual mesh (:mod:`tests._numpy_mesh`); every value of the partitioned program is
reassembled from its per-rank blocks under the layout it claims and compared with the
single-process result.

Property test size: ``MESHPLAN_FUZZ_EXAMPLES`` (default 60) random programs.
"""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from completion import (
    Completer,
    OperatorDistAttr,
    ProcessMesh,
    Program,
    TensorDistAttr,
    apply_partition_pass,
    print_program,
)
from completion.annotate import set_annotation
from tests._numpy_mesh import partition_and_check, random_inputs, run_global, run_mesh

FUZZ_EXAMPLES = int(os.environ.get("MESHPLAN_FUZZ_EXAMPLES", "60"))


def _data(p: Program, name: str, shape):
    return p.add("data", [], {"shape": list(shape), "dtype": "float64", "name": name},
                 names=[name]).results[0]


def _types(p: Program) -> list[str]:
    return [op.type for op in p.ops]


# -- item 1: an annotated result the op cannot produce is resharded, not relabelled ------


def _matmul_annotated_on_both_mesh_dims():
    """Mesh [2, 2]; x [4, 8] with its contracted dim k on mesh dim 1; y = x @ w annotated
    [0, 1] (S(0) on mesh dim 0, S(1) on mesh dim 1). Sharding k on mesh dim 1 makes the
    product Partial over mesh dim 1, so y as the matmul computes it is (S(0), P(sum))."""
    mesh = ProcessMesh.of(2, 2)
    p = Program()
    x, w = _data(p, "x", (4, 8)), _data(p, "w", (8, 6))
    mm = p.add("matmul", [x, w])
    y = mm.results[0]
    p.add("relu", [y])
    set_annotation(p, x, mesh, [-1, 1])
    set_annotation(p, y, mesh, [0, 1])
    return p, mm, y, mesh


def test_item1_matmul_result_annotation_is_resharded_not_relabelled():
    p, mm, y, mesh = _matmul_annotated_on_both_mesh_dims()
    Completer(p).complete()
    # the annotation stays on the value; the op says what it really computes
    assert y.dist_attr == TensorDistAttr(mesh, [0, 1])
    produced = mm.dist_attr.results[0]
    assert produced.dims_mapping == (0, -1) and produced.partial_dims == {1: "sum"}
    prog, checked = partition_and_check(p)
    # (S(0), P(sum)) -> (S(0), S(1)): one reduce_scatter on mesh dim 1 after the matmul
    types = _types(prog)
    assert types[types.index("matmul") + 1] == "reduce_scatter"
    rs = prog.ops[types.index("reduce_scatter")]
    assert rs.attrs["mesh_dim"] == 1 and rs.attrs["groups"] == [[0, 1], [2, 3]]
    assert rs.results[0].uses[0][0].type == "relu"  # relu reads the resharded product
    assert rs.results[0].dist_attr == y.dist_attr
    assert checked == len([v for v in prog.values()])


def test_item1_relu_of_the_annotated_product_is_the_single_process_value():
    p, mm, y, mesh = _matmul_annotated_on_both_mesh_dims()
    Completer(p).complete()
    inputs = random_inputs(p, seed=3)
    relu_out = p.ops[-1].results[0]
    want = np.maximum(inputs[id(p.ops[0].results[0])] @ inputs[id(p.ops[1].results[0])], 0)
    np.testing.assert_array_equal(run_global(p, inputs)[id(relu_out)], want)
    from completion import apply_reshard_pass

    apply_partition_pass(p)
    apply_reshard_pass(p)
    dist = run_mesh(p, inputs)
    # relu runs on (S(0), S(1)) blocks: rank (i, j) holds rows i, columns j of the answer
    for r in mesh.process_ids:
        i, j = mesh.coord(r)
        np.testing.assert_array_equal(dist[id(relu_out)][r], want[2 * i:2 * i + 2, 3 * j:3 * j + 3])


def test_item1_full_annotated_partial_is_zero_filled():
    """A ``full`` computes its constant on every rank: annotated Partial(sum) it must be
    zero-filled (else the sum over ranks would be n times the value)."""
    mesh = ProcessMesh.of(2)
    p = Program()
    x = _data(p, "x", (4, 6))
    f = p.add("full", [], {"shape": [4, 6], "dtype": "float64", "value": 2.0})
    s = p.add("add", [x, f.results[0]])
    set_annotation(p, x, mesh, placements=[__import__("completion").Partial("sum")])
    f.results[0].dist_attr = TensorDistAttr(mesh, [-1, -1], {0: "sum"})
    Completer(p).complete()
    assert f.dist_attr.results[0].is_replicated()
    prog, _ = partition_and_check(p)
    assert "zero_fill" in _types(prog)
    assert s.results[0].dist_attr.partial_dims == {0: "sum"}


# -- item 2: a given reshard op is never rewritten ---------------------------------------


def _forward_reshard_partial_to_shard(annotate_result: bool):
    """Mesh [2]: h = x @ w with x S(1), w S(0) is Partial(sum); a forward reshard op given
    as Partial(sum) -> Shard(0); relu reads the shard."""
    mesh = ProcessMesh.of(2)
    p = Program()
    x, w = _data(p, "x", (4, 8)), _data(p, "w", (8, 6))
    h = p.add("matmul", [x, w]).results[0]
    rs = p.add("reshard", [h])
    set_annotation(p, x, mesh, [-1, 0])
    set_annotation(p, w, mesh, [0, -1])
    src, dst = TensorDistAttr(mesh, [-1, -1], {0: "sum"}), TensorDistAttr(mesh, [0, -1])
    rs.dist_attr = OperatorDistAttr(mesh, (src,), (dst,))
    if annotate_result:
        rs.results[0].dist_attr = dst
    out = p.add("relu", [rs.results[0]])
    return p, rs, out, src, dst


@pytest.mark.parametrize("annotate_result", [True, False])
def test_item2_forward_reshard_partial_to_shard_keeps_its_reduce_scatter(annotate_result):
    p, rs, out, src, dst = _forward_reshard_partial_to_shard(annotate_result)
    Completer(p).complete()
    assert rs.dist_attr.operands == (src,) and rs.dist_attr.results == (dst,)
    assert rs.results[0].dist_attr == dst
    assert out.dist_attr.operands[0] == dst
    first = print_program(p)
    Completer(p).complete()  # completing again changes nothing
    assert print_program(p) == first
    prog, _ = partition_and_check(p)
    types = _types(prog)
    assert types == ["data", "data", "matmul", "reduce_scatter", "relu"]
    red = prog.ops[3]
    assert red.attrs["reduce_type"] == "sum" and red.attrs["dst_dim"] == 0
    assert red.attrs["nbytes"] == 4 * 6 * 8  # the whole [4, 6] float64 input


def test_item2_given_reshard_source_differs_from_its_operand():
    """The reshard op says its source is Partial(sum) but its operand is Shard(1): the
    pass moves the operand to the given source first (never rewrites the reshard)."""
    mesh = ProcessMesh.of(2)
    p = Program()
    x = _data(p, "x", (4, 6))
    rs = p.add("reshard", [x])
    set_annotation(p, x, mesh, [-1, 0])
    src, dst = TensorDistAttr(mesh, [-1, -1], {0: "sum"}), TensorDistAttr(mesh, [0, -1])
    rs.dist_attr = OperatorDistAttr(mesh, (src,), (dst,))
    p.add("relu", [rs.results[0]])
    Completer(p).complete()
    assert rs.dist_attr.operands == (src,)
    prog, _ = partition_and_check(p)
    assert _types(prog) == ["data", "zero_fill", "reduce_scatter", "relu"]


def test_item2_a_reshard_without_given_attrs_moves_data_instead_of_relabelling():
    """An un-given reshard op requires its operand as it is (Partial here), so the data
    is really reduced: the op's operand attr is the operand's layout."""
    mesh = ProcessMesh.of(2)
    p = Program()
    x, w = _data(p, "x", (4, 8)), _data(p, "w", (8, 6))
    h = p.add("matmul", [x, w]).results[0]
    rs = p.add("reshard", [h])
    set_annotation(p, x, mesh, [-1, 0])
    set_annotation(p, w, mesh, [0, -1])
    set_annotation(p, rs.results[0], mesh, [0, -1])
    p.add("relu", [rs.results[0]])
    Completer(p).complete()
    assert rs.dist_attr.operands[0] == h.dist_attr and h.dist_attr.is_partial()
    prog, _ = partition_and_check(p)
    assert "reduce_scatter" in _types(prog)


def test_partition_is_idempotent_on_result_reshards():
    p, _, _, _ = _matmul_annotated_on_both_mesh_dims()
    Completer(p).complete()
    apply_partition_pass(p)
    once = print_program(p)
    apply_partition_pass(p)
    assert print_program(p) == once


# -- the property: random annotated programs are exact on the virtual mesh --------------

MESHES = [ProcessMesh.of(2), ProcessMesh.of(2, 2)]
DIMS = [1, 2, 3, 4, 6]
# per layout, partial types from one alphabet whose order does not matter
REDUCE_ALPHABETS = [("sum", "avg"), ("sum",), ("max",)]


@st.composite
def layout(draw, mesh: ProcessMesh, ndim: int, partial_p: float = 0.3) -> TensorDistAttr:
    free = list(range(mesh.ndim))
    dm = []
    for _ in range(ndim):
        m = draw(st.sampled_from([-1] + free))
        dm.append(m)
        if m >= 0:
            free.remove(m)
    part = {}
    types = draw(st.sampled_from(REDUCE_ALPHABETS))
    for m in free:
        if draw(st.floats(0, 1)) < partial_p:
            part[m] = draw(st.sampled_from(types))
    return TensorDistAttr(mesh, dm, part)


def _reshapes(shape: tuple[int, ...]) -> list[tuple[int, ...]]:
    n = math.prod(shape)
    outs = {(n,)}
    for a in range(1, n + 1):
        if n % a == 0:
            outs.add((a, n // a))
    if len(shape) == 2:
        outs.add((shape[1], shape[0]))
        for a in (2, 3):
            if shape[1] % a == 0:
                outs.add((shape[0], a, shape[1] // a))
    return sorted(o for o in outs if o != shape and len(o) <= 3)


@st.composite
def annotated_program(draw):
    mesh = draw(st.sampled_from(MESHES))
    p = Program()
    vals = []
    annotations = []
    given_ops: list = []

    def new_input(shape):
        v = _data(p, f"in{len(p.ops)}", shape)
        annotations.append((v, draw(layout(mesh, len(shape)))))
        return v

    shape = tuple(draw(st.lists(st.sampled_from(DIMS), min_size=1, max_size=2)))
    vals.append(new_input(shape))
    for _ in range(draw(st.integers(1, 6))):
        a = draw(st.sampled_from(vals))
        kind = draw(st.sampled_from(["matmul", "add", "relu", "reshape", "sum", "reshard"]))
        if kind == "matmul" and a.ndim == 2:
            w = new_input((a.shape[1], draw(st.sampled_from(DIMS))))
            op = p.add("matmul", [a, w])
        elif kind == "add":
            same = [v for v in vals if v.shape == a.shape and v is not a]
            b = draw(st.sampled_from(same)) if same and draw(st.booleans()) else \
                new_input(a.shape[-1:] if draw(st.booleans()) else a.shape)
            op = p.add("add", [a, b])
        elif kind == "reshape" and a.ndim:
            op = p.add("reshape", [a], {"shape": list(draw(st.sampled_from(_reshapes(a.shape))))})
        elif kind == "sum" and a.ndim:
            axes = draw(st.lists(st.integers(0, a.ndim - 1), min_size=1, max_size=a.ndim, unique=True))
            op = p.add("sum", [a], {"axis": axes, "keepdim": draw(st.booleans())})
        elif kind == "reshard":  # a given reshard: random source and target, both facts
            op = p.add("reshard", [a])
            src, dst = draw(layout(mesh, a.ndim)), draw(layout(mesh, a.ndim))
            op.dist_attr = OperatorDistAttr(mesh, (src,), (dst,))
            given_ops.append((op, op.dist_attr))
        else:
            op = p.add("relu", [a])
        r = op.results[0]
        vals.append(r)
        if draw(st.floats(0, 1)) < 0.35:
            annotations.append((r, draw(layout(mesh, r.ndim))))
    for v, attr in annotations:
        v.dist_attr = attr
    p._given_reshards = given_ops  # for the test's check
    return p


def _attrs(p: Program):
    return ([v.dist_attr for v in p.values()], [op.dist_attr for op in p.ops])


@settings(max_examples=FUZZ_EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(p=annotated_program())
def test_random_annotated_programs_are_exact_on_the_virtual_mesh(p):
    """Random matmul / add / relu / reshape / sum / given-reshard chains on meshes [2] and
    [2, 2] with random dims_mapping and Partial annotations on inputs and some results:
    annotations and given reshards survive completion, completing twice changes nothing,
    and every value of the partitioned program is exact on the virtual mesh."""
    ann = {id(v): v.dist_attr for v in p.values() if v.dist_attr is not None}
    Completer(p).complete()
    for v in p.values():  # annotations are never overwritten
        if id(v) in ann:
            assert v.dist_attr == ann[id(v)], v.label()
    for op, da in p._given_reshards:  # a given reshard op is never rewritten
        assert op.dist_attr == da, op.label()
    first, text = _attrs(p), print_program(p)
    Completer(p).complete()  # propagation is idempotent
    assert _attrs(p) == first and print_program(p) == text
    prog, checked = partition_and_check(p)
    assert checked == len(list(prog.values()))


def test_recompleting_follows_a_changed_given_reshard():
    """The result of a given reshard takes the op's target; after the op's attr is
    changed, completing again takes the new target (it was derived from the op)."""
    p, rs, out, src, dst = _forward_reshard_partial_to_shard(annotate_result=False)
    Completer(p).complete()
    assert rs.results[0].dist_attr == dst
    mesh = dst.process_mesh
    new = TensorDistAttr(mesh, [-1, 0])
    rs.dist_attr = OperatorDistAttr(mesh, (src,), (new,))
    Completer(p).complete()
    assert rs.results[0].dist_attr == new and rs.dist_attr.results == (new,)
    prog, _ = partition_and_check(p)
    assert "reduce_scatter" in _types(prog)


def _training_program_with_a_given_reshard(path):
    """x [4, 16] @ W0 (row-split on mesh dim 1) is Partial(sum); a forward reshard given as
    Partial(sum) -> Shard(0) on mesh [1, 2]; relu, @ W1, MSE loss. Forward-only PIR text
    with its dist attrs (the plan pipeline appends backward and SGD)."""
    from completion.ir import OpRole
    from completion.models.builder import ProgramBuilder

    pb = ProgramBuilder(dtype="float32")
    w1, w0 = pb.param("", "parameter_1", [16, 8]), pb.param("", "parameter_0", [16, 16])
    x, label = pb.data("input0", [4, 16], "float32"), pb.data("label0", [4, 8], "float32")
    mm = {"transpose_x": False, "transpose_y": False}
    h = pb.op1("matmul", [x, w0], mm)
    rs = pb.program.add("reshard", [h])
    y = pb.op1("matmul", [pb.op1("relu", [rs.results[0]]), w1], mm)
    loss = pb.op1("mean", [pb.op1("square", [pb.op1("subtract", [y, label])])],
                  {"axis": [], "keepdim": False}, role=OpRole.LOSS)
    pb.op("shadow_output", [loss], {"output_name": "loss_0"}, role=OpRole.LOSS)
    prog = pb.program
    mesh = ProcessMesh((1, 2), (0, 1))
    for v, dm in ((w0, [1, -1]), (w1, [-1, -1]), (x, [-1, -1]), (label, [-1, -1])):
        set_annotation(prog, v, mesh, dm)
        v.op.dist_attr = OperatorDistAttr(mesh, (), (v.dist_attr,))
    src, dst = TensorDistAttr(mesh, [-1, -1], {1: "sum"}), TensorDistAttr(mesh, [1, -1])
    rs.dist_attr = OperatorDistAttr(mesh, (src,), (dst,))
    rs.results[0].dist_attr = dst
    path.write_text(print_program(prog))
    return str(path)


def _given_reshard_plan(tmp_path):
    from completion.strategy import Strategy
    from meshplan.plan import Plan

    return Plan(model=_training_program_with_a_given_reshard(tmp_path / "given_reshard.pir"),
                cluster="cpu-local", strategy=Strategy(tp=2, micro_batch_size=4, global_batch_size=4,
                                                       dtype="float32", optimizer="sgd"))


def test_item2_given_reshard_in_a_training_plan_keeps_its_reduce_scatter(tmp_path):
    from executor.program import build_program

    prog = build_program(_given_reshard_plan(tmp_path)).program
    fwd = [op.type for op in prog.ops if op.dialect == "dist_op" and op.role == 0]
    assert "reduce_scatter" in fwd


@pytest.mark.distributed
def test_item2_given_reshard_plan_verifies_on_two_gloo_ranks(tmp_path):
    from meshplan.validation import verify

    r = verify(_given_reshard_plan(tmp_path), 2, steps=2)
    assert r.ok, r.summary()


@pytest.mark.parametrize("build", ["item1", "item2"])
def test_completed_text_round_trips_and_partitions_the_same(build):
    """A completed program whose op produces another layout than its annotated result (or
    holds a given reshard) prints, parses back identically, re-completes to itself and
    partitions exactly as the original."""
    from completion import parse_program

    p = (_matmul_annotated_on_both_mesh_dims() if build == "item1"
         else _forward_reshard_partial_to_shard(True))[0]
    Completer(p).complete()
    text = print_program(p)
    q = parse_program(text)
    assert print_program(q) == text
    again = parse_program(text)
    Completer(again).complete()
    assert print_program(again) == text
    apply_partition_pass(p)
    apply_partition_pass(q)
    assert print_program(q) == print_program(p)

"""Op registry: shape inference checked against numpy, grad declarations, error messages."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from completion import OpError, Program, TensorType
from completion.ops import OP_REGISTRY, get_opdef


def infer(op: str, shapes, attrs=None, dtype="float32"):
    od = get_opdef(op)
    assert od is not None
    types = [None if s is None else TensorType(tuple(s), dtype) for s in shapes]
    out = od.infer(types, {**od.attrs, **(attrs or {})})
    return [None if t is None else t.shape for t in out]


dims = st.lists(st.integers(1, 4), min_size=0, max_size=4)


@settings(deadline=None, max_examples=60)
@given(dims, dims, st.sampled_from(["add", "subtract", "multiply", "divide"]))
def test_binary_broadcast_matches_numpy(a, b, op) -> None:
    try:
        want = np.broadcast_shapes(tuple(a), tuple(b))
    except ValueError:
        with pytest.raises(OpError, match="do not broadcast"):
            infer(op, [a, b])
        return
    assert infer(op, [a, b]) == [want]


@settings(deadline=None, max_examples=60)
@given(st.lists(st.integers(1, 3), min_size=0, max_size=2), st.integers(1, 4), st.integers(1, 4),
       st.integers(1, 4), st.booleans(), st.booleans(), st.booleans())
def test_matmul_matches_numpy(batch, m, k, n, tx, ty, bcast) -> None:
    xs = [*batch, k, m] if tx else [*batch, m, k]
    ys = [k, n] if not ty else [n, k]
    if bcast and batch:
        ys = [1, *ys]
    x, y = np.zeros(xs), np.zeros(ys)
    want = np.matmul(np.swapaxes(x, -1, -2) if tx else x, np.swapaxes(y, -1, -2) if ty else y).shape
    assert infer("matmul", [xs, ys], {"transpose_x": tx, "transpose_y": ty}) == [want]


@pytest.mark.parametrize(("x", "y"), [([5], [5, 3]), ([2, 5], [5]), ([5], [5]), ([3, 2, 5], [5])])
def test_matmul_vectors_match_numpy(x, y) -> None:
    assert infer("matmul", [x, y]) == [np.matmul(np.zeros(x), np.zeros(y)).shape]


def test_matmul_mismatch_names_op_and_shapes() -> None:
    p = Program()
    a = p.add("data", [], {"shape": [4, 16]}, names=["a"]).results[0]
    w = p.add("parameter", [], {"shape": [12, 8]}, names=["w"], is_parameter=True).results[0]
    with pytest.raises(OpError, match=r"pd_op.matmul \[mlp.fc1\]: inner dims differ: x \[4, 16\] "
                       r"\(transpose_x=False\) has K=16 but y \[12, 8\] \(transpose_y=False\) has K=12"):
        p.add("matmul", [a, w], struct_name="mlp.fc1")
    with pytest.raises(OpError, match="unknown op type 'nosuchop'"):
        p.add("nosuchop", [a])


@pytest.mark.parametrize("op", ["sum", "mean", "max"])
@pytest.mark.parametrize(("shape", "axis", "keepdim"),
                         [([4, 8], [], False), ([4, 8], [1], True), ([2, 3, 4], [0, -1], False),
                          ([2, 3, 4], [-2], True), ([5], [0], False)])
def test_reductions_match_numpy(op, shape, axis, keepdim) -> None:
    fn = {"sum": np.sum, "mean": np.mean, "max": np.max}[op]
    want = np.shape(fn(np.zeros(shape), axis=tuple(axis) if axis else None, keepdims=keepdim))
    assert infer(op, [shape], {"axis": axis, "keepdim": keepdim}) == [want]


def test_layout_ops_match_numpy() -> None:
    x = np.zeros((2, 3, 4))
    assert infer("reshape", [[2, 3, 4]], {"shape": [0, -1]}) == [(2, 12)]
    assert infer("reshape", [[2, 3, 4]], {"shape": [4, -1, 2]}) == [x.reshape(4, -1, 2).shape]
    with pytest.raises(OpError, match=r"cannot reshape \[2, 3, 4\]"):
        infer("reshape", [[2, 3, 4]], {"shape": [5, -1]})
    assert infer("transpose", [[2, 3, 4]], {"perm": [2, 0, 1]}) == [x.transpose(2, 0, 1).shape]
    got = infer("split", [[2, 3, 4]], {"num_or_sections": 2, "axis": -1})
    assert got == [a.shape for a in np.split(x, 2, axis=-1)]
    got = infer("split", [[2, 3, 4]], {"num_or_sections": [1, -1], "axis": 1})
    assert got == [(2, 1, 4), (2, 2, 4)]
    assert infer("concat", [[2, 3, 4], [2, 5, 4]], {"axis": 1}) == [
        np.concatenate([x, np.zeros((2, 5, 4))], axis=1).shape]
    with pytest.raises(OpError, match="differ off axis 1"):
        infer("concat", [[2, 3, 4], [2, 5, 3]], {"axis": 1})
    got = infer("slice", [[2, 3, 4]], {"axes": [1, 2], "starts": [1, -3], "ends": [10, -1]})
    assert got == [x[:, 1:10, -3:-1].shape]
    assert infer("squeeze", [[1, 3, 1]], {"axis": []}) == [np.zeros((1, 3, 1)).squeeze().shape]
    assert infer("squeeze", [[1, 3, 1]], {"axis": [-1]}) == [(1, 3)]
    assert infer("unsqueeze", [[3, 4]], {"axis": [0, -1]}) == [(1, 3, 4, 1)]


def test_source_and_misc_ops() -> None:
    assert infer("full", [], {"shape": [1]}) == [(1,)]
    assert infer("full_like", [[], [1]]) == [()]
    assert infer("data", [], {"shape": [4, 16]}) == [(4, 16)]
    assert infer("shadow_output", [[]]) == []
    assert infer("dropout", [[4, 8], None]) == [(4, 8), (4, 8)]
    assert get_opdef("dropout").infer([TensorType((4,))], {})[1].dtype == "uint8"
    assert get_opdef("cast").infer([TensorType((4,))], {"dtype": "bfloat16"})[0].dtype == "bfloat16"
    assert infer("add_n", [[4, 8], [4, 8], [4, 8]]) == [(4, 8)]
    with pytest.raises(OpError, match="different shapes"):
        infer("add_n", [[4, 8], [8, 4]])
    assert infer("reshard", [[4, 8]]) == [(4, 8)]
    assert get_opdef("reshard").dialect == "dist_op"
    assert infer("sgd_", [[16, 8], [], [16, 8], None]) == [(16, 8), None]
    with pytest.raises(OpError, match=r"grad shape \[8, 16\] differs from param shape \[16, 8\]"):
        infer("sgd_", [[16, 8], [], [8, 16], None])
    assert infer("adamw_", [[3, 2], [3, 2], [], [3, 2], [3, 2], [1], [1], None, None]) == [
        (3, 2), (3, 2), (3, 2), (1,), (1,), None]


SEED_GRADS = {
    "matmul": ("x", "y", "out@GRAD"),
    "relu": ("out", "out@GRAD"),
    "subtract": ("x", "y", "out@GRAD"),
    "mean": ("x", "out@GRAD"),
    "square": ("x", "out@GRAD"),
}


def test_grad_declarations_follow_paddle_operand_order() -> None:
    for op, gin in SEED_GRADS.items():
        od = get_opdef(op)
        assert od.grad == f"{op}_grad" and od.grad_inputs == gin
        g = get_opdef(od.grad)
        assert g.forward == op and g.operands == gin
        assert g.results == tuple(f"{o}@GRAD" for o in od.operands)
    assert get_opdef("subtract_grad").attrs["axis"] == -1
    assert get_opdef("subtract_grad").attr_tags["axis"] == "Int32"
    assert get_opdef("mean_grad").attrs["reduce_all"] is False


def test_every_grad_op_is_registered_and_infers_forward_operand_types() -> None:
    mine = ["add", "subtract", "multiply", "divide", "relu", "gelu", "silu", "tanh", "sigmoid",
            "exp", "square", "cast", "scale", "dropout", "matmul", "reshape", "transpose", "split",
            "concat", "slice", "squeeze", "unsqueeze", "sum", "mean", "max"]
    for op in mine:
        od = get_opdef(op)
        assert od.grad in OP_REGISTRY, op
    # grads have the forward operands' shapes
    assert infer("matmul_grad", [[4, 16], [16, 8], [4, 8]]) == [(4, 16), (16, 8)]
    assert infer("relu_grad", [[4, 8], [4, 8]]) == [(4, 8)]
    assert infer("silu_grad", [[4, 8], [4, 8], [4, 8]]) == [(4, 8)]
    assert infer("divide_grad", [[4, 8], [8], [4, 8], [4, 8]]) == [(4, 8), (8,)]
    assert infer("mean_grad", [[4, 8], []]) == [(4, 8)]
    assert infer("transpose_grad", [[4, 2, 3]], {"perm": [2, 0, 1]}) == [(2, 3, 4)]
    assert infer("split_grad", [[2, 1], [2, 3]], {"axis": 1}) == [(2, 4)]
    assert infer("concat_grad", [[2, 1], [2, 3], [2, 4]], {"axis": 1}) == [(2, 1), (2, 3)]
    assert infer("dropout_grad", [[4, 8], [4, 8]]) == [(4, 8), (4, 8)]


def test_program_add_records_attr_tags_for_printing() -> None:
    p = Program()
    x = p.add("data", [], {"shape": [4, 8]}, names=["x"]).results[0]
    m = p.add("mean", [x])
    assert m.attr_tags == {"axis": "pd_op.IntArray"}
    assert m.results[0].shape == ()

"""Issue "Correct on every input", item 3: grad kernels take their local shapes from their
own result types (the op's dist attrs), never from a forward operand's block.

Completion may lay a forward input out otherwise than its gradient: a reshape whose input
is Shard(1) needs it replicated (an all_gather before the reshape), so ``reshape_grad``'s
result x@GRAD is replicated while the x it reads is still the [4, 8] shard. Reshaping the
gradient to x's block (the old kernel) fails with a shape error.
"""

from __future__ import annotations

import pytest
import torch

from completion.ir import OpRole
from completion.models.builder import ProgramBuilder
from completion.ops.registry import TensorType
from completion.pir import print_program
from completion.strategy import Strategy
from executor.kernels import KernelContext, get_kernel
from executor.program import build_program
from meshplan.plan import Plan

MM = {"transpose_x": False, "transpose_y": False}
ANNOTATION = {"parameter_0": ["R", "S(1)"], "parameter_1": ["R", "S(0)"]}


def _mlp_with_reshapes(path):
    """x [4, 16] @ W0 [16, 16] -> reshape [8, 8] -> relu -> reshape [4, 16] @ W1 [16, 8],
    MSE loss against label0; written as forward-only PIR text (the plan pipeline appends
    backward and SGD)."""
    pb = ProgramBuilder(dtype="float32")
    w1 = pb.param("", "parameter_1", [16, 8])
    w0 = pb.param("", "parameter_0", [16, 16])
    x = pb.data("input0", [4, 16], "float32")
    label = pb.data("label0", [4, 8], "float32")
    h = pb.op1("matmul", [x, w0], MM)
    a = pb.op1("relu", [pb.op1("reshape", [h], {"shape": [8, 8]})])
    y = pb.op1("matmul", [pb.op1("reshape", [a], {"shape": [4, 16]}), w1], MM)
    sq = pb.op1("square", [pb.op1("subtract", [y, label])])
    loss = pb.op1("mean", [sq], {"axis": [], "keepdim": False}, role=OpRole.LOSS)
    pb.op("shadow_output", [loss], {"output_name": "loss_0"}, role=OpRole.LOSS)
    path.write_text(print_program(pb.program))
    return str(path)


def _plan(tmp_path) -> Plan:
    strategy = Strategy(tp=2, micro_batch_size=4, global_batch_size=4, dtype="float32",
                        optimizer="sgd", annotation=ANNOTATION)
    return Plan(model=_mlp_with_reshapes(tmp_path / "mlp_reshape.pir"), cluster="cpu-local",
                strategy=strategy)


def test_completion_reshards_around_the_reshape(tmp_path):
    """The plan really has the layout change: the first reshape reads an all_gather of the
    column-split product, and the grad of that reshape reads x as the [4, 8] shard while
    its result is the replicated [4, 16] gradient."""
    prog = build_program(_plan(tmp_path)).program
    first = next(op for op in prog.ops if op.type == "reshape")
    assert first.operands[0].op.type == "all_gather"
    grads = [op for op in prog.ops if op.type == "reshape_grad"]
    moved = [op for op in grads if op.operands[0].dist_attr != op.results[0].dist_attr]
    assert len(moved) == 1
    g = moved[0]
    assert g.operands[0].dist_attr.dims_mapping == (-1, 1)  # x: the column shard
    assert g.results[0].dist_attr.dims_mapping == (-1, -1)  # x@GRAD: replicated


@pytest.mark.distributed
def test_verify_passes_when_completion_reshards_around_a_reshape(tmp_path):
    from meshplan.validation import verify

    r = verify(_plan(tmp_path), 2, steps=2)
    assert r.ok, r.summary()
    assert sorted(r.param_errors) == ["parameter_0", "parameter_1"]
    assert len(r.losses) == 2 and r.losses[1] != r.losses[0]


# -- each grad kernel shapes its results by its own result types ------------------------


def _ctx(*shapes):
    return KernelContext(out_types=tuple(None if s is None else TensorType(s, "float32") for s in shapes))


def test_reshape_grad_uses_its_result_type_not_the_forward_block():
    x_block = torch.zeros(4, 8)  # x as Shard(1) of a [4, 16] tensor
    g = torch.arange(64.0).reshape(8, 8)  # out@GRAD replicated [8, 8]
    (dx,) = get_kernel("reshape_grad")([x_block, g], {}, _ctx((4, 16)))
    assert dx.shape == (4, 16) and torch.equal(dx, g.reshape(4, 16))
    (dx,) = get_kernel("reshape_grad")([x_block, g.reshape(4, 16)[:, :8].reshape(8, 4)], {}, _ctx())
    assert dx.shape == (4, 8)  # no local types: the forward block's shape


def test_add_and_subtract_grads_unbroadcast_to_their_result_types():
    x_block, y = torch.zeros(2, 6), torch.zeros(6)  # x's block is a Shard(0) half
    g = torch.ones(4, 6)  # out@GRAD and x@GRAD replicated
    for op, sign in (("add_grad", 1), ("subtract_grad", -1)):
        dx, dy = get_kernel(op)([x_block, y, g], {}, _ctx((4, 6), (6,)))
        assert dx.shape == (4, 6) and dy.shape == (6,)
        assert torch.equal(dy, sign * torch.full((6,), 4.0))


def test_sum_and_mean_grads_broadcast_to_their_result_types():
    x_block = torch.zeros(2, 6)
    g = torch.tensor(3.0)
    (dx,) = get_kernel("sum_grad")([x_block, g], {"axis": [], "keepdim": False}, _ctx((4, 6)))
    assert dx.shape == (4, 6) and torch.all(dx == 3.0)
    ctx = KernelContext(out_types=(TensorType((4, 6), "float32"),), in_global=((4, 6), ()))
    (dx,) = get_kernel("mean_grad")([x_block, g], {"axis": [], "keepdim": False}, ctx)
    assert dx.shape == (4, 6) and torch.allclose(dx, torch.full((4, 6), 3.0 / 24))


def test_slice_and_concat_grads_use_their_result_types():
    g = torch.ones(4, 2)
    (dx,) = get_kernel("slice_grad")([torch.zeros(2, 6), g], {"axes": [1], "starts": [0], "ends": [2]},
                                     _ctx((4, 6)))
    assert dx.shape == (4, 6) and dx[:, :2].sum() == 8 and dx[:, 2:].sum() == 0
    xs = [torch.zeros(4, 1), torch.zeros(4, 1)]  # forward blocks of another layout
    outs = get_kernel("concat_grad")([*xs, torch.ones(4, 6)], {"axis": 1}, _ctx((4, 2), (4, 4)))
    assert [tuple(o.shape) for o in outs] == [(4, 2), (4, 4)]


def test_matmul_grad_shapes_by_its_result_types():
    x, y, g = torch.ones(4, 8), torch.ones(8, 6), torch.ones(4, 6)
    dx, dy = get_kernel("matmul_grad")([x, y, g], {}, _ctx((4, 8), (8, 6)))
    assert dx.shape == (4, 8) and dy.shape == (8, 6)

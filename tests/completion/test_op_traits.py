"""Op traits declared in the op registry (``completion.ops``): hand-known facts (Paddle's
``backward.yaml`` ``no_need_buffer`` for the buffers), consistency of every declaration,
and the models reading them (cost model, memory model, weight tracing)."""

from __future__ import annotations

from typing import get_args

import pytest

from completion import append_backward, build_model
from completion.ir import Operation, OpRole, Program
from completion.models.builder import ProgramBuilder
from completion.ops import (
    FOREIGN_TRAITS,
    OP_REGISTRY,
    UNKNOWN_TRAITS,
    KernelKind,
    OpError,
    OpTraits,
    PatternRole,
    get_opdef,
    op_traits,
    register_traits,
)
from completion.ops.declare import defop
from simulator import memory as mem
from simulator.op_cost import no_kernel, op_cost, rule_for
from simulator.op_signature import op_signature, param_root

ALL_TRAITS = {**FOREIGN_TRAITS, **OP_REGISTRY}


def _operand_index(op_type: str, name: str) -> int:
    od = get_opdef(op_type)
    assert od is not None
    return od.operands.index(name)


# -- hand-known facts ---------------------------------------------------------------------
def test_views_launch_no_kernel_and_their_grads_read_only_the_shape_of_x():
    for t in ("reshape", "squeeze", "unsqueeze"):
        assert op_traits(t).view and op_traits(t).kernel is None
        g = op_traits(f"{t}_grad")
        assert g.kernel is None and not g.view  # it reshapes out@GRAD, not operand 0
        assert g.no_need_buffer == {_operand_index(f"{t}_grad", "x")}
    assert not op_traits("transpose").view and op_traits("transpose").kernel == "memory"


def test_matmul_grad_reads_x_y_and_dout():
    od = get_opdef("matmul_grad")
    assert od is not None and od.operands == ("x", "y", "out@GRAD")
    assert od.no_need_buffer == frozenset() and od.kernel == "gemm"
    assert op_traits("matmul").kernel == "gemm"


@pytest.mark.parametrize("grad, unread", [
    ("layer_norm_grad", {"bias"}),  # backward.yaml: no_need_buffer : bias
    ("add_grad", {"x", "y"}),
    ("subtract_grad", {"x", "y"}),
    ("embedding_grad", {"weight"}),
    ("cast_grad", {"x"}),
    ("slice_grad", {"input"}),
    ("mean_grad", {"x"}),
    ("sum_grad", {"x"}),
    ("multiply_grad", set()),
    ("rms_norm_grad", set()),
    ("flash_attention_grad", set()),
])
def test_no_need_buffer_follows_paddle_backward_yaml(grad, unread):
    od = get_opdef(grad)
    assert od is not None
    assert {od.operands[i] for i in od.no_need_buffer} == unread
    if grad == "layer_norm_grad":
        assert 2 in od.no_need_buffer and od.operands[2] == "bias"


def test_optimizer_ops():
    for t in ("sgd_", "adam_", "adamw_", "pd_op.adamw_"):
        assert op_traits(t).optimizer
    for t in ("momentum_", "lamb_"):  # known by traits only
        assert op_traits(t).optimizer and get_opdef(t) is None
    assert not op_traits("matmul").optimizer and not op_traits("add_n").optimizer


def test_weights_pass_through_cast_and_reshard():
    for t in ("cast", "reshard"):
        assert op_traits(t).weight_passthrough and op_traits(t).weight_alias
    for t in ("transpose", "reshape", "all_gather", "assign"):
        assert op_traits(t).weight_passthrough and not op_traits(t).weight_alias
    for t in ("matmul", "squeeze", "all_reduce", "scale", "cast_grad"):
        assert not op_traits(t).weight_passthrough


def test_flash_attention_is_an_attention_core():
    fa = op_traits("flash_attention")
    assert fa.attention_core and fa.kernel == "attention" and fa.pattern_role == "attention"
    g = op_traits("flash_attention_grad")
    assert g.attention_core and g.kernel == "attention" and g.pattern_role is None
    for t in ("softmax", "dropout", "scale", "matmul"):  # unfused attention
        assert op_traits(t).attention_core and op_traits(f"{t}_grad").attention_core
    for t in ("log_softmax", "layer_norm", "add", "gelu"):
        assert not op_traits(t).attention_core


def test_inputs_and_other_kernel_free_ops():
    assert op_traits("data").input and op_traits("parameter").input
    for t in ("full", "shadow_output", "reshard", "builtin.combine", "pd_op.assign"):
        assert op_traits(t).kernel is None and not op_traits(t).input
    assert op_traits("full_like").kernel == "memory"


def test_pattern_roles():
    expect = {
        "matmul": "matmul", "linear": "matmul", "flash_attention": "attention",
        "scaled_dot_product_attention": "attention", "layer_norm": "norm", "rms_norm": "norm",
        "cross_entropy_with_softmax": "loss", "softmax_with_cross_entropy": "loss",
        "embedding": "embedding", "gelu": "activation", "silu": "activation",
        "swiglu": "activation", "multiply": "activation", "reshape": "passthrough",
        "transpose": "passthrough", "fused_rotary_position_embedding": "passthrough",
        "cast": "passthrough", "concat": "passthrough", "exp": None, "add": None,
        "squeeze": None, "matmul_grad": None, "layer_norm_grad": None,
    }
    assert {t: op_traits(t).pattern_role for t in expect} == expect


def test_lookup_by_prefixed_type_and_unknown_types():
    assert op_traits("pd_op.reshape") is get_opdef("reshape")
    assert op_traits("dist_op.reshard") is get_opdef("reshard")
    assert op_traits("no_such_op") is UNKNOWN_TRAITS
    assert UNKNOWN_TRAITS == OpTraits() and UNKNOWN_TRAITS.kernel == "memory"
    for t in FOREIGN_TRAITS:
        assert get_opdef(t) is None


def test_registration_errors_leave_the_registry_unchanged():
    with pytest.raises(OpError, match="twice"):
        register_traits("matmul", OpTraits())
    with pytest.raises(OpError, match="twice"):
        register_traits("pd_op.assign", OpTraits())
    with pytest.raises(OpError, match="no_need_buffer"):
        defop("_traits_test_op", ("x",), ("out",), lambda ts, a: [ts[0]],
              grad_inputs=("x", "out@GRAD"), no_need_buffer=("y",))
    assert "_traits_test_op" not in OP_REGISTRY and "_traits_test_op_grad" not in OP_REGISTRY
    with pytest.raises(OpError, match="variadic"):
        defop("_traits_test_cat", ("x",), ("out",), lambda ts, a: [ts[0]], variadic=True,
              grad_inputs=("x", "out@GRAD"), no_need_buffer=("x",))
    assert "_traits_test_cat" not in OP_REGISTRY


# -- consistency of every declaration -----------------------------------------------------
@pytest.mark.parametrize("name", sorted(ALL_TRAITS))
def test_every_op_has_consistent_traits(name):
    t = ALL_TRAITS[name]
    assert t.kernel is None or t.kernel in get_args(KernelKind)
    assert t.pattern_role is None or t.pattern_role in get_args(PatternRole)
    if t.view:
        assert t.kernel is None, "a view launches no kernel"
    if t.input:
        assert t.kernel is None and not t.view
    if t.weight_alias:
        assert t.weight_passthrough, "weight_alias implies weight_passthrough"
    if t.optimizer:
        assert t.kernel == "memory" and t.pattern_role is None and not t.view
    if t.pattern_role == "attention":
        assert t.attention_core and t.kernel == "attention"
    if t.pattern_role == "matmul":
        assert t.kernel == "gemm"
    od = OP_REGISTRY.get(name)
    if od is None:
        return
    if od.input:
        assert not od.operands and od.grad is None
    if od.view or od.weight_passthrough:
        assert od.operands, "a view / passthrough reads its first operand"
    if od.no_need_buffer:
        assert od.forward is not None, "no_need_buffer is a trait of grad ops"
        assert max(od.no_need_buffer) < len(od.operands)
        assert not any(od.operands[i].endswith("@GRAD") for i in od.no_need_buffer), \
            "an incoming gradient is always read"
    if od.forward is not None:  # grad ops derive their traits from the forward op
        fwd = get_opdef(od.forward)
        assert fwd is not None
        assert od.kernel == fwd.kernel and od.attention_core == fwd.attention_core
        assert not (od.view or od.input or od.optimizer or od.weight_passthrough
                    or od.weight_alias) and od.pattern_role is None


# -- the models read the traits -----------------------------------------------------------
def test_cost_model_kernels_agree_with_declared_kernel_kinds():
    prog = build_model("llama2-7b", batch_size=1, seq_len=64, num_layers=1)
    append_backward(prog)
    seen = set()
    for op in prog.ops:
        t = op_traits(op.type)
        kernels = op_cost(op_signature(op))
        seen.add(op.type)
        if t.kernel is None:
            assert kernels == () and rule_for(op.type) is no_kernel, op.type
        else:
            assert kernels and {k.kind for k in kernels} == {t.kernel}, op.type
    assert {"matmul_grad", "flash_attention_grad", "reshape_grad", "rms_norm"} <= seen


def _weight_chain() -> tuple[Program, dict[str, object]]:
    pb = ProgramBuilder(dtype="float32")
    w = pb.param("lin", "weight", [8, 4])
    c = pb.op1("cast", [w], {"dtype": "bfloat16"})
    t = pb.op1("transpose", [c], {"perm": [1, 0]})
    r = pb.op1("relu", [w])
    return pb.program, {"w": w, "cast": c, "transpose": t, "relu": r}


def test_param_root_follows_passthrough_and_alias_traits():
    _, v = _weight_chain()
    assert param_root(v["cast"]) is v["w"] and param_root(v["transpose"]) is v["w"]
    assert param_root(v["cast"], alias_only=True) is v["w"]
    assert param_root(v["transpose"], alias_only=True) is None
    assert param_root(v["relu"]) is None


def test_is_attention_core_uses_traits_role_and_struct_name():
    pb = ProgramBuilder(dtype="float32")
    q = pb.data("q", [2, 4, 8], "float32")
    k = pb.data("k", [2, 4, 8], "float32")
    s = pb.op1("matmul", [q, k], {"transpose_y": True}, "model.layers.0.self_attn")
    p = pb.op1("softmax", [s], {"axis": -1}, "model.layers.0.self_attn")
    w = pb.param("model.layers.0.self_attn", "o", [4, 4])
    o = pb.op1("matmul", [p, w], None, "model.layers.0.self_attn")
    pb.op1("relu", [o], None, "model.layers.0.self_attn")
    ops = {(op.type, i): op for i, op in enumerate(pb.program.ops)}
    core = [op.type for op in pb.program.ops if mem.is_attention_core(op)]
    assert core == ["matmul", "softmax"]  # the projection reads a parameter; relu is no core
    mm = next(op for (t, _), op in ops.items() if t == "matmul")
    moved = Operation(mm.type, mm.operands, [], mm.attrs, role=OpRole.FORWARD,
                      struct_name="model.layers.0.mlp")
    assert not mem.is_attention_core(moved)
    bwd = Operation("matmul", mm.operands, [], mm.attrs, role=OpRole.BACKWARD,
                    struct_name=mm.struct_name)
    assert not mem.is_attention_core(bwd)  # a forward type in backward is not the core's grad


def test_no_need_buffer_keeps_layer_norm_bias_input_out_of_saved_activations():
    pb = ProgramBuilder(dtype="float32")
    x = pb.data("x", [4, 16], "float32")
    w = pb.param("ln", "w", [16, 16])
    h = pb.op1("matmul", [x, w], None, "ln")
    bias = pb.data("bias_in", [16], "float32")
    b = pb.op1("cast", [bias], {"dtype": "float32"}, "ln")  # an activation as the bias
    y = pb.op1("layer_norm", [h, None, b], {"begin_norm_axis": 1}, "ln")
    loss = pb.op1("mean", [y], None, "loss")
    pb.op("shadow_output", [loss], {"output_name": "loss"}, "loss")
    prog = pb.program
    append_backward(prog)
    roots, _, _ = mem._saved_roots(prog)
    saved = {id(v) for v in roots.values()}
    ln_grad = next(op for op in prog.ops if op.type == "layer_norm_grad")
    assert ln_grad.operands[2] is b  # the grad op does get the bias value ...
    assert id(h) in saved  # ... x of layer_norm_grad is read
    assert id(b) not in saved  # ... but not the bias: backward.yaml no_need_buffer


def test_fusion_and_gradient_flow_traits():
    # Inductor leaves gathers / scatter-adds as their own kernels; the grad inherits it
    assert not op_traits("embedding").fusable and not op_traits("embedding_grad").fusable
    assert op_traits("rms_norm").fusable and op_traits("rms_norm_grad").fusable
    # dropout's mask is random: a fused backward cannot recompute it; its grad is deterministic
    assert op_traits("dropout").random and not op_traits("dropout_grad").random
    assert not op_traits("scale").random
    # sums and casts pass gradients through; subtract and multiply do not just sum
    assert [t for t in ("add", "add_n", "cast", "subtract", "multiply", "add_grad")
            if op_traits(t).gradient_sum] == ["add", "add_n", "cast"]


def test_shape_only_grad_operands_come_from_no_need_buffer():
    from completion.spmd.rule import get_spmd_rule

    def shape_only(grad_type, shapes):
        rule = get_spmd_rule(grad_type)
        return sorted(rule.make_notation(shapes, [None] * 2, {}).shape_only)

    # add_grad(x, y, dout): x and y are read for their shapes only
    assert shape_only("add_grad", [(4, 8), (4, 8), (4, 8)]) == [0, 1]
    # cast_grad(x, dout): x only for its shape (the gradient is dout re-typed)
    assert shape_only("cast_grad", [(4, 8), (4, 8)]) == [0]
    # matmul_grad reads x and y: nothing is shape-only
    assert shape_only("matmul_grad", [(4, 8), (8, 16), (4, 16)]) == []

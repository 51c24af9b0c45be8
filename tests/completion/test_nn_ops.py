"""nn op declarations (completion/ops/nn.py): shape inference against torch, errors that
name the op and the shapes, grad ops through append_backward, PIR round trip."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from completion import build_model, parse_program, print_program
from completion.backward import append_backward
from completion.ir import Program
from completion.ops.registry import OpError, TensorType, get_opdef

BF = "bfloat16"


def _prog() -> Program:
    return Program()


def _data(p: Program, shape, dtype="float32", name=None):
    return p.add("data", [], {"shape": list(shape), "dtype": dtype, "name": name or "x"},
                 names=[name], stop_gradient=True).results[0]


def _param(p: Program, shape, name):
    return p.add("parameter", [], {"shape": list(shape), "dtype": "float32", "parameter_name": name},
                 names=[name], is_parameter=True, persistable=True).results[0]


def test_flash_attention_gqa_shapes_match_torch_sdpa():
    b, s, hq, hkv, d = 2, 5, 8, 2, 4
    q, k, v = torch.randn(b, hq, s, d), torch.randn(b, hkv, s, d), torch.randn(b, hkv, s, d)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    od = get_opdef("flash_attention")
    out, sm, lse, seed = od.infer([TensorType((b, s, hq, d)), TensorType((b, s, hkv, d)),
                                   TensorType((b, s, hkv, d))], dict(od.attrs))
    assert out.shape == tuple(ref.transpose(1, 2).shape) and sm is None
    assert lse == TensorType((b, hq, s), "float32") and seed == TensorType((2,), "int64")


def test_layer_norm_rms_norm_embedding_cross_entropy_shapes():
    x = TensorType((3, 4, 6), BF)
    out, mean, var = get_opdef("layer_norm").infer([x, TensorType((6,), BF), TensorType((6,), BF)],
                                                   {"begin_norm_axis": 2})
    assert out == x and mean == var == TensorType((12,), "float32")
    out, inv = get_opdef("rms_norm").infer([x, TensorType((6,), BF)], {"begin_norm_axis": -1})
    assert out == x and inv == TensorType((12,), "float32")
    ids, table = torch.zeros(3, 4, dtype=torch.long), torch.randn(10, 6)
    (emb,) = get_opdef("embedding").infer([TensorType((3, 4), "int64"), TensorType((10, 6), BF)], {})
    assert emb == TensorType(tuple(F.embedding(ids, table).shape), BF)
    sm, loss = get_opdef("cross_entropy_with_softmax").infer(
        [TensorType((3, 4, 10), BF), TensorType((3, 4, 1), "int64")], {"axis": -1})
    assert sm == TensorType((3, 4, 10), BF) and loss == TensorType((3, 4, 1), BF)
    (half,) = get_opdef("swiglu").infer([TensorType((3, 8)), None], {})
    assert half.shape == (3, 4)


@pytest.mark.parametrize("op,types,attrs,needle", [
    ("flash_attention", [(2, 5, 6, 4), (2, 5, 4, 4), (2, 5, 4, 4)], {}, "not a multiple of k/v heads 4"),
    # v may have its own head size (multi-head latent attention), not its own sequence
    ("flash_attention", [(2, 5, 8, 4), (2, 5, 2, 4), (2, 6, 2, 8)], {}, "differ in batch, seq or heads"),
    ("layer_norm", [(3, 4, 6), (5,), None], {"begin_norm_axis": 2}, r"scale \[5\]"),
    ("rms_norm", [(3, 4, 6), (6,)], {"begin_norm_axis": 3}, "begin_norm_axis 3 is out of range"),
    ("swiglu", [(3, 8), (3, 4)], {}, "same shape"),
    ("fused_rotary_position_embedding", [(2, 5, 4, 3), None, None, None, None, None], {}, "head_dim 3"),
])
def test_bad_shapes_name_the_problem(op, types, attrs, needle):
    tt = [TensorType(t) if t is not None else None for t in types]
    with pytest.raises(OpError, match=needle):
        get_opdef(op).infer(tt, {**get_opdef(op).attrs, **attrs})


def test_dtype_errors_and_op_name_in_program_add():
    p = _prog()
    x = _data(p, (3, 4), "float32", "ids")
    w = _param(p, (10, 6), "w")
    with pytest.raises(OpError, match=r"pd_op.embedding \[embed\]: x must be an integer tensor"):
        p.add("embedding", [x, w], struct_name="embed")
    logits = _data(p, (3, 10), "float32", "logits")
    with pytest.raises(OpError, match=r"label \[3\] must be \[3, 1\]"):
        p.add("cross_entropy_with_softmax", [logits, _data(p, (3,), "int64", "lab")])


def test_grad_ops_give_every_parameter_a_gradient_of_its_type():
    for name in ("llama2-70b", "gpt3-175b"):
        p = build_model(name, 2, seq_len=8, num_layers=2, dtype=BF)
        pairs = append_backward(p)
        p.validate()
        assert len(pairs) == len(p.parameters())
        for param, grad in pairs:
            assert grad.type == param.type, (param.name, grad.type)
            assert grad.name.startswith(param.name + "@GRAD")
        # sin/cos, ids and labels (stop_gradient) get no gradient
        for op in p.ops:
            if op.type in ("fused_rotary_position_embedding_grad", "cross_entropy_with_softmax_grad",
                           "embedding_grad"):
                fwd = get_opdef(op.type.removesuffix("_grad"))
                nulls = [n for n, r in zip(fwd.operands, op.results, strict=True) if r is None]
                assert nulls == {"fused_rotary_position_embedding_grad": ["v?", "sin?", "cos?", "position_ids?"],
                                 "cross_entropy_with_softmax_grad": ["label"],
                                 "embedding_grad": ["x"]}[op.type]


def test_flash_attention_grad_operands_follow_paddle_order():
    p = build_model("llama2-7b", 1, seq_len=8, num_layers=1)
    append_backward(p)
    fwd = next(op for op in p.ops if op.type == "flash_attention")
    g = next(op for op in p.ops if op.type == "flash_attention_grad")
    out, _, lse, seed = fwd.results
    assert g.operands[:6] == [*fwd.operands, out, lse, seed]
    assert g.operands[6].name is None and g.operands[6].shape == out.shape
    assert [r.shape for r in g.results] == [v.shape for v in fwd.operands]


def test_forward_and_backward_round_trip_through_pir_text():
    for name in ("llama2-7b", "gpt3-175b"):
        p = build_model(name, 2, seq_len=8, num_layers=1)
        append_backward(p)
        text = print_program(p)
        assert print_program(parse_program(text)) == text

"""GPT as Megatron-LM 2021 ran it (Narayanan et al. 2021; Korthikanti et
al. 2022, fig. 2): unfused attention (QK^T, scale, softmax, dropout, x V) and dropout
(p = 0.1) after the attention and MLP blocks. The built-in GPT builder uses flash attention
without dropout, so the published activation formula and Table 1 throughputs, measured on
this older architecture, are checked on programs built here (tests/test_memory.py,
tests/test_engine_cost.py, experiments/megatron_table1.py)."""

from __future__ import annotations

import math

from completion import append_backward
from completion.ir import Program, Value
from completion.models.builder import ProgramBuilder


def _layer(pb: ProgramBuilder, x: Value, i: int, b: int, s: int, h: int, a: int) -> Value:
    d, pre = h // a, f"decoder.layers.{i}"
    att = f"{pre}.self_attn"

    def norm(v: Value, name: str) -> Value:
        w, bias = pb.param(f"{pre}.{name}", "weight", [h]), pb.param(f"{pre}.{name}", "bias", [h])
        return pb.op1("layer_norm", [v, w, bias], {"begin_norm_axis": 2}, f"{pre}.{name}")

    def heads(v: Value) -> Value:
        return pb.op1("transpose", [pb.reshape(v, [b, s, a, d], att)], {"perm": [0, 2, 1, 3]}, att)

    def dropout(v: Value, struct: str) -> Value:
        return pb.op1("dropout", [v, None], {"p": 0.1}, struct)

    ln1 = norm(x, "input_layernorm")
    q, k, v = (heads(pb.linear(ln1, h, h, f"{att}.{n}_proj", True)) for n in "qkv")
    sc = pb.op1("matmul", [q, k], {"transpose_x": False, "transpose_y": True}, att)
    sc = pb.op1("scale", [sc, None], {"scale": 1 / math.sqrt(d)}, att)
    sc = dropout(pb.op1("softmax", [sc], {"axis": -1}, att), att)
    ctx = pb.op1("matmul", [sc, v], {"transpose_x": False, "transpose_y": False}, att)
    ctx = pb.reshape(pb.op1("transpose", [ctx], {"perm": [0, 2, 1, 3]}, att), [b, s, h], att)
    x2 = pb.add(x, dropout(pb.linear(ctx, h, h, f"{att}.o_proj", True), pre), pre)
    y = pb.linear(norm(x2, "post_attention_layernorm"), h, 4 * h, f"{pre}.mlp.up_proj", True)
    y = pb.op1("gelu", [y], {"approximate": True}, f"{pre}.mlp.act")
    y = dropout(pb.linear(y, 4 * h, h, f"{pre}.mlp.down_proj", True), pre)
    return pb.add(x2, y, pre)


def megatron_layer(b: int, s: int, h: int, a: int) -> Program:
    """One layer on an input ``x`` [b, s, h], mean as the loss, backward appended."""
    pb = ProgramBuilder(dtype="bfloat16")
    x = pb.data("x", [b, s, h], "bfloat16")
    x.stop_gradient = False
    out = _layer(pb, x, 0, b, s, h, a)
    loss = pb.op1("mean", [out], {"axis": [], "keepdim": False}, "loss")
    append_backward(pb.program, loss)
    return pb.program


def megatron_gpt(b: int, s: int, h: int, a: int, vocab: int = 51200, layers: int = 1,
                 dtype: str = "float16") -> Program:
    """Embeddings (token + learned position), ``layers`` layers, final layer_norm, head
    tied to the token embedding, cross entropy; forward + backward."""
    pb = ProgramBuilder(dtype=dtype)
    ids = pb.data("input_ids", [b, s], "int64", "embed_tokens")
    labels = pb.data("labels", [b, s, 1], "int64", "loss")
    pos = pb.data("position_ids", [b, s], "int64", "embed_positions")
    wte = pb.param("embed_tokens", "weight", [vocab, h])
    wpe = pb.param("embed_positions", "weight", [s, h])
    x = pb.op1("embedding", [ids, wte], None, "embed_tokens")
    x = pb.add(x, pb.op1("embedding", [pos, wpe], None, "embed_positions"), "embed_positions")
    for i in range(layers):
        x = _layer(pb, x, i, b, s, h, a)
    w, bias = pb.param("decoder.norm", "weight", [h]), pb.param("decoder.norm", "bias", [h])
    x = pb.op1("layer_norm", [x, w, bias], {"begin_norm_axis": 2}, "decoder.norm")
    logits = pb.op1("matmul", [x, wte], {"transpose_x": False, "transpose_y": True}, "lm_head")
    res = pb.op("cross_entropy_with_softmax", [logits, labels], None, "loss")
    loss = pb.op1("mean", [res[1]], {"axis": [], "keepdim": False}, "loss")
    append_backward(pb.program, loss)
    return pb.program

"""Forward programs of decoder-only transformers: the GPT and LLaMA families.

GPT (Radford et al. 2019; Megatron-LM's GPT): token + learned position embeddings,
pre-LN layers with layer_norm (weight and bias), attention projections with biases, a GeLU
MLP ``h -> ffn -> h`` with biases, a final layer_norm, and an LM head tied to the token
embedding (or a separate ``[h, V]`` weight). Its parameter count is Megatron 2021 eq. 2 plus
the final layer_norm's 2h.

LLaMA (Touvron et al. 2023): token embedding, rms_norm, q/k/v/o projections without bias
and grouped-query attention (``num_kv_heads`` key/value heads), rotary position embedding
(``fused_rotary_position_embedding`` with sin/cos tables as inputs), a SwiGLU MLP
(``gate_proj``, ``up_proj``, ``swiglu``, ``down_proj``), a final rms_norm, an untied
``lm_head``.

Both end with ``cross_entropy_with_softmax`` over the vocabulary, a ``mean`` over tokens and
a ``shadow_output`` of the loss (role LOSS).

Attention (``attention`` of :func:`build_decoder`, :data:`ATTENTIONS`):

- ``flash``: one ``flash_attention`` op on q, k, v ``[b, s, heads, d]`` (causal; its
  ``dropout`` attribute is ``ModelConfig.attention_dropout``);
- ``unfused``: the reference composition as Megatron-LM 2021 and Hugging Face ``eager`` run
  it: q, k, v transposed to ``[b, heads, s, d]``, ``matmul(q, k, transpose_y)`` (a batched
  GEMM, inner dim d, writing the ``[b, heads, s, s]`` scores), ``scale`` by 1/sqrt(d),
  ``softmax``, ``dropout`` (when ``attention_dropout`` > 0), ``matmul`` with v, transposed
  back. Grouped-query attention groups the query heads as ``[b, kv_heads, group, s, d]``
  against k, v ``[b, kv_heads, 1, s, d]`` (batch dims broadcast; Hugging Face's
  ``repeat_kv`` without the copy). The causal mask is part of the softmax kernel
  (Megatron's ``scaled_upper_triang_masked_softmax`` generates it in the kernel and reads
  no mask tensor); the IR's ``softmax`` has no mask operand, so the executor runs this
  composition unmasked (costs and shapes are the causal kernel's).

Dropout (``ModelConfig.hidden_dropout`` > 0): a ``dropout`` on the embedding output
(Megatron's ``embedding_dropout``) and on each residual branch before its add (Megatron's
``bias_dropout_add``), under the struct name of the add.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from completion.ir import OpRole, Program, Value
from completion.models.builder import ProgramBuilder
from completion.models.config import ATTENTIONS, ModelConfig, ModelConfigError


def layer_struct(i: int) -> str:
    """Struct name prefix of decoder layer ``i``."""
    return f"decoder.layers.{i}"


def _dropout(pb: ProgramBuilder, x: Value, p: float, struct: str) -> Value:
    """``dropout(x)`` with probability ``p`` (Paddle's ``upscale_in_train``); ``x`` itself
    when ``p`` is 0."""
    if not p:
        return x
    attrs = {"p": float(p), "mode": "upscale_in_train", "is_test": False, "fix_seed": False, "seed": 0}
    return pb.op1("dropout", [x, None], attrs, struct)


def _heads_first(pb: ProgramBuilder, x: Value, struct: str) -> Value:
    """``[b, s, heads, d]`` -> ``[b, heads, s, d]``."""
    return pb.op1("transpose", [x], {"perm": [0, 2, 1, 3]}, struct)


def _unfused_core(pb: ProgramBuilder, cfg: ModelConfig, q: Value, k: Value, v: Value,
                  b: int, s: int, pre: str) -> Value:
    """QK^T, scale, softmax, dropout, x V on ``[b, s, heads, d]`` inputs (module docstring);
    returns ``[b, s, hq, d]``."""
    d, hq, hkv = cfg.head_dim, cfg.num_heads, cfg.num_kv_heads
    qt, kt, vt = (_heads_first(pb, t, pre) for t in (q, k, v))
    if hkv != hq:  # GQA: query heads grouped per key/value head, batch dims broadcast
        g = hq // hkv
        qt = pb.reshape(qt, [b, hkv, g, s, d], pre)
        kt = pb.reshape(kt, [b, hkv, 1, s, d], pre)
        vt = pb.reshape(vt, [b, hkv, 1, s, d], pre)
    sc = pb.op1("matmul", [qt, kt], {"transpose_x": False, "transpose_y": True}, pre)
    sc = pb.op1("scale", [sc, None], {"scale": 1.0 / math.sqrt(d), "bias": 0.0,
                                      "bias_after_scale": True}, pre)
    probs = _dropout(pb, pb.op1("softmax", [sc], {"axis": -1}, pre), cfg.attention_dropout, pre)
    ctx = pb.op1("matmul", [probs, vt], {"transpose_x": False, "transpose_y": False}, pre)
    if hkv != hq:
        ctx = pb.reshape(ctx, [b, hq, s, d], pre)
    return _heads_first(pb, ctx, pre)


def _attention(pb: ProgramBuilder, cfg: ModelConfig, x: Value, i: int, b: int, s: int,
               rope: tuple[Value, Value] | None, attention: str) -> Value:
    """q/k/v projections, optional rotary embedding, causal attention (flash or unfused),
    o_proj."""
    h, d = cfg.hidden_size, cfg.head_dim
    hq, hkv = cfg.num_heads, cfg.num_kv_heads
    pre = f"{layer_struct(i)}.self_attn"
    bias = FAMILIES[cfg.family].bias
    q = pb.linear(x, h, hq * d, f"{pre}.q_proj", bias)
    k = pb.linear(x, h, hkv * d, f"{pre}.k_proj", bias)
    v = pb.linear(x, h, hkv * d, f"{pre}.v_proj", bias)
    q = pb.reshape(q, [b, s, hq, d], pre)
    k = pb.reshape(k, [b, s, hkv, d], pre)
    v = pb.reshape(v, [b, s, hkv, d], pre)
    if rope is not None:
        sin, cos = rope
        attrs = {"use_neox_rotary_style": True, "time_major": False, "rotary_emb_base": cfg.rope_theta}
        res = pb.op("fused_rotary_position_embedding", [q, k, None, sin, cos, None], attrs, pre)
        q, k = res[0], res[1]  # type: ignore[assignment]
    if attention == "unfused":
        out = _unfused_core(pb, cfg, q, k, v, b, s, pre)
    else:
        out = pb.op1("flash_attention", [q, k, v],
                     {"dropout": float(cfg.attention_dropout), "causal": True,
                      "return_softmax": False, "is_test": False}, pre)
    out = pb.reshape(out, [b, s, hq * d], pre)
    return pb.linear(out, hq * d, h, f"{pre}.o_proj", bias)


def _layer_norm(pb: ProgramBuilder, cfg: ModelConfig, x: Value, struct: str) -> Value:
    """layer_norm with weight and bias over the last dim (GPT)."""
    w = pb.param(struct, "weight", [cfg.hidden_size])
    bias = pb.param(struct, "bias", [cfg.hidden_size])
    attrs = {"epsilon": cfg.norm_eps, "begin_norm_axis": x.ndim - 1}
    return pb.op1("layer_norm", [x, w, bias], attrs, struct)


def _rms_norm(pb: ProgramBuilder, cfg: ModelConfig, x: Value, struct: str) -> Value:
    """rms_norm with weight over the last dim (LLaMA)."""
    w = pb.param(struct, "weight", [cfg.hidden_size])
    return pb.op1("rms_norm", [x, w], {"epsilon": cfg.norm_eps, "begin_norm_axis": x.ndim - 1}, struct)


def _gelu_mlp(pb: ProgramBuilder, cfg: ModelConfig, x: Value, i: int) -> Value:
    """up_proj (+bias), gelu, down_proj (+bias) (GPT)."""
    h, f = cfg.hidden_size, cfg.ffn_hidden_size
    pre = f"{layer_struct(i)}.mlp"
    y = pb.linear(x, h, f, f"{pre}.up_proj", True)
    y = pb.op1("gelu", [y], {"approximate": False}, f"{pre}.act")
    return pb.linear(y, f, h, f"{pre}.down_proj", True)


def _swiglu_mlp(pb: ProgramBuilder, cfg: ModelConfig, x: Value, i: int) -> Value:
    """gate_proj, up_proj, swiglu, down_proj, no biases (LLaMA)."""
    h, f = cfg.hidden_size, cfg.ffn_hidden_size
    pre = f"{layer_struct(i)}.mlp"
    gate = pb.linear(x, h, f, f"{pre}.gate_proj", False)
    up = pb.linear(x, h, f, f"{pre}.up_proj", False)
    y = pb.op1("swiglu", [gate, up], None, f"{pre}.act")
    return pb.linear(y, f, h, f"{pre}.down_proj", False)


def _layer(pb: ProgramBuilder, cfg: ModelConfig, x: Value, i: int, b: int, s: int,
           rope: tuple[Value, Value] | None, attention: str) -> Value:
    pre, fam = layer_struct(i), FAMILIES[cfg.family]
    a = _attention(pb, cfg, fam.norm(pb, cfg, x, f"{pre}.input_layernorm"), i, b, s, rope, attention)
    x = pb.add(x, _dropout(pb, a, cfg.hidden_dropout, pre), pre)
    m = fam.mlp(pb, cfg, fam.norm(pb, cfg, x, f"{pre}.post_attention_layernorm"), i)
    return pb.add(x, _dropout(pb, m, cfg.hidden_dropout, pre), pre)


def _head_and_loss(pb: ProgramBuilder, cfg: ModelConfig, x: Value, wte: Value, labels: Value) -> Value:
    x = FAMILIES[cfg.family].norm(pb, cfg, x, "decoder.norm")
    h, vocab = cfg.hidden_size, cfg.vocab_size
    if cfg.tie_word_embeddings:
        logits = pb.op1("matmul", [x, wte], {"transpose_x": False, "transpose_y": True}, "lm_head")
    else:
        logits = pb.linear(x, h, vocab, "lm_head", False)
    pb.role = OpRole.LOSS
    res = pb.op("cross_entropy_with_softmax", [logits, labels], None, "loss")
    loss = pb.op1("mean", [res[1]], {"axis": [], "keepdim": False}, "loss")
    pb.op("shadow_output", [loss], {"output_name": "loss_0"}, "loss")
    pb.role = OpRole.FORWARD
    return loss


def _learned_positions(pb: ProgramBuilder, cfg: ModelConfig, x: Value, b: int, s: int
                       ) -> tuple[Value, tuple[Value, Value] | None]:
    """x + embedding(position_ids, embed_positions.weight [seq_len, h]) (GPT)."""
    pos = pb.data("position_ids", [b, s], "int64", "embed_positions")
    wpe = pb.param("embed_positions", "weight", [cfg.seq_len, cfg.hidden_size])
    p = pb.op1("embedding", [pos, wpe], {"padding_idx": -1, "sparse": False}, "embed_positions")
    return pb.add(x, p, "embed_positions"), None


def _rope_tables(pb: ProgramBuilder, cfg: ModelConfig, x: Value, b: int, s: int
                 ) -> tuple[Value, tuple[Value, Value] | None]:
    """sin/cos tables [1, s, 1, head_dim] as inputs of every rotary op (LLaMA)."""
    d = cfg.head_dim
    sin = pb.data("rotary_emb.sin", [1, s, 1, d], pb.dtype, "rotary_emb")
    cos = pb.data("rotary_emb.cos", [1, s, 1, d], pb.dtype, "rotary_emb")
    return x, (sin, cos)


@dataclass(frozen=True)
class Family:
    """What differs between the families: norm, MLP, linear biases, position encoding."""

    norm: Callable[[ProgramBuilder, ModelConfig, Value, str], Value]
    mlp: Callable[[ProgramBuilder, ModelConfig, Value, int], Value]
    bias: bool
    positions: Callable[[ProgramBuilder, ModelConfig, Value, int, int],
                        tuple[Value, tuple[Value, Value] | None]]


#: family name -> its layer pieces
FAMILIES: dict[str, Family] = {
    "gpt": Family(_layer_norm, _gelu_mlp, True, _learned_positions),
    "llama": Family(_rms_norm, _swiglu_mlp, False, _rope_tables),
}


def build_decoder(cfg: ModelConfig, batch_size: int, seq_len: int, dtype: str,
                  attention: str | None = None) -> Program:
    """The forward program of ``cfg`` for ``batch_size`` sequences of ``seq_len`` tokens.

    Inputs (data ops): ``input_ids`` [b, s] int64, ``labels`` [b, s, 1] int64, and
    ``position_ids`` [b, s] int64 (GPT) or ``rotary_emb.sin`` / ``rotary_emb.cos``
    [1, s, 1, head_dim] (LLaMA). ``attention``: ``flash`` or ``unfused`` (module
    docstring); None: ``cfg.attention``, else flash. Returns the program; its loss is the
    scalar result of the ``mean`` op with role LOSS, also exported by ``shadow_output`` as
    ``loss_0``. Raises ModelConfigError for an unknown ``attention``.
    """
    attention = attention or cfg.attention or "flash"
    if attention not in ATTENTIONS:
        raise ModelConfigError(f"model {cfg.name!r}: attention {attention!r} is not one of {list(ATTENTIONS)}")
    pb = ProgramBuilder(dtype=dtype)
    b, s = batch_size, seq_len
    ids = pb.data("input_ids", [b, s], "int64", "embed_tokens")
    labels = pb.data("labels", [b, s, 1], "int64", "loss")
    h = cfg.hidden_size
    wte = pb.param("embed_tokens", "weight", [cfg.vocab_size, h])
    x = pb.op1("embedding", [ids, wte], {"padding_idx": -1, "sparse": False}, "embed_tokens")
    x, rope = FAMILIES[cfg.family].positions(pb, cfg, x, b, s)
    x = _dropout(pb, x, cfg.hidden_dropout, "embed_positions" if rope is None else "embed_tokens")
    for i in range(cfg.num_layers):
        x = _layer(pb, cfg, x, i, b, s, rope, attention)
    _head_and_loss(pb, cfg, x, wte, labels)
    pb.program.renumber()
    return pb.program

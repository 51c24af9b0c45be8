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

Every piece is a field of :class:`ModelConfig` with the family's default
(``completion.models.config.FAMILIES``), so the Hugging Face architectures of
``completion.models.hf_types`` build from the same code: the norm (``NORM_BUILDERS``) and
its placement (pre, post as OLMo 2, sandwich as Gemma 2), the positions
(``POSITION_BUILDERS``), the MLP activation (``UNARY_ACTIVATIONS``; gated MLPs multiply
the activated gate by the up projection, SwiGLU stays the one ``swiglu`` op; squared ReLU
is ``relu`` then ``square``), biases per linear group, an explicit head dim
(``kv_channels``), q/k rms_norm (per head or over all channels) and a per-layer sliding
window (the ``sliding_window`` attribute of ``flash_attention``; the unfused composition
keeps its dense scores, as a masked eager softmax computes them).

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

from completion.ir import OpRole, Program, Value
from completion.models.builder import ProgramBuilder
from completion.models.config import (
    ACTIVATIONS,
    ATTENTIONS,
    ModelConfig,
    ModelConfigError,
)
from completion.models.mla import mla_qkv
from completion.models.moe import moe_mlp


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
        ctx = pb.reshape(ctx, [b, hq, s, cfg.value_head_dim], pre)
    return _heads_first(pb, ctx, pre)


def _qk_norm(pb: ProgramBuilder, cfg: ModelConfig, t: Value, width: int, struct: str) -> Value:
    """rms_norm of q or k over its last dim (``width``: d per head, or heads * d)."""
    w = pb.param(struct, "weight", [width])
    return pb.op1("rms_norm", [t, w], {"epsilon": cfg.norm_eps, "begin_norm_axis": t.ndim - 1}, struct)


def _gqa_qkv(pb: ProgramBuilder, cfg: ModelConfig, x: Value, pre: str, b: int, s: int,
             rope: tuple[Value, Value] | None) -> tuple[Value, Value, Value]:
    """q/k/v projections (biases per ``cfg.bias("qkv")``), optional q/k norm
    (``cfg.qk_norm``: ``full`` on the projections, ``head`` per head) and optional rotary
    embedding: q ``[b, s, hq, d]``, k and v ``[b, s, hkv, d]``."""
    h, d = cfg.hidden_size, cfg.head_dim
    hq, hkv = cfg.num_heads, cfg.num_kv_heads
    bias = cfg.bias("qkv")
    q = pb.linear(x, h, hq * d, f"{pre}.q_proj", bias)
    k = pb.linear(x, h, hkv * d, f"{pre}.k_proj", bias)
    v = pb.linear(x, h, hkv * d, f"{pre}.v_proj", bias)
    if cfg.qk_norm == "full":  # OLMo 2: over every q (k) channel
        q = _qk_norm(pb, cfg, q, hq * d, f"{pre}.q_norm")
        k = _qk_norm(pb, cfg, k, hkv * d, f"{pre}.k_norm")
    q = pb.reshape(q, [b, s, hq, d], pre)
    k = pb.reshape(k, [b, s, hkv, d], pre)
    v = pb.reshape(v, [b, s, hkv, d], pre)
    if cfg.qk_norm == "head":  # Qwen3: per head over d
        q = _qk_norm(pb, cfg, q, d, f"{pre}.q_norm")
        k = _qk_norm(pb, cfg, k, d, f"{pre}.k_norm")
    if rope is not None:
        sin, cos = rope
        attrs = {"use_neox_rotary_style": True, "time_major": False, "rotary_emb_base": cfg.rope_theta}
        res = pb.op("fused_rotary_position_embedding", [q, k, None, sin, cos, None], attrs, pre)
        q, k = res[0], res[1]  # type: ignore[assignment]
    return q, k, v


def _flash(pb: ProgramBuilder, cfg: ModelConfig, q: Value, k: Value, v: Value, i: int, s: int,
           pre: str) -> Value:
    """One ``flash_attention``: causal, with the layer's sliding window and attention chunk
    when shorter than the sequence, and the heads' sinks (a ``sinks`` ``[hq]`` parameter)
    when ``cfg.attention_sinks``."""
    fa = {"dropout": float(cfg.attention_dropout), "causal": True, "return_softmax": False,
          "is_test": False}
    for attr, span in (("sliding_window", cfg.window_of(i)), ("attention_chunk", cfg.chunk_of(i))):
        if span is not None and span < s:
            fa[attr] = span
    operands = [q, k, v]
    if cfg.attention_sinks:
        operands.append(pb.param(pre, "sinks", [cfg.num_heads]))
    return pb.op1("flash_attention", operands, fa, pre)


def _attention(pb: ProgramBuilder, cfg: ModelConfig, x: Value, i: int, b: int, s: int,
               rope: tuple[Value, Value] | None, attention: str, st: str | None = None) -> Value:
    """The q/k/v projections (multi-head / GQA, or multi-head latent attention,
    :mod:`completion.models.mla`), rotary positions on the layers that use them, causal
    attention (flash or unfused; flash carries the layer's ``sliding_window``,
    ``attention_chunk`` and sinks), o_proj."""
    pre = f"{st or layer_struct(i)}.self_attn"
    rope = rope if cfg.uses_rope(i) else None
    q, k, v = (mla_qkv if cfg.mla else _gqa_qkv)(pb, cfg, x, pre, b, s, rope)
    if attention == "unfused":
        out = _unfused_core(pb, cfg, q, k, v, b, s, pre)
    else:
        out = _flash(pb, cfg, q, k, v, i, s, pre)
    width = cfg.num_heads * cfg.value_head_dim
    out = pb.reshape(out, [b, s, width], pre)
    return pb.linear(out, width, cfg.hidden_size, f"{pre}.o_proj", cfg.bias("o"))


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


#: ``ModelConfig.resolved_norm`` -> its builder
NORM_BUILDERS: dict[str, Callable[[ProgramBuilder, ModelConfig, Value, str], Value]] = {
    "layer_norm": _layer_norm, "rms_norm": _rms_norm,
}


def _norm(pb: ProgramBuilder, cfg: ModelConfig, x: Value, struct: str) -> Value:
    return NORM_BUILDERS[cfg.resolved_norm](pb, cfg, x, struct)


def _relu2(pb: ProgramBuilder, x: Value, struct: str) -> Value:
    """Squared ReLU (So et al. 2021, "Primer", sec. 3): ``square(relu(x))``, two
    elementwise ops (Megatron-LM ``squared_relu``: ``pow(relu(x), 2)``)."""
    return pb.op1("square", [pb.op1("relu", [x], None, struct)], None, struct)


#: plain activation (:data:`completion.models.config.ACTIVATIONS`) -> the ops applying it
UNARY_ACTIVATIONS: dict[str, Callable[[ProgramBuilder, Value, str], Value]] = {
    "gelu": lambda pb, x, st: pb.op1("gelu", [x], {"approximate": False}, st),
    "gelu_tanh": lambda pb, x, st: pb.op1("gelu", [x], {"approximate": True}, st),
    "relu": lambda pb, x, st: pb.op1("relu", [x], None, st),
    "relu2": _relu2,
    "silu": lambda pb, x, st: pb.op1("silu", [x], None, st),
}


def _mlp(pb: ProgramBuilder, cfg: ModelConfig, x: Value, i: int, st: str | None = None) -> Value:
    """The MLP of ``cfg.mlp_activation``: plain ``down(act(up(x)))`` or gated
    ``down(act(gate(x)) * up(x))`` (SwiGLU as the one ``swiglu`` op, other GLUs as the
    activation then ``multiply``), biases per ``cfg.bias("mlp")``; a mixture-of-experts
    layer's router and experts (:func:`completion.models.moe.moe_mlp`)."""
    h, f = cfg.hidden_size, cfg.ffn_hidden_size
    pre = f"{st or layer_struct(i)}.mlp"
    if cfg.is_moe_layer(i):  # router, experts, combine (completion.models.moe)
        return moe_mlp(pb, cfg, x, pre)
    bias = cfg.bias("mlp")
    act, gated = ACTIVATIONS[cfg.mlp_activation]
    if not gated:
        y = UNARY_ACTIVATIONS[act](pb, pb.linear(x, h, f, f"{pre}.up_proj", bias), f"{pre}.act")
        return pb.linear(y, f, h, f"{pre}.down_proj", bias)
    gate = pb.linear(x, h, f, f"{pre}.gate_proj", bias)
    up = pb.linear(x, h, f, f"{pre}.up_proj", bias)
    if cfg.mlp_activation == "swiglu":
        y = pb.op1("swiglu", [gate, up], None, f"{pre}.act")
    else:
        y = pb.op1("multiply", [UNARY_ACTIVATIONS[act](pb, gate, f"{pre}.act"), up], None, f"{pre}.act")
    return pb.linear(y, f, h, f"{pre}.down_proj", bias)


def _sublayer(pb: ProgramBuilder, cfg: ModelConfig, x: Value, fn: Callable[[Value], Value],
              pre_name: str, post_name: str, i: int, st: str | None = None) -> Value:
    """``x + dropout(f(x))`` with the norms of ``cfg.norm_placement``: pre ``f(norm(x))``,
    post ``norm(f(x))``, sandwich ``norm(f(norm(x)))``."""
    place, st = cfg.norm_placement, st or layer_struct(i)
    y = fn(_norm(pb, cfg, x, f"{st}.{pre_name}") if place in ("pre", "sandwich") else x)
    if place in ("post", "sandwich"):
        y = _norm(pb, cfg, y, f"{st}.{post_name}")
    return pb.add(x, _dropout(pb, y, cfg.hidden_dropout, st), st)


def _layer(pb: ProgramBuilder, cfg: ModelConfig, x: Value, i: int, b: int, s: int,
           rope: tuple[Value, Value] | None, attention: str, st: str | None = None) -> Value:
    """Decoder layer ``i`` (its attention span, rotary use and MLP kind are layer i's), its
    ops under ``st`` (default ``decoder.layers.{i}``; a multi-token prediction module's
    layer names its own)."""
    # struct names follow Hugging Face: pre-norm input_layernorm / post_attention_layernorm;
    # post-norm (OLMo 2) post_attention_layernorm / post_feedforward_layernorm; Gemma 2
    # all four
    place = cfg.norm_placement
    names = {"pre": (("input_layernorm", ""), ("post_attention_layernorm", "")),
             "post": (("", "post_attention_layernorm"), ("", "post_feedforward_layernorm")),
             "sandwich": (("input_layernorm", "post_attention_layernorm"),
                          ("pre_feedforward_layernorm", "post_feedforward_layernorm"))}[place]
    x = _sublayer(pb, cfg, x, lambda y: _attention(pb, cfg, y, i, b, s, rope, attention, st),
                  names[0][0], names[0][1], i, st)
    return _sublayer(pb, cfg, x, lambda y: _mlp(pb, cfg, y, i, st), names[1][0], names[1][1], i, st)


def _ce_mean(pb: ProgramBuilder, logits: Value, labels: Value) -> Value:
    res = pb.op("cross_entropy_with_softmax", [logits, labels], None, "loss")
    return pb.op1("mean", [res[1]], {"axis": [], "keepdim": False}, "loss")


def _mtp(pb: ProgramBuilder, cfg: ModelConfig, h: Value, wte: Value, b: int, s: int,
         rope: tuple[Value, Value] | None, attention: str) -> list[tuple[Value, Value]]:
    """The multi-token prediction modules (DeepSeek-V3 report, sec. 2.2, eq. 21-25, as
    Megatron-Core ``MultiTokenPredictionLayer`` computes them): module k (0-based, struct
    ``mtp.layers.{k}``) embeds the tokens k + 1 ahead (``mtp.input_ids.{k}``, the shared
    ``embed_tokens``), normalises them (``enorm``) and the previous hidden states
    (``hnorm``: the decoder's output before its final norm for k = 0), projects their
    concatenation ``[b, s, 2h] @ eh_proj [2h, h]`` and runs one more decoder layer (layer
    index ``num_layers + k``: its MLP kind is that layer's). Returns (hidden states, labels
    ``mtp.labels.{k}`` [b, s, 1]: the tokens k + 2 ahead) per module."""
    out: list[tuple[Value, Value]] = []
    for k in range(cfg.mtp_layers):
        st = f"mtp.layers.{k}"
        ids = pb.data(f"mtp.input_ids.{k}", [b, s], "int64", st)
        labels = pb.data(f"mtp.labels.{k}", [b, s, 1], "int64", "loss")
        emb = pb.op1("embedding", [ids, wte], {"padding_idx": -1, "sparse": False}, st)
        x = pb.op1("concat", [_norm(pb, cfg, emb, f"{st}.enorm"), _norm(pb, cfg, h, f"{st}.hnorm")],
                   {"axis": -1}, st)
        x = pb.linear(x, 2 * cfg.hidden_size, cfg.hidden_size, f"{st}.eh_proj", False)
        h = _layer(pb, cfg, x, cfg.num_layers + k, b, s, rope, attention, st)
        out.append((h, labels))
    return out


def _head_and_loss(pb: ProgramBuilder, cfg: ModelConfig, x: Value, wte: Value, labels: Value,
                   mtp: list[tuple[Value, Value]]) -> Value:
    """The final norm, the LM head (tied to ``wte`` or ``lm_head.weight`` [h, V]) and the
    mean cross entropy; each multi-token prediction module's hidden states through its own
    final norm and the same head, their mean cross entropies added with weight
    ``mtp_loss_weight / mtp_layers`` (DeepSeek-V3 eq. 25; Megatron-Core
    ``--mtp-loss-scaling-factor``)."""
    h, vocab = cfg.hidden_size, cfg.vocab_size
    x = _norm(pb, cfg, x, "decoder.norm")
    head = wte if cfg.tie_word_embeddings else pb.param("lm_head", "weight", [h, vocab])
    mm = {"transpose_x": False, "transpose_y": cfg.tie_word_embeddings}
    logits = pb.op1("matmul", [x, head], mm, "lm_head")
    extra = [(pb.op1("matmul", [_norm(pb, cfg, hk, f"mtp.layers.{k}.final_layernorm"), head], mm,
                     f"mtp.layers.{k}.shared_head"), lk) for k, (hk, lk) in enumerate(mtp)]
    pb.role = OpRole.LOSS
    loss = _ce_mean(pb, logits, labels)
    if extra:
        means = [_ce_mean(pb, lg, lk) for lg, lk in extra]
        tot = means[0] if len(means) == 1 else pb.op1("add_n", means, None, "loss")
        w = float(cfg.mtp_loss_weight) / len(means)
        tot = pb.op1("scale", [tot, None], {"scale": w, "bias": 0.0, "bias_after_scale": True}, "loss")
        loss = pb.op1("add", [loss, tot], None, "loss")
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
    """sin/cos tables [1, s, 1, rope_dim] as inputs of every rotary op (LLaMA; the
    rotary part of each head under multi-head latent attention)."""
    d = cfg.rope_dim
    sin = pb.data("rotary_emb.sin", [1, s, 1, d], pb.dtype, "rotary_emb")
    cos = pb.data("rotary_emb.cos", [1, s, 1, d], pb.dtype, "rotary_emb")
    return x, (sin, cos)


#: ``ModelConfig.resolved_positions`` -> its builder (returns the embedded x and the rotary
#: tables, None for learned positions)
POSITION_BUILDERS: dict[str, Callable[[ProgramBuilder, ModelConfig, Value, int, int],
                                      tuple[Value, tuple[Value, Value] | None]]] = {
    "learned": _learned_positions, "rope": _rope_tables,
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
    if attention == "unfused" and cfg.attention_sinks:
        raise ModelConfigError(f"model {cfg.name!r}: attention 'unfused' has no attention sinks "
                               "(the GPT-OSS sinks are an operand of flash_attention); use 'flash'")
    pb = ProgramBuilder(dtype=dtype)
    b, s = batch_size, seq_len
    ids = pb.data("input_ids", [b, s], "int64", "embed_tokens")
    labels = pb.data("labels", [b, s, 1], "int64", "loss")
    h = cfg.hidden_size
    wte = pb.param("embed_tokens", "weight", [cfg.vocab_size, h])
    x = pb.op1("embedding", [ids, wte], {"padding_idx": -1, "sparse": False}, "embed_tokens")
    x, rope = POSITION_BUILDERS[cfg.resolved_positions](pb, cfg, x, b, s)
    x = _dropout(pb, x, cfg.hidden_dropout, "embed_positions" if rope is None else "embed_tokens")
    for i in range(cfg.num_layers):
        x = _layer(pb, cfg, x, i, b, s, rope, attention)
    _head_and_loss(pb, cfg, x, wte, labels, _mtp(pb, cfg, x, wte, b, s, rope, attention))
    pb.program.renumber()
    return pb.program

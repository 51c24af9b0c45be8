"""Neural-network op declarations: swiglu, softmax, log_softmax, layer_norm, rms_norm,
embedding, flash_attention, fused_rotary_position_embedding, cross_entropy_with_softmax and
their ``*_grad`` ops.

Operand and result lists follow Paddle's op definitions (``paddle/phi/ops/yaml/ops.yaml``
and ``backward.yaml``) where Paddle has the op; simplifications are named per op. As the
registry requires, a grad op's results are the gradients of the forward operands in operand
order, with a null result for an operand that has no gradient (token ids, labels, sin/cos).

Traits: ``layer_norm`` / ``rms_norm`` are norms, ``flash_attention`` an attention kernel and
core, ``softmax`` part of an unfused attention core, ``swiglu`` an activation, the rotary
embedding a passthrough, ``cross_entropy_with_softmax`` the loss; ``layer_norm_grad`` reads
only the shape of ``bias`` and ``embedding_grad`` only that of ``weight`` (backward.yaml
``no_need_buffer``).

Also ``opaque``: an op a frontend could not map (``from_torch`` on an unknown ATen op); its
result types are recorded in its attributes and it has no grad op, so ``append_backward``
does not propagate gradients through it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from completion.ops.declare import defop
from completion.ops.registry import OpError, TensorType

INT_DTYPES = ("int64", "int32")
_T = Sequence[TensorType | None]


def _need(ts: _T, i: int, what: str) -> TensorType:
    if i >= len(ts) or ts[i] is None:
        raise OpError(f"operand {i} ({what}) is required")
    t = ts[i]
    assert t is not None
    return t


def _axis(axis: int, ndim: int, what: str = "axis") -> int:
    a = axis + ndim if axis < 0 else axis
    if not 0 <= a < max(ndim, 1):
        raise OpError(f"{what} {axis} is out of range for rank {ndim}")
    return a


def _eq(a: Sequence[int], b: Sequence[int]) -> bool:
    """Shapes equal, a dim of -1 (unknown) matching any size."""
    return len(a) == len(b) and all(x == y or x == -1 or y == -1 for x, y in zip(a, b, strict=False))


def _count(ts: _T, n: int) -> None:
    if len(ts) != n:
        raise OpError(f"expected {n} operands, got {len(ts)}")


# -- swiglu --------------------------------------------------------------------------------
def _infer_swiglu(ts: _T, attrs: dict[str, Any]) -> list[TensorType | None]:
    """out = silu(x) * y; with y null, x is split in two halves on its last dim."""
    _count(ts, 2)
    x = _need(ts, 0, "x")
    y = ts[1]
    if y is None:
        if not x.shape or x.shape[-1] % 2:
            raise OpError(f"swiglu without y needs an even last dim, x is {list(x.shape)}")
        return [TensorType(x.shape[:-1] + (x.shape[-1] // 2,), x.dtype)]
    if not _eq(x.shape, y.shape):
        raise OpError(f"x {list(x.shape)} and y {list(y.shape)} must have the same shape")
    return [TensorType(x.shape, x.dtype)]


def _infer_swiglu_grad(ts: _T, attrs: dict[str, Any]) -> list[TensorType | None]:
    _count(ts, 3)
    x = _need(ts, 0, "x")
    _need(ts, 2, "out@GRAD")
    return [x, ts[1]]


# -- softmax / log_softmax -----------------------------------------------------------------
def _infer_softmax(ts: _T, attrs: dict[str, Any]) -> list[TensorType | None]:
    _count(ts, 1)
    x = _need(ts, 0, "x")
    if x.ndim:
        _axis(int(attrs.get("axis", -1)), x.ndim)
    return [x]


def _infer_softmax_grad(ts: _T, attrs: dict[str, Any]) -> list[TensorType | None]:
    _count(ts, 2)
    out, g = _need(ts, 0, "out"), _need(ts, 1, "out@GRAD")
    if not _eq(out.shape, g.shape):
        raise OpError(f"out {list(out.shape)} and out@GRAD {list(g.shape)} differ")
    return [out]


# -- layer_norm / rms_norm -----------------------------------------------------------------
def _norm_split(x: TensorType, begin: int) -> tuple[int, tuple[int, ...]]:
    b = _axis(begin, x.ndim, "begin_norm_axis")
    left = 1
    for s in x.shape[:b]:
        left *= s
    return (-1 if -1 in x.shape[:b] else left), x.shape[b:]


def _check_affine(t: TensorType | None, normalized: tuple[int, ...], what: str) -> None:
    if t is None:
        return
    n = 1
    for s in normalized:
        n *= s
    if -1 not in normalized and -1 not in t.shape and t.numel != n:
        raise OpError(f"{what} {list(t.shape)} does not match the normalized shape {list(normalized)}")


def _infer_layer_norm(ts: _T, attrs: dict[str, Any]) -> list[TensorType | None]:
    """out like x; mean and variance [prod(x.shape[:begin_norm_axis])] float32."""
    _count(ts, 3)
    x = _need(ts, 0, "x")
    left, normalized = _norm_split(x, int(attrs.get("begin_norm_axis", 1)))
    _check_affine(ts[1], normalized, "scale")
    _check_affine(ts[2], normalized, "bias")
    stat = TensorType((left,), "float32")
    return [x, stat, stat]


def _infer_layer_norm_grad(ts: _T, attrs: dict[str, Any]) -> list[TensorType | None]:
    # (x, scale, bias, mean, variance, out@GRAD)
    _count(ts, 6)
    x, g = _need(ts, 0, "x"), _need(ts, 5, "out@GRAD")
    if not _eq(x.shape, g.shape):
        raise OpError(f"x {list(x.shape)} and out@GRAD {list(g.shape)} differ")
    return [x, ts[1], ts[2]]


def _infer_rms_norm(ts: _T, attrs: dict[str, Any]) -> list[TensorType | None]:
    """out like x; inv_var [prod(x.shape[:begin_norm_axis])] float32."""
    _count(ts, 2)
    x = _need(ts, 0, "x")
    left, normalized = _norm_split(x, int(attrs.get("begin_norm_axis", -1)))
    _check_affine(ts[1], normalized, "norm_weight")
    return [x, TensorType((left,), "float32")]


def _infer_rms_norm_grad(ts: _T, attrs: dict[str, Any]) -> list[TensorType | None]:
    # (x, norm_weight, inv_var, out@GRAD)
    _count(ts, 4)
    x, g = _need(ts, 0, "x"), _need(ts, 3, "out@GRAD")
    if not _eq(x.shape, g.shape):
        raise OpError(f"x {list(x.shape)} and out@GRAD {list(g.shape)} differ")
    return [x, ts[1]]


# -- embedding -----------------------------------------------------------------------------
def _infer_embedding(ts: _T, attrs: dict[str, Any]) -> list[TensorType | None]:
    """out = weight[x]: x int [...], weight [V, h] -> [..., h] in weight's dtype."""
    _count(ts, 2)
    x, w = _need(ts, 0, "x"), _need(ts, 1, "weight")
    if x.dtype not in INT_DTYPES:
        raise OpError(f"x must be an integer tensor, got {x.dtype}")
    if w.ndim != 2:
        raise OpError(f"weight must be 2-D [vocab, hidden], got {list(w.shape)}")
    return [TensorType(x.shape + (w.shape[1],), w.dtype)]


def _infer_embedding_grad(ts: _T, attrs: dict[str, Any]) -> list[TensorType | None]:
    # (x, weight, out@GRAD) -> (null for x, weight_grad)
    _count(ts, 3)
    x, w, g = _need(ts, 0, "x"), _need(ts, 1, "weight"), _need(ts, 2, "out@GRAD")
    if not _eq(g.shape, x.shape + (w.shape[1],)):
        raise OpError(f"out@GRAD {list(g.shape)} does not match x {list(x.shape)} and weight {list(w.shape)}")
    return [None, w]


# -- flash_attention -----------------------------------------------------------------------
def _check_qkv(q: TensorType, k: TensorType, v: TensorType, sinks: TensorType | None = None) -> None:
    """q [b, s, hq, d], k [b, t, hkv, d], v [b, t, hkv, d_v]: v may have its own head size
    (multi-head latent attention: d = qk_nope + qk_rope = 192, d_v = 128 in DeepSeek-V3;
    FlashAttention-3 and cuDNN take d_v != d); sinks, when given, one logit per query head
    [hq]."""
    for nm, t in (("q", q), ("k", k), ("v", v)):
        if t.ndim != 4:
            raise OpError(f"{nm} must be 4-D [batch, seq, heads, head_dim], got {list(t.shape)}")
    if not _eq(k.shape[:3], v.shape[:3]):
        raise OpError(f"k {list(k.shape)} and v {list(v.shape)} differ in batch, seq or heads")
    if not _eq(q.shape[::3], k.shape[::3]):
        raise OpError(f"q {list(q.shape)} and k {list(k.shape)} differ in batch or head_dim")
    if q.shape[2] > 0 and k.shape[2] > 0 and q.shape[2] % k.shape[2]:
        raise OpError(f"q heads {q.shape[2]} are not a multiple of k/v heads {k.shape[2]} (GQA)")
    if sinks is not None and not _eq(sinks.shape, (q.shape[2],)):
        raise OpError(f"sinks {list(sinks.shape)} must be [q heads = {q.shape[2]}]")


def _qkv_sinks(ts: _T, n_fixed: int) -> tuple[TensorType, TensorType, TensorType, TensorType | None]:
    """q, k, v and the optional sinks of a flash_attention (grad) op whose operand list has
    ``n_fixed`` entries before the sinks."""
    if len(ts) not in (n_fixed, n_fixed + 1):
        raise OpError(f"expected {n_fixed} or {n_fixed + 1} operands, got {len(ts)}")
    q, k, v = _need(ts, 0, "q"), _need(ts, 1, "k"), _need(ts, 2, "v")
    sinks = ts[n_fixed] if len(ts) > n_fixed else None
    _check_qkv(q, k, v, sinks)
    return q, k, v, sinks


def _infer_flash_attention(ts: _T, attrs: dict[str, Any]) -> list[TensorType | None]:
    """q [b, s, hq, d], k [b, s_kv, hkv, d], v [b, s_kv, hkv, d_v], sinks? [hq] -> out
    [b, s, hq, d_v], softmax (null unless return_softmax) [b, hq, s, s_kv], softmax_lse
    [b, hq, s] float32, seed_offset [2] int64."""
    q, k, v, _ = _qkv_sinks(ts, 3)
    b, s, hq, _ = q.shape
    sm = TensorType((b, hq, s, k.shape[1]), q.dtype) if attrs.get("return_softmax") else None
    return [TensorType((b, s, hq, v.shape[3]), q.dtype), sm, TensorType((b, hq, s), "float32"),
            TensorType((2,), "int64")]


def _infer_flash_attention_grad(ts: _T, attrs: dict[str, Any]) -> list[TensorType | None]:
    # (q, k, v, out, softmax_lse, seed_offset, out@GRAD, sinks?)
    q, k, v, sinks = _qkv_sinks(ts, 7)
    g = _need(ts, 6, "out@GRAD")
    if not _eq(g.shape, q.shape[:3] + v.shape[3:]):
        raise OpError(f"out@GRAD {list(g.shape)} does not match q {list(q.shape)} and v {list(v.shape)}")
    return [q, k, v] if len(ts) == 7 else [q, k, v, sinks]


# -- fused_rotary_position_embedding -------------------------------------------------------
def _check_rope_table(t: TensorType | None, s: int, d: int, what: str) -> None:
    if t is None:
        return
    if -1 in t.shape or s < 0 or d < 0:
        return
    if t.numel != s * d and t.shape[-1:] != (d,):
        raise OpError(f"{what} {list(t.shape)} does not match seq {s} and head_dim {d}")


def _infer_rope(ts: _T, attrs: dict[str, Any]) -> list[TensorType | None]:
    """q [b, s, hq, d], optional k/v [b, s, hkv, d], sin/cos [1, s, 1, d] (or [s, d]),
    position_ids [b, s] int -> out_q, out_k, out_v of the same shapes (null for a null input)."""
    _count(ts, 6)
    q = _need(ts, 0, "q")
    if q.ndim != 4:
        raise OpError(f"q must be 4-D [batch, seq, heads, head_dim], got {list(q.shape)}")
    b, s, _, d = q.shape
    if d > 0 and d % 2:
        raise OpError(f"head_dim {d} must be even for rotary embedding")
    for nm, t in (("k", ts[1]), ("v", ts[2])):
        if t is not None and (t.ndim != 4 or not _eq(t.shape[:2] + t.shape[3:], (b, s, d))):
            raise OpError(f"{nm} {list(t.shape)} does not match q {list(q.shape)}")
    if (ts[3] is None) != (ts[4] is None):
        raise OpError("sin and cos must be given together")
    _check_rope_table(ts[3], s, d, "sin")
    _check_rope_table(ts[4], s, d, "cos")
    pid = ts[5]
    if pid is not None and (pid.dtype not in INT_DTYPES or not _eq(pid.shape, (b, s))):
        raise OpError(f"position_ids must be an integer [{b}, {s}] tensor, got {pid.dtype} {list(pid.shape)}")
    return [q, ts[1], ts[2]]


def _infer_rope_grad(ts: _T, attrs: dict[str, Any]) -> list[TensorType | None]:
    # (sin, cos, position_ids, out_q@GRAD, out_k@GRAD, out_v@GRAD) -> q, k, v grads, nulls
    _count(ts, 6)
    gq = _need(ts, 3, "out_q@GRAD")
    return [gq, ts[4], ts[5], None, None, None]


# -- cross_entropy_with_softmax ------------------------------------------------------------
def _infer_ce(ts: _T, attrs: dict[str, Any]) -> list[TensorType | None]:
    """input [..., C] logits, label [..., 1] int (hard) or [..., C] (soft_label) ->
    softmax [..., C], loss [..., 1] (the class axis is ``axis``)."""
    _count(ts, 2)
    x, lab = _need(ts, 0, "input"), _need(ts, 1, "label")
    a = _axis(int(attrs.get("axis", -1)), x.ndim)
    red = x.shape[:a] + (1,) + x.shape[a + 1 :]
    if attrs.get("soft_label"):
        if not _eq(lab.shape, x.shape):
            raise OpError(f"soft label {list(lab.shape)} must match input {list(x.shape)}")
    else:
        if lab.dtype not in INT_DTYPES:
            raise OpError(f"hard label must be an integer tensor, got {lab.dtype}")
        if not _eq(lab.shape, red):
            raise OpError(f"label {list(lab.shape)} must be {list(red)} for input {list(x.shape)}")
    return [x, TensorType(red, x.dtype)]


def _infer_ce_grad(ts: _T, attrs: dict[str, Any]) -> list[TensorType | None]:
    # (label, softmax, loss@GRAD) -> (input_grad, null for label)
    _count(ts, 3)
    sm = _need(ts, 1, "softmax")
    _need(ts, 2, "loss@GRAD")
    return [sm, None]


_F, _I32, _I64 = "Float", "Int32", "Int64"

defop("swiglu", ("x", "y?"), ("out",), _infer_swiglu, family="swiglu",
      pattern_role="activation", grad_inputs=("x", "y", "out@GRAD"), grad_infer=_infer_swiglu_grad)
defop("softmax", ("x",), ("out",), _infer_softmax, attrs={"axis": -1}, attr_tags={"axis": _I32},
      family="softmax", attention_core=True, grad_inputs=("out", "out@GRAD"), grad_infer=_infer_softmax_grad)
defop("log_softmax", ("x",), ("out",), _infer_softmax, attrs={"axis": -1},
      attr_tags={"axis": _I32}, family="softmax", grad_inputs=("out", "out@GRAD"),
      grad_infer=_infer_softmax_grad)
defop("layer_norm", ("x", "scale?", "bias?"), ("out", "mean", "variance"), _infer_layer_norm,
      attrs={"epsilon": 1e-5, "begin_norm_axis": 1},
      attr_tags={"epsilon": _F, "begin_norm_axis": _I32}, family="layer_norm",
      pattern_role="norm", grad_inputs=("x", "scale", "bias", "mean", "variance", "out@GRAD"),
      grad_infer=_infer_layer_norm_grad, no_need_buffer=("bias",))
# Paddle's rms_norm also takes bias, residual and norm_bias operands and quantization
# attributes; the models here use none of them, so this op keeps x and norm_weight only.
defop("rms_norm", ("x", "norm_weight"), ("out", "inv_var"), _infer_rms_norm,
      attrs={"epsilon": 1e-5, "begin_norm_axis": -1},
      attr_tags={"epsilon": _F, "begin_norm_axis": _I32}, family="rms_norm",
      pattern_role="norm", grad_inputs=("x", "norm_weight", "inv_var", "out@GRAD"), grad_infer=_infer_rms_norm_grad)
defop("embedding", ("x", "weight"), ("out",), _infer_embedding,
      attrs={"padding_idx": -1, "sparse": False}, attr_tags={"padding_idx": _I64},
      family="embedding", pattern_role="embedding", grad_inputs=("x", "weight", "out@GRAD"),
      grad_infer=_infer_embedding_grad, no_need_buffer=("weight",), fusable=False)
# Paddle's flash_attn also takes fixed_seed_offset and attn_mask operands (both optional);
# causal masking is the only mask the models here need. ``sinks`` (optional, [hq]): one
# learned logit per query head joining every softmax denominator and attending to nothing
# (GPT-OSS, OpenAI 2025 model card sec. 2.1; transformers ``modeling_gpt_oss``
# ``eager_attention_forward``): out = softmax([S, sink]) V without the sink column. A
# forward op without it has a grad op without it (``completion.backward``). Attributes
# beyond Paddle's: ``sliding_window`` (keys per query) and ``attention_chunk`` c (a query
# at position i sees the keys of its own chunk, positions floor(i / c) * c .. i: Llama 4's
# chunked attention, transformers ``modeling_llama4``), both carried to the grad op.
defop("flash_attention", ("q", "k", "v", "sinks?"), ("out", "softmax", "softmax_lse", "seed_offset"),
      _infer_flash_attention,
      attrs={"dropout": 0.0, "causal": True, "return_softmax": False, "is_test": False},
      attr_tags={"dropout": _F}, family="flash_attention",
      kernel="attention", attention_core=True, pattern_role="attention", grad_inputs=("q", "k", "v", "out", "softmax_lse", "seed_offset", "out@GRAD", "sinks?"),
      grad_infer=_infer_flash_attention_grad, grad_carries=("sliding_window", "attention_chunk"))
defop("fused_rotary_position_embedding", ("q", "k?", "v?", "sin?", "cos?", "position_ids?"),
      ("out_q", "out_k", "out_v"), _infer_rope,
      attrs={"use_neox_rotary_style": True, "time_major": False, "rotary_emb_base": 10000.0},
      attr_tags={"rotary_emb_base": _F}, family="rotary_embedding",
      pattern_role="passthrough", grad_inputs=("sin", "cos", "position_ids", "out_q@GRAD", "out_k@GRAD", "out_v@GRAD"),
      grad_infer=_infer_rope_grad)
defop("cross_entropy_with_softmax", ("input", "label"), ("softmax", "loss"), _infer_ce,
      attrs={"soft_label": False, "use_softmax": True, "numeric_stable_mode": True,
             "ignore_index": -100, "axis": -1},
      attr_tags={"ignore_index": _I32, "axis": _I32}, family="cross_entropy",
      pattern_role="loss", grad_inputs=("label", "softmax", "loss@GRAD"), grad_infer=_infer_ce_grad)


# -- opaque: an op a frontend could not map (e.g. an unknown ATen op) ---------------------
def _infer_opaque(ts: _T, attrs: dict[str, Any]) -> list[TensorType | None]:
    """Results as recorded by the frontend: ``out_shapes`` (list of shapes) and
    ``out_dtypes`` (list of dtype names, same length)."""
    shapes, dtypes = attrs.get("out_shapes") or [], attrs.get("out_dtypes") or []
    if len(shapes) != len(dtypes):
        raise OpError(f"out_shapes ({len(shapes)}) and out_dtypes ({len(dtypes)}) differ in length")
    return [TensorType(tuple(s), str(d)) for s, d in zip(shapes, dtypes, strict=True)]


defop("opaque", ("x",), ("out",), _infer_opaque, family="opaque", variadic=True,
      variadic_results=True, attrs={"source_op": "", "out_shapes": [], "out_dtypes": []})

"""FLOPs and memory traffic of every op type, from its local (per-rank) shapes.

An op is described by an :class:`OpSig` (type, local operand/result shapes and dtypes, the
attributes that matter, and which operands/results are weights or weight gradients); a
registry maps op types (or, failing that, op families, then a generic memory-bound rule)
to a cost function returning one or more :class:`KernelCost`, each tagged with its phase:

- ``"F"`` forward, ``"B"`` the input-gradient part of a backward op, ``"W"`` the
  weight-gradient part (Zero Bubble paper, Qi et al. 2024, section 2: a matmul's backward
  splits into dX = dY W^T, the B pass, and dW = X^T dY, the W pass), ``"O"`` optimizer.

Counting conventions (documented because every published figure depends on them):

- matmul: 2mnk FLOPs per product (batched / broadcast batch dims multiply), Megatron-LM
  2021 (Narayanan et al.), appendix "FLOPs calculation". Its grad: dX and dY cost 2mnk each.
- flash_attention: model FLOPs 4 * b * h_q * s_q * s_k * d (QK^T and PV, two 2mnk
  products per head), counted in full even when causal, as Megatron eq. 3 and the ZB paper
  (Table 1: 24bsh^2 + 4bs^2h per layer) count attention; GQA leaves FLOPs unchanged (K/V
  are shared, only their bytes shrink). The *executed* FLOPs (``exec_flops``, what the
  roofline times) skip masked blocks when causal (fraction (s_k+1)/(2 s_k) for s_q = s_k)
  and, in backward, include the recomputation of QK^T (FlashAttention-2, Dao 2023,
  section 3.1: backward = 5 products = 2.5x forward; model FLOPs keep the 2x of eq. 3).
  ``causal_flops`` is the second convention MFU is reported in (``mfu_causal``): the model
  FLOPs over the scores the mask keeps, (s_k+1)/(2 s_k) of the full count for a causal
  mask (FlashAttention-2's and torchtitan's count of causal attention, half of eq. 3's).
- elementwise ops, norms, softmax, rotary, cross entropy: a small per-element FLOP count
  (table ``ELEMENT_FLOPS``); their time is bound by bytes moved (read every operand,
  write every result), which is what the roofline uses.
- ops whose declaration says they launch no kernel (``OpTraits.kernel`` None in
  ``completion.ops``: views such as reshape, squeeze, unsqueeze and their grads,
  data/parameter/full/shadow_output, reshard): no kernel here (reshard collectives are
  costed from the reshard pass, not as ops). Optimizer updates (``OpTraits.optimizer``)
  run in phase ``"O"``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import lru_cache

from completion.dtypes import DTYPE_BYTES
from completion.ops.registry import UNKNOWN_TRAITS, op_traits
from simulator.errors import SimulatorError
from simulator.op_signature import OpSig, TensorSig
from simulator.types import KernelKind, Phase


@dataclass(frozen=True)
class KernelCost:
    """One kernel of an op.

    Attributes:
        phase: ``"F"``, ``"B"``, ``"W"`` or ``"O"`` (see module docstring).
        flops: model FLOPs (the count MFU and Megatron's eq. 3 use).
        exec_flops: FLOPs the kernel really executes (causal skip, attention recompute).
        causal_flops: for attention, the model FLOPs counted over the scores a causal (or
            windowed) mask keeps, the keys each query sees (``mfu_causal``'s count); None
            for every other kernel (the same as ``flops``).
        bytes: HBM bytes read + written.
        kind: ``"gemm"``, ``"attention"`` or ``"memory"`` (selects the efficiency).
        dtype: compute dtype (selects the peak FLOP/s).
        gemm_flops: FLOPs of the single GEMM (size-dependent efficiency); 0 otherwise.
        op: the op type it belongs to (per-op efficiencies, ``Roofline.by_op``).
        gemm_shape: ``(batch, m, n, k)`` of a GEMM kernel -- output ``[batch, m, n]``,
            inner dimension ``k`` (``2 * batch * m * n * k`` FLOPs) -- that
            ``simulator.roofline`` tiles into waves on devices with ``sm_count``; None
            (other kernels, or a GEMM whose shape is unknown): the smooth size model.
    """

    phase: Phase
    flops: float
    exec_flops: float
    bytes: float
    kind: KernelKind
    dtype: str
    gemm_flops: float = 0.0
    op: str = ""
    gemm_shape: tuple[int, int, int, int] | None = None
    causal_flops: float | None = None


CostFn = Callable[[OpSig], list[KernelCost]]
COST_RULES: dict[str, CostFn] = {}

# Per-element FLOPs of memory-bound ops (a convention: these ops are bandwidth-bound, so
# the count only enters the FLOP totals, where it is below 0.1% for transformer layers).
# A counting convention of this cost model (default 1), so it lives here rather than in the
# op declarations: ``completion`` knows nothing about cost.
ELEMENT_FLOPS: dict[str, float] = {
    "add": 1, "subtract": 1, "multiply": 1, "divide": 1, "scale": 1, "relu": 1,
    "square": 1, "exp": 1, "cast": 0, "tanh": 4, "sigmoid": 4, "silu": 4, "gelu": 8,
    "swiglu": 5, "dropout": 2, "softmax": 5, "log_softmax": 5, "layer_norm": 8,
    "rms_norm": 5, "fused_rotary_position_embedding": 3, "sum": 1, "mean": 1, "max": 1,
    "cross_entropy_with_softmax": 6, "add_n": 1, "full_like": 0, "transpose": 0,
    "split": 0, "concat": 0, "slice": 0, "embedding": 0, "sgd_": 2, "adam_": 12,
    "adamw_": 14,
}


def register_cost(*names: str) -> Callable[[CostFn], CostFn]:
    """Decorator: register a cost function for op types or op families."""

    def deco(fn: CostFn) -> CostFn:
        for n in names:
            COST_RULES[n] = fn
        return fn

    return deco


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _bytes(ts: TensorSig | None) -> float:
    return 0.0 if ts is None else float(_numel(ts.shape) * DTYPE_BYTES.get(ts.dtype, 4))


def _elems(ts: TensorSig | None) -> int:
    return 0 if ts is None else _numel(ts.shape)


def _first_dtype(sig: OpSig) -> str:
    for t in (*sig.outs, *sig.ins):
        if t is not None:
            return t.dtype
    return "float32"


# -- matmul ---------------------------------------------------------------------------------
def _matmul_dims(sig: OpSig) -> tuple[int, int, int, int]:
    """(batch, m, n, k) of ``out = x @ y`` with Paddle's transpose_x / transpose_y."""
    b, m, n, k, _, _ = _matmul_dims_batches(sig)
    return b, m, n, k


def _matmul_dims_batches(sig: OpSig) -> tuple[int, int, int, int, int, int]:
    """(batch, m, n, k, x_batch, y_batch): :func:`_matmul_dims` and the product of each
    operand's own batch dims (1 for a matrix, e.g. a weight broadcast over the batch)."""
    x, y = sig.ins[0], sig.ins[1]
    if x is None or y is None:
        raise SimulatorError(f"{sig.type}: matmul needs two operands")
    xs, ys = list(x.shape), list(y.shape)
    if len(xs) == 1:
        xs = [1, xs[0]] if not sig.attr("transpose_x") else [xs[0], 1]
    if len(ys) == 1:
        ys = [ys[0], 1] if not sig.attr("transpose_y") else [1, ys[0]]
    if sig.attr("transpose_x"):
        xs[-1], xs[-2] = xs[-2], xs[-1]
    if sig.attr("transpose_y"):
        ys[-1], ys[-2] = ys[-2], ys[-1]
    m, k = xs[-2], xs[-1]
    n = ys[-1]
    bx, by = xs[:-2], ys[:-2]
    nb = max(len(bx), len(by))
    bx, by = [1] * (nb - len(bx)) + bx, [1] * (nb - len(by)) + by
    batch = _numel(tuple(max(a, b) for a, b in zip(bx, by, strict=True)))
    return batch, m, n, k, _numel(tuple(bx)), _numel(tuple(by))


def gemm_shapes(batch: int, m: int, n: int, k: int, x_batch: int, y_batch: int
                ) -> tuple[tuple[int, int, int, int], tuple[int, int, int, int],
                           tuple[int, int, int, int]]:
    """``(batch, m, n, k)`` GEMM shapes (output ``[batch, m, n]``, inner ``k``) of the
    forward ``out = x @ y``, of ``dx = dout @ y^T`` and of ``dy = x^T @ dout``.

    For ``x[m, k] @ y[k, n]``: forward ``(1, m, n, k)``, dx ``(1, m, k, n)``, dy
    ``(1, k, n, m)``. Batch dims multiply into ``batch`` when both operands carry them (the
    attention's QK^T and scores x V: one GEMM per head). When only ``x`` has batch dims
    (activations ``[b, s, k]`` times a weight ``[k, n]``) the batch folds into the rows,
    as torch's ``at::matmul`` (``should_fold``) and Paddle's matmul kernel reshape to one
    2-D GEMM: forward ``(1, batch*m, n, k)``, dx ``(1, batch*m, k, n)``, and dy sums over
    the batch, so its inner dim is ``batch*m``: ``(1, k, n, batch*m)``. Symmetrically,
    when only ``y`` is batched, dx sums over the batch: ``(1, m, k, batch*n)``.
    Transposes do not change the shapes: cuBLAS reads transposed operands in place, and
    the output's orientation does not matter to the tile model (its candidate tiles are
    closed under transposition, ``simulator.roofline.GEMM_TILES``)."""
    if batch > 1 and y_batch == 1:  # a weight broadcast over the batch: rows fold
        return (1, batch * m, n, k), (1, batch * m, k, n), (1, k, n, batch * m)
    if batch > 1 and x_batch == 1:  # x broadcast: dx reduces over the batch
        return (batch, m, n, k), (1, m, k, batch * n), (batch, k, n, m)
    return (batch, m, n, k), (batch, m, k, n), (batch, k, n, m)


def _gemm(phase: Phase, flops: float, nbytes: float, dtype: str,
          shape: tuple[int, int, int, int] | None = None) -> KernelCost:
    return KernelCost(phase, flops, flops, nbytes, "gemm", dtype, flops, gemm_shape=shape)


#: dtype of FP8 GEMM kernels (``Roofline.peak`` finds the device's ``peak_flops.fp8``)
FP8_DTYPE = "float8_e4m3fn"


def _operand_bytes(sig: OpSig, ts: TensorSig | None) -> float:
    """Bytes a GEMM reads of operand ``ts``: 1 per element when the op is an FP8 linear
    (its ``fp8`` attribute, ``completion.fp8``: the operand was cast to FP8), else its own."""
    return float(_elems(ts)) if sig.attr("fp8") else _bytes(ts)


def _gemm_dtype(sig: OpSig) -> str:
    """:data:`FP8_DTYPE` for an FP8 linear's GEMMs, else the op's dtype."""
    return FP8_DTYPE if sig.attr("fp8") else _first_dtype(sig)


@register_cost("matmul", "matmul_family")
def matmul_cost(sig: OpSig) -> list[KernelCost]:
    """out[batch, m, n] = x[.., m, k] @ y[.., k, n]: 2 * batch * m * n * k FLOPs; bytes =
    x + y read + out written; ``gemm_shape`` from :func:`gemm_shapes` (forward). An FP8
    linear (``fp8`` attribute) reads x and y at 1 byte per element and runs at the FP8 peak
    (dtype :data:`FP8_DTYPE`); its casts are ``simulator.fp8``'s."""
    b, m, n, k, bx, by = _matmul_dims_batches(sig)
    nbytes = _operand_bytes(sig, sig.ins[0]) + _operand_bytes(sig, sig.ins[1]) + _bytes(sig.outs[0])
    shape = gemm_shapes(b, m, n, k, bx, by)[0]
    return [_gemm("F", 2.0 * b * m * n * k, nbytes, _gemm_dtype(sig), shape)]


@register_cost("matmul_grad")
def matmul_grad_cost(sig: OpSig) -> list[KernelCost]:
    """Operands (x, y, dout) -> (dx, dy): each non-null gradient is one 2*b*m*n*k GEMM;
    dx reads (dout, y), dy reads (x, dout) (FP8 linears: 1 byte per element read, the FP8
    peak, as :func:`matmul_cost`). The phase of each is W when that forward
    operand is a weight (``sig.weight``), else B. ``gemm_shape``: dx ``(b, m, k, n)``, dy
    ``(b, k, n, m)`` (batch folding as in :func:`gemm_shapes`)."""
    fwd = OpSig("matmul", sig.ins[:2], (sig.ins[2],), sig.attrs)
    b, m, n, k, bx, by = _matmul_dims_batches(fwd)
    fl, dt = 2.0 * b * m * n * k, _gemm_dtype(sig)
    shapes = gemm_shapes(b, m, n, k, bx, by)[1:]
    x, y, dout = sig.ins[0], sig.ins[1], sig.ins[2]
    out = []
    for j, reads in ((0, (dout, y)), (1, (x, dout))):
        g = sig.outs[j] if j < len(sig.outs) else None
        if g is None:
            continue
        nbytes = sum(_operand_bytes(sig, t) for t in reads) + _bytes(g)
        out.append(_gemm(sig.phase_of(j), fl, nbytes, dt, shapes[j]))
    return out


# -- attention ------------------------------------------------------------------------------
def _attn_dims(sig: OpSig) -> tuple[int, int, int, int, int, int]:
    """(batch, heads_q, s_q, s_k, head_dim of q and k, head_dim of v) from q, k, v in
    [b, s, heads, d] (Paddle's layout; v's d differs under multi-head latent attention)."""
    q, k = sig.ins[0], sig.ins[1]
    v = sig.ins[2] if len(sig.ins) > 2 else None
    if q is None or k is None or len(q.shape) != 4 or len(k.shape) != 4:
        raise SimulatorError(f"{sig.type}: expects q, k of shape [batch, seq, heads, head_dim]")
    b, sq, hq, d = q.shape
    dv = v.shape[3] if v is not None and len(v.shape) == 4 else d
    return b, hq, sq, k.shape[1], d, dv


def _chunk_seen(sq: int, sk: int, c: int) -> float:
    """Keys the queries of a causal ``attention_chunk`` = c attention see in all: query i
    (key position p = i + sk - sq) sees positions floor(p / c) * c .. p, p mod c + 1 keys;
    for sq = sk = s: (s // c) * c (c + 1) / 2 + r (r + 1) / 2 with r = s mod c."""
    off = sk - sq
    if sq <= 4096 or off:
        return float(sum((i + off) % c + 1 for i in range(sq)))
    r = sq % c
    return (sq // c) * c * (c + 1) / 2 + r * (r + 1) / 2


def _causal_fraction(sig: OpSig, sq: int, sk: int) -> float:
    """Fraction of the ``sq x sk`` score matrix a causal (and, with the
    ``sliding_window`` attribute w, windowed) kernel computes: query i sees keys
    ``(i + sk - sq) - w < j <= i + sk - sq`` (FlashAttention-2 ``window_size = (w - 1, 0)``,
    whose kernel skips the key blocks outside the band); with the ``attention_chunk``
    attribute c, the keys of its own chunk (:func:`_chunk_seen`; Llama 4)."""
    w = int(sig.attr("sliding_window", 0) or 0)
    c = int(sig.attr("attention_chunk", 0) or 0)
    if c > 0 and sk > 0:
        return _chunk_seen(sq, sk, c) / (sq * sk)
    if w > 0 and sk > 0:
        off = sk - sq
        if sq <= 4096:
            seen = sum(max(0, min(sk, i + 1 + off) - max(0, i + 1 + off - w)) for i in range(sq))
        else:  # closed form for sq = sk: rows below w see i + 1 keys, the rest w
            r = min(w, sq)
            seen = r * (r + 1) / 2 + (sq - r) * w if off == 0 else sq * min(w, sk)
        return seen / (sq * sk)
    if not sig.attr("causal") or sk == 0:
        return 1.0
    # bottom-right aligned causal mask: query i sees keys up to i + (sk - sq)
    seen = sum(min(sk, i + 1 + (sk - sq)) for i in range(sq)) if sq <= 4096 else None
    if seen is None:
        seen = sq * (sk - sq) + sq * (sq + 1) / 2
    return seen / (sq * sk)


def _cp_degree(sig: OpSig) -> int:
    """The context-parallel degree an attention op runs over (``context_parallel`` attribute,
    ``completion.context_parallel``; 1 without)."""
    return max(1, int(sig.attr("context_parallel", 1) or 1))


def _cp_fraction(sig: OpSig, sq: int, sk: int, cp: int) -> float:
    """Causal fraction of a rank's queries against all keys. cp = 1: :func:`_causal_fraction`.
    cp > 1 with load balancing (rank c holds chunks c and 2cp-1-c of the S = cp * s_k keys):
    every rank sees the same share of the S(S+1)/2 causal pairs, S(S+1)/(2cp) of its
    s_q * S = S^2/cp pairs: (S+1)/(2S), the whole sequence's fraction."""
    if cp == 1:
        return _causal_fraction(sig, sq, sk)
    return _causal_fraction(sig, sk * cp, sk * cp)


def _window_share(sig: OpSig, keys: int) -> float:
    """Model FLOPs of windowed attention: a query sees at most ``sliding_window`` = w (or
    ``attention_chunk`` = c) of the ``keys`` keys, so the convention that counts every query
    against every key (Megatron's and PaLM's 12 L h s per token, no causal halving) counts it
    against min(w, keys): min(w, keys) / keys; 1 without a window or chunk. (Executed FLOPs
    use the exact band, :func:`_causal_fraction`.)"""
    w = int(sig.attr("sliding_window", 0) or 0) or int(sig.attr("attention_chunk", 0) or 0)
    return min(w, keys) / keys if w > 0 and keys > 0 else 1.0


@register_cost("flash_attention", "attention")
def flash_attention_cost(sig: OpSig) -> list[KernelCost]:
    """Model FLOPs 2*b*h_q*s_q*s_k*(d + d_v): QK^T (inner dim d) and P V (inner dim d_v),
    4*b*h_q*s_q*s_k*d when v's head size is q's (with a sliding window w or an attention
    chunk c: s_k counted as min(w, s_k), :func:`_window_share`); executed FLOPs times the
    causal fraction. Bytes: read q, k, v (GQA: k, v have fewer heads) and the sinks, write
    out and the softmax log-sum-exp.

    Context parallelism (``context_parallel`` = cp > 1): the rank's s_q queries attend to
    all cp * s_k keys (cp blocks of the ring, or the all-gathered K/V), so s_k counts cp
    times and every K/V block is read once; the causal fraction is the load-balanced one
    (:func:`_cp_fraction`)."""
    b, hq, sq, sk, d, dv = _attn_dims(sig)
    cp = _cp_degree(sig)
    full = 2.0 * b * hq * sq * sk * cp * (d + dv)
    fl = full * _window_share(sig, sk * cp)
    ex = full * _cp_fraction(sig, sq, sk, cp)
    nbytes = (_bytes(sig.ins[0]) + cp * sum(_bytes(t) for t in sig.ins[1:3])
              + sum(_bytes(t) for t in sig.ins[3:]) + sum(_bytes(t) for t in sig.outs))
    return [KernelCost("F", fl, ex, nbytes, "attention", _first_dtype(sig), causal_flops=ex)]


@register_cost("flash_attention_grad", "attention_grad")
def flash_attention_grad_cost(sig: OpSig) -> list[KernelCost]:
    """Model FLOPs 2x forward (dQ, dK: inner dims d_v then d; dV, dP); executed 2x forward
    plus QK^T recomputed, 2*b*h_q*s_q*s_k*d (2.5x forward when d_v = d: FlashAttention-2
    section 3.1), times the causal fraction. All B: attention has no weights. Context
    parallelism as in :func:`flash_attention_cost` (every K/V block and its dK/dV read and
    written once)."""
    b, hq, sq, sk, d, dv = _attn_dims(sig)
    cp = _cp_degree(sig)
    fwd = 2.0 * b * hq * sq * sk * cp * (d + dv)
    recompute = 2.0 * b * hq * sq * sk * cp * d
    frac = _cp_fraction(sig, sq, sk, cp)
    ex = (2.0 * fwd + recompute) * frac
    causal = 2.0 * fwd * frac  # the model's 2x forward over the scores the mask keeps
    fwd *= _window_share(sig, sk * cp)  # model FLOPs: the keys a query may see
    kv = sum(_bytes(t) for t in sig.ins[1:3]) + sum(_bytes(t) for t in sig.outs[1:3])
    nbytes = sum(_bytes(t) for t in sig.ins) + sum(_bytes(t) for t in sig.outs) + (cp - 1) * kv
    return [KernelCost("B", 2.0 * fwd, ex, nbytes, "attention", _first_dtype(sig), causal_flops=causal)]


# -- memory-bound ops -----------------------------------------------------------------------
def _mem(phase: Phase, flops: float, nbytes: float, dtype: str) -> KernelCost:
    return KernelCost(phase, flops, flops, nbytes, "memory", dtype)


def _base_type(t: str) -> str:
    return t[: -len("_grad")] if t.endswith("_grad") else t


def elementwise_cost(sig: OpSig) -> list[KernelCost]:
    """Forward memory-bound op: FLOPs = ELEMENT_FLOPS[type] * largest tensor's elements;
    bytes = every operand read + every result written."""
    n = max([_elems(t) for t in (*sig.ins, *sig.outs)] or [0])
    fl = ELEMENT_FLOPS.get(sig.type, 1) * n
    nbytes = sum(_bytes(t) for t in sig.ins) + sum(_bytes(t) for t in sig.outs)
    phase: Phase = "O" if op_traits(sig.type).optimizer else sig.default_phase
    return [_mem(phase, fl, nbytes, _first_dtype(sig))]


def read_operands(sig: OpSig) -> list[TensorSig]:
    """The operands whose buffers the op's kernel reads: every non-null operand except
    those the op's traits mark ``no_need_buffer`` (Paddle ``backward.yaml``; e.g.
    ``add_grad`` reads only ``out@GRAD``, ``layer_norm_grad`` not the bias, ``cast_grad``
    not ``x``: their shapes suffice)."""
    skip = op_traits(sig.type).no_need_buffer
    return [t for i, t in enumerate(sig.ins) if t is not None and i not in skip]


def elementwise_grad_cost(sig: OpSig) -> list[KernelCost]:
    """Generic grad of a memory-bound op, split by result: the input gradients (B) are
    one kernel reading the operands it needs (:func:`read_operands`: e.g. ``relu_grad``
    reads out and out@GRAD, ``add_grad`` only out@GRAD) and writing them; the weight
    gradients (W, e.g. a norm's scale or an add's bias) are one reduction kernel reading
    the two largest operands it needs (the incoming gradient and, for a norm, the saved
    input; a bias gradient reads out@GRAD alone) and writing them. FLOPs: 2x the forward
    per-element count on the largest operand."""
    n = max([_elems(t) for t in sig.ins] or [0])
    per = 2.0 * ELEMENT_FLOPS.get(_base_type(sig.type), 1)
    dt = _first_dtype(sig)
    b_outs = [t for j, t in enumerate(sig.outs) if t is not None and sig.phase_of(j) == "B"]
    w_outs = [t for j, t in enumerate(sig.outs) if t is not None and sig.phase_of(j) == "W"]
    out = []
    needed = read_operands(sig)
    reads = sum(_bytes(t) for t in needed)
    if b_outs or not w_outs:
        out.append(_mem("B", per * n, reads + sum(_bytes(t) for t in b_outs), dt))
    if w_outs:
        big = sorted((_bytes(t) for t in needed), reverse=True)[:2]
        out.append(_mem("W", float(n), sum(big) + sum(_bytes(t) for t in w_outs), dt))
    return out


@register_cost("embedding")
def embedding_cost(sig: OpSig) -> list[KernelCost]:
    """Gather: read the ids and the selected rows (= output size), write the output."""
    nbytes = _bytes(sig.ins[0]) + 2 * _bytes(sig.outs[0])
    return [_mem("F", 0.0, nbytes, _first_dtype(sig))]


@register_cost("embedding_grad")
def embedding_grad_cost(sig: OpSig) -> list[KernelCost]:
    """Scatter-add into the table gradient (W): zero the table, read ids and dout,
    accumulate rows (read + write of dout-sized rows)."""
    out = []
    for j, g in enumerate(sig.outs):
        if g is None:
            continue
        dout = sig.ins[-1]
        nbytes = _bytes(g) + sum(_bytes(t) for t in sig.ins[:1]) + 3 * _bytes(dout)
        out.append(_mem(sig.phase_of(j), float(_elems(dout)), nbytes, _first_dtype(sig)))
    return out


def no_kernel(sig: OpSig) -> list[KernelCost]:
    """Ops that launch nothing (``OpTraits.kernel`` None: views, inputs, reshard
    placeholders)."""
    return []


def rule_for(op_type: str, family: str = "") -> CostFn:
    """The cost function of ``op_type``: by type; then :func:`no_kernel` when the op's
    traits say it launches no kernel (``completion.ops.op_traits``); then by family
    (``family`` or the forward op's); then the generic elementwise / elementwise-grad rule."""
    if op_type in COST_RULES:
        return COST_RULES[op_type]
    if op_traits(op_type).kernel is None:
        return no_kernel
    if family and family in COST_RULES:
        return COST_RULES[family]
    if op_type.endswith("_grad"):
        if family and family + "_grad" in COST_RULES:
            return COST_RULES[family + "_grad"]
        return elementwise_grad_cost
    return elementwise_cost


class UnknownOpWarning(SimulatorError, UserWarning):
    """An op type neither the cost registry nor the op registry knows: costed by the
    generic memory-bound rule (a renamed GEMM would be costed far too cheap), said once
    per op type (``meshplan cost`` prints it and lists it in ``--json``)."""


_WARNED: set[str] = set()


def _warn_unknown(op_type: str) -> None:
    """:class:`UnknownOpWarning` for ``op_type`` (a forward type; its ``_grad`` shares it)
    when no registry knows it, once per process."""
    base = op_type.removesuffix("_grad")
    if (op_type in COST_RULES or base in COST_RULES or op_traits(base) is not UNKNOWN_TRAITS
            or base in _WARNED):
        return
    _WARNED.add(base)
    warnings.warn(UnknownOpWarning(f"no cost rule for op {base!r} (nor a declaration in the op "
                                   f"registry): costed as a memory-bound elementwise kernel"),
                  stacklevel=3)


@lru_cache(maxsize=65536)
def op_cost(sig: OpSig) -> tuple[KernelCost, ...]:
    """Kernels of one op (cached by signature: identical layers are costed once). An op
    type no registry knows warns (:class:`UnknownOpWarning`) and is costed as memory-bound.

    Raises ValueError naming the op type when its shapes do not fit its rule."""
    if not sig.family:
        _warn_unknown(sig.type)
    return tuple(k if k.op else replace(k, op=sig.type) for k in rule_for(sig.type, sig.family)(sig))

"""``flash_attention`` and ``fused_rotary_position_embedding`` kernels and their grads.

flash_attention: q [b, s, hq, d], k/v [b, s_kv, hkv, d] (grouped-query attention when
hkv < hq: head i reads kv head ``i // (hq / hkv)``), scale 1/sqrt(d), causal mask aligned
bottom-right (query i sees keys j <= i + s_kv - s, as FlashAttention-2 does). Results: out,
softmax (only with ``return_softmax``), softmax_lse [b, hq, s] (log-sum-exp of the scaled,
masked scores, and of the head's sink logit when ``sinks`` [hq] is given: GPT-OSS) and
seed_offset [2] (zeros; dropout inside attention is not supported). v may have its own head
size (multi-head latent attention). ``sliding_window`` and ``attention_chunk`` mask the
keys a query sees (:func:`_scores`).
The grad follows FlashAttention-2's backward (Dao 2023, Algorithm 2): P = exp(S - lse),
dV = P^T dO, dP = dO V^T, D = rowsum(dO * O), dS = P (dP - D), dQ = dS K / sqrt(d),
dK = dS^T Q / sqrt(d); kv-head gradients sum over their query-head group.

Context parallelism (``context_parallel`` attribute > 1, ``completion.context_parallel``):
q/k/v hold this rank's load-balanced tokens and the kernel runs the cp group's attention,
ring attention (``cp_comm = "p2p"``) or all-gathered K/V, with ``executor.ring_attention``;
the group is the rank's cp peers (``cp_stride`` apart), its process group from
``KernelContext.extra["groups"]``.

Rotary embedding (Su et al. 2021, RoFormer eq. 34): out = x cos + rot(x) sin, applied to q,
k and v when given (Paddle rotates every given input). ``use_neox_rotary_style=True`` pairs
adjacent elements (rot(x)[2i] = -x[2i+1], rot(x)[2i+1] = x[2i]), False pairs the two halves
(rot(x) = [-x2, x1]) — Paddle's naming of the two styles. The grad is
``g cos - rot(g sin)`` since rot^T = -rot. Without sin/cos the tables are computed from
``rotary_emb_base`` (theta_i = base^(-2i/d)) at the positions of the local sequence block.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from completion.context_parallel import cp_group
from executor.kernels.base import Ins, KernelContext, KernelError, need, register_kernel
from executor.kernels.nn import stat_dtype
from executor.ring_attention import CP_ATTENTION


def _heads(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
    """[b, s, h, d] -> [b, h, s, d], kv heads repeated to the query head count."""
    hq, hkv = q.shape[2], k.shape[2]
    if hkv == 0 or hq % hkv:
        raise KernelError(f"flash_attention: {hq} query heads are not a multiple of {hkv} kv heads")
    rep = hq // hkv
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    if rep > 1:
        kt, vt = kt.repeat_interleave(rep, dim=1), vt.repeat_interleave(rep, dim=1)
    return qt, kt, vt, rep


def _scores(qt: torch.Tensor, kt: torch.Tensor, causal: bool, window: int = 0,
            chunk: int = 0) -> torch.Tensor:
    """Scaled scores, masked causally (bottom-right aligned), for ``window`` w > 0 to the w
    most recent keys of each query (FlashAttention-2 ``window_size = (w - 1, 0)``) and for
    ``chunk`` c > 0 to the keys of the query's own chunk of c positions (Llama 4)."""
    dt = stat_dtype(qt)
    s = torch.matmul(qt.to(dt), kt.to(dt).transpose(-1, -2)) / math.sqrt(qt.shape[-1])
    if causal or window > 0 or chunk > 0:
        sq, sk = s.shape[-2], s.shape[-1]
        i = torch.arange(sq, device=s.device)[:, None] + (sk - sq)  # the query's key position
        j = torch.arange(sk, device=s.device)[None, :]
        s = s.masked_fill(j > i, float("-inf"))
        if window > 0:
            s = s.masked_fill(j <= i - window, float("-inf"))
        if chunk > 0:
            s = s.masked_fill(j // chunk != i // chunk, float("-inf"))
    return s


def _masks(attrs: Mapping[str, Any]) -> tuple[bool, int, int]:
    """(causal, sliding_window, attention_chunk) of an attention op (0: none)."""
    return (bool(attrs.get("causal", True)), int(attrs.get("sliding_window", 0) or 0),
            int(attrs.get("attention_chunk", 0) or 0))


def _with_sinks(lse: torch.Tensor, sinks: torch.Tensor | None) -> torch.Tensor:
    """The log-sum-exp [b, h, s] with each head's sink logit joining the denominator:
    log(exp(lse) + exp(sink_h)) (GPT-OSS attention sinks); ``lse`` itself without sinks."""
    if sinks is None:
        return lse
    return torch.logaddexp(lse, sinks.to(lse.dtype)[None, :, None])


def _check_dropout(attrs: Mapping[str, Any]) -> None:
    if float(attrs.get("dropout", 0.0)) != 0.0 and not attrs.get("is_test"):
        raise KernelError("flash_attention: attention dropout is not supported by the executor")


def _context_parallel(attrs: Mapping[str, Any], ctx: KernelContext, op: str):
    """(forward, backward, group, process group) of a context-parallel attention op, or
    None when the op runs on one rank's whole sequence."""
    cp = int(attrs.get("context_parallel", 1) or 1)
    if cp == 1:
        return None
    comm = str(attrs.get("cp_comm", "p2p"))
    if comm not in CP_ATTENTION:
        raise KernelError(f"{op}: cp_comm {comm!r} is none of {sorted(CP_ATTENTION)}")
    if ctx.rank is None:
        raise KernelError(f"{op}: context parallelism needs the rank")
    group = cp_group(ctx.rank, cp, int(attrs.get("cp_stride", 1) or 1))
    groups = ctx.extra.get("groups")
    pg = groups.get(group) if groups is not None else None
    fwd, bwd = CP_ATTENTION[comm]
    return fwd, bwd, group, pg


def _refuse_cp_masks(attrs: Mapping[str, Any], sinks: torch.Tensor | None, op: str) -> None:
    if sinks is not None or int(attrs.get("attention_chunk", 0) or 0):
        raise KernelError(f"{op}: attention sinks and chunked attention are not available with "
                          "context parallelism")


@register_kernel("flash_attention")
def _flash_attention(ins: Ins, attrs: Mapping[str, Any], ctx: KernelContext):
    q, k, v = (need(ins, i, "flash_attention", w) for i, w in enumerate("qkv"))
    sinks = ins[3] if len(ins) > 3 else None
    _check_dropout(attrs)
    cpa = _context_parallel(attrs, ctx, "flash_attention")
    if cpa is not None:
        _refuse_cp_masks(attrs, sinks, "flash_attention")
        if attrs.get("return_softmax"):
            raise KernelError("flash_attention: return_softmax is not available with context parallelism")
        out, lse = cpa[0](q, k, v, cpa[2], ctx.rank, bool(attrs.get("causal", True)), cpa[3],
                          window=int(attrs.get("sliding_window", 0) or 0))
        return [out, None, lse.float() if lse.dtype != torch.float64 else lse,
                torch.zeros(2, dtype=torch.int64, device=q.device)]
    qt, kt, vt, _ = _heads(q, k, v)
    s = _scores(qt, kt, *_masks(attrs))
    lse = _with_sinks(torch.logsumexp(s, dim=-1), sinks)
    p = torch.exp(s - lse[..., None])
    out = torch.matmul(p, vt.to(p.dtype)).transpose(1, 2).to(q.dtype).contiguous()
    sm = p.to(q.dtype) if attrs.get("return_softmax") else None
    return [out, sm, lse, torch.zeros(2, dtype=torch.int64, device=q.device)]


@register_kernel("flash_attention_grad")
def _flash_attention_grad(ins: Ins, attrs: Mapping[str, Any], ctx: KernelContext):
    """FlashAttention-2's backward (module docstring) on the probabilities P = exp(S - lse),
    the lse including the sinks; a sink's gradient is -sum over batch and queries of
    P_sink * D with P_sink = exp(sink - lse) and D = rowsum(dO * O) (the sink's column of
    dS = P (dP - D) with dP = 0: it attends to no value)."""
    q, k, v = (need(ins, i, "flash_attention_grad", w) for i, w in enumerate("qkv"))
    out, lse = need(ins, 3, "flash_attention_grad", "out"), need(ins, 4, "flash_attention_grad", "softmax_lse")
    g = need(ins, 6, "flash_attention_grad", "out@GRAD")
    sinks = ins[7] if len(ins) > 7 else None
    _check_dropout(attrs)
    cpa = _context_parallel(attrs, ctx, "flash_attention_grad")
    if cpa is not None:
        _refuse_cp_masks(attrs, sinks, "flash_attention_grad")
        return list(cpa[1](q, k, v, out, lse, g, cpa[2], ctx.rank, bool(attrs.get("causal", True)), cpa[3],
                           window=int(attrs.get("sliding_window", 0) or 0)))
    qt, kt, vt, rep = _heads(q, k, v)
    s = _scores(qt, kt, *_masks(attrs))
    dt = s.dtype
    p = torch.exp(s - lse.to(dt)[..., None])
    do, o = g.transpose(1, 2).to(dt), out.transpose(1, 2).to(dt)
    dv = torch.matmul(p.transpose(-1, -2), do)
    dp = torch.matmul(do, vt.to(dt).transpose(-1, -2))
    rowsum = (do * o).sum(dim=-1, keepdim=True)
    ds = p * (dp - rowsum)
    scale = 1.0 / math.sqrt(q.shape[-1])
    dq = torch.matmul(ds, kt.to(dt)) * scale
    dk = torch.matmul(ds.transpose(-1, -2), qt.to(dt)) * scale
    if rep > 1:
        b, h, sk = dk.shape[:3]
        dk = dk.reshape(b, h // rep, rep, sk, dk.shape[-1]).sum(dim=2)
        dv = dv.reshape(b, h // rep, rep, sk, dv.shape[-1]).sum(dim=2)
    back = [t.transpose(1, 2).to(x.dtype).contiguous() for t, x in ((dq, q), (dk, k), (dv, v))]
    if sinks is None:
        return back
    p_sink = torch.exp(sinks.to(dt)[None, :, None] - lse.to(dt))  # [b, h, s]
    return back + [(-(p_sink * rowsum.squeeze(-1)).sum(dim=(0, 2))).to(sinks.dtype)]


# -- rotary position embedding ----------------------------------------------------------


def _rot(x: torch.Tensor, every_two: bool) -> torch.Tensor:
    if every_two:
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack([-x2, x1], dim=-1).reshape(x.shape)
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def rope_tables(seq: int, dim: int, base: float, every_two: bool, start: int = 0,
                dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"):
    """sin, cos tables [1, seq, 1, dim] for positions ``start .. start+seq-1``."""
    inv = base ** (-torch.arange(0, dim, 2, dtype=torch.float64, device=device) / dim)
    ang = torch.arange(start, start + seq, dtype=torch.float64, device=device)[:, None] * inv[None, :]
    if every_two:
        ang = ang.repeat_interleave(2, dim=-1)
    else:
        ang = torch.cat([ang, ang], dim=-1)
    return (torch.sin(ang).to(dtype).reshape(1, seq, 1, dim),
            torch.cos(ang).to(dtype).reshape(1, seq, 1, dim))


def _tables(ref: torch.Tensor, sin, cos, pos, attrs: Mapping[str, Any], ctx: KernelContext):
    every_two = bool(attrs.get("use_neox_rotary_style", True))
    b, s, _, d = ref.shape
    if sin is None:
        base = float(attrs.get("rotary_emb_base", 10000.0))
        sin, cos = rope_tables(s if pos is None else int(pos.max()) + 1, d, base, every_two,
                               ctx.offset(0, 1) if pos is None else 0, ref.dtype, ref.device)
    sin, cos = sin.reshape(-1, d), cos.reshape(-1, d)
    if pos is not None:
        return sin[pos.long()].unsqueeze(2), cos[pos.long()].unsqueeze(2), every_two
    return sin.reshape(1, s, 1, d), cos.reshape(1, s, 1, d), every_two


@register_kernel("fused_rotary_position_embedding")
def _rope(ins: Ins, attrs: Mapping[str, Any], ctx: KernelContext):
    q = need(ins, 0, "fused_rotary_position_embedding", "q")
    sin, cos, et = _tables(q, ins[3], ins[4], ins[5], attrs, ctx)
    outs = []
    for x in ins[:3]:
        outs.append(None if x is None else x * cos.to(x.dtype) + _rot(x, et) * sin.to(x.dtype))
    return outs


@register_kernel("fused_rotary_position_embedding_grad")
def _rope_grad(ins: Ins, attrs: Mapping[str, Any], ctx: KernelContext):
    gq = need(ins, 3, "fused_rotary_position_embedding_grad", "out_q@GRAD")
    sin, cos, et = _tables(gq, ins[0], ins[1], ins[2], attrs, ctx)
    outs: list[torch.Tensor | None] = []
    for g in ins[3:6]:
        outs.append(None if g is None else g * cos.to(g.dtype) - _rot(g * sin.to(g.dtype), et))
    return outs + [None, None, None]

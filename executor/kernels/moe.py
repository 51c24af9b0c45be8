"""Kernels of the mixture-of-experts ops (semantics in :mod:`completion.ops.moe`).

Routing slots: for sequence ``i`` the (token, choice) pairs are visited in token-major
order; the ``r``-th pair routed to expert ``e`` takes row ``i * C + r`` of ``out[e]`` when
``r < C`` (``C = capacity(s, k, E, capacity_factor)``) and is dropped otherwise
(:func:`slots`). Dispatch and combine are gathers / scatter-adds over those rows; their
grads are the transposed scatter / gather. The aux loss's gradient is
``coef * E * f_e / (b s)`` for every token's probability of expert ``e``, its own loss
gradient taken as 1 (Megatron-Core ``MoEAuxLossAutoScaler``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from completion.ops.moe import capacity
from executor.kernels.base import Ins, KernelContext, KernelError, need, register_kernel


def slots(indices: torch.Tensor, experts: int, cap: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(row, kept) for ``indices [b, s, k]``: ``row[i, t, j]`` the row of ``[E * b * C]``
    (flattened ``[E, b * C]``) that pair (t, j) of sequence i fills, ``kept`` whether it fits
    the capacity (rows of dropped pairs are 0 and must be masked). Raises KernelError for an
    index outside [0, E)."""
    b, s, k = indices.shape
    if indices.numel() and (int(indices.min()) < 0 or int(indices.max()) >= experts):
        raise KernelError(f"moe routing: expert index outside [0, {experts})")
    flat = indices.reshape(b, s * k).long()
    onehot = torch.nn.functional.one_hot(flat, experts)  # [b, s*k, E]
    rank = (torch.cumsum(onehot, dim=1) - 1).gather(2, flat.unsqueeze(-1)).squeeze(-1)  # [b, s*k]
    kept = rank < cap
    seq = torch.arange(b, device=indices.device).unsqueeze(1)
    row = flat * (b * cap) + seq * cap + rank.clamp(max=cap - 1)
    return row.reshape(b, s, k), kept.reshape(b, s, k)


def _cap(attrs: Mapping[str, Any], s: int, k: int) -> tuple[int, int]:
    e = int(attrs.get("num_experts", 1))
    return e, capacity(s, k, e, float(attrs.get("capacity_factor", 1.0)))


def _topk_weights(x: torch.Tensor, idx: torch.Tensor, normalize: bool, scale: float = 1.0) -> torch.Tensor:
    w = x.gather(-1, idx)
    w = w / w.sum(-1, keepdim=True) if normalize else w
    return w * scale if scale != 1.0 else w


def _choose(x: torch.Tensor, k: int, groups: int, topk_groups: int) -> torch.Tensor:
    """The k chosen experts of each token: the k largest scores, among the experts of the
    ``topk_groups`` best of ``groups`` equal groups when groups > 1 (a group scored by the
    sum of its two best experts: DeepSeek-V3's node-limited routing, transformers
    ``DeepseekV3MoE.get_topk_indices``; its ``e_score_correction_bias`` is 0 here)."""
    if groups <= 1 or topk_groups >= groups:
        return torch.topk(x, k, dim=-1).indices
    e = x.shape[-1]
    grouped = x.reshape(*x.shape[:-1], groups, e // groups)
    best = grouped.topk(min(2, e // groups), dim=-1).values.sum(-1)
    keep = torch.zeros_like(best, dtype=torch.bool).scatter(-1, best.topk(topk_groups, dim=-1).indices, True)
    masked = grouped.masked_fill(~keep.unsqueeze(-1), float("-inf")).reshape(x.shape)
    return torch.topk(masked, k, dim=-1).indices


@register_kernel("moe_topk")
def _moe_topk(ins: Ins, attrs: Mapping[str, Any], ctx: KernelContext):
    x = need(ins, 0, "moe_topk", "x")
    idx = _choose(x, int(attrs.get("k", 1)), int(attrs.get("groups", 1) or 1),
                  int(attrs.get("topk_groups", 1) or 1))
    return [_topk_weights(x, idx, bool(attrs.get("normalize", True)), float(attrs.get("scale", 1.0))), idx]


@register_kernel("moe_topk_grad")
def _moe_topk_grad(ins: Ins, attrs: Mapping[str, Any], ctx: KernelContext):
    x, idx = need(ins, 0, "moe_topk_grad", "x"), need(ins, 1, "moe_topk_grad", "indices")
    g = need(ins, 2, "moe_topk_grad", "weights@GRAD") * float(attrs.get("scale", 1.0))
    if bool(attrs.get("normalize", True)):  # w = v / S, v = x[idx]: dv = (g - sum(g w)) / S
        v = x.gather(-1, idx)
        tot = v.sum(-1, keepdim=True)
        g = (g - (g * v).sum(-1, keepdim=True) / tot) / tot
    return [torch.zeros_like(x).scatter_add(-1, idx, g)]


@register_kernel("moe_dispatch")
def _moe_dispatch(ins: Ins, attrs: Mapping[str, Any], ctx: KernelContext):
    x, idx = need(ins, 0, "moe_dispatch", "x"), need(ins, 1, "moe_dispatch", "indices")
    b, s, h = x.shape
    e, cap = _cap(attrs, s, idx.shape[2])
    row, kept = slots(idx, e, cap)
    src = x.unsqueeze(2).expand(b, s, idx.shape[2], h)[kept]
    out = x.new_zeros(e * b * cap, h)
    out[row[kept]] = src
    return [out.reshape(e, b * cap, h)]


@register_kernel("moe_dispatch_grad")
def _moe_dispatch_grad(ins: Ins, attrs: Mapping[str, Any], ctx: KernelContext):
    x, idx = need(ins, 0, "moe_dispatch_grad", "x"), need(ins, 1, "moe_dispatch_grad", "indices")
    g = need(ins, 2, "moe_dispatch_grad", "out@GRAD")
    b, s, h = x.shape
    e, cap = _cap(attrs, s, idx.shape[2])
    row, kept = slots(idx, e, cap)
    rows = g.reshape(e * b * cap, h)[row.reshape(-1)].reshape(b, s, idx.shape[2], h)
    return [(rows * kept.unsqueeze(-1)).sum(2), None]


def _gathered(y: torch.Tensor, idx: torch.Tensor, attrs: Mapping[str, Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``y`` rows of every pair ``[b, s, k, h]`` (0 where dropped), the rows and the mask."""
    b, s, k = idx.shape
    e, cap = _cap(attrs, s, k)
    if tuple(y.shape[:2]) != (e, b * cap):
        raise KernelError(f"moe_combine: y {list(y.shape)} is not [E={e}, b*C={b * cap}, h]")
    row, kept = slots(idx, e, cap)
    h = y.shape[2]
    rows = y.reshape(e * b * cap, h)[row.reshape(-1)].reshape(b, s, k, h) * kept.unsqueeze(-1)
    return rows, row, kept


@register_kernel("moe_combine")
def _moe_combine(ins: Ins, attrs: Mapping[str, Any], ctx: KernelContext):
    y, w = need(ins, 0, "moe_combine", "y"), need(ins, 1, "moe_combine", "weights")
    idx = need(ins, 2, "moe_combine", "indices")
    rows, _, _ = _gathered(y, idx, attrs)
    return [(rows * w.unsqueeze(-1)).sum(2)]


@register_kernel("moe_combine_grad")
def _moe_combine_grad(ins: Ins, attrs: Mapping[str, Any], ctx: KernelContext):
    y, w = need(ins, 0, "moe_combine_grad", "y"), need(ins, 1, "moe_combine_grad", "weights")
    idx, g = need(ins, 2, "moe_combine_grad", "indices"), need(ins, 3, "moe_combine_grad", "out@GRAD")
    rows, row, kept = _gathered(y, idx, attrs)
    dw = (rows * g.unsqueeze(2)).sum(-1)
    contrib = (w.unsqueeze(-1) * g.unsqueeze(2)) * kept.unsqueeze(-1)  # [b, s, k, h]
    h = y.shape[2]
    dy = y.new_zeros(y.shape[0] * y.shape[1], h).index_add(0, row.reshape(-1), contrib.reshape(-1, h))
    return [dy.reshape(y.shape), dw, None]


def _fractions(probs: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """``f_e``: share of the b*s tokens routed to expert e, once per choice ``[E]``."""
    e = probs.shape[-1]
    counts = torch.nn.functional.one_hot(idx.reshape(-1).long(), e).sum(0)
    return counts.to(probs.dtype) / (probs.shape[0] * probs.shape[1])


@register_kernel("moe_aux_loss")
def _moe_aux_loss(ins: Ins, attrs: Mapping[str, Any], ctx: KernelContext):
    x, p = need(ins, 0, "moe_aux_loss", "x"), need(ins, 1, "moe_aux_loss", "probs")
    idx = need(ins, 2, "moe_aux_loss", "indices")
    f = _fractions(p, idx)
    pm = p.reshape(-1, p.shape[-1]).mean(0)
    loss = float(attrs.get("coef", 0.0)) * p.shape[-1] * (f * pm).sum()
    return [x, loss]


@register_kernel("moe_aux_loss_grad")
def _moe_aux_loss_grad(ins: Ins, attrs: Mapping[str, Any], ctx: KernelContext):
    p, idx = need(ins, 0, "moe_aux_loss_grad", "probs"), need(ins, 1, "moe_aux_loss_grad", "indices")
    g = need(ins, 2, "moe_aux_loss_grad", "out@GRAD")
    tokens = p.shape[0] * p.shape[1]
    dp = float(attrs.get("coef", 0.0)) * p.shape[-1] * _fractions(p, idx) / tokens
    return [g, dp.expand_as(p).clone(), None]

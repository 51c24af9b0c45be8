"""Kernels of softmax, log_softmax, layer_norm, rms_norm, embedding, swiglu,
cross_entropy_with_softmax and their grads (operand orders of ``completion/ops/nn.py``).

Formulas: softmax grad ``y (g - sum(g y))``; log_softmax grad ``g - exp(y) sum(g)``;
layer_norm (Ba et al. 2016) with ``x_hat = (x - mu) rstd``:
``dx = rstd (dx_hat - mean(dx_hat) - x_hat mean(dx_hat x_hat))``, ``dx_hat = g scale``;
rms_norm (Zhang & Sennrich 2019): ``dx = r (dx_hat - x_hat mean(dx_hat x_hat))``;
cross-entropy with softmax: ``d input = (softmax - onehot(label)) g_loss``.
Statistics (mean/variance/inv_var/lse) are kept in float32, or float64 for float64 inputs.
Embedding supports a vocab-sharded weight: ids outside the local rows
``[offset, offset + rows)`` (offset from ``KernelContext.in_offsets``) read zeros, the
vocab-parallel lookup of Megatron-LM (Shoeybi et al. 2019, sec. 3), whose partial sums an
all_reduce completes. Grads shape their results by the op's own local result types
(``KernelContext.out_types``) when given, never by a forward operand's block.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from executor.kernels.base import Ins, KernelContext, KernelError, need, register_kernel


def stat_dtype(x: torch.Tensor) -> torch.dtype:
    """float64 for float64 inputs, else float32 (statistics precision)."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _ax(attrs: Mapping[str, Any], ndim: int, key: str = "axis", default: int = -1) -> int:
    a = int(attrs.get(key, default))
    return a + ndim if a < 0 else a


@register_kernel("softmax")
def _softmax(ins: Ins, attrs: Mapping[str, Any], ctx: KernelContext):
    x = need(ins, 0, "softmax", "x")
    return [torch.softmax(x, dim=_ax(attrs, x.ndim)) if x.ndim else torch.ones_like(x)]


@register_kernel("log_softmax")
def _log_softmax(ins: Ins, attrs: Mapping[str, Any], ctx: KernelContext):
    x = need(ins, 0, "log_softmax", "x")
    return [torch.log_softmax(x, dim=_ax(attrs, x.ndim)) if x.ndim else torch.zeros_like(x)]


@register_kernel("softmax_grad")
def _softmax_grad(ins: Ins, attrs: Mapping[str, Any], ctx: KernelContext):
    y, g = need(ins, 0, "softmax_grad", "out"), need(ins, 1, "softmax_grad", "out@GRAD")
    ax = _ax(attrs, y.ndim)
    return [y * (g - (g * y).sum(dim=ax, keepdim=True))]


@register_kernel("log_softmax_grad")
def _log_softmax_grad(ins: Ins, attrs: Mapping[str, Any], ctx: KernelContext):
    y, g = need(ins, 0, "log_softmax_grad", "out"), need(ins, 1, "log_softmax_grad", "out@GRAD")
    ax = _ax(attrs, y.ndim)
    return [g - torch.exp(y) * g.sum(dim=ax, keepdim=True)]


# -- norms ------------------------------------------------------------------------------


def _rows(x: torch.Tensor, attrs: Mapping[str, Any], default: int) -> torch.Tensor:
    """x as [left, normalized] at begin_norm_axis."""
    b = _ax(attrs, x.ndim, "begin_norm_axis", default)
    left = 1
    for s in x.shape[:b]:
        left *= s
    return x.reshape(left, -1)


@register_kernel("layer_norm")
def _layer_norm(ins: Ins, attrs: Mapping[str, Any], ctx: KernelContext):
    x = need(ins, 0, "layer_norm", "x")
    scale, bias = ins[1] if len(ins) > 1 else None, ins[2] if len(ins) > 2 else None
    eps = float(attrs.get("epsilon", 1e-5))
    xr = _rows(x, attrs, 1).to(stat_dtype(x))
    mean = xr.mean(dim=1)
    var = xr.var(dim=1, unbiased=False)
    y = (xr - mean[:, None]) * torch.rsqrt(var + eps)[:, None]
    if scale is not None:
        y = y * scale.reshape(1, -1).to(y.dtype)
    if bias is not None:
        y = y + bias.reshape(1, -1).to(y.dtype)
    return [y.to(x.dtype).reshape(x.shape), mean, var]


@register_kernel("layer_norm_grad")
def _layer_norm_grad(ins: Ins, attrs: Mapping[str, Any], ctx: KernelContext):
    x = need(ins, 0, "layer_norm_grad", "x")
    scale, bias = ins[1], ins[2]
    mean, var = need(ins, 3, "layer_norm_grad", "mean"), need(ins, 4, "layer_norm_grad", "variance")
    g = need(ins, 5, "layer_norm_grad", "out@GRAD")
    eps = float(attrs.get("epsilon", 1e-5))
    dt = stat_dtype(x)
    xr, gr = _rows(x, attrs, 1).to(dt), _rows(g, attrs, 1).to(dt)
    rstd = torch.rsqrt(var.to(dt) + eps)[:, None]
    xhat = (xr - mean.to(dt)[:, None]) * rstd
    dxhat = gr * scale.reshape(1, -1).to(dt) if scale is not None else gr
    dx = rstd * (dxhat - dxhat.mean(dim=1, keepdim=True)
                 - xhat * (dxhat * xhat).mean(dim=1, keepdim=True))
    dscale = (gr * xhat).sum(dim=0).reshape(ctx.out_shape(1, scale.shape)).to(scale.dtype) \
        if scale is not None else None
    dbias = gr.sum(dim=0).reshape(ctx.out_shape(2, bias.shape)).to(bias.dtype) if bias is not None else None
    return [dx.to(x.dtype).reshape(ctx.out_shape(0, x.shape)), dscale, dbias]


@register_kernel("rms_norm")
def _rms_norm(ins: Ins, attrs: Mapping[str, Any], ctx: KernelContext):
    x, w = need(ins, 0, "rms_norm", "x"), need(ins, 1, "rms_norm", "norm_weight")
    eps = float(attrs.get("epsilon", 1e-5))
    xr = _rows(x, attrs, -1).to(stat_dtype(x))
    inv = torch.rsqrt((xr * xr).mean(dim=1) + eps)
    y = xr * inv[:, None] * w.reshape(1, -1).to(xr.dtype)
    return [y.to(x.dtype).reshape(x.shape), inv]


@register_kernel("rms_norm_grad")
def _rms_norm_grad(ins: Ins, attrs: Mapping[str, Any], ctx: KernelContext):
    x, w = need(ins, 0, "rms_norm_grad", "x"), need(ins, 1, "rms_norm_grad", "norm_weight")
    inv, g = need(ins, 2, "rms_norm_grad", "inv_var"), need(ins, 3, "rms_norm_grad", "out@GRAD")
    dt = stat_dtype(x)
    xr, gr = _rows(x, attrs, -1).to(dt), _rows(g, attrs, -1).to(dt)
    r = inv.to(dt)[:, None]
    xhat = xr * r
    dxhat = gr * w.reshape(1, -1).to(dt)
    dx = r * (dxhat - xhat * (dxhat * xhat).mean(dim=1, keepdim=True))
    dw = (gr * xhat).sum(dim=0).reshape(ctx.out_shape(1, w.shape)).to(w.dtype)
    return [dx.to(x.dtype).reshape(ctx.out_shape(0, x.shape)), dw]


# -- embedding --------------------------------------------------------------------------


def _local_ids(x: torch.Tensor, w: torch.Tensor, attrs: Mapping[str, Any], ctx: KernelContext):
    start = ctx.offset(1, 0)
    ids = x.long() - start
    hit = (ids >= 0) & (ids < w.shape[0])
    pad = int(attrs.get("padding_idx", -1))
    if pad >= 0:
        hit &= x.long() != pad
    return ids.clamp(0, max(w.shape[0] - 1, 0)), hit


@register_kernel("embedding")
def _embedding(ins: Ins, attrs: Mapping[str, Any], ctx: KernelContext):
    x, w = need(ins, 0, "embedding", "x"), need(ins, 1, "embedding", "weight")
    if w.shape[0] == 0:
        return [torch.zeros(*x.shape, w.shape[1], dtype=w.dtype, device=w.device)]
    ids, hit = _local_ids(x, w, attrs, ctx)
    return [w[ids] * hit.unsqueeze(-1).to(w.dtype)]


@register_kernel("embedding_grad")
def _embedding_grad(ins: Ins, attrs: Mapping[str, Any], ctx: KernelContext):
    x, w = need(ins, 0, "embedding_grad", "x"), need(ins, 1, "embedding_grad", "weight")
    g = need(ins, 2, "embedding_grad", "out@GRAD")
    dw = torch.zeros_like(w, dtype=g.dtype)
    if w.shape[0]:
        ids, hit = _local_ids(x, w, attrs, ctx)
        gg = (g * hit.unsqueeze(-1).to(g.dtype)).reshape(-1, w.shape[1])
        dw.index_add_(0, ids.reshape(-1), gg)
    return [None, dw]


# -- swiglu -----------------------------------------------------------------------------


def _dsilu(x: torch.Tensor) -> torch.Tensor:
    s = torch.sigmoid(x)
    return s * (1 + x * (1 - s))


@register_kernel("swiglu")
def _swiglu(ins: Ins, attrs: Mapping[str, Any], ctx: KernelContext):
    x = need(ins, 0, "swiglu", "x")
    y = ins[1] if len(ins) > 1 else None
    if y is None:
        x, y = x.chunk(2, dim=-1)
    return [torch.nn.functional.silu(x) * y]


@register_kernel("swiglu_grad")
def _swiglu_grad(ins: Ins, attrs: Mapping[str, Any], ctx: KernelContext):
    x, y, g = need(ins, 0, "swiglu_grad", "x"), ins[1], need(ins, 2, "swiglu_grad", "out@GRAD")
    if y is None:
        a, b = x.chunk(2, dim=-1)
        return [torch.cat([g * b * _dsilu(a), g * torch.nn.functional.silu(a)], dim=-1), None]
    return [g * y * _dsilu(x), g * torch.nn.functional.silu(x)]


# -- cross entropy ----------------------------------------------------------------------


def _target(label: torch.Tensor, n_local: int, ax: int, ignore: int, offset: int = 0):
    """(index, here, valid) of hard ``label`` over the local classes ``[offset, offset +
    n_local)``: the local index to gather (clamped), whether this rank holds the label,
    and whether the label is not ``ignore``."""
    lab = label.long()
    valid = lab != ignore
    local = lab - offset
    here = valid & (local >= 0) & (local < n_local)
    return local.clamp(0, max(n_local - 1, 0)), here, valid


def _class_sharded(x: torch.Tensor, ax: int, ctx: KernelContext) -> bool:
    return ctx.comm is not None and ctx.global_shape(0, x.shape)[ax] != x.shape[ax]


@register_kernel("cross_entropy_with_softmax")
def _cross_entropy(ins: Ins, attrs: Mapping[str, Any], ctx: KernelContext):
    """Softmax cross entropy; with the class axis sharded (vocab-parallel, Megatron-LM
    ``vocab_parallel_cross_entropy``) the row max, the sum of exponentials and the target
    logit are all-reduced over the class shards (``KernelContext.all_reduce_over``), so
    each rank gets the full loss and its block of the softmax.

    Passes over the [rows, classes] logits (what the kernel moves; the cost model counts
    one read and one write): unsharded, ``log_softmax`` (fused: read twice, write once) and
    its ``exp`` (read + write) -- the target is a gather; sharded, max (read), x - max
    (read + write), exp in place (read + write), sum (read), division in place (read +
    write)."""
    x, label = need(ins, 0, "cross_entropy", "input"), need(ins, 1, "cross_entropy", "label")
    if not attrs.get("use_softmax", True):
        raise KernelError("cross_entropy_with_softmax: use_softmax=False is not supported")
    ax = _ax(attrs, x.ndim)
    xf = x.to(stat_dtype(x))
    soft = bool(attrs.get("soft_label"))
    if not _class_sharded(x, ax, ctx):
        logp = torch.log_softmax(xf, dim=ax)
        if soft:
            loss = -(label.to(logp.dtype) * logp).sum(dim=ax, keepdim=True)
        else:
            idx, here, valid = _target(label, x.shape[ax], ax, int(attrs.get("ignore_index", -100)))
            loss = -logp.gather(ax, idx) * valid.to(logp.dtype)
        return [torch.exp(logp).to(x.dtype), loss.to(x.dtype)]
    m = ctx.all_reduce_over(xf.detach().amax(dim=ax, keepdim=True), 0, ax, "max")
    e = (xf - m).exp_()
    total = ctx.all_reduce_over(e.sum(dim=ax, keepdim=True), 0, ax, "sum")
    lse = torch.log(total) + m
    if soft:
        loss = ctx.all_reduce_over(-(label.to(xf.dtype) * (xf - lse)).sum(dim=ax, keepdim=True),
                                   0, ax, "sum")
    else:
        idx, here, valid = _target(label, x.shape[ax], ax, int(attrs.get("ignore_index", -100)),
                                   ctx.offset(0, ax))
        target = ctx.all_reduce_over(xf.gather(ax, idx) * here.to(xf.dtype), 0, ax, "sum")
        loss = (lse - target) * valid.to(xf.dtype)
    return [e.div_(total).to(x.dtype), loss.to(x.dtype)]


@register_kernel("cross_entropy_with_softmax_grad")
def _cross_entropy_grad(ins: Ins, attrs: Mapping[str, Any], ctx: KernelContext):
    """``d input = (softmax - onehot(label)) g``: hard labels as softmax * g (read + write)
    and a scatter-add of -g at the (local) label positions."""
    label = need(ins, 0, "cross_entropy_grad", "label")
    sm, g = need(ins, 1, "cross_entropy_grad", "softmax"), need(ins, 2, "cross_entropy_grad", "loss@GRAD")
    ax = _ax(attrs, sm.ndim)
    if attrs.get("soft_label"):
        lab = label.to(sm.dtype)
        total = ctx.all_reduce_over(lab.sum(dim=ax, keepdim=True), 0, ax, "sum")
        return [(sm * total - lab) * g, None]
    idx, here, valid = _target(label, sm.shape[ax], ax, int(attrs.get("ignore_index", -100)),
                               ctx.offset(1, ax))
    gv = g * valid.to(sm.dtype)
    out = sm * gv
    return [out.scatter_add_(ax, idx, -(gv * here.to(sm.dtype)).expand_as(idx).to(sm.dtype)), None]

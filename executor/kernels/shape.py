"""Layout ops (reshape, transpose, split, concat, slice, squeeze, unsqueeze, expand) and reductions
(sum, mean, max) with their grads.

Shape attributes in a program state *global* shapes; after partition a rank holds a block,
so reshape / split / squeeze / unsqueeze take their result shapes from
``KernelContext.out_types`` (the rank's local types) when given and fall back to the
attributes otherwise. Grads: reshape-like ops reshape the gradient back; transpose applies
the inverse permutation; split and concat swap roles; slice scatters into zeros;
``sum_grad`` broadcasts, ``mean_grad`` broadcasts and divides by the reduced element count,
``mean_grad`` divides by the *global* count of reduced elements (a block of a
batch-sharded mean gets ``g / N_global``, the gradient of the global mean), and
``max_grad`` routes the gradient to every element equal to the maximum (Paddle's rule).

Local shapes of grads: a grad kernel shapes each gradient by the *local type of its own
result* (``KernelContext.out_types``, from the result's dist attr), never by the local
shape of the forward operand it reads. Completion may lay a forward input out otherwise
than its gradient (the input of a reshape is Shard(1) while the reshape needed it
replicated, so its gradient is replicated): the forward operand's block then has another
shape than the gradient's. The forward operand's shape is only the fallback when the
caller gives no local types.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from executor.kernels.base import (
    Ins,
    KernelContext,
    KernelError,
    need,
    norm_axes,
    register_kernel,
    torch_dtype,
)


def _attr_shape(x: torch.Tensor, spec: Sequence[int]) -> list[int]:
    return [x.shape[i] if int(s) == 0 and i < x.ndim else int(s) for i, s in enumerate(spec)]


@register_kernel("reshape")
def _reshape(ins: Ins, attrs: Mapping[str, Any], ctx: KernelContext):
    x = need(ins, 0, "reshape", "x")
    if ctx.out_types and ctx.out_types[0] is not None:
        return [x.reshape(ctx.out_shape(0))]
    return [x.reshape(_attr_shape(x, attrs.get("shape") or []))]


@register_kernel("squeeze")
def _squeeze(ins: Ins, attrs: Mapping[str, Any], ctx: KernelContext):
    x = need(ins, 0, "squeeze", "x")
    axes = norm_axes(attrs.get("axis") or [], x.ndim)
    shape = [s for i, s in enumerate(x.shape) if not (i in axes and s == 1)]
    return [x.reshape(ctx.out_shape(0, shape))]


@register_kernel("unsqueeze")
def _unsqueeze(ins: Ins, attrs: Mapping[str, Any], ctx: KernelContext):
    x = need(ins, 0, "unsqueeze", "x")
    shape = list(x.shape)
    for a in attrs.get("axis") or []:
        a = int(a)
        shape.insert(a + len(shape) + 1 if a < 0 else a, 1)
    return [x.reshape(ctx.out_shape(0, shape))]


@register_kernel("reshape_grad", "squeeze_grad", "unsqueeze_grad")
def _reshape_grad(ins: Ins, attrs: Mapping[str, Any], ctx: KernelContext):
    x, g = need(ins, 0, "reshape_grad", "x"), need(ins, 1, "reshape_grad", "out@GRAD")
    return [g.reshape(ctx.out_shape(0, x.shape))]


def _perm(attrs: Mapping[str, Any], ndim: int) -> list[int]:
    perm = [int(p) + ndim if int(p) < 0 else int(p) for p in attrs.get("perm") or []]
    if sorted(perm) != list(range(ndim)):
        raise KernelError(f"transpose: perm {attrs.get('perm')} is not a permutation of {ndim} dims")
    return perm


@register_kernel("transpose")
def _transpose(ins: Ins, attrs: Mapping[str, Any], ctx: KernelContext):
    x = need(ins, 0, "transpose", "x")
    return [x.permute(_perm(attrs, x.ndim)).contiguous()]


@register_kernel("transpose_grad")
def _transpose_grad(ins: Ins, attrs: Mapping[str, Any], ctx: KernelContext):
    g = need(ins, 0, "transpose_grad", "out@GRAD")
    perm = _perm(attrs, g.ndim)
    inv = [0] * len(perm)
    for i, p in enumerate(perm):
        inv[p] = i
    return [g.permute(inv).contiguous()]


def _axis(attrs: Mapping[str, Any], ndim: int) -> int:
    a = int(attrs.get("axis", 0))
    return a + ndim if a < 0 else a


def _sections(x: torch.Tensor, ax: int, attrs: Mapping[str, Any], ctx: KernelContext) -> list[int]:
    if ctx.out_types and all(t is not None for t in ctx.out_types):
        return [int(t.shape[ax]) for t in ctx.out_types]  # type: ignore[union-attr]
    secs = attrs.get("num_or_sections", 1)
    size = x.shape[ax]
    if isinstance(secs, int):
        return [size // secs] * secs
    secs = [int(s) for s in secs]
    if -1 in secs:
        secs[secs.index(-1)] = size - sum(s for s in secs if s != -1)
    return secs


@register_kernel("expand")
def _expand(ins: Ins, attrs: Mapping[str, Any], ctx: KernelContext):
    """x broadcast to the rank's block of ``shape`` (its local result type)."""
    x = need(ins, 0, "expand", "x")
    spec = [int(d) for d in attrs.get("shape") or []]
    shape = ctx.out_shape(0, tuple(x.shape[i - (len(spec) - x.ndim)] if d == -1 else d
                                   for i, d in enumerate(spec)))
    return [x.expand(*shape).contiguous()]


@register_kernel("expand_grad")
def _expand_grad(ins: Ins, attrs: Mapping[str, Any], ctx: KernelContext):
    """The gradient summed over the dims expand stretched (and its new leading dims), shaped
    as x's local gradient."""
    x, g = need(ins, 0, "expand_grad", "x"), need(ins, 1, "expand_grad", "out@GRAD")
    shape = ctx.out_shape(0, tuple(x.shape))
    lead = g.ndim - len(shape)
    if lead:
        g = g.sum(dim=tuple(range(lead)))
    dims = tuple(i for i, n in enumerate(shape) if n == 1 and g.shape[i] != 1)
    return [(g.sum(dim=dims, keepdim=True) if dims else g).reshape(shape)]


@register_kernel("split")
def _split(ins: Ins, attrs: Mapping[str, Any], ctx: KernelContext):
    x = need(ins, 0, "split", "x")
    ax = _axis(attrs, x.ndim)
    return list(torch.split(x, _sections(x, ax, attrs, ctx), dim=ax))


@register_kernel("split_grad")
def _split_grad(ins: Ins, attrs: Mapping[str, Any], ctx: KernelContext):
    gs = [need(ins, i, "split_grad", "out@GRAD") for i in range(len(ins))]
    return [torch.cat(gs, dim=_axis(attrs, gs[0].ndim))]


@register_kernel("concat")
def _concat(ins: Ins, attrs: Mapping[str, Any], ctx: KernelContext):
    xs = [need(ins, i, "concat", "x") for i in range(len(ins))]
    return [torch.cat(xs, dim=_axis(attrs, xs[0].ndim))]


@register_kernel("concat_grad")
def _concat_grad(ins: Ins, attrs: Mapping[str, Any], ctx: KernelContext):
    xs = [need(ins, i, "concat_grad", "x") for i in range(len(ins) - 1)]
    g = need(ins, len(ins) - 1, "concat_grad", "out@GRAD")
    ax = _axis(attrs, g.ndim)
    return list(torch.split(g, [ctx.out_shape(i, x.shape)[ax] for i, x in enumerate(xs)], dim=ax))


def _slice_index(shape: Sequence[int], attrs: Mapping[str, Any]) -> tuple[slice, ...]:
    idx = [slice(None)] * len(shape)
    for a, s, e in zip(attrs.get("axes") or [], attrs.get("starts") or [], attrs.get("ends") or [],
                       strict=True):
        ax = int(a) + len(shape) if int(a) < 0 else int(a)
        idx[ax] = slice(*slice(int(s), int(e)).indices(shape[ax])[:2])
    return tuple(idx)


@register_kernel("slice")
def _slice(ins: Ins, attrs: Mapping[str, Any], ctx: KernelContext):
    """Python-style clamped slicing on ``axes`` (positions relative to the operand the
    kernel receives); ``decrease_axis`` drops those unit dims."""
    x = need(ins, 0, "slice", "input")
    out = x[_slice_index(x.shape, attrs)]
    dec = norm_axes(attrs.get("decrease_axis"), x.ndim) if attrs.get("decrease_axis") else []
    if dec:
        out = out.reshape([s for i, s in enumerate(out.shape) if i not in dec])
    return [out.contiguous()]


@register_kernel("slice_grad")
def _slice_grad(ins: Ins, attrs: Mapping[str, Any], ctx: KernelContext):
    x, g = need(ins, 0, "slice_grad", "input"), need(ins, 1, "slice_grad", "out@GRAD")
    shape = ctx.out_shape(0, x.shape)
    idx = _slice_index(shape, attrs)
    out = torch.zeros(shape, dtype=g.dtype, device=g.device)
    out[idx] = g.reshape(out[idx].shape)
    return [out]


# -- reductions -------------------------------------------------------------------------


@register_kernel("sum")
def _sum(ins: Ins, attrs: Mapping[str, Any], ctx: KernelContext):
    x = need(ins, 0, "sum", "x")
    axes = norm_axes(attrs.get("axis"), x.ndim)
    dt = torch_dtype(attrs.get("dtype"), x.dtype)
    return [x.sum(dim=axes, keepdim=bool(attrs.get("keepdim")), dtype=dt) if axes else x.to(dt)]


@register_kernel("mean")
def _mean(ins: Ins, attrs: Mapping[str, Any], ctx: KernelContext):
    x = need(ins, 0, "mean", "x")
    axes = norm_axes(attrs.get("axis"), x.ndim)
    return [x.mean(dim=axes, keepdim=bool(attrs.get("keepdim"))) if axes else x.clone()]


@register_kernel("max")
def _max(ins: Ins, attrs: Mapping[str, Any], ctx: KernelContext):
    x = need(ins, 0, "max", "x")
    axes = norm_axes(attrs.get("axis"), x.ndim)
    return [x.amax(dim=axes, keepdim=bool(attrs.get("keepdim"))) if axes else x.clone()]


def _expand_back(shape: Sequence[int], g: torch.Tensor, attrs: Mapping[str, Any]) -> torch.Tensor:
    """g reshaped with the reduced dims kept (size 1), then broadcast to ``shape`` (the
    local shape of the gradient)."""
    shape = tuple(shape)
    axes = norm_axes(attrs.get("axis"), len(shape))
    kept = [1 if i in axes else s for i, s in enumerate(shape)]
    return g.reshape(kept).expand(shape)


@register_kernel("sum_grad")
def _sum_grad(ins: Ins, attrs: Mapping[str, Any], ctx: KernelContext):
    x, g = need(ins, 0, "sum_grad", "x"), need(ins, 1, "sum_grad", "out@GRAD")
    return [_expand_back(ctx.out_shape(0, x.shape), g, attrs).to(x.dtype).contiguous()]


@register_kernel("mean_grad")
def _mean_grad(ins: Ins, attrs: Mapping[str, Any], ctx: KernelContext):
    x, g = need(ins, 0, "mean_grad", "x"), need(ins, 1, "mean_grad", "out@GRAD")
    axes = norm_axes(attrs.get("axis"), x.ndim)
    full = ctx.global_shape(0, x.shape)  # the global op divides by the global count
    n = math.prod(full[a] for a in axes)
    return [(_expand_back(ctx.out_shape(0, x.shape), g, attrs) / max(n, 1)).contiguous()]


@register_kernel("max_grad")
def _max_grad(ins: Ins, attrs: Mapping[str, Any], ctx: KernelContext):
    names = ("x", "out", "out@GRAD")
    x, out, g = (need(ins, i, "max_grad", w) for i, w in enumerate(names))
    shape = ctx.out_shape(0, x.shape)
    hit = (x == _expand_back(x.shape, out, attrs)).to(g.dtype)
    return [_expand_back(shape, g, attrs) * hit]

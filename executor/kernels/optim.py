"""Optimizer kernels ``sgd_``, ``adam_``, ``adamw_`` (in place, Paddle operand orders).

SGD: p <- p - lr g. Adam (Kingma & Ba 2015, Algorithm 1, in the form of Paddle's phi
``adam`` kernel): m <- b1 m + (1-b1) g; v <- b2 v + (1-b2) g^2;
lr_t = lr sqrt(1 - b2^t) / (1 - b1^t); p <- p - lr_t m / (sqrt(v) + eps sqrt(1 - b2^t));
then the beta powers advance (b^t <- b^t * b). The beta-power state holds b^t for the
*current* step, so it starts at b (as ``completion.apply_optimizer`` initialises it), which
makes this equal to torch.optim.Adam step for step. AdamW (Loshchilov & Hutter 2019,
decoupled decay): p <- p (1 - lr lr_ratio coeff) before the Adam update (when ``with_decay``).
Arithmetic is done in float32 (or float64 for float64 params) and written back in place;
a ``master_param`` (fp32 copy of a 16-bit param) is updated instead and cast into param.
ZeRO (Rajbhandari et al. 2020): when the moments hold only a block of the parameter (stage
1/2, ``completion.zero``), or SGD's gradient does (stage 2/3: reduce-scattered, SGD has no
moments), the rank updates that block of the parameter and the blocks are all-gathered
back into the whole parameter (``KernelContext.all_reduce_over(..., "gather")``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from executor.kernels.base import Ins, KernelContext, need, register_kernel


def _work_dtype(p: torch.Tensor) -> torch.dtype:
    return torch.float64 if p.dtype == torch.float64 else torch.float32


@register_kernel("sgd_")
@torch.no_grad()
def _sgd(ins: Ins, attrs: Mapping[str, Any], ctx: KernelContext):
    p, lr, g = (need(ins, i, "sgd_", w) for i, w in enumerate(("param", "learning_rate", "grad")))
    master = ins[3] if len(ins) > 3 else None
    target = master if master is not None else p
    dt = _work_dtype(target)
    # ZeRO-2/3: the gradient may hold one block of the parameter (reduce-scattered); update
    # that block and gather the blocks back into the whole parameter, as Adam does
    start = [ctx.offset(2, i) - ctx.offset(0, i) for i in range(g.ndim)]
    w_blk, d = _zero_block(target, g, start)
    new = w_blk.to(dt) - lr.to(dt).reshape(()) * g.to(dt)
    if d is None:
        target.copy_(new)
    else:
        target.copy_(ctx.all_reduce_over(new.to(target.dtype), 2, d, "gather"))
    if master is not None:
        p.copy_(master)
    return [p, master]


def _adam_update(w, g, m1, m2, b1p, b2p, lr_v, attrs, decay: bool):
    """One Adam(W) update of ``w`` (float tensor) in the work dtype; moments in place."""
    b1, b2 = float(attrs.get("beta1", 0.9)), float(attrs.get("beta2", 0.999))
    eps = float(attrs.get("epsilon", 1e-8))
    dt = w.dtype
    if decay and attrs.get("with_decay", True):
        w = w * (1 - lr_v * float(attrs.get("coeff", 0.01)))
    gd = g.to(dt)
    m1.copy_(b1 * m1.to(dt) + (1 - b1) * gd)
    m2.copy_(b2 * m2.to(dt) + (1 - b2) * gd * gd)
    bp1, bp2 = b1p.to(dt).reshape(()), b2p.to(dt).reshape(())
    lr_t = lr_v * torch.sqrt(1 - bp2) / (1 - bp1)
    return w - lr_t * m1.to(dt) / (torch.sqrt(m2.to(dt)) + eps * torch.sqrt(1 - bp2))


def _zero_block(t: torch.Tensor, like: torch.Tensor, start: int):
    """The block of ``t`` matching the moment block ``like`` (ZeRO: states hold a block
    of the parameter along one dim starting at local index ``start``), or ``t``."""
    if t.shape == like.shape:
        return t, None
    d = next(i for i, (a, b) in enumerate(zip(t.shape, like.shape, strict=True)) if a != b)
    return t.narrow(d, start[d], like.shape[d]), d


def _adam(ins: Ins, attrs: Mapping[str, Any], ctx: KernelContext, decay: bool, name: str):
    names = ("param", "grad", "learning_rate", "moment1", "moment2", "beta1_pow", "beta2_pow")
    p, g, lr, m1, m2, b1p, b2p = (need(ins, i, name, w) for i, w in enumerate(names))
    master = ins[7] if len(ins) > 7 else None
    skip = ins[8] if len(ins) > 8 else None
    if skip is not None and bool(skip.reshape(-1)[0]):
        return [p, m1, m2, b1p, b2p, master]
    target = master if master is not None else p
    dt = _work_dtype(target)
    lr_v = lr.to(dt).reshape(()) * float(attrs.get("lr_ratio", 1.0))
    # ZeRO: moments may hold one block of the parameter (offsets are global; the local
    # start inside the parameter / gradient block is the difference of the two offsets)
    start_p = [ctx.offset(3, i) - ctx.offset(0, i) for i in range(m1.ndim)]
    start_g = [ctx.offset(3, i) - ctx.offset(1, i) for i in range(m1.ndim)]
    w_blk, d = _zero_block(target, m1, start_p)
    g_blk, _ = _zero_block(g, m1, start_g)
    new = _adam_update(w_blk.to(dt), g_blk, m1, m2, b1p, b2p, lr_v, attrs, decay)
    if d is None:
        target.copy_(new)
    else:  # every rank updated its block; gather the blocks into the whole parameter
        target.copy_(ctx.all_reduce_over(new.to(target.dtype), 3, d, "gather"))
    if master is not None:
        p.copy_(master)
    b1p.mul_(float(attrs.get("beta1", 0.9)))
    b2p.mul_(float(attrs.get("beta2", 0.999)))
    return [p, m1, m2, b1p, b2p, master]


@register_kernel("adam_")
@torch.no_grad()
def _adam_kernel(ins: Ins, attrs: Mapping[str, Any], ctx: KernelContext):
    return _adam(ins, attrs, ctx, False, "adam_")


@register_kernel("adamw_")
@torch.no_grad()
def _adamw_kernel(ins: Ins, attrs: Mapping[str, Any], ctx: KernelContext):
    return _adam(ins, attrs, ctx, True, "adamw_")

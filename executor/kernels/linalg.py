"""``matmul`` and ``matmul_grad`` with transpose flags and broadcast batch dims.

Forward: numpy ``matmul`` semantics after the optional transposes of the last two dims
(Paddle ``matmul(x, y, transpose_x, transpose_y)``); a 1-D operand is promoted as numpy does.
Grad (the chain rule for C = A B): dA = dC B^T, dB = A^T dC, mapped back through the
transposes and summed over broadcast batch dims, shaped as the grad op's own local result
types (``KernelContext.out_types``) when given.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from executor.kernels.base import Ins, KernelContext, need, register_kernel, unbroadcast


def _t(a: torch.Tensor) -> torch.Tensor:
    return a.transpose(-1, -2)


def _operands(x: torch.Tensor, y: torch.Tensor, attrs: Mapping[str, Any]):
    a = x.unsqueeze(0) if x.ndim == 1 else x
    b = y.unsqueeze(-1) if y.ndim == 1 else y
    if attrs.get("transpose_x") and x.ndim > 1:
        a = _t(a)
    if attrs.get("transpose_y") and y.ndim > 1:
        b = _t(b)
    return a, b


@register_kernel("matmul")
def _matmul(ins: Ins, attrs: Mapping[str, Any], ctx: KernelContext):
    x, y = need(ins, 0, "matmul", "x"), need(ins, 1, "matmul", "y")
    a, b = _operands(x, y, attrs)
    out = torch.matmul(a, b)
    if x.ndim == 1:
        out = out.squeeze(-2)
    if y.ndim == 1:
        out = out.squeeze(-1)
    return [out]


@register_kernel("matmul_grad")
def _matmul_grad(ins: Ins, attrs: Mapping[str, Any], ctx: KernelContext):
    x, y, g = (need(ins, i, "matmul_grad", w) for i, w in enumerate(("x", "y", "out@GRAD")))
    a, b = _operands(x, y, attrs)
    gc = g
    if x.ndim == 1:
        gc = gc.unsqueeze(-2)
    if y.ndim == 1:
        gc = gc.unsqueeze(-1)
    da = db = None
    if ctx.wants(0):
        da = unbroadcast(torch.matmul(gc, _t(b)), a.shape)
        if attrs.get("transpose_x") and x.ndim > 1:
            da = _t(da)
        da = da.reshape(ctx.out_shape(0, x.shape))
    if ctx.wants(1) and b.ndim == 2 and a.ndim > 2:
        # a weight read by a batched activation: sum_b a_b^T g_b = A^T G with the batch
        # dims flattened into rows -- one GEMM instead of a batched one plus a reduction
        db = torch.matmul(_t(a.reshape(-1, a.shape[-1])), gc.reshape(-1, gc.shape[-1]))
        if attrs.get("transpose_y"):
            db = _t(db)
        db = db.reshape(ctx.out_shape(1, y.shape))
    elif ctx.wants(1):
        db = unbroadcast(torch.matmul(_t(a), gc), b.shape)
        if attrs.get("transpose_y") and y.ndim > 1:
            db = _t(db)
        db = db.reshape(ctx.out_shape(1, y.shape))
    return [da, db]

"""Kernels of the reshard pass's local steps (``completion.ops.collective``): ``local_slice``,
``zero_fill`` and ``local_scale``. Each acts on this rank's block, knowing its position i in
its group of n ranks (``KernelContext.group`` / ``rank``), with the block sizes of
``completion.dist_attr.shard_range`` (ceil chunks; trailing ranks may hold fewer or zero
rows) — the same rules as the numpy reference ``completion.testing.VirtualMesh``:

- local_slice (Replicate -> Shard(e)): keep rows ``shard_range(size_e, n, i)`` of dim e;
- zero_fill (Shard(d) -> Partial(sum)): a zero tensor of the full extent along d (the
  local result shape) with the block at its offset; (Replicate -> Partial(sum), no
  ``src_dim``): position 0 keeps the value, the others hold zeros;
- local_scale (Partial(sum) <-> Partial(avg)): multiply by ``factor``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from completion.dist_attr import shard_range
from executor.kernels.base import Ins, KernelContext, need, register_kernel


def _dim(attrs: Mapping[str, Any], key: str, ndim: int) -> int | None:
    d = attrs.get(key)
    if d is None or int(d) < 0:
        return None
    return int(d)


@register_kernel("local_slice")
def _local_slice(ins: Ins, attrs: Mapping[str, Any], ctx: KernelContext):
    x = need(ins, 0, "local_slice", "x")
    e = _dim(attrs, "dst_dim", x.ndim)
    i, n = ctx.group_index("local_slice")
    lo, hi = shard_range(x.shape[e], n, i)
    return [x.narrow(e, lo, hi - lo).contiguous()]


@register_kernel("zero_fill")
def _zero_fill(ins: Ins, attrs: Mapping[str, Any], ctx: KernelContext):
    x = need(ins, 0, "zero_fill", "x")
    d = _dim(attrs, "src_dim", x.ndim)
    i, n = ctx.group_index("zero_fill")
    if d is None:
        return [x.clone() if i == 0 else torch.zeros_like(x)]
    shape = ctx.out_shape(0)
    total = shape[d]
    lo, hi = shard_range(total, n, i)
    out = torch.zeros(shape, dtype=x.dtype, device=x.device)
    out.narrow(d, lo, hi - lo).copy_(x)
    return [out]


@register_kernel("local_scale")
def _local_scale(ins: Ins, attrs: Mapping[str, Any], ctx: KernelContext):
    return [need(ins, 0, "local_scale", "x") * float(attrs.get("factor", 1.0))]

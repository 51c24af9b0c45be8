"""Reductions ``sum``, ``mean``, ``max`` over ``axis`` (empty = all axes) with ``keepdim``.

Grads as in Paddle: ``sum_grad(x, out@GRAD)``, ``mean_grad(x, out@GRAD)``,
``max_grad(x, out, out@GRAD)``; each carries ``reduce_all:false`` besides axis / keepdim.
``sum_grad`` and ``mean_grad`` read only the shape of ``x`` (backward.yaml
``no_need_buffer: x``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from completion.ops.declare import defop
from completion.ops.registry import TensorType
from completion.ops.shapes import count, need, norm_axes

T = Sequence[TensorType | None]
IA, DT = "pd_op.IntArray", "pd_op.DataType"


def reduce_shape(shape: Sequence[int], axis: Any, keepdim: bool) -> tuple[int, ...]:
    """Shape after reducing ``axis`` (None / [] = every axis) of ``shape``."""
    axes = set(norm_axes(axis, len(shape)))
    if keepdim:
        return tuple(1 if i in axes else s for i, s in enumerate(shape))
    return tuple(s for i, s in enumerate(shape) if i not in axes)


def _reduce(types: T, attrs: dict[str, Any]) -> list[TensorType | None]:
    count(types, 1, ("x",))
    x = need(types, 0, "x")
    dt = attrs.get("dtype")
    dtype = x.dtype if dt in (None, "", "undefined") else str(dt)
    return [TensorType(reduce_shape(x.shape, attrs.get("axis"), bool(attrs.get("keepdim"))), dtype)]


_G = {"reduce_all": False}
defop("sum", ("x",), ("out",), _reduce, family="reduce",
      attrs={"axis": [], "dtype": "undefined", "keepdim": False},
      attr_tags={"axis": IA, "dtype": DT}, grad_inputs=("x", "out@GRAD"), grad_attrs=_G,
      no_need_buffer=("x",))
defop("mean", ("x",), ("out",), _reduce, family="reduce",
      attrs={"axis": [], "keepdim": False}, attr_tags={"axis": IA},
      grad_inputs=("x", "out@GRAD"), grad_attrs=_G, no_need_buffer=("x",))
defop("max", ("x",), ("out",), _reduce, family="reduce",
      attrs={"axis": [], "keepdim": False}, attr_tags={"axis": IA},
      grad_inputs=("x", "out", "out@GRAD"), grad_attrs=_G)

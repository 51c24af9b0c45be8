"""Elementwise ops: binary with numpy broadcasting, and unary activations.

Grad operand orders follow Paddle's backward yaml: ``relu_grad(out, out@GRAD)``,
``gelu_grad(x, out@GRAD)``, ``silu_grad(x, out, out@GRAD)``, ``square_grad(x, out@GRAD)``,
``subtract_grad(x, y, out@GRAD)`` with attribute ``axis:(Int32)-1``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from completion.ops.declare import defop
from completion.ops.registry import TensorType
from completion.ops.shapes import broadcast, count, need

T = Sequence[TensorType | None]


def _binary(types: T, attrs: dict[str, Any]) -> list[TensorType | None]:
    count(types, 2, ("x", "y"))
    x, y = need(types, 0, "x"), need(types, 1, "y")
    return [TensorType(broadcast(x.shape, y.shape), x.dtype)]


def _unary(types: T, attrs: dict[str, Any]) -> list[TensorType | None]:
    count(types, 1, ("x",))
    return [need(types, 0, "x")]


_AXIS = {"axis": -1}
_AXIS_TAG = {"axis": "Int32"}

for _name in ("add", "subtract", "multiply"):
    defop(_name, ("x", "y"), ("out",), _binary, family="elementwise_binary",
          grad_inputs=("x", "y", "out@GRAD"), grad_attrs=_AXIS, grad_attr_tags=_AXIS_TAG)
defop("divide", ("x", "y"), ("out",), _binary, family="elementwise_binary",
      grad_inputs=("x", "y", "out", "out@GRAD"), grad_attrs=_AXIS, grad_attr_tags=_AXIS_TAG)

# unary activations: name -> Paddle grad operands
_UNARY = {
    "relu": ("out", "out@GRAD"),
    "tanh": ("out", "out@GRAD"),
    "sigmoid": ("out", "out@GRAD"),
    "exp": ("out", "out@GRAD"),
    "square": ("x", "out@GRAD"),
    "silu": ("x", "out", "out@GRAD"),
}
for _name, _gin in _UNARY.items():
    defop(_name, ("x",), ("out",), _unary, family="elementwise_unary", grad_inputs=_gin)
defop("gelu", ("x",), ("out",), _unary, family="elementwise_unary",
      attrs={"approximate": False}, grad_inputs=("x", "out@GRAD"))

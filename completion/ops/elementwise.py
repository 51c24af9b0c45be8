"""Elementwise ops: binary with numpy broadcasting, and unary activations.

Grad operand orders follow Paddle's backward yaml: ``relu_grad(out, out@GRAD)``,
``gelu_grad(x, out@GRAD)``, ``silu_grad(x, out, out@GRAD)``, ``square_grad(x, out@GRAD)``,
``subtract_grad(x, y, out@GRAD)`` with attribute ``axis:(Int32)-1``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from completion.ops.declare import defop
from completion.ops.registry import PatternRole, TensorType
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

# add_grad / subtract_grad read only the shapes of x and y (Paddle backward.yaml
# no_need_buffer: x, y); multiply is the gate product of GLU MLPs (an "activation" pattern)
for _name in ("add", "subtract"):
    defop(_name, ("x", "y"), ("out",), _binary, family="elementwise_binary",
          grad_inputs=("x", "y", "out@GRAD"), grad_attrs=_AXIS, grad_attr_tags=_AXIS_TAG,
          no_need_buffer=("x", "y"), gradient_sum=_name == "add")
defop("multiply", ("x", "y"), ("out",), _binary, family="elementwise_binary",
      pattern_role="activation", grad_inputs=("x", "y", "out@GRAD"), grad_attrs=_AXIS,
      grad_attr_tags=_AXIS_TAG)
defop("divide", ("x", "y"), ("out",), _binary, family="elementwise_binary",
      grad_inputs=("x", "y", "out", "out@GRAD"), grad_attrs=_AXIS, grad_attr_tags=_AXIS_TAG)

# unary ops: name -> (Paddle grad operands, pattern role); exp and square are no activations
_UNARY: dict[str, tuple[tuple[str, ...], PatternRole | None]] = {
    "relu": (("out", "out@GRAD"), "activation"),
    "tanh": (("out", "out@GRAD"), "activation"),
    "sigmoid": (("out", "out@GRAD"), "activation"),
    "exp": (("out", "out@GRAD"), None),
    "square": (("x", "out@GRAD"), None),
    "silu": (("x", "out", "out@GRAD"), "activation"),
}
for _name, (_gin, _role) in _UNARY.items():
    defop(_name, ("x",), ("out",), _unary, family="elementwise_unary", grad_inputs=_gin,
          pattern_role=_role)
defop("gelu", ("x",), ("out",), _unary, family="elementwise_unary",
      attrs={"approximate": False}, pattern_role="activation", grad_inputs=("x", "out@GRAD"))

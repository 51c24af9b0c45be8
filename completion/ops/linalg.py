"""``matmul`` (transpose_x / transpose_y, batched with broadcast batch dims).

Shape rule: :func:`completion.ops.shapes.matmul_shape` (numpy ``matmul`` semantics).
Grad: ``matmul_grad(x, y, out@GRAD) -> (x@GRAD, y@GRAD)`` as in Paddle.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from completion.ops.declare import defop
from completion.ops.registry import OpError, TensorType
from completion.ops.shapes import count, matmul_shape, need

T = Sequence[TensorType | None]


def _matmul(types: T, attrs: dict[str, Any]) -> list[TensorType | None]:
    count(types, 2, ("x", "y"))
    x, y = need(types, 0, "x"), need(types, 1, "y")
    if x.dtype != y.dtype:
        raise OpError(f"x has dtype {x.dtype} but y has dtype {y.dtype}")
    shape = matmul_shape(
        x.shape, y.shape, bool(attrs.get("transpose_x")), bool(attrs.get("transpose_y"))
    )
    return [TensorType(shape, x.dtype)]


# a GEMM; between two activations (QK^T, PV) it is part of an attention core
defop("matmul", ("x", "y"), ("out",), _matmul, family="matmul",
      attrs={"transpose_x": False, "transpose_y": False},
      kernel="gemm", attention_core=True, pattern_role="matmul",
      grad_inputs=("x", "y", "out@GRAD"))

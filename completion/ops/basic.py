"""Source, sink, cast/scale, dropout, add_n and reshard ops.

Traits: ``data`` / ``parameter`` only declare inputs; ``full``, ``shadow_output`` and
``reshard`` launch no kernel; a parameter seen through ``cast`` or ``reshard`` is that
parameter; ``scale`` and ``dropout`` can be part of an attention core.

Attribute tags and defaults follow the PIR text Paddle prints (see
``shared/data/programs/*.pir``): e.g. ``data`` carries ``dtype:(pd_op.DataType)float32``,
``place:(pd_op.Place)Place(undefined:0)`` and ``shape:(pd_op.IntArray)[4,16]``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from completion.ops.declare import defop
from completion.ops.registry import OpError, TensorType
from completion.ops.shapes import need, same_type

DT, PLACE, IA = "pd_op.DataType", "pd_op.Place", "pd_op.IntArray"
T = Sequence[TensorType | None]


def _dtype(attrs: dict[str, Any], default: str) -> str:
    d = attrs.get("dtype")
    return default if d in (None, "", "undefined") else str(d)


def _source(types: T, attrs: dict[str, Any]) -> list[TensorType | None]:
    if types:
        raise OpError(f"takes no operands, got {len(types)}")
    return [TensorType(tuple(attrs.get("shape") or ()), _dtype(attrs, "float32"))]


def _full_like(types: T, attrs: dict[str, Any]) -> list[TensorType | None]:
    x = need(types, 0, "x")
    return [TensorType(x.shape, _dtype(attrs, x.dtype))]


def _sink(types: T, attrs: dict[str, Any]) -> list[TensorType | None]:
    need(types, 0, "x")
    return []


def _cast(types: T, attrs: dict[str, Any]) -> list[TensorType | None]:
    x = need(types, 0, "x")
    return [TensorType(x.shape, _dtype(attrs, x.dtype))]


def _same_as_x(types: T, attrs: dict[str, Any]) -> list[TensorType | None]:
    return [need(types, 0, "x")]


def _dropout(types: T, attrs: dict[str, Any]) -> list[TensorType | None]:
    x = need(types, 0, "x")
    return [x, TensorType(x.shape, "uint8")]


def _add_n(types: T, attrs: dict[str, Any]) -> list[TensorType | None]:
    if not types or any(t is None for t in types):
        raise OpError("needs at least one non-null operand")
    return [same_type(types, "add_n operands")]


defop("data", (), ("out",), _source,
      attrs={"dtype": "float32", "place": "Place(undefined:0)", "shape": []},
      attr_tags={"dtype": DT, "place": PLACE, "shape": IA}, family="source",
      internal_attrs=("init_value",), kernel=None, input=True)
defop("parameter", (), ("out",), _source, dialect="builtin", family="source",
      attrs={"is_distributed": [False], "need_clip": [True], "trainable": [True],
             "shape": [], "dtype": "float32"},
      internal_attrs=("shape", "dtype"), kernel=None, input=True)
defop("full", (), ("out",), _source, family="source",
      attrs={"dtype": "float32", "place": "Place(cpu)", "shape": [1], "value": 0.0},
      attr_tags={"dtype": DT, "place": PLACE, "shape": IA, "value": "Float"}, kernel=None)
defop("full_like", ("x", "value?"), ("out",), _full_like, family="source",
      attrs={"dtype": "float32", "place": "Place(undefined:0)"},
      attr_tags={"dtype": DT, "place": PLACE})
defop("shadow_output", ("x",), (), _sink, dialect="builtin", family="sink",
      attrs={"output_name": ""}, kernel=None)
defop("cast", ("x",), ("out",), _cast, family="elementwise_unary",
      attrs={"dtype": "float32"}, attr_tags={"dtype": DT},
      weight_passthrough=True, weight_alias=True, pattern_role="passthrough",
      grad_inputs=("x", "out@GRAD"), no_need_buffer=("x",), gradient_sum=True)
defop("scale", ("x", "scale?"), ("out",), _same_as_x, family="elementwise_unary",
      attrs={"bias": 0.0, "bias_after_scale": True, "scale": 1.0},
      attr_tags={"bias": "Float", "scale": "Float"},
      attention_core=True, pattern_role="passthrough", grad_inputs=("out@GRAD",))
defop("dropout", ("x", "seed_tensor?"), ("out", "mask"), _dropout, family="elementwise_unary",
      attrs={"fix_seed": False, "is_test": False, "mode": "upscale_in_train", "p": 0.5,
             "seed": 0},
      attr_tags={"p": "Float", "seed": "Int32"},
      attention_core=True, pattern_role="passthrough", grad_inputs=("mask", "out@GRAD"),
      random=True)
defop("add_n", ("x",), ("out",), _add_n, family="add_n", variadic=True, gradient_sum=True)
# reshard: a placeholder the reshard pass resolves into collectives (costed from its plan)
defop("reshard", ("x",), ("out",), _same_as_x, dialect="dist_op", family="reshard",
      grad="reshard", grad_inputs=("out@GRAD",), kernel=None, weight_passthrough=True,
      weight_alias=True)

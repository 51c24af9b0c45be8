"""ATen -> op converters for :func:`completion.frontends.torch_capture.from_torch`.

:data:`ATEN_CONVERTERS` maps an ATen overload packet (``"aten.linear"``) to a converter
``(ctx, node) -> Value | list[Value | None] | None`` that appends our ops for one exported
graph node. Semantics differences handled here (facts from the ATen schemas in
``native_functions.yaml``):

- ``aten.linear(x, w[out, in], b)`` is ``matmul(x, w, transpose_y=True)`` (+ ``add`` b);
- ``aten.embedding(weight, indices)`` swaps its operands relative to ``embedding(x, weight)``;
- ``aten.scaled_dot_product_attention`` takes ``[b, heads, s, d]`` while ``flash_attention``
  takes ``[b, s, heads, d]``: the converter transposes in and out;
- ``aten.cross_entropy_loss(input, target)`` has its class axis at dim 1 and an index target
  without the class dim: the target is unsqueezed there, then ``mean``/``sum`` applies the
  reduction (1 = mean, 2 = sum, 0 = none).
A converter raises (OpError, TypeError, IndexError) for arguments it does not support; the
caller then records an ``opaque`` op instead.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from completion.ir import OpRole, Value
from completion.models.builder import ProgramBuilder
from completion.ops.registry import OpError

Result = Value | list[Value | None] | None


@dataclass
class Ctx:
    """Translation state: the builder, graph node name -> value(s), current struct name."""

    pb: ProgramBuilder
    env: dict[str, Any] = field(default_factory=dict)
    struct: str = ""

    def value(self, arg: Any) -> Any:
        """The value of an fx node argument (a Python constant passes through)."""
        name = getattr(arg, "name", None)
        if name is not None and hasattr(arg, "op"):
            if name not in self.env:
                raise OpError(f"graph node {name!r} has no value (its producer was not converted)")
            return self.env[name]
        return arg

    def op(self, type: str, operands: list[Value | None], attrs: dict[str, Any] | None = None,
           role: OpRole | None = None) -> list[Value | None]:
        return self.pb.op(type, operands, attrs, self.struct, role)

    def op1(self, type: str, operands: list[Value | None], attrs: dict[str, Any] | None = None,
            role: OpRole | None = None) -> Value:
        return self.pb.op1(type, operands, attrs, self.struct, role)


Converter = Callable[[Ctx, Any], Result]
ATEN_CONVERTERS: dict[str, Converter] = {}


def aten_key(target: Any) -> str:
    """``aten.linear.default`` -> ``aten.linear``; ``operator.getitem`` -> ``getitem``."""
    if target is operator.getitem:
        return "getitem"
    s = str(target)
    return s.rsplit(".", 1)[0] if s.count(".") >= 2 else s


def dtype_name(dt: Any) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"``."""
    return str(dt).replace("torch.", "")


def _meta_results(node: Any) -> list[Any]:
    val = node.meta.get("val")
    vals = list(val) if isinstance(val, (tuple, list)) else [val]
    return [v for v in vals if hasattr(v, "shape")]


def opaque(ctx: Ctx, node: Any, key: str) -> Result:
    """An ``opaque`` op: tensor operands in argument order, results with the traced shapes."""
    flat: list[Any] = []
    for a in list(node.args) + list(node.kwargs.values()):
        flat.extend(a if isinstance(a, (list, tuple)) else [a])
    operands = [ctx.env[a.name] for a in flat if hasattr(a, "op") and isinstance(ctx.env.get(a.name), Value)]
    vals = _meta_results(node)
    attrs = {"source_op": key, "out_shapes": [[int(s) for s in v.shape] for v in vals],
             "out_dtypes": [dtype_name(v.dtype) for v in vals]}
    res = ctx.op("opaque", operands, attrs)
    val = node.meta.get("val")
    return res if isinstance(val, (tuple, list)) else (res[0] if res else None)


def register(*keys: str) -> Callable[[Converter], Converter]:
    """Decorator: register a converter under one or more ATen packet names."""
    def deco(fn: Converter) -> Converter:
        for k in keys:
            ATEN_CONVERTERS[k] = fn
        return fn
    return deco


def _arg(node: Any, i: int, name: str, default: Any = None) -> Any:
    if i < len(node.args):
        return node.args[i]
    return node.kwargs.get(name, default)


def _out_shape(node: Any) -> list[int]:
    return [int(s) for s in node.meta["val"].shape]


# -- linear algebra ------------------------------------------------------------------------
@register("aten.linear")
def _linear(ctx: Ctx, node: Any) -> Result:
    x, w, b = ctx.value(node.args[0]), ctx.value(node.args[1]), ctx.value(_arg(node, 2, "bias"))
    y = ctx.op1("matmul", [x, w], {"transpose_x": False, "transpose_y": True})
    return ctx.op1("add", [y, b]) if isinstance(b, Value) else y


@register("aten.matmul", "aten.mm", "aten.bmm")
def _matmul(ctx: Ctx, node: Any) -> Result:
    x, y = ctx.value(node.args[0]), ctx.value(node.args[1])
    return ctx.op1("matmul", [x, y], {"transpose_x": False, "transpose_y": False})


@register("aten.embedding")
def _embedding(ctx: Ctx, node: Any) -> Result:
    w, ids = ctx.value(node.args[0]), ctx.value(node.args[1])
    pad = _arg(node, 2, "padding_idx", -1)
    return ctx.op1("embedding", [ids, w], {"padding_idx": int(pad), "sparse": False})


# -- elementwise ---------------------------------------------------------------------------
_UNARY = {"aten.relu": "relu", "aten.silu": "silu", "aten.tanh": "tanh",
          "aten.sigmoid": "sigmoid", "aten.exp": "exp"}


def _unary(ctx: Ctx, node: Any) -> Result:
    return ctx.op1(_UNARY[aten_key(node.target)], [ctx.value(node.args[0])])


for _k in _UNARY:
    ATEN_CONVERTERS[_k] = _unary


@register("aten.gelu")
def _gelu(ctx: Ctx, node: Any) -> Result:
    approx = _arg(node, 1, "approximate", "none") == "tanh"
    return ctx.op1("gelu", [ctx.value(node.args[0])], {"approximate": approx})


_BINARY = {"aten.add": "add", "aten.sub": "subtract", "aten.mul": "multiply", "aten.div": "divide"}


@register(*_BINARY)
def _binary(ctx: Ctx, node: Any) -> Result:
    key = aten_key(node.target)
    x, y = ctx.value(node.args[0]), ctx.value(node.args[1])
    if node.kwargs.get("alpha", 1) != 1 or node.kwargs.get("rounding_mode") is not None:
        raise TypeError("alpha / rounding_mode are not supported")
    if isinstance(x, Value) and isinstance(y, Value):
        return ctx.op1(_BINARY[key], [x, y])
    if not isinstance(x, Value) or not isinstance(y, (int, float)):
        raise TypeError("a scalar left operand is not supported")
    c = float(y)
    scale, bias = {"aten.add": (1.0, c), "aten.sub": (1.0, -c), "aten.mul": (c, 0.0),
                   "aten.div": (1.0 / c if c else float("inf"), 0.0)}[key]
    return ctx.op1("scale", [x, None], {"scale": scale, "bias": bias, "bias_after_scale": True})


@register("aten.pow")
def _pow(ctx: Ctx, node: Any) -> Result:
    if node.args[1] != 2:
        raise TypeError(f"pow exponent {node.args[1]!r} is not supported")
    return ctx.op1("square", [ctx.value(node.args[0])])


@register("aten.dropout")
def _dropout(ctx: Ctx, node: Any) -> Result:
    p, train = float(_arg(node, 1, "p", 0.5)), bool(_arg(node, 2, "train", True))
    return ctx.op("dropout", [ctx.value(node.args[0]), None], {"p": p, "is_test": not train})[0]


@register("aten._to_copy", "aten.to")
def _cast(ctx: Ctx, node: Any) -> Result:
    return ctx.op1("cast", [ctx.value(node.args[0])], {"dtype": dtype_name(node.meta["val"].dtype)})


@register("aten.alias", "aten.detach", "aten.clone", "aten.contiguous", "aten.lift_fresh_copy")
def _identity(ctx: Ctx, node: Any) -> Result:
    return ctx.value(node.args[0])


@register("getitem")
def _getitem(ctx: Ctx, node: Any) -> Result:
    return ctx.value(node.args[0])[int(node.args[1])]


# -- layout --------------------------------------------------------------------------------
@register("aten.view", "aten.reshape", "aten._unsafe_view", "aten.flatten", "aten.expand")
def _reshape(ctx: Ctx, node: Any) -> Result:
    x = ctx.value(node.args[0])
    out = _out_shape(node)
    if aten_key(node.target) == "aten.expand" and x.shape != tuple(out):
        raise TypeError("expand that broadcasts is not supported")
    return ctx.op1("reshape", [x], {"shape": out})


@register("aten.transpose", "aten.permute", "aten.t")
def _transpose(ctx: Ctx, node: Any) -> Result:
    x = ctx.value(node.args[0])
    key, n = aten_key(node.target), x.ndim
    if key == "aten.permute":
        perm = [int(d) % n for d in node.args[1]]
    else:
        a, b = (0, 1) if key == "aten.t" else (int(node.args[1]) % n, int(node.args[2]) % n)
        perm = list(range(n))
        perm[a], perm[b] = perm[b], perm[a]
    return ctx.op1("transpose", [x], {"perm": perm})


@register("aten.unsqueeze")
def _unsqueeze(ctx: Ctx, node: Any) -> Result:
    return ctx.op1("unsqueeze", [ctx.value(node.args[0])], {"axis": [int(node.args[1])]})


@register("aten.squeeze")
def _squeeze(ctx: Ctx, node: Any) -> Result:
    dims = _arg(node, 1, "dim", [])
    dims = [dims] if isinstance(dims, int) else list(dims)
    return ctx.op1("squeeze", [ctx.value(node.args[0])], {"axis": dims})


@register("aten.cat")
def _cat(ctx: Ctx, node: Any) -> Result:
    xs = [ctx.value(a) for a in node.args[0]]
    return ctx.op1("concat", xs, {"axis": int(_arg(node, 1, "dim", 0))})


# -- reductions ----------------------------------------------------------------------------
@register("aten.mean", "aten.sum")
def _reduce(ctx: Ctx, node: Any) -> Result:
    dims = _arg(node, 1, "dim", None)
    dims = [] if dims is None else ([dims] if isinstance(dims, int) else list(dims))
    keep = bool(_arg(node, 2, "keepdim", False))
    typ = aten_key(node.target).split(".")[1]
    return ctx.op1(typ, [ctx.value(node.args[0])], {"axis": dims, "keepdim": keep})


# -- nn ------------------------------------------------------------------------------------
@register("aten.softmax", "aten._softmax", "aten.log_softmax", "aten._log_softmax")
def _softmax(ctx: Ctx, node: Any) -> Result:
    typ = "log_softmax" if "log_softmax" in aten_key(node.target) else "softmax"
    return ctx.op1(typ, [ctx.value(node.args[0])], {"axis": int(node.args[1])})


@register("aten.rms_norm")
def _rms_norm(ctx: Ctx, node: Any) -> Result:
    x, shape, w = ctx.value(node.args[0]), node.args[1], ctx.value(_arg(node, 2, "weight"))
    if not isinstance(w, Value):
        raise TypeError("rms_norm without a weight is not supported")
    eps = _arg(node, 3, "eps", None)
    attrs = {"epsilon": 1e-6 if eps is None else float(eps), "begin_norm_axis": x.ndim - len(shape)}
    return ctx.op1("rms_norm", [x, w], attrs)


@register("aten.layer_norm")
def _layer_norm(ctx: Ctx, node: Any) -> Result:
    x, shape = ctx.value(node.args[0]), node.args[1]
    w, b = ctx.value(_arg(node, 2, "weight")), ctx.value(_arg(node, 3, "bias"))
    attrs = {"epsilon": float(_arg(node, 4, "eps", 1e-5)), "begin_norm_axis": x.ndim - len(shape)}
    return ctx.op1("layer_norm", [x, w if isinstance(w, Value) else None,
                                  b if isinstance(b, Value) else None], attrs)


@register("aten.scaled_dot_product_attention")
def _sdpa(ctx: Ctx, node: Any) -> Result:
    q, k, v = (ctx.value(a) for a in node.args[:3])
    if _arg(node, 3, "attn_mask") is not None or float(_arg(node, 4, "dropout_p", 0.0)):
        raise TypeError("attn_mask / dropout are not supported")
    to_bshd = {"perm": [0, 2, 1, 3]}
    q, k, v = (ctx.op1("transpose", [t], to_bshd) for t in (q, k, v))
    attrs = {"dropout": 0.0, "causal": bool(_arg(node, 5, "is_causal", False)),
             "return_softmax": False, "is_test": False}
    out = ctx.op1("flash_attention", [q, k, v], attrs)
    return ctx.op1("transpose", [out], to_bshd)


@register("aten.cross_entropy_loss")
def _cross_entropy(ctx: Ctx, node: Any) -> Result:
    x, target = ctx.value(node.args[0]), ctx.value(node.args[1])
    if (_arg(node, 2, "weight") is not None or float(_arg(node, 5, "label_smoothing", 0.0))
            or target.ndim != x.ndim - 1):
        raise TypeError("class weights, label smoothing and soft targets are not supported")
    reduction = int(_arg(node, 3, "reduction", 1))
    axis = 1 if x.ndim > 1 else 0
    label = ctx.op1("unsqueeze", [target], {"axis": [axis]}, role=OpRole.LOSS)
    attrs = {"ignore_index": int(_arg(node, 4, "ignore_index", -100)), "axis": axis}
    loss = ctx.op("cross_entropy_with_softmax", [x, label], attrs, role=OpRole.LOSS)[1]
    assert loss is not None
    if reduction == 0:
        return ctx.op1("squeeze", [loss], {"axis": [axis]}, role=OpRole.LOSS)
    typ = "mean" if reduction == 1 else "sum"
    return ctx.op1(typ, [loss], {"axis": [], "keepdim": False}, role=OpRole.LOSS)

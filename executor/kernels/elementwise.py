"""Kernels of sources, elementwise ops, cast/scale/dropout, add_n and their grads.

Gradient formulas are the textbook derivatives, in the operand orders of
``completion/ops/elementwise.py`` and ``basic.py`` (Paddle's backward yaml):
``relu_grad(out, g) = g * (out > 0)``, ``tanh_grad(out, g) = g (1 - out^2)``,
``sigmoid_grad(out, g) = g out (1 - out)``, ``exp_grad(out, g) = g out``,
``square_grad(x, g) = 2 x g``, ``silu_grad(x, out, g) = g s (1 + x (1 - s))`` with
``s = sigmoid(x)``, ``gelu_grad``: exact ``g (Phi(x) + x phi(x))`` or the tanh form of
Hendrycks & Gimpel (2016) differentiated. Broadcast operands get their gradient summed over
the broadcast dims (:func:`unbroadcast`), to the local shape of the grad op's own result
(``KernelContext.out_types``; the operand's local shape only when none is given), never
the forward operand's block: add/subtract grads read x and y for their shapes only and
completion may lay them out otherwise than their gradients.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from executor.kernels.base import (
    Ins,
    KernelContext,
    KernelError,
    need,
    register_kernel,
    torch_dtype,
    unbroadcast,
)

# -- sources -----------------------------------------------------------------------------


@register_kernel("full")
def _full(ins: Ins, attrs: Mapping[str, Any], ctx: KernelContext):
    shape = ctx.out_shape(0, attrs.get("shape") or ())
    dt = torch_dtype(attrs.get("dtype"))
    return [torch.full(shape, float(attrs.get("value", 0.0)), dtype=dt, device=ctx.device)]


@register_kernel("full_like")
def _full_like(ins: Ins, attrs: Mapping[str, Any], ctx: KernelContext):
    x = need(ins, 0, "full_like", "x")
    v = ins[1] if len(ins) > 1 and ins[1] is not None else None
    value = float(v.reshape(-1)[0]) if v is not None else float(attrs.get("value", 0.0))
    dt = torch_dtype(attrs.get("dtype"), x.dtype)
    return [torch.full(ctx.out_shape(0, x.shape), value, dtype=dt, device=x.device)]


@register_kernel("data")
def _data(ins: Ins, attrs: Mapping[str, Any], ctx: KernelContext):
    if "init_value" not in attrs:
        raise KernelError(f"data {attrs.get('name', '')!r}: an input must be fed, it has no init_value")
    shape = ctx.out_shape(0, attrs.get("shape") or ())
    dt = torch_dtype(attrs.get("dtype"))
    return [torch.full(shape, float(attrs["init_value"]), dtype=dt, device=ctx.device)]


@register_kernel("shadow_output")
def _shadow_output(ins: Ins, attrs: Mapping[str, Any], ctx: KernelContext):
    need(ins, 0, "shadow_output", "x")
    return []


# -- binary ------------------------------------------------------------------------------

_BINARY = {
    "add": torch.add,
    "subtract": torch.sub,
    "multiply": torch.mul,
    "divide": torch.div,
}


def _binary_kernel(name: str):
    fn = _BINARY[name]

    def k(ins: Ins, attrs: Mapping[str, Any], ctx: KernelContext):
        return [fn(need(ins, 0, name, "x"), need(ins, 1, name, "y"))]

    return k


for _n in _BINARY:
    register_kernel(_n)(_binary_kernel(_n))


@register_kernel("add_grad")
def _add_grad(ins: Ins, attrs: Mapping[str, Any], ctx: KernelContext):
    x, y, g = (need(ins, i, "add_grad", w) for i, w in enumerate(("x", "y", "out@GRAD")))
    return [unbroadcast(g, ctx.out_shape(0, x.shape)), unbroadcast(g, ctx.out_shape(1, y.shape))]


@register_kernel("subtract_grad")
def _subtract_grad(ins: Ins, attrs: Mapping[str, Any], ctx: KernelContext):
    x, y, g = (need(ins, i, "subtract_grad", w) for i, w in enumerate(("x", "y", "out@GRAD")))
    return [unbroadcast(g, ctx.out_shape(0, x.shape)), unbroadcast(-g, ctx.out_shape(1, y.shape))]


@register_kernel("multiply_grad")
def _multiply_grad(ins: Ins, attrs: Mapping[str, Any], ctx: KernelContext):
    x, y, g = (need(ins, i, "multiply_grad", w) for i, w in enumerate(("x", "y", "out@GRAD")))
    return [unbroadcast(g * y, ctx.out_shape(0, x.shape)), unbroadcast(g * x, ctx.out_shape(1, y.shape))]


@register_kernel("divide_grad")
def _divide_grad(ins: Ins, attrs: Mapping[str, Any], ctx: KernelContext):
    names = ("x", "y", "out", "out@GRAD")
    x, y, out, g = (need(ins, i, "divide_grad", w) for i, w in enumerate(names))
    return [unbroadcast(g / y, ctx.out_shape(0, x.shape)),
            unbroadcast(-g * out / y, ctx.out_shape(1, y.shape))]


# -- unary -------------------------------------------------------------------------------


def _gelu(x: torch.Tensor, approximate: bool) -> torch.Tensor:
    return torch.nn.functional.gelu(x, approximate="tanh" if approximate else "none")


_UNARY = {
    "relu": lambda x, a: torch.relu(x),
    "tanh": lambda x, a: torch.tanh(x),
    "sigmoid": lambda x, a: torch.sigmoid(x),
    "exp": lambda x, a: torch.exp(x),
    "square": lambda x, a: x * x,
    "silu": lambda x, a: torch.nn.functional.silu(x),
    "gelu": lambda x, a: _gelu(x, bool(a.get("approximate", False))),
}


def _unary_kernel(name: str):
    fn = _UNARY[name]

    def k(ins: Ins, attrs: Mapping[str, Any], ctx: KernelContext):
        return [fn(need(ins, 0, name, "x"), attrs)]

    return k


for _n in _UNARY:
    register_kernel(_n)(_unary_kernel(_n))


def _gelu_grad_fn(x: torch.Tensor, g: torch.Tensor, approximate: bool) -> torch.Tensor:
    if not approximate:
        cdf = 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0)))
        pdf = torch.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
        return g * (cdf + x * pdf)
    c = math.sqrt(2.0 / math.pi)
    inner = c * (x + 0.044715 * x**3)
    t = torch.tanh(inner)
    return g * (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * c * (1 + 3 * 0.044715 * x * x))


# grad op -> (operand names it reads, formula)
_UNARY_GRADS = {
    "relu_grad": lambda o, g, a: g * (o > 0).to(g.dtype),
    "tanh_grad": lambda o, g, a: g * (1 - o * o),
    "sigmoid_grad": lambda o, g, a: g * o * (1 - o),
    "exp_grad": lambda o, g, a: g * o,
    "square_grad": lambda x, g, a: 2 * x * g,
    "gelu_grad": lambda x, g, a: _gelu_grad_fn(x, g, bool(a.get("approximate", False))),
}


def _unary_grad_kernel(name: str):
    fn = _UNARY_GRADS[name]

    def k(ins: Ins, attrs: Mapping[str, Any], ctx: KernelContext):
        return [fn(need(ins, 0, name, "x/out"), need(ins, 1, name, "out@GRAD"), attrs)]

    return k


for _n in _UNARY_GRADS:
    register_kernel(_n)(_unary_grad_kernel(_n))


@register_kernel("silu_grad")
def _silu_grad(ins: Ins, attrs: Mapping[str, Any], ctx: KernelContext):
    x, g = need(ins, 0, "silu_grad", "x"), need(ins, 2, "silu_grad", "out@GRAD")
    s = torch.sigmoid(x)
    return [g * s * (1 + x * (1 - s))]


# -- cast / scale / dropout / add_n --------------------------------------------------------


@register_kernel("cast")
def _cast(ins: Ins, attrs: Mapping[str, Any], ctx: KernelContext):
    x = need(ins, 0, "cast", "x")
    return [x.to(torch_dtype(attrs.get("dtype"), x.dtype))]


@register_kernel("cast_grad")
def _cast_grad(ins: Ins, attrs: Mapping[str, Any], ctx: KernelContext):
    x, g = need(ins, 0, "cast_grad", "x"), need(ins, 1, "cast_grad", "out@GRAD")
    return [g.to(x.dtype)]


def _scale_factor(ins: Ins, attrs: Mapping[str, Any]) -> Any:
    s = ins[1] if len(ins) > 1 and ins[1] is not None else None
    return s.reshape(()) if s is not None else float(attrs.get("scale", 1.0))


@register_kernel("scale")
def _scale(ins: Ins, attrs: Mapping[str, Any], ctx: KernelContext):
    """Paddle scale: ``x * scale + bias`` (bias_after_scale) or ``(x + bias) * scale``."""
    x = need(ins, 0, "scale", "x")
    s, b = _scale_factor(ins, attrs), float(attrs.get("bias", 0.0))
    if attrs.get("bias_after_scale", True):
        return [x * s + b]
    return [(x + b) * s]


@register_kernel("scale_grad")
def _scale_grad(ins: Ins, attrs: Mapping[str, Any], ctx: KernelContext):
    g = need(ins, 0, "scale_grad", "out@GRAD")
    return [g * float(attrs.get("scale", 1.0)), None]


def _dropout_mask(x: torch.Tensor, attrs: Mapping[str, Any], ctx: KernelContext) -> torch.Tensor:
    p = float(attrs.get("p", 0.5))
    if attrs.get("is_test") or p == 0.0:
        return torch.ones(x.shape, dtype=torch.uint8, device=x.device)
    gen = ctx.generator or torch.Generator(device=x.device).manual_seed(int(attrs.get("seed", 0)))
    keep = torch.rand(x.shape, generator=gen, device=x.device) >= p
    return keep.to(torch.uint8)


def _dropout_scale(attrs: Mapping[str, Any]) -> float:
    """Training-time factor on kept elements: 1/(1-p) in upscale_in_train, else 1."""
    p = float(attrs.get("p", 0.5))
    if attrs.get("mode", "upscale_in_train") != "upscale_in_train":
        return 1.0
    return 1.0 / (1.0 - p) if p < 1.0 else 0.0


@register_kernel("dropout")
def _dropout(ins: Ins, attrs: Mapping[str, Any], ctx: KernelContext):
    """Mask = Bernoulli(1 - p) (uint8); out = x * mask / (1 - p) in ``upscale_in_train``
    mode, ``x * mask`` in ``downgrade_in_infer`` mode (Paddle's two modes)."""
    x = need(ins, 0, "dropout", "x")
    mask = _dropout_mask(x, attrs, ctx)
    if attrs.get("is_test"):
        p = float(attrs.get("p", 0.5))
        scale = 1.0 if attrs.get("mode", "upscale_in_train") == "upscale_in_train" else 1.0 - p
        return [x * scale, mask]
    return [x * mask.to(x.dtype) * _dropout_scale(attrs), mask]


@register_kernel("dropout_grad")
def _dropout_grad(ins: Ins, attrs: Mapping[str, Any], ctx: KernelContext):
    mask, g = need(ins, 0, "dropout_grad", "mask"), need(ins, 1, "dropout_grad", "out@GRAD")
    return [g * mask.to(g.dtype) * _dropout_scale(attrs), None]


@register_kernel("add_n")
def _add_n(ins: Ins, attrs: Mapping[str, Any], ctx: KernelContext):
    xs = [t for t in ins if t is not None]
    if not xs:
        raise KernelError("add_n: needs at least one non-null operand")
    out = xs[0].clone()
    for t in xs[1:]:
        out += t
    return [out]

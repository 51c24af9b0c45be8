"""One-call declaration of an op and its ``*_grad`` op.

How to declare an op (the pattern every ``completion/ops/*.py`` module follows)::

    defop("relu", ("x",), ("out",), unary_infer, family="elementwise_unary",
          grad_inputs=("out", "out@GRAD"))

registers ``relu`` and ``relu_grad``. The grad op's operands are ``grad_inputs``: each
names a forward operand (``"x"``), a forward result (``"out"``) or the gradient of a forward
result (``"out@GRAD"``), in Paddle's operand order. Its results are the gradients of the
forward operands, in forward operand order (``"x@GRAD"``, ...); ``append_backward`` makes a
result null where that operand needs no gradient. The grad op's attributes are the forward
op's attributes plus ``grad_attrs``; ``append_backward`` copies the forward values.

Result types of the grad op come from ``grad_infer`` when given, else from
:func:`default_grad_infer`: the gradient of forward operand ``x`` has the type of grad operand
``x`` when ``x`` is among ``grad_inputs``, otherwise the type of the first ``*@GRAD`` operand
(right for elementwise unary ops). ``grad="other_op"`` reuses an existing op type as the
gradient (e.g. ``reshard``), then no new op is registered.

Variadic operands/results (``concat``'s ``x``, ``split``'s ``out``): set ``variadic`` /
``variadic_results``; the last declared name repeats. In ``grad_inputs`` such a name stands
for all of its values.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from completion.ops.registry import (
    OP_REGISTRY,
    InferFn,
    OpDef,
    TensorType,
    register_op,
)

GRAD_SUFFIX = "@GRAD"


def base_name(name: str) -> str:
    """``"x?"`` -> ``"x"``; ``"out@GRAD"`` -> ``"out"``."""
    return name.removesuffix(GRAD_SUFFIX).rstrip("?")


def default_grad_infer(forward_operands: Sequence[str], grad_inputs: Sequence[str]) -> InferFn:
    """Inference for a grad op: see the module docstring."""
    fwd = [base_name(o) for o in forward_operands]
    gin = list(grad_inputs)

    def infer(types: Sequence[TensorType | None], attrs: dict[str, Any]) -> list[TensorType | None]:
        first_grad = next(
            (types[i] for i, g in enumerate(gin) if g.endswith(GRAD_SUFFIX) and i < len(types)), None
        )
        out: list[TensorType | None] = []
        for o in fwd:
            if o in gin and gin.index(o) < len(types):
                out.append(types[gin.index(o)])
            else:
                out.append(first_grad)
        return out

    return infer


def defop(
    name: str,
    operands: Sequence[str],
    results: Sequence[str],
    infer: InferFn,
    *,
    attrs: dict[str, Any] | None = None,
    attr_tags: dict[str, str] | None = None,
    family: str = "",
    dialect: str = "pd_op",
    variadic: bool = False,
    variadic_results: bool = False,
    internal_attrs: Sequence[str] = (),
    grad: str | None = None,
    grad_inputs: Sequence[str] = (),
    grad_infer: InferFn | None = None,
    grad_attrs: dict[str, Any] | None = None,
    grad_attr_tags: dict[str, str] | None = None,
) -> OpDef:
    """Register op ``name`` and, when ``grad_inputs`` is given, its grad op.

    Args: as :class:`OpDef`; ``grad`` defaults to ``name + "_grad"``. Returns the forward
    OpDef. Raises OpError if a name is registered twice.
    """
    gname = (grad or f"{name}_grad") if grad_inputs else grad
    od = register_op(
        OpDef(
            name=name,
            dialect=dialect,
            operands=tuple(operands),
            results=tuple(results),
            infer=infer,
            attrs=dict(attrs or {}),
            family=family,
            grad=gname,
            variadic=variadic,
            grad_inputs=tuple(grad_inputs),
            attr_tags=dict(attr_tags or {}),
            internal_attrs=tuple(internal_attrs),
            variadic_results=variadic_results,
        )
    )
    if gname and grad_inputs and gname not in OP_REGISTRY:
        register_op(_grad_opdef(od, grad_infer, grad_attrs, grad_attr_tags))
    return od


def _grad_opdef(
    fwd: OpDef,
    grad_infer: InferFn | None = None,
    grad_attrs: dict[str, Any] | None = None,
    grad_attr_tags: dict[str, str] | None = None,
) -> OpDef:
    """The OpDef of ``fwd.grad`` derived from the forward declaration (module docstring):
    operands ``fwd.grad_inputs``; results ``<operand>@GRAD`` per forward operand; attributes
    and tags the forward ones updated by ``grad_attrs`` / ``grad_attr_tags``; family
    ``<family>_grad``; variadic where a grad input names the forward op's variadic operand or
    result. Inference is ``grad_infer`` or :func:`default_grad_infer`. Not registered here;
    ``fwd`` must declare ``grad`` and ``grad_inputs``."""
    ops, res = fwd.operands, fwd.results
    fwd_vars = {base_name(o) for o in ops if fwd.variadic and o == ops[-1]}
    fwd_vars |= {base_name(r) for r in res if fwd.variadic_results and r == res[-1]}
    return OpDef(
        name=fwd.grad,
        dialect=fwd.dialect,
        operands=fwd.grad_inputs,
        results=tuple(f"{base_name(o)}{GRAD_SUFFIX}" for o in ops),
        infer=grad_infer or default_grad_infer(ops, fwd.grad_inputs),
        attrs={**fwd.attrs, **(grad_attrs or {})},
        family=f"{fwd.family}_grad" if fwd.family else "grad",
        variadic=any(base_name(g) in fwd_vars for g in fwd.grad_inputs),
        attr_tags={**fwd.attr_tags, **(grad_attr_tags or {})},
        internal_attrs=fwd.internal_attrs,
        forward=fwd.name,
        variadic_results=fwd.variadic,
    )

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

Traits (:class:`~completion.ops.registry.OpTraits`) are keyword arguments of the forward
declaration: ``kernel`` (default ``"memory"``; None for an op that launches nothing),
``view``, ``optimizer``, ``input``, ``weight_passthrough``, ``weight_alias``,
``attention_core``, ``pattern_role``, ``fusable``, ``random``, ``gradient_sum``. The grad
op derives its traits from the forward op: the same ``kernel``, ``attention_core`` and
``fusable``, every other flag off, no pattern role, and
``no_need_buffer``: the names of the ``grad_inputs`` whose buffers the grad kernel does not
read (Paddle's ``backward.yaml`` ``no_need_buffer``), stored as operand indices::

    defop("layer_norm", ..., pattern_role="norm",
          grad_inputs=("x", "scale", "bias", "mean", "variance", "out@GRAD"),
          no_need_buffer=("bias",))
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from completion.ops.registry import (
    OP_REGISTRY,
    InferFn,
    KernelKind,
    OpDef,
    OpError,
    PatternRole,
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
    grad_carries: Sequence[str] = (),
    kernel: KernelKind | None = "memory",
    view: bool = False,
    optimizer: bool = False,
    input: bool = False,
    weight_passthrough: bool = False,
    weight_alias: bool = False,
    attention_core: bool = False,
    pattern_role: PatternRole | None = None,
    no_need_buffer: Sequence[str] = (),
    fusable: bool = True,
    random: bool = False,
    gradient_sum: bool = False,
) -> OpDef:
    """Register op ``name`` and, when ``grad_inputs`` is given, its grad op.

    Args: as :class:`OpDef` (traits as :class:`~completion.ops.registry.OpTraits`;
    ``grad_carries`` becomes the grad op's ``carried_attrs``);
    ``grad`` defaults to ``name + "_grad"``; ``no_need_buffer`` names grad inputs of the
    derived grad op (module docstring). Returns the forward OpDef. Raises OpError if a name
    is registered twice, or ``no_need_buffer`` names something that is not a grad input of
    a derived grad op (or sits at or after a variadic one, where indices are not fixed).
    """
    gname = (grad or f"{name}_grad") if grad_inputs else grad
    derive = bool(gname and grad_inputs and gname != name and gname not in OP_REGISTRY)
    if no_need_buffer and not derive:
        raise OpError(f"{name}: no_need_buffer needs a derived grad op (grad_inputs)")
    od = OpDef(
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
        kernel=kernel,
        view=view,
        optimizer=optimizer,
        input=input,
        weight_passthrough=weight_passthrough,
        weight_alias=weight_alias,
        attention_core=attention_core,
        pattern_role=pattern_role,
        fusable=fusable,
        random=random,
        gradient_sum=gradient_sum,
    )
    gdef = _grad_opdef(od, grad_infer, grad_attrs, grad_attr_tags, no_need_buffer) if derive else None
    if gdef is not None and grad_carries:
        gdef = dataclasses.replace(gdef, carried_attrs=tuple(grad_carries))
    register_op(od)
    if gdef is not None:
        register_op(gdef)
    return od


def _buffer_indices(fwd: OpDef, names: Sequence[str]) -> frozenset[int]:
    """Operand indices of the grad op of ``fwd`` for the grad-input ``names``; OpError for
    a name that is not a grad input or whose index a variadic grad input makes unfixed."""
    gin = list(fwd.grad_inputs)
    var = {base_name(o) for o in fwd.operands if fwd.variadic and o == fwd.operands[-1]}
    var |= {base_name(r) for r in fwd.results if fwd.variadic_results and r == fwd.results[-1]}
    first_var = next((i for i, g in enumerate(gin) if base_name(g) in var), len(gin))
    out = set()
    for n in names:
        if n not in gin:
            raise OpError(f"{fwd.grad}: no_need_buffer names {n!r}, not one of its operands {gin}")
        if gin.index(n) >= first_var:
            raise OpError(f"{fwd.grad}: no_need_buffer {n!r} has no fixed operand index "
                          "(at or after a variadic operand)")
        out.add(gin.index(n))
    return frozenset(out)


def _grad_opdef(
    fwd: OpDef,
    grad_infer: InferFn | None = None,
    grad_attrs: dict[str, Any] | None = None,
    grad_attr_tags: dict[str, str] | None = None,
    no_need_buffer: Sequence[str] = (),
) -> OpDef:
    """The OpDef of ``fwd.grad`` derived from the forward declaration (module docstring):
    operands ``fwd.grad_inputs``; results ``<operand>@GRAD`` per forward operand; attributes
    and tags the forward ones updated by ``grad_attrs`` / ``grad_attr_tags``; family
    ``<family>_grad``; variadic where a grad input names the forward op's variadic operand or
    result. Inference is ``grad_infer`` or :func:`default_grad_infer`. Traits: the forward
    op's ``kernel``, ``attention_core`` and ``fusable``, ``no_need_buffer`` as operand
    indices, nothing else. Not registered here; ``fwd`` must declare ``grad`` and ``grad_inputs``."""
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
        kernel=fwd.kernel,
        attention_core=fwd.attention_core,
        fusable=fwd.fusable,
        no_need_buffer=_buffer_indices(fwd, no_need_buffer),
    )

"""Backward generation from the op registry's declarative grad declarations.

:func:`append_backward` follows Paddle's ``paddle.autograd.ir_backward.append_backward``
(PIR): the loss gradient is seeded with ``full([1], 1.0)`` + ``full_like(loss, full)``, then
forward ops are visited in reverse program order; an op gets its ``*_grad`` op (operands
from ``OpDef.grad_inputs``, see :mod:`completion.ops.declare`) when one of its results has
received a gradient. A grad result is null when its forward operand is null or has
``stop_gradient`` set. A value with several gradient contributions gets an ``add_n`` right
before the grad op of its defining op. Gradient values are named ``X@GRAD`` after a named
forward value ``X`` (contributions summed by ``add_n`` become ``X@GRAD@RENAME@k``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from completion.errors import CompletionError
from completion.ir import Operation, OpRole, Program, Value
from completion.ops.declare import GRAD_SUFFIX, base_name
from completion.ops.registry import OpDef, OpError, get_opdef
from completion.roles import FORWARD_ROLES


class BackwardError(CompletionError):
    """The program cannot be differentiated (no scalar loss, a bad grad declaration)."""


def resolve_loss(program: Program, loss: Value | str | int | None) -> Value:
    """The loss value: given, by name / ``%N``, or the operand of the last ``shadow_output``.

    Raises BackwardError when none is found or it is not a one-element tensor."""
    program.renumber()
    if loss is None:
        outs = [op for op in program.ops if op.type == "shadow_output" and op.role in FORWARD_ROLES]
        if not outs or outs[-1].operands[0] is None:
            raise BackwardError("append_backward: no loss given and no shadow_output in the program")
        loss = outs[-1].operands[0]
    elif not isinstance(loss, Value):
        loss = program.value(loss)
    assert isinstance(loss, Value)
    if loss.type.numel != 1:
        raise BackwardError(f"append_backward: loss {loss.label()} has shape {list(loss.shape)}; "
                            "it must have one element")
    if loss.op is None or loss.op.program is not program:
        raise BackwardError(f"append_backward: loss {loss.label()} is not defined in this program")
    return loss


def bind(names: Sequence[str], values: Sequence[Value | None], variadic: bool) -> dict[str, list[Value | None]]:
    """Declared names -> values (the last name takes the rest when ``variadic``)."""
    out: dict[str, list[Value | None]] = {}
    for i, n in enumerate(names):
        if variadic and i == len(names) - 1:
            out[base_name(n)] = list(values[i:])
        else:
            out[base_name(n)] = [values[i] if i < len(values) else None]
    return out


class _Grads:
    """Gradient contributions per forward value, in arrival order."""

    def __init__(self) -> None:
        self.parts: dict[int, list[Value]] = {}

    def add(self, v: Value, g: Value) -> None:
        self.parts.setdefault(id(v), []).append(g)

    def get(self, v: Value | None) -> Value | None:
        ps = self.parts.get(id(v)) if v is not None else None
        return ps[0] if ps else None

    def combine(self, program: Program, v: Value, struct_name: str) -> None:
        ps = self.parts.get(id(v), [])
        if len(ps) < 2:
            return
        if v.name:
            for k, p in enumerate(ps):
                p.name = f"{v.name}{GRAD_SUFFIX}@RENAME@{k}"
        op = program.add("add_n", ps, role=OpRole.BACKWARD, struct_name=struct_name,
                         names=[_grad_name(v)])
        self.parts[id(v)] = [op.results[0]]  # type: ignore[list-item]


def _grad_name(v: Value) -> str | None:
    return f"{v.name}{GRAD_SUFFIX}" if v.name else None


def append_backward(program: Program, loss: Value | str | int | None = None) -> list[tuple[Value, Value]]:
    """Append the backward ops of ``program`` for ``loss`` (see the module docstring).

    Args:
        program: a forward program (ops with role FORWARD / LOSS); modified in place.
        loss: the loss value, its name or ``%N``; default the operand of the last
            ``shadow_output``. Must have one element.
    Returns:
        ``(parameter, gradient)`` pairs in the order the gradients are produced.
    Raises:
        BackwardError: no usable loss; OpError: a grad declaration that does not fit.
    """
    loss = resolve_loss(program, loss)
    assert loss.op is not None
    fwd = program.ops[: program.ops.index(loss.op) + 1]
    fwd = [op for op in fwd if op.role in FORWARD_ROLES]
    loss.op.role = OpRole.LOSS
    full = program.add("full", [], {"shape": [1], "value": 1.0, "dtype": loss.dtype},
                       role=OpRole.BACKWARD, stop_gradient=True)
    seed = program.add("full_like", [loss, full.results[0]], {"dtype": loss.dtype},
                       role=OpRole.BACKWARD, names=[_grad_name(loss)])
    grads = _Grads()
    grads.add(loss, seed.results[0])  # type: ignore[arg-type]
    for op in reversed(fwd):
        for r in op.results:
            if r is not None:
                grads.combine(program, r, op.struct_name)
        od = get_opdef(op.type)
        if od is None or not od.grad or not any(grads.get(r) for r in op.results):
            continue
        _emit_grad(program, op, od, grads)
    pairs = [(v, grads.get(v)) for v in program.parameters()]
    done = [(p, g) for p, g in pairs if g is not None]
    pos = {id(o): i for i, o in enumerate(program.ops)}
    done.sort(key=lambda pg: pos[id(pg[1].op)])
    return done  # type: ignore[return-value]


def _emit_grad(program: Program, op: Operation, od: OpDef, grads: _Grads) -> Operation:
    gdef = get_opdef(od.grad or "")
    if gdef is None:
        raise OpError(f"{op.label()}: grad op {od.grad!r} is not registered")
    ins = bind(od.operands, op.operands, od.variadic)
    outs = bind(od.results, op.results, od.variadic_results)
    operands: list[Value | None] = []
    for g in od.grad_inputs:
        if base_name(g) in _left_out(od, op):
            continue  # a trailing optional operand the forward op leaves out: so does its grad
        if g.endswith(GRAD_SUFFIX):
            for r in outs.get(base_name(g), [None]):
                operands.append(grads.get(r) or _zeros(program, r, op))
        elif base_name(g) in ins:
            operands.extend(ins[base_name(g)])
        elif base_name(g) in outs:
            operands.extend(outs[base_name(g)])
        else:
            raise OpError(f"{op.full_type}: grad input {g!r} names no operand or result")
    attrs: dict[str, Any] = {k: op.attrs.get(k, d) for k, d in gdef.attrs.items()}
    attrs.update({k: op.attrs[k] for k in gdef.carried_attrs if k in op.attrs})
    tags = {k: t for k, t in {**gdef.attr_tags, **op.attr_tags}.items() if k in attrs}
    types = [v.type if v is not None else None for v in operands]
    try:
        out_types = gdef.infer(types, attrs)
    except OpError as e:
        raise OpError(f"{gdef.dialect}.{gdef.name} for {op.label()}: {e}") from None
    if len(out_types) != len(op.operands):
        raise OpError(f"{gdef.name}: {len(out_types)} results for {len(op.operands)} forward operands")
    results: list[Value | None] = []
    for x, t in zip(op.operands, out_types, strict=True):
        need = x is not None and not x.stop_gradient and t is not None
        results.append(Value(t, _grad_name(x)) if need else None)  # type: ignore[arg-type]
    gop = Operation(gdef.name, operands, results, attrs, role=OpRole.BACKWARD, dialect=gdef.dialect,
                    struct_name=op.struct_name, attr_tags=tags, chunk_id=op.chunk_id)
    program.append(gop)
    for x, g in zip(op.operands, results, strict=True):
        if x is not None and g is not None:
            grads.add(x, g)
    return gop


def _left_out(od: OpDef, op: Operation) -> set[str]:
    """Names of the trailing optional operands (``"sinks?"``) that ``op`` does not have at
    all (its operand list ends before them; a null operand in place still counts as given).
    Its grad op leaves them out too, so an op declared with a new trailing optional operand
    keeps the grad op it had without it (``flash_attention``'s ``sinks``)."""
    if od.variadic or len(op.operands) >= len(od.operands):
        return set()
    return {base_name(n) for n in od.operands[len(op.operands):] if n.endswith("?")}


def _zeros(program: Program, r: Value | None, op: Operation) -> Value | None:
    """A zero gradient for a result that received none (Paddle fills zeros likewise)."""
    if r is None:
        return None
    z = program.add("full", [], {"shape": list(r.shape), "value": 0.0, "dtype": r.dtype},
                    role=OpRole.BACKWARD, struct_name=op.struct_name, stop_gradient=True)
    return z.results[0]

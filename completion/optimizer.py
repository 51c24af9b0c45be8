"""Optimizer update ops appended after the backward ops.

:func:`apply_optimizer` emits one update op per trainable parameter, in the order the
parameters' gradients are produced (as Paddle's ``Optimizer.apply_gradients`` walks
``params_grads``; in the seed MLP ``parameter_1`` is updated before ``parameter_0``).
Update rules: SGD; Adam (Kingma & Ba 2015, Algorithm 1); AdamW (Loshchilov & Hutter 2019,
decoupled weight decay). Optimizer state (moments, beta powers) and the learning rate are
persistable ``data`` values, as Paddle feeds them.
"""

from __future__ import annotations

from completion.errors import CompletionError
from completion.ir import Operation, OpRole, Program, Value
from completion.ops.declare import GRAD_SUFFIX, base_name
from completion.ops.registry import get_opdef

OPTIMIZERS = {"sgd": "sgd_", "adam": "adam_", "adamw": "adamw_"}


class OptimizerError(CompletionError):
    """Unknown optimizer, bad hyper-parameter, or a program without parameter gradients."""


def forward_operands_of(grad_op: Operation) -> list[Value | None]:
    """For a ``*_grad`` op, the forward operand each of its results is the gradient of.

    Uses the forward op's ``grad_inputs``: an operand named there is read directly; others
    come from the forward op found through a forward result passed to the grad op."""
    gdef = get_opdef(grad_op.type)
    fdef = get_opdef(gdef.forward) if gdef and gdef.forward else None
    if fdef is None or fdef.variadic:
        return [None] * len(grad_op.results)
    gin = [g if g.endswith(GRAD_SUFFIX) else base_name(g) for g in fdef.grad_inputs]
    res_names = [base_name(r) for r in fdef.results]
    fwd_op = None
    for j, g in enumerate(gin):
        v = grad_op.operands[j] if j < len(grad_op.operands) else None
        if g in res_names and v is not None and v.op is not None:
            fwd_op = v.op
    out: list[Value | None] = []
    for i, o in enumerate(base_name(n) for n in fdef.operands):
        if o in gin and gin.index(o) < len(grad_op.operands):
            out.append(grad_op.operands[gin.index(o)])
        elif fwd_op is not None and i < len(fwd_op.operands):
            out.append(fwd_op.operands[i])
        else:
            out.append(None)
    return out


def param_grads(program: Program) -> list[tuple[Value, Value]]:
    """``(parameter, gradient)`` pairs found in the backward ops of ``program``, ordered by
    where each final gradient is defined. Several contributions to one parameter must be
    summed by one ``add_n``, whose result is then the gradient."""
    parts: dict[int, list[Value]] = {}
    params: dict[int, Value] = {}
    for op in program.ops:
        if op.role != OpRole.BACKWARD:
            continue
        for x, g in zip(forward_operands_of(op), op.results, strict=False):
            if x is not None and g is not None and x.is_parameter:
                parts.setdefault(id(x), []).append(g)
                params[id(x)] = x
    out: list[tuple[Value, Value]] = []
    for k, gs in parts.items():
        g = gs[0]
        if len(gs) > 1:
            g = _sum_of(program, gs, params[k])
        out.append((params[k], g))
    pos = {id(o): i for i, o in enumerate(program.ops)}
    out.sort(key=lambda pg: pos[id(pg[1].op)])
    return out


def _sum_of(program: Program, gs: list[Value], p: Value) -> Value:
    want = {id(g) for g in gs}
    for op in program.ops:
        if op.type == "add_n" and {id(v) for v in op.operands if v is not None} == want:
            assert op.results[0] is not None
            return op.results[0]
    raise OptimizerError(f"parameter {p.label()} has {len(gs)} gradient contributions but no add_n sums them")


def _state(program: Program, index: int, name: str, shape: list[int], dtype: str, init: float) -> Value:
    op = program.add("data", [], {"shape": shape, "dtype": dtype, "init_value": init},
                     names=[name], index=index, persistable=True, stop_gradient=True)
    assert op.results[0] is not None
    return op.results[0]


def _learning_rate(program: Program, lr: float) -> Value:
    for op in program.ops:
        v = op.results[0] if op.type == "data" and op.results else None
        if v is not None and v.persistable and (v.name or "").startswith("learning_rate"):
            op.attrs["init_value"] = lr
            return v
    return _state(program, 0, "learning_rate_0", [], "float32", lr)


def apply_optimizer(
    program: Program,
    optimizer: str = "sgd",
    learning_rate: float = 1e-3,
    *,
    beta1: float = 0.9,
    beta2: float = 0.999,
    epsilon: float = 1e-8,
    weight_decay: float = 0.01,
) -> list[Operation]:
    """Append one ``sgd_`` / ``adam_`` / ``adamw_`` op per parameter that has a gradient.

    The learning rate is a persistable scalar ``data`` value (an existing one named
    ``learning_rate*`` is reused). Adam state per parameter: ``<p>_moment1_0``,
    ``<p>_moment2_0`` (float32, the parameter's shape), ``<p>_beta1_pow_acc_0``,
    ``<p>_beta2_pow_acc_0`` (shape [1]), inserted at the program start. Returns the update
    ops. Raises OptimizerError for an unknown optimizer, a non-positive learning rate, or a
    program without parameter gradients (run :func:`append_backward` first).
    """
    if optimizer not in OPTIMIZERS:
        raise OptimizerError(f"unknown optimizer {optimizer!r}; expected one of {sorted(OPTIMIZERS)}")
    if not learning_rate > 0:
        raise OptimizerError(f"learning_rate must be > 0, got {learning_rate}")
    pgs = param_grads(program)
    if not pgs:
        raise OptimizerError("apply_optimizer: no parameter gradients in the program; run append_backward first")
    lr = _learning_rate(program, learning_rate)
    ops = []
    for p, g in pgs:
        if optimizer == "sgd":
            ops.append(program.add("sgd_", [p, lr, g, None], role=OpRole.OPTIMIZE))
            continue
        at = program.ops.index(lr.op) + 1  # type: ignore[arg-type]
        nm = p.name or f"param_{p.id}"
        state = [
            _state(program, at, f"{nm}_moment1_0", list(p.shape), "float32", 0.0),
            _state(program, at + 1, f"{nm}_moment2_0", list(p.shape), "float32", 0.0),
            _state(program, at + 2, f"{nm}_beta1_pow_acc_0", [1], "float32", beta1),
            _state(program, at + 3, f"{nm}_beta2_pow_acc_0", [1], "float32", beta2),
        ]
        attrs = {"beta1": beta1, "beta2": beta2, "epsilon": epsilon}
        if optimizer == "adamw":
            attrs["coeff"] = weight_decay
        op = program.add(OPTIMIZERS[optimizer], [p, g, lr, *state, None, None], attrs,
                         role=OpRole.OPTIMIZE)
        ops.append(op)
    program.renumber()
    return ops

"""Notations of sources and sinks (data, parameter, full, full_like, shadow_output),
``add_n``, ``reshard`` and the optimizer ops (``sgd_``, ``adam_``, ``adamw_``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from completion.ops.declare import base_name
from completion.ops.registry import get_opdef
from completion.spmd.core import LetterPool, Letters, LinearGroup, Notation
from completion.spmd.notations import replicated_letters
from completion.spmd.rule import register_spmd_rule

Shapes = Sequence[tuple[int, ...] | None]


def source(op: str, ins: Shapes, outs: Shapes, attrs: dict[str, Any]) -> Notation:
    """``data`` / ``parameter`` / ``full`` (no operands: the result takes its annotation or
    its consumers' wish) and ``full_like(x, value)`` (the result follows x; x is read for
    its shape only; only x has an operand attr, as Paddle prints it)."""
    pool = LetterPool()
    if not ins:
        return Notation([], [pool.take(len(s or ())) for s in outs])
    x = ins[0] if ins[0] is not None else (outs[0] or ())
    lt = pool.take(len(x))
    return Notation([lt] + [None] * (len(ins) - 1), [lt], shape_only=frozenset({0}),
                    num_operand_attrs=1)


def sink(op: str, ins: Shapes, outs: Shapes, attrs: dict[str, Any]) -> Notation:
    """``shadow_output(x)``: x as it is, Partial reduced first (an output is a full value)."""
    pool = LetterPool()
    return Notation([pool.take(len(s)) if s is not None else None for s in ins], [])


def add_n(op: str, ins: Shapes, outs: Shapes, attrs: dict[str, Any]) -> Notation:
    """``add_n(x...)``: gradient accumulation; all operands share the result's letters and
    Partial operands pass through when all are Partial alike."""
    pool = LetterPool()
    x = next((s for s in list(ins) + list(outs) if s is not None), ())
    lt = pool.take(len(x))
    return Notation([lt for _ in ins], [lt], linear=(LinearGroup(tuple(range(len(ins))), "all"),))


def reshard(op: str, ins: Shapes, outs: Shapes, attrs: dict[str, Any]) -> Notation:
    """``reshard(x)``: identity; every Partial passes (the partition pass sets the target
    layout on the result explicitly)."""
    pool = LetterPool()
    x = ins[0] if ins and ins[0] is not None else (outs[0] if outs and outs[0] is not None else ())
    lt = pool.take(len(x))
    return Notation([lt], [lt], keep_all_partial=True)


#: optimizer operands laid out like the parameter (the rest, learning rate, beta powers and
#: skip_update, are replicated)
PARAM_LIKE = ("param", "grad", "moment1", "moment2", "master_param")


def optimizer(op: str, ins: Shapes, outs: Shapes, attrs: dict[str, Any]) -> Notation:
    """``sgd_`` / ``adam_`` / ``adamw_``: param, grad, moments and master param share the
    parameter's letters (operands found by name in the op declaration); the learning rate
    and beta powers are replicated; ``X_out`` follows ``X`` (None when X is null). A Partial
    gradient is required reduced (the update is not linear)."""
    od = get_opdef(op)
    names = [base_name(n) for n in od.operands] if od else []
    rnames = list(od.results) if od else []
    pool = LetterPool()
    p = ins[0] or ()
    plt = pool.take(len(p))
    rep: set[str] = set()
    by_name: dict[str, Letters | None] = {}
    inputs: list[Letters | None] = []
    for i, s in enumerate(ins):
        nm = names[i] if i < len(names) else ""
        lt = None if s is None else (plt if nm in PARAM_LIKE else replicated_letters(s, pool, rep))
        by_name[nm] = lt
        inputs.append(lt)
    bases = [r.removesuffix("_out") for r in rnames[: len(outs)]]
    outputs = [by_name.get(b) for b in bases]
    # beta powers and other scalar state do not depend on the sharded parameter letters:
    # they never become Partial
    aux = frozenset(i for i, b in enumerate(bases) if b not in PARAM_LIKE)
    return Notation(inputs, outputs, rep, aux_outputs=aux)


register_spmd_rule("source", source)
register_spmd_rule("sink", sink)
register_spmd_rule("add_n", add_n)
register_spmd_rule("reshard", reshard)
register_spmd_rule("optimizer", optimizer)


def p2p(op: str, ins: Shapes, outs: Shapes, attrs: dict[str, Any]) -> Notation:
    """``send(x)`` keeps x as it is (any Partial travels); ``recv()`` is a source."""
    if not ins:
        return source(op, ins, outs, attrs)
    pool = LetterPool()
    return Notation([pool.take(len(s)) if s is not None else None for s in ins], [],
                    keep_all_partial=True)


# collectives and local steps emitted by the reshard pass carry their target layout on
# their result; propagation treats them as identities like ``reshard``
register_spmd_rule("collective", reshard)
register_spmd_rule("reshard_local", reshard)
register_spmd_rule("p2p", p2p)

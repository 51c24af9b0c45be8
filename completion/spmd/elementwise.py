"""Einsum notations of the elementwise families (``completion.ops.elementwise``, the
unary ops of ``completion.ops.basic``): binary ops with right-aligned numpy broadcasting,
unary activations, ``cast``, ``scale``, ``dropout``; and the letter helpers the other rule
modules share (:func:`broadcast_letters`, :func:`replicated_letters`).

Each function maps ``(op_type, operand shapes, result shapes, attrs)`` to a
:class:`~completion.spmd.core.Notation`; shapes may be None for a null value.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from completion.spmd.core import ALL_TYPES, LetterPool, Letters, LinearGroup, Notation
from completion.spmd.rule import register_spmd_rule

Shapes = Sequence[tuple[int, ...] | None]


def broadcast_letters(shapes: Shapes, pool: LetterPool, out_rank: int | None = None
                      ) -> tuple[list[Letters | None], Letters]:
    """Right-aligned letters for operands that broadcast together, and the result's.

    A size-1 dim that stretches against a larger one gets a fresh letter of its own (it is
    a broadcast dim: replicated, and reduced away in the gradient)."""
    known = [s for s in shapes if s is not None]
    rank = max([len(s) for s in known] + [out_rank or 0])
    out = pool.take(rank)
    big = [1] * rank
    for s in known:
        for d, n in enumerate(s):
            k = rank - len(s) + d
            if n != 1:
                big[k] = n
    res: list[Letters | None] = []
    for s in shapes:
        if s is None:
            res.append(None)
            continue
        lt = list(out[rank - len(s):])
        for d, n in enumerate(s):
            if n == 1 and big[rank - len(s) + d] != 1:
                lt[d] = pool.one()
        res.append(tuple(lt))
    return res, out


def replicated_letters(shape: tuple[int, ...] | None, pool: LetterPool, rep: set[str]) -> Letters | None:
    """Fresh letters for an operand that takes no part in the sharding (all replicated)."""
    if shape is None:
        return None
    lt = pool.take(len(shape))
    rep.update(lt)
    return lt


def elementwise_binary(op: str, ins: Shapes, outs: Shapes, attrs: dict[str, Any]) -> Notation:
    """``multiply/divide`` and the rest of the family: right-aligned broadcast."""
    pool = LetterPool()
    out_rank = len(outs[0]) if outs and outs[0] is not None else None
    lts, out = broadcast_letters(list(ins), pool, out_rank)
    return Notation(lts, [out])


def linear_binary(op: str, ins: Shapes, outs: Shapes, attrs: dict[str, Any]) -> Notation:
    """``add/subtract``: as :func:`elementwise_binary`, and Partial inputs are kept when both
    are Partial alike (a sum or difference of partials is the partial of the sum)."""
    n = elementwise_binary(op, ins, outs, attrs)
    return Notation(n.inputs, n.outputs, linear=(LinearGroup((0, 1), "all"),))


def elementwise_unary(op: str, ins: Shapes, outs: Shapes, attrs: dict[str, Any]) -> Notation:
    """Activations, ``cast``, ``scale``, ``dropout``: the result(s) share x's letters; extra
    operands (scale tensor, dropout seed) are replicated. cast keeps any Partial; scale keeps
    Partial(sum/avg) when its bias is 0 (a bias would be added once per rank)."""
    pool = LetterPool()
    x = ins[0] if ins else None
    if x is None:
        x = next((s for s in outs if s is not None), ())
    lt = pool.take(len(x))
    rep: set[str] = set()
    inputs: list[Letters | None] = [lt] + [replicated_letters(s, pool, rep) for s in ins[1:]]
    linear: tuple[LinearGroup, ...] = ()
    if op == "cast":
        linear = (LinearGroup((0,), "all", ALL_TYPES),)
    elif op == "scale" and float(attrs.get("bias", 0.0) or 0.0) == 0.0:
        linear = (LinearGroup((0,), "all"),)
    return Notation(inputs, [lt for _ in range(max(1, len(outs)))], rep, linear=linear)



register_spmd_rule("elementwise_binary", elementwise_binary)
register_spmd_rule("add", linear_binary)
register_spmd_rule("subtract", linear_binary)
register_spmd_rule("elementwise_unary", elementwise_unary)

"""Einsum notations of the basic op families: elementwise (with right-aligned numpy
broadcasting), matmul, reductions, transpose, split, concat, slice, softmax.

Each function maps ``(op_type, operand shapes, result shapes, attrs)`` to a
:class:`~completion.spmd.core.Notation`; shapes may be None for a null value.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from completion.spmd.core import ALL_TYPES, LetterPool, Letters, LinearGroup, Notation
from completion.spmd.rule import register_spmd_rule

Shapes = Sequence[tuple[int, ...] | None]


def _norm(axis: int, ndim: int) -> int:
    return axis + ndim if axis < 0 else axis


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


# -- elementwise ---------------------------------------------------------------------------
def elementwise_binary(op: str, ins: Shapes, outs: Shapes, attrs: dict[str, Any]) -> Notation:
    """``add/subtract/multiply/divide``: right-aligned broadcast; add and subtract keep
    Partial inputs when both are Partial alike (sum of partials)."""
    pool = LetterPool()
    out_rank = len(outs[0]) if outs and outs[0] is not None else None
    lts, out = broadcast_letters(list(ins), pool, out_rank)
    linear = (LinearGroup((0, 1), "all"),) if op in ("add", "subtract") else ()
    return Notation(lts, [out], linear=linear)


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


def softmax(op: str, ins: Shapes, outs: Shapes, attrs: dict[str, Any]) -> Notation:
    """``softmax`` / ``log_softmax``: the softmax axis is replicated."""
    nt = elementwise_unary(op, ins, outs, attrs)
    lt = nt.inputs[0] or ()
    if lt:
        nt.replicated.add(lt[_norm(int(attrs.get("axis", -1)), len(lt))])
    return nt


def swiglu(op: str, ins: Shapes, outs: Shapes, attrs: dict[str, Any]) -> Notation:
    """``swiglu(x, y)``: elementwise; with y null, x's last dim holds both halves and is
    replicated."""
    if len(ins) > 1 and ins[1] is not None:
        pool = LetterPool()
        lts, out = broadcast_letters(list(ins[:2]), pool)
        return Notation(lts, [out])
    pool = LetterPool()
    x = ins[0] if ins and ins[0] is not None else (outs[0] or ())
    lt = pool.take(len(x))
    out = lt[:-1] + (pool.one(),) if lt else lt
    rep = {lt[-1], out[-1]} if lt else set()
    return Notation([lt, None], [out], rep)


# -- matmul --------------------------------------------------------------------------------
def matmul(op: str, ins: Shapes, outs: Shapes, attrs: dict[str, Any]) -> Notation:
    """``...mk,...kn->...mn`` with transpose_x / transpose_y and right-aligned broadcast
    batch dims; a 1-d x is ``k`` and a 1-d y is ``k``. Contracting a sharded k gives
    Partial(sum); one side may be Partial (the product is linear in each operand)."""
    pool = LetterPool()
    x, y = ins[0] or (), ins[1] or ()
    m, k, n = pool.take(3)
    bx, by = x[:-2] if len(x) > 1 else (), y[:-2] if len(y) > 1 else ()
    blts, bout = broadcast_letters([bx, by], pool)
    if len(x) == 1:
        xl: Letters = (k,)
    else:
        xl = (blts[0] or ()) + ((k, m) if attrs.get("transpose_x") else (m, k))
    if len(y) == 1:
        yl: Letters = (k,)
    else:
        yl = (blts[1] or ()) + ((n, k) if attrs.get("transpose_y") else (k, n))
    out = bout + ((m,) if len(x) > 1 else ()) + ((n,) if len(y) > 1 else ())
    return Notation([xl, yl], [out], linear=(LinearGroup((0, 1), "one"),))


# -- reductions ----------------------------------------------------------------------------
REDUCE_TYPE = {"sum": "sum", "mean": "avg", "max": "max", "min": "min"}


def reduce(op: str, ins: Shapes, outs: Shapes, attrs: dict[str, Any]) -> Notation:
    """``sum`` / ``mean`` / ``max`` over ``axis`` ([] = all) with keepdim: a sharded reduced
    letter makes the result Partial(sum / avg / max). Partial(avg) needs an even split
    (checked in :func:`completion.spmd.core.solve`; an uneven one is replicated first)."""
    pool = LetterPool()
    x = ins[0] or ()
    lt = pool.take(len(x))
    axes = attrs.get("axis")
    if isinstance(axes, int):
        axes = [axes]
    red = {_norm(int(a), len(x)) for a in axes} if axes else set(range(len(x)))
    if attrs.get("keepdim"):
        out = tuple(pool.one() if d in red else L for d, L in enumerate(lt))
    else:
        out = tuple(L for d, L in enumerate(lt) if d not in red)
    return Notation([lt], [out], reduce_type=REDUCE_TYPE.get(op, "sum"))


# -- layout ops ----------------------------------------------------------------------------
def transpose(op: str, ins: Shapes, outs: Shapes, attrs: dict[str, Any]) -> Notation:
    """Letters permuted by ``perm``; keeps any Partial."""
    pool = LetterPool()
    x = ins[0] or ()
    lt = pool.take(len(x))
    perm = [_norm(int(p), len(x)) for p in attrs.get("perm") or range(len(x))]
    return Notation([lt], [tuple(lt[p] for p in perm)], linear=(LinearGroup((0,), "all", ALL_TYPES),))


def split(op: str, ins: Shapes, outs: Shapes, attrs: dict[str, Any]) -> Notation:
    """Every part shares x's letters; the split axis is replicated."""
    pool = LetterPool()
    x = ins[0] or next((s for s in outs if s is not None), ())
    lt = pool.take(len(x))
    rep = {lt[_norm(int(attrs.get("axis", 0)), len(lt))]} if lt else set()
    return Notation([lt], [lt for _ in range(max(1, len(outs)))], rep)


def concat(op: str, ins: Shapes, outs: Shapes, attrs: dict[str, Any]) -> Notation:
    """Every operand shares the result's letters; the concat axis is replicated."""
    pool = LetterPool()
    x = next((s for s in list(ins) + list(outs) if s is not None), ())
    lt = pool.take(len(x))
    rep = {lt[_norm(int(attrs.get("axis", 0)), len(lt))]} if lt else set()
    return Notation([lt for _ in ins], [lt], rep)


def slice_(op: str, ins: Shapes, outs: Shapes, attrs: dict[str, Any]) -> Notation:
    """Sliced axes are replicated; ``decrease_axis`` dims are dropped from the result."""
    pool = LetterPool()
    x = ins[0] or ()
    lt = pool.take(len(x))
    rep = {lt[_norm(int(a), len(lt))] for a in attrs.get("axes") or []}
    dec = {_norm(int(a), len(lt)) for a in attrs.get("decrease_axis") or []}
    return Notation([lt], [tuple(L for d, L in enumerate(lt) if d not in dec)], rep)


register_spmd_rule("elementwise_binary", elementwise_binary)
register_spmd_rule("elementwise_unary", elementwise_unary)
register_spmd_rule("softmax", softmax)
register_spmd_rule("swiglu", swiglu)
register_spmd_rule("matmul", matmul)
register_spmd_rule("reduce", reduce)
register_spmd_rule("transpose", transpose)
register_spmd_rule("split", split)
register_spmd_rule("concat", concat)
register_spmd_rule("slice", slice_)

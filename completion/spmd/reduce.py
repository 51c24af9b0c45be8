"""Einsum notation of the reductions ``sum``, ``mean``, ``max`` (``completion.ops.reduce``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from completion.spmd.core import LetterPool, Notation, norm_axis
from completion.spmd.rule import register_spmd_rule

Shapes = Sequence[tuple[int, ...] | None]


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
    red = {norm_axis(int(a), len(x)) for a in axes} if axes else set(range(len(x)))
    if attrs.get("keepdim"):
        out = tuple(pool.one() if d in red else L for d, L in enumerate(lt))
    else:
        out = tuple(L for d, L in enumerate(lt) if d not in red)
    return Notation([lt], [out], reduce_type=REDUCE_TYPE.get(op, "sum"))


register_spmd_rule("reduce", reduce)

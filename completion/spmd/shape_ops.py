"""Einsum notations of the layout ops (``completion.ops.shape_ops``): transpose, split,
concat, slice, expand. The reshape rule (``reshape``, ``squeeze``, ``unsqueeze``) is not einsum-
shaped and lives in :mod:`completion.spmd.reshape`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from completion.spmd.core import ALL_TYPES, LetterPool, LinearGroup, Notation, norm_axis
from completion.spmd.elementwise import broadcast_letters
from completion.spmd.rule import register_spmd_rule

Shapes = Sequence[tuple[int, ...] | None]


def transpose(op: str, ins: Shapes, outs: Shapes, attrs: dict[str, Any]) -> Notation:
    """Letters permuted by ``perm``; keeps any Partial."""
    pool = LetterPool()
    x = ins[0] or ()
    lt = pool.take(len(x))
    perm = [norm_axis(int(p), len(x)) for p in attrs.get("perm") or range(len(x))]
    return Notation([lt], [tuple(lt[p] for p in perm)], linear=(LinearGroup((0,), "all", ALL_TYPES),))


def split(op: str, ins: Shapes, outs: Shapes, attrs: dict[str, Any]) -> Notation:
    """Every part shares x's letters; the split axis is replicated."""
    pool = LetterPool()
    x = ins[0] or next((s for s in outs if s is not None), ())
    lt = pool.take(len(x))
    rep = {lt[norm_axis(int(attrs.get("axis", 0)), len(lt))]} if lt else set()
    return Notation([lt], [lt for _ in range(max(1, len(outs)))], rep)


def concat(op: str, ins: Shapes, outs: Shapes, attrs: dict[str, Any]) -> Notation:
    """Every operand shares the result's letters; the concat axis is replicated."""
    pool = LetterPool()
    x = next((s for s in list(ins) + list(outs) if s is not None), ())
    lt = pool.take(len(x))
    rep = {lt[norm_axis(int(attrs.get("axis", 0)), len(lt))]} if lt else set()
    return Notation([lt for _ in ins], [lt], rep)


def slice_(op: str, ins: Shapes, outs: Shapes, attrs: dict[str, Any]) -> Notation:
    """Sliced axes are replicated; ``decrease_axis`` dims are dropped from the result."""
    pool = LetterPool()
    x = ins[0] or ()
    lt = pool.take(len(x))
    rep = {lt[norm_axis(int(a), len(lt))] for a in attrs.get("axes") or []}
    dec = {norm_axis(int(a), len(lt)) for a in attrs.get("decrease_axis") or []}
    return Notation([lt], [tuple(L for d, L in enumerate(lt) if d not in dec)], rep)


def expand(op: str, ins: Shapes, outs: Shapes, attrs: dict[str, Any]) -> Notation:
    """``x -> out`` right-aligned as numpy broadcasting: a stretched size-1 dim of x has a
    letter of its own (replicated), so the result may be sharded on it (each rank expands
    to its block) and the gradient, summed over it, is Partial(sum) over that mesh dim."""
    x = ins[0] or ()
    out = outs[0] if outs and outs[0] is not None else x
    lts, res = broadcast_letters([x, out], LetterPool())
    return Notation([lts[0]], [res])


register_spmd_rule("transpose", transpose)
register_spmd_rule("expand", expand)
register_spmd_rule("split", split)
register_spmd_rule("concat", concat)
register_spmd_rule("slice", slice_)

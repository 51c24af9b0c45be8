"""Notations of the ops of ``completion.ops.basic``: sources and sinks (data, parameter,
full, full_like, shadow_output), ``add_n`` and ``reshard``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from completion.spmd.core import LetterPool, LinearGroup, Notation
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


register_spmd_rule("source", source, reads_attrs=False)  # the notation never reads attrs
register_spmd_rule("sink", sink)
register_spmd_rule("add_n", add_n)
register_spmd_rule("reshard", reshard)

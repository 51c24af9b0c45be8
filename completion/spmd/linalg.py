"""Einsum notation of ``matmul`` (``completion.ops.linalg``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from completion.spmd.core import LetterPool, Letters, LinearGroup, Notation
from completion.spmd.elementwise import broadcast_letters
from completion.spmd.rule import register_spmd_rule

Shapes = Sequence[tuple[int, ...] | None]


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


register_spmd_rule("matmul", matmul)

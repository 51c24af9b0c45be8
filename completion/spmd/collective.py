"""Notations of the ops the reshard pass emits (``completion.ops.collective``):
collectives and local steps keep the reshard notation; send/recv is ``p2p``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from completion.spmd.basic import reshard, source
from completion.spmd.core import LetterPool, Notation
from completion.spmd.rule import register_spmd_rule

Shapes = Sequence[tuple[int, ...] | None]


def p2p(op: str, ins: Shapes, outs: Shapes, attrs: dict[str, Any]) -> Notation:
    """``send(x)`` keeps x as it is (any Partial travels); ``recv()`` is a source."""
    if not ins:
        return source(op, ins, outs, attrs)
    pool = LetterPool()
    return Notation([pool.take(len(s)) if s is not None else None for s in ins], [],
                    keep_all_partial=True)



register_spmd_rule("collective", reshard)
register_spmd_rule("reshard_local", reshard)
register_spmd_rule("p2p", p2p)

"""Notation of the optimizer ops (``completion.ops.optim``: ``sgd_``, ``adam_``, ``adamw_``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from completion.ops.declare import base_name
from completion.ops.registry import get_opdef
from completion.spmd.core import LetterPool, Letters, Notation
from completion.spmd.elementwise import replicated_letters
from completion.spmd.rule import register_spmd_rule

Shapes = Sequence[tuple[int, ...] | None]


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


register_spmd_rule("optimizer", optimizer)

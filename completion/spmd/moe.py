"""Einsum notations of the mixture-of-experts ops (:mod:`completion.ops.moe`).

Tokens ``[b, s, h]``, routing ``[b, s, k]``, expert-major tokens ``[E, b*C, h]``. The
token dim of the expert-major layout carries the letter of the batch b: a batch sharded
over data parallelism leaves each rank the ``b/dp * C`` slots of its own sequences (each
rank routes its own tokens to its full copy of the experts; expert-data-parallel of
Megatron-Core with ep = 1). Expert weights sharded on their expert dim over the mesh dim
that splits the batch (expert parallelism, ep = dp) make the expert GEMMs ask for the
expert-major tokens sharded by expert: the reshard pass turns Shard(1) -> Shard(0) into the
dispatch all_to_all, and the combine (expert letter replicated) turns it back, the combine
all_to_all. The sequence and choice letters are replicated: tokens are
gathered over sequence parallelism before routing (Megatron-Core's all-gather token
dispatcher does the same over the TP group). The combine requires its
expert outputs reduced: a row-parallel expert ``down_proj``'s Partial(sum) is reduced on
the ``[E, b*C, h]`` tensor before the combine, as Megatron-Core reduces (reduce-scatters)
the permuted expert outputs over the expert-TP group before un-permuting; the combine's
backward then reads the reduced outputs for the routing-weight gradient.
The aux loss passes its ``x`` through and reduces over the batch and sequence inside its
kernel (each rank's loss on its own tokens, as
Megatron-Core computes it per micro-batch): no Partial from a sharded batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from completion.spmd.core import LetterPool, Notation
from completion.spmd.rule import register_spmd_rule

Shapes = Sequence[tuple[int, ...] | None]


def _rank(shapes: Shapes, default: int) -> int:
    s = next((x for x in shapes if x is not None), None)
    return default if s is None else len(s)


def moe_topk(op: str, ins: Shapes, outs: Shapes, attrs: dict[str, Any]) -> Notation:
    """``...e -> ...k, ...k``: the expert dim is read whole (replicated)."""
    pool = LetterPool()
    n = _rank([ins[0] if ins else None], 1)
    lead = pool.take(n - 1)
    e, k = pool.take(2)
    return Notation([lead + (e,)], [lead + (k,), lead + (k,)], {e, k})


def moe_dispatch(op: str, ins: Shapes, outs: Shapes, attrs: dict[str, Any]) -> Notation:
    """``bsh, bsk -> ebh`` (module docstring): s, k, e replicated."""
    b, s, h, k, e = LetterPool().take(5)
    return Notation([(b, s, h), (b, s, k)], [(e, b, h)], {s, k, e})


def moe_combine(op: str, ins: Shapes, outs: Shapes, attrs: dict[str, Any]) -> Notation:
    """``ebh, bsk, bsk -> bsh``: e replicated, so expert outputs sharded by expert (expert
    parallelism) are moved back to their tokens' ranks, an all_to_all from Shard(0) to
    Shard(1) on the expert-major tensor (Megatron-Core's all-to-all token dispatcher,
    ``token_unpermutation``), rather than all-gathering the routing and reducing a Partial;
    Partial inputs reduced."""
    b, s, h, k, e = LetterPool().take(5)
    return Notation([(e, b, h), (b, s, k), (b, s, k)], [(b, s, h)], {s, k, e})


def moe_aux_loss(op: str, ins: Shapes, outs: Shapes, attrs: dict[str, Any]) -> Notation:
    """``bsh, bse, bsk -> bsh, ()``: x passes through, b and s reduced inside the kernel
    for the loss, e and k replicated, s replicated (routing reads whole sequences). Not
    linear: its grad computes the aux gradient of ``probs`` whole on every rank, so a
    Partial ``out@GRAD`` is reduced first (kept Partial, it would make that gradient
    Partial too and sum it over the tensor-parallel ranks)."""
    b, s, h, e, k = LetterPool().take(5)
    return Notation([(b, s, h), (b, s, e), (b, s, k)], [(b, s, h), ()], {s, e, k},
                    internal=frozenset({b, s}))


for _name, _fn in (("moe_topk", moe_topk), ("moe_dispatch", moe_dispatch),
                   ("moe_combine", moe_combine), ("moe_aux_loss", moe_aux_loss)):
    register_spmd_rule(_name, _fn)

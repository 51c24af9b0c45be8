"""Blocks of a program: ``"pre"`` (ops before the first decoder layer: embeddings), one
int per decoder layer (struct names ``...layers.<i>...``, the builders' scheme, see
``completion.models``) and ``"post"`` (final norm, head, loss). A backward op belongs to
its own layer, or else to the block of the forward op with the same struct name (a compute
op's block wins over an input's: the ``labels`` data op is created before the layers but
shares the struct name ``loss`` with the loss ops, whose backward belongs to ``"post"``)."""

from __future__ import annotations

import re
from typing import Any

from completion.ir import Operation, OpRole, Program

LAYER_RE = re.compile(r"(?:^|\.)layers\.(\d+)(?:\.|$)")
Block = Any  # "pre" | int | "post"
INPUT_OPS = frozenset({"data", "parameter"})  # ops that only declare a program input


def layer_of(op: Operation | None) -> int | None:
    """Decoder layer index of ``op`` from its struct name, or None."""
    if op is None:
        return None
    m = LAYER_RE.search(op.struct_name or "")
    return int(m.group(1)) if m else None


def assign_blocks(program: Program) -> dict[int, Block]:
    """id(op) -> block for every forward, loss and backward op."""
    out: dict[int, Block] = {}
    by_struct: dict[str, Block] = {}
    of_inputs: dict[str, Block] = {}  # struct name -> block of its first data/parameter op
    seen_layer = False
    for op in program.ops:
        if op.role not in (OpRole.FORWARD, OpRole.LOSS):
            continue
        layer = layer_of(op)
        if layer is not None:
            seen_layer = True
            blk: Block = layer
        else:
            blk = "post" if seen_layer else "pre"
        out[id(op)] = blk
        (of_inputs if op.type in INPUT_OPS else by_struct).setdefault(op.struct_name, blk)
    for name, blk in of_inputs.items():
        by_struct.setdefault(name, blk)
    for op in program.ops:
        if op.role == OpRole.BACKWARD:
            layer = layer_of(op)
            out[id(op)] = layer if layer is not None else by_struct.get(op.struct_name, "post")
    return out

"""Blocks of a program: ``"pre"`` (ops before the first decoder layer: embeddings), one
int per decoder layer (struct names ``...layers.<i>...``, the builders' scheme, see
``completion.models``) and ``"post"`` (final norm, head, loss). A backward op belongs to
its own layer, or else to the block of the forward op with the same struct name (a compute
op's block wins over an input's: the ``labels`` data op is created before the layers but
shares the struct name ``loss`` with the loss ops, whose backward belongs to ``"post"``; an
input op is one whose traits have ``input``, see ``completion.ops.op_traits``). Block keys
are typed :data:`simulator.types.BlockKey`."""

from __future__ import annotations

import re

from completion.ir import Operation, OpRole, Program
from completion.ops.registry import op_traits
from simulator.types import BlockKey

LAYER_RE = re.compile(r"(?:^|\.)layers\.(\d+)(?:\.|$)")


def layer_of(op: Operation | None) -> int | None:
    """Decoder layer index of ``op`` from its struct name, or None."""
    if op is None:
        return None
    m = LAYER_RE.search(op.struct_name or "")
    return int(m.group(1)) if m else None


def assign_blocks(program: Program) -> dict[int, BlockKey]:
    """id(op) -> block for every forward, loss and backward op."""
    out: dict[int, BlockKey] = {}
    by_struct: dict[str, BlockKey] = {}
    of_inputs: dict[str, BlockKey] = {}  # struct name -> block of its first data/parameter op
    seen_layer = False
    for op in program.ops:
        if op.role not in (OpRole.FORWARD, OpRole.LOSS):
            continue
        layer = layer_of(op)
        if layer is not None:
            seen_layer = True
            blk: BlockKey = layer
        else:
            blk = "post" if seen_layer else "pre"
        out[id(op)] = blk
        (of_inputs if op_traits(op.type).input else by_struct).setdefault(op.struct_name, blk)
    for name, blk in of_inputs.items():
        by_struct.setdefault(name, blk)
    for op in program.ops:
        if op.role == OpRole.BACKWARD:
            layer = layer_of(op)
            out[id(op)] = layer if layer is not None else by_struct.get(op.struct_name, "post")
    return out

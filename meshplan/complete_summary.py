"""The per-op summary ``meshplan complete`` prints after the completed program: each op's
type, struct name, stage / chunk and operand -> result placements, ``*`` where an operand's
value has another layout (a reshard goes there)."""

from __future__ import annotations

from typing import Any


def summary_lines(program: Any, completer: Any) -> list[str]:
    """One line per op of a completed ``completion.ir.Program`` (``completer``: the
    ``Completer`` that completed it, for the stages), then the count of operands that need a
    reshard, and :data:`RESHARD_NOTE` saying what that count means."""
    lines = ["// per-op summary: type [struct] stage/chunk: operands -> results (* = reshard needed)"]
    for op in program.ops:
        lines.append("//   " + _op_line(op, completer))
    n = sum(1 for op in program.ops for i, v in enumerate(op.operands)
            if v is not None and op.dist_attr and i < len(op.dist_attr.operands)
            and op.dist_attr.operands[i] is not None and _differs(v.dist_attr, op.dist_attr.operands[i]))
    lines.append(f"// operands needing a reshard: {n}")
    lines += RESHARD_NOTE
    return lines


#: what the count line means (printed under it): the operand layout an op's rule wants
#: against the layout its producer left, and what happens at each mismatch
RESHARD_NOTE = [
    "//   (an operand needs a reshard when the layout its producer left -- its placements,",
    "//    partial status or mesh -- differs from the layout this op's SPMD rule reads it in;",
    "//    the lines marked * above. The partition pass inserts a reshard op there: a",
    "//    collective (all_gather, all_to_all, reduce_scatter, all_reduce) or a local slice,",
    "//    planned by completion.reshard.plan_reshard and timed in simulator/stage_cost.py.",
    "//    0 means every value flows in the layout its consumer wants; `meshplan cost`",
    "//    includes these reshards in the step time)",
]


def _fmt(a: Any) -> str:
    if a is None:
        return "null"
    return "(" + ",".join(str(p) for p in a.placements) + ")"  # DTensor's short form


def _differs(a: Any, b: Any) -> bool:
    return a is not None and (a.dims_mapping != b.dims_mapping or a.partial != b.partial
                              or a.process_mesh != b.process_mesh)


def _op_line(op: Any, completer: Any) -> str:
    d = op.dist_attr
    where = f"stage {completer.stage_of(op)}/chunk {op.chunk_id}"
    if d is None:
        return f"{op.full_type} [{op.struct_name}] {where}: (no dist attr)"
    ins = []
    for i, a in enumerate(d.operands):
        v = op.operands[i] if i < len(op.operands) else None
        mark = "*" if v is not None and a is not None and _differs(v.dist_attr, a) else ""
        ins.append(_fmt(a) + mark)
    outs = [_fmt(a) for a in d.results]
    return f"{op.full_type} [{op.struct_name}] {where}: {' '.join(ins)} -> {' '.join(outs)}"

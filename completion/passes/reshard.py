"""The reshard pass (each ``dist_op.reshard`` becomes the ops of its plan) and the
per-rank view of a program.

``apply_reshard_pass`` follows Paddle's ``ReshardPass``: the planner
(:func:`completion.reshard.plan_reshard`) chooses the steps, and each step becomes one op
(a send_recv step two: ``send`` on the source mesh, ``recv`` on the destination mesh),
with the step's mesh dim, groups and bytes as attributes (``completion.ops.collective``).
Relabels (e.g. Replicate -> Partial(avg)) move no data and emit nothing; when a whole
reshard is a relabel its users read the source value directly.

``rank_program(program, rank)`` lists the ops rank ``r`` executes with their local operand
and result shapes (ops whose mesh lacks ``r`` are skipped), as the executor and the cost
model read them.
"""

from __future__ import annotations

from dataclasses import dataclass

from completion.dist_attr import (
    OperatorDistAttr,
    Placement,
    TensorDistAttr,
    parse_placements,
)
from completion.errors import CompletionError, DistAttrError
from completion.gc_pause import gc_paused
from completion.ir import Operation, Program, Value
from completion.mesh import ProcessMesh
from completion.ops.registry import get_opdef
from completion.passes.splice import OpSplicer
from completion.reshard import Layout, ReshardStep, StepCost, plan_reshard

STEP_OPS = {
    "all_reduce": "all_reduce",
    "reduce_scatter": "reduce_scatter",
    "all_gather": "all_gather",
    "all_to_all": "all_to_all",
    "slice": "local_slice",
    "zero_fill": "zero_fill",
    "scale": "local_scale",
}


@gc_paused()  # builds a graph of cyclic Values/Operations (completion.gc_pause)
def apply_reshard_pass(program: Program, cost: StepCost | None = None) -> Program:
    """Replace every ``reshard`` op of ``program`` (in place) by the ops of its plan.

    ``cost`` is the planner's per-step cost (default: the hardware-free proxy). Returns
    the program, renumbered. Raises ReshardError naming the value and both attrs for an
    unreachable layout, CompletionError for a reshard op without a dist attr."""
    program.renumber()  # error messages name values by id
    edits = OpSplicer(program)
    attrs: dict = {}  # _step_attrs's answers in this pass
    for op in [o for o in program.ops if o.type == "reshard"]:
        v, out = op.operands[0], op.results[0]
        if op.dist_attr is None or v is None or out is None:
            raise CompletionError(f"{op.label()}: a reshard op needs an operand, a result and an op_dist_attr")
        src = op.dist_attr.operands[0] or v.dist_attr
        dst = op.dist_attr.results[0] or out.dist_attr
        plan = plan_reshard(src, dst, v.shape, v.dtype, cost=cost, value=v.label())
        cur = v
        for step in plan.steps:
            cur = _emit(edits, op, step, cur, attrs)
        if cur is not v:
            cur.dist_attr = dst
        for user, j in list(out.uses):
            program.set_operand(user, j, cur)
        edits.remove(op)
    edits.commit()
    program.renumber()
    return program


def _attr(mesh: ProcessMesh, pl: tuple[Placement, ...], ndim: int, chunk: int) -> TensorDistAttr | None:
    """The TensorDistAttr of placements ``pl`` on ``mesh`` for a rank-``ndim`` tensor, None
    when ``pl`` nests two mesh dims on one tensor dim (the op's ``placements`` attr then
    carries the layout)."""
    try:
        return TensorDistAttr.from_placements(mesh, pl, ndim, chunk)
    except DistAttrError:
        return None


def _step_attrs(step: ReshardStep, ndim: int, chunk: int, memo: dict) -> tuple:
    """``step``'s source and target attrs (:func:`_attr`; the target on ``dst_mesh`` for a
    send_recv). ``memo`` keeps them for one pass by the step object: plans are memoised, so
    every layer's reshard of one layout pair emits the same step objects, and attrs are
    immutable, so values may share them. The step is kept in the entry, so its id is not
    reused while the memo lives."""
    key = (id(step), ndim, chunk)
    hit = memo.get(key)
    if hit is None or hit[0] is not step:
        dst_mesh = step.dst_mesh if step.kind == "send_recv" else step.mesh
        hit = memo[key] = (step, _attr(step.mesh, step.src, ndim, chunk), _attr(dst_mesh, step.dst, ndim, chunk))
    return hit[1], hit[2]


def _emit(edits: OpSplicer, rs: Operation, step: ReshardStep, cur: Value, memo: dict) -> Value:
    """The op(s) of one plan step, placed before the reshard op ``rs``; returns the value
    they define. ``memo``: :func:`_step_attrs`'s answers in this pass."""
    chunk, shape = rs.chunk_id, cur.shape
    a_src, a_dst = _step_attrs(step, len(shape), chunk, memo)
    attrs = {"nbytes": step.nbytes, "placements": repr(list(step.dst))}
    common = {"role": rs.role, "struct_name": rs.struct_name, "chunk_id": chunk}
    if step.kind == "send_recv":
        assert step.dst_mesh is not None
        pairs = [list(p) for p in step.groups]
        send = Operation("dist_op.send", [cur], [], {**attrs, "pairs": pairs}, **common,
                         dist_attr=OperatorDistAttr(step.mesh, (a_src,), (), chunk))
        out = Value(cur.type, dist_attr=a_dst, stop_gradient=cur.stop_gradient)
        recv = Operation("dist_op.recv", [], [out],
                         {**attrs, "pairs": pairs, "shape": list(shape), "dtype": cur.dtype}, **common,
                         dist_attr=OperatorDistAttr(step.dst_mesh, (), (a_dst,), chunk))
        edits.insert_before(rs, send)
        edits.insert_before(rs, recv)
        return out
    attrs.update(mesh_dim=step.mesh_dim, groups=[list(g) for g in step.groups])
    for key in ("reduce_type", "src_dim", "dst_dim"):
        if getattr(step, key) is not None:
            attrs[key] = getattr(step, key)
    if step.kind == "scale":
        attrs["factor"] = step.factor
    out = Value(cur.type, dist_attr=a_dst, stop_gradient=cur.stop_gradient)
    op = Operation(f"dist_op.{STEP_OPS[step.kind]}", [cur], [out], attrs, **common,
                   dist_attr=OperatorDistAttr(step.mesh, (a_src,), (a_dst,), chunk))
    edits.insert_before(rs, op)
    return out


# --- per-rank view ------------------------------------------------------------------------

def value_layout(v: Value) -> Layout | None:
    """The layout of ``v``: its dist attr, else the ``placements`` attr of the reshard-pass
    op that defined it (nested sharding); None when the value has no layout."""
    if v.dist_attr is not None:
        return Layout.of(v.dist_attr)
    op = v.op
    if op is not None and op.dist_attr is not None and op.attrs.get("placements"):
        return Layout(op.dist_attr.process_mesh, parse_placements(op.attrs["placements"]))
    return None


@dataclass(frozen=True)
class RankOp:
    """One op as rank ``rank`` runs it: local operand / result shapes (None for a null
    value) and, for collectives, the rank's own group (send/recv: its peer pair)."""

    op: Operation
    rank: int
    operand_shapes: tuple[tuple[int, ...] | None, ...]
    result_shapes: tuple[tuple[int, ...] | None, ...]
    group: tuple[int, ...] | None = None


def _local(v: Value | None, rank: int) -> tuple[int, ...] | None:
    if v is None:
        return None
    lay = value_layout(v)
    if lay is None or rank not in lay.mesh.process_ids or len(v.shape) == 0:
        return tuple(v.shape)
    return lay.local_shape(v.shape, rank)


def _group(op: Operation, rank: int) -> tuple[int, ...] | None:
    if op.dialect != "dist_op":
        return None
    if op.type == "send":  # this rank, then every rank it sends to
        return (rank, *(b for a, b in op.attrs["pairs"] if a == rank))
    if op.type == "recv":  # the rank it receives from, then this rank
        return next(((a, b) for a, b in op.attrs["pairs"] if b == rank), None)
    return next((tuple(g) for g in op.attrs.get("groups", ()) if rank in g), None)


def rank_program(program: Program, rank: int) -> list[RankOp]:
    """The ops rank ``rank`` executes, in program order, with local shapes.

    Ops whose op_dist_attr mesh does not hold ``rank`` are skipped (a send runs on the
    source mesh, its recv on the destination mesh); ops without a dist attr run
    everywhere with global shapes. A send (recv) is kept only on ranks that send (receive)."""
    out: list[RankOp] = []
    for op in program.ops:
        if op.dist_attr is not None and rank not in op.dist_attr.process_mesh.process_ids:
            continue
        group = _group(op, rank)
        if getattr(get_opdef(op.type), "family", None) == "p2p":  # send / recv
            pos = 0 if op.type == "send" else 1
            if not any(p[pos] == rank for p in op.attrs["pairs"]):
                continue
        ins = tuple(_local(v, rank) for v in op.operands)
        res = tuple(_local(v, rank) for v in op.results)
        out.append(RankOp(op, rank, ins, res, group))
    return out

"""The partition pass: insert ``dist_op.reshard`` ops where layouts disagree.

Behaviour follows Paddle's PIR ``apply_partition_pass`` (the pull request "[pir+auto
parallel] add reshard op for input when needed", whose program dumps are the golden test):
for each operand whose value's dist attr differs from the layout the op requires
(``op.dist_attr.operands[i]``), a ``reshard`` op is inserted right before the first op that
needs that layout and the operand is rewired to its result. Layouts are compared by mesh,
dims_mapping and partial status (chunk_id alone needs no data movement). One reshard
serves every later op that needs the same layout of the same value.

When the two meshes differ (a pipeline stage boundary) a pair is inserted: the first on
the source mesh (source layout -> an intermediate layout on the destination mesh: the
layout in which the cheapest plan crosses, see ``completion.reshard.planner``), the
second on the destination mesh (intermediate -> required layout), so each stage keeps
the half it runs. The reshard op takes the role and chunk of its consumer.

Two more places where the data's layout and the layout a value is said to have differ
(the pass never relabels; it moves data):

- a result: an op whose result attr (``op.dist_attr.results[j]``, what its kernel
  produces) differs from its result value's attr (an annotation the op cannot produce
  directly, e.g. a matmul result annotated Shard where the contraction gives a Partial):
  the op now defines a fresh value in the produced layout and a reshard right after it
  defines the original value in its annotated layout (taking the producer's role and
  chunk), so every user reads the annotated layout and its data is right;
- a ``reshard`` op's operand: a reshard op's source and target are fixed; when its
  operand value is laid out otherwise than the op's source, a reshard to that source is
  inserted before it (the op itself is never rewritten).
"""

from __future__ import annotations

from completion.dist_attr import OperatorDistAttr, Replicate, TensorDistAttr
from completion.errors import DistAttrError
from completion.gc_pause import gc_paused
from completion.ir import Operation, Program, Value
from completion.passes.splice import OpSplicer
from completion.reshard import plan_reshard


def layout_key(attr: TensorDistAttr) -> tuple:
    """What decides the data a rank holds: mesh, dims_mapping, partial (not chunk_id)."""
    return (attr.process_mesh, attr.dims_mapping, attr.partial)


def same_layout(a: TensorDistAttr, b: TensorDistAttr) -> bool:
    """``layout_key(a) == layout_key(b)`` without building the keys (the pass compares
    every operand and result of the program; completion shares attr objects between
    identical layers, so identity answers many of them; ``==`` on meshes would call the
    dataclass ``__eq__`` even for the same mesh object, hence the identity test first)."""
    if a is b:
        return True
    ma, mb = a.process_mesh, b.process_mesh
    return a.dims_mapping == b.dims_mapping and a.partial == b.partial and (ma is mb or ma == mb)


@gc_paused()  # builds a graph of cyclic Values/Operations (completion.gc_pause)
def apply_partition_pass(program: Program) -> Program:
    """Insert reshard ops into ``program`` in place (and return it, renumbered): before
    each operand whose value's layout differs from the one its op requires, and after
    each result whose value's layout differs from the one its op produces (module
    docstring). Idempotent: a partitioned program has nothing left to insert.

    Raises ReshardError (a ValueError) naming the value and both attrs when a required
    layout cannot be reached (e.g. it does not fit the value's shape)."""
    program.renumber()  # error messages name values by id
    cache: dict[tuple[int, tuple], Value] = {}
    edits = OpSplicer(program)
    for op in list(program.ops):
        da = op.dist_attr
        if da is None:
            continue
        produced, required = da.results, da.operands
        for j, r in enumerate(op.results):  # (indexing: a zip per op costs more than it saves)
            if r is None or j >= len(produced):
                continue
            have, a = produced[j], r.dist_attr
            if have is not None and a is not None and have is not a and not same_layout(have, a):
                _reshard_result(edits, op, j, have)
        for i, v in enumerate(op.operands):
            if v is None or i >= len(required):
                continue
            want, a = required[i], v.dist_attr
            if want is None or a is None or want is a or same_layout(a, want):
                continue
            key = (id(v), layout_key(want))
            if key not in cache:
                cache[key] = _insert_reshard(edits, op, v, want)
            program.set_operand(op, i, cache[key])
    edits.commit()
    program.renumber()
    return program


def _insert_reshard(edits: OpSplicer, consumer: Operation, v: Value, want: TensorDistAttr) -> Value:
    src = v.dist_attr
    assert src is not None
    if src.process_mesh is want.process_mesh or src.process_mesh == want.process_mesh:
        op, out = _reshard_op(consumer, v, src, want, want.process_mesh)
        edits.insert_before(consumer, op)
        return out
    mid = crossing_attr(src, want, v)
    op1, first = _reshard_op(consumer, v, src, mid, src.process_mesh)
    edits.insert_before(consumer, op1)
    op2, out = _reshard_op(consumer, first, mid, want, want.process_mesh)
    edits.insert_before(consumer, op2)
    return out


def _reshard_result(edits: OpSplicer, op: Operation, j: int, have: TensorDistAttr) -> None:
    """``op`` produces result ``j`` in ``have`` but its value is laid out otherwise: the op
    defines a fresh value in ``have`` and reshard op(s) right after it define the value."""
    r = op.results[j]
    assert r is not None and r.dist_attr is not None
    want = r.dist_attr
    tmp = Value(r.type, dist_attr=have, stop_gradient=r.stop_gradient)
    tmp.op, tmp.index = op, j
    op.results[j] = tmp
    if have.process_mesh == want.process_mesh:
        edits.insert_after(op, [_reshard_op(op, tmp, have, want, want.process_mesh, out=r)[0]])
        return
    mid = crossing_attr(have, want, r)
    op1, first = _reshard_op(op, tmp, have, mid, have.process_mesh)
    op2, _ = _reshard_op(op, first, mid, want, want.process_mesh, out=r)
    edits.insert_after(op, [op1, op2])


def crossing_attr(src: TensorDistAttr, dst: TensorDistAttr, v: Value) -> TensorDistAttr:
    """The layout on ``dst``'s mesh in which the cheapest plan from ``src`` crosses meshes
    (falls back to replicated when that layout nests two mesh dims on one tensor dim)."""
    plan = plan_reshard(src, dst, v.shape, v.dtype, value=v.label())
    cross = next(s for s in plan.steps if s.kind == "send_recv")
    try:
        return TensorDistAttr.from_placements(dst.process_mesh, cross.dst, v.ndim, dst.chunk_id)
    except DistAttrError:
        pl = [Replicate()] * dst.process_mesh.ndim
        return TensorDistAttr.from_placements(dst.process_mesh, pl, v.ndim, dst.chunk_id)


def _reshard_op(consumer: Operation, v: Value, src: TensorDistAttr, dst: TensorDistAttr, mesh,
                out: Value | None = None) -> tuple[Operation, Value]:
    """A reshard op of ``v`` from ``src`` to ``dst`` on ``mesh`` taking ``consumer``'s role
    and chunk, and its result (``out``, or a new value); the caller places it."""
    plan_reshard(src, dst, v.shape, v.dtype, value=v.label())  # validate: clear error now
    if out is None:
        out = Value(v.type, dist_attr=dst, stop_gradient=v.stop_gradient)
    op = Operation(
        "dist_op.reshard", [v], [out], {},
        role=consumer.role, struct_name=consumer.struct_name, chunk_id=consumer.chunk_id,
        dist_attr=OperatorDistAttr(mesh, (src,), (dst,), consumer.chunk_id),
    )  # fmt: skip
    return op, out

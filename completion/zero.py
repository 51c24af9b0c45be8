"""ZeRO stages in optimizer completion (Rajbhandari et al. 2020, "ZeRO", sec. 5).

After sharding propagation, each optimizer op (``sgd_``, ``adam_``, ``adamw_``) is laid out
like its parameter. With a ZeRO stage the data-parallel mesh dim also splits, along one
parameter dim that the parameter's layout leaves replicated (the first such dim whose size
the dp degree divides, else the first with size >= the degree):

- stage 1: the optimizer states (``moment1``, ``moment2``; operands, results and the state
  values themselves) are sharded over dp;
- stage 2: the gradient operand too (its Partial(sum) over dp becomes a reduce_scatter
  instead of an all_reduce);
- stage 3: the parameter too (operand, ``param_out``, the parameter value and the master
  weight); its forward and backward users still need it whole, so the partition pass
  inserts an all_gather before each use.

Parameters already sharded over the dp mesh dim are left as they are.
"""

from __future__ import annotations

from completion.dist_attr import OperatorDistAttr, TensorDistAttr
from completion.errors import CompletionError
from completion.ir import Operation, Value
from completion.mesh import ProcessMesh
from completion.ops.declare import base_name
from completion.ops.registry import get_opdef

STAGE_OPERANDS = {
    1: ("moment1", "moment2"),
    2: ("moment1", "moment2", "grad"),
    3: ("moment1", "moment2", "grad", "param", "master_param"),
}
DP_NAMES = ("dp", "data", "data_parallel", "dp_degree")


def dp_mesh_dim(mesh: ProcessMesh, grads: list[TensorDistAttr | None], explicit: int | str | None) -> int:
    """The data-parallel mesh dim: ``explicit`` (index or name); else a dim named ``dp`` /
    ``data``; else the first mesh dim over which a gradient is Partial(sum); else 0."""
    if explicit is not None:
        return mesh.dim_index(explicit)
    for i, nm in enumerate(mesh.dim_names):
        if nm.lower() in DP_NAMES:
            return i
    for g in grads:
        if g is not None and g.partial:
            return g.partial[0][0]
    return 0


def _pick_dim(shape: tuple[int, ...], dims: tuple[int, ...], n: int) -> int | None:
    free = [d for d, m in enumerate(dims) if m < 0]
    for d in free:
        if shape[d] % n == 0 and shape[d] >= n:
            return d
    return next((d for d in free if shape[d] >= n), None)


def _shard(a: TensorDistAttr | None, d: int, dp: int) -> TensorDistAttr | None:
    if a is None:
        return None
    dims = list(a.dims_mapping)
    dims[d] = dp
    return TensorDistAttr(a.process_mesh, dims, {m: t for m, t in a.partial if m != dp}, a.chunk_id)


def apply_zero(ops: list[Operation], stage: int, dp_dim: int | str | None, fixed: set[int]) -> None:
    """Re-lay the optimizer ops ``ops`` (already completed) for ZeRO ``stage`` (0-3).

    ``fixed``: ids of annotated values, never changed. Raises CompletionError for a stage
    outside 0..3."""
    if stage not in (0, 1, 2, 3):
        raise CompletionError(f"zero_stage must be 0, 1, 2 or 3, got {stage!r}")
    if stage == 0:
        return
    for op in ops:
        _zero_op(op, stage, dp_dim, fixed)


def _zero_op(op: Operation, stage: int, dp_dim: int | str | None, fixed: set[int]) -> None:
    od, da = get_opdef(op.type), op.dist_attr
    if od is None or da is None or not da.operands or da.operands[0] is None:
        return
    names = [base_name(n) for n in od.operands]
    mesh = da.process_mesh
    gi = names.index("grad") if "grad" in names else None
    grad = op.operands[gi] if gi is not None and gi < len(op.operands) else None
    dp = dp_mesh_dim(mesh, [grad.dist_attr if grad is not None else None], dp_dim)
    pa, p = da.operands[0], op.operands[0]
    if p is None or dp in pa.dims_mapping or mesh.shape[dp] == 1:
        return
    d = _pick_dim(p.type.shape, pa.dims_mapping, mesh.shape[dp])
    if d is None:
        return
    which = STAGE_OPERANDS[stage]
    operands = list(da.operands)
    results = list(da.results)
    rnames = [r.removesuffix("_out") for r in od.results]
    for i, nm in enumerate(names[: len(operands)]):
        if nm not in which:
            continue
        operands[i] = _shard(operands[i], d, dp)
        v = op.operands[i] if i < len(op.operands) else None
        if nm != "grad" and v is not None:
            _shard_source(v, d, dp, fixed)
        if nm in rnames and rnames.index(nm) < len(results):
            j = rnames.index(nm)
            results[j] = _shard(results[j], d, dp)
            r = op.results[j] if j < len(op.results) else None
            if r is not None and id(r) not in fixed and results[j] is not None:
                r.dist_attr = results[j]
    op.dist_attr = OperatorDistAttr(mesh, tuple(operands), tuple(results), da.chunk_id)


def _shard_source(v: Value, d: int, dp: int, fixed: set[int]) -> None:
    """Shard a state / parameter value at its source op (data or parameter)."""
    src = v.op
    if id(v) in fixed or src is None or src.operands or v.dist_attr is None:
        return
    if dp in v.dist_attr.dims_mapping:
        return
    new = _shard(v.dist_attr, d, dp)
    v.dist_attr = new
    if src.dist_attr is not None:
        res = tuple(new if r is v else a for r, a in zip(src.results, src.dist_attr.results, strict=False))
        src.dist_attr = OperatorDistAttr(src.dist_attr.process_mesh, src.dist_attr.operands, res,
                                         src.dist_attr.chunk_id)

"""Write in-place optimizer results back into the persistent values they alias.

``sgd_`` / ``adam_`` / ``adamw_`` update their parameter and state operands in place. When
the partition pass gave an update op an operand through reshard ops (e.g. the op is laid
out Shard(0) while the parameter is replicated, so the op reads a ``local_slice`` of it),
the kernel updates that derived copy; the update is carried back here: the result is
resharded at run time from the op's layout to the persistent value's layout
(``completion.plan_reshard``, executed with :mod:`executor.collectives` and the local
reshard kernels) and copied into the rank's state. Every rank of the op's mesh does this
in program order, so the collectives match.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from completion.ir import Value
from completion.ops.registry import TensorType
from completion.passes.reshard import STEP_OPS, value_layout
from completion.reshard import Layout, plan_reshard
from executor.collectives import Groups, run_collective
from executor.errors import ExecutorError
from executor.kernels import KernelContext, get_kernel

# optimizer op type -> (operand index, result index) pairs that alias
ALIASES = {
    "sgd_": ((0, 0), (3, 1)),
    "adam_": ((0, 0), (3, 1), (4, 2), (5, 3), (6, 4), (7, 5)),
    "adamw_": ((0, 0), (3, 1), (4, 2), (5, 3), (6, 4), (7, 5)),
}
_PASS_THROUGH = set(STEP_OPS.values())


class WriteBackError(ExecutorError, RuntimeError):
    """An in-place result cannot be carried back to the value it aliases."""


def root_value(v: Value) -> Value:
    """Follow reshard-pass ops (local_slice, all_gather, ...) back to their source value."""
    while v.op is not None and v.op.type in _PASS_THROUGH and v.op.operands:
        src = v.op.operands[0]
        if src is None:
            break
        v = src
    return v


def runtime_reshard(t: torch.Tensor, src: Layout, dst: Layout, shape: Sequence[int], dtype: str,
                    rank: int, groups: Groups) -> torch.Tensor:
    """``t`` (this rank's block under ``src``) as its block under ``dst`` (same mesh)."""
    if src.mesh != dst.mesh:
        raise WriteBackError(f"write-back across meshes ({src} -> {dst}) is not supported")
    shape = tuple(int(s) for s in shape)
    for step in plan_reshard(src, dst, shape, dtype).steps:
        lay = Layout(step.mesh, step.dst)
        out_shape = lay.local_shape(shape, rank)
        group = next(tuple(g) for g in step.groups if rank in g)
        kind = STEP_OPS.get(step.kind)
        attrs = {"reduce_type": step.reduce_type, "src_dim": step.src_dim, "dst_dim": step.dst_dim,
                 "factor": step.factor}
        if step.kind in ("slice", "zero_fill", "scale"):
            ctx = KernelContext(out_types=(TensorType(out_shape, dtype),), group=group, rank=rank)
            t = get_kernel(kind)([t], attrs, ctx)[0]
        else:
            t = run_collective(kind, t, attrs, rank, group, groups, out_shape)
    return t


def write_back(op, operands: list, results: list, state: dict, rank: int, groups: Groups) -> None:
    """Carry the in-place results of optimizer op ``op`` into ``state`` (module doc).

    ``operands`` / ``results``: the op's values' tensors on this rank (None where null)."""
    for oi, ri in ALIASES.get(op.type, ()):
        if oi >= len(op.operands) or ri >= len(op.results):
            continue
        v, r = op.operands[oi], op.results[ri]
        if v is None or r is None or id(v) in state:
            continue  # updated in place on the persistent tensor itself
        root = root_value(v)
        if id(root) not in state:
            continue
        src, dst = value_layout(r), value_layout(root)
        new = results[ri]
        if src is not None and dst is not None and src != dst:
            new = runtime_reshard(new, src, dst, root.shape, root.dtype, rank, groups)
        state[id(root)].copy_(new.reshape(state[id(root)].shape))

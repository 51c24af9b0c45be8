"""Run a program numerically: once on global numpy arrays (the single-process reference)
and once per rank on a numpy virtual mesh after partition + reshard pass.

``run_global(program, inputs)`` evaluates every op on whole arrays. ``run_mesh(program,
inputs)`` evaluates a program whose reshards are resolved into collectives
(``apply_reshard_pass``): inputs (``data`` ops) are distributed in their annotated layout
(:meth:`completion.testing.VirtualMesh.from_global`; a Partial input gets random parts
that reduce to it), each compute op runs on each rank of its mesh with numpy on the local
blocks (local result shapes from :func:`completion.rank_program`), and each collective /
local reshard step runs with the kernels of :mod:`completion.testing` on the local arrays
of its groups. :func:`check_every_value` then reassembles *every* value of the
partitioned program from its per-rank arrays under the layout the value claims
(reducing Partial mesh dims, checking replicas agree and local shapes are right) and
compares it with the reference: a value whose claimed layout is not the layout of its
data (a relabel) fails.

Ops: data, full, matmul (transpose flags), add, subtract, multiply, relu, exp, scale,
cast, reshape, transpose, sum, shadow_output, and the reshard-pass ops.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np

from completion import rank_program
from completion.ir import Program
from completion.passes.reshard import STEP_OPS, value_layout
from completion.testing import KERNELS, VirtualMesh

STEP_KIND = {op: kind for kind, op in STEP_OPS.items()}


def _axes(attrs: dict[str, Any], ndim: int) -> tuple[int, ...]:
    ax = attrs.get("axis")
    if ax is None or ax == []:
        return tuple(range(ndim))
    ax = [ax] if isinstance(ax, int) else list(ax)
    return tuple(sorted({int(a) % ndim for a in ax})) if ndim else ()


def _matmul(x: np.ndarray, y: np.ndarray, attrs: dict[str, Any]) -> np.ndarray:
    if attrs.get("transpose_x") and x.ndim > 1:
        x = np.swapaxes(x, -1, -2)
    if attrs.get("transpose_y") and y.ndim > 1:
        y = np.swapaxes(y, -1, -2)
    return np.matmul(x, y)


def compute(op_type: str, ins: list[np.ndarray | None], attrs: dict[str, Any],
            out_shapes: list[tuple[int, ...] | None]) -> list[np.ndarray]:
    """One op on arrays (global or one rank's local blocks); ``out_shapes`` are the result
    shapes in the same frame (a reshape's local target)."""
    x = ins[0] if ins else None
    if op_type == "matmul":
        return [_matmul(ins[0], ins[1], attrs)]
    if op_type in ("add", "subtract", "multiply"):
        fn = {"add": np.add, "subtract": np.subtract, "multiply": np.multiply}[op_type]
        return [fn(ins[0], ins[1])]
    if op_type == "relu":
        return [np.maximum(x, 0)]
    if op_type == "exp":
        return [np.exp(x)]
    if op_type == "scale":
        s, b = float(attrs.get("scale", 1.0)), float(attrs.get("bias", 0.0))
        return [x * s + b if attrs.get("bias_after_scale", True) else (x + b) * s]
    if op_type in ("cast", "reshard"):
        return [x.copy()]
    if op_type == "reshape":
        return [x.reshape(out_shapes[0])]
    if op_type == "transpose":
        return [np.transpose(x, [int(p) for p in attrs["perm"]])]
    if op_type == "sum":
        axes = _axes(attrs, x.ndim)
        return [np.sum(x, axis=axes, keepdims=bool(attrs.get("keepdim")))]
    if op_type == "full":
        return [np.full(out_shapes[0], float(attrs.get("value", 0.0)))]
    if op_type == "shadow_output":
        return []
    raise NotImplementedError(f"numpy mesh: no kernel for {op_type}")


def random_inputs(program: Program, seed: int = 0) -> dict[int, np.ndarray]:
    """Integer-valued float64 arrays (in [-3, 3]) for every ``data`` op, by id(value)
    (integer data keeps every check exact)."""
    rng = np.random.default_rng(seed)
    out = {}
    for op in program.ops:
        if op.type == "data" and op.results and op.results[0] is not None:
            v = op.results[0]
            out[id(v)] = rng.integers(-3, 4, size=v.shape).astype(np.float64)
    return out


def run_global(program: Program, inputs: dict[int, np.ndarray]) -> dict[int, np.ndarray]:
    """id(value) -> global array of every value. Reshards and the reshard pass's ops are
    identities on global values (they move data, never change it), so this is the
    single-process result of the program before or after partitioning."""
    env: dict[int, np.ndarray] = {}
    for i, op in enumerate(program.ops):
        if op.type == "data":
            env[id(op.results[0])] = inputs[id(op.results[0])]
            continue
        if op.type == "send":
            continue
        if op.type == "recv":
            env[id(op.results[0])] = env[id(program.ops[i - 1].operands[0])]
            continue
        ins = [None if v is None else env[id(v)] for v in op.operands]
        if op.dialect == "dist_op":
            outs = [ins[0]]
        else:
            outs = compute(op.type, ins, op.attrs, [None if r is None else r.shape for r in op.results])
        for r, a in zip(op.results, outs, strict=False):
            if r is not None:
                env[id(r)] = a
    return env


def distribute_inputs(program: Program, inputs: dict[int, np.ndarray], seed: int = 1
                      ) -> dict[int, dict[int, np.ndarray]]:
    """id(data value) -> {rank: local block}: each ``data`` op's global input laid out in
    its layout (:meth:`VirtualMesh.from_global`, Partial mesh dims as random splits from
    ``seed``), in program order, so every backend starts from the same blocks."""
    rng = np.random.default_rng(seed)
    return {id(op.results[0]): VirtualMesh.from_global(inputs[id(op.results[0])],
                                                       value_layout(op.results[0]), rng).arrays
            for op in program.ops if op.type == "data"}


def run_mesh(program: Program, inputs: dict[int, np.ndarray], seed: int = 1
             ) -> dict[int, dict[int, np.ndarray]]:
    """id(value) -> {rank: local array} after the reshard pass (module docstring)."""
    blocks = distribute_inputs(program, inputs, seed)
    ranks = sorted({r for op in program.ops if op.dist_attr is not None
                    for r in op.dist_attr.process_mesh.process_ids})
    local = {r: {id(ro.op): ro for ro in rank_program(program, r)} for r in ranks}
    env: dict[int, dict[int, np.ndarray]] = {}
    sent: dict[int, dict[int, np.ndarray]] = {}
    for i, op in enumerate(program.ops):
        if op.type == "data":
            env[id(op.results[0])] = blocks[id(op.results[0])]
            continue
        if op.type == "reshard":
            raise ValueError(f"run_mesh needs a program after the reshard pass, got {op.label()}")
        if op.type == "send":
            sent[i] = env[id(op.operands[0])]
            continue
        if op.type == "recv":
            src = sent[i - 1]
            env[id(op.results[0])] = {b: src[a].copy() for a, b in op.attrs["pairs"]}
            continue
        if op.type in STEP_KIND:
            x = op.operands[0]
            step = SimpleNamespace(groups=[tuple(g) for g in op.attrs["groups"]],
                                   reduce_type=op.attrs.get("reduce_type"),
                                   src_dim=op.attrs.get("src_dim"), dst_dim=op.attrs.get("dst_dim"),
                                   factor=op.attrs.get("factor", 1.0))
            vm = VirtualMesh(value_layout(x), x.shape, env[id(x)])
            env[id(op.results[0])] = KERNELS[STEP_KIND[op.type]](vm, step)
            continue
        outs: dict[int, list[np.ndarray]] = {}
        for r in op.dist_attr.process_mesh.process_ids:
            ro = local[r][id(op)]
            ins = [None if v is None else env[id(v)][r] for v in op.operands]
            outs[r] = compute(op.type, ins, op.attrs, list(ro.result_shapes))
        for j, res in enumerate(op.results):
            if res is not None:
                env[id(res)] = {r: outs[r][j] for r in outs}
    return env


def check_every_value(program: Program, glob: dict[int, np.ndarray],
                      dist: dict[int, dict[int, np.ndarray]], rtol: float = 1e-5,
                      atol: float = 1e-5) -> int:
    """Reassemble every value of the partitioned ``program`` from its per-rank arrays
    ``dist`` under the layout the value claims and compare it with the reference ``glob``
    (:func:`run_global` of the same program). Returns the number of values checked;
    raises AssertionError naming the first wrong value (a local block of the wrong
    shape, replicas that disagree, or values that differ)."""
    n = 0
    for op in program.ops:
        for v in op.results:
            if v is None or id(v) not in dist:
                continue
            lay = value_layout(v)
            got = VirtualMesh(lay, v.shape, dist[id(v)]).to_global()
            np.testing.assert_allclose(got, glob[id(v)], rtol=rtol, atol=atol,
                                       err_msg=f"{v.label()} defined by {op.label()} in {lay}")
            n += 1
    return n


def partition_and_check(program: Program, seed: int = 0) -> tuple[Program, int]:
    """Single-process reference of the completed ``program``, then partition pass +
    reshard pass (in place) and the virtual-mesh run; asserts every value of the
    partitioned program is right and every value of the original program keeps its
    single-process value. Returns (program, number of values checked)."""
    from completion import apply_partition_pass, apply_reshard_pass

    inputs = random_inputs(program, seed)
    before = run_global(program, inputs)
    apply_partition_pass(program)
    apply_reshard_pass(program)
    after = run_global(program, inputs)
    for k, a in before.items():
        if k in after:
            np.testing.assert_array_equal(after[k], a)
    dist = run_mesh(program, inputs, seed + 1)
    return program, check_every_value(program, after, dist)

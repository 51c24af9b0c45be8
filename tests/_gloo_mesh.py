"""Run partitioned programs on real torch.distributed gloo ranks, with the executor's code.

The gloo counterpart of :func:`tests._numpy_mesh.run_mesh`: a program after the partition
and reshard passes runs SPMD, one process per rank (:func:`executor.launch.launch`). Each
rank walks the program in order and runs the ops of its mesh (:func:`completion.rank_program`
gives its local shapes and groups):

- ``data``: the rank's block of the input as :func:`tests._numpy_mesh.distribute_inputs`
  laid it out (the same blocks and Partial splits the numpy mesh starts from);
- the reshard pass's collectives (``all_reduce``, ``reduce_scatter``, ``all_gather``,
  ``all_to_all``): :func:`executor.collectives.run_collective` on the process groups of
  :class:`executor.collectives.Groups`, as :class:`executor.rank_exec.RankExecutor` runs
  them for plans;
- every other op (compute ops and the local steps ``local_slice``, ``zero_fill``,
  ``local_scale``): its torch kernel from :mod:`executor.kernels` on the local blocks, with
  the :class:`~executor.kernels.KernelContext` the executor gives it (local result types,
  the rank's group).

Results come back keyed by (op index, result index); :func:`run_gloo` maps them to
``id(value) -> {rank: array}``, the frame :func:`tests._numpy_mesh.check_every_value`
reassembles. Cross-mesh ``send`` / ``recv`` are refused (the programs here live on one mesh).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from completion import rank_program
from completion.ir import Program

Key = tuple[int, int]  # (op index, result index)


def _run_program(program: Program, rank: int, inputs: dict[int, np.ndarray], groups
                 ) -> dict[Key, np.ndarray]:
    """One rank's run of one partitioned program (module docstring); ``inputs``: op index
    of each ``data`` op -> this rank's block."""
    import torch

    from completion.ops.registry import TensorType
    from executor.collectives import COLLECTIVES, run_collective
    from executor.kernels import KernelContext, get_kernel

    index = {id(op): i for i, op in enumerate(program.ops)}
    env: dict[int, torch.Tensor] = {}
    out: dict[Key, np.ndarray] = {}
    for ro in rank_program(program, rank):
        op, i = ro.op, index[id(ro.op)]
        if op.type in ("send", "recv", "reshard"):
            raise ValueError(f"gloo mesh: {op.label()} is not supported here (one mesh, after "
                             f"the reshard pass)")
        ins = [None if v is None else env[id(v)] for v in op.operands]
        if op.type == "data":
            outs = [torch.from_numpy(np.array(inputs[i]))]  # a copy; 0-d inputs too
        elif op.type in COLLECTIVES:
            outs = [run_collective(op.type, ins[0], op.attrs, rank, ro.group or (rank,), groups,
                                   ro.result_shapes[0] or ())]
        else:
            types = tuple(None if v is None or s is None else TensorType(s, v.dtype)
                          for v, s in zip(op.results, ro.result_shapes, strict=False))
            ctx = KernelContext(out_types=types, group=ro.group, rank=rank,
                                in_global=tuple(None if v is None else tuple(v.shape)
                                                for v in op.operands))
            outs = get_kernel(op.type)(ins, op.attrs, ctx)
        for j, v in enumerate(op.results):
            if v is None:
                continue
            env[id(v)] = outs[j]
            out[(i, j)] = outs[j].detach().cpu().numpy().copy()
    return out


def _collective_groups(programs: Sequence[Program]) -> list[tuple[int, ...]]:
    from executor.collectives import COLLECTIVES

    return [tuple(g) for p in programs for op in p.ops
            if op.dialect == "dist_op" and op.type in COLLECTIVES for g in op.attrs["groups"]]


def _rank_main(rank: int, nproc: int, programs: list[Program],
               inputs: list[dict[int, dict[int, np.ndarray]]], timeout: float
               ) -> list[dict[Key, np.ndarray]]:
    """Launched on every rank: create every process group once, run each program."""
    from executor.collectives import Groups

    groups = Groups(_collective_groups(programs), timeout=timeout)
    return [_run_program(p, rank, {i: blocks[rank] for i, blocks in ins.items() if rank in blocks},
                         groups)
            for p, ins in zip(programs, inputs, strict=True)]


def run_gloo(programs: Sequence[Program], inputs: Sequence[dict[int, dict[int, np.ndarray]]],
             nproc: int, timeout: float = 120.0, collective_timeout: float = 60.0
             ) -> list[dict[int, dict[int, np.ndarray]]]:
    """Run every partitioned program of ``programs`` on ``nproc`` gloo ranks in one launch.

    Args:
        programs: programs after ``apply_partition_pass`` + ``apply_reshard_pass``, each on
            a mesh of ranks below ``nproc`` (ranks outside a program's mesh skip it).
        inputs: per program, ``id(data value) -> {rank: local block}``
            (:func:`tests._numpy_mesh.distribute_inputs`).
        timeout: seconds for the whole launch (LaunchTimeout after it; no hang);
        collective_timeout: seconds one collective may wait for a peer.
    Returns per program ``id(value) -> {rank: local array}`` for every value a rank holds.
    Raises executor.launch.RankFailure naming the rank when a rank raises."""
    from executor.launch import launch

    by_index = []
    for p, ins in zip(programs, inputs, strict=True):
        by_index.append({i: ins[id(op.results[0])] for i, op in enumerate(p.ops)
                         if op.type == "data"})
    per_rank = launch(_rank_main, nproc, args=(list(programs), by_index, collective_timeout),
                      timeout=timeout, collective_timeout=collective_timeout)
    out = []
    for pi, p in enumerate(programs):
        dist: dict[int, dict[int, np.ndarray]] = {}
        for i, op in enumerate(p.ops):
            for j, v in enumerate(op.results):
                blocks = {r: per_rank[r][pi][(i, j)] for r in range(nproc)
                          if (i, j) in per_rank[r][pi]}
                if v is not None and blocks:
                    dist[id(v)] = blocks
        out.append(dist)
    return out

"""Per-block costs of a completed, partitioned program: what one layer (and the blocks
before and after the layers) costs per micro-batch on one rank, split into F, B and W, with
the in-stage collectives of its reshard ops on their real rank groups.

Blocks: ``"pre"`` (ops before the first layer: embeddings), an int per decoder layer
(struct names ``...layers.<i>...``), ``"post"`` (final norm, head, loss). A backward op
belongs to the block of the forward op with the same struct name.

Collectives come from the reshard ops the partition pass inserted: each is planned with
``completion.reshard.plan_reshard`` (the same planner the reshard pass uses) and timed with
``Cluster.collective_time`` on the group that holds the rank. A collective whose input is
a weight gradient is the per-step gradient synchronisation (DP, or the TP all_reduce of
sequence-parallel norm weights) and is kept apart in ``grad_sync`` rather than charged per
micro-batch. ``overlap`` (default 0) is the fraction of in-stage collective time hidden
behind compute: T = compute + (1 - overlap) * comm.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from completion.dtypes import DTYPE_BYTES
from completion.ir import Operation, OpRole, Program
from completion.ops.registry import op_traits
from completion.reshard import plan_reshard
from simulator.blocks import assign_blocks
from simulator.memory import is_attention_core, is_regather
from simulator.op_cost import op_cost
from simulator.op_signature import OpSig, is_weight_grad, local_tensor, op_signature, param_root
from simulator.roofline import Roofline
from simulator.types import BlockKey, Phase

#: the phases a block's costs are split into (the optimizer's "O" is costed apart)
PHASES: tuple[Phase, ...] = ("F", "B", "W")

#: one collective a kernel issues: (phase, collective kind, bytes, group)
KernelCollective = tuple[Phase, str, int, tuple[int, ...]]
# op type -> fn(op, rank) -> [KernelCollective]: collectives a kernel issues itself (not
# reshard ops), e.g. vocab-parallel cross entropy (a registry of functions, like COST_RULES)
KERNEL_COLLECTIVES: dict[str, Callable[[Operation, int], list[KernelCollective]]] = {}


def _sharded_axis_groups(v: Any, axis: int, rank: int) -> list[tuple[int, ...]]:
    """Groups of the mesh dims sharding ``axis`` of value ``v`` that hold ``rank``."""
    da = getattr(v, "dist_attr", None)
    if da is None or not v.shape:
        return []
    ax = axis % len(v.shape)
    m = da.dims_mapping[ax]
    dims = m if isinstance(m, (tuple, list)) else (m,)
    mesh = da.process_mesh
    if rank not in mesh.process_ids:
        return []
    return [tuple(g) for d in dims if d is not None and d >= 0
            for g in (mesh.group_of(rank, d),) if len(g) > 1]


def _vocab_parallel_ce(op: Operation, rank: int) -> list[KernelCollective]:
    """Vocab-parallel cross entropy (class axis sharded; Megatron-LM
    ``vocab_parallel_cross_entropy``, Shoeybi et al. 2019 sec. 3): the forward all_reduces
    three per-row statistics over the class shards -- the row max, the sum of exponentials
    and the target logit (soft labels: the loss) -- each ``rows`` float32 values; the grad
    of hard labels needs none. Rows = local elements / local class extent."""
    x = op.operands[0]
    if x is None or op.type != "cross_entropy_with_softmax":
        return []
    groups = _sharded_axis_groups(x, int(op.attrs.get("axis", -1)), rank)
    if not groups:
        return []
    lt = local_tensor(x, rank)
    rows = 1
    for d in lt.shape[:-1] if int(op.attrs.get("axis", -1)) in (-1, len(lt.shape) - 1) else lt.shape:
        rows *= d
    stat = 8 if lt.dtype == "float64" else 4
    return [("F", "all_reduce", rows * stat, g) for g in groups for _ in range(3)]


KERNEL_COLLECTIVES["cross_entropy_with_softmax"] = _vocab_parallel_ce


@dataclass
class BlockCost:
    """Per micro-batch costs of one block on one rank (seconds, FLOPs, bytes).

    Attributes:
        compute / comm: seconds per phase F, B, W (kernels / in-stage collectives).
        flops / exec_flops: model and executed FLOPs per phase.
        attn_core_f: seconds of the attention core's forward (selective recompute reruns it).
        grad_sync: (kind, nbytes, group) of per-step collectives on weight gradients.
        params: parameter name -> (local elements, local bytes) of the parameters the
            block's forward reads (a tied embedding appears in both "pre" and "post").
        workspace: bytes of the largest single op's working set in the block.
        comm_count: number of in-stage collective steps per phase.
    """

    compute: dict[Phase, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    comm: dict[Phase, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    flops: dict[Phase, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    exec_flops: dict[Phase, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    attn_core_f: float = 0.0
    grad_sync: list[tuple[str, int, tuple[int, ...]]] = field(default_factory=list)
    params: dict[str, tuple[int, int]] = field(default_factory=dict)
    workspace: int = 0
    comm_count: dict[Phase, int] = field(default_factory=lambda: dict.fromkeys(PHASES, 0))

    def time(self, phase: Phase, overlap: float = 0.0) -> float:
        """Seconds of ``phase``: compute + (1 - overlap) * in-stage collectives."""
        return self.compute[phase] + (1.0 - overlap) * self.comm[phase]


@lru_cache(maxsize=65536)
def _reshard_steps(src: Any, dst: Any, shape: tuple[int, ...], dtype: str) -> tuple:
    return tuple(plan_reshard(src, dst, shape, dtype).steps)


def _group_of(step: Any, rank: int) -> tuple[int, ...]:
    for g in step.groups:
        if rank in g:
            return tuple(g)
    return tuple(step.groups[0]) if step.groups else (rank,)


class StageCoster:
    """Costs blocks of one program on one cluster for a representative rank.

    Args:
        program: completed and partitioned program (forward + backward, optional optimizer).
        cluster: ``clusters.Cluster``; roofline: the device's :class:`Roofline`.
        rank: the representative rank (its local shapes; its collective groups).
        rank_offset: added to every group rank (the same layout on another pipeline
            stage, ranks shifted by stage * dp * mp).
    """

    def __init__(self, program: Program, cluster: Any, roofline: Roofline, rank: int = 0,
                 rank_offset: int = 0) -> None:
        self.program, self.cluster, self.roofline = program, cluster, roofline
        self.rank, self.offset = rank, rank_offset
        self.names = frozenset(p.name for p in program.parameters() if p.name)
        self._time_cache: dict[Any, dict[Phase, float]] = {}

    def _op_times(self, sig: OpSig) -> tuple[dict[Phase, float], tuple]:
        if sig not in self._time_cache:
            self._time_cache[sig] = self.roofline.kernels_time(op_cost(sig))
        return self._time_cache[sig], op_cost(sig)

    def _collectives(self, op: Operation, bc: BlockCost) -> None:
        x, y = op.operands[0], op.results[0]
        if x is None or y is None or x.dist_attr is None or y.dist_attr is None:
            return
        steps = _reshard_steps(x.dist_attr, y.dist_attr, tuple(x.shape), x.dtype)
        grad = op.role == OpRole.BACKWARD and is_weight_grad(x, self.names) or (
            op.role == OpRole.BACKWARD and any(u.role == OpRole.OPTIMIZE for u, _ in y.uses))
        phase: Phase = "F" if op.role in (OpRole.FORWARD, OpRole.LOSS) else "B"
        regather = is_regather(op) and any(u.role == OpRole.BACKWARD for u, _ in y.uses)
        for st in steps:
            if st.kind == "send_recv":
                continue  # stage boundaries are the pipeline's p2p, costed by the engine
            group = tuple(r + self.offset for r in _group_of(st, self.rank))
            if not st.is_collective:
                bc.compute[phase] += self.roofline.memory_time(st.nbytes)  # local slice
                continue
            if grad:
                bc.grad_sync.append((st.kind, int(st.nbytes), group))
                continue
            t = self.cluster.collective_time(st.kind, st.nbytes, group)
            bc.comm[phase] += t
            bc.comm_count[phase] += 1
            if regather:  # the gathered activation is not kept: B gathers it again
                bc.comm["B"] += t
                bc.comm_count["B"] += 1

    def _kernel_collectives(self, op: Operation, bc: BlockCost) -> None:
        """In-stage collectives a kernel issues itself (``KERNEL_COLLECTIVES``), timed with
        ``Cluster.collective_time`` on their groups and charged to the op's phase."""
        fn = KERNEL_COLLECTIVES.get(op.type)
        if fn is None:
            return
        for phase, kind, nbytes, group in fn(op, self.rank):
            g = tuple(r + self.offset for r in group)
            bc.comm[phase] += self.cluster.collective_time(kind, nbytes, g)
            bc.comm_count[phase] += 1

    def _params_and_workspace(self, op: Operation, sig: OpSig, bc: BlockCost) -> None:
        """Record the parameters a forward op reads (local elements and bytes) and the op's
        working set (local operand + result bytes other than parameters) when it launches a
        kernel: an op that only declares an input (data: optimizer states, labels) or a view
        holds no working set of its own. Local shapes come from the op's signature."""
        work = 0
        kernel = op_traits(op.type).kernel is not None
        for v, t in zip((*op.operands, *op.results), (*sig.ins, *sig.outs), strict=True):
            if v is None or t is None:
                continue
            n = 1
            for d in t.shape:
                n *= d
            nb = n * DTYPE_BYTES.get(t.dtype, 4)
            root = param_root(v, alias_only=True)
            if root is not None and op.role in (OpRole.FORWARD, OpRole.LOSS):
                bc.params.setdefault(root.name or str(id(root)), (n, nb))
            if root is None and kernel:
                work += nb
        bc.workspace = max(bc.workspace, work)

    def block_costs(self) -> dict[BlockKey, BlockCost]:
        """Per-block costs (per micro-batch) of every block in the program."""
        blocks = assign_blocks(self.program)
        out: dict[BlockKey, BlockCost] = {}
        for op in self.program.ops:
            if id(op) not in blocks:
                continue
            bc = out.setdefault(blocks[id(op)], BlockCost())
            if op.type == "reshard":
                self._collectives(op, bc)
                continue
            if op.type == "parameter":
                continue
            sig = op_signature(op, self.rank, self.names)
            self._params_and_workspace(op, sig, bc)
            self._kernel_collectives(op, bc)
            times, kernels = self._op_times(sig)
            for k in kernels:
                if k.phase in PHASES:
                    bc.flops[k.phase] += k.flops
                    bc.exec_flops[k.phase] += k.exec_flops
            for ph, t in times.items():
                if ph in PHASES:
                    bc.compute[ph] += t
            if op.role == OpRole.FORWARD and is_attention_core(op):
                bc.attn_core_f += times.get("F", 0.0)
        return out


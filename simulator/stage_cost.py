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

Kernel fusion: the framework profile's fused groups and torch.compile chains
(``simulator.fusion``) run as one kernel each, charged once to the block and phase of
their members; a member's other kernels (a backward op's weight-gradient kernel) keep
their own cost. FLOPs are the members' own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from completion.dtypes import DTYPE_BYTES
from completion.fp8 import TP_FLOAT8_GATHER
from completion.ir import Operation, OpRole, Program
from completion.ops.registry import op_traits
from completion.reshard import plan_reshard
from simulator.blocks import assign_blocks
from simulator.context_parallel import CP_PHASE, cp_settings
from simulator.cp_impls import cp_impl
from simulator.eager_ops import eager_kernels, eager_settings, impl_for
from simulator.fp8 import cast_kernels, fp8_state_bytes
from simulator.fusion import FusionPlan
from simulator.host_time import Dispatch, host_seconds
from simulator.memory import is_regather
from simulator.op_cost import KernelCost, op_cost
from simulator.op_signature import OpSig, is_weight_grad, local_tensor, op_signature, param_root
from simulator.recompute import PARTIAL_RECOMPUTE, recompute_policy, recomputed_ops
from simulator.roofline import Roofline
from simulator.streams import Kernel, overlapped_time
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
        recompute_f: per partial recompute policy (``simulator.recompute``: every policy but
            ``none`` and ``full``), seconds of the forward kernels it reruns in backward.
        grad_sync: (kind, nbytes, group) of per-step collectives on weight gradients.
        params: parameter name -> (local elements, local bytes) of the parameters the
            block's forward reads (a tied embedding appears in both "pre" and "post").
        dp_split: names of those parameters split over the data-parallel mesh dim (dim 0
            of the plan's mesh, ``completion.plan_program``): each rank holds its own part
            and no other dp rank has a copy (grouped expert weights under expert
            parallelism, ``Strategy.ep``), so the step's data-parallel gradient sync skips
            them (Megatron-Core reduces expert gradients over the expert-data-parallel
            group, of size 1 when ep = dp).
        workspace: bytes of the largest single op's working set in the block.
        comm_count: number of in-stage collective steps per phase.
        per_step: seconds of kernels the block's ops run once per step, not per
            micro-batch (``simulator.fp8``: Transformer Engine's weight casts and amax
            history update).
        fp8_state_bytes: persistent bytes of FP8 weight copies and amax histories
            (``simulator.fp8.fp8_state_bytes``).
        cp_hidden: seconds per phase of the context-parallel exchange that ran beside the
            attention kernels (``simulator.context_parallel``: issued minus exposed). Not in
            ``comm`` (which holds what the block's time carries); the step's ``tp_comm``
            line shows it as issued and ``overlapped`` as hidden.
        launched: per phase, the block's kernels and collectives in program order as
            ``(is_collective, device seconds)`` (a fused group one kernel): what the host
            dispatches (:meth:`dispatch`). Not in :meth:`time`: the pipeline action that
            runs the block composes its blocks' dispatches
            (``simulator.stage_timing.StageTimer.stage_time``).
        a2a: seconds per phase of the block's all_to_all collectives (part of ``comm``: the
            expert-parallel dispatch and combine), what an overlapped F&B pair may hide
            (``overlap.moe_a2a``, ``simulator.step``).
    """

    compute: dict[Phase, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    comm: dict[Phase, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    flops: dict[Phase, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    exec_flops: dict[Phase, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    recompute_f: dict[str, float] = field(default_factory=dict)
    grad_sync: list[tuple[str, int, tuple[int, ...]]] = field(default_factory=list)
    params: dict[str, tuple[int, int]] = field(default_factory=dict)
    dp_split: set[str] = field(default_factory=set)
    workspace: int = 0
    comm_count: dict[Phase, int] = field(default_factory=lambda: dict.fromkeys(PHASES, 0))
    overlaps: list[OverlapCandidate] = field(default_factory=list)
    per_step: float = 0.0
    fp8_state_bytes: float = 0.0
    cp_hidden: dict[Phase, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    launched: dict[Phase, list[tuple[bool, float]]] = field(
        default_factory=lambda: {ph: [] for ph in PHASES})
    _dispatched: dict[tuple[Phase, float, float], Dispatch] = field(
        default_factory=dict, repr=False, compare=False)

    def dispatched(self, phase: Phase, device_s: float, collective: bool = False) -> None:
        """Record one kernel (or collective) of ``phase`` that runs ``device_s`` seconds."""
        self.launched[phase].append((collective, device_s))
        self._dispatched.clear()

    def dispatch(self, phase: Phase, profile: Any) -> Dispatch:
        """``phase``'s kernels as the host dispatches them under ``profile``'s ``host``
        section (``simulator.host_time``: ``host_seconds`` per kernel and per collective;
        none: no host time, ``finish == device``)."""
        kernel, coll = host_seconds(profile, 1), host_seconds(profile, 0, 1)
        key = (phase, kernel, coll)
        if key not in self._dispatched:
            self._dispatched[key] = Dispatch.chain(
                Dispatch.kernel(coll if c else kernel, t) for c, t in self.launched[phase])
        return self._dispatched[key]
    a2a: dict[Phase, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))

    @property
    def attn_core_f(self) -> float:
        """Seconds of the attention core's forward (what ``selective`` recompute reruns)."""
        return self.recompute_f.get("selective", 0.0)

    def recompute_time(self, mode: str, overlap: float = 0.0) -> float:
        """Seconds the backward spends recomputing this block's forward under ``mode``
        (``full``: the whole forward, collectives included; a partial policy: its share,
        :attr:`recompute_f`; ``none``: 0)."""
        return recompute_policy(mode).rerun_time(self.time("F", overlap), self.recompute_f)

    def time(self, phase: Phase, overlap: float = 0.0) -> float:
        """Seconds of ``phase``: compute + (1 - overlap) * in-stage collectives."""
        return self.compute[phase] + (1.0 - overlap) * self.comm[phase]

    def times(self, profile: Any = None, overlap: float = 0.0) -> dict[str, float]:
        """Seconds of F, B, W and of a fused backward BW (B then W in one action) under the
        profile's ``overlap`` flags: a collective that the profile runs beside its partner
        kernels (:class:`OverlapCandidate`) takes ``simulator.streams.overlapped_time``
        with them instead of their sum; a B collective whose partners are W kernels (the
        input-gradient all_reduce beside the weight-gradient GEMM) overlaps only inside a
        BW action. Without a profile (or with every flag off): :meth:`time`.

        Returns a new dict per call (callers add to it); the values are computed once per
        (profile, overlap) and block (a search times the same blocks for every candidate
        of a layout). A BlockCost is complete when ``StageCoster.block_costs`` returns it:
        nothing changes its fields afterwards (``dataclasses.replace`` makes a new one)."""
        memo = self.__dict__.setdefault("_times_memo", {})
        hit = memo.get((id(profile), overlap))
        if hit is not None and hit[0] is profile:
            return dict(hit[1])
        out = self._times(profile, overlap)
        memo[(id(profile), overlap)] = (profile, out)
        return dict(out)

    def _times(self, profile: Any, overlap: float) -> dict[str, float]:
        """:meth:`times` computed (no memo)."""
        out = {ph: self.time(ph, overlap) for ph in PHASES}
        out["BW"] = out["B"] + out["W"]
        if profile is None or not self.overlaps:
            return out
        flags = profile.overlap
        used: set[int] = set()
        for cand in self.overlaps:
            if not getattr(flags, cand.rule).value:
                continue
            window = [k for k in cand.partners if k[0] not in used]
            if not window:
                continue
            used.update(k[0] for k in window)
            kernels = [Kernel(s, c) for _, s, c in window]
            comm = (1.0 - overlap) * cand.seconds
            saving = comm + sum(k.seconds for k in kernels) - overlapped_time(comm, kernels)
            if cand.partner_phase == cand.phase:
                out[cand.phase] -= saving
            out["BW"] -= saving if cand.phase in ("B", "W") or cand.partner_phase in ("B", "W") else 0.0
        return out


@dataclass(frozen=True)
class OverlapCandidate:
    """A collective a framework may run on its own stream beside some kernels.

    Attributes:
        phase: the phase the collective belongs to; seconds: its time alone.
        rule: the profile flag that allows it (``tp_backward``: the input-gradient
            all_reduce / reduce_scatter beside the weight-gradient GEMM of the same linear,
            and the sequence-parallel all_gather beside the input-gradient GEMM in
            backward; ``tp_forward``: the sequence-parallel all_gather / reduce_scatter
            beside the GEMM that consumes / produces it, TE userbuffers).
        partner_phase: the phase of the partner kernels.
        partners: (key, seconds alone, seconds beside a collective) per partner kernel;
            a kernel partners one collective at most (``key`` identifies it).
    """

    phase: Phase
    seconds: float
    rule: str
    partner_phase: Phase
    partners: tuple[tuple[int, float, float], ...]


def _producing_matmuls(v: Any, grad: bool = True, depth: int = 3) -> list[Operation]:
    """The matmul ops (``matmul_grad`` when ``grad``) whose results flow into ``v`` through at
    most ``depth`` sums or casts (the q/k/v input gradients summed before one reduction)."""
    op = getattr(v, "op", None)
    if op is None or depth < 0:
        return []
    want = "matmul_grad" if grad else "matmul"
    if op.type == want:
        return [op]
    if op_traits(op.type).gradient_sum:
        return [m for x in op.operands if x is not None for m in _producing_matmuls(x, grad, depth - 1)]
    return []


def _feeds_fp8_gather(y: Any) -> bool:
    """True when every user of reshard result ``y`` is an FP8 linear whose recipe
    all-gathers in FP8 (``completion.fp8.TP_FLOAT8_GATHER``: torchao's float8 tensor
    parallel styles cast the sequence-parallel input, and in backward the output gradient,
    to FP8 before the all-gather) and reads it as a GEMM input: a forward ``matmul``'s x,
    a ``matmul_grad``'s x (the FP8 input saved for the weight gradient) or output
    gradient."""
    uses = list(getattr(y, "uses", ()) or ())
    return bool(uses) and all(
        u.attrs.get("fp8") in TP_FLOAT8_GATHER
        and ((u.type == "matmul" and i == 0) or (u.type == "matmul_grad" and i in (0, 2)))
        for u, i in uses)


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
            stage, ranks shifted by stage * dp * tp).
        profile: the framework profile (``simulator.profiles.ProfileSpec``; None: every op
            one unfused kernel): its ``kernels.fused`` groups and ``kernels.compile``
            chains run as one kernel each (``simulator.fusion``).
    """

    def __init__(self, program: Program, cluster: Any, roofline: Roofline, rank: int = 0,
                 rank_offset: int = 0, profile: Any = None) -> None:
        self.program, self.cluster, self.roofline = program, cluster, roofline
        self.profile = profile
        self.rank, self.offset = rank, rank_offset
        self.names = frozenset(p.name for p in program.parameters() if p.name)
        self._index = {id(op): i for i, op in enumerate(program.ops)}  # kernel keys by position
        self._time_cache: dict[Any, tuple[dict[Phase, float], tuple[KernelCost, ...],
                                          tuple[float, ...]]] = {}
        self._eager = eager_settings(profile)

    def _op_times(self, sig: OpSig, skip: Phase | None = None) -> tuple[dict[Phase, float], tuple, tuple]:
        """Seconds per phase, the kernels of one op and each kernel's seconds (0 for the
        skipped ones); ``skip``: leave out the kernels of that phase from the times (they
        run inside a fused kernel)."""
        key = (sig, skip)
        if key not in self._time_cache:
            kernels = self._kernels(sig)
            each = tuple(0.0 if k.phase == skip else self.roofline.kernel_time(k) for k in kernels)
            times: dict[Phase, float] = {}
            for k, t in zip(kernels, each, strict=True):
                if k.phase != skip:
                    times[k.phase] = times.get(k.phase, 0.0) + t
            self._time_cache[key] = (times, kernels, each)
        return self._time_cache[key]

    def _kernels(self, sig: OpSig) -> tuple[KernelCost, ...]:
        """The kernels of one op: its eager implementation's under the profile
        (``kernels.eager``, ``simulator.eager_ops``), else ``simulator.op_cost``'s."""
        fused = op_cost(sig)
        impl = impl_for(sig.type, self._eager)
        kernels = tuple(eager_kernels(sig, impl, fused) if impl is not None else fused)
        if sig.attr("fp8"):  # an FP8 linear: its cast kernels (simulator.fp8)
            compiled = self.profile is not None and bool(self.profile.kernels.compile.value)
            kernels += tuple(cast_kernels(sig, compiled))
        return kernels

    def _collectives(self, op: Operation, bc: BlockCost) -> None:
        x, y = op.operands[0], op.results[0]
        if x is None or y is None or x.dist_attr is None or y.dist_attr is None:
            return
        steps = _reshard_steps(x.dist_attr, y.dist_attr, tuple(x.shape), x.dtype)
        grad = op.role == OpRole.BACKWARD and is_weight_grad(x, self.names) or (
            op.role == OpRole.BACKWARD and any(u.role == OpRole.OPTIMIZE for u, _ in y.uses))
        phase: Phase = "F" if op.role in (OpRole.FORWARD, OpRole.LOSS) else "B"
        regather = is_regather(op) and any(u.role == OpRole.BACKWARD for u, _ in y.uses)
        fp8_gather = _feeds_fp8_gather(y)
        for st in steps:
            if st.kind == "send_recv":
                continue  # stage boundaries are the pipeline's p2p, costed by the engine
            group = tuple(r + self.offset for r in _group_of(st, self.rank))
            if not st.is_collective:
                t = self.roofline.memory_time(st.nbytes)  # local slice
                bc.compute[phase] += t
                bc.dispatched(phase, t)
                continue
            if grad:
                bc.grad_sync.append((st.kind, int(st.nbytes), group))
                continue
            nbytes = st.nbytes
            if fp8_gather and st.kind == "all_gather":  # gathered after the FP8 cast
                nbytes = st.nbytes / DTYPE_BYTES.get(x.dtype, 2)
            t = self.cluster.collective_time(st.kind, nbytes, group)
            bc.comm[phase] += t
            bc.comm_count[phase] += 1
            bc.dispatched(phase, t, collective=True)
            if st.kind == "all_to_all":
                bc.a2a[phase] += t
            self._candidate(op, st.kind, phase, t, bc)
            if regather:  # the gathered activation is not kept: B gathers it again
                bc.comm["B"] += t
                bc.comm_count["B"] += 1
                bc.dispatched("B", t, collective=True)
                users = [u for u, _ in y.uses if u.role == OpRole.BACKWARD]
                self._add_candidate(bc, "B", t, "tp_backward", "B", users)

    def _candidate(self, op: Operation, kind: str, phase: Phase, seconds: float, bc: BlockCost) -> None:
        """Record the collective of reshard ``op`` as an overlap candidate where a framework
        overlaps that kind (:class:`OverlapCandidate`): in backward, a reduction of a
        Partial input gradient beside the weight-gradient GEMMs that produced it; in
        forward, a sequence-parallel all_gather beside the GEMMs that consume its result
        and a reduce_scatter beside the GEMM that produced its input."""
        x, y = op.operands[0], op.results[0]
        if phase == "B" and kind in ("all_reduce", "reduce_scatter"):
            self._add_candidate(bc, "B", seconds, "tp_backward", "W", _producing_matmuls(x))
        elif phase == "F" and kind == "all_gather":
            users = [u for u, _ in y.uses if u.type == "matmul" and u.role == OpRole.FORWARD]
            self._add_candidate(bc, "F", seconds, "tp_forward", "F", users)
        elif phase == "F" and kind == "reduce_scatter":
            self._add_candidate(bc, "F", seconds, "tp_forward", "F", _producing_matmuls(x, grad=False))

    def _add_candidate(self, bc: BlockCost, phase: Phase, seconds: float, rule: str,
                       partner_phase: Phase, ops: list[Operation]) -> None:
        partners = []
        for o in ops:
            sig = op_signature(o, self.rank, self.names)
            for i, k in enumerate(op_cost(sig)):
                if k.phase != partner_phase or k.kind != "gemm":
                    continue
                alone = self.roofline.kernel_time(k)
                beside = alone
                sms = getattr(self.roofline, "sm_count", None)
                if sms and self.profile is not None:
                    left = max(1, sms - self.profile.overlap.comm_sms.value)
                    beside = max(alone, self.roofline.kernel_time(k, sms_available=left))
                partners.append((self._index[id(o)] * 16 + i, alone, beside))
        if partners:
            bc.overlaps.append(OverlapCandidate(phase, seconds, rule, partner_phase, tuple(partners)))

    def _kernel_collectives(self, op: Operation, bc: BlockCost) -> None:
        """In-stage collectives a kernel issues itself (``KERNEL_COLLECTIVES``), timed with
        ``Cluster.collective_time`` on their groups and charged to the op's phase."""
        fn = KERNEL_COLLECTIVES.get(op.type)
        if fn is None:
            return
        for phase, kind, nbytes, group in fn(op, self.rank):
            g = tuple(r + self.offset for r in group)
            t = self.cluster.collective_time(kind, nbytes, g)
            bc.comm[phase] += t
            bc.comm_count[phase] += 1
            bc.dispatched(phase, t, collective=True)

    def _context_parallel(self, sig: OpSig, times: dict[Phase, float], bc: BlockCost) -> float:
        """Context-parallel attention as the profile's implementation runs it
        (``kernels.cp_attention``, ``simulator.cp_impls``): the exposed part of its K/V
        exchange charged to the op's phase as communication, its merge kernels as compute,
        and its K/V buffers added to its working set. Returns the exposed and merge seconds
        (0 without cp): a recompute policy that reruns a forward attention reruns both."""
        cp, _, _ = cp_settings(sig)
        if cp == 1:
            return 0.0
        phase = CP_PHASE[sig.type]
        impl = cp_impl(self.profile)
        compiled = self.profile is not None and bool(self.profile.kernels.compile.value)
        exposed, alone = impl.comm_time(sig, times.get(phase, 0.0), self.cluster, self.rank,
                                        self.offset, compiled)
        merge = self.roofline.memory_time(impl.merge_bytes(sig, compiled))
        bc.compute[phase] += merge
        bc.comm[phase] += exposed
        bc.cp_hidden[phase] += max(0.0, alone - exposed)
        bc.comm_count[phase] += cp - 1
        own = 0
        for t in (*sig.ins, *sig.outs):
            if t is not None:
                n = 1
                for d in t.shape:
                    n *= d
                own += n * DTYPE_BYTES.get(t.dtype, 4)
        bc.workspace = max(bc.workspace, own + impl.workspace_bytes(sig))
        return exposed + merge

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
                a = root.dist_attr
                if a is not None and a.process_mesh.shape[0] > 1 and 0 in a.dims_mapping:
                    bc.dp_split.add(root.name or str(id(root)))
            if root is None and kernel:
                work += nb
        bc.workspace = max(bc.workspace, work)

    def _fused(self, plan: FusionPlan, op: Operation, bc: BlockCost,
               recomputed: dict[str, set[int]]) -> Phase | None:
        """The phase of ``op``'s kernels that run inside its fused group (None: in none);
        charges the group's one kernel to ``bc`` at its first member, and to each partial
        recompute policy the share of it that its recomputed members stand for (by their
        unfused times)."""
        g = plan.group(op)
        if g is None:
            return None
        if op is g.ops[0]:
            t = self.roofline.kernel_time(plan.kernel(g, self.rank))
            bc.compute[g.phase] += t
            bc.dispatched(g.phase, t)
            if g.phase == "F":
                own = {id(o): sum(self._op_times(op_signature(o, self.rank, self.names))[0].values())
                       for o in g.ops}
                total = sum(own.values())
                for mode, ids in recomputed.items():
                    share = sum(v for k, v in own.items() if k in ids)
                    if share and total:
                        bc.recompute_f[mode] = bc.recompute_f.get(mode, 0.0) + t * share / total
        return g.phase

    def block_costs(self) -> dict[BlockKey, BlockCost]:
        """Per-block costs (per micro-batch) of every block in the program."""
        blocks = assign_blocks(self.program)
        plan = FusionPlan.of(self.program, self.profile, blocks)
        recomputed = {mode: recomputed_ops(self.program.ops, blocks, mode)
                      for mode in PARTIAL_RECOMPUTE}
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
            fused = self._fused(plan, op, bc, recomputed)
            times, kernels, each = self._op_times(sig, fused)
            cp_exposed = self._context_parallel(sig, times, bc) if op.type in CP_PHASE else 0.0
            for k, t in zip(kernels, each, strict=True):
                if k.phase in PHASES:
                    bc.flops[k.phase] += k.flops
                    bc.exec_flops[k.phase] += k.exec_flops
                    if k.phase != fused:  # a fused group's kernels: its one launch
                        bc.dispatched(k.phase, t)
            for ph, t in times.items():
                if ph in PHASES:
                    bc.compute[ph] += t
            if sig.attr("fp8"):
                bc.per_step += sum(self.roofline.kernel_time(k) for k in kernels
                                   if k.phase == "O" and k.op == "fp8_cast")
                bc.fp8_state_bytes += fp8_state_bytes(sig)
            for mode, ids in recomputed.items():
                if id(op) in ids and times.get("F"):
                    bc.recompute_f[mode] = bc.recompute_f.get(mode, 0.0) + times["F"] + cp_exposed
        return out


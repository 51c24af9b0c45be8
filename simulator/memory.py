"""Memory per rank: model states by ZeRO stage, activations saved for backward (read from
the program), recomputation, a workspace term, and the in-flight count from the schedule.

Model states (ZeRO, Rajbhandari et al. SC'20, section 5; formulas.md): with mixed-precision
Adam, 2 bytes of 16-bit weights + 2 of gradients + 12 of optimizer states (fp32 master,
momentum, variance) per parameter; ZeRO-1 shards the optimizer states over the sharding
degree N, ZeRO-2 also the gradients, ZeRO-3 also the weights:
(2+2+12/N)P, (2+14/N)P, 16P/N. Uneven shards take the largest (ceil) share.

Activations: the forward values that backward ops read (PIR: operands of role-backward ops
defined by forward/loss ops), excluding parameters and the operands a grad kernel needs only
the shape of (Paddle ``backward.yaml`` ``no_need_buffer``, the grad op's
``OpTraits.no_need_buffer`` in ``completion.ops``). Views (ops whose traits have ``view``:
reshape, squeeze, unsqueeze) share their input's storage and are counted once; the result
of a forward all_gather (sequence parallelism) is kept as its sharded input
(:func:`is_regather`). Under an FP8 recipe that saves FP8 copies of linear inputs
(Transformer Engine: ``simulator.fp8.Fp8Recipe.saved_input_bytes``) a value that FP8 weight
gradients read as their input is kept as that 1-byte copy, plus its compute-dtype self when
another backward op reads it too.
Recompute (``simulator.recompute`` policies): ``full`` keeps only each layer's input
(Korthikanti et al. 2022, "Reducing Activation Recomputation"); ``selective`` drops what
only the attention core (QK^T, softmax, dropout, attention over V, or a flash_attention
kernel: ``simulator.recompute.is_attention_core``) needs; ``selective-op`` (torchtitan's op
policy) keeps each layer's input and the results of the ops it saves (every other linear
mm, flash attention) and drops the rest.
The transient of recomputing one layer (its dropped bytes) is added once to the peak.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from completion.dtypes import DTYPE_BYTES
from completion.ir import Operation, OpRole, Program, Value
from completion.ops.registry import op_traits
from simulator.blocks import assign_blocks
from simulator.errors import SimulatorError
from simulator.fp8 import saved_input_bytes
from simulator.op_signature import grad_weights, local_tensor
from simulator.recompute import (
    RECOMPUTE_POLICIES,
    is_attention_core,
    recompute_policy,
    recomputed_ops,
)
from simulator.types import BlockKey

RECOMPUTE_MODES = tuple(RECOMPUTE_POLICIES)
StageKey = tuple[tuple[int, ...], int]

#: where a framework multiplies the MoE router weights into the expert outputs (profile
#: ``kernels.moe_probs``) -> the (grad op, operand index) reads it does not keep for
#: backward. ``combine``: the program's own ``moe_combine`` weights the expert outputs, its
#: grad reads them (``completion.ops.moe``). ``activation``: Megatron-LM d98e8a64
#: ``megatron/core/transformer/moe/experts.py`` ``TEGroupedMLP.forward`` passes the
#: permuted probs to the activation (``weighted_bias_swiglu_impl``: the SwiGLU output
#: times the probs, before ``linear_fc2``), and ``token_dispatcher.py``
#: ``MoEAlltoAllTokenDispatcher.combine_postprocess`` calls ``unpermute`` without probs: a
#: gather whose backward needs only the permutation map. So the expert outputs
#: (``moe_combine_grad`` operand 0, ``y``) are not saved; what the weighted SwiGLU's backward
#: reads beside its saved input is the permuted probs, one value per (token, choice) like
#: the top-k weights the combine grad still reads (operand 1), so the count is unchanged.
MOE_PROBS: dict[str, frozenset[tuple[str, int]]] = {
    "combine": frozenset(),
    "activation": frozenset({("moe_combine_grad", 0)}),
}


def moe_unsaved(profile: object) -> frozenset[tuple[str, int]]:
    """The (grad op type, operand index) reads that ``profile``'s ``kernels.moe_probs``
    (:data:`MOE_PROBS`; absent: ``combine``) does not keep. Raises SimulatorError for a
    value outside the registry."""
    field_ = getattr(getattr(profile, "kernels", None), "moe_probs", None)
    name = "combine" if field_ is None else field_.value
    if name not in MOE_PROBS:
        raise SimulatorError(f"kernels.moe_probs: {name!r} is none of {sorted(MOE_PROBS)}")
    return MOE_PROBS[name]


@dataclass(frozen=True)
class ModelStates:
    """Bytes of weights, gradients and optimizer states on one rank; ``buffers``: the
    unsharded copies a sharded framework gathers (FSDP blocks in flight, ZeRO-3's largest
    layer; ``simulator.model_states``)."""

    params: int
    grads: int
    optimizer: int
    buffers: int = 0

    @property
    def total(self) -> int:
        """params + grads + optimizer + buffers bytes on the rank."""
        return self.params + self.grads + self.optimizer + self.buffers


def zero_model_states(num_params: int, sharding_degree: int, stage: int, param_bytes: int = 2,
                      grad_bytes: int = 2, optimizer_bytes: int = 12) -> ModelStates:
    """Model states of one rank holding ``num_params`` parameters under ZeRO ``stage``
    (0-3) over ``sharding_degree`` ranks (ZeRO paper section 5 / formulas.md).

    Raises ValueError for a stage outside 0..3 or a degree < 1."""
    if stage not in (0, 1, 2, 3):
        raise SimulatorError(f"ZeRO stage (zero) must be 0, 1, 2 or 3, got {stage!r}")
    if sharding_degree < 1 or num_params < 0:
        raise SimulatorError(f"sharding_degree must be >= 1 and num_params >= 0, got "
                         f"{sharding_degree}, {num_params}")
    shard = -(-num_params // sharding_degree)
    return ModelStates(
        params=(shard if stage >= 3 else num_params) * param_bytes,
        grads=(shard if stage >= 2 else num_params) * grad_bytes,
        optimizer=(shard if stage >= 1 else num_params) * optimizer_bytes,
    )


def optimizer_bytes_per_param(param_dtype: str, optimizer: str = "adamw") -> int:
    """Optimizer-state bytes per parameter: Adam/AdamW keep fp32 momentum and variance (8),
    SGD none; a 16-bit parameter adds an fp32 master copy (4). Raises ValueError for an
    unknown optimizer."""
    base = {"adam": 8, "adamw": 8, "sgd": 0}
    if optimizer not in base:
        raise SimulatorError(f"unknown optimizer {optimizer!r}; expected one of {sorted(base)}")
    master = 4 if DTYPE_BYTES.get(param_dtype, 4) < 4 else 0
    return base[optimizer] + master


def stage_key(op: Operation) -> StageKey:
    """(ranks of the op's process mesh, chunk id); ((), chunk) when not annotated."""
    da = op.dist_attr
    mesh = da.process_mesh if da is not None else None
    if mesh is None:
        for v in op.results:
            if v is not None and v.dist_attr is not None:
                mesh = v.dist_attr.process_mesh
                break
    chunk = op.chunk_id or (da.chunk_id if da is not None else 0)
    return (tuple(mesh.process_ids) if mesh is not None else (), chunk)


def _root(v: Value) -> Value:
    while v.op is not None and v.op.operands and v.op.operands[0] is not None and (
            op_traits(v.op.type).view or is_regather(v.op)):
        v = v.op.operands[0]
    return v


def is_regather(op: Operation) -> bool:
    """A forward reshard that only all_gathers (S -> R on some mesh dims, no partial).
    Its result is not kept for backward: the sharded input is kept and the all_gather
    re-issued in B, as Megatron's sequence parallelism does (Korthikanti et al. 2022,
    section 4.2.2), so activations stay s*b*h*(34 + 5as/h)/t."""
    if op.type != "reshard" or op.role != OpRole.FORWARD or not op.operands or not op.results:
        return False
    x, y = op.operands[0], op.results[0]
    if x is None or y is None or x.dist_attr is None or y.dist_attr is None:
        return False
    a, b = x.dist_attr, y.dist_attr
    if a.partial or b.partial or a.process_mesh != b.process_mesh:
        return False
    kept = all(m == -1 or m == n for m, n in zip(b.dims_mapping, a.dims_mapping, strict=True))
    return kept and a.dims_mapping != b.dims_mapping


def _nbytes(v: Value) -> int:
    t = local_tensor(v, None)
    n = 1
    for s in t.shape:
        n *= s
    return n * DTYPE_BYTES.get(t.dtype, 4)




@dataclass
class StageActivations:
    """Per micro-batch activation bytes of one (stage mesh, chunk), per block.

    Attributes:
        by_block: bytes kept from F until B per block ("pre", layer index, "post").
        w_by_block: of those (plus the output gradients W kernels read), the bytes still
            held after B until W (M_W), per block.
        dropped_by_block: bytes dropped by recompute per block (re-materialised in B: the
            transient of recomputing that block).
    """

    by_block: dict[BlockKey, int] = field(default_factory=dict)
    w_by_block: dict[BlockKey, int] = field(default_factory=dict)
    dropped_by_block: dict[BlockKey, int] = field(default_factory=dict)

    @property
    def m_b(self) -> int:
        """M_B: bytes held per micro-batch from F to B."""
        return sum(self.by_block.values())

    @property
    def m_w(self) -> int:
        """M_W: bytes held per micro-batch from B to W (<= M_B)."""
        return min(sum(self.w_by_block.values()), self.m_b)

    @property
    def recompute_peak(self) -> int:
        """Transient of recomputing the largest block (0 without recompute)."""
        return max(self.dropped_by_block.values(), default=0)

    def add(self, table: str, block: BlockKey, nbytes: int) -> None:
        """Add ``nbytes`` to ``block``'s entry of the table named ``table`` (``by_block``,
        ``w_by_block`` or ``dropped_by_block``)."""
        d = getattr(self, table)
        d[block] = d.get(block, 0) + nbytes


def _saved_roots(program: Program, unsaved: frozenset[tuple[str, int]] = frozenset()
                 ) -> tuple[dict[int, Value], dict[int, list[Operation]], dict[int, list[Operation]]]:
    """Storage roots read by backward ops, their backward consumers, and of those the FP8
    weight-gradient ops that read the root as their input x (operand 0) under a recipe
    that saves an FP8 copy of it (``simulator.fp8.saved_input_bytes``). ``unsaved``:
    (grad op type, operand index) reads the framework does not keep (:data:`MOE_PROBS`)."""
    roots: dict[int, Value] = {}
    users: dict[int, list[Operation]] = {}
    fp8_x: dict[int, list[Operation]] = {}
    extra: dict[str, set[int]] = {}  # op type -> operand indices ``unsaved`` names
    for t, i in unsaved:
        extra.setdefault(t, set()).add(i)
    for op in program.ops:
        if op.role != OpRole.BACKWARD:
            continue
        skip = op_traits(op.type).no_need_buffer
        if op.type in extra:
            skip = set(skip) | extra[op.type]
        fp8 = saved_input_bytes(op) > 0
        for i, v in enumerate(op.operands):
            if v is None or i in skip or v.op is None:
                continue
            if v.op.role not in (OpRole.FORWARD, OpRole.LOSS) or v.is_parameter or v.persistable:
                continue
            r = _root(v)
            if r.is_parameter or r.persistable:
                continue
            roots[id(r)] = r
            users.setdefault(id(r), []).append(op)
            if fp8 and i == 0:
                fp8_x.setdefault(id(r), []).append(op)
    return roots, users, fp8_x


def _kept_bytes(r: Value, readers: list[Operation], fp8_readers: list[Operation]) -> int:
    """Bytes a saved root ``r`` holds: its compute-dtype bytes when some backward reader
    needs it as it is, plus one FP8 copy (``saved_input_bytes`` per element, the largest of
    its FP8 readers': TE casts a shared input once) when FP8 weight gradients read it
    (module ``simulator.fp8``)."""
    if not fp8_readers:
        return _nbytes(r)
    t = local_tensor(r, None)
    elems = 1
    for s in t.shape:
        elems *= s
    copy = int(round(elems * max(saved_input_bytes(op) for op in fp8_readers)))
    fp8_ids = {id(op) for op in fp8_readers}
    plain = any(id(op) not in fp8_ids for op in readers)
    return copy + (_nbytes(r) if plain else 0)


def _w_ops(program: Program, names: frozenset[str]) -> list[Operation]:
    """Backward ops that compute a weight gradient (their reads stay until W)."""
    return [op for op in program.ops if op.role == OpRole.BACKWARD and any(grad_weights(op, names))]


@dataclass
class SavedPrepass:
    """What :func:`saved_activations` reads off a program whatever the recompute mode: its
    blocks, the saved storage roots with their backward readers, FP8 readers and kept
    bytes, the weight-gradient ops and the roots they read. Computed once per program and
    ``unsaved`` by :func:`saved_prepass` (a search asks every recompute mode of a layout)."""

    blocks: dict[int, BlockKey]
    roots: dict[int, Value]
    users: dict[int, list[Operation]]
    kept: dict[int, int]
    w_ops: list[Operation]
    w_ids: set[int]


def saved_prepass(program: Program, unsaved: frozenset[tuple[str, int]] = frozenset()) -> SavedPrepass:
    """The recompute-independent part of :func:`saved_activations` (:class:`SavedPrepass`)."""
    names = frozenset(p.name for p in program.parameters() if p.name)
    blocks = assign_blocks(program)
    roots, users, fp8_x = _saved_roots(program, unsaved)
    w_ops = _w_ops(program, names)
    w_ids = {id(_root(v)) for op in w_ops for v in op.operands if v is not None and not v.is_parameter}
    kept = {rid: _kept_bytes(r, users[rid], fp8_x.get(rid, [])) for rid, r in roots.items()}
    return SavedPrepass(blocks, roots, users, kept, w_ops, w_ids)


def saved_activations(program: Program, recompute: str = "none",
                      unsaved: frozenset[tuple[str, int]] = frozenset(),
                      prepass: SavedPrepass | None = None) -> dict[StageKey, StageActivations]:
    """Activation bytes per micro-batch for every (stage mesh, chunk) of ``program``, per
    block (largest shard of each value on the stage's mesh, i.e. the heaviest rank).
    ``unsaved``: (grad op type, operand index) reads the framework keeps nothing for
    (:func:`moe_unsaved`); ``prepass``: :func:`saved_prepass` of the same program and
    ``unsaved`` when the caller has it (the same result, computed once per program).

    ``program`` must contain its backward ops (``append_backward``). Raises ValueError for
    an unknown ``recompute`` mode."""
    if recompute not in RECOMPUTE_MODES:
        raise SimulatorError(f"recompute must be one of {RECOMPUTE_MODES}, got {recompute!r}")
    pre = saved_prepass(program, unsaved) if prepass is None else prepass
    blocks, roots, users, w_ops, w_ids = pre.blocks, pre.roots, pre.users, pre.w_ops, pre.w_ids
    out: dict[StageKey, StageActivations] = {}
    policy = recompute_policy(recompute)
    rec = recomputed_ops(program.ops, blocks, recompute)
    for rid, r in roots.items():
        st = out.setdefault(stage_key(r.op), StageActivations())
        nb, blk = pre.kept[rid], blocks.get(id(r.op), "pre")
        # a partial policy that keeps no layer inputs (selective) drops a value only when
        # every backward reader is inside the recomputed region too
        drop = id(r.op) in rec and (policy.keeps_layer_inputs
                                    or all(is_attention_core(u) for u in users[rid]))
        if drop:
            st.add("dropped_by_block", blk, nb)
            continue
        st.add("by_block", blk, nb)
        if rid in w_ids:
            st.add("w_by_block", blk, nb)
    if policy.saves_outputs:
        _add_saved_outputs(program, roots, blocks, rec, out)
    if policy.keeps_layer_inputs:
        _add_layer_inputs(program, roots, blocks, out)
    for op in w_ops:  # output gradients that W kernels read
        st = out.setdefault(stage_key(op), StageActivations())
        for v in op.operands:
            if v is not None and v.op is not None and v.op.role == OpRole.BACKWARD:
                st.add("w_by_block", blocks.get(id(op), "post"), _nbytes(v))
    return out


def _add_saved_outputs(program: Program, roots: dict[int, Value], blocks: dict[int, BlockKey],
                       rec: set[int], out: dict[StageKey, StageActivations]) -> None:
    """A policy that saves what it does not recompute (torch selective checkpoint
    ``MUST_SAVE``): each layer keeps the results of its forward ops that are not
    recomputed (and launch a kernel), even those no backward op reads."""
    for op in program.ops:
        blk = blocks.get(id(op))
        if op.role != OpRole.FORWARD or not isinstance(blk, int) or id(op) in rec:
            continue
        if op_traits(op.type).kernel is None:
            continue
        for v in op.results:
            if v is None or id(_root(v)) in roots:
                continue
            out.setdefault(stage_key(op), StageActivations()).add("by_block", blk, _nbytes(v))


def _add_layer_inputs(program: Program, roots: dict[int, Value], blocks: dict[int, BlockKey],
                      out: dict[StageKey, StageActivations]) -> None:
    """Full (and op-level selective) recompute: each layer keeps the values it reads from
    outside itself."""
    kept: set[int] = set()
    for op in program.ops:
        blk = blocks.get(id(op))
        if op.role != OpRole.FORWARD or not isinstance(blk, int):
            continue
        for v in op.operands:
            if v is None or v.is_parameter or v.persistable or v.op is None:
                continue
            r = _root(v)
            src = blocks.get(id(r.op))
            if id(r) in kept or src == blk or r.op.type == "data":
                continue
            if not isinstance(src, int) and id(r) in roots:
                continue  # already kept as a saved value outside the layers
            kept.add(id(r))
            out.setdefault(stage_key(op), StageActivations()).add("by_block", blk, _nbytes(r))


def workspace_bytes(program: Program, ops: Iterable[Operation] | None = None) -> int:
    """Workspace term: the largest working set of a single op that launches a kernel
    (local operand + result bytes other than parameters), e.g. the logits and softmax of
    the loss; input declarations (data) and views hold none. Bytes."""
    best = 0
    for op in ops if ops is not None else program.ops:
        if op.role == OpRole.OPTIMIZE or op_traits(op.type).kernel is None:
            continue
        vals = [v for v in (*op.operands, *op.results) if v is not None and not v.is_parameter]
        best = max(best, sum(_nbytes(v) for v in vals))
    return best


def activation_delta(kind: str, mb: float, mw: float) -> float:
    """Bytes of activations an action of ``kind`` adds (F: +M_B) or frees (B: M_B - M_W,
    W: M_W, a fused BW: M_B), for a chunk saving ``mb`` = M_B and keeping ``mw`` = M_W for
    its W."""
    return {"F": mb, "B": -(mb - mw), "W": -mw}.get(kind, -mb)


def activation_changes(timeline: Iterable, num_ranks: int,
                       per_chunk: dict[tuple[int, int], tuple[float, float]]
                       ) -> list[list[tuple[int, int, float]]]:
    """Per rank, the changes of its activation bytes over a SimPy timeline
    (``SimResult.timeline``), sorted: ``(time ns, order, delta)`` with +M_B of (rank, chunk)
    at each F start, -(M_B - M_W) at a B end, -M_W at a W end, -M_B at a fused BW end; frees
    (order 0) sort before allocations (order 1) at equal times. ``per_chunk[(rank, chunk)]
    = (M_B, M_W)`` bytes per micro-batch."""
    changes: list[list[tuple[int, int, float]]] = [[] for _ in range(num_ranks)]
    for e in timeline:
        d = activation_delta(e.kind, *per_chunk.get((e.rank, e.chunk), (0.0, 0.0)))
        if e.kind == "F":
            changes[e.rank].append((e.start, 1, d))
        else:
            changes[e.rank].append((e.end, 0, d))
    for ch in changes:
        ch.sort()
    return changes


def timeline_activation_peaks(timeline: Iterable, num_ranks: int,
                              per_chunk: dict[tuple[int, int], tuple[float, float]]) -> list[float]:
    """Peak activation bytes per rank from a SimPy timeline: the running maximum of
    :func:`activation_changes`."""
    peaks = []
    for ch in activation_changes(timeline, num_ranks, per_chunk):
        cur = best = 0.0
        for _, _, d in ch:
            cur += d
            best = max(best, cur)
        peaks.append(best)
    return peaks


@dataclass(frozen=True)
class LossLogits:
    """The loss's logits on the rank: ``elements`` (local, per micro-batch) and the bytes
    per element of the softmax the program saves for backward (``saved_bytes``)."""

    elements: int = 0
    saved_bytes: int = 0


def loss_logits(program: Program) -> LossLogits:
    """The local logits of the program's ``cross_entropy_with_softmax`` (largest shard on
    its mesh) and the bytes per element of the softmax result it saves; an empty
    LossLogits when the program has no such op. With a profile's ``loss_saved_bytes`` the
    step model replaces the saved softmax by the framework's own (``simulator.step_memory``)."""
    for op in program.ops:
        if op.type != "cross_entropy_with_softmax" or not op.operands or op.operands[0] is None:
            continue
        t = local_tensor(op.operands[0], None)
        n = 1
        for s in t.shape:
            n *= s
        soft = op.results[0] if op.results else None
        saved = DTYPE_BYTES.get(local_tensor(soft, None).dtype, 4) if soft is not None else 0
        return LossLogits(n, saved)
    return LossLogits()

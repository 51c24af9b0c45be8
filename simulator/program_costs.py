"""What the step model reads off a plan's (representative) program: per-block costs on one
rank, the activations saved for backward, the model FLOPs per block, the bytes crossing a
pipeline stage boundary, and which block stands for each model layer.

Blocks are ``"pre"`` (embeddings), one int per decoder layer and ``"post"`` (final norm,
head, loss); see :mod:`simulator.blocks`. For a model built from a config the
(representative) program holds up to three decoder layers (``completion.plan_program``):
the first stands for the first model layer (it reads the embedding output), the second for
every middle layer, the last for the last layer (whose backward sums no output gradient).
A given program is costed layer by layer, or, with ``num_layers``, the same way.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from completion.dtypes import DTYPE_BYTES
from completion.ir import OpRole, Program
from simulator.blocks import assign_blocks
from simulator.errors import SimulatorError
from simulator.memory import (
    LossLogits,
    SavedPrepass,
    StageActivations,
    loss_logits,
    moe_unsaved,
    saved_activations,
    saved_prepass,
)
from simulator.op_cost import op_cost
from simulator.op_signature import local_tensor, op_signature
from simulator.recompute import recomputed_ops
from simulator.roofline import Roofline
from simulator.stage_cost import PHASES, BlockCost, StageCoster


class ProgramCostError(SimulatorError):
    """A program the step model cannot place on pipeline stages; names the cause."""


def costing_strategy(strategy: Any) -> Any:
    """The strategy whose representative program gives the same rank-0 costs as
    ``strategy``'s: the same dp x tp layout, micro-batch, recompute, dtype and annotation
    with pp = vpp = 1, 1F1B, no ZeRO and one micro-batch per step. Rank 0's local shapes,
    its collectives and its activations do not depend on the pipeline, the schedule or the
    ZeRO stage (ZeRO changes optimizer ops, costed apart; ZeRO-3's gathers are costed per
    block by the step model). dp stays: the loss is averaged over the dp group in each
    micro-batch (an all_reduce of the scalar: Megatron-LM's
    ``average_losses_across_data_parallel_group``)."""
    return strategy.replace(pp=1, vpp=1, schedule="1F1B", zero=0, fsdp_shard_size=None,
                            layers_per_stage=None,
                            global_batch_size=strategy.micro_batch_size * strategy.dp)


class ByIdentity:
    """A key part that compares by object identity and keeps the object alive (for
    unhashable objects such as a Cluster: while an entry holds it, its id is not reused)."""

    __slots__ = ("obj",)

    def __init__(self, obj: Any) -> None:
        self.obj = obj

    def __hash__(self) -> int:
        return id(self.obj)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ByIdentity) and other.obj is self.obj


_T = TypeVar("_T")


class CostCache(Generic[_T]):
    """A small LRU cache of :class:`ProgramCosts` (or another value, ``_T``) by a caller's key (the model, its costing
    strategy, the cluster and device efficiency): a search costs each distinct layer layout
    once, whatever its dp, pp, schedule and ZeRO stage. 2048 entries by default: an
    exhaustive search bounds every candidate before it simulates any, so every distinct
    layout of a pattern-based space (over a thousand for llama2-7b on one 8-GPU node) stays
    costed."""

    def __init__(self, maxsize: int = 2048) -> None:
        self.maxsize = maxsize
        self._items: OrderedDict[Any, _T] = OrderedDict()
        self.hits = self.misses = 0

    def clear(self) -> None:
        """Forget every entry (benchmarks time cold searches)."""
        self._items.clear()

    def get(self, key: Any, build: Callable[[], _T]) -> _T:
        """The costs under ``key``, built with ``build()`` on a miss."""
        if key in self._items:
            self._items.move_to_end(key)
            self.hits += 1
            return self._items[key]
        self.misses += 1
        value = self._items[key] = build()
        if len(self._items) > self.maxsize:
            self._items.popitem(last=False)
        return value


#: the tuple keys of ``ProgramCosts.model_flops`` beside the per-block model FLOPs:
#: executed beyond the model (recompute, padded expert slots) and the causal mask's share
EXECUTED_EXTRA = ("recompute", "padding")
EXTRA_FLOPS_KINDS = (*EXECUTED_EXTRA, "causal_skip")


@dataclass
class ProgramCosts:
    """Costs of one plan program, per micro-batch (seconds, bytes, FLOPs).

    Attributes:
        layers: one BlockCost per model layer, model order (objects repeat when one layer
            stands for several). pre / post: the blocks before / after the layers (or None).
        layer_keys: per model layer, its block key in the program (and in ``activations``).
        activations: bytes saved for backward per block (all stage meshes merged: the
            representative program has one).
        model_flops: per block key ("pre", model layer index, "post") the model FLOPs of
            F + B + W of one micro-batch over every dp replica; ``("recompute", i)`` the
            forward FLOPs that recompute re-runs for layer i; ``("padding", i)`` the expert
            op FLOPs on padded slots, recomputed ones twice (executed, not model FLOPs:
            :func:`_slot_factor`); ``("causal_skip", i)`` the attention model FLOPs a causal
            mask leaves out (neither executed nor in ``mfu_causal``'s count).
        boundary_bytes: bytes of the activation a layer hands to the next (the pipeline p2p
            message per micro-batch, local shard of rank 0).
        loss: the loss's local logits and the bytes per element the program saves for them
            (``simulator.memory.loss_logits``). Under a profile that states
            ``memory.loss_saved_bytes`` the "post" activations hold the framework's saved
            bytes per logit instead of the program's (:func:`framework_activations`).
    """

    layers: list[BlockCost]
    pre: BlockCost | None
    post: BlockCost | None
    layer_keys: list[Any]
    activations: StageActivations
    model_flops: dict[Any, float]
    boundary_bytes: float
    loss: LossLogits = LossLogits()

    @classmethod
    def of(cls, plan_program: Any, cluster: Any, roofline: Roofline,
           num_layers: int | None = None, profile: Any = None, *,
           recompute: str | None = None, block_costs: dict[Any, BlockCost] | None = None,
           tables: ProgramTables | None = None) -> ProgramCosts:
        """Costs of a ``completion.plan_program.PlanProgram`` on ``cluster`` for rank 0.

        ``num_layers``: how many model layers the program's layers stand for (module
        docstring; for a representative program: the model's layer count); None costs
        every layer of the program separately. ``profile``: the framework profile the
        kernels run under (fusion: ``simulator.profiles``). ``recompute``: the recompute
        mode whose saved activations and recompute FLOPs to count (None: the program's
        strategy's; the program itself does not depend on it, ``build_plan_program`` reads
        no recompute). ``block_costs``: the program's ``StageCoster(...).block_costs()`` on
        this cluster, roofline and profile when the caller has them; ``tables``: the
        program's :class:`ProgramTables` (``meshplan.engine.PROGRAMS`` keeps both).
        Raises ProgramCostError when pp > 1 and the program has no decoder layers."""
        prog, s = plan_program.program, plan_program.strategy
        recompute = s.recompute if recompute is None else recompute
        blocks = assign_blocks(prog) if tables is None else tables.blocks
        costs = block_costs
        if costs is None:
            costs = StageCoster(prog, cluster, roofline, rank=0, profile=profile).block_costs()
        layer_ids = sorted(k for k in costs if isinstance(k, int))
        if num_layers is not None and layer_ids:
            keys = layer_roles(layer_ids, num_layers)
        else:
            keys = layer_ids
        if not keys and s.pp > 1:
            raise ProgramCostError(f"pp={s.pp} needs decoder layers (struct names "
                                   f"'...layers.<i>...'); the program has none")
        # an annotated program holds every dp replica of its mesh; with 1 < ep < dp it is one
        # of dp / ep expert-data-parallel copies (PlanProgram.replicas)
        reps = getattr(plan_program, "replicas", 1) if plan_program.annotated else s.dp
        flops = block_model_flops(prog, blocks, recompute, reps, None if tables is None else tables.flops())
        model_flops = {k: v for k, v in flops.items()
                       if not (isinstance(k, int) or isinstance(k, tuple) and isinstance(k[1], int))}
        for i, key in enumerate(keys):  # every model layer, even when one stands for all
            model_flops[i] = flops.get(key, 0.0)
            for kind in EXTRA_FLOPS_KINDS:
                if (kind, key) in flops:
                    model_flops[(kind, i)] = flops[(kind, key)]
        loss = loss_logits(prog)
        acts = framework_activations(merged_activations(prog, recompute, moe_unsaved(profile), tables),
                                     loss, profile)
        return cls([costs[k] for k in keys], costs.get("pre"), costs.get("post"), keys,
                   acts, model_flops, boundary_bytes(prog, blocks), loss)


def layer_roles(layer_ids: list[int], num_layers: int) -> list[int]:
    """The program layer standing for each of ``num_layers`` model layers: each layer itself
    when the program has them all (a mixed dense / MoE model); else the program's
    first layer for the first, its last for the last, its second for every middle one
    (with fewer than three program layers the nearest kind: a two-layer program's first
    layer stands for the middle ones too)."""
    if len(layer_ids) == num_layers:  # a program of every layer: each stands for itself
        return list(layer_ids)
    first, last = layer_ids[0], layer_ids[-1]
    middle = layer_ids[1] if len(layer_ids) > 2 else first
    if num_layers == 1:
        return [last]
    return [first] + [middle] * (num_layers - 2) + [last]


def op_flops(prog: Program, blocks: dict[int, Any]) -> list[tuple[int, Any, float, float, float]]:
    """Per op of a block, ``(id(op), block, model FLOPs of F + B + W from global shapes,
    expert slot factor >= 1, the model FLOPs a causal or windowed mask leaves out)``: what
    :func:`block_model_flops` sums, for any recompute mode and replica count."""
    names = frozenset(p.name for p in prog.parameters() if p.name)
    slots = expert_slot_factors(prog)
    out = []
    for op in prog.ops:
        blk = blocks.get(id(op))
        if blk is None:
            continue
        kernels = [k for k in op_cost(op_signature(op, None, names, global_shapes=True))
                   if k.phase in PHASES]
        fl = sum(k.flops for k in kernels)
        skip = sum(k.flops - k.causal_flops for k in kernels if k.causal_flops is not None)
        out.append((id(op), blk, fl, max(1.0, _slot_factor(op, slots)), skip))
    return out


def block_model_flops(prog: Program, blocks: dict[int, Any], recompute: str,
                      replicas: int = 1, table: list[tuple[int, Any, float, float, float]] | None = None
                      ) -> dict[Any, float]:
    """Model FLOPs per block of one micro-batch from global shapes (F + B + W kernels;
    ``simulator.op_cost`` conventions), times ``replicas`` (the dp replicas an unannotated
    program stands for), and under ``("recompute", block)`` the forward FLOPs that
    recompute re-runs (the forward ops of a layer its ``simulator.recompute`` policy
    selects: all for ``full``, the attention core for ``selective``), under
    ``("padding", block)`` the expert FLOPs on padded slots and under
    ``("causal_skip", block)`` the attention model FLOPs a causal (or windowed) mask
    leaves out (``KernelCost.flops - causal_flops``: model FLOPs, not executed ones; the
    count ``mfu_causal`` takes off). ``table``: the program's :func:`op_flops` when the
    caller has it."""
    rec = recomputed_ops(prog.ops, blocks, recompute)
    out: dict[Any, float] = {}
    for oid, blk, fl0, f, skip in (op_flops(prog, blocks) if table is None else table):
        fl = fl0 * replicas
        if skip:
            out[("causal_skip", blk)] = out.get(("causal_skip", blk), 0.0) + skip * replicas
        # an op on padded expert slots (factor f > 1): the model's share is 1 / f; below 1
        # (a capacity that drops tokens) every slot holds a routed token and the dropped
        # ones are not computed: all of it is the model's (MFU never above the executed)
        pad = fl * (1.0 - 1.0 / f)
        fl -= pad
        runs = 2 if oid in rec else 1  # a recomputed op runs its padding again too
        if pad:
            out[("padding", blk)] = out.get(("padding", blk), 0.0) + runs * pad
        out[blk] = out.get(blk, 0.0) + fl
        if runs == 2:
            out[("recompute", blk)] = out.get(("recompute", blk), 0.0) + fl
    return out


class ProgramTables:
    """What :meth:`ProgramCosts.of` reads off one program for any recompute mode and replica
    count, computed once (a search costs every recompute mode and, under expert
    parallelism, several dp of one program): its blocks, per-op model FLOPs
    (:func:`op_flops`) and the saved-activation prepass per ``unsaved`` set
    (``simulator.memory.saved_prepass``). The program must not change afterwards."""

    def __init__(self, prog: Program) -> None:
        self.prog = prog
        self.blocks = assign_blocks(prog)
        self._flops: list[tuple[int, Any, float, float, float]] | None = None
        self._prepass: dict[frozenset, SavedPrepass] = {}

    def flops(self) -> list[tuple[int, Any, float, float, float]]:
        """The program's :func:`op_flops`."""
        if self._flops is None:
            self._flops = op_flops(self.prog, self.blocks)
        return self._flops

    def prepass(self, unsaved: frozenset[tuple[str, int]]) -> SavedPrepass:
        """The program's ``saved_prepass`` for ``unsaved``."""
        if unsaved not in self._prepass:
            self._prepass[unsaved] = saved_prepass(self.prog, unsaved)
        return self._prepass[unsaved]


def expert_slot_factors(prog: Program) -> dict[str, float]:
    """Per mixture-of-experts block (the ``struct_name`` of its ``moe_dispatch``) the slot
    factor its experts were built with (``ModelConfig.expert_slot_factor``: capacity factor
    or load imbalance, ``completion.ops.moe``); factor-1 blocks are left out."""
    return {op.struct_name: float(op.attrs.get("capacity_factor", 1.0)) for op in prog.ops
            if op.type == "moe_dispatch" and float(op.attrs.get("capacity_factor", 1.0)) != 1.0}


def _slot_factor(op: Any, slots: dict[str, float]) -> float:
    """The slot factor of an op on expert-major slots (its struct name is a dispatch's in
    ``slots`` or below it: dispatch, expert GEMMs and activation, combine and their
    gradients), else 1. Model FLOPs count the routed tokens (b s k per layer, Megatron-LM's
    ``num_floating_point_operations``), not the slots each expert is padded to (every
    expert sized like the busiest, or to its capacity), which the kernels execute: MFU must
    not rise with an imbalance that only adds padding. A factor below 1 (a capacity that
    drops tokens) counts the kept tokens only: the dropped ones are not computed
    (:func:`block_model_flops` takes ``max(1, factor)``)."""
    name = op.struct_name or ""
    for prefix, f in slots.items():
        if name == prefix or name.startswith(prefix + "."):
            return f
    return 1.0


def framework_activations(acts: StageActivations, loss: LossLogits, profile: Any) -> StageActivations:
    """``acts`` with the loss's saved bytes per logit replaced by the framework's
    (profile ``memory.loss_saved_bytes``: Megatron and torchtitan keep the fp32 softmax /
    log-softmax, 4 bytes, where the program saves its softmax in the logits' dtype): the
    "post" block gains ``(framework - program) x logits`` bytes held from F to B (M_B;
    the loss backward frees them, so M_W is unchanged). ``acts`` unchanged without a
    profile, a stated value or a loss."""
    mem = getattr(profile, "memory", None)
    saved = getattr(mem, "loss_saved_bytes", None)
    if saved is None or loss.elements == 0:
        return acts
    extra = int(round((saved.value - loss.saved_bytes) * loss.elements))
    if extra == 0:
        return acts
    out = StageActivations(dict(acts.by_block), dict(acts.w_by_block), dict(acts.dropped_by_block))
    out.by_block["post"] = max(0, out.by_block.get("post", 0) + extra)
    return out


def merged_activations(prog: Program, recompute: str,
                       unsaved: frozenset[tuple[str, int]] = frozenset(),
                       tables: ProgramTables | None = None) -> StageActivations:
    """Activation bytes saved for backward per block, summed over the program's stage
    meshes (``simulator.memory.saved_activations``; ``unsaved``: the framework's reads that
    keep nothing, ``simulator.memory.moe_unsaved``; ``tables``: the program's
    :class:`ProgramTables` when the caller keeps them)."""
    merged = StageActivations()
    pre = None if tables is None else tables.prepass(unsaved)
    for st in saved_activations(prog, recompute, unsaved, pre).values():
        for table in ("by_block", "w_by_block", "dropped_by_block"):
            for k, v in getattr(st, table).items():
                merged.add(table, k, v)
    return merged


def boundary_bytes(prog: Program, blocks: dict[int, Any]) -> float:
    """Bytes of the last layer op's first result on rank 0 (what one pipeline stage sends
    the next per micro-batch); 0 without decoder layers."""
    last = None
    for op in prog.ops:
        if op.role == OpRole.FORWARD and isinstance(blocks.get(id(op)), int) and op.results:
            last = op.results[0] or last
    if last is None:
        return 0.0
    t = local_tensor(last, 0)
    n = 1
    for d in t.shape:
        n *= d
    return float(n * DTYPE_BYTES.get(t.dtype, 4))

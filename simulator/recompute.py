"""Activation recompute policies: which forward ops of a transformer layer its backward
runs again, and which of their results are kept for it.

A policy (:class:`RecomputePolicy`) selects, among the forward ops of one layer block
(``simulator.blocks``; embeddings and the head are never recomputed), the ops whose
results are dropped after the forward and recomputed in the backward. The time model
(``simulator.stage_cost`` / ``stage_timing``) charges their forward kernels again inside
the layer's backward; the memory model (``simulator.memory``) drops their results from
the activations kept between F and B and keeps the results of the ops that are saved.

Registered policies (``Strategy.recompute``):

- ``none``: nothing recomputed.
- ``selective``: the attention core (QK^T, scale/mask, softmax, dropout, x V or the flash
  kernel) -- Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
  Transformer Models", sec. 5 (Megatron-LM ``--recompute-granularity selective``).
- ``selective-op``: torchtitan's op-level selective activation checkpointing
  (``activation_checkpoint.mode = 'selective'``, ``selective_ac_option = 'op'``;
  ``torchtitan/parallelisms/parallelize_llama.py`` at commit 9dec370,
  ``_apply_ac_to_transformer_block``): per block forward, the results of ``aten.mm`` are
  saved except every second one (counted from the block's first), the results of
  flash / efficient SDPA and of ``reduce_scatter`` are saved; every other op (norms,
  rotary, activations, adds, casts, and the even-numbered projections) is recomputed.
  In the IR a torch ``aten.mm`` is a ``matmul`` that reads a parameter (a linear layer);
  the attention GEMMs of unfused attention are batched (``aten.bmm``) and recomputed.
- ``full``: every forward op of the layer; the layer keeps only the values it reads from
  outside itself (Chen et al. 2016; Megatron-LM ``--recompute-granularity full``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from completion.choices import RECOMPUTE
from completion.ir import Operation, OpRole
from completion.ops.registry import op_traits
from completion.roles import is_grad_type
from simulator.errors import SimulatorError
from simulator.op_signature import param_root

#: ops of one layer (forward, in program order) -> ids of the ops it recomputes
Selector = Callable[[Sequence[Operation]], set[int]]


@dataclass(frozen=True)
class RecomputePolicy:
    """One recompute mode.

    Attributes:
        name: the ``Strategy.recompute`` value.
        select: forward ops of one layer, in order -> ids of those recomputed.
        keeps_layer_inputs: True when the layer keeps the values it reads from outside
            itself for the recompute (``full``, ``selective-op``); a partial policy whose
            recomputed ops read only kept values (``selective``) needs nothing more.
        saves_outputs: True when the results of the ops it does not recompute are kept
            even if no backward op reads them (torch's selective checkpoint ``MUST_SAVE``
            stores them for the recompute); False: only what backward reads is kept.
        source: where the policy is defined.
        reruns: what the backward of a layer block reruns: ``"nothing"``, ``"part"`` (the
            ops :attr:`select` picks, costed per op by ``simulator.stage_cost`` into
            ``BlockCost.recompute_f``) or ``"forward"`` (the whole forward, collectives
            included, overlapped as the forward is: Chen et al. 2016).

    The one place that says what a mode costs: its rerun time (:meth:`rerun_time`) and its
    memory (:attr:`select`, :attr:`keeps_layer_inputs`, :attr:`saves_outputs`, read by
    ``simulator.memory``); the step model resolves ``Strategy.recompute`` into its policy
    once (``simulator.step.StepConfig.recompute_policy``).
    """

    name: str
    select: Selector
    keeps_layer_inputs: bool
    saves_outputs: bool
    source: str
    reruns: str = "part"

    @property
    def reruns_forward(self) -> bool:
        """True when the backward reruns a layer's whole forward (``full``): its kernels,
        its collectives and their dispatch, before the layer's backward."""
        return self.reruns == "forward"

    @property
    def partial(self) -> bool:
        """True for a policy that reruns part of a layer's forward (its time is costed per
        op and accumulated per block: ``BlockCost.recompute_f``)."""
        return self.reruns == "part"

    def rerun_time(self, forward_s: float, partial_s: Mapping[str, float]) -> float:
        """Seconds the backward of one layer block spends rerunning what this policy drops:
        ``forward_s`` (the block's forward, as the caller times it) when it reruns the whole
        forward, ``partial_s[name]`` (the block's per-policy rerun seconds,
        ``BlockCost.recompute_f``) for a partial policy, 0 for none."""
        if self.reruns == "forward":
            return forward_s
        return partial_s.get(self.name, 0.0) if self.partial else 0.0


def _nothing(ops: Sequence[Operation]) -> set[int]:
    return set()


def _everything(ops: Sequence[Operation]) -> set[int]:
    return {id(op) for op in ops}


def _attention_core(ops: Sequence[Operation]) -> set[int]:
    return {id(op) for op in ops if is_attention_core(op)}


def is_attention_core(op: Operation) -> bool:
    """True when ``op`` is part of an attention core, the part selective recompute drops
    (Korthikanti et al. 2022, section 5): its type has the ``attention_core`` trait
    (softmax, dropout, scale, matmul, flash_attention; ``completion.ops.op_traits``), it is a
    grad op exactly when it runs in backward, its struct name ends in ``self_attn``, and no
    operand is a parameter (so a matmul is QK^T or PV, not a projection)."""
    if not op_traits(op.type).attention_core:
        return False
    if (op.role == OpRole.BACKWARD) != is_grad_type(op.type):
        return False
    if not (op.struct_name or "").endswith("self_attn"):
        return False
    return not any(v is not None and v.is_parameter for v in op.operands)


def is_linear_mm(op: Operation) -> bool:
    """True when ``op`` is a ``matmul`` reading a parameter (torch ``aten.mm`` of a linear
    layer, not an attention ``bmm``)."""
    return op.type == "matmul" and any(
        param_root(v) is not None for v in op.operands if v is not None)


def op_sac_saves(op: Operation) -> bool:
    """True for the ops whose results torchtitan's op policy saves besides every other mm
    (``_save_list`` at 9dec370: SDPA's flash / efficient attention, reduce_scatter_tensor):
    a fused attention kernel (op traits ``kernel == "attention"``) or a reduce_scatter."""
    return op_traits(op.type).kernel == "attention" or op.type == "reduce_scatter"


def _op_sac(ops: Sequence[Operation]) -> set[int]:
    """torchtitan's op policy (module docstring): recompute all but odd-numbered linear mms
    and the saved op types."""
    out: set[int] = set()
    mm = 0
    for op in ops:
        if is_linear_mm(op):
            mm += 1
            if mm % 2 == 1:
                continue
        elif op_sac_saves(op):
            continue
        out.add(id(op))
    return out


RECOMPUTE_POLICIES: dict[str, RecomputePolicy] = {
    p.name: p for p in (
        RecomputePolicy("none", _nothing, False, False, "no recompute", reruns="nothing"),
        RecomputePolicy("selective", _attention_core, False, False,
                        "Korthikanti et al. 2022 sec. 5 (Megatron-LM selective recompute)"),
        RecomputePolicy("selective-op", _op_sac, True, True,
                        "torchtitan 9dec370 parallelize_llama.py _apply_ac_to_transformer_block "
                        "(selective_ac_option = 'op')"),
        RecomputePolicy("full", _everything, True, False,
                        "Chen et al. 2016; Megatron-LM --recompute-granularity full", reruns="forward"),
    )
}


#: the policies that rerun part of a layer's forward (their time is accumulated per block)
PARTIAL_RECOMPUTE = tuple(n for n, p in RECOMPUTE_POLICIES.items() if p.partial)
if tuple(RECOMPUTE_POLICIES) != RECOMPUTE:  # one registry of the names: completion.choices
    raise SimulatorError(f"simulator.recompute registers {tuple(RECOMPUTE_POLICIES)}, "
                         f"completion.choices.RECOMPUTE names {RECOMPUTE}")


def recompute_policy(name: str) -> RecomputePolicy:
    """The registered policy ``name``. Raises SimulatorError naming the known ones."""
    try:
        return RECOMPUTE_POLICIES[name]
    except KeyError:
        raise SimulatorError(f"recompute must be one of {tuple(RECOMPUTE_POLICIES)}, got {name!r}") from None


def recomputed_ops(ops: Sequence[Operation], blocks: dict[int, object], name: str) -> set[int]:
    """ids of the forward ops of every layer block of ``ops`` (program order; ``blocks``
    from ``simulator.blocks.assign_blocks``) that policy ``name`` recomputes."""
    policy = recompute_policy(name)
    by_layer: dict[object, list[Operation]] = {}
    for op in ops:
        blk = blocks.get(id(op))
        if op.role == OpRole.FORWARD and isinstance(blk, int):
            by_layer.setdefault(blk, []).append(op)
    out: set[int] = set()
    for layer_ops in by_layer.values():
        out |= policy.select(layer_ops)
    return out

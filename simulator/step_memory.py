"""Memory of one pipeline rank at its peak (bytes), one named line per mechanism.

Tensors the plan holds (through the caching allocator):

- ``params``, ``grads``, ``optimizer``, ``param_buffers``: model states by the framework's
  state model (``simulator.model_states``; no profile: the ZeRO paper's, sec. 5);
- ``activations``: the activations in flight as the simulated schedule plays them
  (``simulator.memory.timeline_activation_peaks``: +M_B at each F, -(M_B - M_W) at each B,
  -M_W at each W, per (rank, chunk));
- ``recompute``: the bytes one layer drops and re-materialises in its backward (Korthikanti
  et al. 2022), the largest over the rank's layers;
- ``loss_temporaries``: on the rank holding the loss, what the framework's cross-entropy
  holds on top of its saved softmax while it runs (profile ``memory.loss_temp_bytes`` per
  local logit: Megatron's 16-bit logits beside the fp32 copy, torchtitan's fp32
  log-softmax gradients);
- ``op_workspace``: the largest single op's working set (operands + results other than
  parameters, e.g. the unfused attention scores, or the program's loss without a
  profile's loss figures) beyond ``loss_temporaries``: the peak holds the larger of the
  two, not both;
- ``library_workspace``: cuBLAS workspace allocated through the allocator (profile
  ``memory.workspace_bytes``);
- ``fragmentation``: the caching allocator's reserved-but-unallocated share, the profile's
  fraction (``memory.fragmentation``) of the lines above.
- ``fp8_weights``: FP8 weight copies and amax histories of an FP8 recipe (``simulator.fp8``),
  added by the step model after the lines above (no fragmentation share is taken of it).

Outside the allocator (in ``nvidia-smi``, not in ``torch.cuda.memory_reserved``):

- ``cuda_context``: the CUDA context and library handles (``memory.cuda_context_bytes``);
- ``nccl_buffers``: NCCL's buffers per communicator the rank is in
  (``memory.nccl_buffer_bytes`` x :func:`communicators`).

``total`` is the sum of the lines; ``allocator`` lines are listed in :data:`ALLOCATOR_LINES`
(what PyTorch's max reserved memory reports).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from simulator.dp_groups import pipeline_holds_unsharded, replicate_degree, shard_degree
from simulator.expert_parallel import expert_dp_degree
from simulator.memory import ModelStates, StageActivations, zero_model_states
from simulator.model_states import StateInputs, model_states
from simulator.stage_cost import BlockCost
from simulator.stage_timing import reduce_bytes

#: breakdown lines held through the caching allocator (torch max reserved memory)
ALLOCATOR_LINES = ("params", "grads", "optimizer", "param_buffers", "activations", "recompute",
                   "loss_temporaries", "op_workspace", "library_workspace", "fragmentation",
                   "fp8_weights")
#: breakdown lines outside the allocator
OUTSIDE_LINES = ("cuda_context", "nccl_buffers")


def vstage_activation_bytes(acts: StageActivations, table: str, layer_keys: list[Any],
                            layers: Iterable[int], first: bool, last: bool) -> float:
    """Bytes of ``acts``'s table (``by_block`` or ``w_by_block``) for the model layers
    ``layers`` of a virtual stage, plus "pre" on the first and "post" on the last."""
    d = getattr(acts, table)
    total = sum(d.get(layer_keys[i], 0) for i in layers)
    if first:
        total += d.get("pre", 0)
    if last:
        total += d.get("post", 0)
    return float(total)


def communicators(dp: int, tp: int, pp: int, tied: bool, hsdp: bool = False, cp: int = 1,
                  ep: int = 1) -> int:
    """NCCL communicators a rank is in: the default (world) group, and the tp, dp and pp
    groups of size > 1, plus the embedding group of tied embeddings across pipeline stages
    (Megatron-LM ``parallel_state.initialize_model_parallel``); 0 on a single device. ``dp``
    is the gradient-reduction group, dp x cp under context parallelism (Megatron's
    data-parallel-with-context group), and a ``cp`` > 1 adds the context-parallel group of
    the ring exchange; an ``ep`` > 1 adds the expert-parallel group of the all_to_all and,
    when dp / ep > 1, the expert-data-parallel group of the expert gradients. Under HSDP
    (``hsdp``) the dp ranks talk over two groups, the shard and the replicate group of
    FSDP2's 2-D mesh (``simulator.dp_groups``), one more communicator."""
    if dp * tp * pp == 1:
        return 0
    return (1 + (tp > 1) + (dp > 1) + (dp > 1 and hsdp) + (pp > 1) + (pp > 1 and tied)
            + (cp > 1) + (ep > 1) + (ep > 1 and dp // ep > 1))


@dataclass(frozen=True)
class RankParams:
    """Parameter facts of one pipeline rank (elements): ``total`` local elements,
    ``largest_param`` its largest parameter tensor, ``largest_block`` its largest decoder
    layer, ``root`` its parameters outside the decoder layers, ``holds_loss`` whether it
    runs the loss (the last virtual stage)."""

    total: int
    largest_param: int = 0
    largest_block: int = 0
    root: int = 0
    holds_loss: bool = False
    expert: int = 0
    backward_freed: int | None = None
    """Bytes of activations one micro-batch's backward frees on the rank (its smallest
    chunk's M_B; ``simulator.model_states.StateInputs.backward_freed``); None: unknown."""
    """Of ``total``, the expert-parallel elements (``BlockCost.dp_split``), whose ZeRO
    states are sharded over dp / ep (:mod:`simulator.expert_parallel`)."""
    embedding: int = 0
    """Of ``total``, the embedding tables' elements (the "pre" block's parameters, and a
    tied head's table on a rank without "pre"): NeMo keeps their gradients in fp32
    (``simulator.model_states.apex_distributed_adam_states``)."""


def _states(cfg: Any, rp: RankParams) -> Any:
    """The rank's model states: the dense parameters sharded over dp, or over the shard
    group under HSDP (:func:`simulator.dp_groups.shard_degree`), and the ``rp.expert``
    expert-parallel ones over the expert-data-parallel group, dp / ep ranks (Megatron-Core's
    separate distributed optimizer of the expert parameter groups,
    :mod:`simulator.expert_parallel`): the sum of the two states (the expert part has no
    FSDP / ZeRO-3 buffers: zero <= 1 with ep > 1, ``Strategy``)."""
    if not rp.expert:
        return _states_over(cfg, rp, shard_degree(cfg))
    dense = _states_over(cfg, replace(rp, total=rp.total - rp.expert, expert=0), shard_degree(cfg))
    exp = _states_over(cfg, RankParams(rp.expert), expert_dp_degree(cfg))
    return ModelStates(params=dense.params + exp.params, grads=dense.grads + exp.grads,
                       optimizer=dense.optimizer + exp.optimizer, buffers=dense.buffers)


def _states_over(cfg: Any, rp: RankParams, degree: int) -> ModelStates:
    """The states of ``rp.total`` elements sharded over ``degree`` ranks by the profile's
    state model (no profile: the ZeRO paper's)."""
    prof = cfg.profile
    if prof is None:
        return zero_model_states(rp.total, degree, cfg.zero, cfg.param_bytes, cfg.grad_bytes,
                                 cfg.optimizer_bytes)
    x = StateInputs(params=rp.total, dp=degree, zero=cfg.zero, param_bytes=cfg.param_bytes,
                    grad_bytes=cfg.grad_bytes, optimizer_bytes=cfg.optimizer_bytes,
                    largest_param=rp.largest_param, largest_block=rp.largest_block,
                    root_params=rp.root, prefetch=prof.overlap.fsdp_prefetch.value,
                    reduce_bytes=reduce_bytes(cfg), fp8_params=bool(getattr(cfg, "fp8_params", False)),
                    embedding_params=rp.embedding,
                    accumulate_unsharded=pipeline_holds_unsharded(prof, cfg.pp, cfg.zero, degree),
                    backward_freed=rp.backward_freed)
    return model_states(prof.memory.model_states.value, x)


def rank_memory(cfg: Any, params: int | RankParams, act_peak: float, acts: StageActivations,
                layer_keys: list[Any], rank_layers: Iterable[int],
                blocks: Iterable[BlockCost], *, loss_elements: int = 0,
                loss_block: BlockCost | None = None, tied: bool = False) -> dict[str, int]:
    """The memory breakdown of one pipeline rank (bytes; ``total`` is the sum of the
    lines, module docstring).

    Args:
        cfg: the ``simulator.step.StepConfig`` (degrees, bytes, ``profile``).
        params: the rank's parameters (:class:`RankParams`, or its local elements).
        act_peak: its peak activation bytes from the timeline.
        acts / layer_keys: the activation tables and each model layer's block key.
        rank_layers: the rank's model layers.
        blocks: every block it runs (for the op working set).
        loss_elements: local logits of the loss (``ProgramCosts.loss.elements``), counted on
            the rank that holds the loss; loss_block: the block running it ("post"), whose
            working set the framework's loss figures replace.
        tied: whether the embedding is tied to the head (an extra NCCL group with pp > 1).
    Without a profile the breakdown has only the tensor lines of the ZeRO paper's model
    states, activations, recompute and the largest op's working set (``op_workspace``)."""
    rp = params if isinstance(params, RankParams) else RankParams(int(params))
    blocks = list(blocks)
    states = _states(cfg, rp)
    rank_layers = list(rank_layers)
    recompute = 0
    if cfg.recompute_policy.reruns != "nothing":
        recompute = max((acts.dropped_by_block.get(layer_keys[i], 0) for i in rank_layers), default=0)
    op_work = max((b.workspace for b in blocks), default=0)
    prof = cfg.profile
    mem = prof.memory if prof is not None else None
    loss_temp = 0
    temp = getattr(mem, "loss_temp_bytes", None)
    if temp is not None and rp.holds_loss and loss_elements:
        loss_temp = int(round(temp.value * loss_elements))
        # the program's loss op is replaced by the framework's: its working set no longer counts
        op_work = max((b.workspace for b in blocks if b is not loss_block), default=0)
    memory = {"params": states.params, "grads": states.grads, "optimizer": states.optimizer,
              "param_buffers": states.buffers, "activations": int(act_peak),
              "recompute": int(recompute), "loss_temporaries": loss_temp,
              "op_workspace": int(max(0, op_work - loss_temp))}
    if mem is not None:
        memory["library_workspace"] = int(mem.workspace_bytes.value)
        memory["fragmentation"] = int(round(mem.fragmentation.value * sum(memory.values())))
        memory["cuda_context"] = int(mem.cuda_context_bytes.value)
        memory["nccl_buffers"] = int(mem.nccl_buffer_bytes.value
                                     * communicators(cfg.dp, cfg.tp, cfg.pp, tied,
                                                     replicate_degree(cfg) > 1,
                                                     getattr(cfg, "cp", 1), getattr(cfg, "ep", 1)))
    memory["total"] = sum(memory.values())
    return memory


def allocator_bytes(memory: dict[str, int]) -> int:
    """The lines of a breakdown held through the caching allocator (what
    ``torch.cuda.max_memory_reserved`` reports), bytes."""
    return sum(memory.get(k, 0) for k in ALLOCATOR_LINES)


def allocated_bytes(memory: dict[str, int]) -> int:
    """The tensors of a breakdown (what ``torch.cuda.max_memory_allocated`` or the
    executor's live-tensor count reports): the allocator lines less the fragmentation,
    bytes."""
    return allocator_bytes(memory) - memory.get("fragmentation", 0)

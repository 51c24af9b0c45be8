"""Model states per rank by framework: how weights, gradients and optimizer states are held.

A framework profile names its model (``memory.model_states``, :data:`STATE_MODELS`); each is
a function of :class:`StateInputs` returning :class:`simulator.memory.ModelStates` (bytes).
P is the rank's local parameter elements, N the sharding degree (dp; the shard group under
HSDP, ``simulator.dp_groups.shard_degree``), L the largest
parameter tensor on the rank. Sources (FN = shared/reference/fidelity_notes.md):

- ``plain`` -- the ZeRO paper, section 5 (formulas.md): 16-bit weights and gradients,
  12 bytes of fp32 master + Adam m, v; ZeRO-1/2/3 shard optimizer / + gradients / +
  weights: (2+2+12/N)P, (2+14/N)P, 16P/N (``simulator.memory.zero_model_states``).
- ``megatron`` -- FN "Memory by precision" (Megatron-LM ``report_theoretical_memory``):
  fp32 main gradients, 18 bytes per parameter = 2 (16-bit weight) + 4 (fp32 gradient) + 4
  (fp32 main weight) + 8 (Adam); the distributed optimizer (ZeRO-1 here) 6 + 12/N. ZeRO-2
  and -3 shard the fp32 gradients and then the weights the same way (2 + 16/N, 18/N).
- ``megatron-ddp`` -- Megatron-Core's DDP gradient buffer in the dtype it is reduced in
  (``grad_reduce_in_fp32``: 4, else the 16-bit weight's 2; :func:`megatron_ddp_states`):
  (2 + g + 12/N)P with the distributed optimizer, e.g. 4 + 12/N under Megatron-Bridge's
  performance recipes (``grad_reduce_in_fp32 = False``).
- ``apex-distributed-adam`` -- NeMo 24.x's Apex ``DistributedFusedAdam``
  (:func:`apex_distributed_adam_states`): the ``megatron-ddp`` split with the gradient buffer
  in the reduce dtype (fp32 for the embedding tables), but a 16-bit (bf16) weight's fp32
  master is stored as its low 16 bits only (``store_param_remainders``): (2 + g + 10/N)P
  with Adam, 12/N when the weights are FP8 parameters (NeMo then stores whole fp32 masters).
- ``deepspeed`` -- FN "DeepSpeed's ZeRO estimators" (``estimate_zero2_model_states_mem_needs``,
  ``estimate_zero3_model_states_mem_needs``, no offload): ZeRO-2 keeps the full 2P
  half-precision weights plus 18P/N (the 16-bit and fp32 gradient partitions, 2 + 4, and
  the 12 bytes of fp32 master + Adam); ZeRO-3 4L (the gathered 16-bit weights and gradient
  of the largest layer) + 18P/N, split as 2 weights + 4 gradients + 12 optimizer. ZeRO-1
  keeps the full 16-bit gradients (2P + 2P + 16P/N) and no ZeRO the unsharded 2P + 18P
  (the estimator's formula at N = 1).
- ``fsdp`` -- FN "FSDP" (torchtitan 9dec370 ``parallelize_llama.apply_fsdp``: one
  ``fully_shard`` per transformer block, the root holding the embedding, final norm and
  head): FULL_SHARD (ZeRO-3) keeps fp32 sharded weights, fp32 sharded gradients and Adam
  states, (4 + 4 + 8)P/N, plus the unsharded 16-bit buffers at the backward's start: the
  root's weights (gathered for the whole backward, resharded after it), the head's
  unsharded gradient (reduced with the root's at the end), ``prefetch + 1`` blocks'
  weights (the one running and those prefetched) and one block's unsharded gradient with
  its reduce-dtype copy for the reduce_scatter. Below ZeRO-3 the weights stay unsharded
  in 16 bits and the fp32 states follow the ``megatron`` split; ZeRO-2 (FSDP2 with
  ``reshard_after_forward=False``) also holds the same head and block gradient buffers,
  since FSDP2 reduces each block's gradients the same way at either stage.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from simulator.errors import SimulatorError
from simulator.memory import ModelStates, zero_model_states

#: bytes of an fp32 value (main gradients, FSDP's sharded weights and reduce buffers)
FP32 = 4


@dataclass(frozen=True)
class StateInputs:
    """What a state model reads about one rank (elements and bytes per element).

    Attributes:
        params: local parameter elements of the rank (P).
        dp: the sharding degree (N >= 1).
        zero: ZeRO stage 0-3.
        param_bytes / grad_bytes: bytes of a weight / gradient element in the compute dtype.
        optimizer_bytes: optimizer bytes per parameter (fp32 master + Adam: 12 for 16-bit).
        largest_param: elements of the largest parameter tensor on the rank (L; DeepSpeed's
            "largest layer", e.g. the 32000 x 4096 embedding of llama2-7b).
        largest_block: parameter elements of the rank's largest decoder layer (an FSDP unit).
        root_params: elements of the rank's parameters outside the decoder layers (FSDP's
            root unit: embeddings, final norm, head).
        prefetch: FSDP blocks gathered ahead of the running one (profile
            ``overlap.fsdp_prefetch``).
        reduce_bytes: bytes of a gradient element as it is reduced (4 for fp32).
        fp8_params: the weights are FP8 parameters (the framework profile's ``fp8.params``
            under an FP8 recipe), not 16-bit ones.
        embedding_params: of ``params``, the embedding tables' elements (word and position
            embeddings, a tied head's table), whose gradients NeMo keeps in fp32.
        accumulate_unsharded: the pipeline keeps FSDP's weights gathered and accumulates
            the gradients unsharded between micro-batches
            (:func:`simulator.dp_groups.accumulates_unsharded`; :func:`fsdp_states`).
        backward_freed: bytes of activations one micro-batch's backward frees on the rank
            (its smallest chunk's); with ``accumulate_unsharded`` at ZeRO-3 the rank holds
            all its weights gathered only right after a backward, with that much less
            activation than at its peak. None (a lower bound: ``meshplan.bounds.tier0``): those
            weights are not counted.
    """

    params: int
    dp: int
    zero: int
    param_bytes: int = 2
    grad_bytes: int = 2
    optimizer_bytes: int = 12
    largest_param: int = 0
    largest_block: int = 0
    root_params: int = 0
    prefetch: int = 0
    reduce_bytes: int = FP32
    fp8_params: bool = False
    embedding_params: int = 0
    accumulate_unsharded: bool = False
    backward_freed: int | None = None


def _shard(n: int, dp: int) -> int:
    return -(-n // dp)


def plain_states(x: StateInputs) -> ModelStates:
    """ZeRO paper section 5: :func:`simulator.memory.zero_model_states`."""
    return zero_model_states(x.params, x.dp, x.zero, x.param_bytes, x.grad_bytes, x.optimizer_bytes)


def _main_grad_bytes(x: StateInputs) -> int:
    """fp32 main gradients for 16-bit weights, the weight's own bytes otherwise."""
    return FP32 if x.param_bytes < FP32 else x.grad_bytes


def megatron_states(x: StateInputs) -> ModelStates:
    """Megatron mixed precision: 2 + 4 + 12 bytes per parameter (18), the distributed
    optimizer (zero >= 1) 2 + 4 + 12/N; zero 2 / 3 also shard the fp32 gradients / the
    weights."""
    return zero_model_states(x.params, x.dp, x.zero, x.param_bytes, _main_grad_bytes(x),
                             x.optimizer_bytes)


def megatron_ddp_states(x: StateInputs) -> ModelStates:
    """Megatron-Core's DDP with its contiguous gradient buffer in the reduce dtype: 16-bit
    weights, a gradient buffer of ``reduce_bytes`` per element (fp32 only with
    ``grad_reduce_in_fp32``) and 12 bytes of fp32 master + Adam, the distributed optimizer
    (zero >= 1) sharding the 12 over N: ``(2 + g + 12/N) P``.

    Source: Megatron-LM d98e8a64 ``megatron/core/distributed/distributed_data_parallel.py``
    (``group_params_for_buffers(..., ddp_config.grad_reduce_in_fp32)``: the buffer holds
    fp32 gradients only with that flag, else the parameter dtype). With a 16-bit buffer the
    distributed optimizer copies its shard's gradients to fp32 in the step
    (``megatron/core/optimizer/distrib_optimizer.py`` ``_copy_model_grads_to_main_grads``:
    ``shard_main_param.grad = shard_model_grad.float()``), 4/N bytes per parameter that live
    only while the optimizer runs, after every activation is freed, so not at the peak
    this breakdown describes."""
    return zero_model_states(x.params, x.dp, x.zero, x.param_bytes, x.reduce_bytes,
                             x.optimizer_bytes)


#: bytes of a 16-bit weight's fp32 master that Apex's ``store_param_remainders`` need not
#: store: the weight itself holds the master's high 16 bits
REMAINDER_SAVING = 2


def apex_distributed_adam_states(x: StateInputs) -> ModelStates:
    """NeMo 24.x with Apex's ``DistributedFusedAdam`` (optimizer ``distributed_fused_adam``):
    16-bit weights, gradient buckets of ``reduce_bytes`` per element -- fp32 for the E
    embedding-table elements (``embedding_params``) -- and the optimizer states sharded over
    N (zero >= 1), where the fp32 master of a 16-bit weight keeps only its low 16 bits:
    ``(2 + g + 10/N)(P - E) + (2 + 4 + 10/N) E`` with Adam; FP8 parameters keep whole fp32
    masters (12/N; their 1 + 1 FP8 bytes are counted as the 2).

    Source: NeMo v2.0.0 (the 24.09 container)
    ``nemo/collections/nlp/models/language_modeling/megatron_base_model.py``
    ``setup_optimization``: with fp32 optimizer states and bf16 weights (megatron_amp_O2) it
    sets ``store_params=False, store_param_remainders=True``, with ``fp8_params``
    ``store_params=True``; ``megatron_gpt_model.py`` ``configure_optimizers`` marks the word
    and position embeddings (and a tied output table on the last stage)
    ``_with_fp32_optimizer`` (``with_fp32_embedding_grads`` defaults to True), and
    ``nemo/core/optim/distributed_adam.py`` ``init_params_bucket`` gives those parameters
    buckets with ``grad_sync_dtype=torch.float32``; Apex
    ``apex/contrib/optimizers/distributed_fused_adam.py`` (``store_param_remainders``: store
    the bits needed to rebuild fp32 weights from bf16 ones; ``_init_grad_buffer``: the
    contiguous gradient buffer in ``grad_sync_dtype``, bf16 in NVIDIA's dgxc-benchmarking
    35a9aecc recipes)."""
    saving = REMAINDER_SAVING if x.param_bytes == 2 and not x.fp8_params else 0
    opt = max(0, x.optimizer_bytes - saving)
    tables = min(max(0, x.embedding_params), x.params)
    rest = zero_model_states(x.params - tables, x.dp, x.zero, x.param_bytes, x.reduce_bytes, opt)
    emb = zero_model_states(tables, x.dp, x.zero, x.param_bytes, FP32, opt)
    return ModelStates(params=rest.params + emb.params, grads=rest.grads + emb.grads,
                       optimizer=rest.optimizer + emb.optimizer)


def deepspeed_states(x: StateInputs) -> ModelStates:
    """DeepSpeed's estimators: ZeRO-2 2P + 18P/N, ZeRO-3 4L + 18P/N (module docstring)."""
    p, n = x.params, x.dp
    fp32_grad = FP32 if x.param_bytes < FP32 else 0
    if x.zero == 3:
        # 18P/N = 2 (16-bit weight partition) + 4 (fp32 gradient partition) + 12
        return ModelStates(params=_shard(p, n) * x.param_bytes,
                           grads=_shard(p, n) * (fp32_grad or x.grad_bytes),
                           optimizer=_shard(p, n) * x.optimizer_bytes,
                           buffers=(x.param_bytes + x.grad_bytes) * x.largest_param)
    part = p if x.zero == 0 else _shard(p, n)
    half_grads = p * x.grad_bytes if x.zero <= 1 else part * x.grad_bytes
    return ModelStates(params=p * x.param_bytes, grads=half_grads + part * fp32_grad,
                       optimizer=part * x.optimizer_bytes)


def fsdp_states(x: StateInputs) -> ModelStates:
    """FSDP FULL_SHARD (zero 3): 16P/N + the unsharded buffers (module docstring); below
    ZeRO-3 the ``megatron`` split.

    Under a pipeline that accumulates unsharded (``x.accumulate_unsharded``, zero 2-3:
    torch 2.13.0 pipelining turns FSDP2's gradient sync and resharding after backward off
    for every micro-batch, ``simulator.dp_groups.accumulates_unsharded``), from the
    stage's first backward to its one reduce_scatter the rank holds all P gradients
    unsharded in the reduce dtype (FSDP2 ``FSDPParam.to_accumulated_grad_if_needed``
    upcasts a bf16 gradient to reduce_dtype float32 to accumulate it) plus the running
    block's fresh 16-bit gradient before it is added, ``r P + 2 L_block``, beside the
    sharded fp32 master and Adam states; its 16-bit weights stay gathered after each
    backward: always under ZeRO-2 (``2P``), while under ZeRO-3 each forward reshards the
    blocks it ran (``reshard_after_forward``), so the rank holds all 2P only right after a
    backward, when one micro-batch's activations (``x.backward_freed``) are gone: the
    buffers line is the larger of FSDP's gathered blocks (at the activation peak, after a
    forward) and ``2P - backward_freed``. E.g. a stage of P = 1e9 over N = 8 in bf16,
    fp32 reduce: 4 GB of unsharded gradients (+ 2 GB of weights under ZeRO-2) where
    FULL_SHARD without pipelining holds 16/8 = 2 GB of states plus a few blocks."""
    if x.accumulate_unsharded and x.zero >= 2:
        return _fsdp_unsharded_accumulation(x)
    if x.zero < 2:
        return megatron_states(x)
    if x.zero == 2:  # all 16-bit weights stay gathered; the same per-block reduce as ZeRO-3
        base = megatron_states(x)
        return ModelStates(params=base.params, grads=base.grads, optimizer=base.optimizer,
                           buffers=_reduce_buffers(x))
    params, optimizer, gathered = _full_shard(x)
    return ModelStates(params=params, grads=_shard(x.params, x.dp) * _main_grad_bytes(x),
                       optimizer=optimizer, buffers=gathered + _reduce_buffers(x))


def _reduce_buffers(x: StateInputs) -> int:
    """FSDP2's unsharded gradients at a block's backward, the same under ZeRO-2 and ZeRO-3:
    the head's 16-bit gradient (the root's gradients are reduced only at the end of the
    backward) and the running block's 16-bit gradient with its reduce-dtype copy for the
    reduce_scatter. torch 2.13.0 ``_fully_shard/_fsdp_param_group.py`` ``post_backward``
    collects each group's unsharded gradients and calls ``foreach_reduce`` (which copies them
    into a ``reduce_dtype`` reduce_scatter input) whatever ``reshard_after_forward`` is:
    ZeRO-2 (``reshard_after_forward=False``) differs from ZeRO-3 only in keeping the weights
    gathered. Counting these for ZeRO-3 only made ZeRO-3 report more memory than ZeRO-2
    (Qwen3-30B-A3B, 4 layers, dp 8: 17.75 -> 19.57 GiB)."""
    head_grad = x.param_bytes * x.largest_param if x.root_params else 0
    return head_grad + (x.param_bytes + x.reduce_bytes) * x.largest_block


def _full_shard(x: StateInputs) -> tuple[int, int, int]:
    """FULL_SHARD's (params, optimizer, gathered) bytes: the sharded weights (the fp32
    master for 16-bit weights), the rest of the optimizer states over N, and the unsharded
    16-bit weights of the root and of ``prefetch + 1`` blocks."""
    shard = _shard(x.params, x.dp)
    master = FP32 if x.param_bytes < FP32 else 0  # the sharded weight is the fp32 master
    # at most all of the rank's weights: a stage of fewer than prefetch + 1 blocks gathers
    # every one it has, not blocks it does not hold
    gathered = x.param_bytes * min(x.root_params + (x.prefetch + 1) * x.largest_block, x.params)
    return shard * (master or x.param_bytes), shard * (x.optimizer_bytes - master), gathered


def _fsdp_unsharded_accumulation(x: StateInputs) -> ModelStates:
    """:func:`fsdp_states` of a stage whose pipeline accumulates unsharded: the 16-bit
    weights (ZeRO-2: its params line; ZeRO-3: buffers beside the sharded fp32 masters, the
    larger of the gathered blocks and all weights less ``backward_freed``),
    ``reduce_bytes`` x P unsharded gradients (the sharded fp32 gradient only exists after
    the reduce_scatter, once the backward's activations are gone), the fp32 master and Adam
    states over N, and one block's fresh 16-bit gradient."""
    fresh = x.grad_bytes * x.largest_block
    acc = x.reduce_bytes * x.params
    if x.zero < 3:
        base = megatron_states(x)
        return ModelStates(params=base.params, grads=acc, optimizer=base.optimizer, buffers=fresh)
    params, optimizer, gathered = _full_shard(x)
    held = 0 if x.backward_freed is None else x.param_bytes * x.params - x.backward_freed
    return ModelStates(params=params, grads=acc, optimizer=optimizer, buffers=max(gathered, held) + fresh)


#: state model name (profile ``memory.model_states``) -> function
STATE_MODELS: dict[str, Callable[[StateInputs], ModelStates]] = {
    "plain": plain_states,
    "megatron": megatron_states,
    "megatron-ddp": megatron_ddp_states,
    "apex-distributed-adam": apex_distributed_adam_states,
    "deepspeed": deepspeed_states,
    "fsdp": fsdp_states,
}


def model_states(kind: str, x: StateInputs) -> ModelStates:
    """Model states of one rank under state model ``kind`` (:data:`STATE_MODELS`).

    Raises SimulatorError for an unknown kind, a ZeRO stage outside 0..3 or dp < 1."""
    fn = STATE_MODELS.get(kind)
    if fn is None:
        raise SimulatorError(f"unknown model-state model {kind!r}; expected one of "
                             f"{sorted(STATE_MODELS)}")
    if x.zero not in (0, 1, 2, 3):
        raise SimulatorError(f"ZeRO stage (zero) must be 0, 1, 2 or 3, got {x.zero!r}")
    if x.dp < 1 or x.params < 0:
        raise SimulatorError(f"dp must be >= 1 and params >= 0, got {x.dp}, {x.params}")
    return fn(x)

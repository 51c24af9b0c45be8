"""Context parallelism (``Strategy.cp``): the sequence of every micro-batch split over cp ranks.

Megatron-LM's ``--context-parallel-size`` (``megatron/core/parallel_state.py``; Transformer
Engine's ``attn_forward_func_with_cp``). Every op but the attention is position-wise, so on
each cp rank it runs on that rank's tokens alone; the attention needs every earlier key
and value and gets them from the other cp ranks:

- ``p2p`` (ring attention, Liu et al. 2023, "Ring Attention with Blockwise Transformers";
  Megatron ``--cp-comm-type p2p``): cp steps; in step i a rank attends its queries to the
  K/V block it holds (its own in step 0) while it sends that block to the next rank of the
  ring and receives the previous rank's; the blockwise results merge by their log-sum-exp.
  Backward passes K/V and the accumulated dK/dV around the ring the same way.
- ``all_gather`` (Megatron ``--cp-comm-type all_gather``): K/V all-gathered over the cp
  group before the attention; backward reduce-scatters dK/dV.

Causal load balancing (Megatron ``get_batch_on_this_cp_rank``): the sequence is cut into 2cp
chunks and cp rank c holds chunks c and 2cp-1-c, so each rank has the same number of
(query, key) pairs under the causal mask: :func:`rank_positions`, :func:`zigzag_order`.

How a plan with cp > 1 is built (:func:`fold_strategy`, :func:`fold_source`): the cp ranks of
one data-parallel replica are laid out inside its data-parallel slot (Megatron's rank order
tp-cp-dp-pp: rank = (d * cp + c) * tp + t), and each holds a sequence of ``seq_len / cp``
tokens. The program is therefore the program of ``dp * cp`` data-parallel replicas of
``seq_len / cp``-token sequences on the mesh ``[dp * cp, tp]`` whose data-parallel dim is
the dp x cp group: exactly the group Megatron reduces weight gradients over and shards the
distributed optimizer over (``get_data_parallel_group(with_context_parallel=True)``). Local
shapes, activations, tensor-parallel collectives and gradient syncs are then those of the cp
plan. What differs is the attention, and its ops carry it in their attributes
(:data:`CP_ATTRS`, set by :func:`mark_attention`): the cost model charges the whole causal
attention of the rank's queries against all ``seq_len`` keys and the ring's traffic
(``simulator.context_parallel``), the executor runs the ring on the cp peers
(``executor.ring_attention``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from completion.errors import CompletionError
from completion.ir import Program

#: attention op types a cp plan runs blockwise over the cp group
CP_OP_TYPES = ("flash_attention", "flash_attention_grad")
#: attributes of those ops: cp degree, how K/V travel, rank distance between cp peers (= tp)
CP_ATTRS = ("context_parallel", "cp_comm", "cp_stride")


class ContextParallelError(CompletionError):
    """A plan that context parallelism cannot split; names the field and the value."""


def chunk_len(seq_len: int, cp: int) -> int:
    """Tokens of one of the 2cp load-balancing chunks; ContextParallelError unless 2cp divides
    ``seq_len``."""
    if cp < 1 or seq_len < 1 or seq_len % (2 * cp):
        raise ContextParallelError(f"strategy field 'cp' = {cp}: seq_len {seq_len} must be a "
                                   f"multiple of 2 * cp = {2 * cp} (causal load balancing cuts "
                                   f"the sequence into 2 * cp chunks)")
    return seq_len // (2 * cp)


def rank_positions(seq_len: int, cp: int, c: int) -> list[int]:
    """Global token positions cp rank ``c`` holds, in its local order: chunk c, then chunk
    2cp-1-c (each ``seq_len / 2cp`` tokens). Raises ContextParallelError for a bad rank or
    a sequence 2cp does not divide."""
    n = chunk_len(seq_len, cp)
    if not 0 <= c < cp:
        raise ContextParallelError(f"cp rank {c} is outside 0..{cp - 1}")
    first, second = c * n, (2 * cp - 1 - c) * n
    return list(range(first, first + n)) + list(range(second, second + n))


def zigzag_order(seq_len: int, cp: int) -> list[int]:
    """The global positions of the cp ranks' tokens one rank after another (rank 0's, then
    rank 1's, ...): a permutation of 0..seq_len-1."""
    return [p for c in range(cp) for p in rank_positions(seq_len, cp, c)]


def check_context_parallel(source: Any, strategy: Any) -> None:
    """Legality of ``strategy.cp`` on a model source: cp > 1 needs a model built from a config
    (a given program has its own, unsplit sequence), ``seq_len`` divisible by 2cp (load
    balancing), and the fused attention (checked by Strategy). Raises ContextParallelError."""
    cp = strategy.cp
    if cp == 1:
        return
    if source.is_program:
        raise ContextParallelError(f"strategy field 'cp' = {cp}: context parallelism needs a model "
                                   f"built from a config; program {source.name!r} has its own sequence")
    chunk_len(source.seq_len, cp)
    cfg = source.config
    for field, on in (("attention_sinks", getattr(cfg, "attention_sinks", False)),
                      ("attention_chunk", (getattr(cfg, "attention_chunk", None) or source.seq_len) < source.seq_len)):
        if on:
            raise ContextParallelError(f"strategy field 'cp' = {cp}: model {source.name!r} has {field} "
                                       f"({getattr(cfg, field)}); ring attention with attention sinks or "
                                       "chunked attention is not modelled")


def fold_strategy(strategy: Any) -> Any:
    """The strategy the program of a cp plan is built for (module docstring): dp * cp
    data-parallel replicas, cp = 1, and the global batch counted in ``seq_len / cp``-token
    sequences (``global_batch_size * cp``), so micro-batches per step and tokens per step
    are unchanged. An HSDP shard group of N dp ranks becomes N * cp folded ranks (the cp
    ranks of its replicas: torchtitan shards over ``dp_shard * cp``, its ``fsdp`` mesh dim,
    b5bcd76 ``torchtitan/distributed/parallel_dims.py``). The identity for cp = 1."""
    s = strategy
    if s.cp == 1:
        return s
    shard = getattr(s, "fsdp_shard_size", None)
    kw = {} if shard is None else {"fsdp_shard_size": shard * s.cp}
    return s.replace(dp=s.dp * s.cp, cp=1, cp_comm="p2p", global_batch_size=s.global_batch_size * s.cp, **kw)


def fold_source(source: Any, cp: int) -> Any:
    """The model source with ``seq_len / cp`` tokens per sequence (the identity for cp = 1).
    Learned position tables keep the model's length (``config.seq_len``)."""
    if cp == 1:
        return source
    return replace(source, seq_len=source.seq_len // cp)


def mark_attention(program: Program, strategy: Any) -> int:
    """Set :data:`CP_ATTRS` on every ``flash_attention`` / ``flash_attention_grad`` op of a
    program built for :func:`fold_strategy` of ``strategy`` (cp > 1). Returns how many ops
    were marked; ContextParallelError when the program has none (an attention that is not a
    fused kernel cannot run blockwise)."""
    n = 0
    for op in program.ops:
        if op.type in CP_OP_TYPES:
            op.attrs.update(context_parallel=strategy.cp, cp_comm=strategy.cp_comm,
                            cp_stride=strategy.tp)
            n += 1
    if n == 0:
        raise ContextParallelError(f"strategy field 'cp' = {strategy.cp}: the program has no "
                                   "flash_attention op to run blockwise over the cp group")
    return n


def cp_group(rank: int, cp: int, stride: int) -> tuple[int, ...]:
    """The cp peers of ``rank`` (itself included, in cp-rank order) in the layout of
    :func:`fold_strategy`: rank = base + (d * cp + c) * stride + t with stride = tp."""
    slot, t = divmod(rank, stride)
    base = (slot // cp) * cp
    return tuple((base + c) * stride + t for c in range(cp))


__all__ = ["CP_ATTRS", "CP_OP_TYPES", "ContextParallelError", "check_context_parallel",
           "chunk_len", "cp_group", "fold_source", "fold_strategy", "mark_attention",
           "rank_positions", "zigzag_order"]

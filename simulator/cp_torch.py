"""Context-parallel attention as PyTorch's experimental ring runs it under torchtitan
(``torch/distributed/tensor/experimental/_attention.py``, the load-balanced ring of
PR 132442 (2024-08) that torch 1963fc8 (2024-12-23, the torchtitan_2412 rows) ships;
read at the stored versions f2127db and the ``PRE_ALL_GATHER`` one, whose loops are
the same), per rank per attention op per micro-batch.

What the code launches (functions of ``_attention.py``):

- **K/V as SDPA sees them**: torchtitan 9dec370 ``models/llama/model.py``
  ``Attention.forward`` repeats K and V to all query heads (``repeat_kv``) before
  ``F.scaled_dot_product_attention``, so every exchanged K/V block carries ``n_heads``
  heads, not ``n_kv_heads`` (:func:`exchanged_heads`; 4x the bytes for Llama 3.1 8B).
- **Kernels per step** (``_templated_ring_attention``): cp SDPA launches of the flash
  backend (torchtitan ``utils.get_train_context`` restricts SDPA to flash / efficient under
  cp): step 0 causal on the rank's own chunks, steps 1..cp-1 non-causal on half of q or
  half of k/v (``_is_causal_behavior`` with ``enable_load_balance``): no masked block is
  computed, so the executed FLOPs are the balanced causal share ``simulator.op_cost``
  charges already.
- **Merge** (``_SDPAMerger``, ``convert_to_f32 = True``): each step's output is upcast to
  fp32 and merged by the sigmoid / logsigmoid rescale, the partial (half-q) steps write
  the whole fp32 output back through ``_partial_update`` (``torch.cat``); the result is
  cast back to bf16. Backward (``_templated_ring_attention_backward``): fp32 accumulators
  of dq, dk, dv (``torch.zeros_like``), each step's gradients added into them
  (``_partial_update`` for the half steps), dk/dv concatenated (``torch.cat``) and sent on;
  cast back at the end. Memory-bound kernels: :func:`merge_bytes`.
- **Exchange** (:func:`comm_time`): ``rotate_method`` ``allgather`` (``cp_comm =
  "all_gather"``, torchtitan's default) all_gathers the cp K/V blocks once
  (``_AllGatherRotater``), ``alltoall`` (``cp_comm = "p2p"``) permutes one block per step
  (``_AllToAllRotater``, ``ft_c.permute_tensor``); backward does the same for K/V and
  always permutes the fp32 dK/dV (``dkv_rotater``, ALL_TO_ALL) after each of the cp steps.
  In eager mode ``ft_c`` returns an ``AsyncCollectiveTensor`` waited at first use (the
  next step), so a send overlaps the step beside it (a step is ``1 / cp`` of the op's
  work); the dK/dV of the last step is waited after the loop (exposed). Under
  torch.compile (torchtitan compiles each TransformerBlock, ``apply_compile``) the ring is
  traced and ``ft_c._maybe_wrap_tensor`` inserts ``wait_tensor`` right after every
  collective (``_are_we_tracing``); Inductor does not move it
  (``reorder_for_compute_comm_overlap`` off by default in 2024), so every exchange is
  exposed.

Not modelled: the lse tensors (b * heads * s fp32, 1/d of the output: their kernels move a
negligible share), the ``repeat_kv`` copy itself, the host-side DTensor dispatch.
"""

from __future__ import annotations

from typing import Any

from completion.context_parallel import cp_group
from completion.dtypes import DTYPE_BYTES
from simulator.context_parallel import cp_settings
from simulator.errors import SimulatorError
from simulator.op_signature import OpSig

#: bytes of the fp32 accumulators and merged output (``_ContextParallelOptions.convert_to_f32``)
F32 = 4


def _elems(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def exchanged_heads(sig: OpSig) -> int:
    """Heads of the K/V tensors SDPA receives: the query heads (torchtitan's ``repeat_kv``
    before SDPA, module docstring). Raises SimulatorError without q [b, s, heads, d]."""
    q = sig.ins[0]
    if q is None or len(q.shape) != 4:
        raise SimulatorError(f"{sig.type}: context parallelism needs q of shape [batch, seq, heads, head_dim]")
    return int(q.shape[2])


def out_elems(sig: OpSig) -> int:
    """Elements of the rank's attention output (= its q): b * (s / cp) * heads * head_dim."""
    q = sig.ins[0]
    if q is None:
        raise SimulatorError(f"{sig.type}: context parallelism needs q")
    return _elems(tuple(q.shape))


def kv_elems(sig: OpSig) -> int:
    """Elements of one of the rank's K or V as SDPA sees them: b * (s / cp) * heads_q *
    head_dim (K/V repeated to the query heads, :func:`exchanged_heads`)."""
    k = sig.ins[1]
    if k is None or len(k.shape) != 4:
        raise SimulatorError(f"{sig.type}: context parallelism needs k of shape [batch, seq, heads, head_dim]")
    b, s, _, d = k.shape
    return b * s * exchanged_heads(sig) * d


def kv_block_bytes(sig: OpSig) -> int:
    """Bytes of one exchanged K/V block (``torch.cat([key.flatten(), value.flatten()])``):
    2 * :func:`kv_elems` * the K dtype's bytes."""
    k = sig.ins[1]
    return 2 * kv_elems(sig) * DTYPE_BYTES.get(k.dtype if k is not None else "bfloat16", 2)


def dkv_block_bytes(sig: OpSig) -> int:
    """Bytes of one dK/dV block the backward permutes: 2 * :func:`kv_elems` * 4 (the fp32
    accumulators, ``accum_dtype``)."""
    return 2 * kv_elems(sig) * F32


def merge_bytes(sig: OpSig, compiled: bool) -> float:
    """Bytes the merge and accumulation kernels of one attention op move on the heaviest
    rank (cp rank cp - 1, whose steps 1..cp-1 all cover its whole q: ``i <= rank``; the ranks
    meet at every exchange, so the slowest sets the pace); 0 for cp = 1. O = output
    elements, K = :func:`kv_elems`, activation dtype 2 bytes, fp32 4.

    Forward (``_SDPAMerger``): eager, one kernel per tensor op: step 0's upcast (read 2,
    write 4 per element), per later step the upcast (6), ``out - block_out`` (read 4 + 4,
    write 4: 12), the product with the sigmoid (read 4, write 4: 8) and the subtraction
    (12), 38 in all; the final cast (read 4, write 2: 6): (12 + 38 (cp - 1)) O. Compiled
    (Inductor fuses each step's chain into one pass, approx.): per later step read the fp32
    output and the bf16 block, write the output (10): (12 + 10 (cp - 1)) O.

    Backward (``_templated_ring_attention_backward``), eager: zeros of dq, dk, dv
    (4 O + 8 K); dq accumulated each step (read 4 + 2, write 4: 10 O per step, cp steps);
    step 0's dk, dv added (10 K each) and concatenated for the send (read 8, write 8: 16 K);
    each later step's ``_partial_update`` of dk and dv (add into the first half: read 2 + 1,
    write 2; ``torch.cat``: read 4, write 4: 13 K each) and the concatenation (16 K); the
    final casts (dq 6 O, dk/dv read 8 write 4: 12 K): (10 + 10 cp) O + (56 + 42 (cp - 1)) K.
    Compiled (one pass per step, approx.): dq (6 O at step 0, 10 O later, 6 O cast), dk/dv
    (step 0 read the bf16 gradients, write the fp32 send buffer: 12 K; later read the
    received fp32 buffer and the bf16 half gradients, write the send buffer: 18 K; cast
    12 K): (12 + 10 (cp - 1)) O + (24 + 18 (cp - 1)) K."""
    cp, _, _ = cp_settings(sig)
    if cp == 1:
        return 0.0
    o = out_elems(sig)
    if not sig.type.endswith("_grad"):
        return float((12 + (10 if compiled else 38) * (cp - 1)) * o)
    k = kv_elems(sig)
    if compiled:
        return float((12 + 10 * (cp - 1)) * o + (24 + 18 * (cp - 1)) * k)
    return float((10 + 10 * cp) * o + (56 + 42 * (cp - 1)) * k)


def workspace_bytes(sig: OpSig) -> int:
    """Extra bytes one attention op holds while the ring runs (beyond its own operands and
    results); 0 for cp = 1. K/V: ``all_gather`` the gathered buffer of cp
    :func:`kv_block_bytes` blocks (``_AllGatherRotater``), ``p2p`` the block received and
    the concatenated one being sent (2 blocks). Forward: the fp32 merged output and the
    fp32 upcast block (2 * 4 O bytes). Backward: the fp32 dq, dk, dv accumulators (4 O +
    8 K) and the dK/dV blocks sent and received (2 :func:`dkv_block_bytes`)."""
    cp, comm, _ = cp_settings(sig)
    if cp == 1:
        return 0
    kv = (cp if comm == "all_gather" else 2) * kv_block_bytes(sig)
    o = out_elems(sig)
    if not sig.type.endswith("_grad"):
        return kv + 2 * F32 * o
    return kv + F32 * o + 2 * F32 * kv_elems(sig) + 2 * dkv_block_bytes(sig)


def _group(sig: OpSig, rank: int, offset: int) -> list[int]:
    cp, _, stride = cp_settings(sig)
    return [r + offset for r in cp_group(rank, cp, stride)]


def _permute_time(nbytes: float, cluster: Any, group: list[int]) -> float:
    """Seconds of one ``permute_tensor`` (each rank sends ``nbytes`` to the next of the
    ring): the slowest edge's ``Cluster.p2p_time``."""
    n = len(group)
    return max(cluster.p2p_time(nbytes, group[i], group[(i + 1) % n]) for i in range(n))


def comm_time(sig: OpSig, attention_s: float, cluster: Any, rank: int, offset: int = 0,
              compiled: bool = True) -> tuple[float, float]:
    """(exposed, alone) seconds of the exchange of one attention op (module docstring);
    ``attention_s`` the op's attention kernel seconds (a step is ``attention_s / cp``).
    Forward, ``all_gather``: one all_gather of cp :func:`kv_block_bytes` blocks
    (``Cluster.collective_time``, nccl-tests size); ``p2p``: cp - 1 permutes of a block.
    Backward: the same for K/V, plus cp permutes of a :func:`dkv_block_bytes` block.
    Compiled: everything exposed. Eager: each send hidden behind the step beside it
    (exposed ``max(0, t - attention_s / cp)``), the last dK/dV exposed whole. (0, 0) for
    cp = 1."""
    cp, comm, _ = cp_settings(sig)
    if cp == 1:
        return 0.0, 0.0
    group = _group(sig, rank, offset)
    step = attention_s / cp
    sends: list[float] = []
    if comm == "all_gather":
        sends.append(cluster.collective_time("all_gather", cp * kv_block_bytes(sig), group))
    else:
        sends += [_permute_time(kv_block_bytes(sig), cluster, group)] * (cp - 1)
    last = 0.0
    if sig.type.endswith("_grad"):
        t_dkv = _permute_time(dkv_block_bytes(sig), cluster, group)
        sends += [t_dkv] * (cp - 1)
        last = t_dkv
    alone = sum(sends) + last
    if compiled:
        return alone, alone
    return sum(max(0.0, t - step) for t in sends) + last, alone


__all__ = ["F32", "comm_time", "dkv_block_bytes", "exchanged_heads", "kv_block_bytes",
           "kv_elems", "merge_bytes", "out_elems", "workspace_bytes"]

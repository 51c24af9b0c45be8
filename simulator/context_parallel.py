"""Communication of context-parallel attention (``completion.context_parallel``), per rank
per attention op per micro-batch.

Ring attention (``cp_comm = "p2p"``; Liu et al. 2023, sec. 3; Megatron-LM / Transformer
Engine ``AttnFuncWithCPAndKVP2P``): the forward runs cp blockwise steps; before step i+1 a
rank must have received the next K/V block, sent by its ring predecessor while step i
computes. One block is the rank's K and V, ``2 * b * (s / cp) * kv_heads * head_dim * bytes``
(:func:`kv_block_bytes`). Forward: cp - 1 sends of a block; backward: cp - 1 sends of the
K/V block and cp - 1 of the accumulated dK/dV block, twice the forward's bytes
(:func:`ring_volume`). Each send overlaps the step's blockwise attention, so the exposed
part per step is max(0, t_send - t_step) with t_step = t_attention / cp (load balancing
makes the steps equal; :func:`ring_exposed_time`). A send goes to the ring neighbour; the
slowest edge of the ring bounds every step (``Cluster.p2p_time``).

All-gather K/V (``cp_comm = "all_gather"``; Megatron ``--cp-comm-type all_gather``,
Transformer Engine ``AttnFuncWithCPAndKVAllGather``): forward all_gathers the K/V blocks
over the cp group; backward all_gathers them again (they are not kept) and reduce-scatters
dK/dV. Not overlapped: the attention needs the whole K/V.

Memory (:func:`cp_workspace_bytes`): the ring keeps two K/V blocks in flight (the one being
received, the one being sent: double buffering), backward two K/V and two dK/dV blocks; the
all-gather variant holds the cp - 1 other blocks (backward: and their dK/dV).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from completion.context_parallel import cp_group
from completion.dtypes import DTYPE_BYTES
from simulator.errors import SimulatorError
from simulator.op_signature import OpSig
from simulator.types import Phase

#: attention op type -> the phase its communication belongs to
CP_PHASE: dict[str, Phase] = {"flash_attention": "F", "flash_attention_grad": "B"}


def cp_settings(sig: OpSig) -> tuple[int, str, int]:
    """(cp degree, cp_comm, cp_stride) of an attention op's signature; (1, "p2p", 1) without
    context parallelism. Raises SimulatorError for an unknown cp_comm."""
    cp = max(1, int(sig.attr("context_parallel", 1) or 1))
    comm = str(sig.attr("cp_comm", "p2p"))
    if comm not in COMM_TIME:
        raise SimulatorError(f"{sig.type}: cp_comm {comm!r} is none of {sorted(COMM_TIME)}")
    return cp, comm, max(1, int(sig.attr("cp_stride", 1) or 1))


def kv_block_bytes(sig: OpSig) -> int:
    """Bytes of one K/V block: the rank's local k and v ([b, s/cp, kv_heads, head_dim]
    each), 2 * b * (s/cp) * kv_heads * head_dim * dtype bytes."""
    total = 0
    for t in sig.ins[1:3]:
        if t is None:
            raise SimulatorError(f"{sig.type}: context parallelism needs k and v")
        n = 1
        for d in t.shape:
            n *= d
        total += n * DTYPE_BYTES.get(t.dtype, 4)
    return total


def ring_volume(sig: OpSig) -> int:
    """Bytes one rank sends for one attention op under ring attention: (cp - 1) K/V blocks
    forward, 2 (cp - 1) backward (K/V and dK/dV); 0 for cp = 1."""
    cp, _, _ = cp_settings(sig)
    factor = 2 if sig.type.endswith("_grad") else 1
    return factor * (cp - 1) * kv_block_bytes(sig)


def _ring_edges(rank: int, cp: int, stride: int, offset: int) -> list[tuple[int, int]]:
    g = [r + offset for r in cp_group(rank, cp, stride)]
    return [(g[i], g[(i + 1) % cp]) for i in range(cp)]


def ring_exposed_time(sig: OpSig, attention_s: float, cluster: Any, rank: int,
                      offset: int = 0) -> tuple[float, float]:
    """(exposed seconds, seconds of the sends alone) of ring attention for one op: cp - 1
    steps, each max(0, t_send - attention_s / cp) exposed; t_send the slowest ring edge's
    ``Cluster.p2p_time`` of the step's block (a K/V block forward; K/V and dK/dV backward,
    sent together)."""
    cp, _, stride = cp_settings(sig)
    if cp == 1:
        return 0.0, 0.0
    per_step = ring_volume(sig) / (cp - 1)
    t_send = max(cluster.p2p_time(per_step, a, b) for a, b in _ring_edges(rank, cp, stride, offset))
    t_step = attention_s / cp
    return (cp - 1) * max(0.0, t_send - t_step), (cp - 1) * t_send


def all_gather_time(sig: OpSig, attention_s: float, cluster: Any, rank: int,
                    offset: int = 0) -> tuple[float, float]:
    """(exposed, alone) seconds of the all-gather variant (module docstring): forward one
    all_gather of the cp K/V blocks; backward an all_gather and a reduce_scatter of them.
    ``Cluster.collective_time`` on the cp group, buffers of cp blocks (nccl-tests size)."""
    cp, _, stride = cp_settings(sig)
    if cp == 1:
        return 0.0, 0.0
    group = [r + offset for r in cp_group(rank, cp, stride)]
    full = cp * kv_block_bytes(sig)
    t = cluster.collective_time("all_gather", full, group)
    if sig.type.endswith("_grad"):
        t += cluster.collective_time("reduce_scatter", full, group)
    return t, t


COMM_TIME: dict[str, Callable[..., tuple[float, float]]] = {
    "p2p": ring_exposed_time, "all_gather": all_gather_time}


def cp_comm_time(sig: OpSig, attention_s: float, cluster: Any, rank: int,
                 offset: int = 0) -> tuple[float, float]:
    """(exposed, alone) seconds of the cp communication of one attention op (its
    ``cp_comm``); (0, 0) without context parallelism."""
    _, comm, _ = cp_settings(sig)
    return COMM_TIME[comm](sig, attention_s, cluster, rank, offset)


def cp_workspace_bytes(sig: OpSig) -> int:
    """Extra bytes an attention op holds while it runs under context parallelism (module
    docstring): ring: 2 blocks forward, 4 backward; all-gather: cp - 1 blocks forward,
    2 (cp - 1) backward; 0 for cp = 1."""
    cp, comm, _ = cp_settings(sig)
    if cp == 1:
        return 0
    blocks = 2 if comm == "p2p" else cp - 1
    return blocks * (2 if sig.type.endswith("_grad") else 1) * kv_block_bytes(sig)


__all__ = ["CP_PHASE", "COMM_TIME", "all_gather_time", "cp_comm_time", "cp_settings",
           "cp_workspace_bytes", "kv_block_bytes", "ring_exposed_time", "ring_volume"]

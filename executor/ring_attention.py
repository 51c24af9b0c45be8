"""Context-parallel attention on torch.distributed: ring attention and all-gather K/V.

Each of the cp ranks of a group holds ``s/cp`` tokens of every sequence, load-balanced for
the causal mask (``completion.context_parallel.rank_positions``: cp rank c holds chunks c and
2cp-1-c of 2cp), as q, k, v ``[b, s/cp, heads, head_dim]`` (k/v may have fewer heads: GQA,
query head i reads kv head ``i // (hq / hkv)``); scale 1/sqrt(head_dim); a query at global
position p sees the keys at positions <= p.

Ring attention (:func:`ring_attention`, :func:`ring_attention_grad`; Liu et al. 2023, "Ring
Attention with Blockwise Transformers", sec. 3; Megatron-LM / Transformer Engine
``AttnFuncWithCPAndKVP2P``):

- forward, cp steps: in step i rank c holds the K/V block of cp rank (c - i) mod cp; it posts
  the send of that block to rank c+1 and the receive of the next from rank c-1, computes the
  blockwise attention of its queries against the block it holds (positions decide the
  mask), and merges it into its running result by the log-sum-exp (out = sum_j
  exp(lse_j - lse) out_j, lse = log sum_j exp(lse_j); Milakov & Gimelshein 2018). The
  transfer runs beside the block's compute (asynchronous ``isend`` / ``irecv``).
- backward, the same ring: with the final out and lse every block's gradient is independent
  (FlashAttention-2 backward, Dao 2023, Algorithm 2: P = exp(S - lse), dV = P^T dO,
  dP = dO V^T, D = rowsum(dO * O), dS = P (dP - D), dQ = dS K / sqrt(d), dK = dS^T Q /
  sqrt(d)); dQ accumulates locally, and the dK/dV of block j travel with it: the owner keeps
  its own step-0 part, ranks j+1 .. j+cp-1 add theirs to an accumulator passed along the ring
  (cp - 1 sends), the last one sends it back to the owner. Sends per rank: cp - 1 K/V blocks
  forward; cp - 1 K/V blocks and cp - 1 dK/dV blocks backward
  (``simulator.context_parallel.ring_volume``).

All-gather K/V (:func:`all_gather_attention`, :func:`all_gather_attention_grad`; Megatron
``--cp-comm-type all_gather``): the K/V blocks are all-gathered over the group, the queries
attend to the whole sequence; backward all-gathers them again and sums each block's dK/dV
onto its owner (an all_reduce and the own slice: gloo has no reduce_scatter).

Blocks are computed whole with the mask (a CPU reference: no masked-block skipping); math in
float32 (float64 inputs: float64).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.distributed as dist

from completion.context_parallel import rank_positions
from executor.errors import ExecutorError


class RingAttentionError(ExecutorError, ValueError):
    """Inconsistent shapes, group or rank for context-parallel attention; names them."""


def _compute_dtype(t: torch.Tensor) -> torch.dtype:
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def _heads(q: torch.Tensor, k: torch.Tensor) -> int:
    for name, t in (("q", q), ("k", k)):
        if t.ndim != 4:
            raise RingAttentionError(f"{name} must be [batch, seq, heads, head_dim], got {list(t.shape)}")
    hq, hkv = q.shape[2], k.shape[2]
    if hkv == 0 or hq % hkv:
        raise RingAttentionError(f"{hq} query heads are not a multiple of {hkv} kv heads")
    return hq // hkv


def _expand(t: torch.Tensor, rep: int, dt: torch.dtype) -> torch.Tensor:
    """[b, s, h, d] -> [b, h*rep, s, d] in ``dt``."""
    t = t.transpose(1, 2).to(dt)
    return t.repeat_interleave(rep, dim=1) if rep > 1 else t


def _scores(q: torch.Tensor, k: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor,
            causal: bool, window: int = 0) -> torch.Tensor:
    """Scaled scores [b, h, s_q, s_k] with keys after the query masked (-inf), and with a
    sliding ``window`` w > 0 the keys w or more positions before it (each query sees its w
    most recent keys, itself included: FlashAttention-2 ``window_size = (w - 1, 0)``, as
    ``executor.kernels.attention`` masks the whole sequence)."""
    s = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if causal:
        s = s.masked_fill(k_pos[None, :] > q_pos[:, None], float("-inf"))
    if window > 0:
        s = s.masked_fill(k_pos[None, :] <= q_pos[:, None] - window, float("-inf"))
    return s


def block_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_pos: torch.Tensor,
                    k_pos: torch.Tensor, causal: bool = True, window: int = 0
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of queries ``q`` [b, s_q, hq, d] at positions ``q_pos`` [s_q] against one
    K/V block [b, s_k, hkv, d] at ``k_pos`` [s_k]. Returns (out [b, hq, s_q, d], lse
    [b, hq, s_q]) in the compute dtype; a query that sees no key of the block gets out 0
    and lse -inf."""
    rep = _heads(q, k)
    dt = _compute_dtype(q)
    qt, kt, vt = _expand(q, 1, dt), _expand(k, rep, dt), _expand(v, rep, dt)
    s = _scores(qt, kt, q_pos, k_pos, causal, window)
    lse = torch.logsumexp(s, dim=-1)
    safe = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)
    p = torch.exp(s - safe[..., None])
    return torch.matmul(p, vt), lse


def merge_blocks(out: torch.Tensor, lse: torch.Tensor, out_b: torch.Tensor,
                 lse_b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge two partial attention results by their log-sum-exp (``lse`` must be finite:
    the running result, which always holds the query's own block)."""
    new = torch.logaddexp(lse, lse_b)
    out = out * torch.exp(lse - new)[..., None] + out_b * torch.exp(lse_b - new)[..., None]
    return out, new


def block_grads(q, k, v, out, lse, do, q_pos, k_pos, causal: bool = True, window: int = 0):
    """(dq, dk, dv) of one K/V block (module docstring; FlashAttention-2 Algorithm 2) from
    the final ``out`` [b, s_q, hq, d] and ``lse`` [b, hq, s_q]; dq [b, hq, s_q, d], dk/dv
    [b, hkv, s_k, d] in the compute dtype (kv-head gradients summed over their query heads)."""
    rep = _heads(q, k)
    dt = _compute_dtype(q)
    qt, kt, vt = _expand(q, 1, dt), _expand(k, rep, dt), _expand(v, rep, dt)
    ot, dot = _expand(out, 1, dt), _expand(do, 1, dt)
    p = torch.exp(_scores(qt, kt, q_pos, k_pos, causal, window) - lse.to(dt)[..., None])
    dv = torch.matmul(p.transpose(-1, -2), dot)
    dp = torch.matmul(dot, vt.transpose(-1, -2))
    ds = p * (dp - (dot * ot).sum(dim=-1, keepdim=True))
    scale = 1.0 / math.sqrt(q.shape[-1])
    dq = torch.matmul(ds, kt) * scale
    dk = torch.matmul(ds.transpose(-1, -2), qt) * scale
    if rep > 1:
        b, h, sk, d = dk.shape
        dk = dk.reshape(b, h // rep, rep, sk, d).sum(dim=2)
        dv = dv.reshape(b, h // rep, rep, sk, d).sum(dim=2)
    return dq, dk, dv


def _index(group: Sequence[int], rank: int) -> tuple[int, int]:
    g = list(group)
    if rank not in g or len(set(g)) != len(g):
        raise RingAttentionError(f"rank {rank} is not once in the cp group {g}")
    return g.index(rank), len(g)


def _positions(s_local: int, cp: int, c: int, device) -> torch.Tensor:
    return torch.tensor(rank_positions(s_local * cp, cp, c), device=device)


def _exchange(send: torch.Tensor, nxt: int, prv: int, pg=None):
    """Post the send of ``send`` to ``nxt`` and the receive of a block like it from ``prv``;
    returns (receive buffer, work handles)."""
    recv = torch.empty_like(send)
    ops = [dist.P2POp(dist.isend, send, nxt, group=pg), dist.P2POp(dist.irecv, recv, prv, group=pg)]
    return recv, dist.batch_isend_irecv(ops)


def _pack(k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """K and V as one tensor to send (concatenated on the head dim: v may have its own head
    size, multi-head latent attention); :func:`_unpack` splits it at ``d``, k's head size."""
    return torch.cat([k, v], dim=-1).contiguous()


def _unpack(kv: torch.Tensor, d: int) -> tuple[torch.Tensor, torch.Tensor]:
    return kv[..., :d], kv[..., d:]


def _out_layout(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """[b, h, s, d] -> [b, s, h, d] in ``like``'s dtype."""
    return t.transpose(1, 2).to(like.dtype).contiguous()


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: Sequence[int],
                   rank: int, causal: bool = True, pg=None, window: int = 0
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Ring-attention forward of this rank's load-balanced tokens (module docstring).

    Args: q [b, s/cp, hq, d], k/v [b, s/cp, hkv, d] (this rank's tokens in
    ``rank_positions`` order); ``group``: the cp group's global ranks in cp-rank order;
    ``rank``: this rank; ``pg``: the process group of ``group`` (None: the default group).
    Returns (out [b, s/cp, hq, d] in q's dtype, lse [b, hq, s/cp] float32/64). Raises
    RingAttentionError for a rank outside the group or mismatched heads."""
    c, cp = _index(group, rank)
    q_pos = _positions(q.shape[1], cp, c, q.device)
    out, lse = block_attention(q, k, v, q_pos, q_pos, causal, window)
    kv, d = _pack(k, v), k.shape[-1]
    nxt, prv = group[(c + 1) % cp], group[(c - 1) % cp]
    for i in range(1, cp):
        kv, works = _exchange(kv, nxt, prv, pg)
        for w in works:
            w.wait()
        j = (c - i) % cp
        ob, lb = block_attention(q, *_unpack(kv, d), q_pos, _positions(q.shape[1], cp, j, q.device), causal, window)
        out, lse = merge_blocks(out, lse, ob, lb)
    return _out_layout(out, q), lse


def ring_attention_grad(q, k, v, out, lse, do, group: Sequence[int], rank: int,
                        causal: bool = True, pg=None, window: int = 0):
    """Ring-attention backward (module docstring): (dq, dk, dv) of this rank's q, k, v, in
    their dtypes and layouts. ``out`` [b, s/cp, hq, d] and ``lse`` [b, hq, s/cp] are the
    forward's results; ``do`` is the gradient of ``out``."""
    c, cp = _index(group, rank)
    q_pos = _positions(q.shape[1], cp, c, q.device)
    dq, dk_own, dv_own = block_grads(q, k, v, out, lse, do, q_pos, q_pos, causal, window)
    kv, d = _pack(k, v), k.shape[-1]
    nxt, prv = group[(c + 1) % cp], group[(c - 1) % cp]
    acc = None  # the dK/dV accumulator of the block held, received from the ring predecessor
    for i in range(1, cp):
        kv, works = _exchange(kv, nxt, prv, pg)
        if i > 1:  # the accumulator of block (c - i) left rank c - 1 after its step i - 1
            acc, more = _exchange(acc, nxt, prv, pg)
            works = list(works) + list(more)
        for w in works:
            w.wait()
        j = (c - i) % cp
        dqb, dkb, dvb = block_grads(q, *_unpack(kv, d), out, lse, do, q_pos,
                                    _positions(q.shape[1], cp, j, q.device), causal, window)
        dq = dq + dqb
        part = _pack(dkb, dvb)
        acc = part if i == 1 else acc + part
    if cp > 1:  # the last holder sends block (c + 1)'s accumulator home; ours comes from c - 1
        home, works = _exchange(acc.contiguous(), nxt, prv, pg)
        for w in works:
            w.wait()
        dk_home, dv_home = _unpack(home, d)
        dk_own, dv_own = dk_own + dk_home, dv_own + dv_home
    return _out_layout(dq, q), _out_layout(dk_own, k), _out_layout(dv_own, v)


def _gather_kv(k: torch.Tensor, v: torch.Tensor, cp: int, pg=None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    kv = _pack(k, v)
    parts = [torch.empty_like(kv) for _ in range(cp)]
    dist.all_gather(parts, kv, group=pg)
    return [_unpack(p, k.shape[-1]) for p in parts]


def _whole_kv(q, k, v, group: Sequence[int], rank: int, pg=None):
    """The whole sequence's K and V gathered from the cp group (concatenated in cp-rank
    order on the sequence dim), with this rank's query positions and all key positions."""
    c, cp = _index(group, rank)
    s = q.shape[1]
    parts = _gather_kv(k, v, cp, pg)
    kf = torch.cat([p[0] for p in parts], dim=1)
    vf = torch.cat([p[1] for p in parts], dim=1)
    k_pos = torch.cat([_positions(s, cp, j, q.device) for j in range(cp)])
    return kf, vf, _positions(s, cp, c, q.device), k_pos


def all_gather_attention(q, k, v, group: Sequence[int], rank: int, causal: bool = True, pg=None,
                         window: int = 0):
    """All-gather-K/V forward (module docstring); arguments and results as
    :func:`ring_attention`."""
    kf, vf, q_pos, k_pos = _whole_kv(q, k, v, group, rank, pg)
    out, lse = block_attention(q, kf, vf, q_pos, k_pos, causal, window)
    return _out_layout(out, q), lse


def all_gather_attention_grad(q, k, v, out, lse, do, group: Sequence[int], rank: int,
                              causal: bool = True, pg=None, window: int = 0):
    """All-gather-K/V backward (module docstring); as :func:`ring_attention_grad`."""
    c, s = _index(group, rank)[0], q.shape[1]
    kf, vf, q_pos, k_pos = _whole_kv(q, k, v, group, rank, pg)
    dq, dk, dv = block_grads(q, kf, vf, out, lse, do, q_pos, k_pos, causal, window)
    dkv = _pack(dk, dv)
    dist.all_reduce(dkv, group=pg)
    own_k, own_v = _unpack(dkv[:, :, c * s:(c + 1) * s], k.shape[-1])
    return _out_layout(dq, q), _out_layout(own_k, k), _out_layout(own_v, v)


#: cp_comm -> (forward, backward)
CP_ATTENTION = {"p2p": (ring_attention, ring_attention_grad),
                "all_gather": (all_gather_attention, all_gather_attention_grad)}

__all__ = ["CP_ATTENTION", "RingAttentionError", "all_gather_attention",
           "all_gather_attention_grad", "block_attention", "block_grads", "merge_blocks",
           "ring_attention", "ring_attention_grad"]

"""Einsum notations of the neural-network ops (``completion.ops.nn``): softmax,
log_softmax, swiglu, embedding, layer_norm, rms_norm, flash_attention,
fused_rotary_position_embedding, cross_entropy_with_softmax.

Layouts follow the op declarations in :mod:`completion.ops.nn`; the sharding semantics
follow Megatron-LM (vocab-parallel embedding and cross entropy, head-parallel attention;
Shoeybi et al. 2019, sec. 3) and Paddle's SPMD rules for the same ops.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from completion.spmd.core import LetterPool, Letters, Notation, norm_axis
from completion.spmd.elementwise import broadcast_letters, elementwise_unary, replicated_letters
from completion.spmd.rule import register_spmd_rule

Shapes = Sequence[tuple[int, ...] | None]


def _first(*shapes: tuple[int, ...] | None) -> tuple[int, ...]:
    return next((s for s in shapes if s is not None), ())


def embedding(op: str, ins: Shapes, outs: Shapes, attrs: dict[str, Any]) -> Notation:
    """``ids[...], weight[v, h] -> out[..., h]``: the vocab letter v is contracted, so a
    row-sharded (vocab-parallel) weight gives Partial(sum) (each rank looks up the ids in
    its vocab range and writes zeros elsewhere)."""
    pool = LetterPool()
    ids = ins[0] if ins[0] is not None else _first(outs[0])[:-1]
    il = pool.take(len(ids))
    v, h = pool.take(2)
    return Notation([il, (v, h)], [il + (h,)])


def _stat_letters(batch: Letters, shape: tuple[int, ...] | None) -> Letters:
    """Letters of a norm statistic (mean / variance / inv_var) of ``shape``: the batch
    letters when the ranks match, else one dim flattening all batch dims (``"a+b"``)."""
    if shape is not None and len(shape) == len(batch):
        return batch
    return ("+".join(batch),) if batch else ()


def _norm_notation(ins: Shapes, outs: Shapes, begin: int, n_stats: int) -> Notation:
    pool = LetterPool()
    x = _first(ins[0], outs[0] if outs else None)
    lt = pool.take(len(x))
    b = norm_axis(begin, len(lt)) if lt else 0
    batch, normed = lt[:b], lt[b:]
    rep = set(normed)
    affine: Letters = normed if len(normed) == 1 else (pool.one(),)
    rep.update(affine)
    inputs: list[Letters | None] = [lt] + [affine if s is not None else None for s in ins[1:]]
    outputs: list[Letters | None] = [lt]
    for j in range(n_stats):
        s = outs[1 + j] if len(outs) > 1 + j else None
        outputs.append(_stat_letters(batch, s))
    return Notation(inputs, outputs, rep)


def layer_norm(op: str, ins: Shapes, outs: Shapes, attrs: dict[str, Any]) -> Notation:
    """``x, scale, bias -> out, mean, variance``: the normalized dims (from
    ``begin_norm_axis``) are replicated; batch and sequence dims may be sharded (sequence
    parallel). Scale/bias gradients contract the batch letters, so they come out
    Partial(sum) over every mesh dim sharding batch or sequence (reference case 8)."""
    return _norm_notation(ins, outs, int(attrs.get("begin_norm_axis", 1)), 2)


def rms_norm(op: str, ins: Shapes, outs: Shapes, attrs: dict[str, Any]) -> Notation:
    """``x, norm_weight -> out, inv_var``: as :func:`layer_norm`."""
    return _norm_notation(ins, outs, int(attrs.get("begin_norm_axis", -1)), 1)


def flash_attention(op: str, ins: Shapes, outs: Shapes, attrs: dict[str, Any]) -> Notation:
    """``q[b,s,h,d], k[b,t,h,d], v[b,t,h,e], sinks?[h] -> out[b,s,h,e], softmax[b,h,s,t],
    softmax_lse[b,h,s], seed_offset[2]``: batch and heads may be sharded (heads only when
    the mesh dim divides the head counts; a single k/v head (MQA) is simply replicated);
    the sequence and head_dim letters are replicated. v's head size e is its own letter
    (multi-head latent attention: e = v_head_dim, d = qk_nope + qk_rope). The sinks (one
    logit per query head, GPT-OSS) follow the heads: a head-parallel (tensor-parallel)
    attention holds its heads' sinks, and their gradient sums over the batch and sequence.

    Context-parallel attention (attribute ``context_parallel`` > 1,
    ``completion.context_parallel``): the kernel exchanges K/V over the ranks that split the
    sequence (ring attention or all-gathered K/V), so q, k, v, out and softmax_lse may all be
    sharded on the sequence, with one letter for the query and key sequence (a sequence
    sharded on a mesh dim stays sharded there, no reshard before or after; it must split
    evenly). The softmax's key dim stays replicated."""
    pool = LetterPool()
    b, s, h, d, t, e = pool.take(6)
    cp = int(attrs.get("context_parallel", 1) or 1)
    if cp > 1:
        rep, kv_seq, div = {t, d, e}, s, frozenset({h, s})
    else:
        rep, kv_seq, div = {s, t, d, e}, t, frozenset({h})
    q, k, v = (b, s, h, d), (b, kv_seq, h, d), (b, kv_seq, h, e)
    seed = replicated_letters(outs[3] if len(outs) > 3 else (2,), pool, rep)
    outputs: list[Letters | None] = [(b, s, h, e), (b, h, s, t), (b, h, s), seed]
    inputs: list[Letters | None] = [q, k, v]
    if len(ins) > 3:
        inputs.append((h,) if ins[3] is not None else None)
    return Notation(inputs, outputs, rep, divisible=div, aux_outputs=frozenset({3}))


def rotary_embedding(op: str, ins: Shapes, outs: Shapes, attrs: dict[str, Any]) -> Notation:
    """``q, k?, v? [b,s,h,d], sin?, cos? ([1,s,1,d] or [s,d]), position_ids? [b,s] ->
    out_q, out_k, out_v``: batch, sequence and heads may be sharded, head_dim is
    replicated (rotation mixes its halves); sin/cos align right with q."""
    pool = LetterPool()
    b, s, h, d = pool.take(4)
    qkv: Letters = (b, s, h, d)
    rep = {d}
    inputs: list[Letters | None] = [qkv if ins[i] is not None else None for i in range(3)]
    for i in (3, 4):
        sh = ins[i] if len(ins) > i else None
        if sh is None:
            inputs.append(None)
        elif len(sh) == 4:
            inputs.append(qkv)  # [1, s, 1, d]: the unit dims are replicated
        elif len(sh) == 2:
            inputs.append((s, d))
        else:
            inputs.append(replicated_letters(sh, pool, rep))
    inputs.append((b, s) if len(ins) > 5 and ins[5] is not None else None)
    outputs: list[Letters | None] = [qkv if ins[i] is not None else None for i in range(3)]
    return Notation(inputs, outputs, rep, divisible=frozenset({h}))


def cross_entropy(op: str, ins: Shapes, outs: Shapes, attrs: dict[str, Any]) -> Notation:
    """``input[..., C, ...], label -> softmax, loss``: batch/sequence letters may be
    sharded and so may the class letter C (vocab-parallel cross entropy, Megatron-LM
    ``vocab_parallel_cross_entropy``: max, sum-exp and the target logit are all-reduced
    inside the kernel, so the loss is not Partial). A hard label has a size-1 class dim."""
    pool = LetterPool()
    x = _first(ins[0], outs[0] if outs else None)
    lt = pool.take(len(x))
    a = norm_axis(int(attrs.get("axis", -1)), len(lt)) if lt else 0
    cls = lt[a] if lt else ""
    red = tuple(pool.one() if i == a else L for i, L in enumerate(lt))
    label = lt if attrs.get("soft_label") else red
    return Notation([lt, label], [lt, red], internal=frozenset({cls}))



def softmax(op: str, ins: Shapes, outs: Shapes, attrs: dict[str, Any]) -> Notation:
    """``softmax`` / ``log_softmax``: the softmax axis is replicated."""
    nt = elementwise_unary(op, ins, outs, attrs)
    lt = nt.inputs[0] or ()
    if lt:
        nt.replicated.add(lt[norm_axis(int(attrs.get("axis", -1)), len(lt))])
    return nt


def swiglu(op: str, ins: Shapes, outs: Shapes, attrs: dict[str, Any]) -> Notation:
    """``swiglu(x, y)``: elementwise; with y null, x's last dim holds both halves and is
    replicated."""
    if len(ins) > 1 and ins[1] is not None:
        pool = LetterPool()
        lts, out = broadcast_letters(list(ins[:2]), pool)
        return Notation(lts, [out])
    pool = LetterPool()
    x = ins[0] if ins and ins[0] is not None else (outs[0] or ())
    lt = pool.take(len(x))
    out = lt[:-1] + (pool.one(),) if lt else lt
    rep = {lt[-1], out[-1]} if lt else set()
    return Notation([lt, None], [out], rep)


register_spmd_rule("embedding", embedding)
register_spmd_rule("layer_norm", layer_norm)
register_spmd_rule("rms_norm", rms_norm)
register_spmd_rule("flash_attention", flash_attention)
register_spmd_rule("rotary_embedding", rotary_embedding)
register_spmd_rule("cross_entropy", cross_entropy)
register_spmd_rule("softmax", softmax)
register_spmd_rule("swiglu", swiglu)

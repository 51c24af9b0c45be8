"""Context-parallel attention on 2 and 4 gloo ranks equals one process (issue 17 item 2).

Each rank holds its load-balanced tokens (chunks c and 2cp-1-c of 2cp) of a causal GQA
attention; the reference is torch's own ``scaled_dot_product_attention`` (is_causal) on the
whole sequence in one process, differentiated by autograd: an implementation independent of
``executor.ring_attention``. Forward and backward must agree to 1e-6 in float32."""

from __future__ import annotations

import pytest
import torch

from completion.context_parallel import rank_positions
from executor.launch import launch

B, S, HQ, HKV, D = 2, 48, 4, 2, 8


def _inputs(seed: int = 0, dtype: torch.dtype = torch.float64):
    g = torch.Generator().manual_seed(seed)
    shapes = ((B, S, HQ, D), (B, S, HKV, D), (B, S, HKV, D), (B, S, HQ, D))
    return tuple((0.5 * torch.randn(*sh, generator=g, dtype=torch.float64)).to(dtype) for sh in shapes)


def _reference():
    """out, dq, dk, dv of causal attention on the whole sequence ([b, s, h, d] layout),
    float64."""
    q, k, v, do = (t.clone() for t in _inputs())
    for t in (q, k, v):
        t.requires_grad_(True)
    rep = HQ // HKV
    out = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2).repeat_interleave(rep, 1),
        v.transpose(1, 2).repeat_interleave(rep, 1), is_causal=True).transpose(1, 2)
    out.backward(do)
    return out.detach(), q.grad, k.grad, v.grad


CASES = [(comm, dt) for comm in ("p2p", "all_gather") for dt in (torch.float32, torch.float64)]
TOL = {torch.float32: 1e-6, torch.float64: 1e-12}


def _rank(rank: int, nproc: int):
    from executor.ring_attention import CP_ATTENTION

    idx = torch.tensor(rank_positions(S, nproc, rank))
    group = list(range(nproc))
    out = []
    for comm, dt in CASES:
        fwd, bwd = CP_ATTENTION[comm]
        q, k, v, do = (t[:, idx].contiguous() for t in _inputs(dtype=dt))
        o, lse = fwd(q, k, v, group, rank)
        out.append((o, *bwd(q, k, v, o, lse, do, group, rank)))
    return out


@pytest.mark.parametrize("nproc", [2, 4])
def test_cp_attention_equals_one_process(nproc):
    """Ring attention and all-gather K/V, causal with load balancing, on nproc gloo ranks:
    every rank's out, dq, dk, dv equal the one-process values at its positions (float32:
    <= 1e-6, float64: <= 1e-12)."""
    ref = _reference()
    results = launch(_rank, nproc, timeout=240)
    for c, per_case in enumerate(results):
        idx = torch.tensor(rank_positions(S, nproc, c))
        for (comm, dt), got in zip(CASES, per_case, strict=True):
            for name, g, r in zip(("out", "dq", "dk", "dv"), got, ref, strict=True):
                assert g.dtype == dt and g.shape == r[:, idx].shape
                err = (g.double() - r[:, idx]).abs().max().item()
                assert err <= TOL[dt], f"cp rank {c}/{nproc} {comm} {dt}: {name} differs by {err:.2e}"


def test_block_merge_equals_whole_attention():
    """Merging the blockwise results of two K/V halves by their log-sum-exp gives the
    attention over the whole K/V (one process, no communication)."""
    from executor.ring_attention import block_attention, merge_blocks

    q, k, v, _ = _inputs()
    pos = torch.arange(S)
    whole, lse = block_attention(q, k, v, pos, pos)
    h = S // 2
    o1, l1 = block_attention(q, k[:, :h], v[:, :h], pos, pos[:h])
    o2, l2 = block_attention(q, k[:, h:], v[:, h:], pos, pos[h:])
    o, l_ = merge_blocks(o1, l1, o2, l2)
    assert torch.allclose(o, whole, atol=1e-12) and torch.allclose(l_, lse, atol=1e-12)
    ref = _reference()[0]
    assert (whole.transpose(1, 2) - ref).abs().max().item() <= 1e-12

"""PyTorch's experimental context-parallel ring under torchtitan (``simulator.cp_torch``,
``simulator.cp_impls``): K/V repeated to the query heads, the fp32 merge and accumulation
kernels (their bytes counted op by op with torch's dispatcher on an independent rewrite of
the loops), the exchange exposed under torch.compile and hidden in eager mode, and the
profile field that selects the implementation."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

from clusters import load_cluster
from completion.models.config import ModelConfig
from completion.models.source import resolve_model
from completion.plan_program import build_plan_program
from completion.strategy import Strategy
from simulator.cp_impls import CP_IMPLS, DEFAULT_CP_IMPL, cp_impl
from simulator.cp_torch import (
    comm_time,
    dkv_block_bytes,
    kv_block_bytes,
    kv_elems,
    merge_bytes,
    out_elems,
    workspace_bytes,
)
from simulator.errors import SimulatorError
from simulator.op_signature import op_signature
from simulator.profiles import load_profile
from simulator.profiles.spec import ProfileSpec

L8B = ModelConfig(name="l8b", family="llama", num_layers=3, hidden_size=4096, num_heads=32,
                  num_kv_heads=8, ffn_hidden_size=14336, vocab_size=128256, seq_len=8192)


def _attention(cp: int, comm: str = "all_gather"):
    """(forward, backward) signatures of rank 0's first attention op: Llama 3.1 8B shapes,
    sequence 8192 over cp ranks."""
    s = Strategy(dp=1, cp=cp, micro_batch_size=1, global_batch_size=1,
                 cp_comm=comm if cp > 1 else "p2p", attention="flash")  # no exchange at cp 1
    pp = build_plan_program(resolve_model(L8B), s, representative=True, resolve_reshards=False)
    ops = pp.program.ops
    f = next(op for op in ops if op.type == "flash_attention")
    b = next(op for op in ops if op.type == "flash_attention_grad")
    return op_signature(f, 0), op_signature(b, 0)


def test_kv_repeated_to_query_heads():
    """cp 4 of 8192 tokens: 2048 local tokens; SDPA gets K and V with all 32 query heads
    (torchtitan's repeat_kv), not the 8 KV heads: one K is 2048 * 32 * 128 = 8,388,608
    elements, a bf16 K/V block 2 * 8,388,608 * 2 = 32 MiB (4x the 8 MiB of 8 heads), the
    fp32 dK/dV block 64 MiB."""
    fwd, _ = _attention(4)
    assert out_elems(fwd) == kv_elems(fwd) == 2048 * 32 * 128 == 8_388_608
    assert kv_block_bytes(fwd) == 32 * 2**20
    assert dkv_block_bytes(fwd) == 64 * 2**20


def test_merge_bytes_by_hand():
    """cp 4, O = K = 8,388,608 elements. Forward compiled: step 0's upcast (2 + 4 bytes per
    element) and the final cast (4 + 2): 12 O, plus 10 O for each of the 3 later steps:
    42 O = 352,321,536 bytes; eager 12 O + 3 * 38 O = 126 O. Backward compiled: dq
    6 + 3 * 10 + 6 = 42 O, dk/dv 12 + 3 * 18 + 12 = 78 K: 120 O; eager dq zeros 4 + 4 steps
    of 10 + cast 6 = 50 O, dk/dv zeros 8 + step 0 (20 + 16) + 3 * (26 + 16) + cast 12 =
    182 K: 232 O. cp 1: nothing."""
    fwd, bwd = _attention(4)
    o = 8_388_608
    assert merge_bytes(fwd, compiled=True) == 42 * o == 352_321_536
    assert merge_bytes(fwd, compiled=False) == 126 * o
    assert merge_bytes(bwd, compiled=True) == 120 * o
    assert merge_bytes(bwd, compiled=False) == 232 * o
    f1, b1 = _attention(1)
    assert merge_bytes(f1, True) == merge_bytes(b1, False) == 0.0


class _Bytes(TorchDispatchMode):
    """Sums the bytes every aten op reads (its tensor inputs) and writes (its tensor
    outputs), skipping views (outputs that share an input's storage and are not in-place),
    tensors no larger than ``small`` elements (the log-sum-exp rows) and the inputs of
    factory ops (``zeros_like`` reads only a shape)."""

    def __init__(self, small: int) -> None:
        super().__init__()
        self.small, self.total = small, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = func.__name__
        ins = [a for a in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
        outs = [o for o in torch.utils._pytree.tree_leaves(out) if isinstance(o, torch.Tensor)]
        inplace = name.split(".")[0].endswith("_")
        storages = {t.untyped_storage().data_ptr() for t in ins}
        if not inplace and outs and all(o.untyped_storage().data_ptr() in storages for o in outs):
            return out  # a view: no kernel
        reads = [] if "like" in name or name.startswith(("zeros", "empty")) else ins
        self.total += sum(t.numel() * t.element_size() for t in (*reads, *outs) if t.numel() > self.small)
        return out


def _forward_merge(outs, lses):
    """The rank's merge as the ring runs it in eager mode (our rewrite of ``_SDPAMerger``
    for a rank all of whose later steps cover its whole q): each block upcast to fp32, the
    sigmoid rescale of the running output and log-sum-exp, the final cast to bf16."""
    acc = lse = None
    for o, blk_lse in zip(outs, lses, strict=True):
        o32, l32 = o.to(torch.float32), blk_lse.to(torch.float32).unsqueeze(-1)
        if acc is None:
            acc, lse = o32, l32
        else:
            acc = acc - torch.sigmoid(l32 - lse) * (acc - o32)
            lse = lse - F.logsigmoid(lse - l32)
    return acc.to(torch.bfloat16)


def _backward_accumulate(q, k, grads, received):
    """The rank's gradient accumulation in eager mode (our rewrite of the backward loop for
    rank cp - 1): fp32 zeros, step 0's gradients added whole, later steps' dk/dv (first half
    of the sequence) added into the received buffer's first half and re-concatenated, every
    step's dk/dv concatenated for the send, dq accumulated; the final casts."""
    dq = torch.zeros_like(q, dtype=torch.float32)
    dk = torch.zeros_like(k, dtype=torch.float32)
    dv = torch.zeros_like(k, dtype=torch.float32)
    n = k.numel()
    for i, (gq, gk, gv) in enumerate(grads):
        if i == 0:
            dk += gk
            dv += gv
        else:
            buf = received[i - 1]
            dk, dv = buf[:n].reshape(k.shape), buf[n:].reshape(k.shape)
            parts = []
            for acc, g in ((dk, gk), (dv, gv)):
                halves = list(acc.chunk(2, dim=2))
                halves[0] += g
                parts.append(torch.cat(halves, dim=2))
            dk, dv = parts
        torch.cat([dk.flatten(), dv.flatten()])  # the send buffer
        dq += gq
    return dq.to(torch.bfloat16), received[-1].to(torch.bfloat16)


@pytest.mark.parametrize("cp", [2, 4, 8])
def test_merge_bytes_match_the_dispatcher(cp):
    """Eager merge bytes of :func:`merge_bytes` equal what torch's dispatcher counts on the
    loops rewritten above (b 1, 2 heads, 16 local tokens, head dim 8: O = K = 256; the lse
    rows of 32 elements are left out, as the model leaves them out)."""
    fwd, bwd = _attention(cp)
    b, h, s, d = 1, 2, 16, 8
    o = b * h * s * d
    outs = [torch.randn(b, h, s, d).to(torch.bfloat16) for _ in range(cp)]
    lses = [torch.randn(b, h, s) for _ in range(cp)]
    with _Bytes(small=b * h * s) as m:
        _forward_merge(outs, lses)
    want = merge_bytes(fwd, compiled=False) / out_elems(fwd) * o
    assert m.total == want
    q = torch.randn(b, h, s, d).to(torch.bfloat16)
    k = torch.randn(b, h, s, d).to(torch.bfloat16)
    full = (q, k, k)
    half = (q, k[:, :, : s // 2].contiguous(), k[:, :, : s // 2].contiguous())
    grads = [full] + [half] * (cp - 1)
    received = [torch.randn(2 * k.numel()) for _ in range(cp)]
    with _Bytes(small=b * h * s) as m:
        _backward_accumulate(q, k, grads, received)
    assert m.total == merge_bytes(bwd, compiled=False) / out_elems(bwd) * o


def test_comm_time_compiled_and_eager_by_hand():
    """One DGX H100, cp 4, all_gather: forward one all_gather of 4 blocks of 32 MiB;
    backward that all_gather plus 4 permutes of the 64 MiB fp32 dK/dV block. Compiled:
    all exposed. Eager with a slow attention (10 s, 2.5 s a step): only the last dK/dV
    stays exposed; with a zero-time attention everything shows. alltoall rotation (p2p):
    3 permutes of a block forward."""
    cl = load_cluster("dgx-h100", 1)
    fwd, bwd = _attention(4)
    group = [0, 1, 2, 3]
    t_ag = cl.collective_time("all_gather", 4 * 32 * 2**20, group)
    t_dkv = cl.p2p_time(64 * 2**20, 0, 1)
    assert comm_time(fwd, 10.0, cl, 0, compiled=True) == (pytest.approx(t_ag), pytest.approx(t_ag))
    assert comm_time(fwd, 10.0, cl, 0, compiled=False) == (0.0, pytest.approx(t_ag))
    assert comm_time(bwd, 10.0, cl, 0, compiled=True)[0] == pytest.approx(t_ag + 4 * t_dkv)
    assert comm_time(bwd, 10.0, cl, 0, compiled=False) == (pytest.approx(t_dkv), pytest.approx(t_ag + 4 * t_dkv))
    assert comm_time(bwd, 0.0, cl, 0, compiled=False)[0] == pytest.approx(t_ag + 4 * t_dkv)
    fp, _ = _attention(4, "p2p")
    assert comm_time(fp, 0.0, cl, 0, compiled=True)[0] == pytest.approx(3 * cl.p2p_time(32 * 2**20, 0, 1))
    f1, _ = _attention(1)
    assert comm_time(f1, 1.0, cl, 0) == (0.0, 0.0)


def test_profiles_select_the_implementation():
    """torchtitan's profiles name the torch ring; Megatron-Core names none (Transformer
    Engine, the default); an unknown name is refused naming the field."""
    assert load_profile("fsdp2").kernels.cp_attention.value == "torchtitan-sdpa"
    assert load_profile("fsdp2-eager").kernels.cp_attention.value == "torchtitan-sdpa"
    mc = load_profile("megatron-core")
    assert mc.kernels.cp_attention is None and cp_impl(mc).name == DEFAULT_CP_IMPL == "transformer-engine"
    assert cp_impl(None) is CP_IMPLS["transformer-engine"]
    data = load_profile("fsdp2").model_dump()
    data["kernels"]["cp_attention"] = {"value": "ring-of-fire", "provenance": "x"}
    with pytest.raises(ValueError, match="cp attention implementation 'ring-of-fire'"):
        ProfileSpec.model_validate(data)

    class _Odd:
        class kernels:  # noqa: N801 -- a stand-in profile object
            class cp_attention:  # noqa: N801
                value = "nope"

    with pytest.raises(SimulatorError, match="kernels.cp_attention: 'nope'"):
        cp_impl(_Odd())


def test_workspace_bytes_by_hand():
    """cp 4 (O = K = 8,388,608, a bf16 K/V block 32 MiB, an fp32 dK/dV block 64 MiB):
    all_gather forward holds the 4 gathered blocks (128 MiB) and the fp32 output and block
    (2 * 32 MiB): 192 MiB; backward the gathered blocks, fp32 dq (32 MiB), dk and dv
    (64 MiB) and two dK/dV blocks (128 MiB): 352 MiB; the alltoall rotation 2 blocks of
    K/V instead of 4."""
    mib = 2**20
    fwd, bwd = _attention(4)
    assert workspace_bytes(fwd) == 192 * mib and workspace_bytes(bwd) == 352 * mib
    fp, bp = _attention(4, "p2p")
    assert workspace_bytes(fp) == 128 * mib and workspace_bytes(bp) == 288 * mib
    assert workspace_bytes(_attention(1)[0]) == 0


def test_engine_charges_the_torch_ring():
    """A 2-layer Llama (16 heads of 64, 4 KV heads) at 4096 tokens on cp 2 of one DGX H100,
    all_gather: under fsdp2 (compiled) a layer's forward communication is the exposed
    all_gather of 2 blocks of K/V repeated to 16 heads (2 * 2 * 2048 * 16 * 64 * 2 bytes
    each) and its forward compute grows by the merge kernels at the memory rate; under
    megatron-core the all_gather of the 4-head blocks (Transformer Engine)."""
    cfg = ModelConfig(name="m", family="llama", num_layers=2, hidden_size=1024, num_heads=16,
                      num_kv_heads=4, ffn_hidden_size=2816, vocab_size=32000, seq_len=4096)
    from meshplan.engine import Engine

    base = Strategy(cp=2, cp_comm="all_gather", micro_batch_size=1, global_batch_size=1, attention="flash")
    cl = load_cluster("dgx-h100", 1)
    block16, block4 = 2 * 2048 * 16 * 64 * 2, 2 * 2048 * 4 * 64 * 2
    ft = Engine(cfg, cl, base.replace(framework="fsdp2"), nodes=1)
    mc = Engine(cfg, cl, base.replace(framework="megatron-core"), nodes=1)
    lf, lm = ft.program_costs().layers[0], mc.program_costs().layers[0]
    assert lf.comm["F"] == pytest.approx(cl.collective_time("all_gather", 2 * block16, [0, 1]))
    assert lm.comm["F"] == pytest.approx(cl.collective_time("all_gather", 2 * block4, [0, 1]))
    assert lf.cp_hidden["F"] == lm.cp_hidden["F"] == 0.0


@settings(max_examples=25, deadline=None)
@given(cp=st.sampled_from([2, 4, 8]), attn=st.floats(0.0, 10.0), comm=st.sampled_from(["all_gather", "p2p"]))
def test_exposure_and_merge_properties(cp, attn, comm):
    """For any attention time: the exposed exchange never exceeds the exchange alone,
    compiled exposes it all, eager exposes at least the last dK/dV permute and no more
    than compiled; fusing never moves more bytes than eager."""
    cl = _DGX
    for sig in _attention_cached(cp, comm):
        c_exp, c_alone = comm_time(sig, attn, cl, 0, compiled=True)
        e_exp, e_alone = comm_time(sig, attn, cl, 0, compiled=False)
        assert c_exp == c_alone == pytest.approx(e_alone)
        assert 0.0 <= e_exp <= c_exp + 1e-15
        if sig.type.endswith("_grad"):
            assert e_exp >= cl.p2p_time(dkv_block_bytes(sig), 0, 1) - 1e-15
        assert 0 < merge_bytes(sig, True) <= merge_bytes(sig, False)


_DGX = load_cluster("dgx-h100", 1)
_SIGS: dict[tuple[int, str], tuple] = {}


def _attention_cached(cp: int, comm: str) -> tuple:
    if (cp, comm) not in _SIGS:
        _SIGS[cp, comm] = _attention(cp, comm)
    return _SIGS[cp, comm]

"""The ops of the frontier architectures (issue 42): ``flash_attention`` with v of its own
head size (MLA), sinks (GPT-OSS) and chunks (Llama 4) -- kernels against torch autograd on
the textbook formula, FLOPs and bytes by hand; ``expand`` (MLA's shared rotary key);
``moe_topk`` with node-limited groups and routed scaling; the MLA layer's GEMM FLOPs and its
tensor- and sequence-parallel collectives by hand."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from completion.backward import append_backward
from completion.models import ModelConfigWarning, build_model, config_from_hf_dict
from completion.models.source import resolve_model
from completion.ops.registry import OpError
from completion.plan_program import build_plan_program
from completion.strategy import Strategy
from executor.kernels import get_kernel
from executor.kernels.base import KernelContext
from simulator.op_cost import op_cost
from simulator.op_signature import OpSig, TensorSig, op_signature
from tests.completion.test_models_frontier import TINY_DS


def T(*shape: int, dtype: str = "bfloat16") -> TensorSig:
    return TensorSig(tuple(shape), dtype)


# -- flash_attention: kernels against autograd ---------------------------------------------
def _reference(q, k, v, sinks, causal=True, window=0, chunk=0):
    """softmax([QK^T / sqrt(d), sink]) V without the sink column, masked (the textbook
    formula, autograd-differentiable)."""
    b, s, hq, d = q.shape
    rep = hq // k.shape[2]
    kt, vt = (t.transpose(1, 2).repeat_interleave(rep, 1) for t in (k, v))
    sc = q.transpose(1, 2) @ kt.transpose(-1, -2) / math.sqrt(d)
    i, j = torch.arange(s)[:, None], torch.arange(s)[None, :]
    mask = (j > i) if causal else torch.zeros(s, s, dtype=torch.bool)
    if window:
        mask |= j <= i - window
    if chunk:
        mask |= j // chunk != i // chunk
    sc = sc.masked_fill(mask, float("-inf"))
    if sinks is not None:
        sc = torch.cat([sc, sinks[None, :, None, None].expand(b, hq, s, 1)], -1)
    p = torch.softmax(sc, -1)
    p = p[..., :s] if sinks is not None else p
    return (p @ vt).transpose(1, 2)


@pytest.mark.parametrize("sinks,window,chunk,dv", [
    (False, 0, 0, 6), (True, 0, 0, 6), (True, 3, 0, 6), (False, 0, 4, 6), (True, 0, 4, 3), (False, 0, 0, 3),
])
def test_flash_attention_kernels_match_autograd(sinks, window, chunk, dv):
    """Forward and backward (q, k, v and the sinks) of GQA attention whose v is d_v wide, with
    sinks, a sliding window or an attention chunk, equal the formula's autograd in float64."""
    g = torch.Generator().manual_seed(0)
    b, s, hq, hkv, d = 2, 10, 4, 2, 6
    q, k = (torch.randn(b, s, n, d, dtype=torch.float64, generator=g, requires_grad=True) for n in (hq, hkv))
    v = torch.randn(b, s, hkv, dv, dtype=torch.float64, generator=g, requires_grad=True)
    sk = torch.randn(hq, dtype=torch.float64, generator=g, requires_grad=True) if sinks else None
    attrs = {"causal": True, **({"sliding_window": window} if window else {}),
             **({"attention_chunk": chunk} if chunk else {})}
    ins = [q, k, v] + ([sk] if sinks else [])
    out, _, lse, seed = get_kernel("flash_attention")(ins, attrs, KernelContext())
    ref = _reference(q, k, v, sk, window=window, chunk=chunk)
    assert out.shape == (b, s, hq, dv)
    assert torch.allclose(out, ref, atol=1e-12)
    dout = torch.randn_like(ref)
    ref.backward(dout)
    grads = get_kernel("flash_attention_grad")([q, k, v, out, lse, seed, dout] + ([sk] if sinks else []),
                                               attrs, KernelContext())
    want = [q.grad, k.grad, v.grad] + ([sk.grad] if sinks else [])
    assert len(grads) == len(want)
    for got, w in zip(grads, want, strict=True):
        assert torch.allclose(got, w, atol=1e-12)


def test_flash_attention_inference_of_v_head_size_and_sinks():
    from completion.ops.registry import TensorType, get_opdef

    fa = get_opdef("flash_attention")
    q, k, v = TensorType((2, 8, 4, 6)), TensorType((2, 8, 2, 6)), TensorType((2, 8, 2, 3))
    out = fa.infer([q, k, v, TensorType((4,))], {})
    assert out[0].shape == (2, 8, 4, 3) and out[2].shape == (2, 4, 8)
    with pytest.raises(OpError, match="sinks \\[3\\] must be \\[q heads = 4\\]"):
        fa.infer([q, k, v, TensorType((3,))], {})
    with pytest.raises(OpError, match="differ in batch, seq or heads"):
        fa.infer([q, k, TensorType((2, 8, 4, 3))], {})


def test_a_forward_without_sinks_keeps_its_seven_operand_grad():
    """Programs without sinks are as before: flash_attention_grad reads 7 operands and
    yields 3 gradients; with sinks 8 and 4 (completion.backward)."""
    plain = build_model("llama2-7b", 1, seq_len=8, num_layers=1)
    append_backward(plain)
    (g,) = [op for op in plain.ops if op.type == "flash_attention_grad"]
    assert (len(g.operands), len(g.results)) == (7, 3)
    oss = config_from_hf_dict({"model_type": "gpt_oss", "num_hidden_layers": 1, "hidden_size": 32,
                               "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
                               "intermediate_size": 16, "vocab_size": 64, "max_position_embeddings": 16,
                               "num_local_experts": 2, "num_experts_per_tok": 1, "sliding_window": 4})
    prog = build_model(oss, 1, seq_len=8)
    append_backward(prog)
    (g,) = [op for op in prog.ops if op.type == "flash_attention_grad"]
    assert (len(g.operands), len(g.results)) == (8, 4) and g.results[3].name.endswith("sinks@GRAD")
    assert g.attrs["sliding_window"] == 4


# -- costs by hand ----------------------------------------------------------------------------
def test_mla_attention_flops_and_bytes_by_hand():
    """DeepSeek-V3's attention core at b 1, s 4096, 128 heads, d 192, d_v 128 (bf16): model
    FLOPs 2 b H s^2 (d + d_v) = 2 * 128 * 4096^2 * 320 = 1,374,389,534,720; executed x (s +
    1) / 2s (causal); bytes q + k (4096*128*192*2 = 201,326,592 each) + v + out
    (4096*128*128*2 = 134,217,728 each) + lse 128*4096*4 = 2,097,152 + seed 16 =
    673,185,808. Backward: model 2x; executed 2x forward + QK^T recomputed (2 b H s^2 d =
    824,633,720,832) times the causal fraction."""
    s, h = 4096, 128
    q, v = T(1, s, h, 192), T(1, s, h, 128)
    outs = (v, None, T(1, h, s, dtype="float32"), T(2, dtype="int64"))
    (f,) = op_cost(OpSig("flash_attention", (q, q, v), outs, (("causal", True),)))
    assert f.flops == 2 * h * s * s * 320 == 1_374_389_534_720
    assert f.exec_flops == pytest.approx(f.flops * (s + 1) / (2 * s))
    assert f.bytes == 2 * 201_326_592 + 2 * 134_217_728 + 2_097_152 + 16 == 673_185_808
    grad = OpSig("flash_attention_grad", (q, q, v, v, outs[2], outs[3], v), (q, q, v), (("causal", True),),
                 default_phase="B")
    (g,) = op_cost(grad)
    assert g.flops == 2 * f.flops
    assert g.exec_flops == pytest.approx((2 * f.flops + 824_633_720_832) * (s + 1) / (2 * s))


def test_chunked_attention_and_sinks_costs_by_hand():
    """s 8, chunk 4: each query sees its chunk's keys up to itself, 2 * (1+2+3+4) = 20 of 64
    pairs executed; model FLOPs count min(4, 8) = 4 keys per query (half of 4 b h s^2 d).
    Sinks add their bytes: 4 heads * 4 bytes."""
    q = T(1, 8, 4, 16, dtype="float32")
    outs = (q, None, T(1, 4, 8, dtype="float32"), T(2, dtype="int64"))
    full = 4 * 4 * 8 * 8 * 16
    (c,) = op_cost(OpSig("flash_attention", (q, q, q), outs, (("causal", True), ("attention_chunk", 4))))
    assert c.flops == full / 2 and c.exec_flops == pytest.approx(full * 20 / 64)
    (plain,) = op_cost(OpSig("flash_attention", (q, q, q), outs, (("causal", True),)))
    (sunk,) = op_cost(OpSig("flash_attention", (q, q, q, T(4, dtype="float32")), outs, (("causal", True),)))
    assert sunk.bytes - plain.bytes == 16 and sunk.flops == plain.flops


# -- expand ---------------------------------------------------------------------------------
def test_expand_op_kernel_and_grad():
    from completion.ops.registry import TensorType, get_opdef

    ex = get_opdef("expand")
    assert ex.infer([TensorType((2, 3, 1, 4))], {"shape": [2, 3, 5, -1]})[0].shape == (2, 3, 5, 4)
    with pytest.raises(OpError, match="cannot expand x \\[2, 3\\] to \\[2, 4\\]"):
        ex.infer([TensorType((2, 3))], {"shape": [2, 4]})
    x = torch.randn(2, 3, 1, 4)
    out = get_kernel("expand")([x], {"shape": [2, 3, 5, 4]}, KernelContext())[0]
    assert torch.equal(out, x.expand(2, 3, 5, 4))
    g = torch.randn(2, 3, 5, 4)
    (dx,) = get_kernel("expand_grad")([x, g], {"shape": [2, 3, 5, 4]}, KernelContext())
    assert torch.allclose(dx, g.sum(2, keepdim=True))


# -- routing ---------------------------------------------------------------------------------
def test_node_limited_routing_by_hand():
    """8 experts in 4 groups of 2, top-2 groups, k 2. Scores [.9 .1 | .8 .7 | .85 .0 | .2 .3]:
    group scores (sum of the two best) 1.0, 1.5, 0.85, 0.5, so groups 1 and 0; the plain
    top-2 would take experts 0 and 4 (.9, .85), the limited one 0 and 2 (.9, .8). Weights
    renormalised then times 2.5: .9/1.7 * 2.5, .8/1.7 * 2.5."""
    x = torch.tensor([[[0.9, 0.1, 0.8, 0.7, 0.85, 0.0, 0.2, 0.3]]], dtype=torch.float64)
    attrs = {"k": 2, "normalize": True, "scale": 2.5, "groups": 4, "topk_groups": 2}
    w, idx = get_kernel("moe_topk")([x], attrs, KernelContext())
    assert idx.tolist() == [[[0, 2]]]
    assert torch.allclose(w, torch.tensor([[[0.9 / 1.7 * 2.5, 0.8 / 1.7 * 2.5]]], dtype=torch.float64))
    plain = get_kernel("moe_topk")([x], {"k": 2}, KernelContext())[1]
    assert plain.tolist() == [[[0, 4]]]
    xr = x.clone().requires_grad_(True)
    ref = xr.gather(-1, idx)
    ref = ref / ref.sum(-1, keepdim=True) * 2.5
    gw = torch.tensor([[[0.3, -1.2]]], dtype=torch.float64)
    ref.backward(gw)
    (dx,) = get_kernel("moe_topk_grad")([x, idx, gw], attrs, KernelContext())
    assert torch.allclose(dx, xr.grad)


# -- the MLA layer under completion --------------------------------------------------------
def _mla_layer(tp: int, sp: bool):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ModelConfigWarning)
        src = resolve_model(config_from_hf_dict({**TINY_DS, "first_k_dense_replace": 1}), seq_len=32,
                            num_layers=1)
    return build_plan_program(src, Strategy(tp=tp, sequence_parallel=sp, micro_batch_size=2,
                                            global_batch_size=2), representative=True).program


def test_mla_layer_gemm_flops_by_hand():
    """One MLA layer of TINY_DS at b 2, s 32 (T = 64 tokens; h 64, H 4, r_q 24, r_kv 16, d_n
    16, d_r 8, d_v 12): projection GEMMs 2 T (64*24 + 24*4*24 + 64*24 + 16*4*28 + 48*64) =
    2 * 64 * 10,240 = 1,310,720 FLOPs; attention 2 b H s^2 (24 + 12) = 589,824."""
    prog = build_model(config_from_hf_dict({**TINY_DS, "num_hidden_layers": 1}), 2, seq_len=32)
    ops = [op for op in prog.ops if op.struct_name.startswith("decoder.layers.0.self_attn")]
    gemm = sum(k.flops for op in ops if op.type == "matmul" for k in op_cost(op_signature(op)))
    attn = sum(k.flops for op in ops if op.type == "flash_attention" for k in op_cost(op_signature(op)))
    assert gemm == 2 * 64 * (64 * 24 + 24 * 4 * 24 + 64 * 24 + 16 * 4 * 28 + 48 * 64) == 1_310_720
    assert attn == 2 * 2 * 4 * 32 * 32 * (24 + 12) == 589_824


def test_mla_tensor_and_sequence_parallel_collectives():
    """tp 2: the latents are whole on both ranks (replicated down-projections), the
    up-projections head-parallel: forward all-reduces only the o_proj output; backward also
    reduces the latents' input gradients (the rotary key [b, s, 1, d_r] summed over the
    heads the expand spread it to, the kv and q latents). With sequence parallelism the q
    latent is gathered before q_b_proj and the joint kv latent [b, s, r_kv + d_r] right
    after its projection (Megatron-Core MLASelfAttention): no all_to_all."""
    def colls(prog):
        return [(op.role.name[0], op.type, tuple(op.operands[0].shape)) for op in prog.ops
                if op.type in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
                and op.struct_name.startswith("decoder.layers.0.self_attn")]

    assert colls(_mla_layer(2, False)) == [("B", "all_reduce", (2, 32, 1, 8)), ("B", "all_reduce", (2, 32, 16)),
                                           ("B", "all_reduce", (2, 32, 24))]
    assert colls(_mla_layer(2, True)) == [
        ("F", "all_gather", (2, 32, 24)), ("F", "all_gather", (2, 32, 24)),
        ("B", "all_gather", (2, 32, 64)), ("B", "reduce_scatter", (2, 32, 1, 8)),
        ("B", "all_reduce", (2, 32, 16)), ("B", "reduce_scatter", (2, 32, 24))]


def test_context_parallelism_refuses_sinks_and_chunks_by_name():
    from completion.context_parallel import ContextParallelError, check_context_parallel

    oss = config_from_hf_dict({"model_type": "gpt_oss", "num_hidden_layers": 1, "hidden_size": 32,
                               "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
                               "intermediate_size": 16, "vocab_size": 64, "max_position_embeddings": 64,
                               "num_local_experts": 2, "num_experts_per_tok": 1, "sliding_window": 4})
    with pytest.raises(ContextParallelError, match="has attention_sinks \\(True\\)"):
        check_context_parallel(resolve_model(oss, seq_len=32), Strategy(cp=2))
    chunked = config_from_hf_dict(
        {"model_type": "llama4_text", "num_hidden_layers": 1, "hidden_size": 32, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 8, "intermediate_size": 16, "intermediate_size_mlp": 32,
         "vocab_size": 64, "max_position_embeddings": 64, "num_local_experts": 2, "num_experts_per_tok": 1,
         "attention_chunk_size": 16})
    with pytest.raises(ContextParallelError, match="has attention_chunk \\(16\\)"):
        check_context_parallel(resolve_model(chunked, seq_len=32), Strategy(cp=2))
    check_context_parallel(resolve_model(chunked, seq_len=16), Strategy(cp=2))  # the chunk masks nothing

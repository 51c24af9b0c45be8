"""The ``megatron-deepspeed`` profile and the small-kernel mechanisms it brings: Megatron's
fused-softmax availability rule, its eager vocab-parallel cross entropy, and the host
dispatch bound (values derived by hand from microsoft/Megatron-DeepSpeed f4157bea and
microsoft/DeepSpeed 38327e07)."""

from __future__ import annotations

import pytest

from completion import append_backward, build_model
from completion.models import ModelConfig
from completion.strategy import Strategy
from meshplan.engine import Engine
from simulator.eager_ops import EAGER_IMPLS, eager_kernels, impl_for
from simulator.fused_softmax import softmax_batch_per_block, softmax_kernel_available
from simulator.fusion import FusionPlan
from simulator.op_signature import op_signature
from simulator.profiles import load_profile


def test_profile_facts_from_the_code():
    p = load_profile("megatron-deepspeed")
    assert set(p.kernels.fused.value) == {"bias_gelu", "bias_dropout_add", "scale_mask_softmax", "norm"}
    assert p.kernels.attention.value == "unfused"
    assert not p.overlap.tp_backward.value  # arguments.py: deepspeed turns async TP all_reduce off
    assert p.pipeline.p2p.value == "sync"  # DeepSpeed p2p.send/recv: dist.send / dist.recv
    assert not p.pipeline.scatter_gather.value
    assert p.pipeline.zero_stages.value == (0, 1)
    assert p.gradients.accumulation.value == "separate"
    assert dict(p.kernels.eager.value) == {"cross_entropy": "megatron-vocab-parallel-cross-entropy",
                                           "scale_mask_softmax": "megatron-torch-softmax"}
    assert p.host is not None and "FITTED" in p.host.kernel_launch_s.provenance


@pytest.mark.parametrize(("sk", "want"), [(1024, 4), (2048, 4), (128, 8), (64, 8), (16, 16), (100, 8)])
def test_softmax_batch_per_block_by_hand(sk, want):
    # keys -> power of two n; warp min(n, 32) threads; 128 / warp warps a block; 2 rows a
    # warp when n <= 128: 1024 -> 4 warps x 1; 128 -> 4 x 2; 16 -> 8 warps of 16 x 2
    assert softmax_batch_per_block(sk) == want


def test_softmax_kernel_availability_by_hand():
    # 16 heads at tp 8 = 2 local heads; one sequence of 1,024: b * heads = 2, not a multiple
    # of 4 -> PyTorch's softmax; two sequences (4) -> the fused kernel (4 % 4 == 0)
    assert not softmax_kernel_available((1, 2, 1024, 1024), "float16")
    assert softmax_kernel_available((2, 2, 1024, 1024), "float16")
    assert softmax_kernel_available((1, 4, 1024, 1024), "bfloat16")
    assert not softmax_kernel_available((1, 4, 1024, 1024), "float32")  # input must be 16-bit
    assert not softmax_kernel_available((1, 4, 8192, 8192), "float16")  # sk > 4096
    assert not softmax_kernel_available((1, 4, 16, 16), "float16")  # sk must exceed 16
    assert not softmax_kernel_available((1, 4, 1022, 1022), "float16")  # sq % 4
    # causal needs b * heads % batch_per_block: sk = 64 -> 8 rows a block, 4 batches -> no
    assert not softmax_kernel_available((1, 4, 64, 64), "float16")
    assert softmax_kernel_available((2, 4, 64, 64), "float16")


def _gpt_program(heads_local: int, b: int, s: int = 64):
    cfg = ModelConfig("t", "gpt", 1, 16 * heads_local, heads_local, heads_local, 64 * heads_local,
                      128, s, tie_word_embeddings=True, attention="unfused", attention_dropout=0.1,
                      hidden_dropout=0.1)
    prog = build_model(cfg, b, seq_len=s, dtype="float16")
    append_backward(prog)
    return prog


def test_fusion_plan_falls_back_where_the_kernel_does_not_apply():
    """scale + softmax fuse (forward and backward) only where Megatron's kernel takes the
    scores: 4 heads, s = 64 (8 rows a block): b = 2 (8 batches) fuses, b = 1 (4) does not."""
    prof = load_profile("megatron-deepspeed")
    fused = FusionPlan.of(_gpt_program(4, 2), prof)
    assert sum(g.name == "scale_mask_softmax" for g in fused.groups) == 2  # F and B
    plain = FusionPlan.of(_gpt_program(4, 1), prof)
    assert not any(g.name == "scale_mask_softmax" for g in plain.groups)
    assert any(g.name == "bias_gelu" for g in plain.groups)  # the others still fuse


def test_softmax_fallback_kernels_by_hand():
    """Where the fused kernel does not apply (b = 1, 4 heads, s = 64: 4 batches, 8 rows a
    block) the softmax runs as PyTorch's fp32 fallback: over N = b x heads x s x s scores,
    .float() reads 2N and writes 4N, masked_fill_ 8N, softmax 8N, .half() 4N + 2N: 28N in 4
    kernels (the scale is the program's own op); backward 6N + 12N + 8N + 6N = 32N in 4.
    Fused (b = 2) the same ops are one kernel each way."""
    prof = load_profile("megatron-deepspeed")
    prog = _gpt_program(4, 1)
    from simulator.stage_cost import StageCoster

    coster = StageCoster(prog, None, _rf(), profile=prof)
    sm = next(op for op in prog.ops if op.type == "softmax")
    smg = next(op for op in prog.ops if op.type == "softmax_grad")
    n = 1 * 4 * 64 * 64
    fwd = coster._kernels(op_signature(sm, 0, coster.names))
    assert len(fwd) == 4 and sum(k.bytes for k in fwd) == 28 * n
    bwd = [k for k in coster._kernels(op_signature(smg, 0, coster.names)) if k.phase == "B"]
    assert len(bwd) == 4 and sum(k.bytes for k in bwd) == 32 * n
    assert not any(g.name == "scale_mask_softmax" for g in FusionPlan.of(prog, prof).groups)


def _rf():
    from simulator.roofline import Roofline

    return Roofline(peak_flops={"fp16": 1e18}, gemm_efficiency=1.0, gemm_half_flops=1.0,
                    mem_bandwidth=1e9, mem_efficiency=1.0, kernel_overhead=1e-6)


def test_vocab_parallel_cross_entropy_bytes_by_hand():
    """The eager loss over N fp16 logits: forward reads 2N and writes 4N (the fp32 copy),
    max reads 4N, subtract 8N, exp 8N, sum 4N, div 8N: 38N bytes in 17 kernels (12 of them
    small); backward: mul_ 8N, the cast back 4N + 2N: 14N bytes in 6 kernels."""
    impl = EAGER_IMPLS["megatron-vocab-parallel-cross-entropy"]
    assert impl_for("cross_entropy_with_softmax", {"cross_entropy": impl.name}) is impl
    prog = _gpt_program(4, 2)
    ce = next(op for op in prog.ops if op.type == "cross_entropy_with_softmax")
    ce_grad = next(op for op in prog.ops if op.type == "cross_entropy_with_softmax_grad")
    n = 2 * 64 * 128  # b * s * vocab logits
    fwd = eager_kernels(op_signature(ce, 0), impl, [])
    assert len(fwd) == 17 and sum(k.bytes for k in fwd) == 38 * n
    bwd = eager_kernels(op_signature(ce_grad, 0), impl, [])
    assert len(bwd) == 6 and sum(k.bytes for k in bwd) == 14 * n


def _engine(tp: int, mbs: int) -> Engine:
    cfg = ModelConfig("g", "gpt", 4, 1024, 16, 16, 4096, 50257, 1024, tie_word_embeddings=True,
                      attention="unfused", attention_dropout=0.1, hidden_dropout=0.1)
    s = Strategy(dp=1, tp=tp, micro_batch_size=mbs, global_batch_size=2 * mbs, recompute="full",
                 zero=1, dtype="float16", framework="megatron-deepspeed")
    return Engine(cfg, "dgx-a100-80g", s, nodes=1, seq_len=1024)


def test_host_bound_layer_at_tp8_micro_batch_1():
    """hidden 1,024 at tp 8, one sequence: every kernel of a layer is shorter than its
    launch, so the layer's forward takes its launches x the host time per launch plus its
    last kernel (simulator.host_time: the GPU waits for every launch); at micro-batch 8 the
    kernels hide the host."""
    eng = _engine(8, 1)
    per = load_profile("megatron-deepspeed").host.kernel_launch_s.value
    layer = eng.program_costs().layers[1]
    d = layer.dispatch("F", eng.profile)
    launches = round(d.host / per)
    assert d.host == pytest.approx(launches * per)
    assert launches >= 20  # ~20 kernels and 2 all_reduces in a layer's forward
    assert d.device < d.host  # host-bound
    assert d.finish <= d.host + d.device and d.finish >= d.host
    big = _engine(8, 8).program_costs().layers[1].dispatch("F", eng.profile)
    assert big.exposed < d.exposed


def test_the_step_adds_the_exposed_dispatch_of_each_action():
    """pp 1, two micro-batches: the step with the host section is the step without it plus
    2 x (what dispatch adds to the F and the BW action), and the compute line carries it."""
    from unittest import mock

    import meshplan.engine as engine_mod

    prof = load_profile("megatron-deepspeed")
    with mock.patch.object(engine_mod, "load_profile", lambda name: prof.model_copy(update={"host": None})):
        bare = _engine(8, 1).simulate()
    res = _engine(8, 1).simulate()
    added = res.stage_parts[0]["host_fused"]
    assert added > 0 and bare.stage_parts[0]["host_fused"] == 0.0
    assert res.step_time - bare.step_time == pytest.approx(2 * added, abs=2e-9)
    assert res.time_breakdown["compute"] - bare.time_breakdown["compute"] == pytest.approx(2 * added, abs=2e-9)

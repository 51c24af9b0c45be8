"""Kernel fusion as a framework profile says (simulator/fusion.py), against hand-derived
byte counts and roofline times.

Sources of the patterns: Megatron-LM ``fused_bias_gelu.py`` (bias_gelu / bias_gelu_back),
``bias_dropout_add_fused_train`` and ``FusedScaleMaskSoftmax``; torch.compile's Inductor
fuses pointwise chains (its partitioner recomputes pointwise intermediates in backward).
The roofline here has bandwidth 1e9 B/s at efficiency 1, 1 us per kernel and a peak far
above every FLOP count, so a memory-bound kernel takes ``bytes / 1e9 + 1e-6`` s.
"""

from __future__ import annotations

import pytest
import yaml

from completion import append_backward, build_model
from completion.models import ModelConfig, megatron_2021
from completion.models.builder import ProgramBuilder
from simulator.fusion import COMPILE, FusionPlan, fusion_settings
from simulator.op_cost import op_cost
from simulator.op_signature import op_signature
from simulator.profiles import CATALOG_DIR, FUSION_GROUPS, load_profile, parse_profile
from simulator.recompute import is_attention_core
from simulator.roofline import Roofline
from simulator.stage_cost import StageCoster

RF = Roofline(peak_flops={"bf16": 1e18, "fp32": 1e18}, gemm_efficiency=1.0, gemm_half_flops=1.0,
              mem_bandwidth=1e9, mem_efficiency=1.0, kernel_overhead=1e-6)
BW, OH = 1e9, 1e-6

# a small GPT: b = 2, s = 32, h = 64, 4 heads (d = 16), ffn 4h = 256, bf16
B, S, H, A, F = 2, 32, 64, 4, 256
GPT = ModelConfig("t-gpt", "gpt", 1, H, A, A, F, 128, S, tie_word_embeddings=True)
X4 = B * S * F * 2  # an [b, s, 4h] bf16 activation: 32768 bytes
BIAS4 = F * 2  # its bias: 512 bytes
XH = B * S * H * 2  # an [b, s, h] activation: 8192 bytes
MASK = B * S * H  # its dropout mask (uint8): 4096 bytes
SC = B * A * S * S * 2  # the [b, a, s, s] scores: 16384 bytes


def profile(fused=(), compile=False):
    """The ``eager`` catalog profile with other kernel facts."""
    data = yaml.safe_load((CATALOG_DIR / "eager.yaml").read_text())
    data["kernels"]["fused"]["value"] = list(fused)
    data["kernels"]["compile"]["value"] = compile
    return parse_profile(data, "test profile")


def _program(cfg=GPT):
    prog = build_model(cfg, B, seq_len=S)
    append_backward(prog)
    return prog


def _op(prog, type_, struct, role="FORWARD"):
    return next(op for op in prog.ops if op.type == type_ and op.struct_name == struct
                and op.role.name == role)


def _unfused(prog, ops, phase):
    """(bytes, seconds) of the ops' own kernels in ``phase``."""
    ks = [k for op in ops for k in op_cost(op_signature(op, 0)) if k.phase == phase]
    return sum(k.bytes for k in ks), sum(RF.kernel_time(k) for k in ks)


def _block(prog, prof):
    return StageCoster(prog, None, RF, profile=prof).block_costs()[0]


def test_bias_gelu_reads_x_and_bias_and_writes_once():
    """GPT MLP: add(x, bias) -> gelu on [b, s, 4h] bf16. Unfused: add reads x + bias and
    writes (2 X + bias), gelu reads and writes (2 X), two launches; fused: read x + bias,
    write once, one launch. Backward: unfused gelu_grad reads x + bias's sum and dout,
    writes (3 X) and add_grad's input-gradient kernel reads dout, writes (2 X); fused:
    read dout, x, bias (the sum is recomputed, Megatron's bias_gelu_back), write dx. The
    bias gradient's reduction (W) stays: reads dout, writes the bias gradient."""
    prog = _program()
    add, gelu = _op(prog, "add", "decoder.layers.0.mlp.up_proj"), _op(prog, "gelu", "decoder.layers.0.mlp.act")
    plan = FusionPlan(prog, ["bias_gelu"])
    g = plan.group(add)
    assert g is plan.group(gelu) and g.name == "bias_gelu" and g.phase == "F" and g.ops == [add, gelu]
    k = plan.kernel(g)
    assert (k.bytes, k.kind, k.op) == (2 * X4 + BIAS4, "memory", "bias_gelu")
    assert RF.kernel_time(k) == pytest.approx((2 * X4 + BIAS4) / BW + OH, rel=1e-12)
    assert _unfused(prog, [add, gelu], "F") == pytest.approx((4 * X4 + BIAS4, (4 * X4 + BIAS4) / BW + 2 * OH))
    assert k.flops == sum(kk.flops for op in (add, gelu) for kk in op_cost(op_signature(op, 0)))

    ggrad = _op(prog, "gelu_grad", "decoder.layers.0.mlp.act", "BACKWARD")
    agrad = _op(prog, "add_grad", "decoder.layers.0.mlp.up_proj", "BACKWARD")
    gb = plan.group(ggrad)
    assert gb is plan.group(agrad) and (gb.name, gb.phase) == ("bias_gelu", "B")
    assert plan.kernel(gb).bytes == 3 * X4 + BIAS4
    assert _unfused(prog, [ggrad, agrad], "B")[0] == 5 * X4
    w = [kk for kk in op_cost(op_signature(agrad, 0)) if kk.phase == "W"]
    assert [kk.bytes for kk in plan.remaining(agrad, op_cost(op_signature(agrad, 0)))] == [X4 + BIAS4] == [
        kk.bytes for kk in w]

    # the block costs: F saves 2 X and a launch, B saves 2 X - bias and a launch, W is the same
    fused, plain = _block(prog, profile(["bias_gelu"])), _block(prog, profile())
    assert plain.compute["F"] - fused.compute["F"] == pytest.approx(2 * X4 / BW + OH, rel=1e-9)
    assert plain.compute["B"] - fused.compute["B"] == pytest.approx((2 * X4 - BIAS4) / BW + OH, rel=1e-9)
    assert fused.compute["W"] == plain.compute["W"] and fused.flops == plain.flops


def test_a_profile_without_the_group_keeps_the_unfused_cost():
    prog = _program()
    none = _block(prog, None)
    for prof in (profile(), profile(["scale_mask_softmax", "norm", "rope", "swiglu", "cross_entropy"]),
                 load_profile("eager")):
        assert _block(prog, prof).compute == none.compute  # no pattern of these in this GPT
    assert FusionPlan.of(prog, None).groups == [] and fusion_settings(None) == ((), False)
    assert fusion_settings(profile(["bias_gelu", "norm"], True)) == (("bias_gelu", "norm"), True)


def test_megatron_2021_layer_bias_dropout_add_and_scale_mask_softmax():
    """The 2021 GPT (unfused attention, dropout 0.1) under the megatron-2021 profile.
    bias_dropout_add (o_proj): reads x, bias, residual [b, s, h]; writes the sum and the
    uint8 mask: 3 XH + bias + XH + MASK (unfused: 2 XH + bias, 2 XH + MASK, 3 XH).
    Backward: reads dout and the mask, writes the residual's and x's gradients (unfused:
    3 XH, 2 XH + MASK, 2 XH). scale_mask_softmax: reads the scores, writes the
    probabilities (2 SC; unfused 4 SC); backward reads the probabilities and their
    gradient, writes the scores' gradient (3 SC; unfused 5 SC)."""
    prog = _program(megatron_2021(GPT))
    plan = FusionPlan.of(prog, load_profile("megatron-2021"))
    bias = _op(prog, "add", "decoder.layers.0.self_attn.o_proj")
    g = plan.group(bias)
    assert [op.type for op in g.ops] == ["add", "dropout", "add"] and g.name == "bias_dropout_add"
    ins, outs = plan.io(g)
    assert sorted(ins.values()) == [H * 2, XH, XH] and sorted(outs.values()) == [MASK, XH]
    assert plan.kernel(g).bytes == 3 * XH + H * 2 + MASK
    assert _unfused(prog, g.ops, "F")[0] == 7 * XH + H * 2 + MASK
    bw = next(x for x in plan.groups if x.name == "bias_dropout_add" and x.phase == "B"
              and x.ops[-1].struct_name == "decoder.layers.0.self_attn.o_proj")
    assert [op.type for op in bw.ops] == ["add_grad", "dropout_grad", "add_grad"]
    assert plan.kernel(bw).bytes == 3 * XH + MASK
    assert _unfused(prog, bw.ops, "B")[0] == 7 * XH + MASK

    scale = _op(prog, "scale", "decoder.layers.0.self_attn")
    sm = plan.group(scale)
    assert [op.type for op in sm.ops] == ["scale", "softmax"] and sm.name == "scale_mask_softmax"
    assert plan.kernel(sm).bytes == 2 * SC and _unfused(prog, sm.ops, "F")[0] == 4 * SC
    smb = next(x for x in plan.groups if x.name == "scale_mask_softmax" and x.phase == "B")
    assert [op.type for op in smb.ops] == ["softmax_grad", "scale_grad"]
    assert plan.kernel(smb).bytes == 3 * SC and _unfused(prog, smb.ops, "B")[0] == 5 * SC
    # the attention dropout after the softmax is its own kernel (as in Megatron)
    assert not plan.is_fused(_op(prog, "dropout", "decoder.layers.0.self_attn"))
    assert {x.name for x in plan.groups} == {"bias_gelu", "bias_dropout_add", "scale_mask_softmax"}


def test_selective_recompute_time_of_the_fused_attention_core():
    """The attention core's forward time (what selective recompute reruns) is QK^T, the
    one scale-mask-softmax kernel, the attention dropout and x V."""
    prog = _program(megatron_2021(GPT))
    prof = load_profile("megatron-2021")
    plan = FusionPlan.of(prog, prof)
    core = [op for op in prog.ops if op.role.name == "FORWARD" and is_attention_core(op)]
    assert [op.type for op in core] == ["matmul", "scale", "softmax", "dropout", "matmul"]
    sm = plan.group(core[1])
    own = sum(RF.kernel_time(k) for op in core if not plan.is_fused(op) for k in op_cost(op_signature(op, 0)))
    assert _block(prog, prof).attn_core_f == pytest.approx(own + RF.kernel_time(plan.kernel(sm)), rel=1e-12)


def test_unfused_qkt_is_a_batched_gemm_over_the_s_by_s_scores():
    """2021 GPT: QK^T of q, k [b, a, s, d] writes the [b, a, s, s] scores: FLOPs
    2 b a s^2 d, bytes q + k + scores."""
    prog = build_model(megatron_2021(GPT), B, seq_len=S)
    qk = _op(prog, "matmul", "decoder.layers.0.self_attn")
    assert [v.shape for v in qk.operands] == [(B, A, S, H // A)] * 2 and qk.attrs["transpose_y"]
    (k,) = op_cost(op_signature(qk, 0))
    assert k.kind == "gemm" and k.flops == 2 * B * A * S * S * (H // A)
    assert k.bytes == 2 * (B * A * S * (H // A) * 2) + SC
    assert "flash_attention" not in {op.type for op in prog.ops}


def test_compile_fuses_a_chain_of_three_elementwise_ops():
    """y = x @ W1; c = scale(tanh(exp(y))); z = c @ W2 (fp32 [8, 64], X = 2048 bytes).
    torch.compile: one forward kernel reads y and writes c (2 X; exp's and tanh's results
    are recomputed in backward, which only reads them), unfused 6 X in three launches; one
    backward kernel reads dc and y, writes dy (3 X), unfused scale_grad 2 X + tanh_grad
    3 X + exp_grad 3 X. The patterns alone fuse none of them."""
    pb = ProgramBuilder(dtype="float32")
    x = pb.data("x", [8, 64], "float32", "inp")
    x.stop_gradient = False
    y = pb.linear(x, 64, 64, "lin1", False)
    a = pb.op1("exp", [y], None, "act")
    t = pb.op1("tanh", [a], None, "act")
    c = pb.op1("scale", [t, None], {"scale": 0.5, "bias": 0.0, "bias_after_scale": True}, "act")
    z = pb.linear(c, 64, 64, "lin2", False)
    loss = pb.op1("mean", [z], {"axis": [], "keepdim": False}, "loss")
    append_backward(pb.program, loss)
    prog, xb = pb.program, 8 * 64 * 4
    chain = [a.op, t.op, c.op]
    plan = FusionPlan(prog, compile=True)
    g = plan.group(a.op)
    assert g.name == COMPILE and g.ops == chain and g.phase == "F"
    assert plan.kernel(g).bytes == 2 * xb
    assert RF.kernel_time(plan.kernel(g)) == pytest.approx(2 * xb / BW + OH, rel=1e-9)
    assert _unfused(prog, chain, "F") == pytest.approx((6 * xb, 6 * xb / BW + 3 * OH))
    grads = [op for op in prog.ops if op.type in ("scale_grad", "tanh_grad", "exp_grad")]
    gb = plan.group(grads[0])
    assert gb.ops == grads and gb.phase == "B" and plan.kernel(gb).bytes == 3 * xb
    assert _unfused(prog, grads, "B")[0] == 8 * xb
    assert not any(FusionPlan(prog, FUSION_GROUPS).is_fused(op) for op in chain + grads)


def test_compile_never_fuses_across_a_gemm():
    """The two residual adds of a LLaMA layer share the residual stream but the MLP GEMMs
    run between them: they stay in different kernels (the first joins the norm after it)."""
    cfg = ModelConfig("t-llama", "llama", 1, H, A, A, F, 128, S)
    prog = _program(cfg)
    plan = FusionPlan(prog, compile=True)
    adds = [op for op in prog.ops if op.type == "add" and op.struct_name == "decoder.layers.0"]
    assert len(adds) == 2 and plan.group(adds[0]) is not plan.group(adds[1])
    assert [op.type for op in plan.group(adds[0]).ops] == ["add", "rms_norm"]


def test_grad_kernels_read_only_what_they_need():
    """add_grad of a bias reads only dout (Paddle backward.yaml no_need_buffer: x, y):
    input-gradient kernel dout + dx, weight-gradient reduction dout + dbias; relu_grad
    reads out and dout (its operands), cast_grad only dout."""
    prog = _program()
    agrad = _op(prog, "add_grad", "decoder.layers.0.mlp.up_proj", "BACKWARD")
    ks = {k.phase: k.bytes for k in op_cost(op_signature(agrad, 0))}
    assert ks == {"B": 2 * X4, "W": X4 + BIAS4}
    res = _op(prog, "add_grad", "decoder.layers.0", "BACKWARD")  # a residual add: two dx
    assert [k.bytes for k in op_cost(op_signature(res, 0))] == [3 * XH]

    pb = ProgramBuilder(dtype="float32")
    x = pb.data("x", [4, 8], "float32")
    x.stop_gradient = False
    r = pb.op1("relu", [pb.op1("cast", [x], {"dtype": "bfloat16"})], None)
    loss = pb.op1("mean", [pb.op1("cast", [r], {"dtype": "float32"})], {"axis": [], "keepdim": False})
    append_backward(pb.program, loss)
    got = {op.type: [k.bytes for k in op_cost(op_signature(op))] for op in pb.program.ops
           if op.type in ("relu_grad", "cast_grad")}
    assert got["relu_grad"] == [3 * 32 * 2]  # out, dout, dx in bf16
    assert got["cast_grad"] == [32 * 4 + 32 * 2]  # reads dout (fp32), writes dx (bf16)

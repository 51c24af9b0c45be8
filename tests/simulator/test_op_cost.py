"""Op cost: FLOPs / bytes from local shapes, the B/W split, and roofline times.

Reference values are derived by hand (2mnk, 4*b*h*s^2*d) or taken from the ZB paper,
Table 1 (forward FLOPs of one GPT layer 24bsh^2 + 4bs^2h)."""

from __future__ import annotations

import warnings

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clusters import load_cluster
from completion.models import build_model
from simulator.op_cost import KernelCost, op_cost
from simulator.op_signature import OpSig, TensorSig, op_signature
from simulator.roofline import DEFAULT_GEMM_HALF_FLOPS, Roofline


def T(*shape: int, dtype: str = "bfloat16") -> TensorSig:
    return TensorSig(tuple(shape), dtype)


@settings(deadline=None, max_examples=60)
@given(b=st.integers(1, 4), m=st.integers(1, 64), n=st.integers(1, 64), k=st.integers(1, 64),
       tx=st.booleans(), ty=st.booleans())
def test_matmul_flops_2mnk_with_transposes_and_broadcast(b, m, n, k, tx, ty):
    x = T(b, k, m) if tx else T(b, m, k)
    y = T(n, k) if ty else T(k, n)  # broadcast over the batch dim
    sig = OpSig("matmul", (x, y), (T(b, m, n),), (("transpose_x", tx), ("transpose_y", ty)))
    (kc,) = op_cost(sig)
    assert kc.flops == 2 * b * m * n * k
    assert kc.bytes == 2 * (b * m * k + k * n + b * m * n)
    assert kc.phase == "F" and kc.kind == "gemm"


def test_matmul_grad_splits_input_and_weight_gradients():
    x, w, dout = T(8, 16), T(16, 32), T(8, 32)
    sig = OpSig("matmul_grad", (x, w, dout), (T(8, 16), T(16, 32)), weights=(False, True),
                default_phase="B")
    ks = op_cost(sig)
    assert [k.phase for k in ks] == ["B", "W"]
    assert all(k.flops == 2 * 8 * 16 * 32 for k in ks)
    # dx reads dout and w, writes dx; dW reads x and dout, writes dW (2 bytes each)
    assert ks[0].bytes == 2 * (8 * 32 + 16 * 32 + 8 * 16)
    assert ks[1].bytes == 2 * (8 * 16 + 8 * 32 + 16 * 32)
    # no input gradient needed (a first layer): only W remains
    only_w = OpSig("matmul_grad", (x, w, dout), (None, T(16, 32)), weights=(False, True))
    assert [k.phase for k in op_cost(only_w)] == ["W"]


def test_flash_attention_causal_and_gqa():
    b, s, hq, hkv, d = 2, 128, 8, 2, 64
    q, kv = T(b, s, hq, d), T(b, s, hkv, d)
    outs = (T(b, s, hq, d), None, T(b, hq, s, dtype="float32"), T(2, dtype="int64"))
    causal = OpSig("flash_attention", (q, kv, kv), outs, (("causal", True),))
    full = OpSig("flash_attention", (q, q, q), outs, (("causal", False),))
    (kc,), (kf,) = op_cost(causal), op_cost(full)
    assert kc.flops == kf.flops == 4 * b * hq * s * s * d  # model FLOPs count the full s^2
    assert kc.exec_flops == pytest.approx(kf.flops * (s + 1) / (2 * s))
    assert kf.exec_flops == kf.flops
    assert kc.bytes < kf.bytes  # GQA: K/V carry 2 of 8 heads
    grad = OpSig("flash_attention_grad", (q, kv, kv, q, outs[2], outs[3], q), (q, kv, kv),
                 (("causal", False),), default_phase="B")
    (g,) = op_cost(grad)
    assert g.phase == "B" and g.flops == 2 * kf.flops and g.exec_flops == 2.5 * kf.flops


def test_elementwise_and_norm_grads_split_weight_part():
    x, w = T(4, 16, 32), T(32)
    stat = T(64, dtype="float32")
    sig = OpSig("layer_norm_grad", (x, w, w, stat, stat, x), (x, w, w),
                weights=(False, True, True))
    ks = op_cost(sig)
    assert [k.phase for k in ks] == ["B", "W"]
    assert all(k.kind == "memory" for k in ks)
    relu = OpSig("relu", (x,), (x,))
    (r,) = op_cost(relu)
    assert r.bytes == 2 * 2 * 4 * 16 * 32 and r.flops == 4 * 16 * 32


def test_unknown_op_falls_back_to_memory_bound_and_says_so():
    """A bad-input hunt renamed a PIR program's matmul: `cost` charged it as a memory-bound
    kernel without a word (`complete` warned, single-rank costing did not). It warns once
    per op type, its _grad included."""
    from simulator.op_cost import UnknownOpWarning

    sig = OpSig("some_custom_op", (T(10, 10),), (T(10, 10),))
    with pytest.warns(UnknownOpWarning, match="no cost rule for op 'some_custom_op'"):
        (k,) = op_cost(sig)
    assert k.kind == "memory" and k.bytes == 400
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        op_cost(OpSig("some_custom_op_grad", (T(10, 10),), (T(10, 10),)))  # said already
        op_cost(OpSig("matmul", (T(10, 10), T(10, 10)), (T(10, 10),)))  # a known type


@pytest.mark.parametrize("name", ["megatron-1.7b", "megatron-7.5b", "gpt3-175b"])
def test_gpt_layer_forward_flops_match_zb_table1(name):
    b, s = 1, 2048
    prog = build_model(name, batch_size=b, seq_len=s, num_layers=1)
    layer = [op for op in prog.ops if op.struct_name.startswith("decoder.layers.0")]
    flops = sum(k.flops for op in layer for k in op_cost(op_signature(op)))
    h = prog.value("decoder.layers.0.self_attn.q_proj.weight").shape[0]
    expect = 24 * b * s * h * h + 4 * b * s * s * h
    assert flops == pytest.approx(expect, rel=0.01)


def test_roofline_times_from_the_cluster_spec():
    dev = load_cluster("selene").device
    rf = Roofline.from_device(dev)
    assert rf.defaults_used == ("gemm_half_flops",)
    peak, eff = dev.peak("bf16"), dev.efficiency.gemm.value
    ovh = dev.efficiency.kernel_overhead_s.value
    fl = 2.0 * 8192 ** 3
    gemm = KernelCost("F", fl, fl, 3 * 2 * 8192 ** 2, "gemm", "bfloat16", fl)
    size = fl / (fl + DEFAULT_GEMM_HALF_FLOPS)
    assert rf.kernel_time(gemm) == pytest.approx(fl / (peak * eff * size) + ovh)
    mem = KernelCost("F", 1e6, 1e6, 4e9, "memory", "bfloat16")
    bw = dev.memory_bandwidth.value * dev.efficiency.memory_bandwidth.value
    assert rf.kernel_time(mem) == pytest.approx(4e9 / bw + ovh)
    small = KernelCost("F", 2e6, 2e6, 1e3, "gemm", "bfloat16", 2e6)
    assert rf.gemm_eff(2e6) < 0.05 * eff  # tiny GEMMs run far below the plateau
    assert rf.kernel_time(small) > 2e6 / (peak * eff)


def test_roofline_per_op_efficiency_replaces_the_kind_average():
    """``by_op`` ("op:phase" first, then "op") replaces memory_kernels / attention for
    that op only: t = bytes / (B e) + o; other ops keep the average."""
    rf = Roofline(peak_flops={"fp32": 1e11}, gemm_efficiency=1.0, gemm_half_flops=1.0,
                  mem_bandwidth=1e10, mem_efficiency=1.0, kernel_overhead=1e-5,
                  memory_kernel_efficiency=0.5,
                  by_op={"rms_norm_grad:W": 0.1, "rope": 0.25, "flash_attention": 0.05})
    w = KernelCost("W", 0.0, 0.0, 1e6, "memory", "float32", op="rms_norm_grad")
    b = KernelCost("B", 0.0, 0.0, 1e6, "memory", "float32", op="rms_norm_grad")
    r = KernelCost("F", 0.0, 0.0, 1e6, "memory", "float32", op="rope")
    a = KernelCost("F", 1e9, 1e9, 0.0, "attention", "float32", op="flash_attention")
    assert rf.kernel_time(w) == pytest.approx(1e6 / (1e10 * 0.1) + 1e-5)
    assert rf.kernel_time(b) == pytest.approx(1e6 / (1e10 * 0.5) + 1e-5)
    assert rf.kernel_time(r) == pytest.approx(1e6 / (1e10 * 0.25) + 1e-5)
    assert rf.kernel_time(a) == pytest.approx(1e9 / (1e11 * 0.05) + 1e-5)


def test_op_cost_tags_kernels_with_their_op_type():
    sig = OpSig("rms_norm", (T(2, 8, 16), T(16)), (T(2, 8, 16), T(2, 8)))
    assert {k.op for k in op_cost(sig)} == {"rms_norm"}


def test_a_16_bit_dtype_never_runs_at_the_fp32_rate_silently():
    """bf16 and fp16 stand in for each other; with neither listed a 16-bit GEMM is refused
    naming the field (found by a bad-input hunt: a cluster YAML with only an fp32 peak costed
    llama2-7b's bf16 GEMMs at the fp32 rate, 88 ms instead of 14 ms, without a word).
    Integer dtypes still take the largest listed rate."""
    from simulator.errors import SimulatorError

    kw = dict(gemm_efficiency=1.0, gemm_half_flops=1.0, mem_bandwidth=1e10, mem_efficiency=1.0,
              kernel_overhead=1e-5)
    assert Roofline(peak_flops={"fp16": 3e14, "fp32": 2e13}, **kw).peak("bfloat16") == 3e14
    assert Roofline(peak_flops={"bf16": 3e14, "fp32": 2e13}, **kw).peak("float16") == 3e14
    only32 = Roofline(peak_flops={"fp32": 2e13}, **kw)
    for dt in ("bfloat16", "float16"):
        with pytest.raises(SimulatorError, match=rf"{dt} GEMMs need a 16-bit peak .*it lists fp32"):
            only32.peak(dt)
    assert only32.peak("float32") == 2e13 and only32.peak("int64") == 2e13


def test_fp32_never_runs_at_the_16_bit_rate_silently():
    """The converse (found by a bad-input hunt: a cluster YAML without an fp32 peak costed a
    --dtype float32 llama2-7b plan at the bf16 tensor-core rate, 382 ms instead of 2,261 ms,
    and `clusters validate` said ok): float32 GEMMs need fp32 (or tf32) and are refused
    naming the field; tf32 stands in; bf16 plans are unaffected."""
    from simulator.errors import SimulatorError

    kw = dict(gemm_efficiency=1.0, gemm_half_flops=1.0, mem_bandwidth=1e10, mem_efficiency=1.0,
              kernel_overhead=1e-5)
    no32 = Roofline(peak_flops={"bf16": 9.89e14, "fp8": 1.979e15}, **kw)
    with pytest.raises(SimulatorError, match=r"float32 GEMMs need the device's fp32 peak .*lists bf16, fp8"):
        no32.peak("float32")
    assert no32.peak("bfloat16") == 9.89e14 and no32.peak("int64") == 9.89e14
    assert Roofline(peak_flops={"bf16": 9.89e14, "tf32": 4.95e14}, **kw).peak("float32") == 4.95e14
    # a float32 memory-bound kernel (an AMP loss after bf16 GEMMs) is costed, by its bytes;
    # a float32 GEMM is refused naming its op (the review's AMP program)
    from simulator.op_cost import KernelCost

    mem = KernelCost("F", 1e6, 1e6, 4e6, "memory", "float32", op="pd_op.subtract")
    assert no32.kernel_time(mem) == pytest.approx(max(1e6 / 9.89e14, 4e6 / 1e10) + 1e-5)
    gemm = KernelCost("F", 2e9, 2e9, 1e7, "gemm", "float32", op="pd_op.matmul")
    with pytest.raises(SimulatorError, match=r"float32 GEMMs need .* \(op pd_op.matmul\)"):
        no32.kernel_time(gemm)


def test_mfu_peak_is_the_largest_floating_point_peak_other_than_fp8():
    """MFU's denominator (simulator.step): an A100's BF16 312 TFLOP/s even beside an int8
    624 TOP/s entry (the reviewer's case) and an H100's FP8 1979; a CPU that emulates bf16
    (cpu-local: fp32 1e11, bf16 5e10) its fp32 rate; no floating-point peak: refused."""
    from simulator.errors import SimulatorError

    kw = dict(gemm_efficiency=1.0, gemm_half_flops=1.0, mem_bandwidth=1e10, mem_efficiency=1.0,
              kernel_overhead=1e-5)
    assert Roofline(peak_flops={"bf16": 3.12e14, "fp32": 1.95e13, "int8": 6.24e14}, **kw).mfu_peak() == 3.12e14
    assert Roofline(peak_flops={"bf16": 9.89e14, "fp8": 1.979e15}, **kw).mfu_peak() == 9.89e14
    assert Roofline(peak_flops={"fp32": 1e11, "bf16": 5e10}, **kw).mfu_peak() == 1e11
    with pytest.raises(SimulatorError, match="floating-point peak_flops entry other than FP8"):
        Roofline(peak_flops={"fp8": 1e15, "int8": 1e15}, **kw).mfu_peak()

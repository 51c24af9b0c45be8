"""FP8 training (issue 17 item 1): recipes in the strategy, FP8 linears in the program, FP8
GEMM rate and bytes, cast kernels, FP8 weight copies, the FP8 all-gather of torchao's
tensor parallelism, and the refusal of FP8 on devices without FP8 tensor cores."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clusters import load_cluster
from completion.fp8 import FP8Weights, is_fp8_linear, mark_fp8_linears
from completion.models import build_model, get_model_config
from completion.strategy import FP8_DTYPES, FP8_RECIPES, FRAMEWORKS, Strategy, StrategyError
from meshplan import Engine
from meshplan.engine import EngineError
from simulator.errors import SimulatorError
from simulator.fp8 import RECIPES, cast_kernels, fp8_state_bytes
from simulator.op_cost import FP8_DTYPE, op_cost
from simulator.op_signature import OpSig, TensorSig
from simulator.roofline import Roofline


def test_strategy_takes_recipes_and_dtype_spellings():
    s = Strategy(dtype="fp8-delayed")
    assert (s.dtype, s.fp8) == ("bfloat16", "te-delayed")
    assert Strategy(dtype="fp8-tensorwise", framework="fsdp2").fp8 == "tensorwise"
    assert Strategy.from_dict(Strategy(fp8="rowwise", framework="fsdp2").to_dict()).fp8 == "rowwise"
    assert set(FP8_DTYPES.values()) == set(FP8_RECIPES)
    for kw, needle in (({"fp8": "e4m3"}, "'fp8' must be one of"),
                       ({"fp8": "tensorwise"}, "runs under framework fsdp2, fsdp2-eager or fsdp2-async-tp"),
                       ({"fp8": "te-delayed", "dtype": "float16"}, "must be bfloat16"),
                       ({"dtype": "fp8-delayed", "fp8": "rowwise"}, "means fp8 'te-delayed'")):
        with pytest.raises(StrategyError, match=needle):
            Strategy(**kw)


def test_recipe_frameworks_are_catalog_names():
    """FP8_RECIPES names FRAMEWORKS entries (the catalog's names,
    simulator.profiles.check_catalog), and a Strategy takes a recipe exactly under them:
    Transformer Engine under megatron-core, megatron-bridge, nemo and llm-foundry, torchao
    under the FSDP2 three."""
    named = {f for fws in FP8_RECIPES.values() for f in fws}
    assert named <= set(FRAMEWORKS)
    ok = {(r, f) for r in FP8_RECIPES for f in FRAMEWORKS
          if not _refused(lambda r=r, f=f: Strategy(fp8=r, framework=f))}
    assert ok == {("te-delayed", "megatron-core"), ("te-delayed", "megatron-bridge"),
                  ("te-delayed", "nemo"), ("te-delayed", "llm-foundry"),
                  *((r, f) for r in ("tensorwise", "rowwise")
                    for f in ("fsdp2", "fsdp2-eager", "fsdp2-async-tp"))}


def test_the_profiles_say_how_fp8_weights_are_held():
    """The FP8 weight facts are profile fields (``fp8:``), read by nothing else: Megatron-Core
    caches each weight's FP8 cast across micro-batches (is_first_microbatch) and keeps 16-bit
    weights; Megatron-Bridge and NeMo inherit the cache and keep FP8 parameters
    (fp8_param_gather / fp8_params); every other profile states none (cast in every
    forward, 16-bit weights)."""
    from simulator.profiles import list_profiles, load_profile

    held = {n: load_profile(n).fp8_weights for n in list_profiles()}
    assert held.pop("megatron-core") == FP8Weights(cache=True, params=False)
    assert held.pop("megatron-bridge") == held.pop("nemo") == FP8Weights(cache=True, params=True)
    assert set(held.values()) == {FP8Weights()}


def _refused(make) -> bool:
    try:
        make()
    except StrategyError:
        return True
    return False


def _llama(layers: int = 2):
    cfg = get_model_config("llama2-7b").replace(hidden_size=64, num_heads=4, num_kv_heads=4,
                                                ffn_hidden_size=128, vocab_size=256)
    from completion import append_backward

    prog = build_model(cfg, 1, seq_len=8, num_layers=layers)
    append_backward(prog)
    return prog


def test_marking_picks_the_decoder_linears_only():
    prog = _llama()
    n = mark_fp8_linears(prog, "te-delayed", FP8Weights(cache=True))
    assert n == 2 * 7  # q, k, v, o, gate, up, down per layer; the LM head stays BF16
    fwd = [op for op in prog.ops if op.type == "matmul" and op.attrs.get("fp8")]
    grads = [op for op in prog.ops if op.type == "matmul_grad" and op.attrs.get("fp8")]
    assert len(fwd) == len(grads) == 14
    head = [op for op in prog.ops if op.struct_name == "lm_head" and op.type.startswith("matmul")]
    assert head and not any(op.attrs.get("fp8") for op in head) and not any(is_fp8_linear(op) for op in head)
    # TE: one cast of the shared input of q/k/v and of gate/up; o and down cast their own
    casts = {op.struct_name.rsplit(".", 1)[-1]: op.attrs["fp8_cast_x"] for op in fwd if ".0." in op.struct_name}
    assert casts == {"q_proj": True, "k_proj": False, "v_proj": False, "o_proj": True,
                     "gate_proj": True, "up_proj": False, "down_proj": True}
    assert all(op.attrs["fp8_weight_cache"] for op in fwd)
    t = _llama()
    mark_fp8_linears(t, "tensorwise", FP8Weights(), tp=1)  # separate Float8Linear casts
    assert all(op.attrs["fp8_cast_x"] and not op.attrs["fp8_weight_cache"]
               for op in t.ops if op.type == "matmul" and op.attrs.get("fp8"))
    t2 = _llama()
    mark_fp8_linears(t2, "tensorwise", FP8Weights(), tp=2)  # PrepareFloat8ModuleInput: one cast
    assert sum(op.attrs.get("fp8_cast_x", False) for op in t2.ops if op.type == "matmul") == 2 * 4


def _mm(recipe: str | None, cast_x: bool = True, cache: bool = False) -> OpSig:
    x, w, y = TensorSig((1, 8, 64), "bfloat16"), TensorSig((64, 128), "bfloat16"), TensorSig((1, 8, 128), "bfloat16")
    attrs = [("transpose_x", False), ("transpose_y", False)]
    if recipe:
        attrs += [("fp8", recipe), ("fp8_cast_x", cast_x), ("fp8_weight_cache", cache)]
    return OpSig("matmul", (x, w), (y,), tuple(sorted(attrs)), family="matmul")


def _mm_grad(recipe: str | None) -> OpSig:
    x, w, g = TensorSig((1, 8, 64), "bfloat16"), TensorSig((64, 128), "bfloat16"), TensorSig((1, 8, 128), "bfloat16")
    attrs = [("transpose_x", False), ("transpose_y", False)] + ([("fp8", recipe)] if recipe else [])
    return OpSig("matmul_grad", (x, w, g), (x, w), tuple(sorted(attrs)), family="matmul_grad",
                 weights=(False, True), default_phase="B")


def test_fp8_gemm_bytes_and_dtype_by_hand():
    (bf,), (f8,) = op_cost(_mm(None)), op_cost(_mm("te-delayed"))
    assert bf.flops == f8.flops == 2 * 8 * 128 * 64
    assert bf.bytes == 2 * (512 + 8192 + 1024) and bf.dtype == "bfloat16"
    assert f8.bytes == 512 + 8192 + 2 * 1024 and f8.dtype == FP8_DTYPE  # FP8 in, BF16 out
    dx, dw = op_cost(_mm_grad("tensorwise"))
    assert (dx.phase, dw.phase) == ("B", "W") and dx.dtype == dw.dtype == FP8_DTYPE
    assert dx.bytes == 1024 + 8192 + 2 * 512  # dout, w in FP8; dx in BF16
    assert dw.bytes == 512 + 1024 + 2 * 8192


def _by_phase(kernels) -> dict:
    out: dict = {}
    for k in kernels:
        out.setdefault(k.phase, []).append(k.bytes)
    return out


def test_cast_kernel_bytes_by_hand():
    # x: 512 elements, W: 8192, dout: 1024; module docstring of simulator.fp8
    te = _by_phase(cast_kernels(_mm("te-delayed", cache=True)))
    assert te == {"F": [4 * 512], "O": [4 * 8192, 2 * 3 * 1024 * 4]}
    assert _by_phase(cast_kernels(_mm("te-delayed", cast_x=False, cache=False))) == \
        {"F": [4 * 8192], "O": [2 * 3 * 1024 * 4]}  # no input cast; weight every forward
    assert _by_phase(cast_kernels(_mm_grad("te-delayed"))) == {"B": [4 * 1024]}
    tw = _by_phase(cast_kernels(_mm("tensorwise"), compiled=False))
    assert tw == {"F": [2 * 512, 4 * 512, 2 * 8192, 3 * 8192]}
    assert _by_phase(cast_kernels(_mm("tensorwise"), compiled=True))["F"][:2] == [0, 4 * 512]
    assert _by_phase(cast_kernels(_mm_grad("tensorwise"), compiled=False)) == \
        {"B": [2 * 1024, 4 * 1024, 3 * 8192]}
    rw = _by_phase(cast_kernels(_mm("rowwise"), compiled=False))
    assert rw == {"F": [5 * 512, 3 * 512, 3 * 8192]}
    assert _by_phase(cast_kernels(_mm_grad("rowwise"), compiled=True)) == \
        {"B": [3 * 1024, 3 * 1024, 4 * 8192, 3 * 8192]}
    assert cast_kernels(_mm(None)) == []
    assert fp8_state_bytes(_mm("te-delayed", cache=True)) == 2 * 8192 + 3 * 1026 * 4
    assert fp8_state_bytes(_mm("tensorwise")) == 0


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 64), st.integers(1, 64), st.integers(1, 64), st.sampled_from(sorted(RECIPES)),
       st.booleans())
def test_cast_bytes_scale_with_the_tensors(m, k, n, recipe, compiled):
    """Every cast kernel's bytes are a per-element constant times its tensor's size."""
    x, w, y = TensorSig((m, k), "bfloat16"), TensorSig((k, n), "bfloat16"), TensorSig((m, n), "bfloat16")
    sig = OpSig("matmul", (x, w), (y,), (("fp8", recipe), ("fp8_cast_x", True)), family="matmul")
    rec = RECIPES[recipe]
    per_x = sum(c.nbytes(1, compiled) for c in rec.input)
    per_w = sum(c.nbytes(1, False) for c in rec.weight if c.phase != "B")
    hist = 2 * 3 * rec.amax_history_len * 4 if rec.amax_history_len else 0
    assert sum(kk.bytes for kk in cast_kernels(sig, compiled)) == pytest.approx(per_x * m * k + per_w * k * n + hist)


def test_fp8_rate_is_the_devices_fp8_peak():
    rf = Roofline.from_device(load_cluster("dgx-h100").device)
    shape = (1, 8192, 8192, 8192)
    assert rf.peak(FP8_DTYPE) == 1.979e15
    bf, f8 = rf.gemm_tiling(shape, "bfloat16"), rf.gemm_tiling(shape, FP8_DTYPE)
    # the main loop runs at the FP8 peak; the epilogue stores bf16 either way (H100: 132 SMs
    # store 2 bytes an element at 3.35e12 * 0.8 / 132 B/s each; simulator/roofline.py)
    assert rf.epilogue_exposed and f8.tile == bf.tile and f8.waves == bf.waves
    store = bf.waves * bf.tile[0] * bf.tile[1] * 2 * 132 / (3.35e12 * 0.8)
    assert f8.compute_s - store == pytest.approx((bf.compute_s - store) * 989 / 1979)
    a100 = Roofline.from_device(load_cluster("dgx-a100-80g").device)
    with pytest.raises(SimulatorError, match="fp8 peak_flops"):
        a100.peak(FP8_DTYPE)


def test_a100_with_fp8_is_refused_naming_the_device():
    with pytest.raises(EngineError, match="device 'A100-SXM-80GB' of cluster 'dgx-a100-80g' lists no fp8"):
        Engine("llama2-7b", "dgx-a100-80g", Strategy(dp=8, micro_batch_size=1, global_batch_size=8,
                                                      dtype="fp8-delayed"))


def _run(fp8, framework="megatron-core", tp=1, sp=False, layers=2, gbs=8):
    s = Strategy(dp=8 // tp, tp=tp, micro_batch_size=1, global_batch_size=gbs, framework=framework,
                 fp8=fp8, sequence_parallel=sp)
    return Engine("llama2-7b", "dgx-h100", s, seq_len=2048, num_layers=layers).simulate()


def test_te_weight_copies_in_memory_by_hand():
    # llama2-7b linears per layer: 4 * 4096^2 + 3 * 4096 * 11008 = 202,375,168 weights;
    # 2 layers, 2 bytes each (FP8 weight + transpose) + 14 GEMMs x 3 x (1024 + 2) fp32
    bf, f8 = _run(None), _run("te-delayed")
    want = 2 * 2 * 202_375_168 + 14 * 3 * 1026 * 4
    assert f8.memory_breakdown["fp8_weights"] == want
    saved = bf.memory_breakdown["activations"] - f8.memory_breakdown["activations"]
    assert saved == 61_865_984  # test_te_keeps_fp8_copies_of_linear_inputs_by_hand
    frag = bf.memory_breakdown["fragmentation"] - f8.memory_breakdown["fragmentation"]
    assert frag == round(0.05 * saved)  # megatron-core's fragmentation share of the saving
    assert f8.max_memory_bytes - bf.max_memory_bytes == want - saved - frag
    assert f8.step_time < bf.step_time


def test_te_keeps_fp8_copies_of_linear_inputs_by_hand():
    """Transformer Engine saves the FP8 cast of a linear's input for its weight gradient
    (``simulator.fp8.Fp8Recipe.saved_input_bytes``). llama2-7b, s 2048, mbs 1, one
    micro-batch in flight, per layer: the input norm's output [2048, 4096] (read only by
    the q/k/v weight gradients) 2 -> 1 byte: -8,388,608; the attention output (read by the
    o_proj weight gradient and by flash attention's backward) keeps BF16 and adds its FP8
    copy: +8,388,608; the post-attention norm's output (gate/up) -8,388,608; the SwiGLU
    output [2048, 11008] (down) -22,544,384: 30,932,992 a layer, 61,865,984 for 2.
    torchao's tensorwise recipe saves BF16: no change."""
    bf, te, tw = _run(None), _run("te-delayed"), _run("tensorwise", framework="fsdp2")
    per_layer = 2048 * 4096 - 2048 * 4096 + 2048 * 4096 + 2048 * 11008
    assert per_layer == 30_932_992
    assert bf.memory_breakdown["activations"] - te.memory_breakdown["activations"] == 2 * per_layer
    bf2 = _run(None, framework="fsdp2")
    assert tw.memory_breakdown["activations"] == bf2.memory_breakdown["activations"]


def test_te_weight_cast_is_once_per_step():
    one, four = _run("te-delayed", gbs=8), _run("te-delayed", gbs=32)
    # four micro-batches: the per-micro-batch work x4, the per-step casts once
    assert four.time_breakdown["optimizer"] == pytest.approx(one.time_breakdown["optimizer"], rel=0.05)
    assert one.time_breakdown["optimizer"] > _run(None, gbs=8).time_breakdown["optimizer"]


def test_torchao_tp_all_gathers_in_fp8():
    bf = _run(None, "fsdp2", tp=2, sp=True)
    tw = _run("tensorwise", "fsdp2", tp=2, sp=True)
    rw = _run("rowwise", "fsdp2", tp=2, sp=True)
    assert tw.time_breakdown["tp_comm"] < bf.time_breakdown["tp_comm"]
    assert rw.time_breakdown["tp_comm"] == pytest.approx(bf.time_breakdown["tp_comm"])


def test_cli_dtype_fp8(capsys, tmp_path):
    from tests._cli import one_line_error, run_main

    base = ["cost", "--model", "llama2-7b", "--dp", "8", "--micro-batch-size", "1",
            "--global-batch", "8", "--seq-len", "1024"]
    rc, out, err = run_main(capsys, *base, "--cluster", "dgx-h100", "--dtype", "fp8-delayed")
    assert rc == 0 and "fp8 te-delayed (decoder linears)" in out and "fp8_weights" in out
    line = one_line_error(*run_main(capsys, *base, "--cluster", "dgx-a100-80g", "--dtype", "fp8-delayed"))
    assert "device 'A100-SXM-80GB'" in line
    line = one_line_error(*run_main(capsys, *base, "--cluster", "dgx-h100", "--dtype", "fp8-tensorwise"))
    assert ("--dtype fp8-tensorwise runs under --framework fsdp2, fsdp2-eager or fsdp2-async-tp, "
            "not megatron-core: give one of them") in line
    line = one_line_error(*run_main(capsys, *base, "--cluster", "dgx-h100", "--dtype", "fp8-delayed",
                                    "--framework", "fsdp2"))
    assert "--dtype fp8-delayed runs under --framework megatron-core, megatron-bridge, nemo or " \
           "llm-foundry, not fsdp2: give one of them" in line, line


def test_cli_warns_one_line_per_unmodelled_key(tmp_path):
    """In a real process (pytest captures warnings in-process): one ``warning:`` line."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    f = tmp_path / "neox.json"
    f.write_text(json.dumps({"model_type": "gpt_neox", "num_hidden_layers": 1, "hidden_size": 64,
                             "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 256,
                             "max_position_embeddings": 64, "rotary_pct": 0.25}))
    root = Path(__file__).resolve().parents[2]
    p = subprocess.run([sys.executable, "-m", "meshplan.cli", "cost", "--model", str(f), "--cluster",
                        "dgx-h100", "--global-batch", "1", "--seq-len", "32"], cwd=root,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert [ln for ln in p.stderr.splitlines() if ln.strip()] == [
        f"warning: {f}: rotary_pct=0.25 (model_type 'gpt_neox') is not modelled: rotary on every head "
        "dim (cost difference negligible)"]

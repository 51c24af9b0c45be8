"""Hugging Face model types and fields (issue 17 item 4): published parameter counts,
activations, head_dim, biases, qk-norm, sliding windows, warnings and errors."""

from __future__ import annotations

import json
import math
import time
import warnings
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from completion.models import (
    ModelConfig,
    ModelConfigError,
    ModelConfigWarning,
    build_model,
    config_from_hf_dict,
    load_hf_config,
)
from completion.models.hf_types import MODEL_TYPES
from simulator.op_cost import op_cost
from simulator.op_signature import OpSig, TensorSig, op_signature

CONFIGS = Path(__file__).parents[1] / "data" / "hf_configs"


def _count(path: str) -> int:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ModelConfigWarning)
        cfg = load_hf_config(CONFIGS / path)
    return build_model(cfg, 1, seq_len=8).num_parameters()


# Derivations (h hidden, a heads, g kv heads, d head dim, f ffn, V vocab, l layers):
# layer = h*a*d (+a*d bias) + 2*h*g*d (+2*g*d) + a*d*h + 3*h*f + norms*h;
# total = l*layer + (1 or 2)*V*h + h (final norm).
# Mistral-7B v0.1: 32 * (16,777,216 + 8,388,608 + 16,777,216 + 176,160,768 + 8,192)
#   + 2 * 131,072,000 + 4,096 = 7,241,732,096
# Qwen2-7B (q/k/v biases): 28 * (12,848,640 + 3,671,040 + 12,845,056 + 203,685,888 + 7,168)
#   + 2 * 544,997,376 + 3,584 = 7,615,616,512
# Llama-3.1-8B: 32 * 218,112,000 + 2 * 525,336,576 + 4,096 = 8,030,261,248
# Gemma-2-9B (d = 256, tied, 4 norms per layer): 42 * (14,680,064 * 3 + 154,140,672 +
#   14,336) + 917,504,000 + 3,584 = 9,241,705,984
@pytest.mark.parametrize("path,want", [
    ("mistral-7b-v0.1.json", 7_241_732_096),
    ("qwen2-7b.json", 7_615_616_512),
    ("llama-3.1-8b.json", 8_030_261_248),
    ("gemma-2-9b.json", 9_241_705_984),
])
def test_published_parameter_counts(path, want):
    assert _count(path) == want


def test_published_configs_read_their_fields():
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        g = load_hf_config(CONFIGS / "gemma-2-9b.json")
    assert (g.head_dim, g.mlp_activation, g.norm_placement, g.tie_word_embeddings) == (256, "geglu_tanh", "sandwich", True)
    assert (g.window_of(0), g.window_of(1)) == (4096, None)  # local layers alternate
    msgs = [str(x.message) for x in w if issubclass(x.category, ModelConfigWarning)]
    assert len(msgs) == 2 and "attn_logit_softcapping=50.0" in msgs[0] and "final_logit_softcapping" in msgs[1]
    assert all("\n" not in m for m in msgs)
    q = load_hf_config(CONFIGS / "qwen2-7b.json")  # use_sliding_window false: no window, no warning
    assert (q.qkv_bias, q.o_bias, q.sliding_window) == (True, False, None)
    m = load_hf_config(CONFIGS / "mistral-7b-v0.1.json")
    assert m.sliding_window == 4096 and m.window_of(31) == 4096
    with warnings.catch_warnings():
        warnings.simplefilter("error", ModelConfigWarning)  # rope_scaling: accepted, silent
        lam = load_hf_config(CONFIGS / "llama-3.1-8b.json")
    assert lam.rope_theta == 500000.0 and lam.mlp_activation == "swiglu"


#: a tiny config.json per model type: 2 layers, h 64, 4 heads (2 kv), ffn 128, V 256
_TINY = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
         "intermediate_size": 128, "vocab_size": 256, "max_position_embeddings": 64}
_EXTRA = {
    "llama": {}, "mistral": {"sliding_window": 16}, "qwen2": {}, "qwen3": {"head_dim": 32},
    "gemma": {"head_dim": 32}, "gemma2": {"head_dim": 32, "sliding_window": 16},
    "phi3": {}, "olmo2": {}, "gpt2": {"n_inner": None}, "gpt": {}, "megatron-gpt": {},
    "gpt_neox": {}, "nemotron": {},
    "mixtral": {"num_local_experts": 4, "num_experts_per_tok": 2},
    "qwen2_moe": {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                  "shared_expert_intermediate_size": 64},
    "qwen3_moe": {"head_dim": 32, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32},
    # issue 42: multi-head latent attention (k/v heads = heads), a dense first layer, node-limited
    # sigmoid routing; GPT-OSS sinks and biases; Llama 4's text config inside text_config
    **{mt: {"num_key_value_heads": 4, "q_lora_rank": 24, "kv_lora_rank": 16, "qk_rope_head_dim": 8,
            "qk_nope_head_dim": 16, "v_head_dim": 16, "n_routed_experts": 4, "num_experts_per_tok": 2,
            "moe_intermediate_size": 32, "n_shared_experts": 1, "first_k_dense_replace": 1, "n_group": 2,
            "topk_group": 1, "routed_scaling_factor": 2.5} for mt in ("deepseek_v3", "kimi_k2")},
    "gpt_oss": {"head_dim": 16, "num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": 16},
    "llama4_text": {"head_dim": 16, "num_local_experts": 4, "num_experts_per_tok": 1,
                    "intermediate_size_mlp": 128, "interleave_moe_layer_step": 2},
    "llama4": {"text_config": {**_TINY, "head_dim": 16, "num_local_experts": 4, "num_experts_per_tok": 1,
                               "intermediate_size_mlp": 128, "interleave_moe_layer_step": 2}},
}


def _tiny(mt: str, **kw) -> dict:
    return {"model_type": mt, **_TINY, **_EXTRA[mt], **kw}


def test_every_model_type_has_a_tiny_config():
    assert set(_EXTRA) == set(MODEL_TYPES)


@pytest.mark.parametrize("mt", sorted(MODEL_TYPES))
def test_each_type_builds_from_config_json_and_costs_fast(tmp_path, mt):
    from meshplan import Engine, Strategy

    f = tmp_path / "config.json"
    f.write_text(json.dumps(_tiny(mt)))
    strat = Strategy(dp=2, tp=2, micro_batch_size=1, global_batch_size=4)
    best = math.inf
    for seq in (32, 48):  # two distinct builds (no cost cache hit); the faster on a shared CPU
        t0 = time.perf_counter()
        ms, mem = Engine(str(f), "dgx-h100", strat, seq_len=seq).cost()
        best = min(best, time.perf_counter() - t0)
        assert ms > 0 and mem > 0
    assert best < 1.0


def _types(cfg: ModelConfig) -> Counter:
    return Counter(op.type for op in build_model(cfg, 1, seq_len=8).ops)


@pytest.mark.parametrize("act,ops,params_per_layer", [
    # h=64, f=128: plain MLPs 2 * 64 * 128 weights (+ 128 + 64 biases in gpt), gated 3 * ...
    ("gelu_new", {"gelu": 1, "square": 0, "multiply": 0}, 2 * 64 * 128),
    ("relu", {"relu": 1, "square": 0}, 2 * 64 * 128),
    ("relu2", {"relu": 1, "square": 1}, 2 * 64 * 128),
    ("silu", {"silu": 1, "swiglu": 0}, 2 * 64 * 128),
])
def test_plain_activations_of_gpt_neox(act, ops, params_per_layer):
    # gpt_neox: non-gated, biases on every linear, layer_norm, rotary
    cfg = config_from_hf_dict(_tiny("gpt_neox", hidden_act=act, num_hidden_layers=1))
    t = _types(cfg)
    for op, n in ops.items():
        assert t[op] == n, op
    assert t["embedding"] == 1 and t["fused_rotary_position_embedding"] == 1  # rope, no table
    mlp = build_model(cfg, 1, seq_len=8)
    names = {p.name: math.prod(p.shape) for p in mlp.parameters()}
    got = sum(v for k, v in names.items() if ".mlp." in k and k.endswith("weight"))
    assert got == params_per_layer
    assert names["decoder.layers.0.mlp.up_proj.bias"] == 128


@pytest.mark.parametrize("mt,act,want", [
    ("llama", "silu", "swiglu"), ("gemma", "gelu", "geglu"), ("gemma", "gelu_pytorch_tanh", "geglu_tanh"),
    ("phi3", "relu", "reglu"), ("nemotron", "relu2", "relu2"), ("gpt2", "gelu_new", "gelu_tanh"),
])
def test_activation_names_map(mt, act, want):
    key = "activation_function" if mt == "gpt2" else "hidden_act"
    cfg = config_from_hf_dict(_tiny(mt, **{key: act}))
    assert cfg.mlp_activation == want
    t = _types(cfg)
    gated = want in ("swiglu", "geglu", "geglu_tanh", "reglu")
    assert t["multiply"] == (2 if gated and want != "swiglu" else 0)
    n_gate = sum(1 for p in build_model(cfg, 1, seq_len=8).parameters() if "gate_proj" in (p.name or ""))
    assert n_gate == (2 if gated else 0)


def test_gated_relu2_is_refused_and_unknown_activation_named():
    with pytest.raises(ModelConfigError, match="'hidden_act' 'relu2' has no gated"):
        config_from_hf_dict(_tiny("llama", hidden_act="relu2"))
    with pytest.raises(ModelConfigError, match="'hidden_act' must be one of"):
        config_from_hf_dict(_tiny("llama", hidden_act="mish"))


def test_unknown_model_type_is_a_clear_error():
    with pytest.raises(ModelConfigError, match=r"model_type 'mamba' is not one of \[.*'qwen3'"):
        config_from_hf_dict({"model_type": "mamba"}, "c.json")


def test_qk_norm_and_head_dim_shapes():
    q3 = config_from_hf_dict(_tiny("qwen3"))  # head_dim 32 != 64 / 4
    prog = build_model(q3, 1, seq_len=8)
    ps = {p.name: list(p.shape) for p in prog.parameters()}
    assert ps["decoder.layers.0.self_attn.q_proj.weight"] == [64, 4 * 32]
    assert ps["decoder.layers.0.self_attn.k_proj.weight"] == [64, 2 * 32]
    assert ps["decoder.layers.0.self_attn.q_norm.weight"] == [32]
    fa = next(op for op in prog.ops if op.type == "flash_attention")
    assert list(fa.operands[0].shape) == [1, 8, 4, 32]
    o2 = build_model(config_from_hf_dict(_tiny("olmo2")), 1, seq_len=8)
    ps = {p.name: list(p.shape) for p in o2.parameters()}
    assert ps["decoder.layers.0.self_attn.q_norm.weight"] == [4 * 16]
    assert ps["decoder.layers.0.self_attn.k_norm.weight"] == [2 * 16]
    assert "decoder.layers.0.post_feedforward_layernorm.weight" in ps
    assert "decoder.layers.0.input_layernorm.weight" not in ps  # post-norm


def test_attention_bias_switches_o_proj_too():
    cfg = config_from_hf_dict(_tiny("llama", attention_bias=True))
    names = {p.name for p in build_model(cfg, 1, seq_len=8).parameters()}
    assert {"decoder.layers.0.self_attn.q_proj.bias", "decoder.layers.0.self_attn.o_proj.bias"} <= names
    assert not any(".mlp." in n and n.endswith("bias") for n in names)


def test_unmodelled_key_warns_once_per_key():
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        config_from_hf_dict(_tiny("gpt_neox", rotary_pct=0.25, use_parallel_residual=True), "neox.json")
        config_from_hf_dict(_tiny("gpt_neox", rotary_pct=1.0, use_parallel_residual=False), "neox.json")
    msgs = [str(x.message) for x in w if issubclass(x.category, ModelConfigWarning)]
    assert msgs == [m for m in msgs if m.startswith("neox.json: ")] and len(msgs) == 2
    assert "rotary_pct=0.25" in msgs[0] and "use_parallel_residual=True" in msgs[1]


def _fa_sig(s: int, window: int | None) -> OpSig:
    q = TensorSig((1, s, 2, 8), "bfloat16")
    attrs = [("causal", True)] + ([("sliding_window", window)] if window else [])
    return OpSig("flash_attention", (q, q, q), (q,), tuple(sorted(attrs)), family="flash_attention")


def test_sliding_window_executed_flops_hand_derived():
    # s = 8, w = 3: rows 0..7 see 1, 2, 3, 3, 3, 3, 3, 3 keys = 21 of 64 scores; model
    # FLOPs count each query against the w = 3 keys it may see (no causal halving, as
    # without a window): 4 b h s w d
    full = 4.0 * 1 * 2 * 8 * 8 * 8
    k = op_cost(_fa_sig(8, 3))[0]
    assert k.flops == 4.0 * 1 * 2 * 8 * 3 * 8
    assert k.exec_flops == pytest.approx(full * 21 / 64)
    # long sequences use the closed form: w (w + 1) / 2 + (s - w) w
    s, w = 8192, 4096
    big = op_cost(_fa_sig(s, w))[0]
    full = 4.0 * 1 * 2 * s * s * 8
    assert big.flops == pytest.approx(full * w / s)
    assert big.exec_flops == pytest.approx(full * (w * (w + 1) / 2 + (s - w) * w) / s**2)
    # the backward's model FLOPs are twice the forward's, windowed the same way
    g = op_cost(OpSig("flash_attention_grad", _fa_sig(s, w).ins * 2, _fa_sig(s, w).ins,
                      _fa_sig(s, w).attrs, family="flash_attention_grad"))[0]
    assert g.flops == pytest.approx(2 * big.flops)


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 40), st.integers(1, 50))
def test_window_fraction_matches_a_mask_count(s, w):
    import numpy as np

    i, j = np.arange(s)[:, None], np.arange(s)[None, :]
    seen = ((j <= i) & (j > i - w)).sum()
    k = op_cost(_fa_sig(s, w))[0]
    assert k.exec_flops == pytest.approx(4.0 * 2 * s * s * 8 * seen / (s * s))
    assert k.flops == pytest.approx(4.0 * 2 * s * min(s, w) * 8)


def test_window_only_set_where_it_masks_something():
    cfg = config_from_hf_dict(_tiny("mistral"))  # window 16
    fa = [op for op in build_model(cfg, 1, seq_len=32).ops if op.type == "flash_attention"]
    assert [op.attrs.get("sliding_window") for op in fa] == [16, 16]
    fa = [op for op in build_model(cfg, 1, seq_len=16).ops if op.type == "flash_attention"]
    assert [op.attrs.get("sliding_window") for op in fa] == [None, None]  # w >= s: plain causal


def test_executor_window_mask_equals_numpy_reference():
    import numpy as np
    import torch

    from executor.kernels.attention import _scores

    rng = np.random.default_rng(0)
    q, k = (torch.tensor(rng.standard_normal((1, 2, 6, 4))) for _ in range(2))
    got = _scores(q, k, True, window=2).numpy()
    ref = (q.numpy() @ k.numpy().transpose(0, 1, 3, 2)) / 2.0
    i, j = np.arange(6)[:, None], np.arange(6)[None, :]
    ref = np.where((j <= i) & (j > i - 2), ref, -np.inf)
    np.testing.assert_allclose(got, ref, rtol=1e-12)


def test_model_config_field_errors():
    base = dict(name="m", family="llama", num_layers=1, hidden_size=64, num_heads=4, num_kv_heads=2,
                ffn_hidden_size=128, vocab_size=10, seq_len=8)
    for bad, needle in (({"activation": "mish"}, "activation 'mish'"), ({"kv_channels": 0}, "kv_channels"),
                        ({"norm_placement": "middle"}, "norm_placement"), ({"qk_norm": "x"}, "qk_norm"),
                        ({"sliding_window": -1}, "sliding_window"), ({"qkv_bias": "yes"}, "qkv_bias"),
                        ({"kv_channels": 31}, "even for rotary")):
        with pytest.raises(ModelConfigError, match=needle):
            ModelConfig(**base, **bad)
    # an explicit head dim lifts the h % a check
    assert ModelConfig(**{**base, "num_heads": 6, "num_kv_heads": 2}, kv_channels=16).head_dim == 16


def test_relu2_mlp_kernels_by_hand():
    """Squared ReLU: relu then square on the [b, s, f] up projection, each one memory-bound
    kernel reading and writing b*s*f bf16 elements (1 FLOP per element); the backward has
    square_grad (reads x) and relu_grad (reads out)."""
    from completion import append_backward
    from simulator.op_signature import op_signature

    cfg = config_from_hf_dict(_tiny("nemotron", num_hidden_layers=1))
    prog = build_model(cfg, 1, seq_len=8)
    append_backward(prog)
    n = 1 * 8 * 128
    for t in ("relu", "square"):
        (k,) = op_cost(op_signature(next(op for op in prog.ops if op.type == t)))
        assert (k.kind, k.flops, k.bytes) == ("memory", n, 2 * n * 2)
    grads = Counter(op.type for op in prog.ops if op.type.endswith("_grad"))
    assert grads["square_grad"] == grads["relu_grad"] == 1
    (kg,) = op_cost(op_signature(next(op for op in prog.ops if op.type == "square_grad")))
    assert kg.bytes == 3 * n * 2  # x and out@GRAD read, x@GRAD written


def test_windowed_layers_are_costed_each_not_by_a_representative_layer():
    """Gemma-2 windows every other layer: the representative program (first, middle, last
    layer) costed the middle layers with full attention (a warning said so, and MFU was
    overstated). Layers with different attention spans are now costed one by one
    (``ModelConfig.uniform_at``): model FLOPs and step time are linear in the number of
    windowed layers, so 3 of 6 windowed lands exactly half-way between none and all."""
    from meshplan import Engine, Strategy

    cfg = config_from_hf_dict({"model_type": "gemma2", "num_hidden_layers": 6, "hidden_size": 1024,
                               "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 128,
                               "intermediate_size": 4096, "vocab_size": 32000,
                               "max_position_embeddings": 8192, "sliding_window": 1024}, "g.json")
    assert [cfg.window_of(i) for i in range(6)] == [1024, None] * 3
    assert not cfg.uniform_at(8192) and cfg.uniform_at(1024)  # w >= s: no key masked anywhere
    strat = Strategy(micro_batch_size=1, global_batch_size=2)
    got = {}
    for name, c in (("none", cfg.replace(sliding_window=None)), ("alt", cfg),
                    ("all", cfg.replace(sliding_window_layers=tuple(range(6))))):
        with warnings.catch_warnings():
            warnings.simplefilter("error", ModelConfigWarning)  # no warning line any more
            r = Engine(c, "dgx-h100", strat, seq_len=8192).simulate()
        got[name] = (r.model_flops, r.step_time)
    assert got["none"][0] > got["alt"][0] > got["all"][0]
    assert got["alt"][0] == pytest.approx((got["none"][0] + got["all"][0]) / 2, rel=1e-12)
    assert got["alt"][1] == pytest.approx((got["none"][1] + got["all"][1]) / 2, rel=1e-9)
    # a windowed layer: 12 h s (s - w) fewer FLOPs per sequence (README), h = 8 heads x 128,
    # for the 2 sequences of the step
    assert (got["none"][0] - got["all"][0]) / 6 == 12 * 1024 * 8192 * (8192 - 1024) * 2


def test_qwen_windows_start_at_max_window_layers_and_layer_types_win():
    """transformers' Qwen2Config windows layer i only when i >= max_window_layers (default
    28); meshplan windowed every layer (a hunt found Qwen2-7B, 28 layers, max_window_layers
    28, costed 23% short). An explicit ``layer_types`` list wins; a wrong one is refused."""
    raw = {"model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944,
           "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
           "vocab_size": 152064, "max_position_embeddings": 131072, "use_sliding_window": True,
           "sliding_window": 4096, "max_window_layers": 20}
    c = config_from_hf_dict(dict(raw), "q.json")
    assert [i for i in range(28) if c.window_of(i)] == list(range(20, 28))
    assert [i for i in range(28) if config_from_hf_dict({**raw, "max_window_layers": 28}).window_of(i)] == []
    no_key = {k: v for k, v in raw.items() if k != "max_window_layers"}
    assert config_from_hf_dict(no_key).sliding_window_layers == ()  # the default 28: none
    assert config_from_hf_dict({**no_key, "num_hidden_layers": 30}).sliding_window_layers == (28, 29)
    kinds = ["sliding_attention", "full_attention"] * 14
    assert config_from_hf_dict({**raw, "layer_types": kinds}).sliding_window_layers == tuple(range(0, 28, 2))
    off = config_from_hf_dict({**raw, "use_sliding_window": False, "layer_types": kinds})
    assert off.sliding_window is None and off.window_of(0) is None
    with pytest.raises(ModelConfigError, match="'layer_types' must be a list of 28 entries .* got 27"):
        config_from_hf_dict({**raw, "layer_types": kinds[:27]})
    with pytest.raises(ModelConfigError, match=r"'layer_types' has \['linear_attention'\]"):
        config_from_hf_dict({**raw, "layer_types": ["linear_attention"] * 28})
    with pytest.raises(ModelConfigError, match="'max_window_layers' must be an int >= 0"):
        config_from_hf_dict({**raw, "max_window_layers": -1})


@pytest.mark.parametrize("key", ["num_local_experts", "num_experts", "n_routed_experts"])
def test_mixture_of_experts_configs_are_refused_not_costed_dense(key):
    """A Mixtral / Qwen-MoE / DeepSeek config under a known model_type was costed as its dense
    model (same step time, no warning; a new-user trial found it): it is refused, naming the
    key; one expert (a dense model stating it) is accepted."""
    from completion.models.hf_config import config_from_hf_dict

    base = {"model_type": "mistral", "num_hidden_layers": 2, "hidden_size": 64,
            "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128,
            "vocab_size": 256, "max_position_embeddings": 64}
    with pytest.raises(ModelConfigError, match=f"{key} = 8: mixture-of-experts models are not modelled"):
        config_from_hf_dict({**base, key: 8, "num_experts_per_tok": 2}, "mixtral.json")
    assert config_from_hf_dict({**base, key: 1}, "dense.json").num_layers == 2


def test_a_long_context_window_is_not_the_default_training_length():
    """Llama-3.1's max_position_embeddings 131,072 is a context window: the default sequence
    is capped to 8,192 with one warning line; a given --seq-len is kept; a config whose
    window is at most 8,192 keeps it."""
    from completion.models.config import ModelConfigWarning
    from completion.models.source import DEFAULT_TRAIN_SEQ, resolve_model

    with pytest.warns(ModelConfigWarning, match="max_position_embeddings 131072 is the context window"):
        src = resolve_model(str(CONFIGS / "llama-3.1-8b.json"))
    assert (src.seq_len, src.context_window) == (DEFAULT_TRAIN_SEQ, 131072) == (8192, 131072)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        kept = resolve_model(str(CONFIGS / "llama-3.1-8b.json"), seq_len=131072)
        assert (kept.seq_len, kept.context_window) == (131072, 0)


def test_the_backward_of_windowed_attention_keeps_the_window(tmp_path):
    """flash_attention_grad takes over the forward's sliding_window (OpDef.carried_attrs),
    so the backward is costed on the same band: its model FLOPs are twice the forward's
    (4 b h s min(w, s) d each way; found by a new-user check: Mistral-7B at 16k had its
    backward charged as full causal attention, 6.50e16 model FLOPs a step instead of 5.15e16)."""
    from meshplan import Engine, Strategy

    f = tmp_path / "config.json"
    f.write_text(json.dumps(_tiny("mistral")))  # window 16
    prog = Engine(str(f), "dgx-h100", Strategy(global_batch_size=1), seq_len=32).plan_program().program
    fwd = [op for op in prog.ops if op.type == "flash_attention"]
    bwd = [op for op in prog.ops if op.type == "flash_attention_grad"]
    assert len(fwd) == len(bwd) == 2
    assert [op.attrs.get("sliding_window") for op in bwd] == [16, 16]
    for a, g in zip(fwd, bwd, strict=True):
        fa = op_cost(op_signature(a, None, frozenset(), global_shapes=True))[0]
        ga = op_cost(op_signature(g, None, frozenset(), global_shapes=True))[0]
        assert ga.flops == pytest.approx(2 * fa.flops)
        b, s, h, d = a.operands[0].type.shape
        assert fa.flops == pytest.approx(4.0 * b * h * s * 16 * d)
    # a model without a window: the grad op carries no such attribute (dumps unchanged)
    f.write_text(json.dumps(_tiny("llama")))
    prog = Engine(str(f), "dgx-h100", Strategy(global_batch_size=1), seq_len=32).plan_program().program
    assert all("sliding_window" not in op.attrs for op in prog.ops if op.type == "flash_attention_grad")


def test_a_near_miss_of_a_key_is_named_once_other_unread_keys_pass():
    """Found by a bad-input hunt: ``num_key_value_head`` (for ``num_key_value_heads``) was
    ignored without a word and the model silently became full multi-head attention. An
    unread key that is a near miss of a key the parser looked for and did not find warns
    once, naming both; keys with no cost effect (``foo_bar``, token ids) stay silent, as do
    the bundled published configs."""
    raw = _tiny("llama") | {"foo_bar": 1, "bos_token_id": 1}
    raw["num_key_value_head"] = raw.pop("num_key_value_heads", 2)
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        cfg = config_from_hf_dict(raw, "typo.json")
    msgs = [str(w.message) for w in got if issubclass(w.category, ModelConfigWarning)]
    assert msgs == ["typo.json: key 'num_key_value_head' is not read; did you mean "
                    "'num_key_value_heads'? (absent: its default applies)"]
    assert cfg.num_kv_heads == cfg.num_heads  # what the warning says happened
    for f in sorted(CONFIGS.glob("*.json")):
        with warnings.catch_warnings(record=True) as got:
            warnings.simplefilter("always")
            load_hf_config(f)
        assert not [w for w in got if "is not read" in str(w.message)], f.name


@pytest.mark.parametrize("model_type", ["qwen2", "qwen3", "qwen2_moe", "qwen3_moe"])
def test_qwen_sliding_window_is_off_unless_switched_on(model_type):
    """transformers' Qwen configs default use_sliding_window to False (their sliding_window
    is then inert); a config leaving the switch out was costed windowed (a bad-input hunt:
    Qwen3 at 32k tokens 137 ms instead of 257 ms). Mistral has no switch: its window holds."""
    from completion.models import config_from_hf_dict

    raw = {"model_type": model_type, "num_hidden_layers": 2, "hidden_size": 256,
           "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 512,
           "vocab_size": 1000, "max_position_embeddings": 32768, "sliding_window": 512}
    if model_type.endswith("moe"):
        raw |= {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 128}
    assert config_from_hf_dict(dict(raw)).sliding_window is None
    assert config_from_hf_dict(dict(raw, use_sliding_window=True)).sliding_window == 512
    mistral = dict(raw, model_type="mistral")
    for k in ("num_experts", "num_experts_per_tok", "moe_intermediate_size"):
        mistral.pop(k, None)
    assert config_from_hf_dict(mistral).sliding_window == 512


def test_a_config_key_given_twice_is_refused(tmp_path):
    from completion.models import ModelConfigError, load_hf_config

    p = tmp_path / "config.json"
    p.write_text('{"model_type": "llama", "num_hidden_layers": 2, "num_hidden_layers": 4}')
    with pytest.raises(ModelConfigError, match="key 'num_hidden_layers' appears twice"):
        load_hf_config(p)


@pytest.mark.parametrize("value", ["8", 8.0])
def test_an_expert_count_of_another_type_is_refused_under_a_dense_type(value):
    """num_experts 8 under a dense model_type is refused (costing an MoE as dense would be
    wrong); "8" and 8.0 used to pass, costing it dense (a bad-input hunt)."""
    from completion.models import ModelConfigError, config_from_hf_dict

    raw = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
           "intermediate_size": 128, "vocab_size": 100, "max_position_embeddings": 32,
           "num_experts": value}
    with pytest.raises(ModelConfigError, match="num_experts = .* must be an integer"):
        config_from_hf_dict(raw)


@pytest.mark.parametrize("mt, heads, hidden, want_head_dim", [
    ("qwen3", 16, 1024, 128),   # transformers Qwen3Config(head_dim=128); h / a would be 64
    ("gemma", 16, 3072, 256),   # GemmaConfig(head_dim=256); h / a would be 192
    ("gemma2", 8, 2304, 256),   # Gemma2Config(head_dim=256); h / a would be 288
])
def test_an_absent_head_dim_takes_transformers_default(mt, heads, hidden, want_head_dim):
    raw = {"model_type": mt, "hidden_size": hidden, "intermediate_size": 4 * hidden,
           "num_hidden_layers": 2, "num_attention_heads": heads, "num_key_value_heads": heads,
           "vocab_size": 256, "max_position_embeddings": 64}
    if mt == "gemma2":
        raw["sliding_window"] = 32  # stated: only the head_dim default warns
    with pytest.warns(ModelConfigWarning, match="'head_dim' is absent: transformers' default"):
        cfg = config_from_hf_dict(dict(raw))
    assert cfg.head_dim == want_head_dim
    with warnings.catch_warnings():
        warnings.simplefilter("error", ModelConfigWarning)
        assert config_from_hf_dict(dict(raw, head_dim=hidden // heads)).head_dim == hidden // heads


def test_qwen3_0_6b_without_head_dim_has_its_published_parameter_count():
    """Qwen3-0.6B's sizes without the head_dim key: embedding 151936 * 1024 = 155,582,464,
    a layer q 1024 x 2048 + k, v 2 x 1024 x 1024 + o 2048 x 1024 + MLP 3 x 1024 x 3072 +
    norms 2 x 1024 + q/k norms 2 x 128 = 15,730,944; 28 layers, final norm, tied head:
    596,049,920 (the published count)."""
    raw = {"model_type": "qwen3", "hidden_size": 1024, "intermediate_size": 3072,
           "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8,
           "vocab_size": 151936, "max_position_embeddings": 40960, "tie_word_embeddings": True}
    with pytest.warns(ModelConfigWarning):
        cfg = config_from_hf_dict(raw)
    assert 155_582_464 + 28 * 15_730_944 + 1024 == 596_049_920
    assert build_model(cfg, 1, seq_len=8).num_parameters() == 596_049_920


@pytest.mark.parametrize("mt, extra, window", [
    ("mistral", {}, 4096),                                  # MistralConfig(sliding_window=4096)
    ("mistral", {"sliding_window": None}, None),            # stated null: no window
    ("gemma2", {"head_dim": 16}, 4096),                     # Gemma2Config(sliding_window=4096)
    ("qwen2", {"use_sliding_window": True}, 4096),          # Qwen2Config(sliding_window=4096)
    ("qwen2", {}, None),                                    # switched off by default
    ("mixtral", {}, None),                                  # MixtralConfig(sliding_window=None)
])
def test_an_absent_sliding_window_takes_transformers_default(mt, extra, window):
    raw = {"model_type": mt, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256,
           "max_position_embeddings": 64, **extra}
    if mt == "mixtral":
        raw |= {"num_local_experts": 4, "num_experts_per_tok": 2}
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        cfg = config_from_hf_dict(raw)
    assert cfg.sliding_window == window
    said = [str(w.message) for w in seen if "'sliding_window' is absent" in str(w.message)]
    assert len(said) == (1 if "sliding_window" not in extra and window else 0)


@pytest.mark.parametrize("change, words", [
    ({"head_dim": 0}, "'head_dim' must be an int in [1, 16384], got 0"),
    ({"num_hidden_layers": 0}, "'num_hidden_layers' must be a positive int, got 0"),
    ({"num_key_value_heads": 3}, "'num_attention_heads' 4 is not a multiple of 'num_key_value_heads' 3"),
])
def test_config_errors_name_the_config_json_key(change, words):
    """Found by a bad-input hunt: a bad head_dim was reported as "kv_channels", the layer
    and head counts as num_layers / num_heads: meshplan's field names, not the user's keys."""
    raw = {"model_type": "qwen3", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 256,
           "max_position_embeddings": 64, **change}
    with pytest.raises(ModelConfigError) as e:
        config_from_hf_dict(raw)
    assert words in str(e.value) and "kv_channels" not in str(e.value)

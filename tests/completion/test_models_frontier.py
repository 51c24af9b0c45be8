"""Frontier architectures (issue 42): Hugging Face ``deepseek_v3`` / ``kimi_k2``, ``gpt_oss``
and ``llama4`` config.json files read into ModelConfig with every key honoured, warned or
refused by name, and the published configs (``tests/data/hf_configs``, sources in its
SOURCES.md) have their published parameter counts, derived here by hand."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from completion.models import (
    ModelConfigError,
    ModelConfigWarning,
    build_model,
    config_from_hf_dict,
    load_hf_config,
)
from completion.models.params import parameter_counts

CONFIGS = Path(__file__).parents[1] / "data" / "hf_configs"


def _load(name: str):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ModelConfigWarning)
        return load_hf_config(CONFIGS / name)


def _raw(name: str) -> dict:
    return json.loads((CONFIGS / name).read_text())


# -- published parameter counts ---------------------------------------------------------------
def test_deepseek_v3_has_671b_parameters_and_37b_active():
    """DeepSeek-V3 (h 7168, 61 layers, 128 heads, MLA r_q 1536, r_kv 512, d_n 128, d_r 64,
    d_v 128; the first 3 layers dense of 18432; 256 routed experts of 2048, top-8, one shared;
    V 129280, untied). Per layer: MLA q_a 7168*1536 = 11,010,048 + q_a norm 1,536 + q_b
    1536*128*192 = 37,748,736 + kv_a 7168*576 = 4,128,768 + kv_a norm 512 + kv_b 512*128*256 =
    16,777,216 + o 16384*7168 = 117,440,512 = 187,107,328; 2 norms 14,336. Dense MLP 3 *
    7168*18432 = 396,361,728; MoE: router 7168*256 = 1,835,008, experts 256 * 44,040,192
    (3 * 7168*2048) = 11,274,289,152, shared 44,040,192. 3 dense layers 1,750,450,176 + 58
    MoE layers 58 * 11,507,286,016 = 667,422,588,928; embedding + head 2 * 926,679,040;
    final norm 7,168: 671,026,404,352 (the report's 671B, Table 1; the main model without
    its MTP module, README_WEIGHTS.md). Active: 248 routed experts of every MoE layer unused,
    58 * 248 * 44,040,192 = 633,474,121,728 less: 37,552,282,624; without the input
    embedding (DeepSeek's convention) 36,625,603,584, README_WEIGHTS.md's "36.6B (including
    0.9B for the output Head)", the report's 37B."""
    cfg = _load("deepseek-v3.json").replace(mtp_layers=0)
    total, active = parameter_counts(cfg)
    assert total == 671_026_404_352 and active == 37_552_282_624
    assert active - 129280 * 7168 == 36_625_603_584
    assert round(total / 1e9) == 671 and round((active - 129280 * 7168) / 1e9, 1) == 36.6


def test_deepseek_v3_multi_token_prediction_module():
    """``num_nextn_predict_layers`` 1 builds one MTP module (report sec. 2.2; Megatron-Core
    ``MultiTokenPredictionLayer``): enorm and hnorm 2 * 7,168, eh_proj 14336*7168 =
    102,760,448, one MoE decoder layer 11,507,286,016 (layer index 61), its
    final norm 7,168 -- 11,610,067,968 besides the shared embedding and head
    (README_WEIGHTS.md rounds the module to "11.5B") -- and the loss adds 0.1 (Megatron's
    default ``--mtp-loss-scaling-factor``; the report uses 0.3 then 0.1) times its mean cross
    entropy on the labels two tokens ahead."""
    cfg = _load("deepseek-v3.json")
    total, _ = parameter_counts(cfg)
    assert total - 671_026_404_352 == 2 * 7168 + 14336 * 7168 + 11_507_286_016 + 7168 == 11_610_067_968
    prog = build_model(cfg.replace(num_layers=1, dense_layers=(0,)), 1, seq_len=8)
    names = {p.name for p in prog.parameters()}
    assert {"mtp.layers.0.eh_proj.weight", "mtp.layers.0.enorm.weight", "mtp.layers.0.hnorm.weight",
            "mtp.layers.0.mlp.experts.gate_proj.weight", "mtp.layers.0.final_layernorm.weight"} <= names
    loss_ops = [op for op in prog.ops if op.struct_name == "loss" and op.type in ("cross_entropy_with_softmax",
                                                                                  "scale", "add")]
    assert [op.type for op in loss_ops] == ["cross_entropy_with_softmax"] * 2 + ["scale", "add"]
    assert loss_ops[2].attrs["scale"] == 0.1


def test_kimi_k2_has_1t_parameters_and_32b_active():
    """Kimi-K2 (DeepSeek-V3's layout: 64 heads, 384 experts, one dense layer, V 163840).
    MLA: 11,010,048 + 1,536 + q_b 1536*64*192 = 18,874,368 + 4,128,768 + 512 + kv_b
    512*64*256 = 8,388,608 + o 8192*7168 = 58,720,256 = 101,124,096. Dense layer 101,124,096
    + 14,336 + 396,361,728 = 497,500,160; MoE layer 101,124,096 + 14,336 + router 7168*384 =
    2,752,512 + experts 384 * 44,040,192 = 16,911,433,728 + shared 44,040,192 =
    17,059,364,864, 60 of them 1,023,561,891,840; embedding + head 2 * 1,174,405,120; norm
    7,168: 1,026,408,209,408 (Moonshot's "1T total"). Active without the input embedding:
    32,861,477,888 - 1,174,405,120 = 31,687,072,768 (the card's "32B activated")."""
    total, active = parameter_counts(_load("kimi-k2.json"))
    assert total == 1_026_408_209_408 and active == 32_861_477_888
    assert round(total / 1e12) == 1 and round((active - 163840 * 7168) / 1e9) == 32


@pytest.mark.parametrize("name,layers,experts,total,active", [
    ("gpt-oss-120b.json", 36, 128, 116_829_156_672, 5_711_982_912),
    ("gpt-oss-20b.json", 24, 32, 20_914_757_184, 4_187_440_704),
])
def test_gpt_oss_parameter_counts(name, layers, experts, total, active):
    """GPT-OSS (h 2880, 64 heads and 8 kv heads of 64, biases on q/k/v/o, 64 sinks per
    layer; E experts of 2880 with biases, top-4, a biased router; V 201088, untied). Per
    layer: q 2880*4096 + 4096 = 11,800,576, k and v 2 * (2880*512 + 512) = 2,950,144, o
    4096*2880 + 2880 = 11,799,360, sinks 64 -> 26,550,144; norms 5,760; router 2880 E + E;
    an expert 2880*5760 + 5760 + 2880*2880 + 2880 = 24,891,840. 120b: 36 * (26,550,144 +
    5,760 + 368,768 + 128 * 24,891,840) = 115,670,886,912 + 2 * 579,133,440 + 2,880 =
    116,829,156,672 (the card's 116.83B); 20b: 24 * (26,555,904 + 92,192 + 32 * 24,891,840)
    + 1,158,269,760 = 20,914,757,184 (20.91B). Active without the input embedding (OpenAI's
    count): 5,132,849,472 (5.13B) and 3,608,307,264 (3.61B)."""
    cfg = _load(name)
    assert (cfg.num_layers, cfg.num_experts) == (layers, experts)
    got_total, got_active = parameter_counts(cfg)
    assert (got_total, got_active) == (total, active)
    per_expert = 2880 * 5760 + 5760 + 2880 * 2880 + 2880
    assert total == layers * (26_550_144 + 5_760 + 2880 * experts + experts + experts * per_expert) \
        + 2 * 201088 * 2880 + 2880
    card = {36: (116.83, 5.13), 24: (20.91, 3.61)}[layers]
    assert (round(total / 1e9, 2), round((active - 201088 * 2880) / 1e9, 2)) == card


def _llama4_vision(v: dict) -> int:
    """The Llama 4 vision tower and projector (transformers ``Llama4VisionModel`` and
    ``Llama4MultiModalProjector``), which meshplan does not cost: patch embedding (3 * 14^2)
    * 1408 = 827,904, class embedding 1,408, positions (24^2 + 1) * 1408 = 812,416, pre/post
    layer norms 5,632; 34 layers of q/k/v/o with biases 4 * 1,983,872, fc1 1408*5632 + 5632,
    fc2 5632*1408 + 1408, 2 layer norms 5,632 = 23,807,872 each; pixel-shuffle adapter
    (1408 * 4) * 4096 + 4096 * 4096; projector 4096 * 5120: 871,932,416."""
    h, f, n = v["hidden_size"], v["intermediate_size"], v["num_hidden_layers"]
    patches = (v["image_size"] // v["patch_size"]) ** 2
    layer = 4 * (h * h + h) + (h * f + f) + (f * h + h) + 4 * h
    adapter = int(h / v["pixel_shuffle_ratio"] ** 2) * v["projector_input_dim"] + \
        v["projector_input_dim"] * v["projector_output_dim"]
    return (v["num_channels"] * v["patch_size"] ** 2 * h + h + (patches + 1) * h + 4 * h + n * layer
            + adapter + v["vision_output_dim"] * 5120)


def test_llama4_scout_and_maverick_parameter_counts():
    """Llama 4 (h 5120, 48 layers, 40 heads and 8 kv heads of 128, V 202048, untied).
    Attention 62,914,560 + norms 10,240 per layer; an expert or the shared expert 3 *
    5120*8192 = 125,829,120; a dense layer's MLP 3 * 5120*16384 = 251,658,240. Scout: 48 MoE
    layers of 16 experts, 48 * (62,924,800 + 81,920 + 17 * 125,829,120) = 105,700,884,480 +
    2 * 1,034,485,760 + 5,120 = 107,769,861,120; with the vision tower
    (:func:`_llama4_vision`, 871,932,416) 108,641,793,536, Meta's "109B"; active (one expert
    and the shared one) 17,172,894,720, "17B". Maverick: 24 dense and 24 MoE layers of 128
    experts, 24 * 314,583,040 + 24 * 16,295,536,640 + 2,068,976,640 = 400,711,848,960 (text
    model; Meta's "400B"), active 17,184,691,200 ("17B")."""
    scout, mav = _load("llama-4-scout-17b-16e.json"), _load("llama-4-maverick-17b-128e.json")
    assert parameter_counts(scout) == (107_769_861_120, 17_172_894_720)
    assert parameter_counts(mav) == (400_711_848_960, 17_184_691_200)
    vision = _llama4_vision(_raw("llama-4-scout-17b-16e.json")["vision_config"])
    assert vision == 871_932_416
    assert round((107_769_861_120 + vision) / 1e9) == 109
    assert abs(400_711_848_960 / 400e9 - 1) < 0.002 and round(17_184_691_200 / 1e9) == 17


def test_qwen3_235b_a22b_parameter_counts():
    """Qwen3-235B-A22B (h 4096, 94 layers, 64 heads and 4 kv heads of 128, 128 experts of
    1536, top-8, V 151936): attention 33,554,432 + 4,194,304 + 33,554,432 + q/k norms 256 =
    71,303,424, norms 8,192, router 524,288, experts 128 * 18,874,368 = 2,415,919,104; 94 *
    2,487,755,008 + 2 * 622,329,856 + 4,096 = 235,093,634,560 (235B); active 94 *
    222,830,848 + 1,244,663,808 = 22,190,763,520 (A22B)."""
    assert parameter_counts(_load("qwen3-235b-a22b.json")) == (235_093_634_560, 22_190_763_520)


# -- what the readers take from each key -------------------------------------------------------
def test_deepseek_v3_keys():
    c = _load("deepseek-v3.json")
    assert (c.q_lora_rank, c.kv_lora_rank, c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim) == (1536, 512, 128, 64, 128)
    assert (c.head_dim, c.value_head_dim, c.rope_dim, c.mla) == (192, 128, 64, True)
    assert c.dense_layers == (0, 1, 2) and [c.is_moe_layer(i) for i in (2, 3, 60)] == [False, True, True]
    assert (c.num_experts, c.experts_per_token, c.expert_ffn_hidden_size, c.ffn_hidden_size) == (256, 8, 2048, 18432)
    assert (c.shared_expert_ffn_hidden_size, c.shared_expert_gate) == (2048, False)
    assert (c.router_score, c.router_groups, c.router_topk_groups, c.routed_scaling_factor) == ("sigmoid", 8, 4, 2.5)
    assert (c.norm_topk_prob, c.router_aux_loss_coef, c.mtp_layers, c.norm_eps) == (True, 0.0, 1, 1e-6)


def test_kimi_k2_is_deepseek_v3_under_its_own_model_type():
    with pytest.warns(ModelConfigWarning, match="seq_aux=True .* is not modelled"):
        k = load_hf_config(CONFIGS / "kimi-k2.json")
    assert (k.num_experts, k.dense_layers, k.router_groups, k.routed_scaling_factor) == (384, (0,), 1, 2.827)
    assert (k.router_aux_loss_coef, k.mtp_layers, k.num_heads) == (0.001, 0, 64)


def test_gpt_oss_keys():
    g = _load("gpt-oss-120b.json")
    assert g.attention_sinks and g.bias("qkv") and g.bias("o") and g.bias("mlp")
    assert [g.window_of(i) for i in range(4)] == [128, None, 128, None]
    assert (g.router_score, g.norm_topk_prob, g.router_aux_loss_coef, g.head_dim) == ("softmax", True, 0.9, 64)
    names = {p.name for p in build_model(g.replace(num_layers=1), 1, seq_len=8).parameters()}
    assert {"decoder.layers.0.self_attn.sinks", "decoder.layers.0.mlp.gate.bias",
            "decoder.layers.0.mlp.experts.down_proj.bias"} <= names


def test_llama4_keys():
    with pytest.warns(ModelConfigWarning, match="vision_config=\\{...\\} .* the text model is costed"):
        s = load_hf_config(CONFIGS / "llama-4-scout-17b-16e.json")
    assert s.nope_layers == tuple(range(3, 48, 4)) and s.attention_chunk == 8192
    assert [s.chunk_of(i) for i in range(4)] == [8192, 8192, 8192, None]
    assert (s.router_score, s.norm_topk_prob, s.experts_per_token, s.shared_expert_ffn_hidden_size) == ("sigmoid", False, 1, 8192)
    assert all(s.is_moe_layer(i) for i in range(48)) and s.ffn_hidden_size == 16384
    m = _load("llama-4-maverick-17b-128e.json")
    assert [m.is_moe_layer(i) for i in range(4)] == [False, True, False, True]
    assert m.nope_layers == tuple(range(3, 48, 4)) and not m.tie_word_embeddings
    assert not s.uniform_at(4096) and not m.uniform_at(4096)  # NoPE layers differ


#: a small DeepSeek-V3
TINY_DS = {"model_type": "deepseek_v3", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
           "num_key_value_heads": 4, "intermediate_size": 96, "vocab_size": 256, "max_position_embeddings": 64,
           "q_lora_rank": 24, "kv_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 16, "v_head_dim": 12,
           "n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "n_shared_experts": 1,
           "first_k_dense_replace": 1, "n_group": 4, "topk_group": 2, "routed_scaling_factor": 2.5,
           "scoring_func": "sigmoid", "topk_method": "noaux_tc", "norm_topk_prob": True}


@pytest.mark.parametrize("change,match", [
    ({"topk_method": "group_limited_greedy"}, "'topk_method' 'group_limited_greedy' is not modelled"),
    ({"n_group": 3}, "'n_group' = 3 must divide 'n_routed_experts' = 8"),
    ({"topk_group": 5}, "'topk_group' = 5 be at most n_group"),
    ({"scoring_func": "tanh"}, "'scoring_func' must be 'sigmoid' or 'softmax'"),
    ({"q_lora_rank": "big"}, "'q_lora_rank' must be an int >= 1"),
    ({"kv_lora_rank": None}, "missing key 'kv_lora_rank'"),
    ({"v_head_dim": 0}, "'v_head_dim' must be an int >= 1"),
    ({"qk_rope_head_dim": 7}, "qk_rope_head_dim 7 must be even"),
    ({"num_key_value_heads": 2}, "'num_key_value_heads' 2 does not go with multi-head latent attention"),
    ({"num_experts_per_tok": 9}, "'num_experts_per_tok' = 9 exceeds 'n_routed_experts' = 8"),
    ({"routed_scaling_factor": -1}, "'routed_scaling_factor' must be a finite number > 0"),
    ({"num_nextn_predict_layers": -1}, "'num_nextn_predict_layers' must be an int >= 0"),
])
def test_bad_deepseek_keys_are_named(change, match):
    with pytest.raises(ModelConfigError, match=match):
        config_from_hf_dict({**TINY_DS, **change}, "ds.json")


def test_q_lora_rank_null_is_a_full_q_projection_and_absent_is_refused():
    raw = {k: v for k, v in TINY_DS.items() if k != "q_lora_rank"}
    with pytest.raises(ModelConfigError, match="missing key 'q_lora_rank' \\(null: a full q projection\\)"):
        config_from_hf_dict(raw, "ds.json")
    cfg = config_from_hf_dict({**raw, "q_lora_rank": None})
    names = {p.name for p in build_model(cfg, 1, seq_len=8).parameters()}
    assert "decoder.layers.0.self_attn.q_proj.weight" in names and not any("q_a_proj" in n for n in names)


def test_absent_deepseek_defaults_warn_with_transformers_values():
    raw = {k: v for k, v in TINY_DS.items() if k not in ("n_group", "topk_group")}
    raw["n_routed_experts"] = 16
    with pytest.warns(ModelConfigWarning, match="'n_group' is absent: transformers' default .* 8"):
        cfg = config_from_hf_dict(raw, "ds.json")
    assert (cfg.router_groups, cfg.router_topk_groups) == (8, 4)


def test_deepseek_v2_and_bad_frontier_keys_are_refused_by_name():
    with pytest.raises(ModelConfigError, match="model_type 'deepseek_v2' is refused: topk_method"):
        config_from_hf_dict({"model_type": "deepseek_v2", "topk_method": "group_limited_greedy"})
    oss = {**_raw("gpt-oss-20b.json"), "experts_per_token": 2}
    with pytest.raises(ModelConfigError, match="'experts_per_token' = 2 and 'num_experts_per_tok' = 4 disagree"):
        config_from_hf_dict(oss, "oss.json")
    scout = _raw("llama-4-scout-17b-16e.json")
    with pytest.raises(ModelConfigError, match="keeps its text model in 'text_config', which is missing"):
        config_from_hf_dict({k: v for k, v in scout.items() if k != "text_config"}, "l4.json")
    bad = {**scout, "text_config": {**scout["text_config"], "no_rope_layers": [1, 0]}}
    with pytest.raises(ModelConfigError, match="'no_rope_layers' must be 48 entries of 0 or 1"):
        config_from_hf_dict(bad, "l4.json")
    bad = {**scout, "text_config": {**scout["text_config"], "moe_layers": [48]}}
    with pytest.raises(ModelConfigError, match="'moe_layers' must hold layer indices in \\[0, 48\\)"):
        config_from_hf_dict(bad, "l4.json")


@settings(max_examples=20, deadline=None)
@given(heads=st.sampled_from([1, 2, 4]), rq=st.sampled_from([None, 8, 24]), rkv=st.integers(1, 40),
       dn=st.integers(1, 20), dr=st.sampled_from([2, 4, 8]), dv=st.integers(1, 20))
def test_mla_parameters_closed_form(heads, rq, rkv, dn, dr, dv):
    """Property: an MLA layer's attention parameters are h r_q + r_q + r_q H (d_n + d_r)
    (or h H (d_n + d_r) without r_q) + h (r_kv + d_r) + r_kv + r_kv H (d_n + d_v) + H d_v h
    (completion.models.mla)."""
    h = 32
    cfg = config_from_hf_dict({**TINY_DS, "num_hidden_layers": 1, "first_k_dense_replace": 1,
                               "hidden_size": h, "num_attention_heads": heads, "num_key_value_heads": heads,
                               "q_lora_rank": rq, "kv_lora_rank": rkv, "qk_nope_head_dim": dn,
                               "qk_rope_head_dim": dr, "v_head_dim": dv})
    attn = sum(p.type.numel for p in build_model(cfg, 1, seq_len=4).parameters() if ".self_attn." in p.name)
    q = h * rq + rq + rq * heads * (dn + dr) if rq else h * heads * (dn + dr)
    assert attn == q + h * (rkv + dr) + rkv + rkv * heads * (dn + dv) + heads * dv * h

"""Mixture-of-experts models (issue 21, part A): Hugging Face ``mixtral``, ``qwen2_moe`` and
``qwen3_moe`` config.json files parse into ModelConfig's MoE fields, the published configs
have their exact parameter counts (``deepseek_v3``, ``gpt_oss``, ``llama4``:
``tests/completion/test_models_frontier.py``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from completion.models import (
    MODEL_CATALOG,
    ModelConfigError,
    build_model,
    config_from_hf_dict,
    load_hf_config,
)

CONFIGS = Path(__file__).parents[1] / "data" / "hf_configs"


def _params(path_or_cfg) -> int:
    cfg = load_hf_config(CONFIGS / path_or_cfg) if isinstance(path_or_cfg, str) else path_or_cfg
    return build_model(cfg, 1, seq_len=8).num_parameters()


def test_mixtral_8x7b_parameter_count():
    """Mixtral-8x7B (h 4096, 32 layers, 32 heads of 128, 8 kv heads, 8 experts of
    f 14336, V 32000, untied):
    attention q 4096*4096 + k, v 2 * 4096*1024 + o 4096*4096 = 41,943,040;
    2 rms_norms 8,192; router 4096*8 = 32,768; experts 8 * 3 * 4096*14336 = 1,409,286,144;
    layer 1,451,270,144; 32 layers 46,440,644,608; embedding + lm_head 2 * 32000*4096 =
    262,144,000; final norm 4,096: 46,702,792,704 (the published 46.7B)."""
    assert _params("mixtral-8x7b.json") == 46_702_792_704
    assert _params(MODEL_CATALOG["mixtral-8x7b"]) == 46_702_792_704


def test_qwen1_5_moe_a2_7b_parameter_count():
    """Qwen1.5-MoE-A2.7B (qwen2_moe; h 2048, 24 layers, 16 heads of 128 = 16 kv heads,
    60 experts of f 1408, top-4, a shared expert of 5632 with a sigmoid gate, V 151936,
    untied): q, k, v 3 * (2048*2048 + 2048 bias) = 12,589,056 + o 4,194,304 = 16,783,360;
    norms 4,096; router 2048*60 = 122,880; experts 60 * 3 * 2048*1408 = 519,045,120; shared
    expert 3 * 2048*5632 = 34,603,008; shared-expert gate 2048*1 = 2,048; layer
    570,560,512; 24 layers 13,693,452,288; embedding + lm_head 2 * 151936*2048 =
    622,329,856; final norm 2,048: 14,315,784,192 (the published 14.3B)."""
    assert _params("qwen1.5-moe-a2.7b.json") == 14_315_784_192


def test_qwen3_30b_a3b_parameter_count():
    """Qwen3-30B-A3B (qwen3_moe; h 2048, 48 layers, 32 heads and 4 kv heads of d 128,
    per-head q/k rms_norm, 128 experts of f 768, top-8, V 151936, untied): q 2048*4096 =
    8,388,608 + k, v 2 * 2048*512 = 2,097,152 + o 4096*2048 = 8,388,608 -> 18,874,368;
    q_norm + k_norm 2 * 128 = 256; norms 4,096; router 2048*128 = 262,144; experts
    128 * 3 * 2048*768 = 603,979,776; layer 623,120,640; 48 layers 29,909,790,720;
    embedding + lm_head 622,329,856; final norm 2,048: 30,532,122,624 (the published 30.5B)."""
    assert _params("qwen3-30b-a3b.json") == 30_532_122_624
    assert _params(MODEL_CATALOG["qwen3-30b-a3b"]) == 30_532_122_624


def test_published_configs_read_their_moe_fields():
    m = load_hf_config(CONFIGS / "mixtral-8x7b.json")
    assert (m.num_experts, m.experts_per_token, m.expert_ffn_hidden_size) == (8, 2, 14336)
    assert (m.norm_topk_prob, m.router_aux_loss_coef, m.shared_expert_ffn_hidden_size) == (True, 0.02, None)
    q = load_hf_config(CONFIGS / "qwen1.5-moe-a2.7b.json")
    assert (q.num_experts, q.experts_per_token, q.expert_ffn_hidden_size, q.ffn_hidden_size) == (60, 4, 1408, 5632)
    assert (q.shared_expert_ffn_hidden_size, q.shared_expert_gate, q.norm_topk_prob) == (5632, True, False)
    assert (q.qkv_bias, q.router_aux_loss_coef) == (True, 0.001)
    q3 = load_hf_config(CONFIGS / "qwen3-30b-a3b.json")
    assert (q3.num_experts, q3.experts_per_token, q3.expert_ffn_hidden_size) == (128, 8, 768)
    assert (q3.norm_topk_prob, q3.qk_norm, q3.head_dim, q3.shared_expert_ffn_hidden_size) == (True, "head", 128, None)
    assert all(q3.is_moe_layer(i) for i in range(48))


#: a tiny Qwen3-MoE: 4 layers, h 64, 4 heads of 16 (2 kv), dense f 128, 4 experts of 32
TINY = {"model_type": "qwen3_moe", "num_hidden_layers": 4, "hidden_size": 64, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 128, "vocab_size": 256,
        "max_position_embeddings": 64, "num_experts": 4, "num_experts_per_tok": 2,
        "moe_intermediate_size": 32}


def test_sparse_step_and_mlp_only_layers_pick_the_dense_layers():
    """decoder_sparse_step 2: layers 1 and 3 are MoE; mlp_only_layers [3] makes 3 dense.
    Per layer: attention 64*64 + 2 * 64*32 + 64*64 = 12,288, q/k norms 32, 2 norms 128;
    dense MLP 3 * 64*128 = 24,576; MoE router 64*4 = 256 + experts 4 * 3 * 64*32 = 24,576.
    Total 4 * 12,448 + 3 * 24,576 + 24,832 + 2 * 256*64 + 64 = 181,184."""
    cfg = config_from_hf_dict({**TINY, "decoder_sparse_step": 2, "mlp_only_layers": [3]})
    assert [cfg.is_moe_layer(i) for i in range(4)] == [False, True, False, False]
    assert _params(cfg) == 4 * 12_448 + 3 * 24_576 + 24_832 + 2 * 256 * 64 + 64 == 181_184
    names = {p.name for p in build_model(cfg, 1, seq_len=8).parameters()}
    assert "decoder.layers.1.mlp.experts.gate_proj.weight" in names
    assert "decoder.layers.0.mlp.gate_proj.weight" in names and "decoder.layers.3.mlp.gate.weight" not in names


@pytest.mark.parametrize("change,match", [
    ({"num_experts_per_tok": 5}, "'num_experts_per_tok' = 5 exceeds 'num_experts' = 4"),
    ({"num_experts": 0}, "'num_experts' must be an int >= 1, got 0"),
    ({"num_experts": "8"}, "'num_experts' must be an int >= 1"),
    ({"num_experts_per_tok": None}, "missing key 'num_experts_per_tok'"),
    ({"moe_intermediate_size": None}, "missing key 'moe_intermediate_size'"),
    ({"mlp_only_layers": [7]}, "'mlp_only_layers' must be a list of layer indices in \\[0, 4\\)"),
    ({"decoder_sparse_step": 0}, "'decoder_sparse_step' must be an int >= 1"),
    ({"router_aux_loss_coef": -1}, "'router_aux_loss_coef' must be a number >= 0"),
    ({"norm_topk_prob": "yes"}, "'norm_topk_prob' must be true or false"),
])
def test_bad_moe_fields_name_the_key(change, match):
    with pytest.raises(ModelConfigError, match=match):
        config_from_hf_dict({**TINY, **change}, "moe.json")


def test_mixtral_always_renormalises():
    raw = json.loads((CONFIGS / "mixtral-8x7b.json").read_text())
    with pytest.raises(ModelConfigError, match="'norm_topk_prob' false: this architecture always renormalises"):
        config_from_hf_dict({**raw, "norm_topk_prob": False}, "mixtral.json")


def test_experts_under_a_dense_model_type_are_still_refused():
    raw = {**TINY, "model_type": "qwen3"}
    with pytest.raises(ModelConfigError, match="num_experts = 4: mixture-of-experts models are not modelled "
                                               "under model_type 'qwen3'.*'qwen3_moe'"):
        config_from_hf_dict(raw, "dense.json")


@settings(max_examples=25, deadline=None)
@given(e=st.integers(1, 16), k=st.integers(1, 16), step=st.integers(1, 4), f=st.integers(1, 64))
def test_parameter_count_closed_form(e, k, step, f):
    """Property: the built program's parameters equal the closed form for every MoE shape
    (layers with (i + 1) % step == 0 are MoE: router h*E + E * 3*h*f; others dense 3*h*128)."""
    if k > e:
        with pytest.raises(ModelConfigError, match="exceeds"):
            config_from_hf_dict({**TINY, "num_experts": e, "num_experts_per_tok": k})
        return
    cfg = config_from_hf_dict({**TINY, "num_experts": e, "num_experts_per_tok": k,
                               "moe_intermediate_size": f, "decoder_sparse_step": step})
    moe = sum(1 for i in range(4) if (i + 1) % step == 0)
    want = 4 * 12_448 + (4 - moe) * 3 * 64 * 128 + moe * (64 * e + e * 3 * 64 * f) + 2 * 256 * 64 + 64
    assert _params(cfg) == want


def test_a_qwen2_moe_config_without_its_shared_expert_width_says_so():
    """transformers' Qwen2MoeConfig would build a shared expert of its default width where
    the key is absent; meshplan costs none and says so (0 says "none" without a warning)."""
    import json
    import pathlib
    import warnings

    from completion.models import ModelConfigWarning
    from completion.models.hf_config import config_from_hf_dict

    raw = json.loads((pathlib.Path(__file__).parents[1] / "data" / "hf_configs" / "qwen1.5-moe-a2.7b.json").read_text())
    assert config_from_hf_dict(dict(raw)).shared_expert_ffn_hidden_size == 5632
    raw.pop("shared_expert_intermediate_size")
    with pytest.warns(ModelConfigWarning, match="'shared_expert_intermediate_size' is absent: costed without"):
        assert config_from_hf_dict(dict(raw)).shared_expert_ffn_hidden_size is None
    with warnings.catch_warnings():
        warnings.simplefilter("error", ModelConfigWarning)
        assert config_from_hf_dict({**raw, "shared_expert_intermediate_size": 0}).shared_expert_ffn_hidden_size is None

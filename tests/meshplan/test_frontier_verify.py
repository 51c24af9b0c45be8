"""Small models of the frontier architectures (issue 42) run on 2 gloo ranks compute what one
process computes (loss at both steps and every parameter after the updates, fp32 SGD,
``executor.verify``):

- DeepSeek-style: multi-head latent attention, a dense first layer, then a shared expert
  beside 8 routed experts chosen top-2 by sigmoid scores within the 2 best of 4 groups
  (node-limited routing) and scaled by 2.5 -- under tp 2 -- and with a multi-token
  prediction module under tp 2 with sequence parallelism and dp 2 = ep 2 (dispatch and
  combine by all_to_all); its dense layers' MLA under cp 2 (ring attention passing K and V of
  different head sizes). (Not under pp: the executor does not yet run a parameter two
  pipeline stages read -- MTP's shared embedding, as a tied GPT head -- though the cost
  model counts it);
- GPT-OSS-style: attention sinks, biases on the attention, router and experts, alternating
  sliding-window layers -- under tp 2 (the sinks split with the heads) and ep 2;
- Llama 4-style: MoE every other layer with a shared expert, sigmoid top-1, chunked
  attention on the rotary layers and a NoPE layer -- under tp 2.
"""

from __future__ import annotations

import json

import pytest

from meshplan.plan import Plan
from meshplan.strategy import Strategy
from meshplan.validation import verify_many
from tests.completion.test_models_frontier import TINY_DS

TINY_OSS = {"model_type": "gpt_oss", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 32, "vocab_size": 256,
            "max_position_embeddings": 64, "num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": 8,
            "layer_types": ["sliding_attention", "full_attention"], "router_aux_loss_coef": 0.0}
TINY_L4 = {"model_type": "llama4", "text_config": {
    "model_type": "llama4_text", "num_hidden_layers": 4, "hidden_size": 64, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 32, "intermediate_size_mlp": 96,
    "vocab_size": 256, "max_position_embeddings": 64, "num_local_experts": 4, "num_experts_per_tok": 1,
    "interleave_moe_layer_step": 2, "attention_chunk_size": 8, "router_aux_loss_coef": 0.0}}


@pytest.mark.slow
@pytest.mark.distributed
def test_frontier_models_verify_on_two_gloo_ranks(tmp_path):
    paths = {}
    for name, raw in (("ds", TINY_DS), ("mtp", {**TINY_DS, "num_nextn_predict_layers": 1}), ("oss", TINY_OSS),
                      ("l4", TINY_L4), ("mla", {**TINY_DS, "first_k_dense_replace": 2})):
        paths[name] = tmp_path / f"{name}.json"
        paths[name].write_text(json.dumps(raw))

    def plan(model, **kw):
        return Plan(str(paths[model]), "cpu-local", Strategy(dtype="float32", optimizer="sgd", **kw), seq_len=32)

    cases = {
        "deepseek tp2": plan("ds", tp=2, micro_batch_size=2, global_batch_size=2),
        "mla cp2": plan("mla", cp=2, micro_batch_size=1, global_batch_size=2),
        "deepseek mtp tp2 sp": plan("mtp", tp=2, sequence_parallel=True, micro_batch_size=2, global_batch_size=2),
        "deepseek mtp dp2 ep2": plan("mtp", dp=2, ep=2, micro_batch_size=1, global_batch_size=4),
        "gpt-oss tp2": plan("oss", tp=2, micro_batch_size=2, global_batch_size=2),
        "gpt-oss dp2 ep2": plan("oss", dp=2, ep=2, micro_batch_size=1, global_batch_size=4),
        "llama4 tp2": plan("l4", tp=2, micro_batch_size=2, global_batch_size=2),
    }
    results = verify_many(list(cases.values()), 2)
    bad = [f"{n}: {r.summary()}" for n, r in zip(cases, results, strict=True) if not r.ok]
    assert not bad, "\n".join(bad)
    for r in results:
        assert len(r.losses) == 2 and r.losses[1] != r.losses[0] and r.param_errors and not r.missing

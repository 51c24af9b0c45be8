"""The new architectures run distributed on CPU ranks and compute what one process computes
(``executor.verify``: loss at every step and every parameter after the updates within 1e-5
relative, fp32): squared-ReLU (nemotron), GeGLU with sandwich norms, explicit head_dim and a
sliding window that masks (gemma2, window 16 < seq 64), per-head and full qk-norm (qwen3,
olmo2), q/k/v biases (qwen2), plain GeLU with biases and rotary positions (gpt_neox), each
under tensor parallelism (Megatron layout) on 2 gloo ranks."""

from __future__ import annotations

import json

import pytest

from meshplan.plan import Plan
from meshplan.strategy import Strategy
from meshplan.validation import verify_many

_BASE = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
         "intermediate_size": 128, "vocab_size": 256, "max_position_embeddings": 64}
CASES = {
    "nemotron relu2": {"model_type": "nemotron"},
    "gemma2 geglu window": {"model_type": "gemma2", "head_dim": 32, "sliding_window": 16},
    "qwen3 qk-norm": {"model_type": "qwen3", "head_dim": 32},
    "olmo2 full qk-norm": {"model_type": "olmo2"},
    "qwen2 qkv bias": {"model_type": "qwen2"},
    "gpt_neox": {"model_type": "gpt_neox", "hidden_act": "gelu"},
}


@pytest.mark.distributed
def test_new_architectures_verify_under_tp2(tmp_path):
    plans = []
    for name, extra in CASES.items():
        p = tmp_path / f"{name.split()[0]}.json"
        p.write_text(json.dumps({**_BASE, **extra}))
        plans.append(Plan(str(p), "cpu-local", Strategy(tp=2, micro_batch_size=2, global_batch_size=4,
                                                        dtype="float32", optimizer="sgd"), seq_len=64))
    results = verify_many(plans, 2)
    bad = [f"{n}: {r.summary()}" for n, r in zip(CASES, results, strict=True) if not r.ok]
    assert not bad, "\n".join(bad)
    for r in results:
        assert len(r.losses) == 2 and r.losses[1] != r.losses[0] and r.param_errors

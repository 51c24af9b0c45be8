"""The four frontier families (issue 42) through the CLI from their published config.json
files: ``complete`` and ``cost`` at a few layers, and a small ``tune`` (slow) that finds a
plan within memory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests._cli import run_main

CONFIGS = Path(__file__).parents[1] / "data" / "hf_configs"
FAMILIES = {
    "deepseek-v3.json": ["--layers", "4", "--tp", "8", "--sequence-parallel"],
    "kimi-k2.json": ["--layers", "2", "--dp", "8", "--ep", "8"],
    "gpt-oss-120b.json": ["--layers", "2", "--dp", "4", "--ep", "4", "--tp", "2"],
    "llama-4-maverick-17b-128e.json": ["--layers", "4", "--dp", "8", "--ep", "8"],
}


@pytest.mark.parametrize("config", list(FAMILIES))
def test_cost_each_family(config, capsys):
    """Each family costs on one DGX-H100 at 4096 tokens: a positive step time, model FLOPs
    below executed ones (causal attention executes about half its model FLOPs, but
    selective recompute is off: executed counts the backward's recomputed QK^T)."""
    rc, out, err = run_main(capsys, "cost", "-m", str(CONFIGS / config), "--cluster", "dgx-h100", "--nodes", "1",
                            "--seq-len", "4096", "--micro-batch-size", "1", "--global-batch-size", "8",
                            *FAMILIES[config], "--json")
    assert rc == 0, err
    res = json.loads(out)
    assert res["step_time_ms"] > 0 and res["max_memory_bytes"] > 0
    assert res["model_flops_per_step"] > 0


def test_complete_prints_mla_and_sinks(capsys):
    rc, out, err = run_main(capsys, "complete", "-m", str(CONFIGS / "gpt-oss-20b.json"), "--layers", "1",
                            "--tp", "2", "--seq-len", "64", "--batch-size", "1")
    assert rc == 0, err
    assert "decoder.layers.0.self_attn.sinks" in out
    rc, out, err = run_main(capsys, "complete", "-m", str(CONFIGS / "deepseek-v3.json"), "--layers", "1",
                            "--tp", "2", "--seq-len", "64", "--batch-size", "1")
    assert rc == 0, err
    assert "kv_a_proj_with_mqa" in out and "pd_op.expand" in out


@pytest.mark.slow
@pytest.mark.parametrize("config,nodes", [("deepseek-v3.json", 2), ("gpt-oss-20b.json", 2),
                                          ("llama-4-scout-17b-16e.json", 2), ("kimi-k2.json", 4)])
def test_small_tune_of_each_family_finds_a_plan(config, nodes, tmp_path, capsys):
    """Two layers on 2 DGX-H100 (Kimi-K2's 17B-parameter MoE layer on 4): 30 trials find a
    plan within memory."""
    rc, out, err = run_main(capsys, "tune", "-m", str(CONFIGS / config), "--cluster", "dgx-h100", "--nodes", str(nodes),
                            "--layers", "2", "--seq-len", "1024", "--global-batch-size", "32", "--trials", "30",
                            "--seed", "1", "--no-progress", "--output", str(tmp_path / "t"))
    assert rc == 0, err
    assert "best plan:" in out + err and "no feasible plan" not in out + err


def test_megatron_export_states_routing_mtp_and_attention(capsys):
    """DeepSeek-V3 as Megatron-LM runs what meshplan costs (TransformerConfig at d98e8a64):
    sigmoid scores, routed scaling 2.5, 8 groups top-4, one MTP layer weighted 0.1, the
    first dense layers in --moe-layer-freq; MLA and GPT-OSS sinks named as model arguments."""
    rc, out, err = run_main(capsys, "export", "--to", "megatron", "-m", str(CONFIGS / "deepseek-v3.json"),
                            "--cluster", "dgx-h100", "--nodes", "2", "--dp", "16", "--ep", "16",
                            "--global-batch", "64", "--seq-len", "4096", "--layers", "4")
    assert rc == 0, err
    lines = [ln.rstrip(" \\") for ln in out.splitlines()]
    for want in ("--moe-router-score-function sigmoid", "--moe-router-topk-scaling-factor 2.5",
                 "--moe-router-num-groups 8", "--moe-router-group-topk 4", "--mtp-num-layers 1",
                 "--mtp-loss-scaling-factor 0.1", "--moe-layer-freq '[0,0,0,1]'",
                 "--moe-shared-expert-intermediate-size 2048"):
        assert want in lines, want
    assert "--multi-latent-attention --q-lora-rank 1536 --kv-lora-rank 512 --qk-head-dim 128 " \
           "--qk-pos-emb-head-dim 64 --v-head-dim 128" in out
    rc, out, err = run_main(capsys, "export", "--to", "megatron", "-m", str(CONFIGS / "gpt-oss-20b.json"),
                            "--cluster", "dgx-h100", "--dp", "8", "--ep", "8", "--global-batch", "64",
                            "--seq-len", "4096", "--layers", "2")
    assert rc == 0, err
    assert "--softmax-type learnable" in out and "--window-size 127,0" in out
    assert "--moe-router-score-function" not in out

"""Exports of a mixture-of-experts plan (issue 21): the Megatron-LM arguments state the MoE
model meshplan costed (TransformerConfig fields at d98e8a64), and torchtitan's expert
parallelism is written so that its ParallelDims (b5bcd76) accepts it."""

from __future__ import annotations

import json
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]


def test_torchtitan_expert_parallelism_is_written_so_that_its_parallel_dims_accepts_it(capsys):
    """torchtitan's ParallelDims (b5bcd76) raises unless ep divides dp_shard x cp x tp: a
    dp 8 = ep 8 plan at ZeRO 0 wrote replicate 8, shard 1 (refused at start-up); it is
    written as 8 FSDP shards (ZeRO-2) with a note, and tp > 1 notes the missing expert TP."""
    from tests._cli import run_main

    base = ["export", "--to", "torchtitan", "-m", "qwen3-30b-a3b", "--cluster", "dgx-h100",
            "--global-batch", "32", "--seq-len", "4096", "--layers", "4", "--framework", "fsdp2",
            "--recompute", "full"]
    rc, out, err = run_main(capsys, *base, "--dp", "8", "--ep", "8")
    assert rc == 0, err
    par = tomllib.loads(out)["parallelism"]
    shard, rep, tp, ep = (par[k] for k in ("data_parallel_shard_degree", "data_parallel_replicate_degree",
                                          "tensor_parallel_degree", "expert_parallel_degree"))
    assert (rep, shard, ep) == (1, 8, 8) and (shard * tp) % ep == 0
    assert "borrows FSDP ranks" in err
    rc, out, err = run_main(capsys, *base, "--dp", "4", "--tp", "2", "--ep", "4")
    assert rc == 0, err
    par = tomllib.loads(out)["parallelism"]
    assert (par["data_parallel_shard_degree"] * par["tensor_parallel_degree"]) % par["expert_parallel_degree"] == 0
    assert "no expert tensor parallelism" in err


def test_megatron_export_states_the_moe_model_it_costed(tmp_path, capsys):
    """A MoE model's Megatron-LM arguments (TransformerConfig fields of d98e8a64 through
    ArgumentGroupFactory): experts, top-k, expert width, shared expert, the MoE layer pattern,
    grouped GEMMs and the all_to_all dispatcher that meshplan costs (Megatron's defaults are
    per-expert GEMMs and allgather), the aux loss and a capacity factor padded to capacity;
    a load imbalance is a note (no argument)."""
    from tests._cli import run_main

    raw = json.loads((ROOT / "tests" / "data" / "hf_configs" / "qwen1.5-moe-a2.7b.json").read_text())
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({**raw, "mlp_only_layers": [0]}))
    rc, out, err = run_main(capsys, "export", "--to", "megatron", "-m", str(cfg), "--cluster", "dgx-h100",
                            "--dp", "8", "--ep", "4", "--global-batch", "16", "--seq-len", "2048",
                            "--layers", "4", "--moe-capacity-factor", "1.25", "--moe-load-imbalance", "1.5")
    assert rc == 0, err
    args = " ".join(ln.rstrip(" \\") for ln in out.splitlines() if not ln.startswith("#"))
    for want in ("--expert-model-parallel-size 4", "--num-experts 60", "--moe-router-topk 4",
                 "--moe-ffn-hidden-size 1408", "--moe-grouped-gemm", "--moe-token-dispatcher-type alltoall",
                 "--moe-layer-freq '[0,1,1,1]'", "--moe-shared-expert-intermediate-size 5632",
                 "--moe-router-load-balancing-type aux_loss", "--moe-aux-loss-coeff 0.001",
                 "--moe-expert-capacity-factor 1.25", "--moe-pad-expert-input-to-capacity"):
        assert want in args, want
    assert "moe_load_imbalance: the busiest expert at 1.5x" in err
    rc, out, _ = run_main(capsys, "export", "--to", "megatron", "-m", "llama2-7b", "--cluster", "dgx-h100",
                          "--dp", "8", "--global-batch", "16", "--layers", "2")
    assert rc == 0 and "--num-experts" not in out

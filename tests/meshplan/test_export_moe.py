"""Exports of a mixture-of-experts plan (issue 21): the Megatron-LM arguments state the MoE
model meshplan costed (TransformerConfig fields at d98e8a64), and torchtitan's expert
parallelism is written so that its ParallelDims (b5bcd76) accepts it."""

from __future__ import annotations

import json
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[2]


def test_torchtitan_expert_parallelism_is_written_so_that_its_parallel_dims_accepts_it(capsys):
    """torchtitan's ParallelDims (238fa99 parallel_dims.py lines 59 and 138) raises unless ep x
    etp divides dp_shard x cp x tp, etp 1 or tp: a dp 8 = ep 8 plan at ZeRO 0 wrote replicate
    8, shard 1 (refused at start-up); it is written as 8 FSDP shards (ZeRO-2) with a note. The
    plan's etp is written: None (tp 2) as expert_tensor_parallel_degree 2 (4 x 2 divides
    shard 4 x tp 2 = 8), etp 1 as 1 (the whole experts of ep 4 over dp 2 x tp 2 = 4 ranks)."""
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
    assert (par["data_parallel_shard_degree"], par["tensor_parallel_degree"], par["expert_parallel_degree"],
            par["expert_tensor_parallel_degree"]) == (4, 2, 4, 2)
    assert "no expert tensor parallelism" not in err
    rc, out, err = run_main(capsys, *base, "--dp", "2", "--tp", "2", "--ep", "4", "--etp", "1")
    assert rc == 0, err
    par = tomllib.loads(out)["parallelism"]
    assert (par["data_parallel_shard_degree"], par["tensor_parallel_degree"], par["expert_parallel_degree"],
            par["expert_tensor_parallel_degree"]) == (2, 2, 4, 1)


def test_torchtitan_expert_layout_rule_by_hand():
    """``expert_ep_problem`` is ParallelDims' rule (238fa99 lines 59, 138): efsdp = dp_shard
    x cp x tp / (ep x etp) a whole number, etp 1 or tp. By hand: shard 1, tp 4, ep 4, etp 1:
    4 / 4 = 1 rank (fits); etp 4: 4 / 16 (refused); shard 2, cp 2, tp 2, ep 4, etp 2: 8 / 8
    (fits); etp 3 with tp 2: neither 1 nor tp (refused); shard 3, tp 1, ep 2: 3 / 2 (refused)."""
    from meshplan.frameworks.torchtitan.config import expert_ep_problem

    assert expert_ep_problem(1, 1, 4, 4, 1) is None
    assert "= 1 x 1 x 4 = 4" in expert_ep_problem(1, 1, 4, 4, 4)
    assert expert_ep_problem(2, 2, 2, 4, 2) is None
    assert "must be 1 or tensor_parallel_degree 2" in expert_ep_problem(2, 1, 2, 2, 3)
    assert "= 3 x 1 x 1 = 3" in expert_ep_problem(3, 1, 1, 2, 1)


def test_megatron_export_states_the_moe_model_it_costed(tmp_path, capsys):
    """A MoE model's Megatron-LM arguments (TransformerConfig fields of d98e8a64 through
    ArgumentGroupFactory): experts, top-k, expert width, shared expert, the MoE layer pattern,
    grouped GEMMs and the all_to_all dispatcher that meshplan costs (Megatron's defaults are
    per-expert GEMMs and allgather), the aux loss and a capacity factor (no padding to capacity);
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
                 "--moe-expert-capacity-factor 1.25"):
        assert want in args, want
    assert "moe_load_imbalance: the busiest expert at 1.5x" in err
    # no padding to capacity: a capacity above the load would be paid in full (a hunt found
    # cost at 1x and the export padding every expert to 2x)
    assert "--moe-pad-expert-input-to-capacity" not in args
    assert "every expert at the busiest one's 1.25x the mean" in err
    rc, out, err = run_main(capsys, "export", "--to", "megatron", "-m", str(cfg), "--cluster", "dgx-h100",
                            "--dp", "8", "--ep", "4", "--global-batch", "16", "--seq-len", "2048",
                            "--layers", "4", "--moe-capacity-factor", "2")
    assert rc == 0, err
    args = " ".join(ln.rstrip(" \\") for ln in out.splitlines() if not ln.startswith("#"))
    assert "--moe-expert-capacity-factor 2" in args and "--moe-pad-expert-input-to-capacity" not in args
    assert "busiest one's 1x the mean" in err and "would run every expert at 2x" in err
    rc, out, _ = run_main(capsys, "export", "--to", "megatron", "-m", "llama2-7b", "--cluster", "dgx-h100",
                          "--dp", "8", "--global-batch", "16", "--layers", "2")
    assert rc == 0 and "--num-experts" not in out


def test_torchtitan_and_deepspeed_say_what_they_do_with_the_routing_assumptions(capsys):
    """A hunt found the capacity factor dropped silently by the torchtitan and DeepSpeed
    exports (Megatron writes it, and noted the load imbalance): each now says where the
    capacity goes instead, and that a load imbalance is an assumption; the torchtitan notes
    are in the file too."""
    from tests._cli import run_main

    base = ("export", "--model", "qwen3-30b-a3b", "--cluster", "dgx-h100", "--dp", "8", "--layers",
            "4", "--seq-len", "2048", "--global-batch", "16", "--zero", "1", "--ep", "4",
            "--moe-capacity-factor", "1.25", "--moe-load-imbalance", "1.5")
    for target, where in (("torchtitan", "torchtitan has no expert capacity setting"),
                          ("deepspeed", "DeepSpeed sets it in the model code")):
        rc, out, err = run_main(capsys, *base, "--to", target)
        assert rc == 0, err
        assert f"moe_capacity_factor: the plan drops tokens beyond 1.25x an expert's mean load; {where}" in err
        assert "moe_load_imbalance: the busiest expert at 1.5x" in err
        if target == "torchtitan":
            assert "# note: moe_capacity_factor" in out and "# note: moe_load_imbalance" in out
    rc, out, err = run_main(capsys, "export", "--to", "torchtitan", "--model", "qwen3-30b-a3b",
                            "--cluster", "dgx-h100", "--dp", "8", "--layers", "4", "--seq-len", "2048",
                            "--global-batch", "16", "--zero", "1", "--ep", "4")
    assert rc == 0 and "moe_" not in err  # uniform, dropless: nothing to say


def test_torchtitan_launch_line_counts_the_context_parallel_ranks(capsys):
    """dp_shard 2 x cp 2 x tp 2 = 8 ranks; the launch line said dp x tp x pp = 4."""
    from tests._cli import run_main

    rc, out, err = run_main(capsys, "export", "--to", "torchtitan", "--model", "llama2-7b",
                            "--cluster", "dgx-h100", "--dp", "2", "--cp", "2", "--tp", "2",
                            "--global-batch", "8", "--seq-len", "16384", "--zero", "3",
                            "--framework", "fsdp2")
    assert rc == 0, err
    assert "on 8 ranks" in out
    par = tomllib.loads(out)["parallelism"]
    world = (par["data_parallel_shard_degree"] * par.get("data_parallel_replicate_degree", 1)
             * par["context_parallel_degree"] * par["tensor_parallel_degree"])
    assert world == 8

"""Mixture-of-experts cost (issue 21, part C): the CLI costs and tunes a Mixtral config.json,
grouped expert GEMMs go through the roofline's wave model by their per-expert shape, and
expert parameters and optimizer states are counted on every rank (ep = 1)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clusters import load_cluster
from completion.models import MODEL_CATALOG, build_model, config_from_hf_dict
from meshplan import Engine, Strategy
from simulator.op_cost import op_cost
from simulator.op_signature import op_signature
from simulator.roofline import Roofline
from tests._cli import run_main
from tests.completion.test_moe_program import TINY

CONFIGS = Path(__file__).parents[1] / "data" / "hf_configs"


def test_cost_cli_on_the_mixtral_config(capsys):
    """The published Mixtral-8x7B config.json on 8 DGX H100 nodes, dp 4 x tp 2 x pp 8 (4
    layers a stage). A middle stage's parameters per rank (tp 2, ep 1: every expert, each
    split on f): q 4096*4096/2 = 8,388,608, k and v 4096*1024/2 = 2,097,152 each, o
    8,388,608 -> 20,971,520; norms 8,192; router 32,768; experts 8 * 3 * 4096*14336 / 2 =
    704,643,072 -> 725,655,552 a layer, x 4 = 2,902,622,208 elements, x 2 bytes (bf16) =
    5,805,244,416 bytes."""
    rc, out, err = run_main(capsys, "cost", "--model", str(CONFIGS / "mixtral-8x7b.json"), "--cluster",
                            "dgx-h100", "--nodes", "8", "--dp", "4", "--tp", "2", "--pp", "8",
                            "--micro-batch-size", "1", "--global-batch-size", "256", "--seq-len", "4096",
                            "--json")
    assert rc == 0, err
    res = json.loads(out)
    assert res["memory_per_stage_bytes"][1]["params"] == 2 * 4 * 725_655_552 == 5_805_244_416
    assert res["step_time_ms"] > 0 and 0 < res["mfu"] < 1


def test_tune_cli_on_a_tiny_moe_config(capsys, tmp_path):
    cfg = tmp_path / "moe.json"
    cfg.write_text(json.dumps(TINY))
    rc, out, err = run_main(capsys, "tune", "--model", str(cfg), "--cluster", "dgx-h100", "--nodes", "1",
                            "--global-batch-size", "8", "--seq-len", "32", "--trials", "6", "--seed", "0",
                            "--no-progress", "--output", str(tmp_path / "run"))
    assert rc == 0, err
    plan = json.loads((tmp_path / "run" / "plan.json").read_text())
    assert plan["model"] == str(cfg)


def test_memory_counts_every_expert_on_every_rank():
    """TINY (2 layers) on dp 2 x tp 2: local elements per layer: norms 128; q 64*32 + 32
    bias, k and v 64*16 + 16 each, o 32*64 -> 6,208; router 256 (replicated); experts gate
    and up 4*64*16 each + down 4*16*64 = 12,288 (every expert, split on f); shared expert
    3 * 2,048 = 6,144; shared gate 64 -> 25,088; x 2 = 50,176; vocab-parallel embedding and
    head 2 * 128*64 = 16,384; final norm 64: 66,624 elements, bf16 2 bytes = 133,248 bytes;
    grads 4 bytes (fp32 main grads) and Adam 12 bytes per element (megatron-core). One rank:
    all 132,288 parameters."""
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "moe.json"
        p.write_text(json.dumps(TINY))
        mb = Engine(str(p), "dgx-h100", Strategy(dp=2, tp=2, micro_batch_size=1, global_batch_size=4),
                    seq_len=32).simulate().memory_breakdown
        one = Engine(str(p), "dgx-h100", Strategy(micro_batch_size=1, global_batch_size=4),
                     seq_len=32).simulate().memory_breakdown
        n = build_model(str(p), 1, seq_len=8).num_parameters()
    assert (mb["params"], mb["grads"], mb["optimizer"]) == (2 * 66_624, 4 * 66_624, 12 * 66_624)
    assert n == 132_288 and (one["params"], one["optimizer"]) == (2 * n, 12 * n)


def test_grouped_gemm_pays_for_few_tokens_per_expert():
    """Qwen3-30B-A3B at s = 384: 384 * 8 / 128 = 24 tokens per expert, so each expert GEMM
    is (128, 24, 768, 2048). On an H100 (132 SMs) the wave model's best tile is 64 x 256:
    128 * ceil(24/64) * ceil(768/256) = 384 tiles, 3 waves, 3 * 64*256 = 49,152 tile
    elements of work per k; the same FLOPs as one dense (1, 3072, 768, 2048) GEMM take
    64 x 64 tiles: 48 * 12 = 576 tiles, 5 waves, 20,480 -- the grouped GEMM's compute is
    2.4x (24 of every 64 rows of a tile are used). Its bytes: x 128*24*2048 + W
    128*2048*768 + out 128*24*768 elements, x 2 = 419,954,688 (every expert's weights read
    for 24 tokens), so at this size the kernel is bound by the weight read:
    time = max(compute, bytes / (bandwidth * mem_eff)) + overhead. Each wave also stores its
    tiles (the H100's exposed epilogue: 64 * 256 bf16 elements per SM at 3.35e12 * 0.8 / 132
    B/s)."""
    prog = build_model(MODEL_CATALOG["qwen3-30b-a3b"], 1, seq_len=384, num_layers=1)
    op = next(o for o in prog.ops if o.type == "matmul" and o.struct_name.endswith("experts.gate_proj"))
    (k,) = op_cost(op_signature(op))
    assert k.gemm_shape == (128, 24, 768, 2048)
    rf = Roofline.from_device(load_cluster("dgx-h100", 1).device)
    per_sm = rf.peak("bfloat16") / 132 * rf.gemm_efficiency
    store = 2 * 132 / (3.35e12 * 0.8)  # seconds per output element of one SM's epilogue
    grouped, dense = rf.gemm_tiling(k.gemm_shape, "bfloat16"), rf.gemm_tiling((1, 3072, 768, 2048), "bfloat16")
    assert grouped.compute_s == pytest.approx(49_152 * (2 * 2048 / per_sm + store), rel=1e-12)
    assert (grouped.tile, grouped.waves) == ((64, 256), 3)
    assert dense.compute_s == pytest.approx(20_480 * (2 * 2048 / per_sm + store), rel=1e-12)
    assert k.bytes == 2 * (128 * 24 * 2048 + 128 * 2048 * 768 + 128 * 24 * 768) == 419_954_688
    memory = k.bytes / (rf.mem_bandwidth * rf.mem_efficiency)
    assert memory > grouped.compute_s
    assert rf.gemm_time(k) == pytest.approx(memory + rf.kernel_overhead, rel=1e-12)


def test_pattern_templates_shard_grouped_expert_weights_per_expert():
    """tune's pattern-based mode finds the experts' SwiGLU as an MLP block; its megatron
    template gives each expert's matrix the dense placement: gate/up [E, h, f] Shard(2)
    (column), down [E, f, h] Shard(1) (row), never the expert dim; 2-d weights keep
    Shard(1) / Shard(0)."""
    from completion.models import config_from_hf_dict
    from tuner.patterns import apply_templates, find_patterns, megatron_templates

    prog = build_model(config_from_hf_dict(TINY), 2, seq_len=16, num_layers=1)
    ann = apply_templates(prog, find_patterns(prog), megatron_templates())
    pre = "decoder.layers.0.mlp"
    assert {k: v[1] for k, v in ann.items() if k.startswith(pre)} == {
        f"{pre}.experts.gate_proj.weight": "Shard(2)", f"{pre}.experts.up_proj.weight": "Shard(2)",
        f"{pre}.experts.down_proj.weight": "Shard(1)",
        f"{pre}.shared_expert.gate_proj.weight": "Shard(1)", f"{pre}.shared_expert.up_proj.weight": "Shard(1)",
        f"{pre}.shared_expert.down_proj.weight": "Shard(0)"}


# -- expert parallelism: Strategy.ep (issue 21 D) ---------------------------------------------
@pytest.fixture(scope="module")
def tiny_moe(tmp_path_factory):
    p = tmp_path_factory.mktemp("moe_ep") / "moe.json"
    p.write_text(json.dumps(TINY))
    return str(p)


def test_ep_strategy_places_experts_and_skips_their_gradient_sync(tiny_moe):
    """TINY on dp 2 = ep 2 (tp 1): each rank holds 2 of the 4 experts. Local elements per
    layer: norms 128; q 64*64 + 64, k and v 64*32 + 32 each, o 64*64 -> 12,416; router 256;
    experts 2 * 3 * 64*32 = 12,288; shared expert 3 * 64*64 = 12,288; shared gate 64 ->
    37,440, x 2 layers = 74,880; embedding + head 2 * 256*64 = 32,768; final norm 64:
    107,712 (ep 1: 132,288). The dp gradient sync reduces all but the 2 * 12,288 expert
    elements: 83,136. Per step the program sends 2 layers x 4 all_to_alls x 8,192 bytes x
    2 micro-batches = 131,072 bytes a rank."""
    s = Strategy(dp=2, ep=2, micro_batch_size=1, global_batch_size=4)
    eng = Engine(tiny_moe, "dgx-h100", s, seq_len=32)
    model = eng.step_model()
    assert model.rank_params([0]) == 107_712 and model.rank_params([0], synced=True) == 83_136
    assert eng.simulate().memory_breakdown["params"] == 2 * 107_712
    assert {n for i in (0, 1) for n in model.costs.layers[i].dp_split} == {
        f"decoder.layers.{i}.mlp.experts.{w}.weight" for i in (0, 1) for w in ("gate_proj", "up_proj", "down_proj")}
    from completion.models.source import resolve_model
    from completion.plan_program import build_plan_program

    prog = build_plan_program(resolve_model(tiny_moe, 32), s)
    a2a = [op.attrs["nbytes"] for op in prog.program.ops if op.type == "all_to_all"]
    assert len(a2a) == 8 and sum(a2a) * prog.num_microbatches == 131_072
    dense = Engine(tiny_moe, "dgx-h100", Strategy(dp=2, micro_batch_size=1, global_batch_size=4), seq_len=32)
    assert dense.step_model().rank_params([0], synced=True) == dense.step_model().rank_params([0]) == 132_288


def test_ep_errors_name_the_field(tiny_moe, capsys):
    from completion.strategy import StrategyError

    with pytest.raises(StrategyError, match="'ep' = 3 must divide dp = 4"):
        Strategy(dp=4, ep=3, global_batch_size=4)
    with pytest.raises(StrategyError, match="'ep' = 2 with 'zero' = 2: only the distributed optimizer"):
        Strategy(dp=2, ep=2, zero=2, global_batch_size=2)
    assert Strategy(dp=4, ep=2, zero=1, global_batch_size=4).ep == 2  # ep < dp, ZeRO-1: legal
    with pytest.raises(ValueError, match="'ep' = 2: model 'llama2-7b' has no experts"):
        Engine("llama2-7b", "dgx-h100", Strategy(dp=2, ep=2, global_batch_size=2), seq_len=64).cost()
    cfg8 = TINY | {"num_experts": 6}
    with pytest.raises(ValueError, match="'ep' = 4 does not divide model .* num_experts = 6"):
        Engine(config_from_hf_dict(cfg8), "dgx-h100", Strategy(dp=4, ep=4, global_batch_size=4), seq_len=32).cost()
    rc, out, err = run_main(capsys, "cost", "--model", tiny_moe, "--cluster", "dgx-h100", "--dp", "4",
                            "--ep", "3", "--global-batch", "4", "--seq-len", "32")
    assert rc == 2 and "--ep = 3 must divide --dp = 4" in err


def test_ep_exports_to_each_framework():
    """Megatron-LM ``--expert-model-parallel-size`` (ModelParallelConfig), torchtitan
    ``[parallelism] expert_parallel_degree``; DeepSpeed sets it in model code: a note."""
    from meshplan.frameworks.targets import export_plan
    from meshplan.plan import Plan

    p = Plan(str(CONFIGS / "mixtral-8x7b.json"), "dgx-h100",
             Strategy(dp=4, tp=2, pp=8, ep=4, global_batch_size=256), seq_len=4096)
    assert "--expert-model-parallel-size 4 \\" in export_plan(p, "megatron").text.splitlines()
    assert "expert_parallel_degree = 4" in export_plan(p, "torchtitan").text.splitlines()
    ds = export_plan(p, "deepspeed")
    assert [n.knob for n in ds.notes if n.knob == "ep"] == ["ep"] and ds.effective["ep"] == 1


def test_ep_round_trips_through_plan_json(tmp_path):
    from meshplan.plan import Plan

    p = Plan(str(CONFIGS / "mixtral-8x7b.json"), "dgx-h100",
             Strategy(dp=4, tp=2, pp=8, ep=4, global_batch_size=256), seq_len=4096)
    f = tmp_path / "plan.json"
    f.write_text(json.dumps(p.to_dict()))
    q = Plan.from_dict(json.loads(f.read_text()))
    assert q.strategy.ep == 4 and q.strategy == p.strategy


def test_a_mixed_dense_and_moe_layer_pattern_is_costed_layer_by_layer(tmp_path):
    """decoder_sparse_step 2 over 6 layers (MoE at 1, 3, 5) and mlp_only_layers [5]: the
    first/middle/last representative program would cost every middle layer as layer 1 (MoE),
    so such a model is costed from all its layers, each as itself. Dense layers' forward
    FLOPs differ from MoE layers' by the MLP: per token 2 * 3 * 64*128 = 49,152 dense vs 2 *
    (64*4 + 2 * 3 * 64*32) = 25,088 routed + 2 * 3 * 64*64 = 24,576 shared + 2 * 64 = 128
    shared-expert gate = 49,792."""
    from tests.completion.test_moe_program import TINY as T2

    cfg = tmp_path / "mixed.json"
    cfg.write_text(json.dumps({**T2, "num_hidden_layers": 6, "decoder_sparse_step": 2, "mlp_only_layers": [5],
                               "router_aux_loss_coef": 0.0}))
    eng = Engine(str(cfg), "dgx-h100", Strategy(dp=1, micro_batch_size=1, global_batch_size=1), seq_len=32)
    costs = eng.step_model().costs
    assert costs.layer_keys == [0, 1, 2, 3, 4, 5]
    f = costs.model_flops
    assert f[2] == f[4] and f[1] == f[3] and f[1] != f[2]  # middle dense, middle MoE layers
    dense = build_model(config_from_hf_dict(json.loads(cfg.read_text())), 1, seq_len=32)
    mlp = {i: sum(k.flops for op in dense.ops if op.struct_name.startswith(f"decoder.layers.{i}.mlp")
                  and op.type == "matmul" for k in op_cost(op_signature(op))) / 32 for i in (0, 1)}
    assert mlp == {0: 49_152, 1: 25_088 + 24_576 + 128} and mlp[1] == 49_792
    (tmp_path / "u.json").write_text(json.dumps(T2))
    uniform = Engine(str(tmp_path / "u.json"), "dgx-h100", Strategy(micro_batch_size=1, global_batch_size=1),
                     seq_len=32, num_layers=6)
    assert uniform.step_model().costs.layer_keys == [0, 1, 1, 1, 1, 2]  # first, middle, last stand for all


def test_compare_and_export_take_ep(capsys, tmp_path):
    """``--ep`` on compare (a comma list, an ``ep`` column) and export (Megatron-LM's
    ``--expert-model-parallel-size``), as on cost (new-user trial: they had no such option)."""
    import json as _json

    from tests._cli import run_main

    cfg = tmp_path / "tiny-mixtral.json"
    cfg.write_text(_json.dumps({"model_type": "mixtral", "num_hidden_layers": 2, "hidden_size": 64,
                                "num_attention_heads": 4, "num_key_value_heads": 2,
                                "intermediate_size": 128, "vocab_size": 256,
                                "max_position_embeddings": 64, "num_local_experts": 4,
                                "num_experts_per_tok": 2}))
    base = ["--model", str(cfg), "--cluster", "dgx-h100", "--dp", "2", "--tp", "2",
            "--global-batch", "4", "--seq-len", "32"]
    rc, out, err = run_main(capsys, "compare", *base, "--ep", "1,2", "--json")
    assert rc == 0, err
    assert [p["ep"] for p in _json.loads(out)] == [1, 2]
    rc, out, err = run_main(capsys, "export", "--to", "megatron", *base, "--ep", "2")
    assert rc == 0, err
    assert "--expert-model-parallel-size 2" in out

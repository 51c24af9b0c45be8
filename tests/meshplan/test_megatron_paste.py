"""Megatron-LM's mixture-of-experts arguments and pipeline layout on ``meshplan cost``: what
``export --to megatron`` writes for a MoE plan with a pinned split, pasted back after ``cost
--model M --cluster C --dp N``, costs the same plan (before: "No such option: --num-experts",
then "--pipeline-model-parallel-layout"); model-describing arguments that differ from --model
are errors naming both values; a dispatcher meshplan does not cost is refused."""

from __future__ import annotations

import json
import shlex

import pytest
from hypothesis import HealthCheck, given, settings

from completion.models import get_model_config
from completion.strategy import FP8_RECIPES
from meshplan.errors import MeshplanError
from meshplan.frameworks.megatron.moe import MegatronMoE, check, layer_pattern
from meshplan.plan import Plan
from tests._cli import one_line_error, run_main
from tests.meshplan.test_export import plans

PLAN = ("--model", "qwen3-30b-a3b", "--cluster", "dgx-h100", "--nodes", "2")
LAYOUT = ("--dp", "8", "--pp", "2", "--ep", "8", "--global-batch", "64", "--layers", "8",
          "--layers-per-stage", "even")


def test_exported_moe_arguments_cost_the_same_plan(capsys):
    rc, out, err = run_main(capsys, "export", "--to", "megatron", *PLAN, *LAYOUT)
    assert rc == 0, err
    args = [a for ln in out.splitlines() if not ln.startswith("#") for a in shlex.split(ln.rstrip(" \\"))]
    assert "--num-experts" in args and "--moe-grouped-gemm" in args
    assert args[args.index("--pipeline-model-parallel-layout") + 1] == "E,t*4|t*4,L"
    rc, pasted, err = run_main(capsys, "cost", *PLAN, "--dp", "8", *args, "--json")
    assert rc == 0, err
    rc, direct, err2 = run_main(capsys, "cost", *PLAN, *LAYOUT, "--json")
    assert rc == 0, err2
    assert json.loads(pasted)["step_time_ms"] == json.loads(direct)["step_time_ms"]
    assert not any("grouped" in w for w in json.loads(pasted)["warnings"])


@pytest.mark.parametrize("args, words", [
    (["--num-experts", "64"], "--num-experts 64: model qwen3-30b-a3b has 128"),
    (["--moe-router-topk", "2"], "--moe-router-topk 2: model qwen3-30b-a3b has 8"),
    (["--moe-layer-freq", "2"], "--moe-layer-freq 2: model qwen3-30b-a3b's MoE layers are [1, 1, 1, 1"),
    (["--moe-token-dispatcher-type", "allgather"], "meshplan costs the alltoall dispatcher"),
    (["--moe-router-load-balancing-type", "none"], "has an aux loss of weight 0.001"),
])
def test_a_moe_argument_that_differs_from_the_model_is_an_error(capsys, args, words):
    line = one_line_error(*run_main(capsys, "cost", *PLAN, *LAYOUT, *args))
    assert words in line


def test_moe_arguments_on_a_dense_model_and_without_grouped_gemm(capsys):
    line = one_line_error(*run_main(capsys, "cost", "--model", "llama2-7b", "--cluster", "dgx-h100",
                                    "--dp", "8", "--global-batch", "8", "--num-experts", "8"))
    assert "model llama2-7b is dense" in line
    rc, out, err = run_main(capsys, "cost", *PLAN, *LAYOUT, "--num-experts", "128")
    assert rc == 0, err
    assert "note: the Megatron-LM MoE arguments lack --moe-grouped-gemm" in err


def test_layer_pattern_by_hand():
    # Megatron-Core: an int N makes layer i an MoE layer when i % N == 0
    assert layer_pattern("2", 6) == [1, 0, 1, 0, 1, 0]
    assert layer_pattern("1", 3) == [1, 1, 1]
    assert layer_pattern("[0,1,1]", 3) == [0, 1, 1]
    for bad, words in (("([1]*3)", "expressions are not evaluated"), ("[1,2,0]", "list of 0 and 1"),
                       ("0", "an int must be >= 1"), ("[1,0]", "lists 2 layers but the model has 3")):
        with pytest.raises(MeshplanError, match=words.replace("(", r"\(").replace(")", r"\)")):
            layer_pattern(bad, 3)


def test_check_of_qwen1_5_moe_shared_expert():
    cfg = get_model_config("tests/data/hf_configs/qwen1.5-moe-a2.7b.json")
    ok = MegatronMoE(num_experts=cfg.num_experts, moe_shared_expert_intermediate_size=cfg.shared_expert_ffn_hidden_size,
                     moe_grouped_gemm=True)
    assert check(ok, cfg, cfg.num_layers) == []
    with pytest.raises(MeshplanError, match="--moe-shared-expert-intermediate-size 1: model"):
        check(MegatronMoE(moe_shared_expert_intermediate_size=1), cfg, cfg.num_layers)


@pytest.mark.parametrize("layout, split", [
    ("E,t*4|t*4,L", (4, 4)),
    ("Et*3|(tt|)*2t,L", (3, 2, 2, 1)),       # Megatron's grammar: groups repeated, no commas
    ("E|t*8|t*8|t*8|t*8|L", (0, 8, 8, 8, 8, 0)),
    ("E, t, t | t, t, L", (2, 2)),
])
def test_layout_split_by_hand(layout, split):
    from meshplan.frameworks.megatron.arguments import layout_split

    assert layout_split(layout) == split


@pytest.mark.parametrize("layout, words", [
    ("t*4|E,t*4,L", "the embedding E must open the first stage"),
    ("E,t*4|t*4", "the loss L must close the last stage"),
    ("E,t*4|t*3,m,L", "stage 1 has m"),
    ("E,t*4|t*4,L;", "not a layout of E, t, L and |"),
    ("E,(t)*99999999,L", "more than 65536 layers"),
    ("E,((tt)*2)*2,t*3|t*8,L", "nested (...) groups"),       # the review: counted (8, 8)
    ("tEttt|ttttL", "the embedding E must open the first stage"),
    ("Etttt|tLttt", "the loss L must close the last stage"),
])
def test_bad_layouts_name_the_argument(layout, words):
    from meshplan.frameworks.megatron.arguments import layout_split

    with pytest.raises(MeshplanError, match="--pipeline-model-parallel-layout"):
        layout_split(layout)
    with pytest.raises(MeshplanError) as e:
        layout_split(layout)
    assert words in str(e.value)


def test_a_layout_gives_vpp_and_the_split(capsys):
    """Megatron derives vpp from the layout's stages over pp: 8 stages on pp 4 are 2 chunks
    a rank, the interleaved schedule; the step equals --vpp 2 --layers-per-stage with the
    same split."""
    base = ("cost", "--model", "llama2-7b", "--cluster", "dgx-h100", "--dp", "2", "--pp", "4",
            "--global-batch", "16", "--json")
    rc, a, err = run_main(capsys, *base, "--pipeline-model-parallel-layout", "E,t*3|t*4|t*4|t*4|t*4|t*4|t*4|t*5,L")
    assert rc == 0, err
    rc, b, err = run_main(capsys, *base, "--vpp", "2", "--schedule", "VPP", "--layers-per-stage",
                          "3,4,4,4,4,4,4,5")
    assert rc == 0, err
    ja, jb = json.loads(a), json.loads(b)
    assert ja["step_time_ms"] == jb["step_time_ms"]
    assert ja["layout"] == jb["layout"]
    line = one_line_error(*run_main(capsys, *base, "--vpp", "4", "--pipeline-model-parallel-layout",
                                    "E,t*8|t*8|t*8|t*8,L"))
    assert "the layout's 4 stages on pp 4 are 1 per rank" in line


@pytest.mark.parametrize("zero", [["--zero", "2"], ["--zero", "3"], ["--zero", "3", "--hsdp", "4", "--framework", "fsdp2"],
                                  ["--zero", "1", "--framework", "nemo"]])
def test_exported_fsdp_and_grad_reduce_arguments_cost_the_same_plan(capsys, zero):
    """export --to megatron writes Megatron-FSDP (--use-megatron-fsdp
    --data-parallel-sharding-strategy optim_grads / optim_grads_params, HSDP as
    --num-distributed-optimizer-instances dp/N) and NeMo's --grad-reduce-in-bf16; cost took
    none of them ("No such option"). Pasted back, they cost the same plan."""
    base = ("--model", "llama2-7b", "--cluster", "dgx-h100", "--dp", "8")
    fw = zero[zero.index("--framework"):] if "--framework" in zero else []
    rc, out, err = run_main(capsys, "export", "--to", "megatron", *base, "--global-batch", "16", *zero)
    assert rc == 0, err
    args = [a for ln in out.splitlines() if not ln.startswith("#") for a in shlex.split(ln.rstrip(" \\"))]
    rc, pasted, err = run_main(capsys, "cost", *base, *fw, *args, "--json")
    assert rc == 0, err
    rc, direct, err = run_main(capsys, "cost", *base, "--global-batch", "16", *zero, "--json")
    assert rc == 0, err
    p, d = json.loads(pasted), json.loads(direct)
    assert (p["step_time_ms"], p["zero"], p["strategy"].get("fsdp_shard_size")) == \
        (d["step_time_ms"], d["zero"], d["strategy"].get("fsdp_shard_size"))


@pytest.mark.parametrize("args, words", [
    (["--data-parallel-sharding-strategy", "optim_grads"], "give --use-megatron-fsdp with it"),
    (["--use-distributed-optimizer", "--num-distributed-optimizer-instances", "2"],
     "Megatron-LM's partial distributed optimizer"),
    (["--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim", "--zero", "3"],
     "--zero and --data-parallel-sharding-strategy optim: they ask for ZeRO stages 3 and 1"),
    (["--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads", "--num-distributed-optimizer-instances", "2"],
     "meshplan's HSDP is ZeRO-3 in shard groups"),
    (["--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads_params",
      "--num-distributed-optimizer-instances", "3"], "must divide --dp 8 into shard groups of 2 or more"),
    (["--grad-reduce-in-bf16"], "the megatron-core profile reduces gradients in fp32"),
])
def test_fsdp_argument_contradictions_are_one_line_errors(capsys, args, words):
    line = one_line_error(*run_main(capsys, "cost", "--model", "llama2-7b", "--cluster", "dgx-h100",
                                    "--dp", "8", "--global-batch", "16", *args))
    assert words in line


@settings(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(plan=plans())
def test_any_megatron_export_pasted_into_cost_is_the_plan_megatron_runs(capsys, strategies, plan):
    """For random plans (layouts, ZeRO / HSDP, FP8, layer splits, recompute, dtypes) the
    arguments ``export --to megatron`` writes, pasted after ``cost --model M --cluster C
    --dp D``, give the Strategy of the plan as Megatron-LM runs it (``out.effective``):
    nothing is refused, nothing is lost."""
    from meshplan.frameworks.targets import export_plan

    fp8 = plan.strategy.fp8 if plan.strategy.fp8 in FP8_RECIPES and "megatron-core" in \
        FP8_RECIPES[plan.strategy.fp8] else None  # the recipes Megatron-LM runs
    plan = Plan(model=plan.model, cluster=plan.cluster, num_layers=plan.num_layers, seq_len=plan.seq_len,
                strategy=plan.strategy.replace(framework="megatron-core", fp8=fp8))
    out = export_plan(plan, "megatron")
    eff = out.effective
    args = [a for ln in out.text.splitlines() if not ln.startswith("#")
            for a in shlex.split(ln.rstrip(" \\"))]
    # float32 is Megatron's default, which no argument states (the export notes it)
    f32 = ["--dtype", "float32"] if eff["dtype"] == "float32" else []
    assert bool(f32) == any(n.knob == "dtype" and "--dtype float32" in n.text for n in out.notes)
    rc, _, err = run_main(capsys, "cost", "--model", plan.model, "--cluster", plan.cluster,
                          "--dp", str(eff["dp"]), *f32, *args)
    assert rc == 2 and "stopped before simulating" in err, (err, args)
    s = strategies[-1]
    got = {k: getattr(s, k) for k in ("dp", "tp", "pp", "cp", "cp_comm", "vpp", "micro_batch_size",
                                      "global_batch_size", "zero", "fsdp_shard_size", "recompute",
                                      "sequence_parallel", "dtype", "fp8", "layers_per_stage")}
    want = {k: eff[k] for k in got}
    if want["vpp"] == 1 and want["layers_per_stage"] is None:
        got["layers_per_stage"] = None if s.vpp == 1 else got["layers_per_stage"]
    assert got == want, (args, eff)
    assert s.schedule == ("VPP" if eff["vpp"] > 1 else "1F1B")


@pytest.mark.parametrize("args, words", [
    (["--pp", "2", "--layers", "8", "--pipeline-model-parallel-layout", "E,t*3|t*4,L"],
     "'E,t*3|t*4,L' places 7 decoder layers, the model has 8"),
    (["--pipeline-model-parallel-layout", "E,t*16|t*16,L"], "has 2 stages but --pp is 1"),
])
def test_layout_errors_name_the_layout(capsys, args, words):
    """The review: these said "--layers-per-stage [3, 4] sums to 7" and "--vpp = 2 needs
    --pp > 1", flags the user never typed."""
    line = one_line_error(*run_main(capsys, "cost", "--model", "llama2-7b", "--cluster", "dgx-h100",
                                    "--dp", "4", "--global-batch", "8", *args))
    assert "--pipeline-model-parallel-layout" in line and words in line


def test_megatron_arguments_note_the_even_split_megatron_runs(capsys):
    """The new-user pass: with Megatron-LM arguments cost balanced qwen3-30b-a3b's 8 layers on
    pp 2 as [5, 3] without a word, while Megatron-LM splits evenly, [4, 4]."""
    base = ("cost", "--model", "qwen3-30b-a3b", "--cluster", "dgx-h100", "--nodes", "2", "--dp", "8",
            "--expert-model-parallel-size", "8", "--global-batch-size", "64", "--num-layers", "8")
    rc, out, err = run_main(capsys, *base, "--pipeline-model-parallel-size", "2")
    assert rc == 0, err
    assert ("note: with Megatron-LM arguments: the cost model balanced the pipeline stages as [5, 3], "
            "while Megatron-LM splits the layers evenly, [4, 4]") in err
    rc, out, err = run_main(capsys, *base, "--pipeline-model-parallel-size", "2", "--layers-per-stage", "even")
    assert rc == 0 and "splits the layers evenly" not in err
    rc, out, err = run_main(capsys, "cost", "--model", "qwen3-30b-a3b", "--cluster", "dgx-h100", "--nodes", "2",
                            "--dp", "8", "--ep", "8", "--pp", "2", "--global-batch", "64", "--layers", "8")
    assert rc == 0 and "splits the layers evenly" not in err  # meshplan's own spellings: no note


def test_the_aux_loss_weight_is_not_checked(capsys):
    """Only whether the router has an aux loss changes the cost: Megatron-LM's Mixtral example
    line (--moe-aux-loss-coeff 1e-2) pastes against a model of 0.02 (the break-it pass)."""
    rc, _, err = run_main(capsys, "cost", *PLAN, *LAYOUT, "--moe-aux-loss-coeff", "0.01")
    assert rc == 0, err

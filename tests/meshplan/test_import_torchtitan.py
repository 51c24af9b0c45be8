"""``meshplan cost --torchtitan-config FILE``: a torchtitan job TOML costed as torchtitan
runs it (names and defaults of torchtitan 238fa99 job_config.py). The export -> import round
trip gives the plan back; torchtitan's defaults (shard degree -1, the reshard policy under
pp, the default pipeline split, selective AC "2") are derived by hand; values meshplan does
not model are errors naming the key."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings

from meshplan.frameworks.targets import export_plan
from meshplan.frameworks.torchtitan.config import (
    TorchtitanConfigError,
    default_split,
    torchtitan_knobs,
)
from meshplan.plan import Plan
from tests._cli import one_line_error, run_main
from tests.meshplan.test_export import plans


def _knobs(tmp_path, text: str, world: int = 16, layers: int = 32) -> dict:
    f = tmp_path / "job.toml"
    f.write_text(text)
    return torchtitan_knobs(f, world, lambda: layers)


def test_defaults_by_hand(tmp_path):
    """An empty config on 16 GPUs: shard degree -1 takes all 16 (FSDP, resharded: ZeRO 3),
    local batch 8 = the micro-batch, global 8 x 16, seq 2048, bf16, AdamW, eager (compile
    off) -- and selective AC "2", which meshplan refuses; with AC off it reads."""
    with pytest.raises(TorchtitanConfigError, match=r"selective_ac_option '2'"):
        _knobs(tmp_path, "")
    k = _knobs(tmp_path, '[activation_checkpoint]\nmode = "none"\n')
    assert k == {"dp": 16, "tp": 1, "cp": 1, "cp_comm": "p2p", "ep": 1, "etp": None, "zero": 3, "fsdp_shard_size": None,
                 "sequence_parallel": False, "pp": 1, "schedule": "1F1B", "vpp": 1, "micro_batch_size": 8,
                 "global_batch_size": 128, "recompute": "none", "dtype": "bfloat16", "fp8": None,
                 "optimizer": "adamw", "framework": "fsdp2-eager", "seq_len": 2048}


def test_reshard_policy_under_pp_and_hsdp(tmp_path):
    """torchtitan's "default" reshards after forward only without pp (ZeRO 3), keeps the
    parameters gathered with pp (ZeRO 2); replicate 2 x shard 4 is HSDP groups of 4."""
    base = '[activation_checkpoint]\nmode = "full"\n[parallelism]\n'
    assert _knobs(tmp_path, base + "pipeline_parallel_degree = 2\n")["zero"] == 2
    assert _knobs(tmp_path, base + 'pipeline_parallel_degree = 2\nfsdp_reshard_after_forward = "always"\n')["zero"] == 3
    k = _knobs(tmp_path, base + "data_parallel_replicate_degree = 2\ndata_parallel_shard_degree = 4\n"
                                "tensor_parallel_degree = 2\n")
    assert (k["dp"], k["zero"], k["fsdp_shard_size"], k["sequence_parallel"]) == (8, 3, 4, True)


def test_default_pipeline_split_by_hand():
    """generate_llm_fqn_per_model_part: 32 layers + 1 + 1 = 34 over 4 stages = 9, 9, 8, 8,
    less the embedding on the first and the output on the last: 8, 9, 8, 7; over 2: 17, 17
    -> 16, 16; over 8 (looped, pp 4): 34 = 5,5,4,4,4,4,4,4 -> 4,5,4,4,4,4,4,3."""
    assert default_split(32, 4) == (8, 9, 8, 7)
    assert default_split(32, 2) == (16, 16)
    assert default_split(32, 8) == (4, 5, 4, 4, 4, 4, 4, 3)
    assert sum(default_split(61, 6)) == 61
    with pytest.raises(TorchtitanConfigError, match="cannot split 1 layers"):
        default_split(1, 4)


def test_looped_schedule_and_layers_per_stage(tmp_path):
    base = '[activation_checkpoint]\nmode = "full"\n[parallelism]\npipeline_parallel_degree = 4\n'
    k = _knobs(tmp_path, base + 'pipeline_parallel_schedule = "Interleaved1F1B"\n')
    assert (k["schedule"], k["vpp"], k["layers_per_stage"]) == ("VPP", 2, (4, 5, 4, 4, 4, 4, 4, 3))
    # layers_per_stage 2: ceil(34 / 2) = 17 stages, not a multiple of pp 4
    with pytest.raises(TorchtitanConfigError, match="17 pipeline stages do not divide"):
        _knobs(tmp_path, base + 'pipeline_parallel_schedule = "Interleaved1F1B"\npipeline_parallel_layers_per_stage = 2\n')
    # pp 2, 1F1B, 9 layers a stage: ceil(34 / 9) = 4 stages = 2 per rank, which 1F1B does not run
    with pytest.raises(TorchtitanConfigError, match="runs one stage per rank, but the config gives 2"):
        _knobs(tmp_path, base.replace("= 4", "= 2") + "pipeline_parallel_layers_per_stage = 9\n")
    k = _knobs(tmp_path, base + "pipeline_parallel_microbatch_size = 2\n[training]\nlocal_batch_size = 8\n")
    assert (k["micro_batch_size"], k["global_batch_size"], k["dp"]) == (2, 32, 4)


@pytest.mark.parametrize("text, words", [
    ('[parallelism]\ntensor_parallel_degree = 3\n', "tp 3 x pp 1 x cp 1 = 3 does not divide the 16 GPUs"),
    ('[parallelism]\ndata_parallel_shard_degree = 4\n', "= 4, but the cluster has 16 GPUs"),
    ('[parallelism]\npipeline_parallel_degree = 2\npipeline_parallel_schedule = "DualPipeV"\n',
     "pipeline_parallel_schedule 'DualPipeV'"),
    ('[activation_checkpoint]\nmode = "memory_budget"\n', "mode 'memory_budget' is not modelled"),
    ('[activation_checkpoint]\nmode = "full"\n[model]\nconverters = ["mx"]\n', "converters ['mx']"),
    ('[activation_checkpoint]\nmode = "full"\n[optimizer]\nname = "Lion"\n', "[optimizer] name 'Lion'"),
    ('[activation_checkpoint]\nmode = "full"\n[parallelism]\ntensor_parallel_degree = 2\n'
     'enable_async_tensor_parallel = true\n', "needs [compile] enable"),
    ("[training\n", "not a TOML file"),
])
def test_what_meshplan_does_not_model_is_named(tmp_path, text, words):
    with pytest.raises(TorchtitanConfigError) as e:
        _knobs(tmp_path, text)
    assert words in str(e.value) and "job.toml" in str(e.value)


def test_expert_parallel_degrees_by_hand(tmp_path):
    """``expert_parallel_degree`` with ``expert_tensor_parallel_degree`` (238fa99 job_config.py:
    default 1; ParallelDims lines 59, 138: etp 1 or tp, ep x etp dividing dp_shard x cp x tp).
    16 GPUs, tp 4: shard 16 / 4 = 4; ep 4 with the default etp 1 reads as meshplan's etp 1
    (whole experts); ep 4 with etp 4 (= tp) as etp None (tp; 4 x 4 divides 4 x 4 = 16); ep 8
    with etp 4: 32 does not divide 16 (refused); etp 2 is neither 1 nor tp 4 (refused); etp
    without experts (ep 1) is ignored, as torchtitan ignores it."""
    base = '[activation_checkpoint]\nmode = "none"\n[parallelism]\ntensor_parallel_degree = 4\n'
    k = _knobs(tmp_path, base + "expert_parallel_degree = 4\n")
    assert (k["dp"], k["ep"], k["etp"], k["zero"]) == (4, 4, 1, 3)
    k = _knobs(tmp_path, base + "expert_parallel_degree = 4\nexpert_tensor_parallel_degree = 4\n")
    assert (k["ep"], k["etp"]) == (4, None)
    with pytest.raises(TorchtitanConfigError, match=r"= 4 x 1 x 4 = 16"):
        _knobs(tmp_path, base + "expert_parallel_degree = 8\nexpert_tensor_parallel_degree = 4\n")
    with pytest.raises(TorchtitanConfigError, match=r"must be 1 or tensor_parallel_degree 4"):
        _knobs(tmp_path, base + "expert_parallel_degree = 2\nexpert_tensor_parallel_degree = 2\n")
    assert _knobs(tmp_path, base + "expert_tensor_parallel_degree = 4\n")["etp"] is None


@settings(max_examples=20, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(plan=plans())
def test_export_then_import_gives_the_plan_torchtitan_runs(tmp_path, plan):
    """export --to torchtitan of random plans, read back: the layout torchtitan runs
    (``out.effective``), knob for knob (the FSDP reshard of ZeRO 3 under pp included: the
    export wrote nothing and torchtitan's default kept the parameters gathered, ZeRO 2)."""
    plan = Plan(model=plan.model, cluster=plan.cluster, num_layers=plan.num_layers, seq_len=plan.seq_len,
                strategy=plan.strategy.replace(framework="fsdp2",
                                               fp8=plan.strategy.fp8 if plan.strategy.fp8 in ("tensorwise", "rowwise") else None))
    out = export_plan(plan, "torchtitan")
    eff = out.effective
    f = tmp_path / "x.toml"
    f.write_text(out.text)
    world = eff["dp"] * eff["tp"] * eff["pp"] * eff["cp"]
    layers = eff["num_layers"] or (32 if plan.model == "llama2-7b" else 96)
    got = torchtitan_knobs(f, world, lambda: layers)
    for k in ("dp", "tp", "pp", "cp", "vpp", "micro_batch_size", "global_batch_size", "zero",
              "fsdp_shard_size", "sequence_parallel", "recompute", "dtype", "fp8", "optimizer"):
        assert got[k] == eff[k], (k, out.text)
    if eff["pp"] > 1:
        assert got["layers_per_stage"] == eff["layers_per_stage"]
        assert got["schedule"] == eff["schedule"]
    assert got["cp_comm"] == (eff["cp_comm"] if eff["cp"] > 1 else "p2p")


def test_cli_costs_the_exported_job_as_the_plan(capsys, tmp_path):
    toml = tmp_path / "job.toml"
    plan = ("--model", "llama2-7b", "--cluster", "dgx-h100", "--nodes", "2")
    layout = ("--dp", "4", "--tp", "2", "--pp", "2", "--global-batch", "32", "--framework", "fsdp2",
              "--zero", "3", "--recompute", "full", "--sequence-parallel", "--layers-per-stage", "even")
    rc, _, err = run_main(capsys, "export", "--to", "torchtitan", *plan, *layout, "-o", str(toml))
    assert rc == 0, err
    rc, a, err = run_main(capsys, "cost", *plan, "--torchtitan-config", str(toml), "--json")
    assert rc == 0, err
    rc, b, err = run_main(capsys, "cost", *plan, *layout, "--json")
    assert rc == 0, err
    ja, jb = json.loads(a), json.loads(b)
    assert ja["step_time_ms"] == jb["step_time_ms"] and ja["seq_len_source"] == "torchtitan"
    line = one_line_error(*run_main(capsys, "cost", *plan, "--torchtitan-config", str(toml), "--tp", "4"))
    assert "states the strategy; drop --tp" in line
    line = one_line_error(*run_main(capsys, "cost", *plan, "--torchtitan-config", str(toml), "--seq-len", "8192"))
    assert "--seq-len 8192, but" in line and "seq_len 4096" in line


def test_zero_0_with_tp_is_written_as_fsdp(tmp_path):
    """A hunt: ZeRO 0 with tp 2 / pp 2 went out as replicate 4, shard 1, which torchtitan
    refuses ("DDP has not supported > 1D parallelism"); it is written as FSDP2 shards
    without resharding (ZeRO-2), noted, and reads back so."""
    from meshplan.strategy import Strategy

    s = Strategy(dp=4, tp=2, pp=2, micro_batch_size=1, global_batch_size=32, zero=0, sequence_parallel=True,
                 framework="fsdp2")
    out = export_plan(Plan(model="llama2-7b", cluster="dgx-a100-80g", strategy=s, nodes=2), "torchtitan")
    assert "data_parallel_shard_degree = 4" in out.text and 'fsdp_reshard_after_forward = "never"' in out.text
    assert any(n.knob == "zero" for n in out.notes) and out.effective["zero"] == 2
    f = tmp_path / "j.toml"
    f.write_text(out.text)
    assert torchtitan_knobs(f, 16, lambda: 32)["zero"] == 2


@pytest.mark.parametrize("text, words", [
    # torchtitan 238fa99: DDP only as the one mesh dim
    ('[parallelism]\ndata_parallel_replicate_degree = 8\ndata_parallel_shard_degree = 1\n'
     'tensor_parallel_degree = 2\n', "DDP has not supported > 1D parallelism"),
    ('[parallelism]\ndata_parallel_replicate_degree = 8\ndata_parallel_shard_degree = 1\n'
     'context_parallel_degree = 2\n', "FSDP over the cp ranks only"),
    ('[parallelism]\ndata_parallel_replicate_degree = 2\ndata_parallel_shard_degree = 2\n'
     'pipeline_parallel_degree = 4\n', "set fsdp_reshard_after_forward = \"always\""),
    ('[parallelism]\npipeline_parallel_degree = 4\n[training]\nlocal_batch_size = 8\n'
     'global_batch_size = 64\n', "torchtitan runs 2 pipeline passes a step"),
    ('[parallelism]\npipeline_parallel_degree = 4\n[training]\nlocal_batch_size = 8\n'
     'global_batch_size = 36\n', "not a multiple of local_batch_size 8 x dp 4"),
    ('[training]\nenable_cpu_offload = true\n', "CPU offload is not modelled"),
    ('[compile]\nenable = true\ncomponents = ["loss"]\n', "[compile] components ['loss']"),
    ('[quantize]\nlinear = 3\n[model]\nconverters = ["quantize.linear.float8"]\n', "must be a table"),
    ('[model]\nconverters = 5\n', "converters must be a list"),
    ('[parallelism]\npipeline_parallel_degree = 2\nmodule_fqns_per_model_part = '
     '[["tok_embeddings", "layers.0"], ["layers.1", "norm", "output"]]\n', "lists 2 decoder layers, the model has 32"),
])
def test_the_reviews_torchtitan_cases(tmp_path, text, words):
    """The review of the importer: jobs torchtitan refuses or runs otherwise, gradient
    accumulation over pipeline passes, keys that change the cost, malformed tables."""
    with pytest.raises(TorchtitanConfigError) as e:
        _knobs(tmp_path, '[activation_checkpoint]\nmode = "full"\n' + text)
    assert words in str(e.value)


def test_torchtitan_spellings_it_accepts(tmp_path):
    """cp with shard degree 1 is FSDP over the cp ranks (ZeRO 3 without pp); the schedule is
    read case-blind as torch does; selective_ac_option "1" checkpoints every layer (full);
    a negative global batch is the default."""
    k = _knobs(tmp_path, '[activation_checkpoint]\nmode = "selective"\nselective_ac_option = "1"\n'
                         '[parallelism]\ndata_parallel_shard_degree = 1\ncontext_parallel_degree = 16\n'
                         '[training]\nglobal_batch_size = -5\nlocal_batch_size = 1\n')
    assert (k["zero"], k["dp"], k["cp"], k["recompute"], k["global_batch_size"]) == (3, 1, 16, "full", 1)
    k = _knobs(tmp_path, '[activation_checkpoint]\nmode = "none"\n[parallelism]\npipeline_parallel_degree = 2\n'
                         'pipeline_parallel_schedule = "gpipe"\n')
    assert k["schedule"] == "FThenB"


def test_plan_file_and_toml_together_are_refused(capsys, tmp_path):
    toml = tmp_path / "j.toml"
    toml.write_text('[activation_checkpoint]\nmode = "none"\n')
    line = one_line_error(*run_main(capsys, "cost", "benchmarks/plans/dp2.json", "--torchtitan-config", str(toml)))
    assert "give PLAN.json or --torchtitan-config, not both" in line
    line = one_line_error(*run_main(capsys, "cost", "--torchtitan-config", str(toml), "--cluster", "dgx-h100"))
    assert "give --model (the architecture) and --cluster" in line


def test_older_torchtitan_spellings_and_unknown_keys(tmp_path):
    """The new-user pass: [float8] recipe_name = "rowwise" (the older converter's section) and
    [training] compile = true (before [compile]) were ignored; a misspelled key was costed
    as its default in silence; float8 FSDP all-gathers are not modelled."""
    import warnings

    base = '[activation_checkpoint]\nmode = "full"\n'
    k = _knobs(tmp_path, base + '[training]\ncompile = true\n[model]\nconverters = ["float8"]\n'
                                '[float8]\nrecipe_name = "rowwise"\n')
    assert (k["fp8"], k["framework"]) == ("rowwise", "fsdp2")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        k = _knobs(tmp_path, base + "[parallelism]\ntensor_parallel_degre = 2\n")
    assert k["tp"] == 1
    assert any("[parallelism] has keys torchtitan does not read, ignored: tensor_parallel_degre"
               in str(w.message) for w in seen)
    with pytest.raises(TorchtitanConfigError, match="enable_fsdp_float8_all_gather"):
        _knobs(tmp_path, base + '[model]\nconverters = ["quantize.linear.float8"]\n'
                                '[quantize.linear.float8]\nenable_fsdp_float8_all_gather = true\n')

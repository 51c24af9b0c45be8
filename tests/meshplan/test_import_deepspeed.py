"""``meshplan cost --deepspeed-config FILE``: a DeepSpeed JSON config costed as DeepSpeed runs
it (names and defaults of DeepSpeed's config reference and deepspeed/runtime/config.py,
zero/config.py). DeepSpeed's batch rule (any two of the three batch keys give the third, dp =
GPUs / (tp x pp)) is derived by hand; what meshplan does not model is an error naming the key;
the export -> import round trip gives the plan back."""

from __future__ import annotations

import json
import warnings

import pytest
from hypothesis import HealthCheck, given, settings

from meshplan.frameworks.deepspeed.config import DeepSpeedConfigError, deepspeed_knobs
from meshplan.frameworks.targets import export_plan
from meshplan.plan import Plan
from meshplan.strategy import Strategy
from tests._cli import one_line_error, run_main
from tests.meshplan.test_export import plans


def _knobs(tmp_path, cfg: dict | str, world: int = 16, **kw) -> dict:
    f = tmp_path / "ds.json"
    f.write_text(cfg if isinstance(cfg, str) else json.dumps(cfg))
    return deepspeed_knobs(f, world, **kw)


def _seen(tmp_path, cfg: dict, **kw) -> tuple[dict, list[str]]:
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        k = _knobs(tmp_path, cfg, **kw)
    return k, [str(w.message) for w in seen]


def test_stage_3_micro_2_accumulation_4_on_16_gpus_with_tp_2(tmp_path):
    """16 GPUs / (tp 2 x pp 1) = dp 8; train_batch_size = 2 x 4 x 8 = 64; bf16; the AdamW of
    the config; no activation_checkpointing section: recompute none, no warning."""
    k, seen = _seen(tmp_path, {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4,
                               "zero_optimization": {"stage": 3}, "bf16": {"enabled": True},
                               "optimizer": {"type": "AdamW", "params": {"lr": 3e-4}}}, tp=2)
    assert k == {"dp": 8, "tp": 2, "pp": 1, "zero": 3, "fsdp_shard_size": None, "micro_batch_size": 2,
                 "global_batch_size": 64, "dtype": "bfloat16", "optimizer": "adamw", "recompute": "none"}
    assert seen == []


@pytest.mark.parametrize("batch, tp, micro, glob", [
    # train_batch_size + micro: accumulation = 64 // 2 // 8 = 4 (tp 2: dp 8)
    ({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 2}, 2, 2, 64),
    # train_batch_size + accumulation 2: micro = 64 // 8 // 2 = 4
    ({"train_batch_size": 64, "gradient_accumulation_steps": 2}, 2, 4, 64),
    # train_batch_size alone: accumulation 1, micro = 64 // 16 = 4 (tp 1: dp 16)
    ({"train_batch_size": 64}, None, 4, 64),
    # micro alone: accumulation 1, global = 3 x 16 = 48
    ({"train_micro_batch_size_per_gpu": 3}, None, 3, 48),
    # all three, agreeing: 128 = 2 x 4 x 16
    ({"train_batch_size": 128, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4}, None, 2, 128),
])
def test_any_two_batch_keys_give_the_third(tmp_path, batch, tp, micro, glob):
    k = _knobs(tmp_path, batch, tp=tp)
    assert (k["micro_batch_size"], k["global_batch_size"]) == (micro, glob)


@pytest.mark.parametrize("batch, words", [
    # 2 x 4 x dp 16 = 128
    ({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4},
     "train_batch_size 64 != train_micro_batch_size_per_gpu 2 x gradient_accumulation_steps 4 x dp 16 = 128"),
    # accumulation = 60 // 2 // 16 = 1: 2 x 1 x 16 = 32
    ({"train_batch_size": 60, "train_micro_batch_size_per_gpu": 2},
     "gradient_accumulation_steps = 60 // 2 // 16"),
    # micro = 8 // 16 // 1 = 0
    ({"train_batch_size": 8}, "train_micro_batch_size_per_gpu 0 x"),
    ({"gradient_accumulation_steps": 4}, "give train_batch_size or train_micro_batch_size_per_gpu"),
    ({"train_batch_size": "auto"}, "Hugging Face Trainer"),
    ({"train_batch_size": 0}, "train_batch_size must be an integer >= 1, got 0"),
])
def test_disagreeing_batch_keys_are_named(tmp_path, batch, words):
    with pytest.raises(DeepSpeedConfigError) as e:
        _knobs(tmp_path, batch)
    assert words in str(e.value) and "ds.json" in str(e.value)


def test_dp_is_the_gpus_over_tp_and_pp(tmp_path):
    """AutoTP 4 on 16 GPUs: dp 4, and DeepSpeed's batch keys count all 16 GPUs (no mpu:
    runtime/config.py world_size): train_batch_size 32 of micro 1 is 2 accumulation steps,
    dp 4 x 2 x 1 = 8 sequences a step (the AutoTP tutorial's config: 8, micro 1, autotp 4 on 8
    GPUs: one step of 2). A script's own --tp 4 with --pp 2: dp 2. --tp equal to AutoTP's
    passes, another value is refused; 3 does not divide 16."""
    base = {"train_micro_batch_size_per_gpu": 1, "tensor_parallel": {"autotp_size": 4}}
    assert (_knobs(tmp_path, base)["dp"], _knobs(tmp_path, base, tp=4)["tp"]) == (4, 4)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        k = _knobs(tmp_path, {**base, "train_batch_size": 32})
    assert (k["dp"], k["micro_batch_size"], k["global_batch_size"]) == (4, 1, 8)
    assert any("count every GPU of a stage (train_batch_size 32 = 1 x 2 x 16)" in str(w.message) for w in seen)
    tut = _knobs(tmp_path, {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 1,
                            "tensor_parallel": {"autotp_size": 4}}, world=8)
    assert (tut["dp"], tut["global_batch_size"]) == (2, 2)
    # with --pp 2 the PipelineModule's topology counts 16 / 2 = 8 GPUs: micro 1 alone is 8
    # counted micro-batches, 8 / 4 = 2 sequences a step over dp 2
    k = _knobs(tmp_path, base, pp=2)
    assert (k["dp"], k["tp"], k["pp"], k["global_batch_size"]) == (2, 4, 2, 2)
    k = _knobs(tmp_path, {"train_micro_batch_size_per_gpu": 1}, tp=4, pp=2)  # a script's own tp
    assert (k["dp"], k["tp"], k["pp"], k["global_batch_size"]) == (2, 4, 2, 2)
    with pytest.raises(DeepSpeedConfigError, match="autotp_size 4, but --tp 2"):
        _knobs(tmp_path, base, tp=2)
    with pytest.raises(DeepSpeedConfigError, match="tp 3 x pp 1 = 3 does not divide the cluster's 16 GPUs"):
        _knobs(tmp_path, {"train_micro_batch_size_per_gpu": 1}, tp=3)
    with pytest.raises(DeepSpeedConfigError, match="without Megatron sequence parallelism"):
        _knobs(tmp_path, base, sequence_parallel=True)


@pytest.mark.parametrize("key, sec", [
    ("offload_optimizer", {"device": "cpu", "pin_memory": True}),
    ("offload_param", {"device": "nvme", "nvme_path": "/nvme"}),
])
def test_offload_is_refused_naming_the_key(tmp_path, key, sec):
    cfg = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3, key: sec}}
    with pytest.raises(DeepSpeedConfigError) as e:
        _knobs(tmp_path, cfg)
    assert f"zero_optimization.{key}.device {sec['device']!r}" in str(e.value)
    cfg["zero_optimization"][key] = {"device": "none"}
    assert _knobs(tmp_path, cfg)["zero"] == 3


@pytest.mark.parametrize("cfg, dtype", [
    ({"bf16": {"enabled": True}}, "bfloat16"),
    ({"bfloat16": {"enabled": True}}, "bfloat16"),  # the older section name
    ({"fp16": {"enabled": True, "loss_scale": 0}, "bf16": {"enabled": False}}, "float16"),
    ({}, "float32"),
])
def test_precision(tmp_path, cfg, dtype):
    assert _knobs(tmp_path, {"train_micro_batch_size_per_gpu": 1, **cfg})["dtype"] == dtype


def test_fp16_and_bf16_both_on_are_refused(tmp_path):
    with pytest.raises(DeepSpeedConfigError, match="bfloat16 and fp16 modes cannot be simultaneously enabled"):
        _knobs(tmp_path, {"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True},
                          "fp16": {"enabled": True}})


def test_mics_shard_size_is_the_hsdp_shard_group(tmp_path):
    """MiCS groups of 4 over dp 16: HSDP shard size 4; a group of all 16 is plain ZeRO-3;
    3 does not divide 16; below stage 3 DeepSpeed does not read it (a warning)."""
    zero = {"stage": 3, "mics_shard_size": 4, "mics_hierarchical_params_gather": True}
    cfg = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": zero}
    assert _knobs(tmp_path, cfg)["fsdp_shard_size"] == 4
    assert _knobs(tmp_path, cfg, tp=2)["fsdp_shard_size"] == 4  # dp 8
    zero["mics_shard_size"] = 16
    assert _knobs(tmp_path, cfg)["fsdp_shard_size"] is None
    zero["mics_shard_size"] = 3
    with pytest.raises(DeepSpeedConfigError, match="mics_shard_size 3 must divide dp 16"):
        _knobs(tmp_path, cfg)
    zero.update(stage=2, mics_shard_size=4)
    k, seen = _seen(tmp_path, cfg)
    assert (k["zero"], k["fsdp_shard_size"]) == (2, None)
    assert len(seen) == 1 and "mics_shard_size 4" in seen[0] and "stage 3 only" in seen[0]


def test_an_unknown_key_is_warned_once_and_cost_neutral_keys_are_silent(tmp_path):
    """Logging, scheduler, clipping and communication buckets read silently; a misspelled
    top-level key and a misspelled zero_optimization key get one warning each, naming them."""
    quiet = {"train_micro_batch_size_per_gpu": 1, "steps_per_print": 100, "wall_clock_breakdown": False,
             "gradient_clipping": 1.0, "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 10}},
             "tensorboard": {"enabled": False},
             "zero_optimization": {"stage": 2, "overlap_comm": True, "reduce_bucket_size": 5e8,
                                   "allgather_bucket_size": 5e8, "contiguous_gradients": True,
                                   "stage3_prefetch_bucket_size": 5e7}}
    assert _seen(tmp_path, quiet)[1] == []
    k, seen = _seen(tmp_path, {**quiet, "zero_optimisation": {"stage": 3}})
    assert k["zero"] == 2 and len(seen) == 1
    assert "the top level has keys DeepSpeed does not read, ignored: zero_optimisation" in seen[0]
    _, seen = _seen(tmp_path, {**quiet, "zero_optimization": {"stage": 1, "stage3_prefetch_bucket": 1}})
    assert len(seen) == 1 and "zero_optimization has keys" in seen[0] and "stage3_prefetch_bucket" in seen[0]


@pytest.mark.parametrize("opt, want", [(None, "adamw"), ("AdamW", "adamw"), ("Adam", "adam"), ("adamw", "adamw")])
def test_optimizer_type(tmp_path, opt, want):
    cfg: dict = {"train_micro_batch_size_per_gpu": 1}
    if opt is not None:
        cfg["optimizer"] = {"type": opt, "params": {"lr": 1e-4}}
    assert _knobs(tmp_path, cfg)["optimizer"] == want


@pytest.mark.parametrize("cfg, pp, words", [
    ({"optimizer": {"type": "Lamb"}}, 1, "optimizer.type 'Lamb': meshplan costs Adam and AdamW"),
    ({"zero_optimization": {"stage": 2}}, 2,
     "zero_optimization.stage 2 with pp 2 (--pp): DeepSpeed's PipelineEngine asserts \"ZeRO-2 and ZeRO-3 "
     "are incompatible with pipeline parallelism\""),
    ({"zero_optimization": {"stage": 1, "cpu_offload": True}}, 1, "zero_optimization.cpu_offload"),
    ({"zero_optimization": {"stage": 3, "zero_hpz_partition_size": 8}}, 1, "zero_hpz_partition_size 8"),
    ({"zero_optimization": {"stage": 3, "zero_quantized_weights": True}}, 1, "zero_quantized_weights"),
    ({"zero_optimization": {"stage": 4}}, 1, "zero_optimization.stage must be 0, 1, 2 or 3, got 4"),
    ({"zero_optimization": {"stage": 1, "offload_optimizer": {"device": "gpu"}}}, 1,
     "zero_optimization.offload_optimizer.device 'gpu': one of none, cpu, nvme"),
    ({"sequence_parallel_size": 4}, 1, "sequence_parallel_size 4 (DeepSpeed-Ulysses"),
    ({"activation_checkpointing": {"cpu_checkpointing": True}}, 1, "activation_checkpointing.cpu_checkpointing"),
    ({"bf16": {"enabled": True, "bf16_master_weights_and_grads": True}}, 1, "bf16.bf16_master_weights_and_grads"),
    ({"fp16": {"enabled": "auto"}}, 1, "fp16.enabled is \"auto\""),
    ({"pipeline": {"activation_checkpoint_interval": 2}}, 2, "pipeline.activation_checkpoint_interval 2"),
    ({"zero_optimization": [1]}, 1, "zero_optimization must be an object"),
])
def test_what_meshplan_does_not_model_is_named(tmp_path, cfg, pp, words):
    with pytest.raises(DeepSpeedConfigError) as e:
        _knobs(tmp_path, {"train_micro_batch_size_per_gpu": 1, **cfg}, pp=pp)
    assert words in str(e.value) and "ds.json" in str(e.value)


def test_recompute_is_the_scripts(tmp_path):
    """activation_checkpointing only configures the script's checkpoint calls: without
    --recompute it is costed without recompute and warned; --recompute full is taken; under
    pp, pipeline.activation_checkpoint_interval 1 checkpoints every layer (full)."""
    cfg = {"train_micro_batch_size_per_gpu": 1, "activation_checkpointing": {"partition_activations": False}}
    k, seen = _seen(tmp_path, cfg)
    assert k["recompute"] == "none" and len(seen) == 1 and "--recompute full" in seen[0]
    k, seen = _seen(tmp_path, cfg, recompute="full")
    assert k["recompute"] == "full" and seen == []
    pipe = {"train_micro_batch_size_per_gpu": 1, "pipeline": {"activation_checkpoint_interval": 1}}
    assert _knobs(tmp_path, pipe, pp=2)["recompute"] == "full"
    assert _knobs(tmp_path, pipe)["recompute"] == "none"  # no PipelineModule without pp
    with pytest.raises(DeepSpeedConfigError, match="recomputes every layer .full., but --recompute selective"):
        _knobs(tmp_path, pipe, pp=2, recompute="selective")


def test_old_spellings(tmp_path):
    """"zero_optimization": true is stage 1 (read_zero_config_deprecated); the stage defaults to 0."""
    assert _knobs(tmp_path, {"train_micro_batch_size_per_gpu": 1, "zero_optimization": True})["zero"] == 1
    assert _knobs(tmp_path, {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {}})["zero"] == 0


def test_autotp_with_zero_3_reads_as_deepspeed_0_19_4_trains_it(tmp_path):
    """AutoTP + ZeRO-3 trains from DeepSpeed 0.19.4 (engine.py at edaa722); the export notes
    the older releases that assert stage <= 2 and writes ZeRO-3."""
    cfg = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3},
           "tensor_parallel": {"autotp_size": 2}}
    k = _knobs(tmp_path, cfg, world=8)
    assert (k["zero"], k["tp"]) == (3, 2)
    s = Strategy(dp=8, tp=2, micro_batch_size=1, global_batch_size=8, zero=3, framework="deepspeed")
    out = export_plan(Plan(model="llama2-7b", cluster="dgx-h100", strategy=s, nodes=2), "deepspeed")
    assert json.loads(out.text)["zero_optimization"] == {"stage": 3}
    assert any("0.19.4" in str(n) for n in out.notes)


def test_json_errors_name_the_file_line_and_column(tmp_path):
    with pytest.raises(DeepSpeedConfigError, match=r"ds.json: not a JSON file: line 2 column 22"):
        _knobs(tmp_path, '{"train_batch_size": 8,\n "bf16": {"enabled": tru}}')
    with pytest.raises(DeepSpeedConfigError, match="a DeepSpeed config is a JSON object, got list"):
        _knobs(tmp_path, "[1, 2]")
    with pytest.raises(DeepSpeedConfigError, match="the key 'stage' is given twice"):
        _knobs(tmp_path, '{"train_batch_size": 8, "zero_optimization": {"stage": 1, "stage": 3}}')
    with pytest.raises(DeepSpeedConfigError, match="cannot read the DeepSpeed config"):
        deepspeed_knobs(tmp_path / "missing.json", 16)


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(plan=plans())
def test_export_then_import_gives_the_plan_deepspeed_runs(tmp_path, plan):
    """export --to deepspeed of random plans DeepSpeed can run (cp 1, ZeRO 0/1 under pp, the
    deepspeed profile, no FP8), read back on dp x tp x pp GPUs with the script's pp and
    recompute: the fields the JSON carries, knob for knob; activation_checkpointing is
    written exactly for full recompute; an optimizer the JSON cannot name reads as AdamW."""
    s = plan.strategy
    if s.zero > 1 and s.pp > 1:  # DeepSpeed's pipeline engine refuses ZeRO-2/3: drop the pipeline
        s = s.replace(pp=1, vpp=1, schedule="1F1B", layers_per_stage=None)
    s = s.replace(cp=1, framework="deepspeed", fp8=None)
    plan = Plan(model=plan.model, cluster=plan.cluster, num_layers=plan.num_layers, seq_len=plan.seq_len,
                strategy=s)
    out = export_plan(plan, "deepspeed")
    eff = out.effective
    cfg = json.loads(out.text)
    assert ("activation_checkpointing" in cfg) == (eff["recompute"] == "full")
    f = tmp_path / "x.json"
    f.write_text(out.text)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # AutoTP's batch-count warning
        got = deepspeed_knobs(f, eff["dp"] * eff["tp"] * eff["pp"], pp=eff["pp"], recompute=eff["recompute"])
    for k in ("dp", "tp", "pp", "micro_batch_size", "global_batch_size", "zero", "fsdp_shard_size",
              "dtype", "recompute"):
        assert got[k] == eff[k], (k, out.text)
    assert got["optimizer"] == (eff["optimizer"] if eff["optimizer"] in ("adam", "adamw") else "adamw")


PLAN = ("--model", "llama2-7b", "--cluster", "dgx-h100", "--nodes", "2")


@pytest.mark.parametrize("layout, script", [
    (("--dp", "16", "--zero", "3", "--micro-batch-size", "2", "--global-batch", "64"), ()),
    (("--dp", "4", "--tp", "2", "--pp", "2", "--zero", "1", "--global-batch", "32", "--recompute", "full"),
     ("--pp", "2", "--recompute", "full")),
    (("--dp", "8", "--tp", "2", "--zero", "3", "--micro-batch-size", "2", "--global-batch", "64"), ()),
])
def test_cli_costs_the_exported_config_as_the_plan(capsys, tmp_path, layout, script):
    """meshplan export --to deepspeed, then cost --deepspeed-config with the script's --pp and
    --recompute: the same step time and memory as the flags under --framework deepspeed."""
    cfg = tmp_path / "ds_config.json"
    flags = (*layout, "--framework", "deepspeed")
    rc, _, err = run_main(capsys, "export", "--to", "deepspeed", *PLAN, *flags, "-o", str(cfg))
    assert rc == 0, err
    rc, a, err = run_main(capsys, "cost", *PLAN, "--deepspeed-config", str(cfg), *script, "--json")
    assert rc == 0, err
    rc, b, err = run_main(capsys, "cost", *PLAN, *flags, "--json")
    assert rc == 0, err
    ja, jb = json.loads(a), json.loads(b)
    assert (ja["step_time_ms"], ja["max_memory_bytes"]) == (jb["step_time_ms"], jb["max_memory_bytes"])
    assert ja["layout"] == jb["layout"] and ja["framework"] == "deepspeed"


def test_cli_flags_beside_the_config(capsys, strategies, tmp_path):
    """The flags of what the script sets apply (--tp, --sequence-parallel, --framework); those
    of what the file states are refused, as is a second input file or an output over it."""
    cfg = tmp_path / "ds.json"
    cfg.write_text(json.dumps({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4,
                               "zero_optimization": {"stage": 1}, "bf16": {"enabled": True}}))
    rc, _, err = run_main(capsys, "cost", *PLAN, "--deepspeed-config", str(cfg), "--tp", "2",
                          "--sequence-parallel", "--framework", "megatron-core")
    assert rc == 2 and "stopped before simulating" in err, err
    s = strategies[-1]
    assert (s.dp, s.tp, s.sequence_parallel, s.framework, s.global_batch_size, s.zero) == \
        (8, 2, True, "megatron-core", 64, 1)
    line = one_line_error(*run_main(capsys, "cost", *PLAN, "--deepspeed-config", str(cfg), "--zero-stage", "2"))
    assert "states the batch, ZeRO stage and precision" in line and "drop --zero-stage" in line
    line = one_line_error(*run_main(capsys, "cost", *PLAN, "--deepspeed-config", str(cfg), "--cp", "2"))
    assert "no ring-attention context parallelism" in line
    line = one_line_error(*run_main(capsys, "cost", "benchmarks/plans/dp2.json", "--deepspeed-config", str(cfg)))
    assert "give PLAN.json or --deepspeed-config, not both" in line
    line = one_line_error(*run_main(capsys, "cost", *PLAN, "--torchtitan-config", str(cfg),
                                    "--deepspeed-config", str(cfg)))
    assert "give --torchtitan-config or --deepspeed-config, not both" in line
    line = one_line_error(*run_main(capsys, "cost", "--deepspeed-config", str(cfg), "--cluster", "dgx-h100"))
    assert "cost --deepspeed-config: give --model (the architecture) and --cluster" in line
    line = one_line_error(*run_main(capsys, "cost", *PLAN, "--deepspeed-config", str(cfg), "--trace", str(cfg)))
    assert "--deepspeed-config and --trace name the same file" in line
    cfg.write_text('{"train_batch_size": 8,}')
    line = one_line_error(*run_main(capsys, "cost", *PLAN, "--deepspeed-config", str(cfg)))
    assert "ds.json: not a JSON file: line 1 column" in line


def test_bf16_beside_pp_without_zero_is_deepspeeds_bf16_optimizer(tmp_path):
    """DeepSpeed edaa722 runtime/engine.py _do_optimizer_sanity_check: bf16 at stage 0 under
    pipeline parallelism runs BF16_Optimizer, which partitions the fp32 masters and Adam
    states over dp (BLOOM's Megatron-DeepSpeed setting): costed as ZeRO-1, with a warning;
    export writes ZeRO-1 for such a plan. An fp32 gradient accumulation buffer is warned
    about."""
    cfg = {"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True}, "zero_optimization": {"stage": 0}}
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert _knobs(tmp_path, cfg, pp=4)["zero"] == 1
        assert _knobs(tmp_path, cfg)["zero"] == 0  # no pipeline: DDP in bf16, unsharded
        assert _knobs(tmp_path, {**cfg, "data_types": {"grad_accum_dtype": "fp32"},
                                 "zero_optimization": {"stage": 1}})["zero"] == 1
    with pytest.raises(DeepSpeedConfigError, match="unsupported mix of model_dtype and grad_accum_dtype"):
        _knobs(tmp_path, {**cfg, "data_types": {"grad_accum_dtype": "fp32"}}, pp=4)
    text = " ".join(str(w.message) for w in seen)
    assert "BF16_Optimizer (runtime/engine.py), which partitions" in text
    assert "grad_accum_dtype fp32: DeepSpeed's BF16_Optimizer keeps a whole fp32 gradient buffer" in text
    s = Strategy(dp=4, pp=4, micro_batch_size=1, global_batch_size=16, zero=0, framework="deepspeed")
    out = export_plan(Plan(model="llama2-7b", cluster="dgx-h100", strategy=s, nodes=2), "deepspeed")
    assert json.loads(out.text)["zero_optimization"] == {"stage": 1} and out.effective["zero"] == 1


@pytest.mark.parametrize("key, sec, words", [
    ("elasticity", {"enabled": True, "max_train_batch_size": 2000}, "elasticity.enabled: DeepSpeed then chooses"),
    ("compile", {"deepcompile": True}, "compile.deepcompile: DeepCompile's compiled ZeRO passes"),
])
def test_keys_that_change_the_run_are_refused(tmp_path, key, sec, words):
    with pytest.raises(DeepSpeedConfigError, match=words):
        _knobs(tmp_path, {"train_micro_batch_size_per_gpu": 1, key: sec})
    assert _knobs(tmp_path, {"train_micro_batch_size_per_gpu": 1, key: {}})["zero"] == 0


def test_the_config_files_warnings_are_in_the_json_list(capsys, tmp_path):
    """The break-it pass: under --json the unknown-key warning went to stderr only."""
    cfg = tmp_path / "ds.json"
    cfg.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 1, "foo": 1}}))
    rc, out, err = run_main(capsys, *("cost", *PLAN, "--deepspeed-config", str(cfg), "--json"))
    assert rc == 0, err
    want = f"{cfg}: zero_optimization has keys DeepSpeed does not read, ignored: foo"
    assert want in json.loads(out)["warnings"]

"""Every export, checked by the framework's own config code (the ``frameworks`` extra, CPU
only; :mod:`tests._frameworks_real` loads it).

Which rules are checked by which code:

- DeepSpeed 0.19.8, ``deepspeed.runtime.config.DeepSpeedConfig``: on every export, every
  section it reads
  (pydantic models of ``zero_optimization``, ``bf16`` / ``fp16``, ``tensor_parallel``,
  ``optimizer``, ``activation_checkpointing``), the keys it has removed (MiCS's
  ``mics_shard_size``) and the batch-key rule ``train_batch_size == micro x
  gradient_accumulation_steps x world_size``, with DeepSpeed's world size taken the two ways
  its code takes it (an mpu's data-parallel size: dp; no mpu under AutoTP: every rank,
  dp x tp); on the importer's batch cases, that meshplan reads the batch keys as DeepSpeed
  does (same values, same refusals).
- Megatron-Core 0.16.1, ``TransformerConfig`` built as Megatron-LM's
  ``core_transformer_config_from_args`` builds it (``_frameworks_real.transformer_config``):
  the parallel sizes (tp, pp, virtual pipeline, cp, ep, expert tp, sequence parallelism and
  their mutual rules), the pipeline layout (``PipelineParallelLayerLayout``), recompute,
  FP8, MoE (experts, router, dispatcher, capacity) and attention-backend settings, on the
  exported arguments plus the model's.
- torchtitan 0.2.2, ``ConfigManager.parse_args(["--job.config_file", ...])``: every section
  and key of the TOML is one of ``JobConfig``'s (an unknown one is an error) with its type,
  and the values it holds equal the plan's layout.
- Megatron-LM's training argument parser (``megatron/training/arguments.py``,
  ``validate_args``) is not on PyPI: its rules (argument names, choices, Megatron-FSDP's
  ``--ckpt-format fsdp_dtensor``, the distributed optimizer beside ``--overlap-param-gather``,
  one virtual-pipeline argument at a time) stay checked by ``tests/test_export.py``'s
  parser written from d98e8a64's source.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import tomllib

from completion.models.catalog import get_model_config
from meshplan.frameworks import export_plan
from meshplan.plan import Plan
from meshplan.strategy import Strategy
from tests import _frameworks_real as real
from tests._cli import run_main


def _plan(model: str, nodes: int, cluster: str = "dgx-h100", **kw: Any) -> Plan:
    return Plan(model=model, cluster=cluster, strategy=Strategy(**kw), nodes=nodes)


#: dense and MoE, with and without pp (and VPP), ZeRO 0-3 and HSDP, FP8 (both recipes), cp
#: (both exchanges), under each target's profile
PLANS = {
    "dp8-zero0": _plan("llama2-7b", 1, dp=8, micro_batch_size=2, global_batch_size=64),
    "tp4-pp2-vpp2-zero1-full": _plan("llama2-7b", 4, dp=4, tp=4, pp=2, vpp=2, schedule="VPP",
                                     global_batch_size=64, zero=1, sequence_parallel=True,
                                     recompute="full"),
    "13b-tp2-zero2": _plan("llama2-13b", 2, dp=8, tp=2, global_batch_size=128, zero=2,
                           sequence_parallel=True),
    "zero3-hsdp8": _plan("llama2-7b", 2, dp=16, global_batch_size=64, zero=3, fsdp_shard_size=8),
    # the plan of issue 39 (70B on 8 x dgx-h100: dp4 tp4 pp4, ZeRO-2, sequence parallel)
    "70b-dp4-tp4-pp4-zero2": _plan("llama2-70b", 8, dp=4, tp=4, pp=4, global_batch_size=512, zero=2,
                                   sequence_parallel=True),
    "fp8-te-delayed": _plan("llama2-7b", 2, dp=4, tp=4, global_batch_size=64, fp8="te-delayed",
                            sequence_parallel=True, zero=1),
    "fp8-tensorwise-fsdp2": _plan("llama2-7b", 2, dp=8, tp=2, global_batch_size=64, fp8="tensorwise",
                                  framework="fsdp2", zero=3),
    "cp2-ring": _plan("llama2-7b", 2, dp=2, tp=4, cp=2, global_batch_size=32, zero=1,
                      sequence_parallel=True),
    "cp2-allgather": _plan("llama2-7b", 2, dp=4, tp=2, cp=2, cp_comm="all_gather", global_batch_size=32),
    "mixtral-tp2-pp2-ep4": _plan("mixtral-8x7b", 4, dp=8, tp=2, pp=2, ep=4, global_batch_size=256,
                                 zero=1, sequence_parallel=True),
    "qwen3-moe-ep8-selective": _plan("qwen3-30b-a3b", 2, dp=16, ep=8, global_batch_size=128, zero=1,
                                     recompute="selective"),
    # whole experts (etp 1, torchtitan's default expert layout): ep 4 over dp 2 x tp 4 ranks
    "qwen3-moe-tp4-ep4-etp1": _plan("qwen3-30b-a3b", 1, dp=2, tp=4, ep=4, etp=1, global_batch_size=32,
                                    zero=1, sequence_parallel=True, framework="fsdp2"),
    "fsdp2-zero3-sac": _plan("llama2-7b", 2, dp=16, global_batch_size=64, zero=3, framework="fsdp2",
                             recompute="selective-op"),
    "deepspeed-tp2-zero2": _plan("llama2-7b", 2, dp=8, tp=2, global_batch_size=64, zero=2,
                                 framework="deepspeed"),
    "deepspeed-pp4-zero1": _plan("llama2-13b", 2, dp=4, pp=4, global_batch_size=64, zero=1,
                                 framework="deepspeed"),
    "pp2-zero0-gpipe": _plan("llama2-7b", 1, dp=4, pp=2, schedule="FThenB", global_batch_size=32),
}


# -- DeepSpeed -------------------------------------------------------------------------------


def check_deepspeed(plan: Plan) -> None:
    """DeepSpeedConfig accepts the export under every batch world DeepSpeed may take (dp with
    an mpu; dp x tp without one, under AutoTP), and reads the plan's batch, ZeRO, dtype and
    tp from it."""
    out = export_plan(plan, "deepspeed")
    eff, cfg = out.effective, json.loads(out.text)
    worlds = {eff["dp"], eff["dp"] * eff["tp"]}
    for world in worlds:
        ds = real.deepspeed_config(cfg, world)
        micro, gas = ds.train_micro_batch_size_per_gpu, ds.gradient_accumulation_steps
        assert ds.train_batch_size == micro * gas * world
        assert (micro, micro * gas * eff["dp"]) == (eff["micro_batch_size"], eff["global_batch_size"])
        assert ds.zero_optimization_stage == eff["zero"]
        assert ds.bfloat16_config.enabled == (eff["dtype"] == "bfloat16")
        assert ds.float16_config.enabled == (eff["dtype"] == "float16")
        assert (ds.tensor_parallel_config.autotp_size or 1) == eff["tp"]


@pytest.mark.parametrize("name", sorted(PLANS))
def test_deepspeed_config_accepts_every_export(name):
    check_deepspeed(PLANS[name])


def test_deepspeed_batch_rule_under_autotp_is_the_world_it_is_given():
    """DeepSpeed 0.19.8's batch rule under AutoTP, run: its world size is the mpu's
    data-parallel size when the script passes an mpu, every rank when it does not
    (``runtime/config.py``), so ``train_batch_size`` = global (16) passes only the first and
    global x tp (32, what meshplan wrote before) only the second; without
    ``train_batch_size`` DeepSpeed derives it and both pass (what the export writes)."""
    base = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 8,
            "tensor_parallel": {"autotp_size": 2}, "bf16": {"enabled": True}}
    dp, tp = 2, 2
    assert real.deepspeed_config({**base, "train_batch_size": 16}, dp).train_batch_size == 16
    with pytest.raises(AssertionError, match="16 != 1 \\* 8 \\* 4"):
        real.deepspeed_config({**base, "train_batch_size": 16}, dp * tp)
    assert real.deepspeed_config({**base, "train_batch_size": 32}, dp * tp).train_batch_size == 32
    with pytest.raises(AssertionError, match="32 != 1 \\* 8 \\* 2"):
        real.deepspeed_config({**base, "train_batch_size": 32}, dp)
    assert [real.deepspeed_config(base, w).train_batch_size for w in (dp, dp * tp)] == [16, 32]


def test_deepspeed_refuses_mics_so_hsdp_is_written_as_zero3():
    """DeepSpeed 0.19.8 has removed MiCS (``_REMOVED_ZERO_CONFIG_KEYS``): the HSDP plan's
    export writes ZeRO-3 over all dp, noted."""
    from deepspeed.runtime.config import DeepSpeedConfigError as DSConfigError

    with pytest.raises(DSConfigError, match="mics_shard_size"):
        real.deepspeed_config({"train_batch_size": 16, "zero_optimization": {"stage": 3,
                                                                               "mics_shard_size": 8}}, 16)
    out = export_plan(PLANS["zero3-hsdp8"], "deepspeed")
    assert json.loads(out.text)["zero_optimization"] == {"stage": 3}
    assert out.effective["fsdp_shard_size"] is None
    assert any(n.knob == "fsdp_shard_size" and "0.19.8" in n.text for n in out.notes)


#: batch keys on dp ranks (tests/test_import_deepspeed.py's cases): meshplan's reading and
#: DeepSpeed's must agree, accepting or refusing
BATCHES = [({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 2}, 8),
           ({"train_batch_size": 64, "gradient_accumulation_steps": 2}, 8),
           ({"train_batch_size": 64}, 16), ({"train_micro_batch_size_per_gpu": 3}, 16),
           ({"train_batch_size": 128, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4}, 16),
           ({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4}, 8),
           ({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4}, 16),
           ({"train_batch_size": 60, "train_micro_batch_size_per_gpu": 2}, 16),
           ({"train_batch_size": 8}, 16), ({"gradient_accumulation_steps": 4}, 16)]


@pytest.mark.parametrize("batch, dp", BATCHES)
def test_the_importers_batch_rule_is_deepspeeds(batch, dp):
    """``meshplan cost --deepspeed-config`` reads the batch keys as DeepSpeedConfig does:
    the same micro-batch and train_batch_size where both accept them, both refusing the
    others (keys that disagree, a micro-batch of 0, neither batch key)."""
    from meshplan.frameworks.deepspeed.config import DeepSpeedConfigError, deepspeed_knobs

    try:
        k = deepspeed_knobs({**batch, "bf16": {"enabled": True}}, dp)
    except DeepSpeedConfigError:
        with pytest.raises(AssertionError):
            real.deepspeed_config(batch, dp)
        return
    ds = real.deepspeed_config(batch, dp)
    assert (ds.train_micro_batch_size_per_gpu, ds.train_batch_size) == (k["micro_batch_size"],
                                                                         k["global_batch_size"])


# -- torchtitan -------------------------------------------------------------------------------


def _section_values(job: Any, doc: dict[str, Any], where: str = "") -> None:
    """Every key of the TOML holds, in torchtitan's JobConfig, the value written."""
    for key, value in doc.items():
        got = getattr(job, key)
        if isinstance(value, dict):
            _section_values(got, value, f"{where}{key}.")
        else:
            assert got == value, f"{where}{key}: torchtitan read {got!r}, the TOML says {value!r}"


def check_torchtitan(plan: Plan, tmp_path: Path) -> None:
    """torchtitan 0.2.2's ConfigManager parses the export; its values are the TOML's and
    the plan's layout (dp = replicate x shard, tp, pp, cp, ep, batch, recompute)."""
    out = export_plan(plan, "torchtitan")
    path = tmp_path / "job.toml"
    path.write_text(out.text)
    job = real.torchtitan_job(str(path))
    doc = tomllib.loads(out.text)
    _section_values(job, doc)
    eff, par, tr = out.effective, job.parallelism, job.training
    assert par.data_parallel_replicate_degree * par.data_parallel_shard_degree == eff["dp"]
    assert (par.tensor_parallel_degree, par.pipeline_parallel_degree, par.context_parallel_degree,
            par.expert_parallel_degree) == (eff["tp"], eff["pp"], eff["cp"], eff["ep"])
    if eff["ep"] > 1:  # torchtitan's ParallelDims takes the degrees, and its sparse mesh
        # (pp, dp_replicate, efsdp, ep, etp) covers the dense one's ranks (build_mesh's efsdp)
        dims = real.torchtitan_parallel_dims(par, eff["dp"] * eff["tp"] * eff["pp"] * eff["cp"])
        efsdp, rem = divmod(dims.dp_shard * dims.cp * dims.tp, dims.etp * dims.ep)
        assert rem == 0 and efsdp >= 1 and dims.etp == eff["etp"]
    if eff["pp"] > 1:
        assert par.pipeline_parallel_microbatch_size == eff["micro_batch_size"]
        assert tr.local_batch_size * eff["dp"] == eff["global_batch_size"]
    else:
        assert tr.local_batch_size == eff["micro_batch_size"]
        assert max(tr.global_batch_size, tr.local_batch_size * eff["dp"]) == eff["global_batch_size"]
    mode = {"none": "none", "full": "full", "selective-op": "selective"}[eff["recompute"]]
    assert job.activation_checkpoint.mode == mode
    assert tr.seq_len == eff["seq_len"]


@pytest.mark.parametrize("name", sorted(PLANS))
def test_torchtitan_parses_every_export(name, tmp_path):
    check_torchtitan(PLANS[name], tmp_path)


def test_torchtitan_refuses_an_unknown_key(tmp_path):
    """The loader is strict (so the check above can fail): an unknown key is an error."""
    path = tmp_path / "job.toml"
    path.write_text(export_plan(PLANS["dp8-zero0"], "torchtitan").text.replace(
        "[parallelism]", "[parallelism]\nbogus_degree = 2"))
    with pytest.raises(ValueError, match="bogus_degree"):
        real.torchtitan_job(str(path))


# -- Megatron-Core -----------------------------------------------------------------------------


def check_megatron(plan: Plan) -> None:
    """Megatron-Core's TransformerConfig accepts the exported arguments (with the model's)
    and holds the plan's parallel layout, recompute, FP8 and MoE settings."""
    out = export_plan(plan, "megatron")
    eff = out.effective
    cfg = real.transformer_config(real.export_argv(out.text) + real.model_args(get_model_config(plan.model)))
    assert (cfg.tensor_model_parallel_size, cfg.pipeline_model_parallel_size, cfg.context_parallel_size,
            cfg.expert_model_parallel_size, cfg.expert_tensor_parallel_size) == (
        eff["tp"], eff["pp"], eff["cp"], eff["ep"], eff["etp"])
    assert (cfg.virtual_pipeline_model_parallel_size or 1) == eff["vpp"]
    assert cfg.sequence_parallel == eff["sequence_parallel"] and cfg.num_layers == eff["num_layers"]
    assert cfg.recompute_granularity == {"none": None, "full": "full", "selective": "selective"}[eff["recompute"]]
    assert cfg.bf16 == (eff["dtype"] == "bfloat16")
    assert (cfg.fp8 is not None) == (eff["fp8"] is not None)
    model = get_model_config(plan.model)
    assert cfg.num_moe_experts == model.num_experts


@pytest.mark.parametrize("name", sorted(PLANS))
def test_megatron_core_accepts_every_export(name):
    check_megatron(PLANS[name])


def test_megatron_core_refuses_what_megatron_refuses():
    """The check can fail: Megatron-Core refuses 32 heads over tp 3, and a pipeline layout
    whose stages hold 31 of the 32 layers."""
    argv = real.export_argv(export_plan(PLANS["pp2-zero0-gpipe"], "megatron").text)
    argv += real.model_args(get_model_config("llama2-7b"))
    real.transformer_config(argv + ["--pipeline-model-parallel-layout", "E,t*16|t*16,L"])
    with pytest.raises(AssertionError, match="Number of decoder layers 31"):
        real.transformer_config(argv + ["--pipeline-model-parallel-layout", "E,t*16|t*15,L"])
    with pytest.raises(ValueError, match="num_attention_heads"):
        real.transformer_config(argv + ["--tensor-model-parallel-size", "3"])


# -- the README's examples ---------------------------------------------------------------------


@pytest.mark.slow
def test_the_readme_tour_plan_passes_every_framework(capsys, tmp_path):
    """The README tour's ``tune`` (llama2-7b, 4 x dgx-a100-80g, global batch 512, seq 4096,
    distributed optimizer) and the issue's 70B plan exported and read by each framework."""
    rc, _, err = run_main(capsys, "tune", "--model", "llama2-7b", "--cluster", "dgx-a100-80g",
                          "--nodes", "4", "--global-batch-size", "512", "--seq-length", "4096",
                          "--use-distributed-optimizer", "--output", str(tmp_path / "7b"))
    assert rc == 0, err
    plan = Plan.load(tmp_path / "7b" / "plan.json")
    check_deepspeed(plan)
    check_torchtitan(plan, tmp_path)
    check_megatron(plan)

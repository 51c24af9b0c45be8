"""meshplan.frameworks used as a Python library, never through the CLI: the Megatron-LM
translation and launch line, a DeepSpeed config, a torchtitan TOML, each read into a
Strategy with values derived by hand from the input, the errors' ``.field``, and the
round trip export -> import of one plan through each target."""

from __future__ import annotations

import json
import shlex

import pytest

from meshplan import frameworks
from meshplan.errors import MeshplanError
from meshplan.frameworks import GivenFlags, export_plan
from meshplan.frameworks.deepspeed import strategy_from_config
from meshplan.frameworks.deepspeed.config import DeepSpeedConfigError
from meshplan.frameworks.megatron import arguments as mg
from meshplan.frameworks.megatron import launch, strategy_from_args
from meshplan.frameworks.megatron.launch_line import FIELD_ARGS, MEGATRON_ARGS
from meshplan.frameworks.torchtitan import strategy_from_toml
from meshplan.frameworks.torchtitan.config import TorchtitanConfigError
from meshplan.plan import Plan
from meshplan.strategy import Strategy

BASE = {"pp": 1, "vpp": 1, "schedule": "1F1B", "recompute": "none", "zero": 0, "dtype": "bfloat16",
        "fsdp_shard_size": None}


# -- Megatron-LM arguments (arguments.apply) -----------------------------------------------------

def test_megatron_arguments_translate_into_strategy_fields():
    """pp 4 on 32 layers: 8 per stage; --num-layers-per-virtual-pipeline-stage 2 -> vpp 8 / 2 = 4,
    interleaved (VPP); the distributed optimizer is ZeRO-1; full uniform recompute of one
    layer is meshplan's full; --fp8-format hybrid is fp8-delayed; --optimizer adam is AdamW."""
    m = mg.MegatronArgs(vpp_layers=2, distributed_optimizer=True, granularity="full", method="uniform",
                        fp8_format="hybrid", optimizer="adam")
    out = mg.apply(GivenFlags(), {**BASE, "pp": 4}, m, lambda: 32, dp=2)
    assert out == {"pp": 4, "vpp": 4, "schedule": "VPP", "recompute": "full", "zero": 1,
                   "dtype": "fp8-delayed", "fsdp_shard_size": None, "optimizer": "adamw"}


def test_megatron_fsdp_hsdp_is_zero3_in_shard_groups_of_dp_over_k():
    """optim_grads_params is ZeRO-3; K = 4 optimizer instances over dp 16: groups of 4."""
    m = mg.MegatronArgs(megatron_fsdp=True, dp_sharding="optim_grads_params", optimizer_instances=4)
    out = mg.apply(GivenFlags(), dict(BASE), m, lambda: 32, dp=16)
    assert (out["zero"], out["fsdp_shard_size"]) == (3, 4)


def test_a_typed_value_contradicting_a_megatron_argument_names_both_as_typed():
    typed = GivenFlags(("--zero-stage", "2"), {"zero": ("--zero", "--zero-stage")})
    with pytest.raises(MeshplanError) as e:
        mg.apply(typed, {**BASE, "zero": 2}, mg.MegatronArgs(distributed_optimizer=True), lambda: 32)
    assert str(e.value) == ("--zero-stage and --use-distributed-optimizer: the distributed optimizer "
                            "is ZeRO stage 1, not 2; give one of them")
    assert e.value.field == "--use-distributed-optimizer"
    # the same value not typed (a default) is overridden, not refused
    assert mg.apply(GivenFlags(), {**BASE, "zero": 2}, mg.MegatronArgs(distributed_optimizer=True),
                    lambda: 32)["zero"] == 1


def test_the_tensorwise_recipe_is_told_to_the_note_callback():
    notes: list[str] = []
    m = mg.MegatronArgs(fp8_format="e4m3", fp8_recipe="tensorwise")
    assert mg.dtype_of(GivenFlags(), "bfloat16", m, notes.append) == "fp8-delayed"
    assert notes == ["--fp8-recipe tensorwise (Transformer Engine current scaling) is costed as "
                     "delayed scaling, fp8-delayed: its amax pass before each cast is not costed"]


@pytest.mark.parametrize("m, field", [
    (mg.MegatronArgs(bf16=True, fp16=True), "--bf16"),
    (mg.MegatronArgs(granularity="full"), "--recompute-granularity"),
    (mg.MegatronArgs(granularity="full", method="uniform", recompute_layers=2), "--recompute-num-layers"),
    (mg.MegatronArgs(pipeline_layout="E,t*4|t*4"), "--pipeline-model-parallel-layout"),
])
def test_megatron_errors_carry_the_argument_at_fault(m, field):
    with pytest.raises(MeshplanError) as e:
        mg.apply(GivenFlags(), {**BASE, "pp": 2}, m, lambda: 8)
    assert e.value.field == field


# -- a Megatron-LM launch line (strategy_from_args) --------------------------------------------

ARGV = ["--tensor-model-parallel-size", "4", "--pipeline-model-parallel-size", "2",
        "--num-layers-per-virtual-pipeline-stage", "4", "--num-layers", "32", "--seq-length", "4096",
        "--micro-batch-size", "2", "--global-batch-size", "128", "--bf16",
        "--use-distributed-optimizer", "--sequence-parallel", "--recompute-activations",
        "--lr", "3e-4", "--save", "/ckpt"]


def test_a_launch_line_is_a_strategy():
    """64 GPUs / (tp 4 x pp 2) = dp 8; 32 layers / pp 2 = 16 a stage, / 4 a chunk = vpp 4 (VPP);
    --recompute-activations is selective; the lr and checkpoint arguments are noted."""
    s, notes = strategy_from_args(ARGV, 64)
    assert (s.dp, s.tp, s.pp, s.cp, s.vpp, s.schedule) == (8, 4, 2, 1, 4, "VPP")
    assert (s.micro_batch_size, s.global_batch_size) == (2, 128)
    assert (s.zero, s.recompute, s.dtype, s.sequence_parallel) == (1, "selective", "bfloat16", True)
    assert (s.optimizer, s.framework) == ("adamw", "megatron-core")
    assert notes == ["Megatron-LM arguments that leave a step's cost alone, not read: --lr 3e-4, --save /ckpt"]


def test_sequence_parallel_at_tp_1_is_off_and_noted():
    s, notes = strategy_from_args(["--sequence-parallel", "--global-batch-size", "8"], 8)
    assert (s.dp, s.sequence_parallel) == (8, False)
    assert "--sequence-parallel (at tp 1 Megatron-LM turns it off)" in notes[0]


def test_a_launch_line_refuses_what_it_cannot_read_naming_the_argument():
    with pytest.raises(MeshplanError) as e:
        strategy_from_args(["--tensor-model-parallel-size", "3", "--global-batch-size", "8"], 8)
    assert e.value.field == "--tensor-model-parallel-size" and "does not divide the 8 GPUs" in str(e.value)
    with pytest.raises(MeshplanError) as e:
        strategy_from_args(["--use-flash-attn-v9", "--global-batch-size", "8"], 8)
    assert e.value.field == "--use-flash-attn-v9"
    with pytest.raises(MeshplanError) as e:  # vpp from layers needs the layer count
        strategy_from_args(["--pipeline-model-parallel-size", "2",
                            "--num-layers-per-virtual-pipeline-stage", "2", "--global-batch-size", "8"], 8)
    assert e.value.field == "--num-layers"
    with pytest.raises(MeshplanError) as e:
        launch.split(["--lr"])
    assert e.value.field == "--lr"


def test_the_launch_line_names_are_the_cli_aliases_of_the_same_fields():
    """FIELD_ARGS (the API's reading) and the CLI's FLAGS / SIZE_FLAGS give one field to each
    Megatron-LM name (both read meshplan.flags); the Megatron-only names are the ones
    MEGATRON_FLAGS lists. The spellings as typed: own long flags, the Megatron-LM alias,
    the short flag."""
    from meshplan.commands import options
    from meshplan.flags import FLAGS, SIZE_FLAGS

    assert (options.FLAGS, options.SIZE_FLAGS) == (FLAGS, SIZE_FLAGS)
    cli = {f: name for table in (FLAGS, SIZE_FLAGS) for name, flags in table.items() for f in flags}
    assert {flag: cli.get(flag) for flag in FIELD_ARGS} == {f: field for f, (field, _) in FIELD_ARGS.items()}
    assert set(MEGATRON_ARGS) == set(mg.MEGATRON_FLAGS)
    assert FLAGS["tp"] == ("--tp", "--mp", "--tensor-model-parallel-size")
    assert FLAGS["micro_batch_size"] == ("--micro-batch-size",)
    assert SIZE_FLAGS["seq_len"] == ("--seq-len", "--seq-length", "-s")


# -- a DeepSpeed config (strategy_from_config) ---------------------------------------------------

def test_a_deepspeed_config_is_a_strategy():
    """16 GPUs / (tp 2 x pp 1) = dp 8; micro 2 x 4 accumulation steps x dp 8 = 64 sequences;
    ZeRO-3, bf16; no optimizer section: the script's torch optimizer, costed as AdamW."""
    cfg = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4,
           "zero_optimization": {"stage": 3, "overlap_comm": True}, "bf16": {"enabled": True}}
    s, notes = strategy_from_config(cfg, 16, tp=2)
    assert (s.dp, s.tp, s.pp, s.micro_batch_size, s.global_batch_size) == (8, 2, 1, 2, 64)
    assert (s.zero, s.dtype, s.optimizer, s.framework, s.recompute) == (3, "bfloat16", "adamw", "deepspeed", "none")
    assert notes == []


def test_a_deepspeed_config_notes_and_errors_name_the_key():
    s, notes = strategy_from_config({"train_batch_size": 32, "steps_per_prin": 10}, 8)
    assert (s.dp, s.micro_batch_size, s.global_batch_size) == (8, 4, 32)  # 32 // 8 // 1
    assert notes == ["the DeepSpeed config: the top level has keys DeepSpeed does not read, ignored: "
                     "steps_per_prin"]
    with pytest.raises(DeepSpeedConfigError) as e:
        strategy_from_config({"train_batch_size": 32, "zero_optimization": {"stage": 5}}, 8)
    assert e.value.field == "zero_optimization.stage" and isinstance(e.value, MeshplanError)
    with pytest.raises(DeepSpeedConfigError) as e:
        strategy_from_config({"train_batch_size": 32,
                              "zero_optimization": {"offload_optimizer": {"device": "cpu"}}}, 8)
    assert e.value.field == "zero_optimization.offload_optimizer.device"


# -- a torchtitan job TOML (strategy_from_toml) --------------------------------------------------

TOML = """
[training]
local_batch_size = 8
global_batch_size = 64
seq_len = 4096

[parallelism]
data_parallel_shard_degree = -1
tensor_parallel_degree = 2

[activation_checkpoint]
mode = "selective"
selective_ac_option = "op"

[compile]
enable = true
components = ["model"]
"""


def test_a_torchtitan_toml_is_a_strategy(tmp_path):
    """16 GPUs / tp 2 = shard degree 8 (dp 8), resharded after forward without pp: ZeRO-3;
    micro-batch = local batch 8, global 64 = 8 x 8; selective op AC; compiled: fsdp2."""
    path = tmp_path / "job.toml"
    path.write_text(TOML)
    s, seq_len, notes = strategy_from_toml(path, 16)
    assert (s.dp, s.tp, s.pp, s.zero, s.sequence_parallel) == (8, 2, 1, 3, True)
    assert (s.micro_batch_size, s.global_batch_size, s.recompute) == (8, 64, "selective-op")
    assert (s.framework, s.dtype, seq_len, notes) == ("fsdp2", "bfloat16", 4096, [])


def test_torchtitan_errors_name_the_section_and_key(tmp_path):
    path = tmp_path / "job.toml"
    path.write_text(TOML.replace("tensor_parallel_degree = 2",
                                 "pipeline_parallel_degree = 2\npipeline_parallel_schedule = \"Bogus\""))
    with pytest.raises(TorchtitanConfigError) as e:
        strategy_from_toml(path, 16, 32)
    assert e.value.field == "parallelism.pipeline_parallel_schedule"
    path.write_text(TOML.replace("tensor_parallel_degree = 2", "tensor_parallel_degree = 0"))
    with pytest.raises(TorchtitanConfigError) as e:
        strategy_from_toml(path, 16)
    assert e.value.field == "parallelism.tensor_parallel_degree"


# -- round trips: export_plan -> the reader of the same framework --------------------------------

def _plan(**kw) -> Plan:
    base = dict(dp=2, tp=2, pp=4, vpp=2, schedule="VPP", micro_batch_size=1, global_batch_size=16,
                recompute="full", zero=1, sequence_parallel=True)
    base.update(kw)
    return Plan(model="llama2-7b", cluster="dgx-a100-80g", strategy=Strategy(**base), nodes=4)


LAYOUT = ("dp", "tp", "pp", "vpp", "schedule", "micro_batch_size", "global_batch_size", "recompute",
          "zero", "sequence_parallel", "dtype", "optimizer")


def _fields(s: Strategy) -> dict:
    return {k: getattr(s, k) for k in LAYOUT}


def test_megatron_round_trip():
    plan = _plan()
    out = export_plan(plan, "megatron")
    argv = shlex.split(" ".join(ln.rstrip("\\") for ln in out.text.splitlines() if not ln.startswith("#")))
    s, notes = strategy_from_args(argv, plan.strategy.world_size)
    assert _fields(s) == _fields(plan.strategy) and notes == []


def test_torchtitan_round_trip(tmp_path):
    """A ZeRO-3 1F1B plan costed under fsdp2 (compiled): the TOML reads back as the plan;
    torchtitan's sequence parallelism follows tp."""
    plan = _plan(pp=2, vpp=1, schedule="1F1B", zero=3, recompute="selective-op", framework="fsdp2")
    out = export_plan(plan, "torchtitan")
    path = tmp_path / "job.toml"
    path.write_text(out.text)
    s, seq_len, notes = strategy_from_toml(path, plan.strategy.world_size, 32)
    assert _fields(s) == _fields(plan.strategy) and s.framework == "fsdp2"
    assert seq_len == 4096 and notes == []
    assert s.layers_per_stage is None or sum(s.layers_per_stage) == 32


def test_deepspeed_round_trip():
    """tp and pp are the script's (AutoTP writes tp): a pp 1 ZeRO-2 plan reads back whole."""
    plan = _plan(pp=1, vpp=1, schedule="1F1B", zero=2, recompute="none", framework="deepspeed")
    cfg = json.loads(export_plan(plan, "deepspeed").text)
    s, notes = strategy_from_config(cfg, plan.strategy.world_size, sequence_parallel=False)
    assert _fields(s) == _fields(plan.strategy) | {"sequence_parallel": False}
    assert s.framework == "deepspeed"
    assert any("AutoTP" in n for n in notes)


def test_the_package_exports_its_api():
    assert set(frameworks.TARGETS) == {"megatron", "torchtitan", "deepspeed"}
    with pytest.raises(frameworks.ExportError):
        export_plan(_plan(), "nemo")


@pytest.mark.parametrize("argv", [
    ARGV[:-4],
    ["--tensor-model-parallel-size", "2", "--context-parallel-size", "2", "--global-batch-size", "32",
     "--pipeline-model-parallel-layout", "E,t*16|t*16,L", "--pipeline-model-parallel-size", "2",
     "--fp16", "--recompute-granularity", "full", "--recompute-method", "block",
     "--recompute-num-layers", "16"],
])
def test_the_api_reads_a_launch_line_as_meshplan_cost_does(capsys, argv):
    """The same Megatron-LM arguments after ``cost --model llama2-7b --cluster dgx-h100
    --nodes 4`` (32 GPUs) and through strategy_from_args(argv, 32): one strategy. The CLI
    takes dp from ``--dp`` (default 1: idle GPUs, with a warning), Megatron-LM and the API
    derive it from the world; the CLI reports the attention the model resolves to (the API
    leaves None: the model's)."""
    from tests._cli import run_main

    s, _ = strategy_from_args(argv, 32, model="llama2-7b")
    rc, out, err = run_main(capsys, "cost", "--model", "llama2-7b", "--cluster", "dgx-h100",
                            "--nodes", "4", "--dp", str(s.dp), *argv, "--json")
    assert rc == 0, err
    cli = json.loads(out)["strategy"]
    api = json.loads(json.dumps(s.to_dict()))  # tuples as JSON lists, as the CLI's
    keys = (set(cli) & set(api)) - {"attention"}
    assert len(keys) > 15 and {k: api[k] for k in keys} == {k: cli[k] for k in keys}

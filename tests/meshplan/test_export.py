"""``meshplan export``: each target's output parsed by a parser written from that framework's
documented names, and the parsed layout compared with the plan's.

Parsers (written here, not imported: none of the frameworks is installed):

- Megatron-LM: an argparse definition of the arguments the exporter may write, with the
  names, types, actions and choices of ``megatron/training/arguments.py`` at NVIDIA/
  Megatron-LM d98e8a64ddf34856e74b24714e3bedb2f5a39553 (dataclass-generated ones per
  ``megatron/training/argument_utils.py``: ``--`` + field name with ``-``, bool False ->
  store_true; fields of ``ModelParallelConfig``, ``TransformerConfig``,
  ``TrainingConfig``, ``DistributedInitConfig``; hand-written ones at lines 3095-3190 and
  2913 of that file), and the ``--pipeline-model-parallel-layout`` grammar of
  ``PipelineParallelLayerLayout.parse_str_to_list`` (``megatron/core/transformer/
  pipeline_parallel_layer_layout.py``).
- torchtitan: ``tomllib``, keys checked against the fields of ``Training``,
  ``Parallelism``, ``ActivationCheckpoint`` and ``Optimizer`` in
  ``torchtitan/config/job_config.py`` at pytorch/torchtitan 238fa9953e4a.
- DeepSpeed: ``json``, keys checked against DeepSpeed's config reference.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
from pathlib import Path

import pytest
import tomllib
from hypothesis import given, settings
from hypothesis import strategies as st

from completion.strategy import FP8_RECIPES
from meshplan.commands import export as export_cmd_module
from meshplan.frameworks.megatron.export import pipeline_layout
from meshplan.frameworks.targets import LAYOUT_KNOBS, TARGETS, ExportError, export_plan, layout
from meshplan.frameworks.torchtitan.export import even_split, module_fqns
from meshplan.plan import Plan
from meshplan.strategy import Strategy
from tests._cli import one_line_error, run_main

ROOT = Path(__file__).resolve().parents[2]

# -- Megatron-LM --------------------------------------------------------------------------


def megatron_parser() -> argparse.ArgumentParser:
    """The arguments the exporter may write, as Megatron-LM d98e8a64 defines them."""
    p = argparse.ArgumentParser(prog="pretrain_gpt.py", allow_abbrev=False)
    p.add_argument("--tensor-model-parallel-size", type=int, default=1)
    p.add_argument("--pipeline-model-parallel-size", type=int, default=1)
    p.add_argument("--context-parallel-size", type=int, default=1)
    p.add_argument("--cp-comm-type", nargs="+", default=["p2p"],
                   choices=["p2p", "a2a", "allgather", "a2a+p2p"])
    p.add_argument("--sequence-parallel", action="store_true")
    p.add_argument("--num-layers-per-virtual-pipeline-stage", type=int, default=None)
    p.add_argument("--num-virtual-stages-per-pipeline-rank", type=int, default=None)
    p.add_argument("--pipeline-model-parallel-layout", type=str, default=None)
    p.add_argument("--recompute-granularity", choices=["full", "selective"], default=None)
    p.add_argument("--recompute-method", choices=["uniform", "block"], default=None)
    p.add_argument("--recompute-num-layers", type=int, default=None)
    p.add_argument("--use-distributed-optimizer", action="store_true")
    p.add_argument("--use-megatron-fsdp", action="store_true")
    p.add_argument("--data-parallel-sharding-strategy", default="optim_grads_params",
                   choices=["no_shard", "optim", "optim_grads", "optim_grads_params"])
    p.add_argument("--ckpt-format", default="torch_dist",
                   choices=["torch", "torch_dist", "torch_dcp", "fsdp_dtensor"])
    p.add_argument("--num-distributed-optimizer-instances", type=int, default=1)
    p.add_argument("--outer-dp-sharding-strategy", default="no_shard", choices=["no_shard", "optim"])
    p.add_argument("--fp8-format", choices=["e4m3", "hybrid"], default=None)
    p.add_argument("--fp8-recipe", choices=["tensorwise", "delayed", "mxfp8", "blockwise", "custom"],
                   default="delayed")
    p.add_argument("--fp8-amax-history-len", type=int, default=1)
    p.add_argument("--fp8-amax-compute-algo", choices=["most_recent", "max"], default="most_recent")
    p.add_argument("--bf16", action="store_true")
    p.add_argument("--fp16", action="store_true")
    p.add_argument("--grad-reduce-in-bf16", action="store_true")
    # DistributedDataParallelConfig / TransformerConfig switches (off by default in Megatron-LM)
    p.add_argument("--overlap-grad-reduce", action="store_true")
    p.add_argument("--overlap-param-gather", action="store_true")
    p.add_argument("--tp-comm-overlap", action="store_true")
    p.add_argument("--optimizer", default="adam",
                   choices=["adam", "sgd", "muon", "dist_muon", "lion", "soap", "adaptive_muon"])
    p.add_argument("--attention-backend", choices=["flash", "fused", "unfused", "local", "auto"],
                   default="auto")
    p.add_argument("--micro-batch-size", type=int, default=None)
    p.add_argument("--global-batch-size", type=int, default=None)
    p.add_argument("--num-layers", type=int, default=None)
    p.add_argument("--seq-length", type=int, default=None)
    return p


def parse_layout_string(text: str) -> list[list[str]]:
    """Megatron's layout grammar: commas are cosmetic, ``(..)*n`` and ``x*n`` repeat,
    ``|`` separates stages; E embedding, t decoder layer, L loss."""
    s = text.replace(",", "")
    s = re.sub(r"\(([^)]+)\)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), s)
    s = re.sub(r"(.)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), s)
    return [list(stage) for stage in s.split("|")]


def parse_megatron(text: str, world: int) -> dict:
    """The layout Megatron-LM runs for the exported arguments on ``world`` ranks."""
    body = [ln for ln in text.splitlines() if not ln.startswith("#")]
    argv = shlex.split(" ".join(ln.rstrip("\\") for ln in body))
    a = megatron_parser().parse_args(argv)
    tp, pp, cp = a.tensor_model_parallel_size, a.pipeline_model_parallel_size, a.context_parallel_size
    assert world % (tp * pp * cp) == 0
    lps = None
    if a.pipeline_model_parallel_layout is not None:
        stages = parse_layout_string(a.pipeline_model_parallel_layout)
        assert stages[0][0] == "E" and stages[-1][-1] == "L"
        assert set("".join("".join(s) for s in stages)) <= set("EtL")
        assert len(stages) % pp == 0
        vpp, lps = len(stages) // pp, tuple(s.count("t") for s in stages)
        assert a.num_layers == sum(lps)
    elif a.num_layers_per_virtual_pipeline_stage is not None:
        vpp = a.num_layers // (pp * a.num_layers_per_virtual_pipeline_stage)
        assert vpp * pp * a.num_layers_per_virtual_pipeline_stage == a.num_layers
    else:
        vpp = a.num_virtual_stages_per_pipeline_rank or 1
    recompute = {None: "none", "selective": "selective", "full": "full"}[a.recompute_granularity]
    if recompute == "full":  # every layer: uniform chunks of one layer
        assert (a.recompute_method, a.recompute_num_layers) == ("uniform", 1)
    # Megatron-FSDP and its checkpoint format go together (validate_args asserts both ways,
    # arguments.py lines 1169-1170 and 1675-1676 at d98e8a64)
    assert a.use_megatron_fsdp == (a.ckpt_format == "fsdp_dtensor")
    if a.use_megatron_fsdp:
        zero = {"optim_grads": 2, "optim_grads_params": 3}[a.data_parallel_sharding_strategy]
    else:
        zero = 1 if a.use_distributed_optimizer else 0
    assert not (a.bf16 and a.fp16)
    fp8 = None
    if a.fp8_format is not None:  # Transformer Engine FP8 linears
        fp8 = {"delayed": "te-delayed", "tensorwise": "tensorwise"}[a.fp8_recipe]
        if fp8 == "te-delayed":  # the amax history the cost model assumes
            assert (a.fp8_amax_history_len, a.fp8_amax_compute_algo) == (1024, "max")
    dp, outer = world // (tp * pp * cp), a.num_distributed_optimizer_instances
    # Megatron-FSDP HSDP: states sharded over dp / outer inner ranks, replicated over outer
    assert outer == 1 or (zero == 3 and a.outer_dp_sharding_strategy == "no_shard" and dp % outer == 0)
    cp_comm = {"p2p": "p2p", "allgather": "all_gather"}[a.cp_comm_type[0]] if cp > 1 else "p2p"
    return {"dp": dp, "fsdp_shard_size": dp // outer if outer > 1 else None, "tp": tp, "pp": pp, "cp": cp,
            "cp_comm": cp_comm, "vpp": vpp,
            "schedule": "VPP" if vpp > 1 else "1F1B", "layers_per_stage": lps,
            "micro_batch_size": a.micro_batch_size, "global_batch_size": a.global_batch_size,
            "recompute": recompute, "zero": zero, "sequence_parallel": a.sequence_parallel,
            "dtype": "bfloat16" if a.bf16 else "float16" if a.fp16 else "float32", "fp8": fp8,
            "optimizer": {"adam": "adamw", "sgd": "sgd"}[a.optimizer],
            "attention": None if a.attention_backend == "auto" else a.attention_backend,
            "num_layers": a.num_layers, "seq_len": a.seq_length}


# -- torchtitan ---------------------------------------------------------------------------

#: field names of the job_config.py dataclasses at torchtitan 238fa9953e4a that a section may hold
TORCHTITAN_FIELDS = {
    "training": {"dataset", "dataset_path", "local_batch_size", "global_batch_size", "seq_len",
                 "max_norm", "steps", "enable_cpu_offload", "dtype", "mixed_precision_param",
                 "mixed_precision_reduce", "gc_freq", "gc_debug"},
    "parallelism": {"data_parallel_replicate_degree", "data_parallel_shard_degree",
                    "fsdp_reshard_after_forward", "tensor_parallel_degree",
                    "disable_loss_parallel", "enable_async_tensor_parallel",
                    "pipeline_parallel_degree", "module_fqns_per_model_part",
                    "pipeline_parallel_first_stage_less_layers",
                    "pipeline_parallel_last_stage_less_layers",
                    "pipeline_parallel_layers_per_stage", "pipeline_parallel_schedule",
                    "pipeline_parallel_schedule_csv", "pipeline_parallel_microbatch_size",
                    "context_parallel_degree", "context_parallel_rotate_method",
                    "expert_parallel_degree"},
    "activation_checkpoint": {"mode", "selective_ac_option", "early_stop", "memory_budget"},
    "optimizer": {"name", "lr", "eps"},
    "model": {"name", "flavor", "hf_assets_path", "tokenizer_path", "converters",
              "print_after_conversion"},
    "quantize": {"linear", "grouped_mm"},
    "compile": {"enable", "components", "backend"},
}
#: fields of torchtitan 238fa99 ``Float8Linear`` ([quantize.linear.float8])
FLOAT8_FIELDS = {"enable_fsdp_float8_all_gather", "precompute_float8_dynamic_scale_for_fsdp",
                 "recipe_name", "filter_fqns", "emulate"}
#: torch.distributed.pipelining.schedules.get_schedule_class names -> plan schedule
TORCH_SCHEDULES = {"GPipe": "FThenB", "1F1B": "1F1B", "Interleaved1F1B": "VPP",
                   "ZBVZeroBubble": "ZBVPP"}


def parse_torchtitan(text: str, world: int) -> dict:
    """The layout torchtitan runs for the exported TOML on ``world`` ranks."""
    doc = tomllib.loads(text)
    for section, values in doc.items():
        assert set(values) <= TORCHTITAN_FIELDS[section], (section, set(values))
    tr, par, ac = doc["training"], doc["parallelism"], doc["activation_checkpoint"]
    fp8 = None
    if "quantize.linear.float8" in doc.get("model", {}).get("converters", []):
        f8 = doc["quantize"]["linear"]["float8"]
        assert set(f8) <= FLOAT8_FIELDS and f8["recipe_name"] in ("tensorwise", "rowwise")
        fp8 = f8["recipe_name"]
    rep, shard = par["data_parallel_replicate_degree"], par["data_parallel_shard_degree"]
    tp, pp = par["tensor_parallel_degree"], par.get("pipeline_parallel_degree", 1)
    cp = par.get("context_parallel_degree", 1)
    dp = rep * shard
    assert dp * tp * pp * cp == world
    sched = par.get("pipeline_parallel_schedule", "1F1B")
    fqns, lps = par.get("module_fqns_per_model_part"), None
    if fqns is not None:
        vpp = len(fqns) // pp
        lps = tuple(sum(m.startswith("layers.") for m in part) for part in fqns)
        flat = [m for part in fqns for m in part]
        assert flat == ["tok_embeddings", *(f"layers.{i}" for i in range(sum(lps))), "norm", "output"]
    else:
        vpp = 1 if sched in ("GPipe", "1F1B") or pp == 1 else 2
    if pp > 1:
        micro = par["pipeline_parallel_microbatch_size"]
        assert tr["local_batch_size"] * dp == tr["global_batch_size"]
    else:
        micro = tr["local_batch_size"]
    # torchtitan 238fa99 models/llama3/infra/parallelize.py: "default" reshards after
    # forward only without pp (with pp the parameters stay gathered: ZeRO-2)
    policy = par.get("fsdp_reshard_after_forward", "default")
    reshard = policy == "always" or (policy == "default" and pp == 1)
    # ParallelDims: FSDP runs over dp_shard x cp, so cp > 1 shards even with shard degree 1
    zero = 0 if shard == 1 and cp == 1 else 3 if reshard else 2
    hsdp = shard if rep > 1 and shard > 1 else None  # 2-D mesh (replicate, shard)
    recompute = {("none", None): "none", ("full", None): "full",
                 ("selective", "op"): "selective-op"}[(ac["mode"], ac.get("selective_ac_option"))]
    # torchtitan's rotate methods: alltoall passes the shards round (the ring), allgather
    # (its default) gathers them
    rotate = par.get("context_parallel_rotate_method", "allgather")
    cp_comm = {"alltoall": "p2p", "allgather": "all_gather"}[rotate] if cp > 1 else "p2p"
    out = {"dp": dp, "tp": tp, "pp": pp, "cp": cp, "cp_comm": cp_comm, "vpp": vpp, "micro_batch_size": micro,
           "global_batch_size": tr["global_batch_size"], "schedule": TORCH_SCHEDULES[sched],
           "zero": zero, "fsdp_shard_size": hsdp, "sequence_parallel": tp > 1, "recompute": recompute,
           "dtype": tr["mixed_precision_param"], "fp8": fp8,
           "optimizer": {"AdamW": "adamw", "Adam": "adam"}[doc["optimizer"]["name"]]}
    if fqns is not None:
        out["layers_per_stage"] = lps
    if "seq_len" in tr:
        out["seq_len"] = tr["seq_len"]
    return out


# -- DeepSpeed ----------------------------------------------------------------------------

DEEPSPEED_KEYS = {"train_batch_size", "train_micro_batch_size_per_gpu",
                  "gradient_accumulation_steps", "zero_optimization", "bf16", "fp16",
                  "tensor_parallel", "optimizer", "activation_checkpointing"}


def parse_deepspeed(text: str, world: int, pp: int | None = None) -> dict:
    """The layout DeepSpeed runs for the exported JSON on ``world`` ranks, by DeepSpeed
    0.19.8's batch rule (``runtime/config.py``: train_batch_size = micro x
    gradient_accumulation_steps x dp). pp: the script's ``PipelineModule(num_stages)``
    (the export's pp note); None: the world over the dp that ``train_batch_size`` states
    and tp. AutoTP configs leave ``train_batch_size`` for DeepSpeed to derive (its batch
    world is dp or dp x tp depending on the script's mpu), so they need pp."""
    cfg = json.loads(text)
    assert set(cfg) <= DEEPSPEED_KEYS
    micro, gas = cfg["train_micro_batch_size_per_gpu"], cfg["gradient_accumulation_steps"]
    tp = cfg.get("tensor_parallel", {}).get("autotp_size", 1)
    assert ("train_batch_size" in cfg) == (tp == 1)
    if pp is None:
        dp, rem = divmod(cfg["train_batch_size"], micro * gas)
        assert rem == 0 and world % (dp * tp) == 0
        pp = world // (dp * tp)
    dp = world // (tp * pp)
    assert cfg.get("train_batch_size", micro * gas * dp) == micro * gas * dp
    assert not (cfg["bf16"]["enabled"] and cfg["fp16"]["enabled"])
    out = {"dp": dp, "tp": tp, "pp": pp, "cp": 1, "vpp": 1, "schedule": "1F1B",
           "micro_batch_size": micro, "global_batch_size": micro * gas * dp,
           "zero": cfg["zero_optimization"]["stage"], "sequence_parallel": False,
           "fsdp_shard_size": cfg["zero_optimization"].get("mics_shard_size"),
           "recompute": "full" if "activation_checkpointing" in cfg else "none", "fp8": None,
           "dtype": "bfloat16" if cfg["bf16"]["enabled"] else
                    "float16" if cfg["fp16"]["enabled"] else "float32"}
    if "optimizer" in cfg:
        out["optimizer"] = {"AdamW": "adamw", "Adam": "adam"}[cfg["optimizer"]["type"]]
    return out


PARSERS = {"megatron": parse_megatron, "torchtitan": parse_torchtitan, "deepspeed": parse_deepspeed}
#: knobs each parser must recover from the file alone
CORE = ("dp", "tp", "pp", "cp", "vpp", "micro_batch_size", "global_batch_size", "schedule", "zero",
        "fsdp_shard_size", "recompute", "sequence_parallel", "dtype", "fp8")


# -- random plans -------------------------------------------------------------------------

@st.composite
def plans(draw) -> Plan:
    """A valid plan of a built-in model (32 or 96 layers) or with a stated layer count."""
    dp, tp, pp = (draw(st.sampled_from([1, 2, 4])) for _ in range(3))
    zero = draw(st.sampled_from([0, 1, 2, 3]))
    hsdp = None
    if zero == 3 and draw(st.booleans()):  # HSDP: dp 8 = 4 shard groups of 2 or 2 of 4
        dp, hsdp = 8, draw(st.sampled_from([2, 4]))
    cp = draw(st.sampled_from([1, 1, 2, 4]))
    schedule = draw(st.sampled_from(["1F1B", "FThenB", "VPP", "ZBH1", "ZBVPP", "ZB-1p"]))
    vpp = {"VPP": draw(st.sampled_from([2, 3, 4])), "ZBVPP": 2}.get(schedule, 1)
    if pp == 1 and vpp == 1:  # one stage has no pipeline to schedule (Strategy: 1F1B only)
        schedule = "1F1B"
    micro = draw(st.sampled_from([1, 2]))
    m = draw(st.integers(1, 8))
    model = draw(st.sampled_from(["llama2-7b", "gpt3-175b"]))
    num_layers = draw(st.one_of(st.none(), st.integers(pp * vpp, 48)))
    lps = None
    if pp * vpp > 1 and draw(st.booleans()):
        lps = tuple(draw(st.lists(st.integers(0, 5), min_size=pp * vpp, max_size=pp * vpp)))
        if sum(lps) == 0:
            lps = (1,) + lps[1:]
        num_layers = sum(lps)
    framework = draw(st.sampled_from(["megatron-core", "fsdp2", "deepspeed"]))
    dtype = draw(st.sampled_from(["bfloat16", "float16", "float32"]))
    recipes = [r for r, fws in FP8_RECIPES.items() if framework in fws]
    fp8 = draw(st.sampled_from([None, *recipes])) if dtype == "bfloat16" and recipes else None
    s = Strategy(dp=dp, tp=tp, pp=pp, cp=cp, vpp=vpp, schedule=schedule, micro_batch_size=micro,
                 global_batch_size=dp * micro * m,
                 recompute=draw(st.sampled_from(["none", "selective", "selective-op", "full"])),
                 zero=zero, fsdp_shard_size=hsdp,
                 sequence_parallel=tp > 1 and draw(st.booleans()),
                 dtype=dtype, fp8=fp8,
                 optimizer=draw(st.sampled_from(["adamw", "adam", "sgd"])),
                 attention=draw(st.sampled_from([None, "flash"] + (["unfused"] if cp == 1 else []))),
                 layers_per_stage=lps, framework=framework)
    return Plan(model=model, cluster="dgx-a100-80g", strategy=s, num_layers=num_layers,
                seq_len=draw(st.one_of(st.none(), st.sampled_from([1024, 2048]))))


def _check_round_trip(plan: Plan, target: str) -> dict:
    out = export_plan(plan, target)
    # the ranks the exported job is launched on (a target that drops cp runs without it)
    world = plan.strategy.world_size // plan.strategy.cp * out.effective["cp"]
    if target == "deepspeed":  # pp: the script's PipelineModule(num_stages=N), as noted
        stages = [re.search(r"num_stages=(\d+)", n.text) for n in out.notes if n.knob == "pp"]
        parsed = parse_deepspeed(out.text, world, int(stages[0].group(1)) if stages else 1)
    else:
        parsed = PARSERS[target](out.text, world)
    assert set(CORE) <= set(parsed), set(CORE) - set(parsed)
    assert parsed == {k: out.effective[k] for k in parsed}, (out.text, out.effective)
    want = layout(plan)
    noted = {n.knob for n in out.notes}
    for k in LAYOUT_KNOBS:  # every knob the target runs otherwise is named by a note
        if out.effective[k] != want[k]:
            assert k in noted, (k, want[k], out.effective[k], out.notes)
    return parsed


@settings(max_examples=20, deadline=None, derandomize=True)
@given(plan=plans())
def test_export_round_trip_of_random_plans_equals_the_plans_layout(plan):
    """export -> parse with the framework-style parser -> the layout the target runs; it
    equals the plan's wherever no note says otherwise, and Megatron-LM (whose knobs are
    meshplan's) reproduces the plan's parallel layout, batch, ZeRO and dtype exactly."""
    for target in TARGETS:
        _check_round_trip(plan, target)
    want = layout(plan)
    parsed = parse_megatron(export_plan(plan, "megatron").text, plan.strategy.world_size)
    for k in ("dp", "tp", "micro_batch_size", "global_batch_size", "zero", "fsdp_shard_size",
              "sequence_parallel", "dtype", "num_layers", "pp"):
        assert parsed[k] == want[k], k
    if plan.strategy.pp > 1:
        assert (parsed["vpp"], parsed["layers_per_stage"]) == (want["vpp"], want["layers_per_stage"])


# -- hand-derived outputs -------------------------------------------------------------------

def _plan(**kw) -> Plan:
    base = dict(dp=2, tp=2, pp=4, vpp=2, schedule="VPP", micro_batch_size=1, global_batch_size=16,
                recompute="full", zero=1, sequence_parallel=True)
    base.update(kw)
    return Plan(model="llama2-7b", cluster="dgx-a100-80g", strategy=Strategy(**base), nodes=4)


def test_megatron_arguments_of_a_known_plan():
    """llama2-7b (32 layers), tp2 pp4 vpp2 dp2: 32 / (4 x 2) = 4 layers per virtual stage;
    m = 16 / (2 x 1) = 8 micro-batches is Megatron's to derive from the batch sizes."""
    text = export_plan(_plan(), "megatron").text
    argv = shlex.split(" ".join(ln.rstrip("\\") for ln in text.splitlines() if not ln.startswith("#")))
    assert argv == ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "4",
                    "--num-layers-per-virtual-pipeline-stage", "4", "--sequence-parallel",
                    "--recompute-granularity", "full", "--recompute-method", "uniform",
                    "--recompute-num-layers", "1", "--use-distributed-optimizer",
                    # the megatron-core profile costs these overlaps, which Megatron-LM leaves off
                    "--overlap-grad-reduce", "--overlap-param-gather", "--tp-comm-overlap", "--bf16",
                    "--optimizer", "adam", "--micro-batch-size", "1", "--global-batch-size", "16",
                    "--num-layers", "32", "--seq-length", "4096"]
    assert "dp 2 = 16 / (tp 2 x pp 4 x cp 1)" in text


def test_megatron_layout_string_of_an_uneven_split():
    assert pipeline_layout((3, 0, 2)) == "E,t*3||t*2,L"
    assert pipeline_layout((0, 1)) == "E|t,L"
    assert parse_layout_string("E,t*3||t*2,L") == [["E", "t", "t", "t"], [], ["t", "t", "L"]]
    out = export_plan(_plan(pp=2, vpp=1, schedule="1F1B", layers_per_stage=(5, 3)), "megatron")
    assert "--pipeline-model-parallel-layout 'E,t*5|t*3,L'" in out.text


def test_megatron_notes_what_it_cannot_run():
    out = export_plan(_plan(pp=2, vpp=1, schedule="ZBH1", recompute="selective-op",
                            optimizer="adam"), "megatron")
    assert {n.knob for n in out.notes} == {"schedule", "recompute", "optimizer"}
    assert out.effective["schedule"] == "1F1B" and out.effective["recompute"] == "selective"


def test_a_nemo_plan_exported_to_megatron_lm_is_noted():
    """A plan costed under the nemo profile (Apex DistributedFusedAdam: bf16 gradients,
    fp32 masters as 16-bit remainders) runs differently under Megatron-LM's pretrain_gpt.py
    (fp32 gradients with bf16, whole masters: 6 + 12/N bytes a parameter against 4 + 10/N),
    so the export says to re-cost it."""
    out = export_plan(_plan(framework="nemo"), "megatron")
    note = [n for n in out.notes if n.knob == "framework"]
    assert note and "'nemo' profile" in note[0].text and "megatron-core" in note[0].text
    assert not [n for n in export_plan(_plan(), "megatron").notes if n.knob == "framework"]


def test_bf16_gradients_of_the_profile_are_asked_of_megatron_lm():
    """Megatron-LM d98e8a64 keeps fp32 main gradients with --bf16 (arguments.py:
    accumulate_allreduce_grads_in_fp32 = not grad_reduce_in_bf16); a plan costed with bf16
    gradients (megatron-bridge: grad_reduce_in_fp32 False) asks for them, so the run reduces
    2 bytes a gradient as predicted, not 4. megatron-core's fp32 default writes nothing; an
    fp32 plan has no bf16 to reduce in."""
    def flag(**kw):
        text = export_plan(_plan(**kw), "megatron").text
        parse_megatron(text, 16)  # the whole text parses as Megatron-LM's arguments
        body = [ln for ln in text.splitlines() if not ln.startswith("#")]
        argv = shlex.split(" ".join(ln.rstrip("\\") for ln in body))
        return megatron_parser().parse_args(argv).grad_reduce_in_bf16

    assert flag(framework="megatron-bridge") and flag(framework="nemo")
    assert not flag() and not flag(framework="megatron-core")
    assert not flag(framework="megatron-bridge", dtype="float32")


def test_torchtitan_toml_of_a_known_plan():
    """ZeRO 3 dp2 -> data_parallel_shard_degree 2; pp4: local batch 16 / 2 = 8 split into
    micro-batches of 1; vpp 3 with 32 layers: an even split 3,3,3,3,3,3,3,3,2,2,2,2 of
    12 stages, listed as modules."""
    out = export_plan(_plan(vpp=3, zero=3, recompute="selective-op"), "torchtitan")
    doc = tomllib.loads(out.text)
    assert doc["training"] == {"local_batch_size": 8, "global_batch_size": 16, "seq_len": 4096,
                               "mixed_precision_param": "bfloat16"}
    par = doc["parallelism"]
    assert (par["data_parallel_replicate_degree"], par["data_parallel_shard_degree"]) == (1, 2)
    assert par["pipeline_parallel_schedule"] == "Interleaved1F1B"
    assert [len([m for m in p if m.startswith("layers.")]) for p in par["module_fqns_per_model_part"]] \
        == [3] * 8 + [2] * 4
    assert doc["activation_checkpoint"] == {"mode": "selective", "selective_ac_option": "op"}
    assert "layers_per_stage" in {n.knob for n in out.notes}
    assert even_split(32, 12) == (3,) * 8 + (2,) * 4
    assert module_fqns((1, 0, 1)) == [["tok_embeddings", "layers.0"], [], ["layers.1", "norm", "output"]]


def test_deepspeed_json_of_a_known_plan():
    """global 16 = micro 1 x 8 accumulation steps x dp 2; under AutoTP train_batch_size is
    left for DeepSpeed to derive (noted); pp is a script setting (noted)."""
    out = export_plan(_plan(pp=1, vpp=1, schedule="1F1B", zero=2), "deepspeed")
    cfg = json.loads(out.text)
    assert "train_batch_size" not in cfg and cfg["gradient_accumulation_steps"] == 8
    assert cfg["train_micro_batch_size_per_gpu"] == 1
    assert "global_batch_size" in {n.knob for n in out.notes}
    dense = json.loads(export_plan(_plan(tp=1, pp=1, vpp=1, schedule="1F1B", sequence_parallel=False),
                                   "deepspeed").text)
    assert dense["train_batch_size"] == 16 and "tensor_parallel" not in dense
    assert cfg["zero_optimization"] == {"stage": 2} and cfg["tensor_parallel"] == {"autotp_size": 2}
    assert cfg["bf16"] == {"enabled": True} and "activation_checkpointing" in cfg
    assert "sequence_parallel" in {n.knob for n in out.notes}
    pp_out = export_plan(_plan(), "deepspeed")
    assert any(n.knob == "pp" and "num_stages=4" in n.text for n in pp_out.notes)


def test_a_custom_intra_op_layout_is_noted_by_every_target():
    plan = _plan(annotation={"embedding.weight": ["Replicate()", "Shard(0)"]})
    for target in TARGETS:
        assert "annotation" in {n.knob for n in export_plan(plan, target).notes}, target
        assert "annotation" not in {n.knob for n in export_plan(_plan(), target).notes}, target


def test_unknown_target_is_refused():
    with pytest.raises(ExportError, match="unknown export target 'nemo'"):
        export_plan(_plan(), "nemo")


def test_cli_targets_agree_with_the_registry():
    assert [t.value for t in export_cmd_module.Target] == list(TARGETS)


def test_export_command_writes_the_file_and_prints_notes(tmp_path, capsys):
    plan_path = _plan(recompute="selective-op").save(tmp_path / "plan.json")
    out = tmp_path / "out" / "args.txt"
    code, stdout, stderr = run_main(capsys, "export", str(plan_path), "--to", "megatron", "-o", str(out))
    assert code == 0, stderr
    assert "note: recompute:" in stderr and out.read_text().startswith("# Megatron-LM arguments")
    code, stdout, stderr = run_main(capsys, "export", str(plan_path), "--to", "deepspeed")
    assert code == 0 and json.loads(stdout)["train_micro_batch_size_per_gpu"] == 1
    code, _, stderr = run_main(capsys, "export", str(plan_path), "--to", "nemo")
    assert code == 2 and "nemo" in stderr
    line = one_line_error(*run_main(capsys, "export", str(tmp_path / "missing.json"), "--to", "megatron"))
    assert "plan file not found" in line


def test_context_parallel_plan_exports():
    """cp 2: Megatron's --context-parallel-size and torchtitan's context_parallel_degree; the
    launch covers dp x tp x pp x cp ranks; DeepSpeed (no ring attention) says so in a note."""
    s = Strategy(dp=2, tp=2, cp=2, global_batch_size=8)
    plan = Plan(model="llama2-7b", cluster="dgx-a100-80g", strategy=s, seq_len=4096)
    meg = export_plan(plan, "megatron")
    assert "--context-parallel-size 2" in meg.text and "dp 2 = 8 / (tp 2 x pp 1 x cp 2)" in meg.text
    assert parse_megatron(meg.text, 8)["cp"] == 2
    tt = export_plan(plan, "torchtitan")
    assert tomllib.loads(tt.text)["parallelism"]["context_parallel_degree"] == 2
    # the ring is alltoall in torchtitan (its default allgather is the other variant), and
    # the all_gather variant is Megatron's --cp-comm-type allgather (both dropped before)
    assert tomllib.loads(tt.text)["parallelism"]["context_parallel_rotate_method"] == "alltoall"
    ag = Plan(model="llama2-7b", cluster="dgx-h100", strategy=s.replace(cp_comm="all_gather"), nodes=1)
    assert tomllib.loads(export_plan(ag, "torchtitan").text)["parallelism"][
        "context_parallel_rotate_method"] == "allgather"
    assert "--cp-comm-type allgather" in export_plan(ag, "megatron").text
    assert "--cp-comm-type" not in meg.text
    ds = export_plan(plan, "deepspeed")
    assert ds.effective["cp"] == 1 and [n.knob for n in ds.notes if n.knob == "cp"] == ["cp"]


def test_hsdp_plan_exports_to_each_target():
    """HSDP dp 16 = 2 replicas x 8 shards: torchtitan replicate 2 x shard 8; Megatron-FSDP
    2 distributed-optimizer instances (outer dp, no_shard); DeepSpeed MiCS shard size 8,
    with a note. Each parser reads the shard group back."""
    s = Strategy(dp=16, global_batch_size=64, zero=3, fsdp_shard_size=8, framework="fsdp2")
    plan = Plan(model="llama2-7b", cluster="dgx-a100-80g", strategy=s)
    tt = export_plan(plan, "torchtitan")
    par = tomllib.loads(tt.text)["parallelism"]
    assert (par["data_parallel_replicate_degree"], par["data_parallel_shard_degree"]) == (2, 8)
    meg = export_plan(plan, "megatron")
    assert "--num-distributed-optimizer-instances 2" in meg.text
    assert "--outer-dp-sharding-strategy no_shard" in meg.text
    ds = export_plan(plan, "deepspeed")
    # DeepSpeed 0.19.8 refuses MiCS's mics_shard_size: ZeRO-3 over all dp, noted
    assert json.loads(ds.text)["zero_optimization"] == {"stage": 3}
    assert "fsdp_shard_size" in {n.knob for n in ds.notes}
    for target in TARGETS:
        assert _check_round_trip(plan, target)["fsdp_shard_size"] == (None if target == "deepspeed" else 8), target


def test_fp8_plans_export_their_recipe_or_say_why_not():
    """An FP8 plan is never exported silently as BF16: Megatron-LM writes Transformer
    Engine's recipe (delayed scaling with the modelled 1024-step max amax history, or
    tensorwise current scaling), torchtitan torchao's float8 converter (tensorwise /
    rowwise, head and FSDP all-gather in BF16 as costed); what a target cannot run is a note."""
    te = Plan(model="llama2-7b", cluster="dgx-h100",
              strategy=Strategy(dp=8, global_batch_size=64, dtype="fp8-delayed"))
    mg = export_plan(te, "megatron")
    assert "--fp8-format hybrid" in mg.text and "--fp8-recipe delayed" in mg.text
    assert "--fp8-amax-history-len 1024" in mg.text and mg.effective["fp8"] == "te-delayed"
    for target in ("torchtitan", "deepspeed"):
        out = export_plan(te, target)
        assert out.effective["fp8"] is None and "fp8" in {n.knob for n in out.notes}, target
    tw = Plan(model="llama2-7b", cluster="dgx-h100",
              strategy=Strategy(dp=8, global_batch_size=64, zero=3, framework="fsdp2",
                                dtype="fp8-rowwise"))
    tt = export_plan(tw, "torchtitan")
    doc = tomllib.loads(tt.text)
    assert doc["model"]["converters"] == ["quantize.linear.float8"]
    assert doc["quantize"]["linear"]["float8"] == {"recipe_name": "rowwise", "filter_fqns": ["output"],
                                                   "enable_fsdp_float8_all_gather": False}
    mg = export_plan(tw, "megatron")
    assert "--fp8" not in mg.text and "fp8" in {n.knob for n in mg.notes}
    for plan in (te, tw):
        for target in TARGETS:
            _check_round_trip(plan, target)


def test_torchtitan_compile_and_async_tp_follow_the_profile():
    """fsdp2 is costed compiled: [compile] enable; fsdp2-eager is not; fsdp2-async-tp with tp 2
    also turns on parallelism.enable_async_tensor_parallel, and with tp 1 notes why not."""
    docs = {fw: tomllib.loads(export_plan(_plan(framework=fw), "torchtitan").text)
            for fw in ("fsdp2", "fsdp2-eager", "fsdp2-async-tp")}
    assert docs["fsdp2"]["compile"] == {"enable": True, "components": ["model"]}
    assert "compile" not in docs["fsdp2-eager"]
    assert "enable_async_tensor_parallel" not in docs["fsdp2"]["parallelism"]
    assert docs["fsdp2-async-tp"]["parallelism"]["enable_async_tensor_parallel"] is True
    out = export_plan(_plan(framework="fsdp2-async-tp", tp=1, sequence_parallel=False), "torchtitan")
    assert "enable_async_tensor_parallel" not in tomllib.loads(out.text)["parallelism"]
    assert any(n.knob == "framework" and "tp > 1" in n.text for n in out.notes)


def test_the_command_refuses_what_cost_refuses_and_exports_the_costed_split(tmp_path, capsys):
    """Found by a bad-input hunt: export turned layouts ``cost`` refuses into launch
    arguments. Now the command runs cost's checks first (each error names the field), and a
    plan without a layer split exports the split that was costed: llama2-7b's 32 layers on
    pp 4 x vpp 3 do not divide (Megatron's get_num_layers_to_build refuses 8 % 3), so the
    Megatron arguments carry the costed 12-stage layout, whose stages sum to 32."""
    tiny = str(ROOT / "benchmarks" / "plans" / "llama_l2.json")  # 2 layers, 4 heads
    base = ["export", "--to", "megatron", "--cluster", "dgx-h100", "--global-batch", "2"]
    for extra, what in ((["--tp", "3"], "--tp = 3 does not divide"), (["--pp", "4"], "cannot fill 4 pipeline"),
                        (["--dp", "2", "--cp", "3"], "--cp = 3")):
        line = one_line_error(*run_main(capsys, *base, "--model", tiny, *extra))
        assert what in line, line
    line = one_line_error(*run_main(capsys, "export", "--to", "megatron", "--cluster", "dgx-h100",
                                    "--global-batch", "64", "--model", "llama2-7b", "--dp", "64"))
    assert "= 64 ranks exceeds cluster 'dgx-h100' with 8" in line
    code, out, err = run_main(capsys, "export", "--to", "megatron", "--model", "llama2-7b", "--cluster", "dgx-h100",
                              "--global-batch", "64", "--seq-len", "1024", "--pp", "4", "--vpp", "3",
                              "--schedule", "VPP", "--dp", "2")
    assert code == 0, err
    layout_arg = re.search(r"--pipeline-model-parallel-layout '([^']*)'", out).group(1)
    stages = layout_arg.split("|")
    assert len(stages) == 12
    assert sum(int(t.split("*")[1]) if "*" in t else 1 for st_ in stages for t in st_.split(",")
               if t.startswith("t")) == 32
    # validate --launcher torchrun refuses such a plan too, before printing a command
    bad = Plan(model=tiny, cluster="dgx-h100", strategy=Strategy(tp=3, global_batch_size=2)).save(tmp_path / "p.json")
    line = one_line_error(*run_main(capsys, "validate", str(bad), "--launcher", "torchrun"))
    assert "'tp' = 3 does not divide" in line


def test_export_names_the_flags_as_typed_and_notes_an_out_of_memory_plan(capsys):
    """Found by a new-user check: export's refusals named strategy fields where cost names
    the flags as typed, and a plan cost calls OUT OF MEMORY was exported without a word."""
    base = ["export", "--to", "megatron", "--cluster", "dgx-a100-80g"]
    line = one_line_error(*run_main(capsys, *base, "--model", "llama2-7b", "--tensor-model-parallel-size", "3",
                                    "--dp", "1", "--global-batch", "8"))
    assert line.startswith("error: --tensor-model-parallel-size = 3 does not divide")
    # a job that does not fit is an error (issue 39), unless --force
    line = one_line_error(*run_main(capsys, *base, "--model", "llama2-70b", "--dp", "8", "--global-batch", "8"))
    assert line.startswith("error: the exported job does not fit as megatron runs it: peak ")
    code, out, err = run_main(capsys, *base, "--model", "llama2-70b", "--dp", "8", "--global-batch", "8",
                              "--force")
    assert code == 0 and "--tensor-model-parallel-size 1" in out
    assert "note: OUT OF MEMORY as costed: the plan needs" in err and "GiB limit" in err


def test_torchrun_command_keeps_one_rank_per_gpu(tmp_path, capsys):
    """Found by a new-user check: a dp 32 plan on 4 nodes of 8 GPUs printed
    ``--nproc-per-node 32`` for --nnodes 1."""
    p = Plan(model="llama2-7b", cluster="dgx-a100-80g", nodes=4, seq_len=4096,
             strategy=Strategy(dp=32, global_batch_size=512, zero=1)).save(tmp_path / "p.json")
    line = one_line_error(*run_main(capsys, "validate", str(p), "--launcher", "torchrun", "--nnodes", "1"))
    assert "32 ranks a node, but a node of cluster 'dgx-a100-80g' has 8 GPUs (one rank each); use --nnodes 4" in line
    code, out, _ = run_main(capsys, "validate", str(p), "--launcher", "torchrun", "--nnodes", "4")
    assert code == 0 and "--nnodes 4 --nproc-per-node 8" in out


def test_output_paths_it_cannot_write_are_one_line_naming_the_option(tmp_path, capsys):
    """export -o on a folder, under a file, on a full device; tune --output on a file: one
    `error:` line naming --output (they printed the bare errno text: "Is a directory: adir")."""
    from tests._cli import one_line_error, run_main

    (tmp_path / "afile").write_text("")
    (tmp_path / "adir").mkdir()
    base = ["export", "--to", "megatron", "-m", "llama2-7b", "--cluster", "dgx-h100", "--dp", "8",
            "--global-batch", "8", "-o"]
    cases = [(str(tmp_path / "adir"), "is a directory; give a file name"),
             (str(tmp_path / "afile" / "x"), "a file is in the way of the folder it needs")]
    if Path("/dev/full").exists():
        cases.append(("/dev/full", "is not a regular file"))  # refused before the work (issue 43)
    for out, needle in cases:  # (a note on the plan's memory may come first)
        rc, _, err = run_main(capsys, *base, out)
        line = err.strip().splitlines()[-1]
        assert rc == 2 and "Traceback" not in err and line.startswith("error: --output ") and needle in line, err
    line = one_line_error(*run_main(capsys, "tune", "-m", "llama2-7b", "--cluster", "dgx-h100",
                                    "--global-batch", "8", "--trials", "2", "--output", str(tmp_path / "afile")))
    assert "--output" in line and "a file is in the way" in line


def test_an_even_split_exported_beside_a_balanced_costed_one_is_costed_and_said(capsys):
    """8 layers on pp 2: the cost model balances the stages beside the embedding and the
    loss and costs [5, 3]; Megatron-LM runs its even 4 / 4 (the exported arguments), a
    different plan in time and memory. The export says so with both splits costed."""
    from meshplan import Engine, Strategy
    from tests._cli import run_main

    s = Strategy(dp=4, pp=2, ep=4, micro_batch_size=1, global_batch_size=16, zero=1)
    bal = Engine("qwen3-30b-a3b", "dgx-h100", s, seq_len=2048, num_layers=8).simulate()
    even = Engine("qwen3-30b-a3b", "dgx-h100", s.replace(layers_per_stage=(4, 4)), seq_len=2048,
                  num_layers=8).simulate()
    split = list(bal.layers_per_vstage)
    assert sum(split) == 8 and len(set(split)) > 1
    rc, out, err = run_main(capsys, "export", "--to", "megatron", "-m", "qwen3-30b-a3b", "--cluster", "dgx-h100",
                            "--dp", "4", "--pp", "2", "--ep", "4", "--global-batch", "16", "--seq-len", "2048",
                            "--layers", "8", "--zero", "1")
    assert rc == 0, err
    assert "--pipeline-model-parallel-layout" not in out
    assert (f"the cost model balanced the stages as {split} ({bal.step_time * 1e3:.1f} ms a step" in err
            and f"splits the layers evenly, [4, 4], as exported: {even.step_time * 1e3:.1f} ms" in err)


def test_a_schedule_the_framework_does_not_run_is_costed_as_it_runs(capsys):
    """A hunt exported a tuned ZBVPP plan to Megatron-LM, which runs interleaved 1F1B: the
    notes gave the ZBVPP figures as the prediction. The schedule note now costs the plan as
    the framework runs it, equal to ``meshplan cost`` of that layout (the even split the
    exporters write), beside the plan's own figures; in the file too."""
    from tests._cli import run_main

    base = ("--model", "llama2-7b", "--cluster", "dgx-h100", "--nodes", "2", "--dp", "4", "--pp", "2",
            "--global-batch", "64", "--layers", "8", "--seq-len", "4096")
    rc, out, _ = run_main(capsys, "cost", *base, "--vpp", "2", "--schedule", "VPP",
                          "--layers-per-stage", "even", "--json")
    vpp_ms = json.loads(out)["step_time_ms"]
    rc, out, _ = run_main(capsys, "cost", *base, "--vpp", "2", "--schedule", "ZBVPP", "--json")
    zbv_ms = json.loads(out)["step_time_ms"]
    rc, out, _ = run_main(capsys, "cost", *base, "--layers-per-stage", "even", "--json")
    one_ms = json.loads(out)["step_time_ms"]
    rc, out, err = run_main(capsys, "export", "--to", "megatron", *base, "--vpp", "2", "--schedule", "ZBVPP")
    assert rc == 0, err
    want = f"schedule: as Megatron-LM runs it (VPP): {vpp_ms:.1f} ms a step"
    assert want in err and f"the plan's ZBVPP: {zbv_ms:.1f} ms" in err and "# note: " + want in out
    rc, out, err = run_main(capsys, "export", "--to", "deepspeed", *base, "--vpp", "2", "--schedule", "VPP")
    assert rc == 0, err
    assert f"as DeepSpeed runs it (1F1B with 1 chunk(s) per rank): {one_ms:.1f} ms a step" in err
    assert f"the plan's VPP (vpp 2): {vpp_ms:.1f} ms" in err
    rc, out, err = run_main(capsys, "export", "--to", "megatron", *base, "--vpp", "2", "--schedule", "VPP")
    assert rc == 0 and "as Megatron-LM runs it" not in err  # the plan's own schedule: nothing to say


def test_the_as_run_note_says_when_the_framework_cannot_run_it_or_it_does_not_fit(capsys):
    """A review: a ZBVPP plan of 5 micro-batches on pp 4 exports to Megatron-LM, whose
    interleaved 1F1B needs a multiple of pp: the as-run costing raised and stopped the
    export. It is now a note saying why; an as-run peak over the limit says OUT OF MEMORY."""
    from tests._cli import run_main

    rc, out, err = run_main(capsys, "export", "--to", "megatron", "-m", "llama2-7b", "--cluster",
                            "dgx-h100", "--nodes", "1", "--dp", "2", "--pp", "4", "--vpp", "2",
                            "--schedule", "ZBVPP", "--global-batch", "10")
    assert rc == 0, err
    flat = " ".join(err.split())
    assert "schedule: Megatron-LM cannot run this plan as VPP: " in flat and "needs a multiple of pp = 4" in flat
    rc, out, err = run_main(capsys, "export", "--to", "megatron", "-m", "llama2-13b", "--cluster",
                            "dgx-h100", "--nodes", "1", "--dp", "1", "--tp", "2", "--pp", "4", "--vpp",
                            "2", "--schedule", "ZBVPP", "--micro-batch-size", "2", "--global-batch", "16",
                            "--force")
    assert rc == 0, err
    line = next(ln for ln in err.splitlines() if "as Megatron-LM runs it" in ln)
    peak = float(re.search(r"runs it \(VPP\): [\d.]+ ms a step, peak ([\d.]+) GiB", line).group(1))
    assert peak > 75.67 and "OUT OF MEMORY (75.67 GiB limit)" in line

"""Parsers of each export target's output, written from that framework's documented names
(``tests/meshplan/test_export.py`` compares the parsed layout with the plan's; the frameworks'
own config code checks the same exports in ``tests/meshplan/test_frameworks_real.py``):

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

import tomllib
from hypothesis import strategies as st

from completion.strategy import FP8_RECIPES
from meshplan.frameworks.targets import LAYOUT_KNOBS, export_plan, layout
from meshplan.plan import Plan
from meshplan.strategy import Strategy

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
                    "expert_parallel_degree", "expert_tensor_parallel_degree"},
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


def check_round_trip(plan: Plan, target: str) -> dict:
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



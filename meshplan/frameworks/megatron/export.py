"""Export a plan as Megatron-LM command-line arguments (``pretrain_gpt.py``).

Argument names and meanings are those of ``megatron/training/arguments.py`` at NVIDIA/
Megatron-LM commit d98e8a64ddf34856e74b24714e3bedb2f5a39553 (Aug 2026), where many are
generated from config dataclass fields (``megatron/training/argument_utils.py``:
``--`` + the field name with ``_`` -> ``-``; a bool defaulting to False is ``store_true``):

- ``ModelParallelConfig`` (``megatron/core/model_parallel_config.py``):
  ``--tensor-model-parallel-size``, ``--pipeline-model-parallel-size``,
  ``--sequence-parallel``, ``--context-parallel-size``, ``--expert-model-parallel-size``
  (written when ep > 1), ``--expert-tensor-parallel-size`` (when etp is not tp, Megatron's
  default: MoE parallel folding, ``completion.expert_layout``), ``--bf16``, ``--fp16``;
- ``TransformerConfig``: ``--num-layers``, ``--recompute-granularity {full, selective}``,
  ``--recompute-method {uniform, block}``, ``--recompute-num-layers``,
  ``--attention-backend {flash, fused, unfused, local, auto}``;
- ``TrainingConfig``: ``--micro-batch-size``, ``--global-batch-size``;
- ``DistributedInitConfig``: ``--use-megatron-fsdp``;
- hand-written: ``--num-layers-per-virtual-pipeline-stage``,
  ``--num-virtual-stages-per-pipeline-rank``, ``--pipeline-model-parallel-layout``,
  ``--use-distributed-optimizer``, ``--data-parallel-sharding-strategy {no_shard, optim,
  optim_grads, optim_grads_params}``, ``--optimizer {adam, sgd, ...}``, ``--seq-length``,
  ``--grad-reduce-in-bf16``.

Mapping (Megatron's meanings):

- dp is not an argument: Megatron takes it as world size / (tp * pp * cp), so the launcher's
  ``--nnodes x --nproc-per-node`` must equal the plan's dp * cp * tp * pp (the header says so);
  context parallelism: ``--context-parallel-size`` (written when cp > 1; Megatron's default
  ``--cp-comm-type p2p`` is the plan's ring attention, ``cp_comm`` all_gather is
  ``--cp-comm-type allgather``).
- vpp > 1: the plan's ``layers_per_stage`` as ``--pipeline-model-parallel-layout`` (one
  ``|``-separated stage per virtual stage in model order, ``E`` the embedding before the
  first, ``L`` the loss after the last; Megatron lays stage i on pipeline rank i mod pp);
  else ``--num-layers-per-virtual-pipeline-stage`` (layers / (pp * vpp)) when the layer
  count is known and divides, else ``--num-virtual-stages-per-pipeline-rank``. Megatron
  runs interleaved 1F1B for vpp > 1 and 1F1B otherwise: GPipe (FThenB) and the zero-bubble
  schedules are noted.
- ZeRO 1: ``--use-distributed-optimizer`` (optimizer states sharded over dp; weights and
  gradients full: 6 + 12/dp bytes per parameter, reference/fidelity_notes.md); 2 and 3:
  Megatron-FSDP (``--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads`` /
  ``optim_grads_params``, docs/user-guide/features/megatron_fsdp.md) with ``--ckpt-format
  fsdp_dtensor``, which ``validate_args`` asserts beside ``--use-megatron-fsdp``
  (``arguments.py`` lines 1169-1170); ``--no-gradient-accumulation-fusion`` is not needed
  at d98e8a64 (the same guide: Megatron-FSDP supports the fusion, on by default), and the
  launch environment must leave ``CUDA_DEVICE_MAX_CONNECTIONS`` unset or above 1
  (``arguments.py`` line 1166 asserts it). HSDP (ZeRO-3 in
  shard groups of N): Megatron-FSDP's HSDP, ``--num-distributed-optimizer-instances dp/N
  --outer-dp-sharding-strategy no_shard`` (the same doc, "Hybrid-Sharded Data
  Parallelism": states sharded over the inner dp ranks, replicated over the outer ones).
- recompute full: ``--recompute-granularity full --recompute-method uniform
  --recompute-num-layers 1`` (every layer's input kept, the layer recomputed); selective:
  ``--recompute-granularity selective`` (the core attention, Korthikanti et al. 2022);
  torchtitan's op-level ``selective-op`` has no Megatron equivalent (noted; selective).
- optimizer: Megatron's ``adam`` is Adam with decoupled weight decay (AdamW), so ``adamw``
  -> ``adam``; the plan's L2-coupled ``adam`` is noted.
- gradient dtype: with ``--bf16`` Megatron-LM keeps fp32 main gradients and reduces them in
  fp32 unless ``--grad-reduce-in-bf16`` (``arguments.py`` sets
  ``accumulate_allreduce_grads_in_fp32`` from it): written when the plan's profile keeps
  gradients in the parameter dtype (its ``gradients.reduce_dtype`` is ``same``, e.g.
  ``megatron-bridge``), so the run moves and holds the bytes the plan was costed with.
"""

from __future__ import annotations

import shlex
from typing import Any

from meshplan.frameworks.targets import (
    Export,
    Note,
    framework_note,
    layout,
    model_config,
    routing_notes,
)
from simulator.profiles import load_profile

MEGATRON_COMMIT = "d98e8a64ddf34856e74b24714e3bedb2f5a39553"
FAMILIES = ("megatron-core", "megatron-bridge", "megatron-2021", "megatron-2021-torch-ddp")
#: plan recompute -> (granularity, method, layers per recompute unit) arguments
RECOMPUTE_ARGS = {"none": (), "selective": ("--recompute-granularity", "selective"),
                  "selective-op": ("--recompute-granularity", "selective"),
                  "full": ("--recompute-granularity", "full", "--recompute-method", "uniform",
                           "--recompute-num-layers", "1")}
#: plan ZeRO stage -> arguments (Megatron-FSDP's sharding strategy names)
#: plan ZeRO stage -> arguments (Megatron-FSDP's sharding strategy names, and the checkpoint
#: format validate_args asserts with --use-megatron-fsdp: arguments.py lines 1169-1170 at
#: d98e8a64, ``ckpt_format`` of training/config/training_config.py)
ZERO_ARGS = {0: (), 1: ("--use-distributed-optimizer",),
             2: ("--use-distributed-optimizer", "--use-megatron-fsdp",
                 "--data-parallel-sharding-strategy", "optim_grads", "--ckpt-format", "fsdp_dtensor"),
             3: ("--use-distributed-optimizer", "--use-megatron-fsdp",
                 "--data-parallel-sharding-strategy", "optim_grads_params", "--ckpt-format", "fsdp_dtensor")}
#: plan cp_comm -> ``--cp-comm-type`` (arguments.py: p2p, a2a, allgather or a2a+p2p)
CP_COMM_ARGS = {"p2p": "p2p", "all_gather": "allgather"}
DTYPE_ARGS = {"bfloat16": ("--bf16",), "float16": ("--fp16",), "float32": ()}
#: plan optimizer -> (Megatron --optimizer, what Megatron runs as a plan optimizer name)
OPTIMIZER_ARGS = {"adamw": ("adam", "adamw"), "adam": ("adam", "adamw"), "sgd": ("sgd", "sgd")}


def pipeline_layout(layers_per_stage: tuple[int, ...]) -> str:
    """``--pipeline-model-parallel-layout`` for decoder layers per virtual stage in model
    order: ``E`` + the first stage's layers, ``|`` between stages, ``L`` after the last;
    ``t*n`` for n decoder layers (Megatron's ``PipelineParallelLayerLayout`` grammar)."""
    stages = [f"t*{n}" if n > 1 else "t" * n for n in layers_per_stage]
    stages[0] = "E" + ("," if stages[0] else "") + stages[0]
    stages[-1] = stages[-1] + ("," if stages[-1] else "") + "L"
    return "|".join(stages)


def _pipeline_args(eff: dict[str, Any], notes: list[Note]) -> list[str]:
    pp, vpp, lps, layers = eff["pp"], eff["vpp"], eff["layers_per_stage"], eff["num_layers"]
    if vpp > 1 and pp == 1:
        notes.append(Note("vpp", f"Megatron interleaves model chunks only with pipeline "
                                 f"parallelism (pp > 1); {vpp} chunks on one stage run as one"))
        if lps is not None:
            notes.append(Note("layers_per_stage", f"one stage holds all {sum(lps)} layers"))
        eff["vpp"], eff["layers_per_stage"] = 1, None
        return []
    if lps is not None:
        return ["--pipeline-model-parallel-layout", pipeline_layout(lps)]
    if vpp == 1:
        return []
    if layers is not None and layers % (pp * vpp) == 0:
        return ["--num-layers-per-virtual-pipeline-stage", str(layers // (pp * vpp))]
    return ["--num-virtual-stages-per-pipeline-rank", str(vpp)]


def _schedule(eff: dict[str, Any], notes: list[Note]) -> None:
    runs = "VPP" if eff["vpp"] > 1 else "1F1B"
    if eff["schedule"] != runs:
        placed = (f", and lays virtual stage i on rank i mod {eff['pp']}, not in ZB-V's V (the "
                  f"costed stages of a rank differ)" if eff["schedule"] == "ZBVPP" else "")
        notes.append(Note("schedule", f"Megatron-LM has no {eff['schedule']} schedule; it runs "
                                      f"{'interleaved 1F1B' if runs == 'VPP' else '1F1B'}{placed}"))
        eff["schedule"] = runs


#: FP8 recipe -> Megatron-LM d98e8a64 TransformerConfig arguments (``--fp8-format`` hybrid:
#: e4m3 forward, e5m2 gradients; ``--fp8-recipe``); delayed scaling with the amax history
#: the cost model assumes (``simulator.fp8``: 1024 steps, max, as NeMo's recipes set it)
FP8_ARGS = {"te-delayed": ("--fp8-format", "hybrid", "--fp8-recipe", "delayed",
                           "--fp8-amax-history-len", "1024", "--fp8-amax-compute-algo", "max"),
            "tensorwise": ("--fp8-format", "hybrid", "--fp8-recipe", "tensorwise")}


def _fp8_args(eff: dict[str, Any], notes: list[Note]) -> list[str]:
    """The FP8 arguments of the plan's recipe; torchao's rowwise scaling has no Megatron-LM
    recipe (its ``blockwise`` scales 1x128 tiles), so it is noted and BF16 is written;
    ``tensorwise`` is Transformer Engine's per-tensor current scaling, the same scaling rule
    as torchao's."""
    fp8 = eff["fp8"]
    if fp8 is None:
        return []
    if fp8 not in FP8_ARGS:
        notes.append(Note("fp8", f"Megatron-LM has no {fp8} FP8 recipe (its blockwise recipe "
                                 f"scales 1x128 tiles, not rows); BF16 linears are written"))
        eff["fp8"] = None
        return []
    return list(FP8_ARGS[fp8])


#: Megatron-Core families whose overlaps are Megatron-LM's switches (off by default there)
OVERLAP_FAMILIES = ("megatron-core", "megatron-bridge", "nemo")


def overlap_args(framework: str, eff: dict[str, Any]) -> list[str]:
    """The overlap switches of Megatron-LM d98e8a64 (all off by default) that the plan's
    profile costs as on (``overlap``): ``--overlap-grad-reduce`` (dp_grad_reduce, with more
    than one data-parallel rank), ``--overlap-param-gather`` (dp_param_gather, with the
    distributed optimizer), ``--tp-comm-overlap`` (tp_forward: Transformer Engine's
    userbuffers, with tp > 1 and sequence parallelism). Without them the exported run would
    not overlap as costed. [] for other families."""
    if framework not in OVERLAP_FAMILIES:
        return []
    ov = load_profile(framework).overlap
    out = []
    if ov.dp_grad_reduce.value and eff["dp"] * eff["cp"] > 1:
        out.append("--overlap-grad-reduce")
    if ov.dp_param_gather.value and eff["zero"] >= 1 and eff["dp"] * eff["cp"] > 1:
        out.append("--overlap-param-gather")
    if ov.tp_forward.value and eff["tp"] > 1 and eff["sequence_parallel"]:
        out.append("--tp-comm-overlap")
    return out


def _grad_args(framework: str, eff: dict[str, Any]) -> list[str]:
    """``--grad-reduce-in-bf16`` for a bf16 plan whose profile keeps its gradients and their
    reduction in bf16 (``gradients.reduce_dtype: same``); Megatron-LM's default with
    ``--bf16`` is fp32 (module docstring)."""
    if eff["dtype"] != "bfloat16":
        return []
    return ["--grad-reduce-in-bf16"] if load_profile(framework).gradients.reduce_dtype.value == "same" else []


def _router_args(cfg: Any) -> list[str]:
    """The router as meshplan costs it (TransformerConfig at d98e8a64):
    ``--moe-router-score-function sigmoid`` (DeepSeek-V3, Llama 4; Megatron renormalises a
    sigmoid top-k > 1, as DeepSeek-V3's norm_topk_prob), ``--moe-router-topk-scaling-factor``
    (``routed_scaling_factor``), ``--moe-router-num-groups`` / ``--moe-router-group-topk``
    (node-limited routing)."""
    args = ["--moe-router-score-function", "sigmoid"] if cfg.router_score == "sigmoid" else []
    if cfg.routed_scaling_factor != 1.0:
        args += ["--moe-router-topk-scaling-factor", f"{cfg.routed_scaling_factor:g}"]
    if cfg.router_groups > 1:
        args += ["--moe-router-num-groups", str(cfg.router_groups),
                 "--moe-router-group-topk", str(cfg.router_topk_groups)]
    return args


def architecture_args(cfg: Any, notes: list[Note]) -> list[str]:
    """Multi-token prediction (``--mtp-num-layers``, ``--mtp-loss-scaling-factor``:
    TransformerConfig ``mtp_num_layers`` / ``mtp_loss_scaling_factor``, d98e8a64), and notes
    naming the model arguments Megatron-LM needs for what meshplan costs beyond its
    GPT defaults: multi-head latent attention (MLATransformerConfig ``q_lora_rank``,
    ``kv_lora_rank``, ``qk_head_dim``, ``qk_pos_emb_head_dim``, ``v_head_dim``), attention
    sinks (``softmax_type`` ``learnable``), a sliding window (``window_size``) and chunked
    attention (none in Megatron-LM: noted)."""
    if cfg is None:
        return []
    args = []
    if cfg.mtp_layers:
        args += ["--mtp-num-layers", str(cfg.mtp_layers), "--mtp-loss-scaling-factor", f"{cfg.mtp_loss_weight:g}"]
    if cfg.mla:
        q = f" --q-lora-rank {cfg.q_lora_rank}" if cfg.q_lora_rank else ""
        notes.append(Note("model", f"multi-head latent attention: give the model arguments "
                                   f"--multi-latent-attention{q} --kv-lora-rank {cfg.kv_lora_rank} "
                                   f"--qk-head-dim {cfg.qk_nope_head_dim} --qk-pos-emb-head-dim "
                                   f"{cfg.qk_rope_head_dim} --v-head-dim {cfg.v_head_dim}"))
    if cfg.attention_sinks:
        notes.append(Note("model", "attention sinks: give the model argument --softmax-type learnable"))
    if cfg.sliding_window is not None:
        notes.append(Note("model", f"sliding window {cfg.sliding_window}: give --window-size "
                                   f"{cfg.sliding_window - 1},0 on the windowed layers"))
    if cfg.attention_chunk is not None:
        notes.append(Note("model", f"chunked attention ({cfg.attention_chunk} tokens) has no "
                                   "Megatron-LM argument: it runs full causal attention there"))
    return args


def _moe_args(plan: Any, notes: list[Note]) -> list[str]:
    """A mixture-of-experts model's arguments, as meshplan costs it (TransformerConfig
    fields of Megatron-LM d98e8a64, argparse names by ``ArgumentGroupFactory``): experts,
    top-k, expert width, shared expert, the MoE layer pattern (``--moe-layer-freq`` as a
    list), grouped expert GEMMs and the all_to_all dispatcher (Megatron's defaults are
    per-expert GEMMs and ``allgather``; meshplan costs grouped GEMMs and all_to_all), the
    aux loss, and a capacity factor without padding to capacity: meshplan costs each expert
    at the busiest one's ``min(capacity, load)`` slots (``Strategy.expert_slot_factor``): the
    straggler of a run that drops the tokens beyond capacity and pads nothing, while
    ``--moe-pad-expert-input-to-capacity`` would fill every expert to the capacity (noted). A
    load imbalance is a costing assumption with no argument (noted). [] for a dense model or
    a program text."""
    cfg = model_config(plan)
    if cfg is None or not cfg.num_experts:
        return []
    layers = plan.num_layers or cfg.num_layers
    args = ["--num-experts", str(cfg.num_experts), "--moe-router-topk", str(cfg.experts_per_token),
            "--moe-ffn-hidden-size", str(cfg.expert_ffn_hidden_size), "--moe-grouped-gemm",
            "--moe-token-dispatcher-type", "alltoall"]
    pattern = [int(cfg.is_moe_layer(i)) for i in range(layers)]
    if not all(pattern):
        args += ["--moe-layer-freq", "[" + ",".join(map(str, pattern)) + "]"]
    if cfg.shared_expert_ffn_hidden_size:
        args += ["--moe-shared-expert-intermediate-size", str(cfg.shared_expert_ffn_hidden_size)]
    args += _router_args(cfg)
    if cfg.router_aux_loss_coef > 0:
        args += ["--moe-router-load-balancing-type", "aux_loss",
                 "--moe-aux-loss-coeff", f"{cfg.router_aux_loss_coef:g}"]
    else:
        args += ["--moe-router-load-balancing-type", "none"]
    s = plan.strategy
    if s.moe_capacity_factor is not None:
        args += ["--moe-expert-capacity-factor", f"{s.moe_capacity_factor:g}"]
        notes.append(Note("moe_capacity_factor",
                          f"tokens beyond {s.moe_capacity_factor:g}x an expert's mean load are dropped "
                          "and nothing is padded; meshplan costs every expert at the busiest one's "
                          f"{s.expert_slot_factor:g}x the mean (min of capacity and load imbalance); "
                          "--moe-pad-expert-input-to-capacity would run every expert at "
                          f"{s.moe_capacity_factor:g}x, whatever the load"))
    notes += routing_notes(plan, "Megatron-LM", None)
    return args


def export(plan: Any) -> Export:
    """Megatron-LM arguments for ``plan`` (see the module docstring for the mapping). The
    text is one argument per line ending in `` \\`` (shell continuation) after ``#``
    comment lines: the source, the launch line and one per :class:`Note`."""
    eff = layout(plan)
    notes: list[Note] = framework_note(plan, FAMILIES, "Megatron-LM")
    args = ["--tensor-model-parallel-size", str(eff["tp"]),
            "--pipeline-model-parallel-size", str(eff["pp"])]
    args += _pipeline_args(eff, notes)
    _schedule(eff, notes)
    if eff["sequence_parallel"]:
        args.append("--sequence-parallel")
    if eff["cp"] > 1:
        args += ["--context-parallel-size", str(eff["cp"])]
        if eff["cp_comm"] != "p2p":  # p2p (the ring) is Megatron's default
            args += ["--cp-comm-type", CP_COMM_ARGS[eff["cp_comm"]]]
    if eff["ep"] > 1:  # ModelParallelConfig.expert_model_parallel_size
        args += ["--expert-model-parallel-size", str(eff["ep"])]
    if eff["etp"] != eff["tp"]:  # ModelParallelConfig.expert_tensor_parallel_size (default: tp)
        args += ["--expert-tensor-parallel-size", str(eff["etp"])]
    args += _moe_args(plan, notes)
    args += architecture_args(model_config(plan), notes)
    if eff["recompute"] == "selective-op":
        notes.append(Note("recompute", "torchtitan's op-level selective recompute has no "
                                       "Megatron-LM equivalent; selective recompute (the core "
                                       "attention) is used"))
        eff["recompute"] = "selective"
    args += RECOMPUTE_ARGS[eff["recompute"]]
    args += ZERO_ARGS[eff["zero"]]
    args += overlap_args(plan.strategy.framework, eff)
    if eff["fsdp_shard_size"]:
        args += ["--num-distributed-optimizer-instances", str(eff["dp"] // eff["fsdp_shard_size"]),
                 "--outer-dp-sharding-strategy", "no_shard"]
    args += DTYPE_ARGS[eff["dtype"]]
    if eff["dtype"] == "float32":
        notes.append(Note("dtype", "float32 is Megatron-LM's precision without --bf16 / --fp16, so no "
                                   "argument says it; meshplan cost and export default to bfloat16: "
                                   "give them --dtype float32 with these arguments"))
    args += _grad_args(plan.strategy.framework, eff)
    args += _fp8_args(eff, notes)
    name, runs = OPTIMIZER_ARGS[eff["optimizer"]]
    if runs != eff["optimizer"]:
        notes.append(Note("optimizer", "Megatron-LM's adam decouples weight decay (AdamW); "
                                       "L2-coupled Adam is not offered"))
        eff["optimizer"] = runs
    args += ["--optimizer", name]
    if eff["attention"] is not None:
        args += ["--attention-backend", eff["attention"]]
    args += ["--micro-batch-size", str(eff["micro_batch_size"]),
             "--global-batch-size", str(eff["global_batch_size"])]
    if eff["num_layers"] is not None:
        args += ["--num-layers", str(eff["num_layers"])]
    if eff["seq_len"] is not None:
        args += ["--seq-length", str(eff["seq_len"])]
    world = eff["dp"] * eff["tp"] * eff["pp"] * eff["cp"]
    head = [f"# Megatron-LM arguments for {plan.model} (meshplan export; names of "
            f"megatron/training/arguments.py at NVIDIA/Megatron-LM {MEGATRON_COMMIT[:12]})",
            f"# launch: torchrun --nnodes NODES --nproc-per-node GPUS pretrain_gpt.py "
            f"<these arguments> <model and data arguments>, NODES x GPUS = {world} ranks "
            f"(dp {eff['dp']} = {world} / (tp {eff['tp']} x pp {eff['pp']} x cp {eff['cp']}))"]
    head += [f"# note: {n}" for n in notes]
    pairs = _lines(args)
    text = "\n".join(head + [p + " \\" for p in pairs[:-1]] + pairs[-1:]) + "\n"
    return Export("megatron", text, notes, eff)


def _lines(args: list[str]) -> list[str]:
    """One line per option: a flag with its value, or a flag alone."""
    out: list[str] = []
    for a in args:
        if a.startswith("--") or not out:
            out.append(a)
        else:
            out[-1] += f" {shlex.quote(a)}"
    return out

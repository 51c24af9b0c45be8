"""What ``meshplan cost`` assumed besides the flags it was given: every input of the
prediction, with where each came from, so a report can be read without the command line.

:func:`assumed_inputs` returns the JSON-ready record (``meshplan cost --json`` carries it);
:func:`input_lines` renders it for the text report; :func:`idle_gpu_warning` is the one
warning line of a plan that leaves GPUs of the cluster idle.
"""

from __future__ import annotations

from typing import Any

#: where a sequence length comes from -> how the report names the source
SEQ_LEN_SOURCES = {
    "flag": "--seq-len",
    "plan": "the plan file",
    "torchtitan": "the torchtitan config's [training] seq_len (torchtitan's default, 2048, when "
                  "it has none)",
    "program": "the program's input_ids [batch, seq] shape",
    "none": "nowhere: the program has no input_ids [batch, seq] input, so tokens/s counts no "
            "tokens; pass --seq-len",
    "config": "the model config's default: its seq_len, max_position_embeddings of a "
              "config.json; --seq-len costs another",
    "capped": "a training-length default: the config.json's max_position_embeddings is a "
              "longer context window; --seq-len costs another",
}

#: where the attention implementation comes from (``completion.plan_program.resolve_attention``)
ATTENTION_SOURCES = {
    "flag": "--attention",
    "plan": "the plan file",
    "model": "the model config's own attn_implementation",
    "framework": "the framework profile's default, kernels.attention",
    "program": "nowhere: a given program runs the attention ops it holds; this name is the "
               "framework's default, reported only",
}

#: ZeRO stage -> what it shards over the data-parallel group (Rajbhandari et al. 2020,
#: "ZeRO", sec. 5: P_os, P_os+g, P_os+g+p)
ZERO_SHARDS = {
    0: "nothing sharded: every dp rank holds all optimizer states, gradients and parameters",
    1: "optimizer states sharded over dp",
    2: "optimizer states and gradients sharded over dp",
    3: "optimizer states, gradients and parameters sharded over dp",
}


def _over(text: str, s: Any) -> str:
    """:data:`ZERO_SHARDS` text with the group the states really shard over: dp x cp ranks
    under context parallelism (Megatron-Core's distributed optimizer and FSDP shard over the
    data-parallel-with-context group), the HSDP shard group with ``fsdp_shard_size``."""
    if s.zero and s.fsdp_shard_size:
        return text.replace("over dp", f"over HSDP groups of {s.fsdp_shard_size} dp ranks")
    if s.zero and s.cp > 1:
        return text.replace("over dp", f"over dp x cp = {s.dp * s.cp} ranks")
    return text


def seq_len_source(seq_len_flag: int | None, source: Any) -> str:
    """Key of :data:`SEQ_LEN_SOURCES`: ``flag`` when ``--seq-len`` was given, ``program``
    for a given program (``ModelSource.is_program``) with an ``input_ids`` [b, s] input
    (``none`` without: seq_len 0), else ``config``."""
    if seq_len_flag is not None:
        return "flag"
    if source.is_program:
        return "program" if source.seq_len else "none"
    return "capped" if getattr(source, "context_window", 0) else "config"


def attention_source(attention_flag: str | None, source: Any) -> str:
    """Key of :data:`ATTENTION_SOURCES`, in the order ``resolve_attention`` takes them
    (``program`` for a given program without ``--attention``: its ops are its own)."""
    if attention_flag is not None:
        return "flag"
    if source.is_program:
        return "program"
    return "model" if source.attention is not None else "framework"


def assumed_inputs(engine: Any, *, seq_len_flag: int | None, attention_flag: str | None,
                   plan: Any = None, seq_len_from: str | None = None) -> dict[str, Any]:
    """The inputs ``engine`` (a ``meshplan.engine.Engine``) costed with; ``plan``: the
    ``meshplan.Plan`` it was built from (``cost PLAN.json``), whose stated sequence length
    and attention are then the ``plan`` source, not a flag; ``seq_len_from``: a key of
    :data:`SEQ_LEN_SOURCES` that gave the sequence length (``torchtitan``), if not these.

    Keys: ``seq_len`` (tokens per sequence) and ``seq_len_source`` (a key of
    :data:`SEQ_LEN_SOURCES`); ``gpus_used`` (dp * cp * tp * pp), ``gpus_available`` (the
    cluster's nodes x devices per node), ``gpus_idle`` (the difference), ``nodes``,
    ``devices_per_node``; ``zero`` (stage) and ``zero_shards`` (:data:`ZERO_SHARDS`);
    ``framework``; ``attention`` (resolved) and ``attention_source``
    (:data:`ATTENTION_SOURCES`); ``num_microbatches`` (global batch / (dp * micro batch));
    ``strategy`` (every field of the resolved ``Strategy``); ``warnings`` (one line each:
    :func:`idle_gpu_warning`, :func:`unrun_schedule_warning`)."""
    s, c, src = engine.strategy, engine.cluster, engine.source
    used, avail = s.world_size, c.world_size
    rec: dict[str, Any] = {
        "seq_len": src.seq_len,
        "seq_len_source": (seq_len_from or ("plan" if plan is not None and plan.seq_len is not None
                                            else seq_len_source(seq_len_flag, src))),
        "gpus_used": used, "gpus_available": avail, "gpus_idle": avail - used,
        "nodes": c.num_nodes, "devices_per_node": c.devices_per_node,
        "zero": s.zero, "zero_shards": _over(ZERO_SHARDS[s.zero], s), "framework": s.framework,
        "attention": s.attention,
        "attention_source": ("plan" if plan is not None and plan.strategy.attention is not None
                             else attention_source(attention_flag, src)),
        "num_microbatches": s.num_microbatches, "strategy": s.to_dict(),
    }
    rec["warnings"] = [w for w in (idle_gpu_warning(rec), *framework_warnings(engine)) if w]
    return rec


def framework_warnings(engine: Any) -> list[str]:
    """The lines ``cost`` and ``compare`` warn with when the plan's framework does not run it
    as costed: its schedule (:func:`unrun_schedule_warning`), its context-parallel exchange
    (:func:`unrun_cp_warning`), its ZeRO stage beside the other degrees
    (:func:`unrun_zero_warning`) or tensor parallelism without sequence parallelism
    (:func:`unrun_sp_warning`)."""
    return [w for w in (unrun_schedule_warning(engine), unrun_cp_warning(engine),
                        unrun_zero_warning(engine), unrun_sp_warning(engine)) if w]


def unrun_schedule_warning(engine: Any) -> str | None:
    """One line when the plan pipelines (pp > 1) with a schedule its framework profile does
    not run (``pipeline.schedules``: Megatron-LM runs 1F1B and VPP, not ZB-H1): the figures
    are those of a step the framework cannot take. None otherwise."""
    from meshplan.tuning import runs_schedule

    s = engine.strategy
    runs = engine.profile.pipeline.schedules
    if s.pp == 1 or runs is None or runs_schedule(runs.value, s.schedule):
        return None
    return (f"the {s.framework} profile's framework does not run {s.schedule} (it runs "
            f"{', '.join(runs.value)}): costed as asked; meshplan export costs what the "
            "framework runs instead")


def unrun_cp_warning(engine: Any) -> str | None:
    """One line when the plan has cp > 1 with a K/V exchange its framework profile does not
    run (``kernels.cp_comms``: DeepSpeed, Megatron-LM 2021 and llm-foundry run no context
    parallelism): the figures are those of a step the framework cannot take. None otherwise."""
    s = engine.strategy
    runs = engine.profile.kernels.cp_comms
    if s.cp == 1 or runs is None or s.cp_comm in runs.value:
        return None
    what = "runs no context parallelism" if not runs.value else \
        f"does not run the {s.cp_comm} K/V exchange (it runs {', '.join(runs.value)})"
    return f"the {s.framework} profile's framework {what}: cp {s.cp} costed as asked"


def unrun_zero_warning(engine: Any) -> str | None:
    """One line when the plan's ZeRO stage is not one its framework offers
    (``memory.zero_stages``: FSDP has no ZeRO-1), or it pipelines (pp > 1) with a stage the
    framework does not run beside pipeline parallelism (``pipeline.zero_stages``: DeepSpeed
    runs ZeRO 0 and 1 there), or it replicates (ZeRO 0) beside tp / pp / cp where the
    framework runs DDP only alone (``memory.ddp_alone``: torchtitan). None otherwise."""
    from meshplan.tuning import zero_not_run

    s = engine.strategy
    why = zero_not_run(engine.profile, s.zero, s.pp, dp=s.dp, tp=s.tp, cp=s.cp)
    return None if why is None else f"the {s.framework} profile's framework {why}: costed as asked"


def unrun_sp_warning(engine: Any) -> str | None:
    """One line when the plan splits tp > 1 ways without sequence parallelism under a
    framework whose tensor parallelism always shards the sequence (``kernels.sequence_parallel``
    ``always``: torchtitan). None otherwise."""
    s = engine.strategy
    sp = engine.profile.kernels.sequence_parallel
    if s.tp == 1 or s.sequence_parallel or sp is None or sp.value != "always":
        return None
    return (f"the {s.framework} profile's framework runs tp > 1 with sequence parallelism only: "
            f"tp {s.tp} without it costed as asked (--sequence-parallel is what it runs)")


def idle_gpu_warning(rec: dict[str, Any]) -> str | None:
    """One line when the plan uses fewer GPUs than the cluster has (None otherwise): the
    step time is that of the plan's ranks alone; the idle GPUs add nothing."""
    if rec["gpus_idle"] <= 0:
        return None
    s = rec["strategy"]
    rest = s["cp"] * s["tp"] * s["pp"]
    fill = rec["gpus_available"] // rest if rec["gpus_available"] % rest == 0 else None
    how = (f"--dp {fill} fills them (Megatron-LM derives dp from the world size; meshplan takes "
           f"--dp, default 1), or pass --nodes" if fill and fill != s["dp"] else
           "raise a degree or pass --nodes")
    return (f"the plan uses {rec['gpus_used']} of the {rec['gpus_available']} GPUs "
            f"(dp*cp*tp*pp = {s['dp']}*{s['cp']}*{s['tp']}*{s['pp']}); {rec['gpus_idle']} stay "
            f"idle and add nothing to the throughput: {how}")


def input_lines(rec: dict[str, Any], attention_kernel: str | None) -> list[str]:
    """The text report's lines for :func:`assumed_inputs` ``rec``."""
    s = rec["strategy"]
    kernel = f", kernel {attention_kernel}" if attention_kernel else ""
    per_node = rec["devices_per_node"]
    lines = [
        f"seq len {rec['seq_len']} (from {SEQ_LEN_SOURCES[rec['seq_len_source']]})",
        f"GPUs: {rec['gpus_used']} used of {rec['gpus_available']} available "
        f"({rec['nodes']} node{'s' if rec['nodes'] != 1 else ''} x {per_node}); "
        f"dp {s['dp']} x cp {s['cp']} x tp {s['tp']} x pp {s['pp']}"
        + (f" (vpp {s['vpp']})" if s["vpp"] > 1 else "")
        + f"; global batch {s['global_batch_size']} = dp {s['dp']} x {rec['num_microbatches']} "
          f"micro-batch{'es' if rec['num_microbatches'] != 1 else ''} of {s['micro_batch_size']}",
        f"ZeRO stage {rec['zero']} ({rec['zero_shards']}); recompute {s['recompute']}; "
        f"dtype {s['dtype']}" + ("; sequence parallel" if s["sequence_parallel"] else ""),
        f"framework {rec['framework']}; attention {rec['attention']}{kernel} "
        f"(from {ATTENTION_SOURCES[rec['attention_source']]})"
        + (f"; fp8 {s['fp8']} (decoder linears)" if s.get("fp8") else ""),
    ]
    return lines + [f"warning: {w}" for w in rec["warnings"]]

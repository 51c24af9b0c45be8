"""``meshplan cost``: predicted step time, throughput, MFU and memory of one strategy.

Prints the framework profile, attention implementation and sequence length it costed
with, the time breakdown of the critical rank (compute, TP comm, PP comm, bubble, DP
sync, optimizer), the memory breakdown of the heaviest rank (one line per mechanism,
``simulator.step_memory``) and the device's memory: capacity, the driver's reserve, usable
memory, the headroom (``--memory-headroom``, a fraction of usable memory) and whether
peak + headroom fits in usable memory; ``--json`` prints step_time_ms, tokens_per_s,
tflops_per_gpu, mfu, max_memory_bytes, the breakdowns, ``device_memory_bytes``,
``reserved_memory_bytes``, ``usable_memory_bytes``, ``memory_headroom``,
``memory_headroom_bytes``, ``memory_limit_bytes``, ``fits_in_memory`` and ``framework``,
``attention``, ``attention_kernel``, ``seq_len``; the inputs it assumed
(``meshplan.cost_inputs.assumed_inputs``: ``seq_len_source``, ``gpus_used`` /
``gpus_available`` / ``gpus_idle`` with a warning when GPUs stay idle, ``zero`` and what it
shards, ``attention_source``, the whole ``strategy``, ``warnings``); and two bubble figures
under names that say which: ``zb_bubble_rate`` (the Zero Bubble paper's, Qi et al. 2024
sec. 5.3, = ``bubble_ratio``) and ``critical_rank_idle_fraction`` (the critical rank's
bubble time over the step time); ``layout`` (dp, tp, pp, cp, vpp, schedule, micro/global
batch size, recompute, zero, sequence_parallel as costed; the text's ``plan:`` line);
``step_time_band`` (the prediction's error band, ``simulator.error_band``: low_ms,
high_ms, coverage, comparable_runs, basis; the text's ``error band:`` line).
``--tokens`` adds the expected time to train, its breakdown and cost (``time_to_train`` in
``--json``), ``--jitter-samples`` the step-time percentiles and straggler sensitivity
(``jitter``): ``meshplan.commands.goodput_options``.
Megatron-LM's argument names are accepted (``meshplan.flags.FLAGS`` and
``meshplan.frameworks.megatron.arguments``)."""

from __future__ import annotations

import json
import warnings
from typing import Any

import typer

from meshplan import cost_report as cr
from meshplan import goodput_inputs as gi
from meshplan import outputs as outs
from meshplan import terminal
from meshplan.commands import goodput_options as gp
from meshplan.commands import megatron_options as mo
from meshplan.commands import options as opt
from meshplan.commands import outputs
from meshplan.errors import MeshplanError
from meshplan.frameworks.megatron import arguments as mg
from meshplan.frameworks.megatron import moe as moe_args


def _plan_file(ctx: typer.Context, plan_file: str, cluster: str | None, nodes: int | None) -> Any:
    """The Plan of ``plan_file`` (``Plan.load``: tune's plan.json), on ``cluster`` / ``nodes``
    when given (re-costing a plan on another cluster; the plan's node count stays unless
    ``--nodes`` says, as ``Engine.from_plan`` keeps it). Raises MeshplanError for a model or
    strategy option beside it (the plan states them), and what ``Plan.load`` raises."""

    from meshplan.plan import Plan

    typed = opt.given_flags(ctx, *opt.FLAGS) + opt.typed_flags(
        ctx, "--model", "-m", "--seq-len", "--seq-length", "-s", "--layers", "--num-layers", "-l",
        *mg.MEGATRON_FLAGS)
    if typed:
        raise MeshplanError(f"cost: give PLAN.json or the model and strategy options, not both (got "
                            f"{plan_file} and {', '.join(typed)}; --cluster and --nodes re-cost the "
                            "plan on another cluster)")
    plan = Plan.load(plan_file)
    return plan.on(cluster, nodes)


def _strategy_of_inputs(ctx: typer.Context, plan_file: str | None, model: str | None, cluster: str | None,
                        nodes: int | None, seq_len: int | None, layers: int | None, global_batch: int | None,
                        knobs: dict[str, Any], layers_per_stage: str | None, megatron: Any, moe: Any,
                        torchtitan_config: str | None, deepspeed_config: str | None, as_json: bool) -> Any:
    """Which input gives the strategy -- a PLAN.json, a torchtitan TOML, a DeepSpeed JSON, or
    the strategy options with Megatron-LM's arguments (dp from the world when not typed) --
    and that strategy. Returns (plan or None, strategy, model, cluster, nodes, seq_len,
    layers, the config file's warnings, the dp note or None). Raises MeshplanError for
    inputs given together or missing."""
    inputs_given = {f: v for f, v in (("PLAN.json", plan_file), ("--torchtitan-config", torchtitan_config),
                                      ("--deepspeed-config", deepspeed_config)) if v is not None}
    if len(inputs_given) > 1:
        raise MeshplanError(f"cost: give {' or '.join(inputs_given)}, "
                            f"{'not both' if len(inputs_given) == 2 else 'only one'} (got "
                            f"{' and '.join(inputs_given.values())})")
    config_flag = next((f for f in inputs_given if f != "PLAN.json"), None)
    if config_flag is not None and (model is None or cluster is None):
        raise MeshplanError(f"cost {config_flag}: give --model (the architecture) and --cluster "
                            "(the GPUs) too; the file gives the strategy")
    plan = _plan_file(ctx, plan_file, cluster, nodes) if plan_file is not None else None
    if plan is not None:  # the strategy options below are their defaults, unused
        model, cluster, nodes = plan.model, plan.cluster, plan.nodes
        seq_len, layers = plan.seq_len, plan.num_layers
        global_batch = plan.strategy.global_batch_size
    knobs = {**knobs, "global_batch_size": global_batch}
    read: list[warnings.WarningMessage] = []  # the config file's warnings (also in --json's list)
    dp_note: str | None = None  # dp read from the world, as Megatron-LM reads it (a note)

    def num_layers() -> int:  # the model's decoder layers (after --layers), read when needed
        return mg.model_layers(model, seq_len, layers)
    if plan is None and torchtitan_config is not None and model is not None and cluster is not None:
        from meshplan.commands.config_inputs import torchtitan_strategy

        (strategy, seq_len), read = terminal.reading(lambda: torchtitan_strategy(ctx, torchtitan_config, model, cluster,
                                                                         nodes, seq_len, layers), as_json)
        global_batch = strategy.global_batch_size
    elif plan is None and deepspeed_config is not None and model is not None and cluster is not None:
        from meshplan.commands.config_inputs import deepspeed_strategy

        strategy, read = terminal.reading(lambda: deepspeed_strategy(
            ctx, deepspeed_config, knobs, cluster, nodes, layers_per_stage, num_layers), as_json)
        global_batch = strategy.global_batch_size
    elif model is None or cluster is None or global_batch is None:
        missing = [f for f, v in (("--model", model), ("--cluster", cluster),
                                  ("--global-batch", global_batch)) if v is None]
        raise MeshplanError(f"cost: give {', '.join(missing)} with the strategy options, or a "
                            "PLAN.json (meshplan cost runs/7b/plan.json)")
    if plan is not None and moe.given():
        raise MeshplanError("the Megatron-LM MoE arguments describe the model of --model; a "
                            "PLAN.json names its own")
    if torchtitan_config is None and deepspeed_config is None:
        if plan is None and cluster is not None:  # Megatron-LM arguments: dp from the world
            knobs, dp_note = mo.megatron_dp(ctx, knobs, cluster, nodes)
        strategy = mo.megatron_strategy(ctx, knobs, megatron, num_layers, layers_per_stage)
    if plan is None and torchtitan_config is None:  # a .pir program is costed as written
        from meshplan.commands.program_input import refuse_ignored_cost_options

        refuse_ignored_cost_options(ctx, model, strategy)
    if plan is not None:
        from completion.plan_program import plan_strategy

        strategy = plan_strategy(plan)  # the plan's annotations, as Engine.from_plan takes them
    return plan, strategy, model, cluster, nodes, seq_len, layers, read, dp_note


@mo.megatron_options()
def cost_cmd(
    ctx: typer.Context,
    plan_file: str | None = typer.Argument(
        None, help="Plan JSON to re-cost (meshplan.Plan: tune's plan.json; --cluster / --nodes "
                   "move it); or give --model, --cluster and the strategy options."),
    model: str | None = opt.MODEL_OR_PLAN,
    cluster: str | None = opt.CLUSTER_OR_PLAN,
    nodes: int | None = opt.NODES,
    dp: int = opt.DP,
    tp: int = opt.TP,
    pp: int = opt.PP,
    cp: int = opt.CP,
    cp_comm: opt.CpComm = opt.CP_COMM,
    ep: int = opt.EP,
    etp: int | None = opt.ETP,
    moe_capacity_factor: float | None = opt.MOE_CAPACITY_FACTOR,
    moe_load_imbalance: float = opt.MOE_LOAD_IMBALANCE,
    vpp: int = opt.VPP,
    layers_per_stage: str | None = opt.LAYERS_PER_STAGE,
    schedule: opt.Schedule = opt.SCHEDULE,
    micro_batch_size: int = opt.MICRO_BATCH_SIZE,
    global_batch: int | None = opt.GLOBAL_BATCH_OR_PLAN,
    seq_len: int | None = opt.SEQ_LEN,
    layers: int | None = opt.LAYERS,
    recompute: opt.Recompute = opt.RECOMPUTE,
    zero: int = opt.ZERO,
    fsdp_shard_size: int | None = opt.FSDP_SHARD_SIZE,
    sequence_parallel: bool = opt.SEQUENCE_PARALLEL,
    dtype: opt.Dtype = opt.DTYPE,
    framework: opt.Framework = opt.FRAMEWORK,
    attention: opt.Attention | None = opt.ATTENTION,
    memory_headroom: float = opt.MEMORY_HEADROOM,
    megatron: mg.MegatronArgs = mo.MEGATRON,
    moe: moe_args.MegatronMoE = mo.MOE,
    torchtitan_config: str | None = typer.Option(
        None, "--torchtitan-config", help="A torchtitan job TOML to cost (its \\[parallelism], "
        "\\[training], \\[activation_checkpoint], \\[compile], float8): the strategy comes from it, "
        "the model from --model, the GPUs from --cluster / --nodes.", rich_help_panel=opt.PANEL_INPUTS),
    deepspeed_config: str | None = typer.Option(
        None, "--deepspeed-config", help="A DeepSpeed JSON config (the config of deepspeed.initialize) "
        "to cost: ZeRO stage, MiCS shard size, batch keys, bf16 / fp16, optimizer and AutoTP from it; "
        "the model from --model, the GPUs from --cluster / --nodes, and what the training script sets "
        "from --tp, --pp, --recompute, --sequence-parallel, --schedule (dp: the GPUs over tp x pp).", rich_help_panel=opt.PANEL_INPUTS),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON.", rich_help_panel=opt.PANEL_OUTPUT),
    trace: str | None = typer.Option(None, "--trace", help="Write the step as Chrome trace JSON: "
                                     "a process per rank, a thread per stream, memory counters.", rich_help_panel=opt.PANEL_OUTPUT),
    plot: str | None = typer.Option(None, "--plot", help="Write the step's timeline (Gantt) as a PNG.", rich_help_panel=opt.PANEL_OUTPUT),
    memory_png: str | None = typer.Option(None, "--memory-png",
                                          help="Write each rank's memory over the step as a PNG.", rich_help_panel=opt.PANEL_OUTPUT),
    tokens: str | None = gp.TOKENS,
    price: float | None = gp.PRICE,
    prices: str | None = gp.PRICES,
    checkpoint: str = gp.CHECKPOINT,
    checkpoint_interval: int | None = gp.CHECKPOINT_INTERVAL,
    spares: int = gp.SPARES,
    jitter_samples: int | None = gp.JITTER_SAMPLES,
    jitter_seed: int = gp.JITTER_SEED,
    force: bool = outputs.FORCE,
) -> None:
    """Cost one training step of MODEL on CLUSTER under a strategy (or of a PLAN.json)."""
    from meshplan.cost_inputs import assumed_inputs
    from meshplan.engine import Engine

    knobs = {"dp": dp, "tp": tp, "pp": pp, "cp": cp, "cp_comm": cp_comm, "ep": ep, "etp": etp,
             "moe_capacity_factor": moe_capacity_factor, "moe_load_imbalance": moe_load_imbalance,
             "vpp": vpp, "schedule": schedule, "micro_batch_size": micro_batch_size,
             "global_batch_size": global_batch, "recompute": recompute, "zero": zero,
             "fsdp_shard_size": fsdp_shard_size, "sequence_parallel": sequence_parallel,
             "dtype": dtype, "framework": framework, "attention": attention}

    plan, strategy, model, cluster, nodes, seq_len, layers, read, dp_note = _strategy_of_inputs(
        ctx, plan_file, model, cluster, nodes, seq_len, layers, global_batch, knobs, layers_per_stage,
        megatron, moe, torchtitan_config, deepspeed_config, as_json)
    outs.distinct_outputs({"PLAN.json": plan_file, "--model": outs.input_file(model),
                          "--cluster": outs.input_file(cluster),
                          "--torchtitan-config": outs.input_file(torchtitan_config),
                          "--deepspeed-config": outs.input_file(deepspeed_config), "--trace": trace,
                          "--plot": plot, "--memory-png": memory_png})  # never over an input
    outs.check_outputs({"--trace": (trace, "trace"), "--plot": (plot, "image"),
                           "--memory-png": (memory_png, "image")}, force)
    # the model's warnings (config.json keys not modelled, ...) also go into --json's list
    refused: ValueError | None = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        try:  # the Engine checks the strategy against the model and cluster
            engine = Engine(model, cluster, strategy, nodes=nodes, seq_len=seq_len, num_layers=layers)
            res = engine.simulate()
        except ValueError as e:
            refused = e
    # replayed outside the block: inside it, each shown warning would be recorded again
    if refused is not None or not as_json:
        terminal.replay(caught)
    if refused is not None:  # in the flags' words, unless a plan file gave the strategy
        raise (opt.flag_error(ctx, refused) if plan is None else refused) from None
    moe_notes = ([dp_note] if dp_note else []) + (moe_args.check_source(moe, engine.source) + _megatron_split_note(ctx, engine, plan, torchtitan_config or deepspeed_config)
                 + mo.launch_notes(ctx, lambda: engine.source))
    fit = cr.memory_fit(res, engine.cluster.device, memory_headroom)
    # --tokens / --jitter-samples: the run's time, cost and step-time tail (none: unchanged)
    train, train_lines = gi.goodput_report(engine, res, gi.parse_tokens(tokens), price, prices, checkpoint,
                                           checkpoint_interval, spares, jitter_samples, jitter_seed)
    _write_files(res, f"{model} on {cluster}", trace, memory_png, plot, as_json)
    inputs = assumed_inputs(engine, seq_len_flag=None if plan is not None else seq_len,
                            attention_flag=None if plan is not None else opt.value(attention),
                            plan=plan, seq_len_from="torchtitan" if torchtitan_config else None)
    from simulator.error_band import band_of

    band = band_of(engine).to_dict(res.step_time)
    if as_json:
        inputs["warnings"] = [str(w.message) for w in (*read, *caught)] + inputs["warnings"] + moe_notes
        typer.echo(json.dumps({**res.to_dict(), **fit, **cr.software(engine), **inputs,
                               "layout": cr.layout(engine.strategy), "step_time_band": band,
                               **train}, sort_keys=True))
        for w in inputs["warnings"]:
            typer.echo(f"warning: {w}", err=True)
    else:
        for n in moe_notes:
            typer.echo(f"note: {n}", err=True)
        typer.echo(cr.render(model, cluster, res, fit, cr.software(engine), inputs, cr.layout(engine.strategy), band))
        for line in train_lines:
            typer.echo(line)


def _write_files(res: Any, title: str, trace: str | None, memory_png: str | None, plot: str | None,
                 as_json: bool) -> None:
    """The step's files the user asked for (``--trace`` Perfetto JSON, ``--memory-png``,
    ``--plot`` Gantt chart titled ``title``) and one ``wrote`` line naming them (on stderr
    under ``--json``: stdout stays one JSON document)."""
    if trace is not None or memory_png is not None:
        from simulator import memory_timeline, step_trace

        if trace is not None:
            outs.write_output("--trace", trace, lambda: step_trace.write_trace(res, trace))
        if memory_png is not None:
            outs.write_output("--memory-png", memory_png, lambda: memory_timeline.plot(res, memory_png))
    if plot is not None:
        from simulator.gantt import plot_steps

        outs.write_output("--plot", plot, lambda: plot_steps([(title, res)], plot))
    written = [p for p in (trace, memory_png, plot) if p is not None]
    if written:
        typer.echo(f"wrote {', '.join(written)}", err=as_json)


def _megatron_split_note(ctx: typer.Context, engine: Any, plan: Any, toml: str | None) -> list[str]:
    """``meshplan.frameworks.megatron.notes.even_split_note`` when Megatron-LM arguments
    were typed (not a plan file or a framework config)."""
    from meshplan.frameworks.megatron.notes import even_split_note

    typed = opt.typed_flags(ctx, *mg.MEGATRON_FLAGS, "--tensor-model-parallel-size",
                            "--pipeline-model-parallel-size", "--context-parallel-size",
                            "--num-virtual-stages-per-pipeline-rank", "--global-batch-size")
    if plan is not None or toml is not None or not typed:
        return []
    note = even_split_note(engine.strategy, lambda: tuple(engine.resolved_strategy().layers_per_stage or ()))
    return [note] if note else []


def register(app: typer.Typer) -> None:
    """Add the ``cost`` command to ``app``."""
    app.command("cost", cls=opt.StrategyCommand)(cost_cmd)

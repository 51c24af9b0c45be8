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
(``meshplan.commands.cost_inputs.assumed_inputs``: ``seq_len_source``, ``gpus_used`` /
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
Megatron-LM's argument names are accepted (``meshplan.commands.options.FLAGS`` and
``meshplan.frameworks.megatron.arguments``)."""

from __future__ import annotations

import json
import warnings
from typing import Any

import typer

from meshplan.commands import goodput_options as gp
from meshplan.commands import megatron_options as mo
from meshplan.commands import options as opt
from meshplan.commands import outputs
from meshplan.errors import MeshplanError
from meshplan.frameworks.megatron import arguments as mg
from meshplan.frameworks.megatron import moe as moe_args


def _fmt_bytes(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def memory_fit(res: object, device: object, headroom: float) -> dict[str, object]:
    """The device's memory against the plan's peak (heaviest rank), bytes:
    ``device_memory_bytes`` (capacity), ``reserved_memory_bytes`` (driver), ``usable_memory_bytes``
    (capacity - reserve), ``memory_headroom`` (fraction) and ``memory_headroom_bytes``,
    ``memory_limit_bytes`` = usable - headroom bytes, ``fits_in_memory`` = peak <= limit
    (``clusters.spec.DeviceSpec.memory_limit``)."""
    peak = int(res.max_memory_bytes)  # type: ignore[attr-defined]
    usable = float(device.usable_bytes)  # type: ignore[attr-defined]
    limit = float(device.memory_limit(headroom))  # type: ignore[attr-defined]
    return {"device_memory_bytes": int(device.memory_bytes.value),  # type: ignore[attr-defined]
            "reserved_memory_bytes": int(device.reserved_bytes),  # type: ignore[attr-defined]
            "usable_memory_bytes": int(usable), "memory_headroom": float(headroom),
            "memory_headroom_bytes": int(usable - limit), "memory_limit_bytes": int(limit),
            "fits_in_memory": peak <= limit}


def software(engine: object) -> dict[str, object]:
    """What the Engine costed with besides the layout: ``framework`` (profile name),
    ``attention`` (flash / unfused, resolved), ``attention_kernel`` (the profile's flash
    kernel, None for unfused attention) and ``seq_len`` (tokens per sequence) and ``fp8``
    (the FP8 recipe, None for none) and ``fsdp_shard_size`` (the HSDP shard group, None for
    none)."""
    s = engine.strategy  # type: ignore[attr-defined]
    kernel = engine.profile.kernels.attention_kernel.value  # type: ignore[attr-defined]
    return {"framework": s.framework, "attention": s.attention,
            "attention_kernel": kernel if s.attention == "flash" else None,
            "seq_len": engine.source.seq_len, "fp8": s.fp8,  # type: ignore[attr-defined]
            "fsdp_shard_size": s.fsdp_shard_size}


#: time-breakdown key -> what its line means (the critical rank's step, seconds)
TIME_TERMS = {
    "compute": "kernels of its stages (forward, backward, recompute), and the host's dispatch where it is slower",
    "tp_comm": "collectives inside its stages (TP, CP, EP all_to_all, ZeRO-3 gathers and reduces), all issued",
    "overlapped": "of tp_comm, the part that ran beside compute (not on the critical path)",
    "pp_comm": "the p2p hops it sends to other pipeline stages (synchronous sends: busy time; "
               "asynchronous: a delay inside the bubble)",
    "bubble": "idle: waiting for its pipeline neighbours (warm-up, cool-down, stalls)",
    "dp_sync": "gradient reduce and parameter gathers not hidden behind the backward",
    "optimizer": "optimizer step and once-per-step kernels",
}


#: the layout fields ``cost`` reports, in Megatron's short names (``layout`` in --json)
LAYOUT_FIELDS = ("dp", "tp", "pp", "cp", "ep", "etp", "vpp", "schedule", "micro_batch_size",
                 "global_batch_size", "recompute", "zero", "sequence_parallel")


def layout(strategy: object) -> dict[str, object]:
    """The strategy's layout as costed (after the Megatron arguments were translated, e.g.
    ``--num-layers-per-virtual-pipeline-stage`` into vpp): :data:`LAYOUT_FIELDS` (``etp``
    only when the plan states it: None is tp)."""
    return {k: getattr(strategy, k) for k in LAYOUT_FIELDS if k != "etp" or getattr(strategy, k) is not None}


def layout_line(lay: dict[str, object]) -> str:
    """``plan: dp=4 tp=4 pp=2 cp=1 vpp=2 VPP, mbs 1, gbs 64, recompute full, zero 1, sp off``
    (``ep=N`` after cp when expert parallelism is on)."""
    ep = f"ep={lay['ep']} " if lay.get("ep", 1) != 1 else ""
    if lay.get("etp") is not None and lay.get("etp") != lay.get("tp"):
        ep += f"etp={lay['etp']} "
    return (f"plan: dp={lay['dp']} tp={lay['tp']} pp={lay['pp']} cp={lay['cp']} {ep}vpp={lay['vpp']} "
            f"{lay['schedule']}, mbs {lay['micro_batch_size']}, gbs {lay['global_batch_size']}, "
            f"recompute {lay['recompute']}, zero {lay['zero']}, "
            f"sp {'on' if lay['sequence_parallel'] else 'off'}")


def band_line(b: dict[str, Any]) -> str:
    """One line of a prediction's error band (``simulator.error_band``: ``Band.to_dict``)."""
    return (f"error band: {b['low_ms']:.2f} - {b['high_ms']:.2f} ms ({b['coverage']:.0%} of "
            f"{b['comparable_runs']} comparable measured runs, grouped by {b['basis']}, measured "
            f"within it; simulator.error_band)")


def _render(model: str, cluster: str, res: object, fit: dict[str, object], sw: dict[str, object],
            inputs: dict[str, object], lay: dict[str, object], band: dict[str, Any]) -> str:
    from meshplan.commands.cost_inputs import input_lines

    d = res.to_dict()  # type: ignore[attr-defined]
    lines = [
        f"{model} on {cluster}: step {d['step_time_ms']:.2f} ms, {d['tokens_per_s']:.0f} tokens/s, "
        f"{flop_rate(d['tflops_per_gpu'] * 1e12)} per GPU, MFU {d['mfu'] * 100:.1f}%"
        + (f" of the FP8 peak ({d['mfu_bf16'] * 100:.1f}% of the BF16 peak, as NeMo and "
           f"torchtitan report it)" if abs(d["mfu_bf16"] - d["mfu"]) > 1e-12 else "")
        + f" (causal attention counted in full, as Megatron-LM does; {d['mfu_causal'] * 100:.1f}% "
        f"counting it as executed)"
        + ("" if fit["fits_in_memory"] else
           f" -- OUT OF MEMORY ({_fmt_bytes(d['max_memory_bytes'])} of a "
           f"{_fmt_bytes(fit['memory_limit_bytes'])} limit)"),
        band_line(band),
        layout_line(lay),
        f"pipeline bubble: ZB bubble rate {d['zb_bubble_rate']:.4f} (Qi et al. 2024 sec. 5.3: "
        f"(largest rank span - largest rank busy time) / largest rank span); critical rank idle "
        f"{d['critical_rank_idle_fraction']:.4f} of the step (its bubble line / step time)",
        *input_lines(inputs, sw["attention_kernel"]),  # type: ignore[arg-type]
        *([f"HSDP: ZeRO-3 in shard groups of {sw['fsdp_shard_size']} dp ranks, replicated "
           f"{inputs['strategy']['dp'] // sw['fsdp_shard_size']} times"] if sw.get("fsdp_shard_size") else []),
        f"layers per stage: {d['layers_per_vstage']}",
        "time breakdown (critical rank: the pipeline rank that finishes last; compute + tp_comm "
        "- overlapped + bubble + dp_sync + optimizer, + pp_comm when sends are synchronous, "
        "= the step):",
    ]
    lines += [f"  {k:<10} {v * 1e3:10.2f} ms  {TIME_TERMS.get(k, '')}".rstrip()
              for k, v in d["time_breakdown_s"].items()]
    lines.append(f"memory breakdown (heaviest rank), max {_fmt_bytes(d['max_memory_bytes'])}:")
    lines += [f"  {k:<18} {_fmt_bytes(v):>12}" for k, v in d["memory_breakdown_bytes"].items()]
    lines.append(f"device memory {_fmt_bytes(fit['device_memory_bytes'])} - driver reserve "
                 f"{_fmt_bytes(fit['reserved_memory_bytes'])} = usable "
                 f"{_fmt_bytes(fit['usable_memory_bytes'])}; headroom "
                 f"{fit['memory_headroom']:.0%} ({_fmt_bytes(fit['memory_headroom_bytes'])}): "
                 f"limit {_fmt_bytes(fit['memory_limit_bytes'])}")
    if not fit["fits_in_memory"]:
        lines.append(f"OUT OF MEMORY: the heaviest rank needs {_fmt_bytes(d['max_memory_bytes'])}, "
                     f"usable memory less headroom is {_fmt_bytes(fit['memory_limit_bytes'])}")
    return "\n".join(lines)


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


def flop_rate(flops_per_s: float) -> str:
    """``412.9 TFLOP/s``, or in GFLOP/s below one TFLOP/s (a CPU rank: 28.3 GFLOP/s, which
    TFLOP/s printed as 0.0 beside a 42% MFU)."""
    if flops_per_s >= 1e12 or flops_per_s == 0:
        return f"{flops_per_s / 1e12:.1f} TFLOP/s"
    return f"{flops_per_s / 1e9:.1f} GFLOP/s"




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
    from meshplan.commands.cost_inputs import assumed_inputs
    from meshplan.engine import Engine

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
    read: list[warnings.WarningMessage] = []  # the config file's warnings (also in --json's list)
    dp_note: str | None = None  # dp read from the world, as Megatron-LM reads it (a note)
    knobs = {"dp": dp, "tp": tp, "pp": pp, "cp": cp, "cp_comm": cp_comm, "ep": ep, "etp": etp,
             "moe_capacity_factor": moe_capacity_factor, "moe_load_imbalance": moe_load_imbalance,
             "vpp": vpp, "schedule": schedule, "micro_batch_size": micro_batch_size,
             "global_batch_size": global_batch, "recompute": recompute, "zero": zero,
             "fsdp_shard_size": fsdp_shard_size, "sequence_parallel": sequence_parallel,
             "dtype": dtype, "framework": framework, "attention": attention}

    def num_layers() -> int:  # the model's decoder layers (after --layers), read when needed
        return mg.model_layers(model, seq_len, layers)
    if plan is None and torchtitan_config is not None and model is not None and cluster is not None:
        from meshplan.commands.config_inputs import torchtitan_strategy

        (strategy, seq_len), read = _reading(lambda: torchtitan_strategy(ctx, torchtitan_config, model, cluster,
                                                                         nodes, seq_len, layers), as_json)
        global_batch = strategy.global_batch_size
    elif plan is None and deepspeed_config is not None and model is not None and cluster is not None:
        from meshplan.commands.config_inputs import deepspeed_strategy

        strategy, read = _reading(lambda: deepspeed_strategy(
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
    opt.distinct_outputs({"PLAN.json": plan_file, "--model": opt.input_file(model),
                          "--cluster": opt.input_file(cluster),
                          "--torchtitan-config": opt.input_file(torchtitan_config),
                          "--deepspeed-config": opt.input_file(deepspeed_config), "--trace": trace,
                          "--plot": plot, "--memory-png": memory_png})  # never over an input
    outputs.check_outputs({"--trace": (trace, "trace"), "--plot": (plot, "image"),
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
        _replay(caught)
    if refused is not None:  # in the flags' words, unless a plan file gave the strategy
        raise (opt.flag_error(ctx, refused) if plan is None else refused) from None
    moe_notes = ([dp_note] if dp_note else []) + (_check_moe(moe, engine) + _megatron_split_note(ctx, engine, plan, torchtitan_config or deepspeed_config)
                 + mo.launch_notes(ctx, lambda: engine.source))
    fit = memory_fit(res, engine.cluster.device, memory_headroom)
    # --tokens / --jitter-samples: the run's time, cost and step-time tail (none: unchanged)
    train, train_lines = gp.goodput_report(engine, res, gp.parse_tokens(tokens), price, prices, checkpoint,
                                           checkpoint_interval, spares, jitter_samples, jitter_seed)
    if trace is not None or memory_png is not None:
        from simulator import memory_timeline, step_trace

        if trace is not None:
            opt.write_output("--trace", trace, lambda: step_trace.write_trace(res, trace))
        if memory_png is not None:
            opt.write_output("--memory-png", memory_png, lambda: memory_timeline.plot(res, memory_png))
    if plot is not None:
        from simulator.gantt import plot_steps

        opt.write_output("--plot", plot, lambda: plot_steps([(f"{model} on {cluster}", res)], plot))
    written = [p for p in (trace, memory_png, plot) if p is not None]
    if written:  # on stderr under --json: stdout stays one JSON document
        typer.echo(f"wrote {', '.join(written)}", err=as_json)
    inputs = assumed_inputs(engine, seq_len_flag=None if plan is not None else seq_len,
                            attention_flag=None if plan is not None else opt.value(attention),
                            plan=plan, seq_len_from="torchtitan" if torchtitan_config else None)
    from simulator.error_band import band_of

    band = band_of(engine).to_dict(res.step_time)
    if as_json:
        inputs["warnings"] = [str(w.message) for w in (*read, *caught)] + inputs["warnings"] + moe_notes
        typer.echo(json.dumps({**res.to_dict(), **fit, **software(engine), **inputs,
                               "layout": layout(engine.strategy), "step_time_band": band,
                               **train}, sort_keys=True))
        for w in inputs["warnings"]:
            typer.echo(f"warning: {w}", err=True)
    else:
        for n in moe_notes:
            typer.echo(f"note: {n}", err=True)
        typer.echo(_render(model, cluster, res, fit, software(engine), inputs, layout(engine.strategy), band))
        for line in train_lines:
            typer.echo(line)


def _megatron_split_note(ctx: typer.Context, engine: Any, plan: Any, toml: str | None) -> list[str]:
    """A note when Megatron-LM arguments were typed for a pipelined plan whose split the cost
    model balanced: Megatron-LM splits the layers evenly unless told (d98e8a64
    ``--decoder-first-pipeline-num-layers`` help: "Default None is even split"), so the
    figures are of another run than the pasted arguments' (``export`` notes the same)."""
    from simulator.layer_split import even_split

    s = engine.strategy
    typed = opt.typed_flags(ctx, *mg.MEGATRON_FLAGS, "--tensor-model-parallel-size",
                     "--pipeline-model-parallel-size", "--context-parallel-size",
                     "--num-virtual-stages-per-pipeline-rank", "--global-batch-size")
    if plan is not None or toml is not None or not typed or s.pp * s.vpp == 1 or s.layers_per_stage:
        return []
    costed = tuple(engine.resolved_strategy().layers_per_stage or ())
    layers, stages = sum(costed), s.pp * s.vpp
    if not costed or layers % stages or even_split(layers, stages) == costed:
        return []
    return [f"with Megatron-LM arguments: the cost model balanced the pipeline stages as "
            f"{list(costed)}, while Megatron-LM splits the layers evenly, "
            f"{list(even_split(layers, stages))}; --layers-per-stage even costs that split"]


def _check_moe(moe: moe_args.MegatronMoE, engine: Any) -> list[str]:
    """The Megatron-LM MoE arguments checked against the costed model
    (``megatron_moe.check``); their notes. Raises MeshplanError for a difference, or for
    such arguments beside a .pir program (it has no model config)."""
    if not moe.given():
        return []
    cfg = getattr(engine.source, "config", None)
    if cfg is None:
        raise MeshplanError("the Megatron-LM MoE arguments describe a model config; a .pir program "
                            "is costed as written")
    return moe_args.check(moe, cfg, engine.source.num_layers)


def _reading(read: Any, as_json: bool) -> tuple[Any, list[warnings.WarningMessage]]:
    """``read()`` with its warnings recorded: shown at once (text output, or when it
    raises, before its error) and returned for ``--json``'s list."""
    err: Exception | None = None
    out: Any = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        try:
            out = read()
        except Exception as e:  # re-raised below, after the warnings it gave
            err = e
    if err is not None or not as_json:
        _replay(caught)
    if err is not None:
        raise err
    return out, (list(caught) if as_json else [])


def _replay(caught: list[warnings.WarningMessage]) -> None:
    """Show recorded warnings as they would have shown (one ``warning:`` line each, cli).
    Call it outside ``catch_warnings(record=True)``, which would record them again."""
    for w in caught:
        warnings.showwarning(w.message, w.category, w.filename, w.lineno)


def register(app: typer.Typer) -> None:
    """Add the ``cost`` command to ``app``."""
    app.command("cost", cls=opt.StrategyCommand)(cost_cmd)

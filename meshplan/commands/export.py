"""``meshplan export PLAN.json --to megatron|torchtitan|deepspeed [--output FILE]``: write
what that framework takes to run the plan (Megatron-LM arguments, a torchtitan job TOML, a
DeepSpeed JSON config; ``meshplan.frameworks.targets`` lists the targets), with one
note per plan knob the target cannot express (as comments in the file where the format
has them, and always on stderr).

Instead of PLAN.json the plan can be given by ``--model``, ``--cluster`` and the strategy
options of ``meshplan cost`` (their Megatron-LM spellings included: ``--tensor-model-parallel-size``,
``--num-layers-per-virtual-pipeline-stage``, ``--use-distributed-optimizer``, ...), e.g. to
turn a layout written in Megatron's names into a torchtitan TOML."""

from __future__ import annotations

import dataclasses
from enum import Enum
from pathlib import Path
from typing import Any

import typer

from meshplan import outputs as outs
from meshplan.commands import megatron_options as mo
from meshplan.commands import options as opt
from meshplan.errors import MeshplanError
from meshplan.frameworks.megatron import arguments as mg
from meshplan.pipeline_split import split_word

#: the targets of ``meshplan.frameworks.targets.TARGETS`` (spelled here so that
#: ``meshplan --help`` imports nothing; tests/meshplan/test_export.py checks that they agree)
Target = Enum("Target", {n: n for n in ("megatron", "torchtitan", "deepspeed")}, type=str)


def _plan_from_options(ctx: typer.Context, model: str | None, cluster: str | None,
                       nodes: int | None, seq_len: int | None, layers: int | None,
                       knobs: dict[str, Any], megatron: mg.MegatronArgs,
                       layers_per_stage: str | None = None) -> tuple[Any, str | None]:
    """The Plan the strategy options describe, and the note of a dp read from the world as
    Megatron-LM reads it (``megatron_options.megatron_dp``; None: none). Raises
    MeshplanError naming a missing --model / --cluster, StrategyError naming the flag typed."""
    from meshplan.plan import Plan

    missing = [f for f, v in (("--model", model), ("--cluster", cluster)) if v is None]
    if missing:
        raise MeshplanError(f"export: give PLAN.json, or {' and '.join(missing)} with the "
                            "strategy options")
    assert model is not None and cluster is not None
    knobs, dp_note = mo.megatron_dp(ctx, knobs, cluster, nodes)
    strategy = mo.megatron_strategy(ctx, knobs, megatron, lambda: mg.model_layers(model, seq_len, layers),
                                    layers_per_stage)
    return Plan(model=model, cluster=cluster, strategy=strategy, nodes=nodes, seq_len=seq_len,
                num_layers=layers), dp_note


def _plan_from_file(ctx: typer.Context, plan_file: str, layers_per_stage: str | None,
                    cluster: str | None = None, nodes: int | None = None) -> Any:
    """The Plan of ``plan_file``, on ``cluster`` / ``nodes`` when given (as ``cost PLAN.json``
    re-costs it there), its split restated by ``--layers-per-stage`` when given (a word
    replaces a split the file pins; ``opt.pipeline_split``). Raises MeshplanError for any
    other strategy option beside it, and what ``Plan.load`` and the split raise."""
    from meshplan.frameworks.targets import model_sizes
    from meshplan.plan import Plan

    typed = [f for f in _strategy_flags_typed(ctx)
             if f not in (*opt.FLAGS["layers_per_stage"], "--cluster", "--nodes")]
    if typed:
        raise MeshplanError(f"export: give PLAN.json or the strategy options, not both "
                            f"(got {plan_file} and {', '.join(typed)}; --cluster and --nodes "
                            "move the plan to another cluster)")
    plan = Plan.load(plan_file).on(cluster, nodes)
    if layers_per_stage is None:
        return plan
    if plan.strategy.layers_per_stage is not None and split_word(layers_per_stage):
        plan = dataclasses.replace(plan, strategy=plan.strategy.replace(layers_per_stage=None))
    s = opt.pipeline_split(ctx, layers_per_stage, plan.strategy, lambda: model_sizes(plan)[0])
    return dataclasses.replace(plan, strategy=s)


def _strategy_flags_typed(ctx: typer.Context) -> list[str]:
    """The strategy (and plan) options on the command line of ``ctx``."""
    plan_flags = ("--model", "-m", "--cluster", "--nodes", "--seq-len", "--seq-length", "-s",
                  "--layers", "--num-layers", "-l", *mg.MEGATRON_FLAGS)
    return opt.given_flags(ctx, *opt.FLAGS) + opt.typed_flags(ctx, *plan_flags)


LAUNCH = typer.Option(None, "--launch", help="Also write a bash launch script (.sh): torchrun on "
                      "the plan's nodes and GPUs with the environment it needs, running the "
                      "--output file (Megatron-LM's pretrain_gpt.py, torchtitan.train, or your "
                      "DeepSpeed script).")
FORCE = typer.Option(False, "--force", help="Replace output files that already exist, and write a "
                     "job that does not fit in the device's memory as the target runs it.")


@mo.megatron_options()
def export_cmd(
    ctx: typer.Context,
    plan_file: str | None = typer.Argument(
        None, help="Plan JSON (meshplan.Plan); or give --model, --cluster and the strategy options."),
    to: Target = typer.Option(..., "--to", help="Framework to export to."),
    output: str = typer.Option("", "--output", "-o", help="File to write (default: stdout)."),
    model: str | None = opt.MODEL_OR_PLAN,
    cluster: str | None = opt.CLUSTER_OR_PLAN,
    nodes: int | None = opt.NODES,
    seq_len: int | None = opt.SEQ_LEN,
    layers: int | None = opt.LAYERS,
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
    recompute: opt.Recompute = opt.RECOMPUTE,
    zero: int = opt.ZERO,
    fsdp_shard_size: int | None = opt.FSDP_SHARD_SIZE,
    sequence_parallel: bool = opt.SEQUENCE_PARALLEL,
    dtype: opt.Dtype = opt.DTYPE,
    framework: opt.Framework = opt.FRAMEWORK,
    attention: opt.Attention | None = opt.ATTENTION,
    megatron: mg.MegatronArgs = mo.MEGATRON,
    launch: str | None = LAUNCH,
    force: bool = FORCE,
) -> None:
    """Export a plan to Megatron-LM arguments, a torchtitan TOML or a DeepSpeed JSON."""
    from meshplan.frameworks.recost import as_run_note, costed_plan, model_source, recost_notes
    from meshplan.frameworks.targets import export_plan

    outs.distinct_outputs({"PLAN.json": plan_file, "--model": outs.input_file(model),
                           "--cluster": outs.input_file(cluster), "--output": output or None,
                           "--launch": launch})
    if output or opt.typed_flags(ctx, "--output", "-o"):  # -o '' is not stdout
        outs.check_output("--output", output, to.value, force, new_folder=True)
    if launch is not None:
        if not output:
            raise MeshplanError("export --launch: give --output too (the launch script runs the "
                                "exported file)", field="--launch")
        outs.check_output("--launch", launch, "launch", force, new_folder=True)
    dp_note: str | None = None
    if plan_file is not None:
        plan = _plan_from_file(ctx, plan_file, layers_per_stage, cluster, nodes)
    else:
        if global_batch is None:
            raise MeshplanError("export: give PLAN.json, or --global-batch-size with the "
                                "strategy options")
        knobs = {"dp": dp, "tp": tp, "pp": pp, "cp": cp, "cp_comm": cp_comm, "ep": ep, "etp": etp,
                 "moe_capacity_factor": moe_capacity_factor, "moe_load_imbalance": moe_load_imbalance,
                 "vpp": vpp,
                 "schedule": schedule, "micro_batch_size": micro_batch_size,
                 "global_batch_size": global_batch, "recompute": recompute, "zero": zero,
                 "fsdp_shard_size": fsdp_shard_size, "sequence_parallel": sequence_parallel,
                 "dtype": dtype,
                 "framework": framework, "attention": attention}
        plan, dp_note = _plan_from_options(ctx, model, cluster, nodes, seq_len, layers, knobs, megatron,
                                           layers_per_stage)
    try:
        balanced = split_word(layers_per_stage) == "balanced"
        checked, fit_note = costed_plan(plan, pin=balanced, target=to.value)
    except ValueError as e:  # the user's flags named as typed, as cost names them
        raise (opt.flag_error(ctx, e) if plan_file is None else e) from None
    launch_notes = mo.launch_notes(ctx, lambda: model_source(checked))
    out = export_plan(checked, to.value)
    recost_note, recost_warning = recost_notes(checked, out, force)
    run_note = as_run_note(checked, out.effective, to.value)
    if run_note and fit_note:
        fit_note += f" (with the plan's {checked.strategy.schedule} schedule; see the schedule note)"
    notes = (([dp_note] if dp_note else []) + ([fit_note] if fit_note else []) + [str(n) for n in out.notes] + ([run_note] if run_note else [])
             + launch_notes + ([recost_note] if recost_note else []))
    for note in notes:
        typer.echo(f"note: {note}", err=True)
    if recost_warning:
        typer.echo(f"warning: {recost_warning}", err=True)
    if to.value != "deepspeed":  # the file keeps them too (JSON has no comments)
        out.text = "".join(f"# note: {n}\n" for n in (fit_note, run_note) if n) + out.text
    if output:
        path = Path(output)
        outs.ensure_dir(path.parent)
        outs.write_output("--output", output, lambda: path.write_text(out.text))
        typer.echo(f"wrote {path} ({to.value}, {len(notes)} note(s))", err=True)
        if launch is not None:
            _write_launch(checked, out, output, launch)
    else:
        typer.echo(out.text, nl=False)


def _write_launch(plan: Any, out: Any, output: str, launch: str) -> None:
    """Write the launch script of ``out`` (``meshplan.frameworks.launch_script``) to
    ``launch``, executable, and say so on stderr."""
    from meshplan.frameworks.launch_script import launch_script

    text = launch_script(plan, out, output, launch)
    path = Path(launch)
    outs.ensure_dir(path.parent)
    outs.write_output("--launch", launch, lambda: path.write_text(text))
    path.chmod(0o755)
    typer.echo(f"wrote {path} (torchrun launch script of {out.target}; run it on every node)", err=True)


def register(app: typer.Typer) -> None:
    """Add the ``export`` command to ``app``."""
    app.command("export", cls=opt.StrategyCommand)(export_cmd)

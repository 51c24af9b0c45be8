"""``meshplan validate PLAN.json --nproc N [--cluster FILE.yaml] [--steps S] [--repeats R]
[--no-verify] [--json] [--csv FILE] [--launcher local|torchrun]``: run a plan on N local
ranks (gloo; ``--backend nccl`` on GPUs) and print the simulator's prediction next to the
measurement (step time, T_F / T_B / T_W per stage, peak memory) with the relative error;
append one row to a CSV for the experiment reports.

A measurement on a shared host is noisy, so the run is repeated R times (one launch, each
repeat the same run from the same parameters) and the step time reported is the median of
the repeats' medians, with their spread ((max - min) / median); the host's 1-minute load
average before and after is recorded and a warning printed when it exceeds the cores;
and an fp32 plan is verified (``executor.verify``: losses and parameters against one
process, 1e-5 relative) so the report says whether the numerics matched (other dtypes are
reported as not checked: rounding differences exceed that tolerance).

``--profile-trace DIR``: after the last repeat's timed steps every rank runs 3 steps under
``torch.profiler`` (``record_shapes=True``: the aten ops' shapes) and 31 rounds of one
unrecorded step and one whose plan ops are timed by the span recorder, and writes it all as
a Chrome trace to ``DIR/rank<R>.json`` (``executor.profile``; none of these steps is in the
report), the input of ``meshplan calibrate --from-trace``.

``--launcher torchrun`` runs nothing: it prints the torchrun command that runs the plan on
a cluster (``meshplan.executor.run``, one process per rank, any number of nodes).

The run plays the schedule the simulator played for the prediction
(``meshplan.validation.run_repeated``), so both describe the same order of work."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import typer

from meshplan import outputs as outs
from meshplan import validation_launch as vl
from meshplan.commands import options as opt
from meshplan.commands import outputs
from meshplan.errors import MeshplanError
from meshplan.resources import host_cores
from meshplan.validation_report import (
    CSV_COLUMNS,
    DEFAULT_CSV,
    append_csv,
    print_table,
    report_rows,
)

#: Most measured steps one ``validate`` runs
MAX_STEPS = 10_000
#: Most repeats of the measurement
MAX_REPEATS = 100
LAUNCHERS = ("local", "torchrun")


def _given(ctx: Any, param: str) -> bool:
    """Whether option ``param`` was typed on the command line (not its default)."""
    src = ctx.get_parameter_source(param) if ctx is not None else None
    return getattr(src, "name", "") == "COMMANDLINE"  # click's ParameterSource, as typer ships it


def _check_csv(csv_path: str, append: bool, force: bool) -> None:
    """Refuse before the run a ``--csv`` that cannot take the row: not a CSV name, a
    directory, in a folder that cannot be created, an existing file without ``--append``
    (add the row; its columns must be this command's) or ``--force`` (replace it)."""
    if append and force:
        raise outs.OutputError("--append adds a row to the CSV and --force replaces it; give one")
    outs.check_output("--csv", csv_path, "csv", force, append, new_folder=True)
    if append and Path(csv_path).is_file():
        outs.check_csv_header("--csv", csv_path, CSV_COLUMNS)


def validate_cmd(
    ctx: typer.Context,
    plan_file: str = typer.Argument(..., help="Plan JSON (meshplan.Plan)."),
    nproc: int = typer.Option(0, "--nproc", min=0, max=opt.MAX_LOCAL_RANKS,
                              help="Ranks to launch (must equal dp*cp*tp*pp; 0: the plan's)."),
    cluster: str = typer.Option("", "--cluster", help="Cluster YAML or name for the prediction."),
    steps: int = typer.Option(10, "--steps", min=1, max=MAX_STEPS, help="Measured steps (after 2 warmup)."),
    repeats: int = typer.Option(3, "--repeats", min=1, max=MAX_REPEATS,
                                help="Times the measurement is repeated (median and spread)."),
    check: bool = typer.Option(True, "--verify/--no-verify",
                               help="Also check the numerics against one process."),
    backend: str = typer.Option("gloo", "--backend", help="gloo (CPU) or nccl (GPU)."),
    csv_path: str = typer.Option(DEFAULT_CSV, "--csv", help="CSV to write a row to (one given "
                                 "that exists needs --append or --force; the default log grows)."),
    append: bool = outputs.APPEND,
    force: bool = outputs.FORCE,
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    launcher: str = typer.Option("local", "--launcher",
                                 help="local (run here) or torchrun (print the cluster command)."),
    nnodes: int = typer.Option(1, "--nnodes", min=1, max=2**20, help="Nodes (with --launcher torchrun)."),
    rdzv_endpoint: str = typer.Option("", "--rdzv-endpoint",
                                      help="HOST:PORT of the rendezvous (with --launcher torchrun)."),
    profile_trace: str = typer.Option("", "--profile-trace",
                                      help="Directory each rank writes the trace calibrate "
                                           "--from-trace fits to (rank<R>.json; extra steps "
                                           "after the reported ones)."),
) -> None:
    """Run a plan, print predicted vs measured (median of repeats) with relative errors."""
    from meshplan.plan import Plan

    if launcher not in LAUNCHERS:
        raise MeshplanError(f"--launcher must be one of {list(LAUNCHERS)}, got {launcher!r}")
    plan = Plan.load(plan_file)
    world = plan.strategy.world_size
    if launcher == "torchrun":
        from meshplan.frameworks.recost import costed_plan

        costed_plan(plan)  # refuse here what every rank would refuse at start-up (its note: cost's)
        vl.check_gpus_per_node(plan, world, nnodes)
        if nproc and nproc != world:
            raise MeshplanError(f"--nproc {nproc}: the plan runs dp*tp*pp*cp = {world} ranks "
                             f"(--launcher torchrun spreads them over --nnodes {nnodes})")
        extra = vl.executor_args(cluster, backend, csv_path, as_json, profile_trace,
                              _given(ctx, "backend"))
        typer.echo(vl.torchrun_command(plan_file, world, nnodes, steps, rdzv_endpoint, extra))
        return
    nproc = nproc or world
    from executor.run import check_plan
    from meshplan import terminal
    from meshplan.validation import run_repeated, verify, zero_note

    check_plan(plan, nproc)  # the rank count first: a memory check on the wrong count misleads

    # before the ranks run: a measurement is never lost. The default log (reports/
    # validation.csv, the experiment reports' input) is meant to grow: it takes a row
    # without --append, if it is a validation CSV
    default_log = ctx.get_parameter_source("csv_path").name != "COMMANDLINE"
    _check_csv(csv_path, append or (default_log and not force), force)

    cores, before = host_cores(), vl.host_load()
    fp32 = plan.strategy.dtype == "float32"
    with terminal.Progress(2 if check and fp32 else 1, f"{repeats} repeat(s) on {nproc} ranks",
                           enabled=terminal.progress_enabled(as_json)) as bar:
        runs = run_repeated(plan, nproc, repeats, cluster=cluster or None, backend=backend,
                            steps=steps, warmup=2, profile_dir=profile_trace or None)
        bar.advance(note="measured; verifying numerics" if check and fp32 else "measured")
        numerics = verify(plan, nproc, runs[0].predicted, backend=backend) if check and fp32 else None
        if numerics is not None:
            bar.advance(note="numerics verified")
    after = vl.host_load()
    meas = runs[0]
    times = [m.step_time for m in runs]
    meas.step_time = statistics.median(times)
    warning = vl.load_warning(before, after, cores)
    if warning:
        typer.echo(f"warning: {warning}", err=True)
    note = zero_note(plan)
    if note:
        typer.echo(f"note: {note}", err=True)
    outs.write_output("--csv", csv_path,
                     lambda: append_csv(Path(csv_path), plan_file, plan, meas, replace=force))
    summary = vl.ValidationSummary(plan_file, plan, meas, times, numerics, check,
                                   (before, after, cores), warning, note, profile_trace)
    if as_json:
        typer.echo(json.dumps(summary.to_dict(repeats)))
        return
    print_table(report_rows(plan, meas))
    typer.echo("\n".join(summary.lines(repeats)))


def register(app: typer.Typer) -> None:
    """Add the ``validate`` command to ``app``."""
    app.command("validate")(validate_cmd)

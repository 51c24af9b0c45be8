"""``meshplan calibrate [--nproc 2] --output FILE.yaml [--quick] [--name NAME]``: measure
this machine as the executor uses it (its own ops' GEMM rate, small-GEMM penalty,
memory-bound and attention kernel throughput and per-op overhead, GEMM rate per dtype,
memory bandwidth, collective alpha/beta on gloo ranks; on a GPU also its SM count and
the GEMM plateau of the wave model, printing the measured GEMM curve against the model's
at a sweep of shapes) and write a cluster YAML that
``--cluster FILE.yaml`` accepts everywhere. See ``executor.calibrate`` for the method;
measure on an otherwise idle machine (the load is recorded in the provenance).

``meshplan calibrate --from-trace TRACE.json --plan PLAN.json --output FILE.yaml`` instead
fits the GEMM rate and half-size, the memory-bound bandwidth and the link latency and
bandwidth to a PyTorch profiler (Kineto) Chrome trace of a real run
(``executor.trace_calibrate``), writes the plan's cluster (or ``--cluster``) with them,
and prints each kernel class's measured time against the prediction before and after.
A trace the executor recorded (``meshplan validate --profile-trace DIR``; TRACE may be
that directory, every ``rank*.json`` in it is read) is matched op by op to the plan
(``executor.trace_match``) and fitted as ``meshplan calibrate`` fits its own program
(``executor.trace_plan_fit``: per-op overhead, GEMM curve, memory-bound and attention
rates overall and per op, per-action overhead, collective bandwidth); the command then
also prints the plan's measured step (the traced run's timed steps) against the
simulator's step before and after calibration."""

from __future__ import annotations

import typer


def calibrate_cmd(
    ctx: typer.Context,
    output: str = typer.Option(..., "--output", "-o", help="Cluster YAML to write."),
    nproc: int = typer.Option(2, "--nproc", min=2, max=64,
                              help="Ranks for the collective timings (at most 64)."),
    quick: bool = typer.Option(False, "--quick", help="Fewer sizes and repeats (seconds)."),
    name: str = typer.Option("", "--name", help="Cluster name (default: the file stem)."),
    device: str = typer.Option("cpu", "--device", help="cpu, or cuda to time GEMMs on the GPU."),
    from_trace: str = typer.Option("", "--from-trace",
                                   help="Fit to a PyTorch profiler Chrome trace instead of measuring."),
    plan: str = typer.Option("", "--plan", help="With --from-trace: the plan whose cluster is calibrated."),
    cluster: str = typer.Option("", "--cluster", help="With --from-trace: the cluster calibrated (name or YAML)."),
    force: bool = typer.Option(False, "--force", help="Replace the output file if it exists."),
) -> None:
    """Measure this machine (or fit a profiler trace) and write a cluster YAML with provenance."""
    from meshplan.outputs import check_output
    from meshplan.resources import check_processes

    check_output("--output", output, "cluster", force)  # before minutes of measuring, not after
    _refuse_unused(ctx, bool(from_trace))
    if not from_trace:
        check_processes("--nproc", nproc, "ranks", "the collective timings it records would "
                        "measure their contention, and take minutes")
    if from_trace:
        from meshplan.calibration_trace import calibrate_from_trace

        calibrate_from_trace(from_trace, plan, cluster, output, name)
        return
    from clusters import load_cluster
    from executor.calibrate import (
        calibrate,
        calibration_phases,
        format_gemm_curve,
        write_cluster_yaml,
    )
    from meshplan import terminal

    _check_device(device)
    phases = calibration_phases(device)
    drawn = terminal.progress_enabled()
    if not drawn:  # no bar (stderr is not a terminal): say what runs and when each phase ends
        typer.echo(f"calibrating on {nproc} ranks ({'seconds' if quick else 'a few minutes'}; "
                   f"{len(phases)} phases)", err=True)

    def phase_done(name: str) -> None:
        bar.advance(note=name)
        if not drawn:
            typer.echo(f"  {bar.completed}/{len(phases)} {name}", err=True)

    with terminal.Progress(len(phases), f"calibrating on {nproc} ranks", enabled=drawn) as bar:
        cal = calibrate(nproc=nproc, quick=quick, device=device, on_phase=phase_done)
    path = write_cluster_yaml(cal, output, name or None)
    c = load_cluster(path)
    d = c.spec.device
    typer.echo(f"wrote {path} ({cal.provenance})")
    for k, v in d.peak_flops.items():
        typer.echo(f"  GEMM {k}: {v.value / 1e9:.1f} GFLOP/s per rank")
    e = d.efficiency
    typer.echo(f"  memory bandwidth: {d.memory_bandwidth.value / 1e9:.2f} GB/s; "
               f"kernel overhead: {e.kernel_overhead_s.value * 1e6:.1f} us")
    if e.memory_kernels is not None and e.attention is not None and e.gemm_half_flops is not None:
        typer.echo(f"  memory-bound kernels: {e.memory_kernels.value:.0%} of it; attention: "
                   f"{e.attention.value:.0%} of the fp32 GEMM rate; GEMM half-rate size "
                   f"{e.gemm_half_flops.value / 1e6:.2f} MFLOP")
    if cal.dropped:
        typer.echo(f"  not fitted per op (efficiency below the spec's minimum): {', '.join(cal.dropped)}")
    n = c.spec.node
    typer.echo(f"  collectives: step latency {n.intra_latency.value * 1e6:.1f} us, "
               f"bandwidth {n.intra_bandwidth.value / 1e9:.2f} GB/s")
    if cal.gemm_curve:
        typer.echo(format_gemm_curve(cal))


#: options of one mode only: a measurement of this machine, or a fit to a trace
MEASURE_ONLY = {"nproc": "--nproc", "quick": "--quick", "device": "--device"}
TRACE_ONLY = {"plan": "--plan", "cluster": "--cluster"}


def _refuse_unused(ctx: typer.Context, from_trace: bool) -> None:
    """Refuse an option the chosen mode ignores (``--plan`` / ``--cluster`` without
    ``--from-trace`` ran a 90 s measurement instead of the fit; ``--nproc``, ``--quick``,
    ``--device`` with it). Raises click's BadParameter naming the option."""
    from meshplan.commands.options import typed_on_line

    unused = typed_on_line(ctx, MEASURE_ONLY if from_trace else TRACE_ONLY)
    if unused:
        verb = "applies" if len(unused) == 1 else "apply"
        why = (f"{verb} only to a measurement of this machine; --from-trace fits a profiler "
               f"trace and measures nothing" if from_trace else
               f"{verb} only with --from-trace (a fit to a profiler trace); a measurement of "
               f"this machine takes no plan or cluster")
        raise typer.BadParameter(f"{' and '.join(unused)} {why}", param_hint=f"'{unused[0]}'")


def _check_device(device: str) -> None:
    """Refuse a ``--device`` the calibration cannot time on (before any rank starts):
    ``cpu``, or ``cuda`` / ``cuda:N`` with a CUDA build of torch that sees that GPU."""
    import torch

    kind, _, idx = device.partition(":")
    if kind not in ("cpu", "cuda") or (idx and not idx.isdigit()) or (kind == "cpu" and idx):
        raise typer.BadParameter(f"must be cpu or cuda[:N], got {device!r}", param_hint="'--device'")
    if kind == "cuda" and not torch.cuda.is_available():
        raise typer.BadParameter(f"{device!r}: this torch ({torch.__version__}) sees no CUDA device",
                                 param_hint="'--device'")
    if kind == "cuda" and idx and int(idx) >= torch.cuda.device_count():
        raise typer.BadParameter(f"{device!r}: this host has {torch.cuda.device_count()} CUDA device(s)",
                                 param_hint="'--device'")


def register(app: typer.Typer) -> None:
    """Add the ``calibrate`` command to ``app``."""
    app.command("calibrate")(calibrate_cmd)

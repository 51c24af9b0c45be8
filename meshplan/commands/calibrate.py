"""``meshplan calibrate [--nproc 2] --output FILE.yaml [--quick] [--name NAME]``: measure
this machine as the executor uses it (its own ops' GEMM rate, small-GEMM penalty,
memory-bound and attention kernel throughput and per-op overhead, GEMM rate per dtype,
memory bandwidth, collective alpha/beta on gloo ranks; on a GPU also its SM count and
the GEMM plateau of the wave model, printing the measured GEMM curve against the model's
at a sweep of shapes) and write a cluster YAML that
``--cluster FILE.yaml`` accepts everywhere. See ``executor.calibrate`` for the method;
measure on an otherwise idle machine (the load is recorded in the provenance)."""

from __future__ import annotations

import typer


def calibrate_cmd(
    output: str = typer.Option(..., "--output", "-o", help="Cluster YAML to write."),
    nproc: int = typer.Option(2, "--nproc", min=2, max=64,
                              help="Ranks for the collective timings (at most 64, executor.launch.MAX_LOCAL_RANKS)."),
    quick: bool = typer.Option(False, "--quick", help="Fewer sizes and repeats (seconds)."),
    name: str = typer.Option("", "--name", help="Cluster name (default: the file stem)."),
    device: str = typer.Option("cpu", "--device", help="cpu, or cuda to time GEMMs on the GPU."),
) -> None:
    """Measure this machine and write a cluster YAML with provenance."""
    from clusters import load_cluster
    from executor.calibrate import calibrate, format_gemm_curve, write_cluster_yaml

    cal = calibrate(nproc=nproc, quick=quick, device=device)
    path = write_cluster_yaml(cal, output, name or None)
    c = load_cluster(path)
    d = c.spec.device
    typer.echo(f"wrote {path} ({cal.provenance})")
    for k, v in d.peak_flops.items():
        typer.echo(f"  GEMM {k}: {v.value / 1e9:.1f} GFLOP/s per rank")
    e = d.efficiency
    typer.echo(f"  memory bandwidth: {d.memory_bandwidth.value / 1e9:.2f} GB/s; "
               f"kernel overhead: {e.kernel_overhead_s.value * 1e6:.1f} us")
    if e.memory_kernels is not None and e.attention is not None:
        typer.echo(f"  memory-bound kernels: {e.memory_kernels.value:.0%} of it; attention: "
                   f"{e.attention.value:.0%} of the fp32 GEMM rate; GEMM half-rate size "
                   f"{e.gemm_half_flops.value / 1e6:.2f} MFLOP")
    n = c.spec.node
    typer.echo(f"  collectives: step latency {n.intra_latency.value * 1e6:.1f} us, "
               f"bandwidth {n.intra_bandwidth.value / 1e9:.2f} GB/s")
    if cal.gemm_curve:
        typer.echo(format_gemm_curve(cal))


def register(app: typer.Typer) -> None:
    """Add the ``calibrate`` command to ``app``."""
    app.command("calibrate")(calibrate_cmd)

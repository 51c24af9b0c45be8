"""``meshplan demo [--trials N] [--seed S] [--output DIR] [--steps S] [--cluster FILE.yaml]
[--no-calibrate] [--no-validate]``: the main job end to end (``make demo``; see
:mod:`meshplan.demo`): tune llama2-7b on 4 x dgx-a100-80g, write ``reports/demo/``, then
validate a small plan on 2 local ranks. Exit code 0, 1 when the validation failed (the
report is still written), 2 for bad input (``meshplan.cli.main``)."""

from __future__ import annotations

import typer


def demo_cmd(
    trials: int = typer.Option(300, "--trials", help="Search trials."),
    seed: int = typer.Option(0, "--seed", help="Sampler seed."),
    output: str = typer.Option("reports/demo", "--output", help="Report directory (recreated)."),
    steps: int = typer.Option(5, "--steps", help="Measured steps of the validation."),
    cluster: str | None = typer.Option(
        None, "--cluster", help="Cluster YAML for the validation's prediction (no calibration)."),
    no_calibrate: bool = typer.Option(
        False, "--no-calibrate", help="Predict on the uncalibrated cpu-local spec, no measuring."),
    no_validate: bool = typer.Option(False, "--no-validate", help="Skip the 2-rank validation."),
) -> None:
    """Tune llama2-7b on 4 x DGX A100, write reports/demo/, validate a plan on 2 local ranks."""
    from meshplan.demo import run_demo

    code = run_demo(output, trials=trials, seed=seed, steps=steps, cluster=cluster,
                    calibrate=not no_calibrate, validate=not no_validate)
    if code:
        raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    """Add the ``demo`` command to ``app``."""
    app.command("demo")(demo_cmd)

"""``meshplan export PLAN.json --to megatron|torchtitan|deepspeed [--output FILE]``: write
what that framework takes to run the plan (Megatron-LM arguments, a torchtitan job TOML, a
DeepSpeed JSON config; ``meshplan.commands.export_targets`` lists the targets), with one
note per plan knob the target cannot express (as comments in the file where the format
has them, and always on stderr)."""

from __future__ import annotations

from enum import Enum
from pathlib import Path

import typer

from meshplan.commands import options as opt

#: the targets of ``meshplan.commands.export_targets.TARGETS`` (spelled here so that
#: ``meshplan --help`` imports nothing; tests/test_export.py checks that they agree)
Target = Enum("Target", {n: n for n in ("megatron", "torchtitan", "deepspeed")}, type=str)


def export_cmd(
    plan_file: str = typer.Argument(..., help="Plan JSON (meshplan.Plan)."),
    to: Target = typer.Option(..., "--to", help="Framework to export to."),
    output: str = typer.Option("", "--output", "-o", help="File to write (default: stdout)."),
) -> None:
    """Export a plan to Megatron-LM arguments, a torchtitan TOML or a DeepSpeed JSON."""
    from meshplan.commands.export_targets import export_plan
    from meshplan.plan import Plan

    plan = Plan.load(plan_file)
    out = export_plan(plan, to.value)
    for note in out.notes:
        typer.echo(f"note: {note}", err=True)
    if output:
        path = Path(output)
        opt.ensure_dir(path.parent)
        path.write_text(out.text)
        typer.echo(f"wrote {path} ({to.value}, {len(out.notes)} note(s))", err=True)
    else:
        typer.echo(out.text, nl=False)


def register(app: typer.Typer) -> None:
    """Add the ``export`` command to ``app``."""
    app.command("export")(export_cmd)

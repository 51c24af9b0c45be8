"""``meshplan report [--quick] [--output DIR] [--only NAME]``: run the registered
experiments, print each table and write CSV, Markdown, PNGs and a combined README.md.

An experiment that cannot run (a missing piece) or that fails is printed in red; after
all have run, the command raises ``ExperimentError`` (a ``ValueError``), so
``meshplan.cli.main`` prints ``error: ...`` naming the failed experiments and exits 2.
"""

from __future__ import annotations

import sys

import typer
from rich.console import Console
from rich.table import Table

ONLY_OPT = typer.Option(None, "--only", help="Run only this experiment (repeatable).")


def _console() -> Console:
    return Console(file=sys.stdout, width=None if sys.stdout.isatty() else 160)


def render(console: Console, rec) -> None:
    """Print one RunRecord: its table (rich) and notes, or its error."""
    from pandas.api.types import is_bool_dtype, is_numeric_dtype

    from experiments.tables import format_cell

    if rec.result is None:
        console.print(f"[bold red]{rec.name} failed:[/] {rec.error}")
        return
    res = rec.result
    table = Table(title=f"{res.title} [{rec.name}, {rec.seconds:.1f} s]")
    for col in res.table.columns:
        numeric = is_numeric_dtype(res.table[col]) and not is_bool_dtype(res.table[col])
        table.add_column(str(col), justify="right" if numeric else "left")
    for row in res.table.itertuples(index=False):
        table.add_row(*(format_cell(v, res.float_format) for v in row))
    console.print(table)
    for note in res.notes:
        console.print(f"  - {note}")
    console.print(f"  files: {', '.join(str(f) for f in rec.files)}")


def report_cmd(
    quick: bool = typer.Option(False, "--quick", help="Small sizes (seconds; what CI runs)."),
    output: str = typer.Option("reports/experiments", "--output",
                               help="Directory for CSV, Markdown, PNG and README.md."),
    only: list[str] | None = ONLY_OPT,
) -> None:
    """Run the experiments and write their tables and plots."""
    from experiments import ExperimentError, run_experiments
    from experiments.runner import select
    from meshplan import terminal

    console = _console()
    names = select(only or None)
    # on a terminal the bar shares the tables' console (rich keeps it below them); else stderr
    shared = console if console.is_terminal else None
    with terminal.Progress(len(names), "experiments", enabled=terminal.progress_enabled(),
                           console=shared) as bar:
        def done(rec) -> None:
            render(console, rec)
            bar.advance(note=f"{rec.name} {'failed' if rec.error else 'done'}")

        records = run_experiments(output, quick=quick, only=only or None, on_done=done)
    console.print(f"report: {output}/README.md")
    failed = [r for r in records if r.error]
    if failed:
        raise ExperimentError(
            f"{len(failed)} experiment(s) failed: "
            + "; ".join(f"{r.name}: {r.error}" for r in failed)
        )


def register(app: typer.Typer) -> None:
    """Add the ``report`` command to ``app``."""
    app.command("report")(report_cmd)

"""The output options every writing command shares: ``--force`` and ``--append``; the
checks of the paths they govern: ``meshplan.outputs``."""

from __future__ import annotations

import typer

FORCE = typer.Option(False, "--force", help="Replace output files that already exist.")
APPEND = typer.Option(False, "--append", help="Add a row to a CSV that already exists "
                                               "(one this command wrote: same columns).")

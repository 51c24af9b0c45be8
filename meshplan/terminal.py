"""Terminal output shared by the commands: tables that fit the terminal's width and one
rich progress bar helper (``calibrate``, ``report``, ``validate``, ``tune``).

The width is the terminal's (``shutil.get_terminal_size``: ``$COLUMNS``, else the terminal
of stdout, else 80 columns); a rich table wraps its cells to fit it. The progress bar
draws on stderr (stdout stays the command's output: text, JSON, CSV), only when stderr is
a terminal and the command was not asked for ``--json``; its columns are sized so a bar
with its description, count and elapsed time fits 80 columns.
"""

from __future__ import annotations

import io
import shutil
import sys
import warnings
from typing import Any

#: the width of a terminal that says nothing (and of a pipe)
DEFAULT_WIDTH = 80
#: progress bar: characters of the description (longer ones end in an ellipsis) and of the bar
DESCRIPTION_WIDTH = 34
BAR_WIDTH = 20


def echo(message: str = "", err: bool = False) -> None:
    """Print ``message`` and a newline to stdout (``err``: stderr), flushed: what the
    library modules say while a command runs (``typer.echo``'s output, without typer)."""
    stream = sys.stderr if err else sys.stdout
    stream.write(f"{message}\n")
    stream.flush()


def width() -> int:
    """Columns of the terminal (``$COLUMNS`` first), :data:`DEFAULT_WIDTH` when unknown."""
    return max(20, shutil.get_terminal_size((DEFAULT_WIDTH, 24)).columns)


def render(renderable: Any, columns: int | None = None) -> str:
    """``renderable`` (a rich Table, text, ...) as plain text at most ``columns`` wide
    (default :func:`width`): rich wraps the table's cells to fit."""
    from rich.console import Console

    con = Console(file=io.StringIO(), width=columns or width(), record=True, color_system=None)
    con.print(renderable)
    return con.export_text().rstrip("\n")


def progress_enabled(as_json: bool = False, stream: Any = None) -> bool:
    """True when a progress bar should draw: not ``as_json`` and ``stream`` (default
    stderr) is a terminal."""
    s = sys.stderr if stream is None else stream
    return not as_json and bool(getattr(s, "isatty", lambda: False)())


class Progress:
    """A rich progress bar over ``total`` steps: ``with Progress(n, "label") as p:
    p.advance(note="...")``. ``enabled=False`` draws nothing (the calls still count);
    ``console``: a rich Console to draw on (default: stderr). The description column is
    :data:`DESCRIPTION_WIDTH` characters (ellipsis beyond), the bar :data:`BAR_WIDTH`."""

    def __init__(self, total: int, description: str, enabled: bool = True, done: int = 0,
                 console: Any = None) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
        from rich.progress import Progress as _Progress
        from rich.table import Column

        self.completed = done
        self.progress = _Progress(
            TextColumn("{task.description}", table_column=Column(
                width=DESCRIPTION_WIDTH, no_wrap=True, overflow="ellipsis")),
            BarColumn(bar_width=BAR_WIDTH), MofNCompleteColumn(), TimeElapsedColumn(),
            console=console or Console(stderr=True), disable=not enabled, transient=False)
        self.task = self.progress.add_task(description, total=total, completed=done)

    def __enter__(self) -> Progress:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.__exit__(*exc)

    def advance(self, n: int = 1, note: str | None = None) -> None:
        """``n`` more steps done; ``note`` replaces the description."""
        self.completed += n
        kw = {"description": note} if note is not None else {}
        self.progress.update(self.task, advance=n, **kw)


def reading(read: Any, as_json: bool) -> tuple[Any, list[warnings.WarningMessage]]:
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
        replay(caught)
    if err is not None:
        raise err
    return out, (list(caught) if as_json else [])


def replay(caught: list[warnings.WarningMessage]) -> None:
    """Show recorded warnings as they would have shown (one ``warning:`` line each, cli).
    Call it outside ``catch_warnings(record=True)``, which would record them again."""
    for w in caught:
        warnings.showwarning(w.message, w.category, w.filename, w.lineno)

"""The ``meshplan`` command line (typer). Each command group lives in its own module under
``meshplan.commands`` and exposes ``register(app)``; this file only wires them together and
turns bad input into a one-line error with exit code 2."""

from __future__ import annotations

import importlib
import sys

import typer

from meshplan import __version__

app = typer.Typer(
    name="meshplan",
    help="Sharding completion, reshard planning, pipeline simulation and strategy search.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# One entry per command module; each defines register(app: typer.Typer) -> None. The CLI is
# the composition root: it loads command modules by name, so a package above meshplan in
# DESIGN.md's dependency order (``experiments``, which imports everything) can add its
# command (``report``) without meshplan importing it.
COMMAND_MODULES = [
    "meshplan.commands.clusters",
    "meshplan.commands.program",
    "meshplan.commands.simulate",
    "meshplan.commands.cost",
    "experiments.command",
    "meshplan.commands.complete",
    "meshplan.commands.tune",
    "meshplan.commands.calibrate",
    "meshplan.commands.validate",
]


def _version(value: bool) -> None:
    if value:
        typer.echo(f"meshplan {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    """meshplan command line."""


for _name in COMMAND_MODULES:
    importlib.import_module(_name).register(app)


def _click_exceptions():
    """click's exceptions module: typer >= 0.2x vendors click as ``typer._click``."""
    try:
        from typer._click import exceptions
    except ImportError:  # older typer depends on the click distribution
        from click import exceptions
    return exceptions


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script. Bad input (any ``ValueError``, ``FileNotFoundError``
    or ``KeyError`` raised by meshplan) prints ``error: <message>`` and exits with 2."""
    try:
        app(args=argv, standalone_mode=False)
    except typer.Exit as e:
        return e.exit_code
    except SystemExit as e:  # click usage errors already printed
        return int(e.code or 0)
    except (ValueError, FileNotFoundError, KeyError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        typer.echo(f"error: {msg}", err=True)
        return 2
    except OSError as e:  # an output path that is a directory, unwritable, a full disk, ...
        where = f": {e.filename}" if e.filename else ""
        typer.echo(f"error: {e.strerror or e}{where}", err=True)
        return 2
    except Exception as e:  # click usage errors (bad option, missing argument, range)
        click_exc = _click_exceptions()
        if isinstance(e, click_exc.ClickException):
            e.show()
            return 2
        if isinstance(e, getattr(click_exc, "Abort", typer.Abort)):
            return 1
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())

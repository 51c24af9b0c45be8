"""The ``meshplan`` command line (typer). Each command group lives in its own module under
``meshplan.commands`` as top-level functions, and the module's ``register(app)`` attaches
them; this file only wires them together and turns bad input into a one-line error with
exit code 2.

Command modules import numpy, pandas, pydantic and the meshplan packages inside their
command functions, so that ``meshplan --help`` imports little more than typer."""

from __future__ import annotations

import importlib
import sys
import warnings
from typing import Any

import typer
from typer.core import TyperCommand, TyperGroup, TyperOption

from meshplan import __version__, help_format
from meshplan.commands import repeated
from meshplan.commands.click_compat import click_exceptions
from meshplan.errors import MeshplanError

# One entry per command module; each defines register(app: typer.Typer) -> None.
COMMAND_MODULES = [
    "meshplan.commands.clusters",
    "meshplan.commands.program",
    "meshplan.commands.simulate",
    "meshplan.commands.cost",
    "meshplan.commands.compare",
    "meshplan.commands.complete",
    "meshplan.commands.tune",
    "meshplan.commands.calibrate",
    "meshplan.commands.validate",
    "meshplan.commands.export",
    "meshplan.commands.demo",
]
# Commands of packages above meshplan in docs/design.md's dependency order (``experiments``
# imports everything, pandas included): the CLI is the composition root and loads them by
# name, on first use (``meshplan --help`` lists them with this one-line help).
LAZY_COMMANDS = {
    "report": ("experiments.command", "Run the experiments and write their tables and plots."),
}


class _LazyCommand(TyperCommand):
    """Stands for a command of :data:`LAZY_COMMANDS` in the help listing; invoking it imports
    its module and hands over to the real command."""

    def __init__(self, name: str, module: str, help: str) -> None:
        super().__init__(name, help=help)
        self.module = module
        self.command_name = name

    def load(self) -> Any:
        """The real click command: the module's ``register`` run on a scratch app."""
        scratch = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
        importlib.import_module(self.module).register(scratch)
        scratch.callback()(lambda: None)  # a group, whatever the module registers
        return typer.main.get_group(scratch).commands[self.command_name]

    def make_context(self, info_name: Any, args: list[str], parent: Any = None, **extra: Any) -> Any:
        """The real command's context (the group then invokes the real command)."""
        return self.load().make_context(info_name, args, parent=parent, **extra)


class _Root(TyperGroup):
    """The root group: the registered commands, then :data:`LAZY_COMMANDS`."""

    def list_commands(self, ctx: Any) -> list[str]:
        """Registered commands in order, then the lazy ones."""
        names = super().list_commands(ctx)
        return names + [n for n in LAZY_COMMANDS if n not in names]

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        """A registered command, or a stand-in for a lazy one."""
        cmd = super().get_command(ctx, cmd_name)
        if cmd is None and cmd_name in LAZY_COMMANDS:
            module, short_help = LAZY_COMMANDS[cmd_name]
            cmd = _LazyCommand(cmd_name, module, short_help)
        return cmd


def _flag_type(display: Any) -> Any:
    """Wrap ``TyperOption.display_type_rich`` so that an on/off flag (``--json``,
    ``--sequence-parallel``, ``--help``) shows no value type in help: typer 0.29 prints
    ``<bool>`` beside it, which reads as if the flag took a value."""

    def display_type_rich(self: Any, ctx: Any) -> Any:
        if getattr(self, "is_flag", False) and self.metavar is None:
            return None
        return display(self, ctx)

    display_type_rich.__wrapped__ = display  # type: ignore[attr-defined]
    return display_type_rich


if hasattr(TyperOption, "display_type_rich") and not hasattr(
        TyperOption.display_type_rich, "__wrapped__"):
    TyperOption.display_type_rich = _flag_type(TyperOption.display_type_rich)  # type: ignore[method-assign]

help_format.install()  # option names whole at 80 columns (meshplan.help_format)

app = typer.Typer(
    name="meshplan",
    cls=_Root,
    help="Sharding completion, reshard planning, pipeline simulation and strategy search.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"meshplan {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    """meshplan command line."""


def reflow_help(text: str) -> str:
    """``text`` (a command's docstring) with each paragraph on one line: typer 0.29's rich
    help keeps the single line breaks of every paragraph after the first, so a docstring
    wrapped at the source's width printed broken mid-sentence."""
    import inspect

    return "\n\n".join(" ".join(p.split()) for p in inspect.cleandoc(text).split("\n\n"))


def _reflow_commands(t: typer.Typer) -> None:
    """Every command's help of ``t`` and of its sub-groups reflowed (:func:`reflow_help`)."""
    for info in t.registered_commands:
        text = info.help or (info.callback.__doc__ if info.callback else None)
        if text:
            info.help = reflow_help(text)
    for group in t.registered_groups:
        if group.typer_instance is not None:
            _reflow_commands(group.typer_instance)


repeated.install()  # an option typed twice with two values is refused, never the last kept
for _name in COMMAND_MODULES:
    importlib.import_module(_name).register(app)
_reflow_commands(app)


#: exit code of an interrupted command (typer: KeyboardInterrupt -> Exit(130), 128 + SIGINT)
INTERRUPTED = 130


def _is_run_failure(e: BaseException) -> bool:
    """True for an ``executor`` error of a run (a rank that died or hung: an ExecutorError
    that is also a RuntimeError); the executor is loaded only when a command ran it, so its
    module is looked up, not imported."""
    errors = sys.modules.get("executor.errors")
    return errors is not None and isinstance(e, errors.ExecutorError) and isinstance(e, RuntimeError)


#: Longest error message printed (characters); a message quoting a huge input is cut.
MAX_ERROR_CHARS = 2000


def _one_line(e: BaseException) -> str:
    """The message of ``e`` on one line (a KeyError's key without quotes), cut at
    :data:`MAX_ERROR_CHARS`."""
    msg = e.args[0] if isinstance(e, KeyError) and e.args else e
    text = " ".join(str(msg).split()) or type(e).__name__
    return text if len(text) <= MAX_ERROR_CHARS else text[:MAX_ERROR_CHARS] + " ..."


def _once_per_run(show: Any) -> Any:
    """``warnings.showwarning`` that shows each (category, message) once per command: a
    config.json warning re-raised for every plan of ``compare`` or trial of ``tune``
    printed once per plan."""
    seen: set[tuple[type, str]] = set()

    def show_once(message: Any, category: type[Warning], filename: str, lineno: int,
                  file: Any = None, line: Any = None) -> None:
        key = (category, str(message))
        if key not in seen:
            seen.add(key)
            show(message, category, filename, lineno, file, line)

    show_once.__wrapped__ = show  # type: ignore[attr-defined]
    return show_once


def _warning_line(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                  line: str | None = None) -> str:
    """A warning as one line, ``warning: <message>`` (no source location)."""
    return f"warning: {' '.join(str(message).split())}\n"


def main(argv: list[str] | None = None, prog_name: str | None = None) -> int:
    """Entry point of the console script: :func:`_main`, each warning shown once per
    command (:func:`_once_per_run`; the previous ``warnings.showwarning`` is restored)."""
    before = warnings.showwarning
    warnings.showwarning = _once_per_run(before)
    try:
        return _main(argv, prog_name)
    finally:
        warnings.showwarning = before


def _main(argv: list[str] | None = None, prog_name: str | None = None) -> int:
    """Entry point of the console script (``argv``: the arguments after the program name,
    default ``sys.argv[1:]``; ``prog_name``: the name usage lines show). Bad input (a
    :class:`~meshplan.errors.MeshplanError`, the root of every error meshplan raises on bad
    input, or an option value outside its choices or range, an unknown option or a missing
    argument: click's message) prints ``error: <message>`` and exits with 2; so does a file
    named that is absent, unreadable or unwritable (an ``OSError``). A local run that failed
    (a rank died, was killed or hung: ``executor``'s RankFailure / LaunchTimeout) prints
    ``error: <message>`` and exits with 1. Any other exception (a bare ValueError or KeyError
    from inside) is a bug: it is raised, with its traceback. Messages are always one line; so are warnings
    (``warning: <message>``, e.g. a config.json key known but not modelled)."""
    warnings.formatwarning = _warning_line
    try:
        # standalone_mode=False: click returns a command's typer.Exit code instead of exiting
        rc = app(args=argv, prog_name=prog_name, standalone_mode=False)
        if rc == INTERRUPTED:  # typer's code for Ctrl-C (KeyboardInterrupt)
            typer.echo("interrupted: a tune with --output or --storage keeps every finished "
                       "trial; run the same command again to resume", err=True)
        if isinstance(rc, int) and not isinstance(rc, bool) and rc:
            return rc
    except typer.Exit as e:
        return e.exit_code
    except SystemExit as e:  # click usage errors already printed
        return int(e.code or 0) if not isinstance(e.code, str) else 2
    except MeshplanError as e:  # bad input; or a run that failed (exit 1)
        typer.echo(f"error: {_one_line(e)}", err=True)
        return 1 if _is_run_failure(e) else 2
    except FileNotFoundError as e:  # a file the user named that is not there
        typer.echo(f"error: {_one_line(e)}", err=True)
        return 2
    except OSError as e:  # an output path that is a directory, unwritable, a full disk, ...
        where = f": {e.filename}" if e.filename else ""
        typer.echo(f"error: {' '.join(str(e.strerror or e).split())}{where}", err=True)
        return 2
    except Exception as e:  # click usage errors (bad option, missing argument, range)
        click_exc = click_exceptions()
        if isinstance(e, click_exc.BadParameter):  # a value outside a choice or a range
            typer.echo(f"error: {e.format_message().replace('Value error, ', '')}", err=True)
            return 2
        no_args = getattr(click_exc, "NoArgsIsHelpError", ())
        if no_args and isinstance(e, no_args):  # `meshplan` alone: the help is the answer
            return 2
        if isinstance(e, click_exc.UsageError):  # an unknown option, a missing argument
            where = f"; see '{e.ctx.command_path} --help'" if e.ctx is not None else ""
            typer.echo(f"error: {_one_line(e.format_message()).rstrip('.')}{where}", err=True)
            return 2
        if isinstance(e, click_exc.ClickException):
            e.show()
            return 2
        if isinstance(e, getattr(click_exc, "Abort", typer.Abort)):
            return 1
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())

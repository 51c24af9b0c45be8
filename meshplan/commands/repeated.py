"""Options typed twice with different values are refused: click keeps the last one
silently (``--dp 2 --dp 8`` costed dp 8; ``--model A --model B`` costed B), so a command
line that says two things ran one of them without a word.

:func:`repeated_option` scans a command's arguments (before ``--``) against its click
parameters: every option that takes one value (not ``multiple``, not a counter) may appear
any number of times with one value, by any of its spellings (``--tp 2
--tensor-model-parallel-size 2`` is one setting); an on/off pair (``--sequence-parallel
--no-sequence-parallel``) may not be given both ways. :func:`install` makes every typer
command of the CLI run it before parsing."""

from __future__ import annotations

from typing import Any


def _spellings(cmd: Any) -> dict[str, tuple[Any, str]]:
    """Every option string of ``cmd`` -> (its parameter, the value it stands for: ``None``
    for an option that takes a value, ``"on"`` / ``"off"`` for a flag's two spellings)."""
    out: dict[str, tuple[Any, str]] = {}
    for p in getattr(cmd, "params", ()):
        if getattr(p, "param_type_name", "") != "option" or p.multiple or getattr(p, "count", False):
            continue
        flag = bool(getattr(p, "is_flag", False))
        for o in p.opts:
            out[o] = (p, "on" if flag else None)
        for o in getattr(p, "secondary_opts", ()):
            out[o] = (p, "off")
    return out


def repeated_option(cmd: Any, args: list[str] | tuple[str, ...]) -> str | None:
    """The message for the first option of ``cmd`` given twice with different values in
    ``args`` (naming both, as typed); None when every option is given once or
    consistently."""
    table = _spellings(cmd)
    seen: dict[str, tuple[str, str]] = {}
    i = 0
    while i < len(args):
        tok = args[i]
        if tok == "--":
            break
        flag, eq, val = tok.partition("=")
        hit = table.get(flag)
        if hit is None:
            i += 1
            continue
        param, fixed = hit
        if fixed is not None:
            val = fixed
        elif not eq:
            val = args[i + 1] if i + 1 < len(args) else ""
            i += 1
        i += 1
        first = seen.setdefault(param.name, (flag, val))
        if first[1] != val:
            shown = (f"{first[0]} {first[1]}".strip() if fixed is None else first[0],
                     f"{flag} {val}".strip() if fixed is None else flag)
            return (f"{shown[0]} and {shown[1]}: the option is given twice with different values "
                    f"(the last would win in silence); give it once")
    return None


def install() -> None:
    """Make ``TyperCommand.parse_args`` (every command of the CLI, the strategy commands
    included) refuse a repeated option (:func:`repeated_option`) with click's UsageError."""
    from typer.core import TyperCommand

    from meshplan.commands.click_compat import click_exceptions

    parse = TyperCommand.parse_args
    if getattr(parse, "__wrapped__", None) is not None:
        return

    def parse_args(self: Any, ctx: Any, args: list[str]) -> list[str]:
        msg = repeated_option(self, args)
        if msg:
            raise click_exceptions().UsageError(msg, ctx)
        return parse(self, ctx, args)

    parse_args.__wrapped__ = parse  # type: ignore[attr-defined]
    TyperCommand.parse_args = parse_args  # type: ignore[method-assign]

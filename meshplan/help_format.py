"""Command help that reads at 80 columns (issue 40 item 3).

typer prints each command's options as a rich table: every spelling of an option joined
with commas in one name column, the value type (a closed choice list spelled out) in the
next, the help text last. meshplan's options carry Megatron-LM's spellings beside the short
ones (``--tp,--mp,--tensor-model-parallel-size``), so at 80 columns rich shrank the name
column and cut names (``--global-batch…``). This module changes only how the table is
drawn, never what the command parses:

- the name column shows an option's first long spelling (its canonical one, the Strategy
  field's: ``meshplan.flags.FLAGS``) and its short one; the other spellings are
  named at the end of the help text (``Also: --mp, --tensor-model-parallel-size``);
- an on/off pair (``--sequence-parallel/--no-sequence-parallel``) shows its on switch,
  the off one named in the help (``Off: --no-sequence-parallel``);
- a choice list longer than :data:`MAX_CHOICES_CHARS` shows as ``<choice>`` with the
  choices at the end of the help text;
- a range's upper bound of :data:`HIDDEN_MAX` or more is not shown (``[x>=1]``);
- the name columns never wrap or shrink (rich narrows the help column instead).

:func:`install` wraps ``typer.rich_utils._print_options_panel`` (typer 0.29's rich help;
with an older typer that lacks it nothing changes). ``tests/meshplan/test_cli_help_width.py``
checks every command at ``COLUMNS=80``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

#: a choice list wider than this (characters, ``a|b|c``) goes into the help text
MAX_CHOICES_CHARS = 14
#: a range's upper bound from this on is left out of the value type (``[x>=1]``, not
#: ``[1<=x<=16777216]``): it guards against absurd input, not a choice a user makes
HIDDEN_MAX = 10_000


def _choices(param: Any) -> list[str]:
    """The choices of a Choice-typed option (empty for any other type): typer 0.29 keeps
    them on ``type_descriptor``, click (older typer) on ``type``."""
    desc = getattr(param, "type_descriptor", None) or getattr(param, "type", None)
    if desc is None or (hasattr(desc, "is_choice") and not desc.is_choice):
        return []
    return [str(getattr(c, "value", c)) for c in getattr(desc, "choices", None) or ()]


@contextmanager
def narrow(params: list[Any]) -> Iterator[None]:
    """Within the block, each option of ``params`` shows only its first long spelling (and
    its short one) with the others appended to its help, and a long choice list as
    ``<choice>`` with the choices in its help; everything is restored on exit, so parsing
    never sees the change."""
    saved = []
    for p in params:
        if getattr(p, "param_type_name", "") != "option":
            continue
        longs = [o for o in p.opts if o.startswith("--")]
        shorts = [o for o in p.opts if not o.startswith("--")]
        extra = []
        choices = _choices(p)
        metavar = p.metavar
        if choices and p.metavar is None and len("|".join(choices)) > MAX_CHOICES_CHARS:
            if getattr(p, "show_choices", True):
                extra.append(f"Choices: {', '.join(choices)}.")
            metavar = "<choice>"
        off = list(getattr(p, "secondary_opts", None) or ())
        if off:  # an on/off pair: one name column, the off switch named in the help
            extra.append(f"Off: {', '.join(off)}")
        if len(longs) > 1:  # no full stop after a name: its line holds the name alone
            extra.append(f"Also: {', '.join(longs[1:])}")
        high = getattr(p, "max", None)
        high = high if isinstance(high, (int, float)) and high >= HIDDEN_MAX else None
        if not extra and metavar is p.metavar and high is None:
            continue
        saved.append((p, p.opts, p.secondary_opts, p.help, p.metavar, getattr(p, "max", None)))
        p.opts = longs[:1] + shorts if longs else p.opts
        p.secondary_opts = []
        p.help = " ".join([p.help or "", *extra]).strip()
        p.metavar = metavar
        if high is not None:
            p.max = None
    try:
        yield
    finally:
        for p, opts, secondary, help_text, metavar, high in saved:
            p.opts, p.secondary_opts, p.help, p.metavar = opts, secondary, help_text, metavar
            if high is not None:
                p.max = high


#: the help column's width when the panel has room: the value type gives way to it first
HELP_WIDTH = 40


def _parts(cell: Any) -> list[Any]:
    """The renderables of a cell: typer draws the help as rich ``Columns`` (the text, the
    default, ``[required]``), laid out one after the other."""
    return list(getattr(cell, "renderables", None) or [cell])


def _span(console: Any, cells: list[Any]) -> tuple[int, int]:
    """(widest unbreakable word, widest line) over ``cells`` (rich's Measurement)."""
    from rich.measure import Measurement

    spans = [Measurement.get(console, console.options, p) for c in cells for p in _parts(c)]
    return max((m.minimum for m in spans), default=0), max((m.maximum for m in spans), default=0)


def _fold(cells: list[Any]) -> None:
    """Let the rich Text of ``cells`` fold a word too long for the column instead of
    cutting it with an ellipsis."""
    for c in cells:
        for p in _parts(c):
            if hasattr(p, "overflow"):
                p.overflow = "fold"


def column_widths(names: int, type_span: tuple[int, int], help_span: tuple[int, int],
                  room: int) -> tuple[int, int]:
    """(value type, help) widths of an options table whose name columns take ``names``
    characters of ``room``. In order: the type column gets its widest word (a type is never
    broken while it has room), the help column its widest word (an alias named in it is not
    cut) and, room permitting, :data:`HELP_WIDTH`; the type column takes what is left, up
    to its widest line, and the help column the rest."""
    rest = room - names
    t_min, t_max = type_span
    h_min, h_max = help_span
    type_w = min(t_max, max(t_min, rest - max(h_min, min(HELP_WIDTH, h_max))))
    type_w = max(0, min(type_w, rest - 1))
    return type_w, rest - type_w


def _stack_type(cols: list[list[Any]], names: list[int], type_span: tuple[int, int],
                help_span: tuple[int, int], room: int) -> bool:
    """Whether the value type goes under the option's name (in the widest name column)
    rather than into a column of its own: when the names are long (Megatron-LM's
    ``--num-layers-per-virtual-pipeline-stage``) the type column would squeeze the help
    below its widest word or :data:`HELP_WIDTH`, and the type fits under the name."""
    rest = room - sum(names)
    want = max(help_span[0], min(HELP_WIDTH, help_span[1]))
    return rest - type_span[1] < want and max(names, default=0) >= type_span[1]


class _Relayout:
    """A stand-in console for one options panel: before printing it, typer's table is
    rebuilt without its empty columns, with name columns that never wrap and the widths of
    :func:`column_widths` for the value type and the help (which folds a word only when
    even its widest word has no room)."""

    def __init__(self, console: Any) -> None:
        self._console = console

    def print(self, panel: Any, *args: Any, **kwargs: Any) -> Any:
        table = getattr(panel, "renderable", None)
        if getattr(table, "columns", None):
            panel.renderable = self.relayout(table)
        return self._console.print(panel, *args, **kwargs)

    def relayout(self, table: Any) -> Any:
        """``table`` (typer's: name columns, value type, help) as a new rich Table."""
        from rich.table import Table

        con = self._console
        cols = [list(c.cells) for c in table.columns]
        cols = [c for c in cols[:-2] if _span(con, c)[1] > 0] + cols[-2:]
        names = [_span(con, c)[1] for c in cols[:-2]]
        pad = table.padding[1] + table.padding[3]
        room = con.width - 4 - pad * (len(cols) - 1)  # the panel's border and padding
        types, helps = _span(con, cols[-2]), _span(con, cols[-1])
        if _stack_type(cols, names, types, helps, room):
            from rich.console import Group

            k = names.index(max(names))
            cols[k] = [Group(n, t) if _span(con, [t])[1] else n for n, t in zip(cols[k], cols[-2], strict=True)]
            del cols[-2]
            room += pad
            help_w = room - sum(names)
            type_w = None
        else:
            type_w, help_w = column_widths(sum(names), types, helps, room)
        out = Table(highlight=True, show_header=False, expand=True, box=table.box,
                    padding=table.padding, pad_edge=table.pad_edge, show_lines=table.show_lines,
                    leading=table.leading, border_style=table.border_style,
                    row_styles=table.row_styles)
        _fold(cols[-1])
        for w in names:
            out.add_column(width=w, no_wrap=True)
        if type_w is not None:
            out.add_column(width=type_w, overflow="fold")
        out.add_column(width=help_w, overflow="fold")
        for row in zip(*cols, strict=True):
            out.add_row(*row)
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self._console, name)


def narrow_panel(print_panel: Callable[..., None]) -> Callable[..., None]:
    """``typer.rich_utils._print_options_panel`` drawn with :func:`narrow` names and
    :class:`_Relayout` columns."""

    def print_options_panel(*, name: str, params: list[Any], ctx: Any, markup_mode: Any,
                            console: Any) -> None:
        with narrow(params):
            print_panel(name=name, params=params, ctx=ctx, markup_mode=markup_mode,
                        console=_Relayout(console))

    print_options_panel.__wrapped__ = print_panel  # type: ignore[attr-defined]
    return print_options_panel


def _install_panel() -> None:
    """Wrap typer's options panel (:func:`narrow_panel`) once; a typer without
    ``rich_utils._print_options_panel`` (or without rich) is left as it is."""
    try:
        from typer import rich_utils
    except ImportError:  # typer without rich: click's plain help
        return
    panel = getattr(rich_utils, "_print_options_panel", None)
    if panel is not None and not hasattr(panel, "__wrapped__"):
        rich_utils._print_options_panel = narrow_panel(panel)


def install() -> None:
    """Make every typer command's and group's ``format_help`` wrap the options panel
    (:func:`_install_panel`) before it draws: ``typer.rich_utils`` (which imports rich) is
    loaded only when a help is printed, so a command that prints none starts as fast."""
    from typer.core import TyperCommand, TyperGroup

    for cls in (TyperCommand, TyperGroup):
        original = cls.format_help
        if hasattr(original, "__wrapped__"):
            continue

        def format_help(self: Any, ctx: Any, formatter: Any, _original: Any = original) -> Any:
            _install_panel()
            return _original(self, ctx, formatter)

        format_help.__wrapped__ = original  # type: ignore[attr-defined]
        cls.format_help = format_help  # type: ignore[method-assign]

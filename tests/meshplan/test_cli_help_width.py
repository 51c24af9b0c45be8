"""``COLUMNS=80 meshplan <cmd> --help`` shows every option name whole, for every command
(issue 40 item 3; ``meshplan.help_format``). The commands are walked from the typer app
itself, so an option or a command added later is covered without editing this test."""

from __future__ import annotations

import re

import pytest
import typer
from typer.core import TyperGroup

from meshplan import help_format
from meshplan.cli import app, main

WIDTH = 80


def _commands() -> list[tuple[tuple[str, ...], object]]:
    """(path, command) of every leaf command of the app, lazy ones (report) loaded."""
    from typer._click.core import Context

    out = []

    def walk(cmd: object, path: tuple[str, ...]) -> None:
        if isinstance(cmd, TyperGroup):
            ctx = Context(cmd)
            for name in cmd.list_commands(ctx):
                sub = cmd.get_command(ctx, name)
                walk(sub.load() if hasattr(sub, "load") else sub, (*path, name))
        else:
            out.append((path, cmd))

    walk(typer.main.get_group(app), ())
    return out


COMMANDS = _commands()


def _help(capsys, monkeypatch, path: tuple[str, ...]) -> str:
    monkeypatch.setenv("COLUMNS", str(WIDTH))
    assert main([*path, "--help"]) == 0
    return capsys.readouterr().out


def test_every_command_is_walked():
    names = {" ".join(p) for p, _ in COMMANDS}
    assert {"cost", "tune", "export", "compare", "report", "clusters show", "program show"} <= names
    assert len(names) >= 16


@pytest.mark.parametrize("path", [p for p, _ in COMMANDS], ids=[" ".join(p) for p, _ in COMMANDS])
def test_help_fits_80_columns_and_names_every_option_whole(path, capsys, monkeypatch):
    text = _help(capsys, monkeypatch, path)
    lines = text.splitlines()
    assert max(len(ln) for ln in lines) <= WIDTH, "a help line is wider than the terminal"
    assert "…" not in text, "rich cut something with an ellipsis"
    cmd = dict(COMMANDS)[path]
    for param in cmd.params:
        if param.param_type_name != "option" or getattr(param, "hidden", False):
            continue
        for name in (*param.opts, *getattr(param, "secondary_opts", ())):
            hit = re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", text)
            assert hit, f"{' '.join(path)} --help at {WIDTH} columns does not show {name} whole"


def test_the_name_column_shows_the_canonical_spelling_and_the_help_its_aliases(capsys, monkeypatch):
    text = _help(capsys, monkeypatch, ("tune",))
    lines = text.splitlines()
    k = next(i for i, ln in enumerate(lines) if re.match(r"│ +--tp\b", ln))
    col = lines[k].index("Pin the tensor-parallel degree")  # where the help column starts
    names_end = lines[k].index("<int")  # the value type column follows the names
    help_lines = [lines[k][col:]]
    for ln in lines[k + 1:]:
        if not ln[:names_end].strip("│ "):  # a continuation line: no name in the name columns
            help_lines.append(ln[col:])
        else:
            break
    helptext = " ".join(" ".join(h.strip("│ ") for h in help_lines).split())
    assert helptext == "Pin the tensor-parallel degree. Also: --mp, --tensor-model-parallel-size"
    panels = re.findall(r"╭─ (.+?) ─", text)
    assert panels[:2] == ["Options", "Model and cluster"] and "Megatron-LM arguments (translated)" in panels
    assert len(text.splitlines()) < 300  # was 434 lines with 34 names cut


def test_help_formatting_leaves_parsing_alone(capsys, monkeypatch):
    """The aliases hidden from the name column still parse, after a help was drawn."""
    _help(capsys, monkeypatch, ("cost",))
    rc = main(["cost", "--model", "llama2-7b", "--cluster", "dgx-a100-80g", "--layers", "2",
               "--tensor-model-parallel-size", "2", "--global-batch-size", "8", "--seq-length", "256",
               "--sequence-parallel", "--json"])
    out = capsys.readouterr().out
    assert rc == 0 and '"tp": 2' in out


def test_column_widths_give_the_help_its_widest_word_before_the_type_its_widest_line():
    # room 53 after the names: the type's widest line (28) would leave the help 25 < 38;
    # the type keeps its widest word (15), the help gets the rest (38, its widest word)
    assert help_format.column_widths(19, (15, 28), (38, 300), 72) == (15, 38)
    # plenty of room: the type gets its whole line, the help the rest
    assert help_format.column_widths(10, (6, 12), (10, 300), 72) == (12, 50)
    # the type's widest word comes first when both cannot have theirs
    assert help_format.column_widths(39, (13, 20), (33, 300), 72) == (13, 20)

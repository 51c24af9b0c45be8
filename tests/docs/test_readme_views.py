"""The guide "Compare plans, and read them as DataFrames" (docs/how-to/compare-plans.md,
moved there from the README's tour by issue 40; issue 20 items 6 and 8): every command
and Python block there runs, in order, in a scratch directory, and the table it shows is
what ``meshplan compare`` prints."""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

from meshplan.cli import main

PAGE = Path(__file__).resolve().parents[2] / "docs" / "how-to" / "compare-plans.md"
pytestmark = pytest.mark.slow


def section() -> str:
    """The page's text from "## Compare plans" to its end (the pandas views included)."""
    text = PAGE.read_text()
    return text[text.index("## Compare plans"):]


def blocks(text: str) -> list[tuple[str, str]]:
    """(language, body) of each fenced block, in order."""
    return re.findall(r"```(\w+)\n(.*?)```", text, flags=re.S)


def commands(body: str) -> list[list[str]]:
    """The ``meshplan`` command lines of a bash block (continuations joined, comments
    dropped), as argv after the program name."""
    joined = re.sub(r"\\\n\s*", " ", body)
    out = []
    for line in joined.splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            argv = shlex.split(line)
            assert argv[0] == "meshplan", line
            out.append(argv[1:])
    return out


def test_the_sections_exist_and_name_the_pandas_views():
    text = section()
    assert "## pandas views" in text
    assert "StepResult.to_frame()" in text and "TuneResult.to_dataframe()" in text
    kinds = [k for k, _ in blocks(text)]
    assert kinds.count("bash") == 3 and kinds.count("python") == 2


def test_every_command_and_snippet_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "80")
    shown = None
    outputs: list[str] = []
    ran = 0
    for kind, body in blocks(section()):
        if kind == "text":
            shown = body
        elif kind == "bash":
            for argv in commands(body):
                assert main(argv) == 0, argv
                outputs.append(capsys.readouterr().out)
                ran += 1
        elif kind == "python":
            buf = io.StringIO()
            with contextlib.redirect_stdout(buf):
                exec(compile(body, "docs/how-to/compare-plans.md", "exec"), {})
            outputs.append(buf.getvalue())
    assert ran == 4
    for name in ("schedules.png", "step.png"):
        assert (tmp_path / name).read_bytes()[:4] == b"\x89PNG"
    assert '"traceEvents"' in (tmp_path / "step.json").read_text()[:40]
    # the table the page shows is the first compare's (labels exact, numbers within 1%)
    def rows(text: str) -> list[list[str]]:
        return [[c.strip() for c in x.strip().strip("│").split("│")]
                for x in text.splitlines() if x.strip().startswith("│")]

    want, got = rows(shown), rows(outputs[0])
    assert len(want) == len(got) == 8
    for w, g in zip(want, got, strict=True):
        assert w[:2] == g[:2] and w[-1] == g[-1]
        assert float(g[2]) == pytest.approx(float(w[2]), rel=0.01)
    # the pandas views printed what they say
    assert "tp_comm" in outputs[3] and "optimizer" in outputs[3]
    assert "micro_batch_size" in outputs[-1] and "step_time_s" in outputs[-1] and len(outputs[-1].splitlines()) >= 2

"""Terminal output (issue 20 item 8): the one progress bar helper, off unless stderr is a
terminal and off with --json, readable at 80 columns; ``calibrate``, ``report``,
``validate`` and ``tune`` draw it; tables fit the terminal width."""

from __future__ import annotations

import io
import re

import pytest
from rich.console import Console

from meshplan import terminal
from tests._cli import Stopped, run_main

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_is_off_for_json_and_for_a_pipe():
    assert terminal.progress_enabled(stream=_Tty()) is True
    assert terminal.progress_enabled(as_json=True, stream=_Tty()) is False
    assert terminal.progress_enabled(stream=io.StringIO()) is False


def test_bar_fits_80_columns_with_a_long_note():
    buf = io.StringIO()
    con = Console(file=buf, width=80, force_terminal=True, color_system=None)
    note = "best 123.4 ms  dp8 tp4 pp2 1F1B vpp2 mbs1 rc=selective zero1 sp"
    with terminal.Progress(3, "trials", console=con) as bar:
        for _ in range(3):
            bar.advance(note=note)
    assert bar.completed == 3
    lines = [x for x in re.split(r"[\r\n]", ANSI.sub("", buf.getvalue())) if x.strip()]
    assert lines and max(len(x) for x in lines) <= 80
    last = lines[-1]
    assert "3/3" in last and note[:terminal.DESCRIPTION_WIDTH - 1] in last and "…" in last


def test_disabled_bar_draws_nothing_but_counts():
    buf = io.StringIO()
    con = Console(file=buf, width=80, force_terminal=True)
    with terminal.Progress(2, "x", enabled=False, console=con) as bar:
        bar.advance()
        bar.advance()
    assert bar.completed == 2 and buf.getvalue() == ""


def test_render_wraps_a_table_to_the_width(monkeypatch):
    from rich.table import Table

    t = Table(title="t")
    for c in ("a long column head", "another long column head", "and a third one"):
        t.add_column(c)
    t.add_row("x" * 30, "y" * 30, "z" * 30)
    assert max(len(x) for x in terminal.render(t, 60).splitlines()) <= 60
    monkeypatch.setenv("COLUMNS", "72")
    assert terminal.width() == 72
    assert max(len(x) for x in terminal.render(t).splitlines()) <= 72


class Recorder:
    """Stands for meshplan.terminal.Progress: records what a command asked of its bar."""

    made: list[Recorder] = []

    def __init__(self, total, description, enabled=True, done=0, console=None):
        self.total, self.description, self.enabled = total, description, enabled
        self.notes: list[str | None] = []
        Recorder.made.append(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None

    def advance(self, n=1, note=None):
        self.notes.append(note)


@pytest.fixture
def bars(monkeypatch):
    """Progress replaced by :class:`Recorder`; stderr looks like a terminal."""
    Recorder.made = []
    monkeypatch.setattr(terminal, "Progress", Recorder)
    monkeypatch.setattr(terminal, "progress_enabled", lambda as_json=False, stream=None: not as_json)
    return Recorder.made


def test_tune_advances_once_per_trial(bars, tmp_path, capsys):
    rc, out, err = run_main(capsys, "tune", "--model", "megatron-1.7b", "--cluster", "dgx-a100-80g",
                            "--nodes", "1", "--global-batch", "8", "--seq-len", "512", "--layers", "2",
                            "--trials", "3", "--storage", "memory", "--sampler", "random",
                            "--output", str(tmp_path / "t"))
    assert rc == 0, err
    (bar,) = bars
    assert bar.enabled and bar.total == 3 and len(bar.notes) == 3
    assert all(n.startswith("best") for n in bar.notes)
    rc, *_ = run_main(capsys, "tune", "--model", "megatron-1.7b", "--cluster", "dgx-a100-80g",
                      "--nodes", "1", "--global-batch", "8", "--seq-len", "512", "--layers", "2",
                      "--trials", "1", "--storage", "memory", "--no-progress", "--sampler", "random",
                      "--output", str(tmp_path / "t2"))
    # one trial may find no feasible plan (exit 1, the search's answer); the bar is off either way
    assert rc in (0, 1) and bars[1].enabled is False


def test_report_advances_once_per_experiment(bars, tmp_path, capsys):
    rc, out, err = run_main(capsys, "report", "--quick", "--only", "zb_bubbles",
                            "--output", str(tmp_path / "r"))
    assert rc == 0, err
    (bar,) = bars
    assert bar.enabled and bar.total == 1 and bar.notes == ["zb_bubbles done"]


def test_calibrate_advances_once_per_phase(bars, monkeypatch, tmp_path, capsys):
    """The measurement itself is stubbed (``executor.calibrate.calibrate``): it reports its
    phases and stops; the command's bar counts them."""
    import executor.calibrate as cal

    def fake(nproc, quick, device, on_phase):
        for name in cal.calibration_phases(device):
            on_phase(name)
        raise Stopped("stub stops here")

    monkeypatch.setattr(cal, "calibrate", fake)
    rc, _, err = run_main(capsys, "calibrate", "--output", str(tmp_path / "c.yaml"), "--quick")
    assert rc == 2 and "stub stops here" in err
    (bar,) = bars
    assert bar.total == 3 and bar.notes == cal.calibration_phases("cpu") and bar.enabled
    assert len(cal.calibration_phases("cuda")) == 5


@pytest.mark.parametrize("json_flag,enabled", [([], True), (["--json"], False)])
def test_validate_bar_is_off_with_json(bars, monkeypatch, tmp_path, capsys, json_flag, enabled):
    import meshplan.validation as val

    def fake(*a, **k):
        raise Stopped("stub stops here")

    monkeypatch.setattr(val, "run_repeated", fake)
    rc, _, err = run_main(capsys, "validate", "benchmarks/plans/dp2.json", "--nproc", "2",
                          "--csv", str(tmp_path / "v.csv"), *json_flag)
    assert rc == 2 and "stub stops here" in err
    (bar,) = bars
    assert bar.enabled is enabled and bar.description == "3 repeat(s) on 2 ranks"

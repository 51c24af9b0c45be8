"""The guide "Inspect a search with optuna-dashboard" (docs/how-to/optuna-dashboard.md; the
README's section "Inspect a search with Optuna's tools" until issue 40 moved it there):
every command of the page runs, in a
scratch directory: the ``meshplan tune`` line, the ``optuna`` CLI line, the Python block
(``optuna.load_study`` on the journal), and optuna-dashboard's loading of the journal path
(the dashboard opens an existing non-SQLite file as ``JournalStorage(JournalFileBackend(path))``,
optuna-dashboard ``_storage_url.guess_storage_from_url``; the dashboard itself is not a
dependency, so its loader is exercised and its server is not started)."""

from __future__ import annotations

import contextlib
import io
import shlex
import sys
from pathlib import Path

import optuna
import optuna.cli
import pytest
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend

from meshplan.cli import main
from meshplan.plan import Plan

ROOT = Path(__file__).resolve().parents[2]
#: the guide on the documentation site (the whole page)
DOCS_PAGE = ROOT / "docs" / "how-to" / "optuna-dashboard.md"


def _section() -> tuple[list[str], str]:
    """(shell commands, continuation lines joined, comments dropped; the Python block) of
    the docs page."""
    body = DOCS_PAGE.read_text()
    blocks = body.split("```")
    bash = next(b for b in blocks if b.startswith("bash\n"))[5:]
    py = next(b for b in blocks if b.startswith("python\n"))[7:]
    cmds = [c.split("  #")[0].strip() for c in bash.replace("\\\n", " ").splitlines() if c.strip()]
    return cmds, py


@pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")
def test_readme_optuna_section_runs(tmp_path, monkeypatch, capsys):
    cmds, py = _section()
    monkeypatch.chdir(tmp_path)
    ran = set()
    for cmd in cmds:
        argv = shlex.split(cmd)
        if argv[0] == "meshplan":
            assert main([*argv[1:], "--no-progress"]) == 0, cmd
            out = capsys.readouterr().out
            assert "why it won" in out
        elif argv[0] == "optuna":
            monkeypatch.setattr(sys, "argv", argv)
            assert optuna.cli.main() == 0, cmd
            out = capsys.readouterr().out
            assert "feasible: true" in out and "memory_gib:" in out
        elif argv[0] == "optuna-dashboard":
            path = Path(argv[1])
            assert path.is_file() and not path.read_bytes().startswith(b"SQLite format 3")
            storage = JournalStorage(JournalFileBackend(str(path)))  # the dashboard's loader
            # the search's study, and beside it the slices of its branch and bound
            # (tuner.exhaustive_shared.slice_study_name), which the dashboard lists too
            from tuner.exhaustive_shared import slice_study_name

            studies = {s.study_name: s for s in storage.get_all_studies()}
            study = studies.pop("7b-small")
            assert set(studies) <= {slice_study_name("7b-small")}
            trials = storage.get_all_trials(study._study_id)
            done = [t for t in trials if t.state.name == "COMPLETE"]
            assert done and all(isinstance(t.user_attrs["feasible"], bool) for t in done)
            assert all(t.user_attrs["feasible"] == (t.constraints["memory"] <= 0) for t in done)
        else:
            assert argv[:2] == ["pip", "install"], cmd  # nothing else is skipped
            continue
        ran.add(argv[0])
    assert ran == {"meshplan", "optuna", "optuna-dashboard"}
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        exec(compile(py, "docs/how-to/optuna-dashboard.md python block", "exec"), {})
    printed = buf.getvalue().splitlines()
    # the block's best trial is the plan tune wrote: Optuna honours the memory constraint
    study = optuna.load_study(study_name="7b-small",
                              storage=JournalStorage(JournalFileBackend("runs/7b-small/journal.log")))
    plan = Plan.load("runs/7b-small/plan.json")
    best = study.best_trial
    assert best.user_attrs["feasible"] and best.user_attrs["plan"]["dp"] == plan.strategy.dp
    assert (best.user_attrs["plan"]["tp"], best.user_attrs["plan"]["pp"]) == (plan.strategy.tp, plan.strategy.pp)
    assert printed[0] == f"{best.value} {plan.strategy.dp} {best.user_attrs['memory_gib']}"
    assert any("True" in ln for ln in printed[1:])

"""No output is replaced or appended to in silence (issue 43, item 2): an existing file is
refused unless --force (or --append for the validation CSV, whose columns must match);
output paths are checked by kind and suffix before any work."""

from __future__ import annotations

import csv

import pytest

from meshplan import outputs as outs
from meshplan.validation_report import CSV_COLUMNS
from tests._cli import one_line_error, run_main

COST = ["cost", "-m", "llama2-7b", "--cluster", "dgx-h100", "--dp", "8", "--global-batch", "8",
        "--layers", "2"]
SIM = ["simulate", "--schedule", "1F1B", "--stages", "2", "--microbatches", "4", "--tf", "1", "--tb", "1"]
EXPORT = ["export", "--to", "deepspeed", "-m", "llama2-7b", "--cluster", "dgx-h100", "--dp", "8",
          "--global-batch", "8"]
COMPARE = ["compare", "-m", "llama2-7b", "--cluster", "dgx-h100", "--global-batch", "8",
           "--tp", "1,2", "--layers", "2"]

# (command line, output flag, a file name of the right kind)
CASES = [
    (COST, "--trace", "t.json"), (COST, "--plot", "p.png"), (COST, "--memory-png", "m.png"),
    (SIM, "--trace", "t.json"), (SIM, "--plot", "p.svg"), (COMPARE, "--plot", "c.png"),
    (EXPORT, "-o", "ds.json"), (["calibrate", "--quick"], "-o", "c.yaml"),
]


@pytest.mark.parametrize(("cmd", "flag", "name"), CASES, ids=lambda x: x if isinstance(x, str) else x[0])
def test_an_existing_output_is_refused_untouched_and_force_replaces_it(tmp_path, capsys, cmd, flag, name):
    out = tmp_path / name
    out.write_text("the user's own file\n")
    line = one_line_error(*run_main(capsys, *cmd, flag, str(out)))
    assert flag in line and "exists" in line and "--force" in line
    assert out.read_text() == "the user's own file\n"
    if cmd[0] == "calibrate":  # a measurement takes seconds: the refusal is what is tested
        return
    rc, _, err = run_main(capsys, *cmd, flag, str(out), "--force")
    assert rc == 0, err
    assert out.read_bytes() != b"the user's own file\n"


@pytest.mark.parametrize(("cmd", "flag", "name", "kind"), [
    (COST, "--trace", "t.txt", ".json"), (SIM, "--trace", "t.png", ".json"),
    (COST, "--plot", "p.xyz", ".png"), (EXPORT, "-o", "ds.toml", ".json"),
    (["export", "--to", "torchtitan", *EXPORT[3:]], "-o", "job.json", ".toml"),
    (["calibrate", "--quick"], "-o", "c.json", ".yaml"),
])
def test_an_output_of_the_wrong_kind_is_refused_before_any_work(tmp_path, capsys, cmd, flag, name, kind):
    """``cost --trace FILE`` took any name (``--plot`` checked its suffix): every output
    is checked by kind."""
    line = one_line_error(*run_main(capsys, *cmd, flag, str(tmp_path / name)))
    assert flag in line and kind in line and "must end in" in line
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("path", ["/dev/null", "/dev/full"])
def test_a_device_is_not_an_output(capsys, path):
    import os

    if not os.path.exists(path):
        pytest.skip(f"{path} missing")
    line = one_line_error(*run_main(capsys, *SIM, "--trace", path, "--force"))
    assert "not a regular file" in line


def test_the_validation_csv_grows_only_with_append_and_only_its_own_columns(tmp_path):
    """``validate --csv`` appended a row to any file: an existing one now needs --append
    (and must have the validation columns) or --force."""
    from meshplan.commands.validate import _check_csv

    mine = tmp_path / "v.csv"
    with mine.open("w", newline="") as f:
        csv.writer(f).writerow(CSV_COLUMNS)
    with pytest.raises(outs.OutputError, match="exists; .*--append"):
        _check_csv(str(mine), append=False, force=False)
    _check_csv(str(mine), append=True, force=False)  # its own columns: a row is added
    _check_csv(str(mine), append=False, force=True)
    other = tmp_path / "sales.csv"
    other.write_text("region,total\nnorth,3\n")
    with pytest.raises(outs.OutputError, match="columns are not this command's"):
        _check_csv(str(other), append=True, force=False)
    with pytest.raises(outs.OutputError, match="one"):
        _check_csv(str(mine), append=True, force=True)
    with pytest.raises(outs.OutputError, match="must end in .csv"):
        _check_csv(str(tmp_path / "v.txt"), append=True, force=False)
    _check_csv(str(tmp_path / "new" / "v.csv"), append=False, force=False)  # a new file


def test_validate_refuses_an_existing_csv_before_the_ranks_run(tmp_path, capsys):
    plan = "benchmarks/plans/dp2.json"
    out = tmp_path / "notes.csv"
    out.write_text("mine\n")
    line = one_line_error(*run_main(capsys, "validate", plan, "--nproc", "2", "--csv", str(out)))
    assert "--csv" in line and "exists" in line and "--append" in line
    line = one_line_error(*run_main(capsys, "validate", plan, "--nproc", "2", "--csv", str(out),
                                    "--append"))
    assert "columns are not this command's" in line
    assert out.read_text() == "mine\n"


def test_append_csv_never_mixes_its_rows_into_another_csv(tmp_path):
    """The executor's own ``--csv`` (a torchrun rank 0) goes through the same guard."""
    from meshplan.validation_report import append_csv

    other = tmp_path / "x.csv"
    other.write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="columns are not the validation CSV's"):
        append_csv(other, "p.json", None, None)
    assert other.read_text() == "a,b\n1,2\n"


TUNE = ["tune", "--model", "llama2-7b", "--cluster", "dgx-a100-80g", "--nodes", "1",
        "--global-batch-size", "32", "--seq-len", "4096", "--layers", "4", "--no-progress",
        "--sampler", "random"]


@pytest.mark.slow
def test_tune_output_of_another_study_is_refused_and_the_same_study_resumes(tmp_path, capsys):
    """``tune --output DIR`` replaced another study's plan.json and history.csv: refused
    unless --force; rerunning the same command line resumes its study there."""
    out = tmp_path / "run"
    rc, _, err = run_main(capsys, *TUNE, "--output", str(out), "--trials", "2")
    assert rc == 0, err
    plan = (out / "plan.json").read_text()
    rc, _, err = run_main(capsys, *TUNE, "--output", str(out), "--trials", "3")  # the same study
    assert rc == 0, err
    line = one_line_error(*run_main(capsys, *TUNE, "--output", str(out), "--seed", "7", "--trials", "2"))
    assert "--output" in line and "holds the results of study" in line and "--force" in line
    assert (out / "plan.json").exists()
    rc, _, err = run_main(capsys, *TUNE, "--output", str(out), "--seed", "7", "--force", "--trials", "2")
    assert rc == 0, err
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "plan.json").write_text(plan)  # a plan.json no tune report names
    line = one_line_error(*run_main(capsys, *TUNE, "--output", str(foreign), "--trials", "2"))
    assert "no study this command knows" in line
    line = one_line_error(*run_main(capsys, *TUNE, "--output", "", "--trials", "2"))
    assert "--output is empty" in line


def test_the_default_validation_log_grows_but_only_as_a_validation_csv(tmp_path, monkeypatch, capsys):
    """``reports/validation.csv`` (the default ``--csv``) is the experiment reports' log:
    it takes a row without ``--append``, but only when it is a validation CSV."""
    import shutil

    plan = tmp_path / "dp2.json"
    shutil.copy("benchmarks/plans/dp2.json", plan)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "reports").mkdir()
    log = tmp_path / "reports" / "validation.csv"
    log.write_text("something,else\n1,2\n")
    line = one_line_error(*run_main(capsys, "validate", str(plan), "--nproc", "2"))
    assert "columns are not this command's" in line and log.read_text() == "something,else\n1,2\n"

"""Robustness of ``--fix`` and the tune command: conflicting, unknown-valued or impossible
pins fail up front with a one-line error instead of running a search whose every trial is
illegal (regressions found by a break-it review)."""

from __future__ import annotations

import pytest

from meshplan.cli import main
from meshplan.tuning import search_problem
from tuner.space import SearchSpace, SpaceError, parse_fix
from tuner.storage import StorageError, open_storage

PROB = search_problem("llama2-7b", "dgx-a100-80g", None, 16, None, num_layers=4)


@pytest.mark.parametrize("text, msg", [
    ("dp=2,dp=4", "'dp' is given twice"),
    ("zero=1,sharding_stage=2", "'zero' is given twice"),
])
def test_duplicate_knob_is_refused(text, msg):
    with pytest.raises(SpaceError, match=msg):
        parse_fix(text)


@pytest.mark.parametrize("text, msg", [
    ("dp=3", "dp=3 does not divide the world size 8"),
    ("dp=8,tp=8", "does not divide the world size 8"),
    ("dp=2,tp=2,pp=1", "dp\\*tp\\*pp = 4 but the world size is 8"),
    ("schedule=bogus", "schedule 'bogus' is not one of"),
    ("zero=7", "zero=7 is not one of"),
    ("vpp=0", "vpp=0 must be an integer >= 1"),
])
def test_impossible_pins_are_refused(text, msg):
    with pytest.raises(SpaceError, match=msg):
        SearchSpace(PROB, fix=parse_fix(text))


def test_legal_pins_are_kept():
    sp = SearchSpace(PROB, fix=parse_fix("dp=2,tp=4,zero=1,sp=true"))
    assert sp.fix == {"dp": 2, "tp": 4, "zero": 1, "sequence_parallel": True}


def test_seq_len_zero_is_not_silently_the_default():
    with pytest.raises(SpaceError, match="'seq_len' must be an integer >= 1, got 0"):
        search_problem("llama2-7b", "dgx-a100-80g", None, 16, 0)


@pytest.mark.parametrize("extra, msg", [
    (["--top", "-1"], "--top must be >= 1"), (["--timeout", "-1"], "--timeout must be > 0"),
    (["--fix", "dp=2,dp=4"], "given twice"),
])
def test_tune_cli_bad_options_exit_2(tmp_path, capsys, extra, msg):
    rc = main(["tune", "--model", "llama2-7b", "--cluster", "dgx-a100-80g", "--global-batch", "16",
               "--layers", "4", "--trials", "1", "--storage", "memory", "--no-progress",
               "--output", str(tmp_path), *extra])
    err = capsys.readouterr().err
    assert rc == 2 and msg in err and err.count("\n") == 1


def test_unreachable_database_is_a_one_line_error():
    pytest.importorskip("psycopg")
    with pytest.raises(StorageError) as e:
        open_storage("postgresql://nobody@127.0.0.1:1/db", None)
    assert "\n" not in str(e.value) and "127.0.0.1" in str(e.value)


def test_fixed_pp_beyond_the_layer_count_is_refused_up_front():
    """--fix pp=8 on a 4-layer model can never be legal (pp_divides_layers): the space
    refuses it before any trial instead of failing every trial."""
    from meshplan.tuning import search_problem
    from tuner.space import SearchSpace, SpaceError, parse_fix

    prob = search_problem("llama2-7b", "dgx-a100-80g", 1, 64, 1024, num_layers=4)
    with pytest.raises(SpaceError, match="pp=8 exceeds the model's 4 layers"):
        SearchSpace(prob, fix=parse_fix("pp=8"))
    SearchSpace(prob, fix=parse_fix("pp=4"))  # legal


def test_partial_score_record_of_a_killed_worker_is_not_read_as_a_score():
    """A worker SIGKILLed while writing a trial's score leaves only some of its user attrs;
    history rows and counts must not fail on it (KeyError) nor count it as scored."""
    import optuna

    from tuner.result import scored

    assert scored({"time_s": 1.0, "memory_bytes": 2, "memory_limit_bytes": 3})
    assert not scored({"time_s": 1.0})  # killed after the first write
    study = optuna.create_study()
    t = study.ask()
    t.set_user_attr("time_s", 1.0)
    study.tell(t, state=optuna.trial.TrialState.FAIL)
    from tuner.result import TuneResult

    res = TuneResult(study, global_batch_size=8)
    assert res.counts().get("oom", 0) == 0
    assert res.to_dataframe().loc[0, "state"] == "FAIL"  # the row is written, no KeyError


#: a one-trial search whose trial is a legal plan that fits, whatever the sampler draws (tp,
#: pp and the micro-batch pinned)
TUNE = ["tune", "--model", "llama2-7b", "--cluster", "dgx-a100-80g", "--global-batch", "16",
        "--layers", "4", "--trials", "1", "--no-progress", "--tp", "1", "--pp", "1",
        "--micro-batch-size", "1"]


@pytest.mark.parametrize("name", ["../../../x", "a/b", ".hidden", "x y"])
def test_unsafe_study_name_is_refused_before_anything_is_written(tmp_path, capsys, monkeypatch, name):
    """Issue 16 item 9: ``--study ../../../x`` wrote outside the runs folder."""
    from tests._cli import one_line_error

    monkeypatch.chdir(tmp_path)
    line = one_line_error(main([*TUNE, "--study", name]), *capsys.readouterr())
    assert "is not allowed" in line and repr(name) in line
    assert list(tmp_path.iterdir()) == []
    line = one_line_error(main(["worker", "--study", name, "--storage", str(tmp_path / "j.log")]),
                          *capsys.readouterr())
    assert "is not allowed" in line and list(tmp_path.iterdir()) == []


def test_directories_are_created_only_where_asked_and_said(tmp_path, capsys, monkeypatch):
    """Issue 16 item 9: --output and --storage create their directory with one line
    ``created DIR``; nothing else is created."""
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "runs" / "a"
    assert main([*TUNE, "--study", "s1", "--output", str(out)]) == 0
    printed = capsys.readouterr().err.splitlines()  # on stderr: stdout is the report
    assert printed.count(f"created {out}") == 1 and (out / "journal.log").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs"]
    journal = tmp_path / "db" / "j.log"
    out2 = tmp_path / "o2"
    assert main([*TUNE, "--study", "s2", "--storage", str(journal), "--output", str(out2)]) == 0
    printed = capsys.readouterr().err.splitlines()
    assert f"created {journal.parent}" in printed and f"created {out2}" in printed
    assert journal.is_file() and (out2 / "plan.json").is_file()
    assert main([*TUNE, "--study", "s2", "--storage", str(journal), "--output", str(out2)]) == 0
    assert not [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("created ")]


def test_journal_in_a_missing_directory_is_not_created_by_the_library(tmp_path):
    with pytest.raises(StorageError, match="does not exist"):
        open_storage(str(tmp_path / "nope" / "j.log"), None)
    assert not (tmp_path / "nope").exists()


def test_a_worker_on_a_missing_journal_creates_nothing(tmp_path, capsys):
    """Found by a bad-input hunt: ``worker --storage missing.log`` said the study was
    missing but left an empty journal file behind."""
    from tests._cli import one_line_error

    line = one_line_error(main(["worker", "--study", "s", "--storage", str(tmp_path / "none.log")]),
                          *capsys.readouterr())
    assert "no such journal file" in line and list(tmp_path.iterdir()) == []

"""``tuner.search.load_result``: a finished ``meshplan tune --output DIR`` read back as a
TuneResult (the README's pandas view), and its errors."""

from __future__ import annotations

import pytest

from meshplan.cli import main
from tuner.search import load_result
from tuner.study import TuneError


def test_load_result_reads_the_journal_of_a_tune(tmp_path, capsys):
    out = tmp_path / "t"
    args = ["tune", "--model", "megatron-1.7b", "--cluster", "dgx-a100-80g", "--nodes", "1",
            "--global-batch", "8", "--seq-len", "512", "--layers", "2", "--trials", "3",
            "--sampler", "random", "--output", str(out), "--no-progress"]
    assert main(args) == 0
    capsys.readouterr()
    res = load_result(out)
    df = res.to_dataframe()
    assert len(df) == len(res.trials()) == 3
    assert res.global_batch_size == 8
    # the same rows as the history.csv the tune wrote
    import pandas as pd

    csv = pd.read_csv(out / "history.csv")
    assert list(csv.trial) == list(df.trial)
    assert load_result(out / "journal.log").to_dataframe().equals(df)
    with pytest.raises(TuneError, match="holds no study 'nope'"):
        load_result(out, study="nope")


def test_load_result_without_a_journal(tmp_path):
    with pytest.raises(TuneError, match="no tune journal"):
        load_result(tmp_path)


def test_a_rerun_of_another_configuration_says_it_starts_beside_the_old_study(tmp_path, capsys):
    """A new-user pass reran a tune command after an upgrade changed a default: a second
    study started in the folder without a word, plan.json was rewritten and load_result
    then needed a name. tune now says so on stderr, naming both studies."""
    from tests._cli import run_main
    from tuner.search import other_studies

    out = tmp_path / "run"
    base = ("tune", "--model", "llama2-7b", "--cluster", "dgx-a100-80g", "--nodes", "1", "--layers", "4",
            "--trials", "2", "--no-progress", "--output", str(out))
    rc, _, err = run_main(capsys, *base, "--global-batch", "32")
    assert rc == 0 and "note:" not in err
    first = load_result(out).study.study_name
    assert other_studies(out, first) == []
    rc, _, err = run_main(capsys, *base, "--global-batch", "32")  # a plain resume: no note
    assert rc == 0 and "holds study" not in err
    rc, _, err = run_main(capsys, *base, "--global-batch", "16")  # issue 43: not in silence
    assert rc == 2 and f"holds the results of study {first}" in err and "--force" in err
    rc, _, err = run_main(capsys, *base, "--global-batch", "16", "--force")
    assert rc == 0 and f"journal.log holds study {first}, not this command line's" in " ".join(err.split())
    second = [n for n in other_studies(out, "") if n != first]
    assert len(second) == 1 and load_result(out, first).study.study_name == first


def test_each_size_of_a_gpus_search_says_so_too(tmp_path, capsys):
    """--gpus runs one study per size in DIR/gN: the other-study note looked only at DIR."""
    from tests._cli import run_main

    base = ("tune", "--model", "llama2-7b", "--cluster", "dgx-a100-80g", "--gpus", "8-16",
            "--seq-len", "2048", "--layers", "2", "--trials", "2", "--no-progress", "--output", str(tmp_path))
    rc, _, err = run_main(capsys, *base, "--global-batch", "32")
    assert rc == 0 and "holds study" not in err
    rc, _, err = run_main(capsys, *base, "--global-batch", "64")  # issue 43: refused ...
    assert rc == 2 and "holds the results of study" in err
    rc, _, err = run_main(capsys, *base, "--global-batch", "64", "--force")  # ... unless --force
    flat = " ".join(err.split())
    assert rc == 0 and f"{tmp_path / 'g8'}/journal.log holds study" in flat and f"{tmp_path / 'g16'}/journal.log holds study" in flat
